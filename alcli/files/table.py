"""Reading and writing ranked tables: CSV, JSONL, one file path per line ("paths") or one id per
line ("ids"); files written atomically.

Rows are plain dicts. Columns come in a fixed order: rank,id,score,pred, pred_index (when the
classes are named: `pred` is then the name), confidence, then label (when known), loss, then
whatever else the rows carry, in first-seen order (image pools end with `path`, the example's file;
text pools with `text`, cut at --text-width characters). Floats are written with `repr`, so reading a table back gives the very same
numbers.
"""
from __future__ import annotations

import contextlib
import csv
import io
import json
import math
import re
import sys
from pathlib import Path
from typing import IO, Iterable, Iterator

from .atomic import atomic_open
from ..errors import RunError, TableError
from .jsonl import json_objects

BASE_COLUMNS = ("rank", "id", "score", "pred", "pred_index", "confidence", "label", "loss")
INT_COLUMNS = ("rank", "pred", "pred_index", "label")
NAME_COLUMNS = ("pred", "label")  # a class index, or its name when the classes are named: then
                                 # the table has pred_index (or its meta.json records the names)
                                 # and they are read as text, so a class named "2" stays a name
TEXT_COLUMNS = ("id", "text", "prompt", "completions")  # read as text whatever they hold ("42", "nan")
MORE = "\u2026"  # ends a text cut short by clip_text
FORMATS = ("csv", "jsonl", "paths", "ids")
LINE_FORMATS = ("paths", "ids")  # one value per line, no header: for shell pipelines


def columns_of(rows: Iterable[dict]) -> list[str]:
    """The base columns any row has, in their fixed order, then the others in first-seen order."""
    seen: dict[str, None] = {}
    for row in rows:
        for key in row:
            seen.setdefault(key, None)
    return [c for c in BASE_COLUMNS if c in seen] + [c for c in seen if c not in BASE_COLUMNS]


def clip_text(text: str, width: int) -> str:
    """The table's `text` column: the first `width` characters and "…" (0: the whole text)."""
    return text if width == 0 or len(text) <= width else text[:width] + MORE


def format_value(value) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return repr(value)  # shortest string that reads back as the same float ('nan', 'inf' too)
    return str(value)


