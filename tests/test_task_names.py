"""Outside alcli/tasks/, no code compares a task's name: everything task-specific is asked of the task
object (alcli.tasks.TASKS). An AST walk, so a rename or a new task cannot slip past it the way it
would past a grep; the names are the registry's."""
from __future__ import annotations

import ast
from pathlib import Path

import alcli

ROOT = Path(alcli.__file__).parent


def _named(node: ast.AST, names: set[str]) -> bool:
    """A task-name literal, or a tuple / list / set holding one (`task in ("a", "b")`)."""
    if isinstance(node, ast.Constant):
        return node.value in names
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return any(_named(e, names) for e in node.elts)
    return False


def task_name_uses(tree: ast.AST, names: set[str]) -> list[tuple[int, str]]:
    """(line, what) of every place that tells tasks apart by name: a comparison (==, !=, in, not in,
    is) with a task-name literal, a match case on one, a lookup keyed by one (`d["detection"]`,
    `d.get("detection")`), and a dict literal keyed by task names (a table dispatching on them)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare) and any(_named(n, names) for n in [node.left, *node.comparators]):
            found.append((node.lineno, "comparison"))
        elif isinstance(node, ast.MatchValue) and _named(node.value, names):
            found.append((node.lineno, "match case"))
        elif isinstance(node, ast.Subscript) and _named(node.slice, names):
            found.append((node.lineno, "lookup"))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                node.func.attr in ("get", "pop", "setdefault") and node.args and _named(node.args[0], names):
            found.append((node.lineno, "lookup"))
        elif isinstance(node, ast.Dict) and any(k is not None and _named(k, names) for k in node.keys):
            found.append((node.lineno, "table keyed by task names"))
    return found


def outside_task_code(names: set[str]) -> list[str]:
    out = []
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT)
        if rel.parts[0] == "tasks":
            continue
        for line, what in task_name_uses(ast.parse(path.read_text()), names):
            out.append(f"alcli/{rel.as_posix()}:{line}: {what}")
    return out


def test_no_task_name_is_compared_outside_the_task_modules():
    from alcli.tasks import TASKS
    assert len(TASKS) >= 7  # the walk has names to look for
    found = outside_task_code(set(TASKS))
    assert not found, "ask the task object (alcli.tasks) instead:\n" + "\n".join(found)


def test_the_walk_finds_each_kind_of_name_test():
    names = {"detection", "regression"}
    code = '''
if task == "detection": pass
if s.task != "regression": pass
if task in ("auto", "detection"): pass
x = TABLE["regression"]
y = TABLE.get("detection", None)
z = {"detection": 1, "other": 2}
match task:
    case "regression": pass
if task == "classification" or name == "detector": pass
'''
    assert [line for line, _ in task_name_uses(ast.parse(code), names)] == [2, 3, 4, 5, 6, 7, 9]
