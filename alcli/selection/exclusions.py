"""What `alcli select` must never pick (already labeled): ids and paths from files or memory.

An entry may name a row by its id, or by its file: a path (absolute, or relative to the working
directory) that is the row's `path`, or a Label Studio image URL that `--image-root` maps back to
the id. Entries that match no row cannot pass silently: a source none of whose entries match is
an error, a partial match a warning.
"""
from __future__ import annotations

import csv
import io
import json
import os
import sys
from dataclasses import dataclass
from typing import Iterable
from urllib.parse import unquote

from ..errors import ConfigError
from .export import image_ref


class ExclusionsError(ConfigError, ValueError):
    """An exclusions file is unreadable, malformed, or matches nothing; the message names it."""


@dataclass
class Exclusions:
    """The entries of one source: a file, or ids given in memory (`name` says which)."""
    name: str
    entries: list[str]


def read_exclusion_files(paths: Iterable[str]) -> list[Exclusions]:
    """The entries of each exclusion file, by extension:

    - .csv: needs a header row; the `id` column, else the first column (alcli's tables, manifests).
    - .jsonl / .ndjson: one JSON object per non-blank line with an "id" key (alcli's -f jsonl).
    - .json: an array of ids, of objects with an "id" key, or of Label Studio tasks (their
      `data.alcli_id`, else `data.image`): alcli's -f labelstudio output and Label Studio exports.
    - anything else (and `-`, stdin): one id or path per line; blank lines ignored.
    Surrounding whitespace is stripped.
    """
    return [Exclusions(f"exclusions file {path}", _read_one(path)) for path in paths]


def read_exclusions(paths: Iterable[str]) -> set[str]:
    """Every entry of the exclusion files, as one set."""
    return {e for source in read_exclusion_files(paths) for e in source.entries}


def excluded_ids(sources: list[Exclusions], rows: list[dict],
                 image_root: str | None = None) -> tuple[set[str], list[str]]:
    """(ids of `rows` that some entry names, warnings). A source that names none of the rows is
    an ExclusionsError; one that names only some of them gives a warning with the count."""
    index = _row_keys(rows, image_root)
    excluded: set[str] = set()
    notes = []
    for source in sources:
        unmatched = []
        for entry in source.entries:
            hits = {index[k] for k in _entry_keys(entry, image_root) if k in index}
            excluded |= hits
            if not hits:
                unmatched.append(entry)
        if not source.entries or not unmatched:
            continue
        if len(unmatched) == len(source.entries):
            raise ExclusionsError(f"none of the {len(unmatched)} entries of {source.name} names a "
                                  f"row of the table by id or file (the first is '{unmatched[0]}')")
        notes.append(f"{len(unmatched)} of the {len(source.entries)} entries of {source.name} name "
                     f"no row of the table (the first is '{unmatched[0]}')")
    return excluded, notes


def _row_keys(rows: list[dict], image_root: str | None) -> dict[str, str]:
    """Every way an entry may name a row -> the row's id: the id, its file (absolute), and its
    Label Studio image reference."""
    index: dict[str, str] = {}
    for row in rows:
        id_ = str(row["id"])
        index.setdefault(_absolute(row.get("path") or id_), id_)
        if image_root:
            index.setdefault(image_ref(id_, image_root), id_)
    for row in rows:  # ids first: an id always names its own row
        index[str(row["id"])] = str(row["id"])
    return index


def _entry_keys(entry: str, image_root: str | None) -> list[str]:
    keys = [entry, os.path.normpath(entry), _absolute(entry)]
    if image_root and entry.startswith(image_root):  # a URL under --image-root: the id after it
        keys.append(unquote(entry[len(image_root):].lstrip("/")))
    return keys


def _absolute(path: str) -> str:
    return os.path.normpath(os.path.abspath(path))


def _read_one(path: str) -> list[str]:
    ext = os.path.splitext(path)[1].lower()
    try:
        if path == "-":
            return _from_lines(path, sys.stdin.read())
        with open(path, encoding="utf-8-sig", newline="") as fh:
            text = fh.read()
    except (OSError, UnicodeDecodeError) as err:
        raise ExclusionsError(f"cannot read exclusions file {path}: {err}.") from err
    if ext == ".csv":
        return _from_csv(path, text)
    if ext in (".jsonl", ".ndjson"):
        return _from_jsonl(path, text)
    if ext == ".json":
        return _from_json(path, text)
    return _from_lines(path, text)


def _from_lines(path: str, text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if line.strip()]


def _from_csv(path: str, text: str) -> list[str]:
    reader = csv.reader(io.StringIO(text))
    out: list[str] = []
    try:
        header = [h.strip() for h in next(reader, [])]
        col = header.index("id") if "id" in header else 0
        for row in reader:
            if not any(cell.strip() for cell in row):
                continue
            if col >= len(row) or not row[col].strip():
                name = header[col] if col < len(header) else col + 1
                raise ExclusionsError(f"exclusions file {path}, line {reader.line_num}: "
                                      f"no value in column '{name}'.")
            out.append(row[col].strip())
    except csv.Error as err:
        raise ExclusionsError(f"exclusions file {path}, line {reader.line_num}: "
                              f"not valid CSV ({err}).") from err
    return out


def _id_of(path: str, where: str, item) -> str:
    """An object's id: a Label Studio task's data.alcli_id (else data.image), else its "id"."""
    data = item.get("data") if isinstance(item, dict) else None
    if isinstance(data, dict):
        for key in ("alcli_id", "image"):
            if isinstance(data.get(key), (str, int)) and not isinstance(data[key], bool):
                return str(data[key]).strip()
    if isinstance(item, dict) and "id" in item and isinstance(item["id"], (str, int)):
        return str(item["id"]).strip()
    raise ExclusionsError(f"exclusions file {path}, {where}: expected an object with an 'id' "
                          f"(text or number) or a Label Studio task with data.image.")


def _from_jsonl(path: str, text: str) -> list[str]:
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError as err:
            raise ExclusionsError(f"exclusions file {path}, line {n}: not valid JSON "
                                  f"({err.msg}).") from err
        out.append(_id_of(path, f"line {n}", item))
    return out


def _from_json(path: str, text: str) -> list[str]:
    try:
        items = json.loads(text)
    except json.JSONDecodeError as err:
        raise ExclusionsError(f"exclusions file {path} is not valid JSON ({err.msg}, "
                              f"line {err.lineno}).") from err
    if not isinstance(items, list):
        raise ExclusionsError(f"exclusions file {path} must hold a JSON array of ids or objects.")
    return [str(x).strip() if isinstance(x, (str, int)) and not isinstance(x, bool)
            else _id_of(path, f"item {n}", x) for n, x in enumerate(items, 1)]
