"""What a fresh machine needs is declared, not found by luck: every package the tests import is named in
the `test` extra with a lower bound, that extra holds every extra the tests exercise, the installed
versions meet the bounds, and no test starts a bare `python` from PATH (tests/shell.py says how)."""
from __future__ import annotations

import ast
import re
import sys
import tomllib
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

REPO = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
EXTRAS = PROJECT["optional-dependencies"]
# the extras whose code paths the tests run (gcs and azure have no local server to test against)
EXERCISED_EXTRAS = ("hf", "vision", "tables", "datasets", "s3", "http", "dedup", "report")
# tests/data/labelstudio runs in Label Studio's own environment, not alcli's
OTHER_ENVIRONMENTS = (REPO / "tests" / "data",)


def requirements(names: list[str]) -> dict[str, Requirement]:
    return {canonicalize_name(r.name): r for r in map(Requirement, names)}


def python_files_of_tests() -> list[Path]:
    return [p for p in sorted((REPO / "tests").rglob("*.py"))
            if not any(p.is_relative_to(other) for other in OTHER_ENVIRONMENTS)]


def imported_top_level_modules(path: Path) -> set[str]:
    """Modules imported by `import x`, `from x import y` and `pytest.importorskip("x")` in one file."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split(".")[0])
        elif (isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "importorskip"
              and node.args and isinstance(node.args[0], ast.Constant)):
            found.add(node.args[0].value.split(".")[0])
        elif (isinstance(node, ast.For) and isinstance(node.iter, ast.Tuple)  # for p in ("a", "b"): importorskip(p)
              and any(getattr(getattr(n, "func", None), "attr", None) == "importorskip" for n in ast.walk(node))):
            found |= {e.value.split(".")[0] for e in node.iter.elts if isinstance(e, ast.Constant)}
    return found


def local_modules() -> set[str]:
    """Modules that are files of this checkout (tests' helpers, benchmarks, alcli itself)."""
    names = {"alcli", "conftest"}
    for folder in (REPO / "tests", REPO / "benchmarks", REPO / "scripts"):
        names |= {p.stem for p in folder.rglob("*.py")} | {p.name for p in folder.iterdir() if p.is_dir()}
    return names


def test_every_package_the_tests_import_is_named_in_the_test_extra():
    named = requirements(PROJECT["dependencies"]) | requirements(EXTRAS["test"])
    distributions = metadata.packages_distributions()
    local = local_modules()
    missing = {}
    for path in python_files_of_tests():
        written = set(re.findall(r"([A-Za-z_]\w*)\.py\b", path.read_text()))  # modules the test writes itself
        for module in imported_top_level_modules(path) - local - written - set(sys.stdlib_module_names):
            dists = {canonicalize_name(d) for d in distributions.get(module, [])}
            if not dists:
                missing[module] = f"{path.name} imports {module}, which no installed package provides"
            elif not dists & set(named):
                missing[module] = f"{path.name} imports {module} from {sorted(dists)}, not named in the test extra"
    assert not missing, "\n".join(sorted(missing.values()))


def test_the_test_extra_holds_every_exercised_extra_with_bounds():
    test = requirements(EXTRAS["test"])
    for extra in EXERCISED_EXTRAS:
        for name, req in requirements(EXTRAS[extra]).items():
            assert name in test, f"extra {extra!r} needs {req}, which the test extra does not name"
    for name, req in test.items():
        lower = [s for s in req.specifier if s.operator in (">=", "==", "~=")]
        assert lower, f"test extra: {req} has no lower bound"


def test_installed_versions_meet_the_declared_bounds():
    for req in requirements(PROJECT["dependencies"] + EXTRAS["test"]).values():
        installed = Version(metadata.version(req.name))
        assert req.specifier.contains(installed, prereleases=True), f"{req.name} {installed} does not meet {req}"


BARE_PYTHON = re.compile(r"(?:^|[\s;&|(`])python3?\s+\S")  # `python train.py`, `; python3 -c`


def command_strings(path: Path):
    """String constants of a test file that are not docstrings or comments: what could reach a shell."""
    tree = ast.parse(path.read_text(), str(path))
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                  and node.body and isinstance(node.body[0], ast.Expr)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            yield node.lineno, node.value


def test_no_test_starts_a_bare_python_from_path():
    """`python ...` in a command runs whichever Python is first on PATH; tests use shell.PYTHON."""
    found = [f"{path.name}:{line}: {text!r}" for path in python_files_of_tests()
             for line, text in command_strings(path) if BARE_PYTHON.search(text)]
    assert not found, "\n".join(found)
