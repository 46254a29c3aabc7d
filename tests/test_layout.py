"""The package's shape: no import cycle inside alcli, and the name lists config keeps equal to the
registries they mirror."""
from __future__ import annotations

import ast
import importlib
from pathlib import Path

import alcli
from alcli.files.config import METHOD_NAMES, STRATEGY_NAMES, TASK_NAMES
from alcli.gradnorm import METHODS
from alcli.score.strategies import STRATEGIES
from alcli.tasks import TASKS

ROOT = Path(alcli.__file__).parent


def _module_name(path: Path) -> str:
    parts = ["alcli", *path.relative_to(ROOT).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """module -> the alcli modules it imports (at the top or inside functions)."""
    files = {_module_name(p): p for p in ROOT.rglob("*.py")}
    graph: dict[str, set[str]] = {name: set() for name in files}
    for name, path in files.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = package
                for _ in range(node.level - 1):
                    base = base.rpartition(".")[0]
                base = (f"{base}.{node.module}" if node.module else base) if node.level else node.module
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in files else base
                           for a in node.names]
            else:
                continue
            graph[name] |= {t for t in targets if t in files and t != name}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done
    path: list[str] = []

    def visit(node):
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_no_import_cycle_inside_the_package():
    graph = import_graph()
    assert graph["alcli.cli"] and graph["alcli.longrun.job"]  # the walk sees real imports
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph))


def test_find_cycle_finds_one():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_config_names_mirror_the_registries():
    assert STRATEGY_NAMES == tuple(STRATEGIES)
    assert METHOD_NAMES == METHODS
    assert TASK_NAMES == ("auto", *TASKS)


# what tasks/ may hold beside its task modules, and why: a newcomer opening it finds the tasks
TASKS_NON_TASK_FILES = {
    "__init__.py": "the registry (TASKS)",
    "common.py": "the Task dataclass every task module fills, and the math tasks share",
    "detectors": "the detectors' engine internals, which detection.py runs",
    "shared": "the labels-as-given and Label Studio vocabulary the task modules describe themselves in",
}


def task_modules_defined(folder: Path) -> set[str]:
    """The .py files directly in `folder` whose top level assigns TASK = Task(...)."""
    found = set()
    for path in folder.glob("*.py"):
        for node in ast.parse(path.read_text()).body:
            if (isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "TASK"
                                                     for t in node.targets)
                    and isinstance(node.value, ast.Call) and getattr(node.value.func, "id", None) == "Task"):
                found.add(path.name)
    return found


def test_tasks_top_level_holds_only_task_modules_and_the_listed_rest():
    folder = ROOT / "tasks"
    entries = {p.name for p in folder.iterdir() if p.name != "__pycache__"}
    tasks = task_modules_defined(folder)
    defined = {importlib.import_module(f"alcli.tasks.{name[:-3]}").TASK.name for name in tasks}
    assert defined == set(TASKS) and len(tasks) == len(TASKS)  # one module per registered task
    extra = entries - tasks - set(TASKS_NON_TASK_FILES)
    assert not extra, (f"alcli/tasks/ holds {sorted(extra)}, which define no task: move them into "
                       "a sub-package (detectors/, shared/) or list them here with a reason")
    assert set(TASKS_NON_TASK_FILES) <= entries  # the list names nothing that is gone


def private_imports_of_tasks() -> list[str]:
    """`from <a module of alcli.tasks> import _name` anywhere in alcli: a name shared across
    modules is public (or lives in the one module that uses it)."""
    found = []
    for path in ROOT.rglob("*.py"):
        name = _module_name(path)
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ImportFrom):
                continue
            base = package
            for _ in range(max(node.level - 1, 0)):
                base = base.rpartition(".")[0]
            source = (f"{base}.{node.module}" if node.module else base) if node.level else node.module
            if source.startswith("alcli.tasks"):
                found += [f"{path.relative_to(ROOT)}:{node.lineno} {a.name} from {source}"
                          for a in node.names if a.name.startswith("_") and not a.name.startswith("__")]
    return found


def test_no_private_name_is_imported_from_the_tasks():
    assert not private_imports_of_tasks(), "\n".join(private_imports_of_tasks())
