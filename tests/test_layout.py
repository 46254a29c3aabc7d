"""The package's shape: no import cycle inside alcli, and the name lists config keeps equal to the
registries they mirror."""
from __future__ import annotations

import ast
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
