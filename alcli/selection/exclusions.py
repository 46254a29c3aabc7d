"""Exclusion files for `alcli select --exclude`: the ids never to select (already labeled)."""
from __future__ import annotations

import csv
import io
import json
import os
import sys
from typing import Iterable


class ExclusionsError(ValueError):
    """An exclusions file is unreadable or malformed; the message names the file (and line)."""


def read_exclusions(paths: Iterable[str]) -> set[str]:
    """Ids listed in exclusion files, by extension:

    - .csv: needs a header row; the `id` column, else the first column.
    - .jsonl / .ndjson: one JSON object per non-blank line with an "id" key.
    - .json: an array of ids, or of objects with an "id" key.
    - anything else (and `-`, stdin): one id or path per line; blank lines ignored.
    Ids are compared as exact strings (surrounding whitespace stripped).
    """
    out: set[str] = set()
    for path in paths:
        out |= _read_one(path)
    return out


def _read_one(path: str) -> set[str]:
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


def _from_lines(path: str, text: str) -> set[str]:
    return {line.strip() for line in text.splitlines() if line.strip()}


def _from_csv(path: str, text: str) -> set[str]:
    reader = csv.reader(io.StringIO(text))
    out: set[str] = set()
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
            out.add(row[col].strip())
    except csv.Error as err:
        raise ExclusionsError(f"exclusions file {path}, line {reader.line_num}: "
                              f"not valid CSV ({err}).") from err
    return out


def _id_of(path: str, where: str, item) -> str:
    if isinstance(item, dict) and "id" in item and isinstance(item["id"], (str, int)):
        return str(item["id"]).strip()
    raise ExclusionsError(f"exclusions file {path}, {where}: expected an object with an 'id' "
                          f"(text or number).")


def _from_jsonl(path: str, text: str) -> set[str]:
    out = set()
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError as err:
            raise ExclusionsError(f"exclusions file {path}, line {n}: not valid JSON "
                                  f"({err.msg}).") from err
        out.add(_id_of(path, f"line {n}", item))
    return out


def _from_json(path: str, text: str) -> set[str]:
    try:
        items = json.loads(text)
    except json.JSONDecodeError as err:
        raise ExclusionsError(f"exclusions file {path} is not valid JSON ({err.msg}, "
                              f"line {err.lineno}).") from err
    if not isinstance(items, list):
        raise ExclusionsError(f"exclusions file {path} must hold a JSON array of ids or objects.")
    return {str(x).strip() if isinstance(x, (str, int)) and not isinstance(x, bool)
            else _id_of(path, f"item {n}", x) for n, x in enumerate(items, 1)}