def _json_value(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None if math.isnan(value) else repr(value)
    return value


def render(rows: Iterable[dict], columns: list[str], fmt: str = "csv",
           header: bool = True, null: bool = False) -> Iterator[str]:
    """Lines of text (each ending in a newline) for `rows` in `fmt`; with `null`, paths and ids
    end in NUL instead (see `_records`)."""
    if fmt not in FORMATS:
        raise TableError(f"unknown table format '{fmt}' (choose {', '.join(FORMATS)})")
    if fmt in LINE_FORMATS:
        yield from _records(rows, columns, fmt, null)
        return
    if fmt == "jsonl":
        for row in rows:
            yield json.dumps({c: _json_value(row.get(c)) for c in columns}) + "\n"
        return
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    quoted = csv.writer(buf, lineterminator="\n", quoting=csv.QUOTE_ALL)
    if header:
        writer.writerow(columns)
    for row in rows:
        values = [format_value(row.get(c)) for c in columns]
        # the csv module quotes a field holding \n but not a bare \r, which readers take as a
        # line end: a row with one is written with every field quoted
        (quoted if any("\r" in v for v in values) else writer).writerow(values)
        yield buf.getvalue()
        buf.seek(0)
        buf.truncate()
    if buf.tell():
        yield buf.getvalue()


def _records(rows: Iterable[dict], columns: list[str], fmt: str, null: bool) -> Iterator[str]:
    """-f paths / -f ids: one value per record, ended by a newline, or by NUL with `null`
    (`find -print0`, for `xargs -0`). Every value is checked before the first is written."""
    key = "path" if fmt == "paths" else "id"
    if fmt == "paths" and "path" not in columns:
        raise TableError("-f paths writes each example's file, but these rows have no 'path' "
                         "(a tensor pool, or a table from an older alcli); use -f ids")
    values = [str(row[key]) for row in rows]
    check_records(values, fmt, null)
    end = "\0" if null else "\n"
    for value in values:
        yield value + end


# what would cut a record in two for `xargs`, `while read` or Python's splitlines
_BREAKS = re.compile(r"[\x00-\x1f\x7f\x85\u2028\u2029]")
_NUL = re.compile("\x00")
_BREAK_NAMES = {"\n": "a newline", "\r": "a carriage return", "\t": "a tab", "\0": "a NUL"}


def check_records(values: Iterable[str], fmt: str, null: bool = False) -> None:
    """Refuse a path or id that would not come out as one record: with newline endings, one
    holding a line break or other control character; with NUL endings, one holding a NUL."""
    what = "file" if fmt == "paths" else "id"
    for value in values:
        found = (_NUL if null else _BREAKS).search(value)
        if not found:
            continue
        name = _BREAK_NAMES.get(found.group(), f"the control character U+{ord(found.group()):04X}")
        instead = ("use -f csv" if null else "pass -0/--null to end each record with NUL "
                   "instead (for xargs -0), or use -f csv")
        raise TableError(f"-f {fmt} cannot write the {what} {value!r}: it holds "
                         f"{name}, which would split it into two records; {instead}")


def write_table(rows: list[dict], dest: str | Path | IO[str] | None, fmt: str = "csv",
                null: bool = False) -> None:
    """Write `rows` to a file (atomically: a temporary file renamed into place), or to stdout
    when `dest` is None or '-', or to an open text stream."""
    write_rows(rows, columns_of(rows), dest, fmt, null)


def write_rows(rows: Iterable[dict], columns: list[str], dest: str | Path | IO[str] | None,
               fmt: str = "csv", null: bool = False) -> None:
    """`write_table` for rows that arrive one by one (a generator) with their columns known."""
    if dest is None or str(dest) == "-":
        dest = sys.stdout
        if hasattr(dest, "reconfigure"):  # ids from non-UTF-8 file names: their bytes as they are
            dest.reconfigure(errors="surrogateescape")
    if not isinstance(dest, (str, Path)):
        dest.writelines(render(rows, columns, fmt, null=null))
        dest.flush()
        return
    with atomic_file(dest, "output") as f:
        f.writelines(render(rows, columns, fmt, null=null))


@contextlib.contextmanager
def atomic_file(dest: str | Path, what: str = "output") -> Iterator[IO[str]]:
    """A text table written atomically (see atomic.py); failures become one TableError sentence.
    Ids from file names that are not UTF-8 (surrogate escapes) are written as their raw bytes."""
    path = Path(dest)
    if path.is_dir():
        raise TableError(f"{what} {path} is a directory")
    try:
        with atomic_open(path, "w", newline="", encoding="utf-8", errors="surrogateescape") as f:
            yield f
    except OSError as err:
        raise TableError(f"cannot write {what} {path} ({err.strerror or err})") from None


# --- reading ------------------------------------------------------------------------------------

def _parse(column: str, text, where: str, named: bool = False):
    """One cell; `named`: the table names its classes, so pred and label hold names (text)."""
    if text is None or text == "":
        return None
    if not isinstance(text, str):  # JSONL values come typed
        return str(text) if column in TEXT_COLUMNS else text
    if column in TEXT_COLUMNS or (named and column in NAME_COLUMNS):
        return text
    if column in INT_COLUMNS:
        try:
            return int(text)
        except ValueError:
            if column in NAME_COLUMNS:
                return text
            raise TableError(f"{where}: {column} '{text}' is not an integer") from None
    try:
        number = float(text)
    except ValueError:
        if column in BASE_COLUMNS:
            raise TableError(f"{where}: {column} '{text}' is not a number") from None
        return text
    if column not in BASE_COLUMNS and text.lstrip("-").isdigit() and not text.lstrip("-").startswith("0"):
        return int(text)  # an integer extra column (no leading zeros, which would be an id-like code)
    return number


def read_table(source: str | Path | IO[str], name: str | None = None) -> list[dict]:
    """Rows of a CSV or JSONL table (file, '-' for stdin, or a text stream); needs id and score.
    pred and label are class names (text) when the table has a pred_index column or its
    meta.json records class names; else class indices where they are integers."""
    named = False
    if isinstance(source, (str, Path)) and str(source) != "-":
        named = _records_names(Path(source))
        path = Path(source)
        name = name or str(path)
        try:
            # as written: bytes undecoded kept as surrogates, and no newline translation (a \r
            # inside a quoted text stays a \r)
            text = path.read_bytes().decode("utf-8", errors="surrogateescape")
        except FileNotFoundError:
            raise TableError(f"table {path} does not exist") from None
        except (OSError, UnicodeDecodeError) as err:
            raise TableError(f"table {path} cannot be read ({err})") from None
    else:
        stream = sys.stdin if not hasattr(source, "read") else source
        if stream is sys.stdin and hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="surrogateescape")  # a table holding raw file-name bytes
            with contextlib.suppress(ValueError, OSError):  # a stream read from already keeps it
                stream.reconfigure(newline="")  # a \r inside a quoted text stays a \r
        name = name or "stdin"
        text = stream.read()
    if text.lstrip().startswith("{"):
        rows = _read_jsonl(text, name, named)
    else:
        rows = _read_csv(text, name, named)
    if not rows:
        raise TableError(f"table {name} has no rows")
    seen: dict[str, int] = {}
    for n, row in enumerate(rows, 1):
        if row["id"] in seen:
            raise TableError(f"table {name} has the id '{row['id']}' twice (rows {seen[row['id']]} and {n})")
        seen[row["id"]] = n
    return rows


