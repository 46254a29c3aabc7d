"""`alcli merge`: shard tables (from `score --shard K/N`) -> the one ranked table of the pool.

Each part is known by its OUTPUT.meta.json sidecar: its shard K/N, the pool's fingerprint and the
settings it was scored with. The parts must be shards 0..N-1 of one N, each exactly once, of the
same pool and settings; their rows must not share an id and must add up, with the skipped examples
of their errors files, to the whole pool. The result is the table one process would have written.
"""
from __future__ import annotations

import functools
import json
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from ..version import __version__
from ..errors import ConfigError, TableError
from ..files.atomic import check_writable, make_folder, writes_stream
from ..files.outputs import check_not_input
from ..files.embeddings import (EmbeddingsError, embeddings_path, embeddings_run_id, encode_factors,
                                load_embeddings)
from .finish import Finished, finish, read_errors, save_table_embeddings, write_sidecars
from .partial import new_partial, new_run_id, stdout_folder
from ..files.table import LINE_FORMATS, SIDECARS, read_meta, read_table, sidecar


@dataclass
class MergeResult:
    finished: Finished
    parts: int
    files: list[str]
    embeddings_file: str | None = None  # the parts' embeddings joined (same run id as the table)
    notes: list[str] = field(default_factory=list)  # for people: why there are none


def merge_tables(parts: list[str], dest: str, fmt: str = "csv", null: bool = False) -> MergeResult:
    """Check that `parts` are the complete, non-overlapping shards of one run, and write `dest`
    (`null`: -f paths / ids records end in NUL)."""
    if not parts:
        raise ConfigError("no parts given; pass the shard tables to merge")
    metas = [_meta(part) for part in parts]
    _check_parts(parts, metas)
    check_not_input(dest, "option --output", [("a part", parts)], beside=SIDECARS)
    stream = writes_stream(dest)
    # where the embeddings of a merged table on stdout go (checked before the work)
    emb_folder = stdout_folder("merge keeps the embeddings of a table on stdout") if stream else None
    folder = Path(tempfile.gettempdir()) if stream else Path(dest).parent
    make_folder(folder, f"output {dest}")
    check_writable(folder, f"output {dest}")
    first = metas[0]
    with tempfile.TemporaryDirectory(prefix=".alcli-merge-", dir=folder) as tmp:
        combined = Path(tmp) / "merged.partial"
        new_partial(combined, first["run"])
        owner: dict[str, str] = {}
        factors, notes = _parts_factors(parts, metas)
        with open(combined, "a") as out:
            for part, meta in zip(parts, metas):
                rows = read_table(part) if meta["rows"] else []
                if len(rows) != meta["rows"]:
                    raise TableError(f"part {part} has {len(rows)} rows but its "
                                     f"{sidecar(part, 'meta.json').name} says {meta['rows']}; "
                                     f"score that shard again")
                errors = read_errors(sidecar(part, "errors.csv")) if meta.get("skipped") else []
                for id_ in [r["id"] for r in rows] + [e[0] for e in errors]:
                    if id_ in owner:
                        raise TableError(f"the id '{id_}' is in both {owner[id_]} and {part}; "
                                         f"the parts overlap")
                    owner[id_] = part
                emb = factors.get(part)
                for row in rows:
                    row = {k: v for k, v in row.items() if k != "rank"}
                    if emb is not None:
                        row["_emb"] = emb(row["id"])
                    out.write(json.dumps(row) + "\n")
                for id_, message in errors:
                    out.write(json.dumps({"id": id_, "error": message}) + "\n")
        if len(owner) != first["pool_size"]:
            raise TableError(f"the parts hold {len(owner)} examples but the pool "
                             f"{first.get('pool')} has {first['pool_size']}; a part is incomplete")
        finished = finish([combined], dest, fmt, null=null, factors=not notes)
    run_id = new_run_id()
    files = [] if stream else write_sidecars(dest, finished, {
        **first, "alcli_version": __version__, "table_format": fmt, "shard": None, "shard_size": first["pool_size"],
        "merged_from": [str(p) for p in parts], "run_id": run_id})
    emb_file = None
    if not notes and finished.embeddings is None and finished.count:
        notes.append(f"the merged table has no embeddings ({finished.without_factors} rows have "
                     f"none in their part's embeddings file), so select cannot pick a diverse "
                     f"batch from it")
    elif not notes:
        emb_file, note = save_table_embeddings(finished, dest, fmt, run_id,
                                               None if stream else embeddings_path(dest), emb_folder)
        notes += [note] if note else []
    return MergeResult(finished, len(parts), files, emb_file, notes)


