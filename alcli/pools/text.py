"""Text pools: a .txt file (one text per line), or a .csv/.jsonl manifest with the text column;
tokenized when a batch is collated."""
from __future__ import annotations

import csv
from pathlib import Path
from typing import Callable

from ..errors import PoolError, first_line
from ..files.jsonl import json_objects
from .common import (MANIFEST_EXTS, TEXT_EXTS, Item, Pool, PoolKind, PoolOptions, Text,
                     check_unique_ids, csv_error, label_index, named_label, task_label,
                     with_task_labels)


def _is_text(spec, opts: PoolOptions) -> bool:
    if not isinstance(spec, str):
        return False
    path = Path(spec)
    suffix = path.suffix.lower()
    return suffix in TEXT_EXTS or (suffix in MANIFEST_EXTS and is_text_manifest(path, opts.text_column))


KIND = PoolKind("texts", _is_text, lambda spec, opts, stdin: from_text_file(spec, opts),
                options=("text_column", "tokenizer", "class_names", "labels_as_given"))


# --- text ---------------------------------------------------------------------------------------

class TextPool(Pool):
    kind = "text"

    def __init__(self, name: str, ids: list[str], texts: list[str], labels: list[int],
                 tokenize: Callable[[list[str]], dict]):
        self.name, self.ids, self.texts, self.labels = name, ids, texts, labels
        self.has_labels = any(label >= 0 for label in labels)
        self.tokenize = tokenize

    def __getitem__(self, i: int) -> Item:
        return Item(self.ids[i], Text(self.texts[i], self.tokenize), self.labels[i], None)

def is_text_manifest(path: Path, column: str) -> bool:
    """Does the .csv header, or the first .jsonl object, have the text column?"""
    try:
        with open(path, newline="") as f:
            if path.suffix.lower() == ".csv":
                reader = csv.DictReader(f)
                return column in (reader.fieldnames or [])
            for _, obj in json_objects(f, lambda n: f"manifest {path} line {n}", PoolError):
                return column in obj
    except (OSError, UnicodeDecodeError) as err:
        raise PoolError(f"manifest {path} cannot be read ({first_line(err)})") from None
    except csv.Error as err:
        raise csv_error(path, reader, err) from None
    return False


def from_text_file(spec: str, opts: PoolOptions) -> Pool:
    """Texts: a .txt file (one per line; its line number is its id), or a .csv/.jsonl manifest with
    the `text_column` column and optional `id` (default: the line number) and `label`."""
    path = Path(spec)
    rows: list[tuple] = []  # (id, text, label, (where, another task's label) or None)
    suffix = path.suffix.lower()
    try:
        # .txt: lines end at \n only (as for wc -l and sed), a bare CR stays in its text
        with open(path, newline="\n" if suffix == ".txt" else "", encoding="utf-8") as f:
            if suffix == ".txt":
                rows = [(str(n), _line_text(line), -1, None) for n, line in enumerate(f, 1) if line.strip()]
            elif suffix == ".csv":
                reader = csv.DictReader(f)
                rows = [_text_row(path, reader.line_num, row, opts) for row in reader]
            else:
                rows = [_text_row(path, n, row, opts)
                        for n, row in json_objects(f, lambda n: f"manifest {path} line {n}", PoolError)]
    except (OSError, UnicodeDecodeError) as err:
        raise PoolError(f"text pool {path} cannot be read ({first_line(err)})") from None
    except csv.Error as err:
        raise csv_error(path, reader, err) from None
    if not rows:
        raise PoolError(f"text pool {path} holds no texts")
    if opts.tokenizer is None:
        raise PoolError(f"text pool {path} needs a tokenizer: pass --model a Hugging Face model "
                        f"directory that holds one")
    check_unique_ids(str(path), [r[0] for r in rows])
    ids, texts, labels, raws = (list(col) for col in zip(*rows))
    return with_task_labels(TextPool(str(path), ids, texts, labels, opts.tokenizer()),
                             {i: raw for i, raw in zip(ids, raws) if raw is not None})


def _line_text(line: str) -> str:
    """A line without its end: the newline, or the CR LF of a Windows file."""
    return line.removesuffix("\n").removesuffix("\r")


def _text_row(path: Path, n: int, row: dict, opts: PoolOptions) -> tuple[str, str, int, tuple | None]:
    where, column = f"manifest {path} line {n}", opts.text_column
    text = row.get(column)
    if not isinstance(text, str):
        raise PoolError(f"{where} has no text in column '{column}'" if text is None else
                        f"{where}: '{column}' must be a string, not {type(text).__name__}")
    id_ = row.get("id")
    raw = task_label(row, opts, path.parent)
    return ((str(id_) if id_ not in (None, "") else str(n)), text,
            -1 if raw is not None else label_index(named_label(row.get("label"), where, opts), where),
            None if raw is None else (where, raw))