def _check_columns(columns, name: str) -> None:
    for needed in ("id", "score"):
        if needed not in columns:
            raise TableError(f"table {name} has no '{needed}' column (columns: {', '.join(columns)})")


def _records_names(path: Path) -> bool:
    """Does the table's meta.json record class names (so pred and label hold names)?"""
    try:
        meta = read_meta(sidecar(path, "meta.json"))
    except RunError:  # an unreadable meta.json: `select` says so when it reads it
        return False
    return bool(meta and isinstance(meta.get("class_names"), list) and meta["class_names"])


def _read_csv(text: str, name: str, named: bool = False) -> list[dict]:
    reader = csv.DictReader(io.StringIO(text, newline=""))
    if not reader.fieldnames:
        return []
    _check_columns(reader.fieldnames, name)
    named = named or "pred_index" in reader.fieldnames
    rows = []
    for raw in reader:
        where = f"table {name} line {reader.line_num}"
        row = {c: _parse(c, v, where, named) for c, v in raw.items() if c is not None}
        if row.get("score") is None:
            raise TableError(f"{where} has no score")
        if row.get("id") is None:
            raise TableError(f"{where} has no id")
        rows.append(row)
    return rows


def _read_jsonl(text: str, name: str, named: bool = False) -> list[dict]:
    rows = []
    for n, raw in json_objects(text.splitlines(), lambda n: f"table {name} line {n}", TableError):
        where = f"table {name} line {n}"
        _check_columns(list(raw), name)
        if raw["id"] is None:
            raise TableError(f"{where} has no id")
        row = {c: _parse(c, v, where, named or "pred_index" in raw) for c, v in raw.items()}
        score = raw["score"]
        if isinstance(score, bool) or not isinstance(score, (int, float, str, type(None))):
            raise TableError(f"{where}: score {score!r} is not a number")
        row["score"] = float("nan") if score is None else _parse("score", str(score), where)
        rows.append(row)
    return rows


# --- beside the table ---------------------------------------------------------------------------

def sidecar(output: str | Path, suffix: str) -> Path:
    """OUTPUT.partial, OUTPUT.errors.csv, OUTPUT.meta.json, ... beside the table."""
    output = Path(output)
    return output.with_name(f"{output.name}.{suffix}")


SIDECARS = ("meta.json", "errors.csv", "emb.npz")  # written with the table, removed with it


def remove_sidecars(output: str | Path, keep: tuple[str, ...] = ()) -> None:
    """Remove OUTPUT's sidecars (but `keep`): a new table must not inherit an old run's files."""
    for suffix in SIDECARS:
        if suffix not in keep:
            path = sidecar(output, suffix)
            try:
                path.unlink(missing_ok=True)
            except OSError as err:
                raise TableError(f"cannot remove {path}, which described the earlier table "
                                 f"{output} ({err.strerror or err})") from None


def write_meta(path: Path, meta: dict) -> None:
    with atomic_file(path, "metadata file") as f:
        json.dump(meta, f, indent=2, sort_keys=True)
        f.write("\n")


def read_meta(path: Path) -> dict | None:
    try:
        meta = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as err:
        raise RunError(f"{path} cannot be read ({err})") from None
    if not isinstance(meta, dict):
        raise RunError(f"{path} is not an alcli metadata file")
    return meta
