"""Outside alcli/pools/, no code tells pool kinds apart: what a pool's spec names (a suffix, '-' for
stdin, a folder, a file) is asked of alcli.pools (its registry KINDS and the questions beside it).
An AST walk, as tests/test_task_names.py does for tasks, so a new kind's suffix cannot slip past it
the way it would past a grep; the suffixes are the kinds' own."""
from __future__ import annotations

import ast
import re
from pathlib import Path

import alcli
from alcli.pools import KINDS, common, tables, video

ROOT = Path(alcli.__file__).parent
POOL_NAME = re.compile(r"(^|_)(pool|spec)($|_)")  # pool, spec, settings.pool, pool_path, ...
SUFFIXES = {*common.IMAGE_EXTS, *common.TENSOR_EXTS, *common.MANIFEST_EXTS, *common.TEXT_EXTS,
            *tables.TABLE_EXTS, *video.VIDEO_EXTS, ".tar", ".arrow"}
PREDICATES = {"is_shard_spec", "is_hf_dataset", "is_parquet_folder", "is_text_manifest",
              "is_video", "expand_braces"}


def _names_pool(node: ast.AST) -> bool:
    """Does the expression mention a pool's spec (a name or attribute like pool, spec, settings.pool)?"""
    for n in ast.walk(node):
        name = n.id if isinstance(n, ast.Name) else n.attr if isinstance(n, ast.Attribute) else None
        if name and POOL_NAME.search(name):
            return True
    return False


def _kind_literal(node: ast.AST) -> bool:
    """'-', a pool file suffix, or a tuple / list / set holding one."""
    if isinstance(node, ast.Constant):
        return node.value == "-" or node.value in SUFFIXES
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return any(_kind_literal(e) for e in node.elts)
    return False


def pool_kind_decisions(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, what) of every place that decides a pool's kind by itself: a comparison of a pool's
    spec with '-' or a suffix; endswith / is_dir / is_file on one; a kind's own predicate called."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(_names_pool(s) for s in sides) and any(_kind_literal(s) for s in sides):
                found.append((node.lineno, "comparison"))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            attr = node.func.attr
            if attr == "endswith" and _names_pool(node.func.value) and \
                    any(_kind_literal(a) for a in node.args):
                found.append((node.lineno, "suffix test"))
            elif attr in ("is_dir", "is_file") and _names_pool(node.func.value):
                found.append((node.lineno, f"{attr}() on a pool"))
            elif attr in PREDICATES:
                found.append((node.lineno, f"{attr}()"))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and \
                node.func.id in PREDICATES:
            found.append((node.lineno, f"{node.func.id}()"))
        elif isinstance(node, ast.ImportFrom) and any(a.name in PREDICATES for a in node.names):
            found.append((node.lineno, "a kind's predicate imported"))
    return found


def outside_pool_code() -> list[str]:
    out = []
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT)
        if rel.parts[0] == "pools":
            continue
        for line, what in pool_kind_decisions(ast.parse(path.read_text())):
            out.append(f"alcli/{rel.as_posix()}:{line}: {what}")
    return out


def test_no_pool_kind_is_decided_outside_the_pool_modules():
    assert len(KINDS) >= 10 and video.KIND in KINDS  # the registry the walk's suffixes come from
    found = outside_pool_code()
    assert not found, "ask alcli.pools instead:\n" + "\n".join(found)


def test_the_walk_finds_each_kind_of_decision():
    code = '''
if spec == "-": pass
if Path(settings.pool).suffix.lower() in (".pt", ".npy"): pass
if settings.pool.lower().endswith(".parquet"): pass
if Path(spec).is_dir(): pass
if is_shard_spec(pool): pass
from alcli.pools.webdataset import is_shard_spec
if dest == "-": pass
if out.endswith(".csv"): pass
if path.is_dir(): pass
'''
    assert sorted(line for line, _ in pool_kind_decisions(ast.parse(code))) == [2, 3, 4, 5, 6, 7]


def test_each_kind_is_defined_in_its_own_module():
    """One pool kind, one module: a kind's functions live in the module that defines it."""
    for kind in KINDS:
        assert kind.recognises.__module__ == kind.opens.__module__, kind.name
    modules = {kind.opens.__module__.rpartition(".")[2] for kind in KINDS}
    assert modules == {"pools", "filelist", "stores", "prompts", "webdataset", "hf_dataset",
                       "parquet", "video", "folder", "text", "manifest", "tensors"}
