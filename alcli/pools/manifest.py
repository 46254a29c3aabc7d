"""Image manifests: a .csv or .jsonl with a `path` column (optional `id`, `label`, `mask`), local
or in an object store (its images then beside it there)."""
from __future__ import annotations

import csv
import io
from pathlib import Path

from ..errors import PoolError, first_line
from ..files import remote
from ..files.jsonl import json_objects
from .common import (MANIFEST_EXTS, Pool, PoolKind, PoolOptions, csv_error, image_pool,
                     label_index, named_label, shortened, task_label, with_task_labels)


def _is_manifest(spec, opts: PoolOptions) -> bool:
    return isinstance(spec, str) and Path(spec).suffix.lower() in MANIFEST_EXTS


def _files_named(spec: str):
    """A row's id -> the image the manifest names for it."""
    if not Path(spec).is_file():
        return lambda i: None
    pool = from_manifest(spec, PoolOptions())
    return dict(zip(pool.ids, (str(p) for p in pool.paths))).get


KIND = PoolKind("image manifest", _is_manifest, lambda spec, opts, stdin: from_manifest(spec, opts),
                options=("class_names", "labels_as_given"), files_of=_files_named)


def from_manifest(spec, opts: PoolOptions) -> Pool:
    """A .csv or .jsonl with `path` (relative to the manifest), optional `id` and `label`; the
    manifest may be an object-store file (a remote.Remote), its images then beside it there."""
    path = spec if isinstance(spec, remote.Remote) else Path(spec)
    base = remote.parent(path)
    records: list[tuple[int, dict]] = []  # (line number, record)
    try:
        with _text_of(path) as f:
            if str(path).lower().endswith(".csv"):
                reader = csv.DictReader(f)
                if not reader.fieldnames or "path" not in reader.fieldnames:
                    raise PoolError(f"manifest {path} has no 'path' column "
                                    f"(columns: {shortened(', '.join(reader.fieldnames or []))})")
                records = [(reader.line_num, row) for row in reader]
            else:
                records = list(json_objects(f, lambda n: f"manifest {path} line {n}", PoolError))
    except (OSError, UnicodeDecodeError) as err:
        raise PoolError(f"manifest {path} cannot be read as UTF-8 text ({first_line(err)})") from None
    except csv.Error as err:  # a field over CSV_FIELD_LIMIT, ...
        raise csv_error(path, reader, err) from None
    rows, task_labels = [], {}
    for n, row in records:
        where = f"manifest {path} line {n}"
        if not row.get("path"):
            raise PoolError(f"{where} has no path")
        full = _image_path(str(row["path"]), base)
        id_ = row.get("id")
        raw = task_label(row, opts, base)
        rows.append((str(id_) if id_ not in (None, "") else str(row["path"]), full,
                     -1 if raw is not None else label_index(named_label(row.get("label"), where, opts), where)))
        if raw is not None:
            task_labels[rows[-1][0]] = (where, raw)
    pool = with_task_labels(image_pool(str(path), rows, opts), task_labels)
    # the label columns a detector would take as given boxes (detection.refuses_given_boxes refuses them)
    pool.given_columns = (str(path), [c for c in ("boxes", "label")
                                      if any(row.get(c) not in (None, "", []) for _, row in records)])
    # each row's `boxes` cell as given, for alcli review of a detector (detection.given_boxes reads it)
    pool.given_boxes = {id_: (f"manifest {path} line {n}", row["boxes"]) for (n, row), (id_, *_) in
                        zip(records, rows) if row.get("boxes") not in (None, "")}
    return pool


def _text_of(path):
    """A manifest open as text (UTF-8, a BOM dropped), local or in an object store."""
    if isinstance(path, remote.Remote):
        return io.StringIO(remote.read_bytes(path).decode("utf-8-sig"), newline="")
    return open(path, newline="", encoding="utf-8-sig")


def _image_path(value: str, base):
    """A manifest's image: a URL, an absolute path, or a path relative to the manifest's folder
    (in its object store for a remote manifest)."""
    if remote.is_url(value):
        return remote.locate(value)
    if isinstance(base, remote.Remote):
        return remote.join(base, value)
    p = Path(value)
    return p if p.is_absolute() else base / p