def _parts_factors(parts: list[str], metas: list[dict]) -> tuple[dict, list[str]]:
    """{part: id -> its encoded factors} from each part's PART.emb.npz (written by the same run,
    by the run ids in it and in PART.meta.json), or a note naming the part that has none."""
    factors = {}
    for part, meta in zip(parts, metas):
        path = embeddings_path(part)
        why = None
        if not Path(path).is_file():
            why = f"{path} does not exist"
        else:
            try:
                run = embeddings_run_id(path)
                if run and meta.get("run_id") and run != meta["run_id"]:
                    why = f"{path} was written by another run than {part}"
                else:
                    ids, a, b = load_embeddings(path)
            except EmbeddingsError as err:
                why = str(err).rstrip(".")
        if why:
            return {}, [f"the merged table has no embeddings ({why}), so select cannot pick a "
                        f"diverse batch from it; score that shard again"]
        factors[part] = functools.partial(_encoded, a.numpy(), b.numpy(),
                                          {id_: n for n, id_ in enumerate(ids)})
    return factors, []


def _encoded(a, b, at: dict[str, int], id_: str):
    return encode_factors(a[at[id_]], b[at[id_]]) if id_ in at else None


def _meta(part: str) -> dict:
    if not Path(part).is_file():
        raise TableError(f"part {part} does not exist")
    path = sidecar(part, "meta.json")
    meta = read_meta(path)
    if meta is None:
        raise TableError(f"part {part} has no {path.name} beside it; shard tables must be written "
                         f"by `alcli score --shard K/N -o FILE`")
    if meta.get("format") != "alcli-table" or "run" not in meta:
        raise TableError(f"{path} is not an alcli table description")
    _check_fields(path, meta)
    if meta.get("table_format") in LINE_FORMATS:
        raise TableError(f"part {part} holds one {meta['table_format'][:-1]} per line "
                         f"(-f {meta['table_format']}); score the shard as csv or jsonl")
    return meta


def _check_fields(path: Path, meta: dict) -> None:
    """The keys merge uses, of the right kinds (an edited file is named, not a traceback)."""
    shard = meta.get("shard")
    if shard is not None:
        match = re.fullmatch(r"(\d+)/(\d+)", shard) if isinstance(shard, str) else None
        if match is None or not int(match[1]) < int(match[2]):
            raise TableError(f"{path}: shard {json.dumps(shard)} is not K/N with K < N")
    if not isinstance(meta["run"], dict):
        raise TableError(f"{path}: run {json.dumps(meta['run'])} is not the settings of a run")
    for key in ("rows", "pool_size", "skipped"):
        value = meta.get(key, 0 if key == "skipped" else None)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise TableError(f"{path}: {key} is {json.dumps(value) if key in meta else 'missing'}"
                             f"; it should be a count of examples")


def _check_parts(parts: list[str], metas: list[dict]) -> None:
    shards: dict[int, str] = {}
    n_of = None
    for part, meta in zip(parts, metas):
        shard = meta.get("shard")
        if shard is None:
            raise TableError(f"part {part} is a whole-pool table, not a shard (scored without "
                             f"--shard)")
        k, n = (int(x) for x in shard.split("/"))
        if n_of is None:
            n_of = (n, part)
        elif n != n_of[0]:
            raise TableError(f"part {part} is shard {shard} but {n_of[1]} is a shard of "
                             f"{n_of[0]}; merge shards of one split")
        if k in shards:
            raise TableError(f"parts {shards[k]} and {part} are both shard {shard}; the parts "
                             f"overlap")
        shards[k] = part
        _check_same(metas[0], meta, parts[0], part)
    n = n_of[0]
    missing = [f"{k}/{n}" for k in range(n) if k not in shards]
    if missing:
        raise TableError(f"shard {', '.join(missing)} is missing; merge needs all {n} shards "
                         f"(got {', '.join(f'{k}/{n}' for k in sorted(shards))})")


def _check_same(a: dict, b: dict, part_a: str, part_b: str) -> None:
    for key in sorted(set(a["run"]) | set(b["run"])):
        if a["run"].get(key) != b["run"].get(key):
            what = "pool" if key == "pool_fingerprint" else key
            raise TableError(f"parts {part_a} and {part_b} were scored with different {what} "
                             f"({a['run'].get(key)!r} vs {b['run'].get(key)!r})")
