"""Reading and writing ranked tables: CSV, JSONL, one file path per line ("paths") or one id per
line ("ids"); files written atomically.

Rows are plain dicts. Columns come in a fixed order: rank,id,score,pred,confidence, then label (when
known), loss, then whatever else the rows carry, in first-seen order (image pools end with `path`,
the example's file). Floats are written with `repr`, so reading a table back gives the very same
numbers.
"""
from __future__ import annotations

import contextlib
import csv
import io
import json
import math
import sys
from pathlib import Path
from typing import IO, Iterable, Iterator

from .atomic import atomic_open
from ..errors import RunError, TableError
from .jsonl import json_objects

BASE_COLUMNS = ("rank", "id", "score", "pred", "confidence", "label", "loss")
INT_COLUMNS = ("rank", "pred", "label")
FORMATS = ("csv", "jsonl", "paths", "ids")
LINE_FORMATS = ("paths", "ids")  # one value per line, no header: for shell pipelines


def columns_of(rows: Iterable[dict]) -> list[str]:
    """The base columns any row has, in their fixed order, then the others in first-seen order."""
    seen: dict[str, None] = {}
    for row in rows:
        for key in row:
            seen.setdefault(key, None)
    return [c for c in BASE_COLUMNS if c in seen] + [c for c in seen if c not in BASE_COLUMNS]


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
           header: bool = True) -> Iterator[str]:
    """Lines of text (each ending in a newline) for `rows` in `fmt`."""
    if fmt not in FORMATS:
        raise TableError(f"unknown table format '{fmt}' (choose {', '.join(FORMATS)})")
    if fmt == "paths":
        if "path" not in columns:
            raise TableError("-f paths writes each example's file, but these rows have no 'path' "
                             "(a tensor pool, or a table from an older alcli); use -f ids")
        for row in rows:
            yield f"{row['path']}\n"
        return
    if fmt == "ids":
        for row in rows:
            yield f"{row['id']}\n"
        return
    if fmt == "jsonl":
        for row in rows:
            yield json.dumps({c: _json_value(row.get(c)) for c in columns}) + "\n"
        return
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    if header:
        writer.writerow(columns)
    for row in rows:
        writer.writerow([format_value(row.get(c)) for c in columns])
        yield buf.getvalue()
        buf.seek(0)
        buf.truncate()
    if buf.tell():
        yield buf.getvalue()


def write_table(rows: list[dict], dest: str | Path | IO[str] | None, fmt: str = "csv") -> None:
    """Write `rows` to a file (atomically: a temporary file renamed into place), or to stdout
    when `dest` is None or '-', or to an open text stream."""
    write_rows(rows, columns_of(rows), dest, fmt)


def write_rows(rows: Iterable[dict], columns: list[str], dest: str | Path | IO[str] | None,
               fmt: str = "csv") -> None:
    """`write_table` for rows that arrive one by one (a generator) with their columns known."""
    if dest is None or str(dest) == "-":
        dest = sys.stdout
        if hasattr(dest, "reconfigure"):  # ids from non-UTF-8 file names: their bytes as they are
            dest.reconfigure(errors="surrogateescape")
    if not isinstance(dest, (str, Path)):
        dest.writelines(render(rows, columns, fmt))
        dest.flush()
        return
    with atomic_file(dest, "output") as f:
        f.writelines(render(rows, columns, fmt))


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

def _parse(column: str, text, where: str):
    if text is None or text == "":
        return None
    if not isinstance(text, str):  # JSONL values come typed
        return str(text) if column == "id" else text
    if column == "id":
        return text
    if column in INT_COLUMNS:
        try:
            return int(text)
        except ValueError:
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
    """Rows of a CSV or JSONL table (file, '-' for stdin, or a text stream); needs id and score."""
    if isinstance(source, (str, Path)) and str(source) != "-":
        path = Path(source)
        name = name or str(path)
        try:
            text = path.read_text(encoding="utf-8", errors="surrogateescape")  # as written
        except FileNotFoundError:
            raise TableError(f"table {path} does not exist") from None
        except (OSError, UnicodeDecodeError) as err:
            raise TableError(f"table {path} cannot be read ({err})") from None
    else:
        stream = sys.stdin if not hasattr(source, "read") else source
        if stream is sys.stdin and hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="surrogateescape")  # a table holding raw file-name bytes
        name = name or "stdin"
        text = stream.read()
    if text.lstrip().startswith("{"):
        rows = _read_jsonl(text, name)
    else:
        rows = _read_csv(text, name)
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


def _read_csv(text: str, name: str) -> list[dict]:
    reader = csv.DictReader(io.StringIO(text))
    if not reader.fieldnames:
        return []
    _check_columns(reader.fieldnames, name)
    rows = []
    for raw in reader:
        where = f"table {name} line {reader.line_num}"
        row = {c: _parse(c, v, where) for c, v in raw.items() if c is not None}
        if row.get("score") is None:
            raise TableError(f"{where} has no score")
        if row.get("id") is None:
            raise TableError(f"{where} has no id")
        rows.append(row)
    return rows


def _read_jsonl(text: str, name: str) -> list[dict]:
    rows = []
    for n, raw in json_objects(text.splitlines(), lambda n: f"table {name} line {n}", TableError):
        where = f"table {name} line {n}"
        _check_columns(list(raw), name)
        if raw["id"] is None:
            raise TableError(f"{where} has no id")
        row = {c: _parse(c, v, where) for c, v in raw.items()}
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
