"""The files a finished scoring run leaves beside OUTPUT:

    OUTPUT             the ranked table (written to a temporary file, then renamed)
    OUTPUT.errors.csv  `id,error` of the skipped examples (only when there are some)
    OUTPUT.meta.json   what the table holds: counts, shard, pool fingerprint, settings, run id
    OUTPUT.emb.npz     the BADGE factors the rows carried (`_emb` in the partial files), with
                       the same run id; a table on stdout keeps them in ./.alcli/

The table is ranked from partial files (see partial.py) without holding the rows: only
(score, id, offset) per example is kept in memory, and each row is read back from its offset
when it is written.
"""
from __future__ import annotations

import csv
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import numpy as np

from ..files.atomic import STREAM_FOLDER, writes_stream
from ..files.embeddings import (decode_factors, prune_stream_embeddings, save_embeddings,
                                stream_embeddings_path)
from ..files.table import (LINE_FORMATS, atomic_file, columns_of, remove_sidecars, sidecar,
                           write_meta, write_rows)
from ..selection.rank import score_order
from .partial import read_record


@dataclass
class Finished:
    count: int = 0                      # rows in the table
    nans: int = 0                       # of which score NaN (ranked last)
    errors: list[tuple[str, str]] = field(default_factory=list)  # skipped examples
    top: list[dict] = field(default_factory=list)  # the best rows, ranked (for the summary)
    rows: list[dict] | None = None      # every row, ranked, when the table is kept in memory
    embeddings: Factors | None = None   # the rows' BADGE factors, when every row carried them
    without_factors: int = 0            # rows that carried none (when they were collected)


@dataclass
class Factors:
    """The factors rows carried through the partial files (`_emb`), in file order."""
    ids: list[str] = field(default_factory=list)
    scores: list[float] = field(default_factory=list)
    a: list[np.ndarray] = field(default_factory=list)  # [C] each
    b: list[np.ndarray] = field(default_factory=list)  # [D] each

    def add(self, record: dict) -> bool:
        try:
            a, b = decode_factors(record.get("_emb"))
        except (ValueError, TypeError):
            return False
        self.ids.append(record["id"])
        self.scores.append(float("nan") if record["score"] is None else float(record["score"]))
        self.a.append(a)
        self.b.append(b)
        return True


def finish(sources: list[Path], dest, fmt: str, *, top: int = 5, null: bool = False,
           factors: bool = False) -> Finished:
    """Rank the rows of the partial files `sources` into the table `dest` (a path, '-' or None
    for stdout), streaming: rows are read back one by one in rank order. `null`: -f paths / ids
    records end in NUL. `factors`: collect the BADGE factors the rows carry (`_emb`, never a
    column of the table) into `Finished.embeddings`."""
    keys = []          # (order key, source index, offset)
    errors: dict[str, str] = {}
    seen: set[str] = set()
    columns: dict[str, None] = {}
    nans = 0
    collected, without = Factors(), 0
    for s, path in enumerate(sources):
        with open(path, "rb") as f:
            offset = len(f.readline())
            for n, line in enumerate(f, 2):
                if not line.endswith(b"\n"):
                    break
                record = read_record(path, n, line)
                id_ = record["id"]
                if id_ not in seen:
                    seen.add(id_)
                    if "score" in record:
                        for key in record:
                            if key != "_emb":
                                columns.setdefault(key, None)
                        if factors and not collected.add(record):
                            without += 1
                        key = score_order(record["score"], id_)
                        nans += key[0]  # NaN (or None) scores sort last
                        keys.append((key, s, offset))
                    else:
                        errors[id_] = str(record.get("error", ""))
                offset += len(line)
    keys.sort()
    cols = columns_of([{"rank": None, **columns}])
    out = Finished(count=len(keys), nans=nans, errors=sorted(errors.items()),
                   embeddings=collected if factors and not without else None,
                   without_factors=without)

    def ranked() -> Iterator[dict]:
        handles = [open(p, "rb") for p in sources]
        try:
            for rank, (_, s, offset) in enumerate(keys, 1):
                f = handles[s]
                f.seek(offset)
                record = json.loads(f.readline())
                record.pop("_emb", None)
                row = {"rank": rank, **record}
                if row.get("score") is None:
                    row["score"] = float("nan")
                if rank <= top:
                    out.top.append(row)
                yield row
        finally:
            for f in handles:
                f.close()

    if keys:
        write_rows(ranked(), cols, dest, fmt, null)
    elif dest not in (None, "-"):
        with atomic_file(dest):  # no rows: an empty file (its meta says 0 rows)
            pass
    return out


def save_table_embeddings(finished: Finished, dest, fmt: str, run_id: str, path: str | None,
                          stream_folder: Path | None) -> tuple[str | None, str | None]:
    """Write the factors the table's rows carried to `path` (TABLE.emb.npz or --embeddings FILE)
    with the table's run id and the rows' scores -> (the file written, a note for people). A
    table on stdout (`path` None) keeps them in ./.alcli/stdout-RUNID.emb.npz, where `select`
    finds them by the rows' ids and scores; `stream_folder` is where this run could write."""
    emb = finished.embeddings
    if emb is None or not emb.ids:
        return None, None
    if path is None:
        if not writes_stream(dest) or fmt in LINE_FORMATS:
            return None, None  # not wanted; or -f ids / paths, a hand-off that select never reads
        if stream_folder is None or stream_folder.resolve() != STREAM_FOLDER.resolve():
            return None, (f"no embeddings kept for the table on stdout (./{STREAM_FOLDER} cannot "
                          f"be written), so select cannot pick a diverse batch from it; write "
                          f"the table with -o FILE")
        path = str(stream_embeddings_path(STREAM_FOLDER, run_id))
    save_embeddings(path, emb.ids, np.stack(emb.a), np.stack(emb.b), run_id, emb.scores)
    if writes_stream(dest):
        prune_stream_embeddings(STREAM_FOLDER)
    return path, None


def write_sidecars(dest: str | Path, finished: Finished, meta: dict) -> list[str]:
    """DEST.errors.csv (only when examples were skipped) and DEST.meta.json: `meta` plus the
    table's own name and counts -> the files written. An earlier DEST.emb.npz is removed: the
    caller writes this run's, if any."""
    errors_path, meta_path = sidecar(dest, "errors.csv"), sidecar(dest, "meta.json")
    write_errors(errors_path, finished.errors)
    write_meta(meta_path, {**meta, "table": Path(dest).name, "rows": finished.count,
                           "nan_scores": finished.nans, "skipped": len(finished.errors),
                           "errors_file": errors_path.name if finished.errors else None})
    remove_sidecars(dest, keep=("meta.json", "errors.csv"))
    return ([str(errors_path)] if finished.errors else []) + [str(meta_path)]


def write_errors(path: Path, errors: list[tuple[str, str]]) -> None:
    """OUTPUT.errors.csv (`id,error`), or no file (an old one removed) when nothing was skipped."""
    if not errors:
        path.unlink(missing_ok=True)
        return
    with atomic_file(path, "errors file") as f:
        writer = csv.writer(f, lineterminator="\n")
        writer.writerow(["id", "error"])
        writer.writerows(errors)


def read_errors(path: Path) -> list[tuple[str, str]]:
    if not path.exists():
        return []
    with open(path, newline="", encoding="utf-8", errors="surrogateescape") as f:
        return [(row["id"], row["error"]) for row in csv.DictReader(f)]
