"""What `alcli select` must never pick (already labeled): ids and paths from files or memory.

An entry may name a row by its id, or by its file: a path (absolute, or relative to the working
directory) that is the row's `path`, or a Label Studio image URL that `--image-root` maps back to
the id; or, for text pools, by its text. Each entry excludes at most one row: the row whose id it
is, if there is one, else the row whose file it names, else the row whose whole text it is (so
`imgs/a.png` never excludes both the row with that id and the row of the file ./imgs/a.png; a
warning says when an entry could name both). Label Studio's exports (JSON, JSON-MIN, CSV, TSV)
name their tasks by the `alcli_id` alcli writes into them, else by the image or text, never by
Label Studio's own task `id`; tasks exported without an annotation are not labeled and not
excluded. Entries that match no row cannot pass silently: a source none of whose entries match is
an error, a partial match a warning.
"""
from __future__ import annotations

import contextlib
import csv
import io
import json
import os
import sys
from dataclasses import dataclass
from typing import Iterable
from urllib.parse import unquote

from ..errors import ConfigError
from ..files.table import MORE, clip_text
from .export import image_ref


class ExclusionsError(ConfigError, ValueError):
    """An exclusions file is unreadable, malformed, or matches nothing; the message names it."""


@dataclass
class Exclusions:
    """The entries of one source: a file, or ids given in memory (`name` says which)."""
    name: str
    entries: list[str]
    by_content: bool = False  # a labeled table whose embeddings find its duplicates: may match no row


def read_exclusion_files(paths: Iterable[str]) -> list[Exclusions]:
    """The entries of each exclusion file, by extension:

    - .csv / .tsv: needs a header row; the `id` column, else the first column (alcli's tables,
      manifests); Label Studio's CSV and TSV exports: `alcli_id`, else `image`, else `text`.
    - .jsonl / .ndjson: one JSON object per non-blank line with an "id" key (alcli's -f jsonl).
    - .json: an array of ids, of objects with an "id" key, of Label Studio tasks (their
      `data.alcli_id`, else `data.image`, else `data.text`): alcli's -f labelstudio output and
      Label Studio's JSON export; or Label Studio's JSON-MIN export (the same keys, top level).
    - anything else (and `-`, stdin): one id or path per line; blank lines ignored.
    Surrounding whitespace is stripped.
    """
    return [Exclusions(f"exclusions file {path}", _read_one(path)) for path in paths]


def read_exclusions(paths: Iterable[str]) -> set[str]:
    """Every entry of the exclusion files, as one set."""
    return {e for source in read_exclusion_files(paths) for e in source.entries}


def excluded_ids(sources: list[Exclusions], rows: list[dict], image_root: str | None = None,
                 what: str = "row of the table") -> tuple[set[str], list[str]]:
    """(ids of `rows` that some entry names, warnings). A source that names none of the rows is
    an ExclusionsError; one that names only some of them gives a warning with the count. `what`
    is what messages call a row ("pool example" when score excludes before scoring)."""
    ids, files = _row_keys(rows, image_root)
    texts = _text_keys(rows)
    excluded: set[str] = set()
    notes = []
    for source in sources:
        unmatched, both = [], []
        for entry in source.entries:
            hit = _by_id(entry, ids, image_root)
            by_file = _by_file(entry, files)
            if hit is not None and by_file not in (None, hit):
                both.append((entry, by_file))
            hit = by_file if hit is None else hit
            hit = _text_hit(entry, *texts) if hit is None else hit
            if hit is None:
                unmatched.append(entry)
            else:
                excluded.add(hit)
        if both:
            notes.append(_both_note(source.name, both))
        if not source.entries or not unmatched or source.by_content:
            continue
        if len(unmatched) == len(source.entries):
            raise ExclusionsError(f"none of the {len(unmatched)} entries of {source.name} names a "
                                  f"{what} by id or file (the first is '{unmatched[0]}')")
        notes.append(f"{len(unmatched)} of the {len(source.entries)} entries of {source.name} name "
                     f"no {what} (the first is '{unmatched[0]}')")
    return excluded, notes


def _both_note(name: str, both: list[tuple[str, str]]) -> str:
    (entry, other), n = both[0], len(both)
    if n == 1:
        return (f"the entry '{entry}' of {name} is the id of one row and the file of another "
                f"(id '{other}'); only the row with that id is excluded")
    return (f"{n} entries of {name} are the id of one row and the file of another (the first is "
            f"'{entry}', also the file of id '{other}'); only the rows with those ids are excluded")


def _row_keys(rows: list[dict], image_root: str | None) -> tuple[set[str], dict[str, str]]:
    """(the rows' ids, their files -> id): a row's file is its path (absolute) and its Label
    Studio image reference."""
    files: dict[str, str] = {}
    for row in rows:
        id_ = str(row["id"])
        files.setdefault(_absolute(row.get("path") or id_), id_)
        if image_root:
            with contextlib.suppress(ValueError):  # an id that cannot be under the root
                files.setdefault(image_ref(id_, image_root), id_)
    return {str(row["id"]) for row in rows}, files


def _text_keys(rows: list[dict]) -> tuple[dict[str, str], set[int]]:
    """(a text pool's texts -> the row's id, the widths texts were cut at), for entries that
    name a row by its whole text; a text that two rows share names neither."""
    index: dict[str, str | None] = {}
    for row in rows:
        text = row.get("text")
        text = text.strip() if isinstance(text, str) and not text.endswith(MORE) else text
        if isinstance(text, str) and text:  # entries are stripped: so are whole texts
            index[text] = None if text in index else str(row["id"])
    widths = {len(t) - 1 for t in index if t.endswith(MORE)}
    return {t: i for t, i in index.items() if i is not None}, widths


def _text_hit(entry: str, texts: dict[str, str], widths: set[int]) -> str | None:
    """The id of the row whose text is `entry`, whole or as the table's text column cuts it."""
    for key in [entry] + [clip_text(entry, w) for w in sorted(widths)]:
        if key in texts:
            return texts[key]
    return None


def _by_id(entry: str, ids: set[str], image_root: str | None) -> str | None:
    """The id `entry` is: as written, normalised, or a URL under --image-root followed by it."""
    keys = [entry, os.path.normpath(entry)]
    if image_root and entry.startswith(image_root):
        keys.append(unquote(entry[len(image_root):].lstrip("/")))
    return next((k for k in keys if k in ids), None)


def _by_file(entry: str, files: dict[str, str]) -> str | None:
    """The id of the row whose file (or Label Studio image) `entry` names."""
    return next((files[k] for k in (entry, _absolute(entry)) if k in files), None)


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
    if ext in (".csv", ".tsv"):
        return _from_csv(path, text, "\t" if ext == ".tsv" else ",")
    if ext in (".jsonl", ".ndjson"):
        return _from_jsonl(path, text)
    if ext == ".json":
        return _from_json(path, text)
    return _from_lines(path, text)


def _from_lines(path: str, text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if line.strip()]


def _from_csv(path: str, text: str, delimiter: str = ",") -> list[str]:
    reader = csv.reader(io.StringIO(text), delimiter=delimiter)
    out: list[str] = []
    try:
        header = [h.strip() for h in next(reader, [])]
        col = header.index("id") if "id" in header else 0
        labelstudio = "alcli_id" in header or _is_export(header)
        for row in reader:
            if not any(cell.strip() for cell in row):
                continue
            if labelstudio:
                entry = _export_entry(path, f"line {reader.line_num}", dict(zip(header, row)))
                out.extend([entry] if entry is not None else [])
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


EXPORT_KEYS = ("annotation_id", "annotator")  # the columns of every JSON-MIN / CSV / TSV export
TASK_KEYS = ("alcli_id", "image", "text")     # what names the row, in this order


def _is_export(keys) -> bool:
    """A record of Label Studio's JSON-MIN, CSV or TSV export (one per annotation)?"""
    return all(k in keys for k in EXPORT_KEYS)


def _export_entry(path: str, where: str, record: dict) -> str | None:
    """A Label Studio export record's alcli_id, else its image, else its text; None for a task
    exported without an annotation (an empty annotation_id): it is not labeled."""
    if _is_export(record) and record.get("annotation_id") in (None, ""):
        return None
    for key in TASK_KEYS:
        value = record.get(key)
        if isinstance(value, (str, int)) and not isinstance(value, bool) and str(value).strip():
            return str(value).strip()
    raise ExclusionsError(f"exclusions file {path}, {where}: a Label Studio task with no "
                          f"{', '.join(TASK_KEYS)} field to match a row by (its task id is Label "
                          f"Studio's own, not alcli's).")


def _labeled(task: dict) -> bool:
    """Does a Label Studio JSON task hold an annotation? (alcli's own tasks have no
    `annotations` key: every one of them counts, as sent for labeling.)"""
    notes = task.get("annotations", task.get("completions"))
    if not isinstance(notes, list):
        return True
    return any(isinstance(a, dict) and not (a.get("was_cancelled") or a.get("skipped"))
               for a in notes)


def _id_of(path: str, where: str, item) -> str | None:
    """An object's id: a Label Studio task's data.alcli_id (else data.image, data.text; None
    when it has no annotation), a JSON-MIN record's alcli_id (else image, text), else its "id"."""
    data = item.get("data") if isinstance(item, dict) else None
    if isinstance(data, dict):
        return _export_entry(path, where, data) if _labeled(item) else None
    if isinstance(item, dict) and ("alcli_id" in item or _is_export(item)):
        return _export_entry(path, where, item)
    if isinstance(item, dict) and "id" in item and isinstance(item["id"], (str, int)):
        return str(item["id"]).strip()
    raise ExclusionsError(f"exclusions file {path}, {where}: expected an object with an 'id' "
                          f"(text or number) or a Label Studio task with data.image.")


_TOO_DEEP = "JSON arrays or objects nested too deeply to read (ids need at most a task object)"


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
        except RecursionError:
            raise ExclusionsError(f"exclusions file {path}, line {n}: {_TOO_DEEP}.") from None
        entry = _id_of(path, f"line {n}", item)
        out.extend([entry] if entry is not None else [])
    return out


def _from_json(path: str, text: str) -> list[str]:
    try:
        items = json.loads(text)
    except json.JSONDecodeError as err:
        raise ExclusionsError(f"exclusions file {path} is not valid JSON ({err.msg}, "
                              f"line {err.lineno}).") from err
    except RecursionError:
        raise ExclusionsError(f"exclusions file {path}: {_TOO_DEEP}.") from None
    if not isinstance(items, list):
        raise ExclusionsError(f"exclusions file {path} must hold a JSON array of ids or objects.")
    entries = [str(x).strip() if isinstance(x, (str, int)) and not isinstance(x, bool)
               else _id_of(path, f"item {n}", x) for n, x in enumerate(items, 1)]
    return [e for e in entries if e is not None]
