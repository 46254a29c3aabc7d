"""Class balance and exclusions for a labeling batch.

Rows are dicts with at least `id`, `score` and (for per-class selection) `pred`, the predicted
class. Higher score = more worth labeling. Every order is deterministic: best score first, ties by
id; quota ties by class.
"""
from __future__ import annotations

import csv
import io
import json
import math
import os
import sys
from typing import Hashable, Iterable, Mapping, Sequence

MODES = ("proportional", "equal")


class ExclusionsError(ValueError):
    """An exclusions file is unreadable or malformed; the message names the file (and line)."""


# --- per-class quotas -----------------------------------------------------------------------------

def _class_key(c: Hashable):
    """Classes sort numerically when they are numbers, else as text (numbers first)."""
    return (0, c, "") if isinstance(c, (int, float)) and not isinstance(c, bool) else (1, 0, str(c))


def _largest_remainder(weights: Mapping[Hashable, int], total: int) -> dict:
    """Split `total` in proportion to integer `weights` (Hamilton's method), exactly in integers.

    Each class gets floor(total·w/W); the units left go one each to the largest remainders
    total·w mod W, ties to the earlier class in `weights`' order.
    """
    w_sum = sum(weights.values())
    if w_sum == 0:
        return {c: 0 for c in weights}
    base = {c: total * w // w_sum for c, w in weights.items()}
    left = total - sum(base.values())
    order = sorted(enumerate(weights), key=lambda t: (-(total * weights[t[1]] % w_sum), t[0]))
    for _, c in order[:left]:
        base[c] += 1
    return base


def per_class_quota(pred_counts: Mapping[Hashable, int], budget: int,
                    mode: str = "proportional") -> dict:
    """How many of the batch each predicted class gets -> {class: quota}, summing to min(budget, N).

    proportional: quota_c ∝ n_c (the class's count in the pool); equal: the same for every class
    with examples. Largest-remainder apportionment, ties by class order. A class cannot get more than
    it has: its excess is re-apportioned over the classes that still have room, until none
    overflows (water-filling).
    """
    if mode not in MODES:
        raise ValueError(f"unknown per-class mode '{mode}'; choose one of {', '.join(MODES)}")
    if int(budget) != budget or budget < 0:
        raise ValueError(f"budget must be a whole number >= 0; got {budget}")
    for c, n in pred_counts.items():
        if int(n) != n or n < 0:
            raise ValueError(f"count of class {c!r} must be a whole number >= 0; got {n}")
    classes = sorted(pred_counts, key=_class_key)
    cap = {c: int(pred_counts[c]) for c in classes}
    quota = {c: 0 for c in classes}
    remaining = min(int(budget), sum(cap.values()))
    full: set = set()
    while remaining > 0:
        active = [c for c in classes if c not in full and cap[c] > 0]
        weights = {c: (cap[c] if mode == "proportional" else 1) for c in active}
        alloc = _largest_remainder(weights, remaining)
        over = [c for c in active if alloc[c] > cap[c]]
        if not over:
            quota.update(alloc)
            break
        for c in over:  # saturated: takes all it has, the rest is re-apportioned
            quota[c] = cap[c]
            full.add(c)
            remaining -= cap[c]
    return quota


def _row_score(row: Mapping, n: int) -> float:
    try:
        s = float(row["score"])
    except KeyError:
        raise ValueError(f"row {n} has no 'score'") from None
    except (TypeError, ValueError):
        raise ValueError(f"row {n} (id '{row.get('id')}') has score {row['score']!r}, "
                         f"which is not a number") from None
    if not math.isfinite(s):
        raise ValueError(f"row {n} (id '{row.get('id')}') has a score that is not finite")
    return s


def _rank_key(row: Mapping, n: int):
    if "id" not in row:
        raise ValueError(f"row {n} has no 'id'")
    return (-_row_score(row, n), str(row["id"]))


def select_per_class(rows: Sequence[Mapping], budget: int, mode: str = "proportional") -> list:
    """Best-scoring rows of each predicted class, `per_class_quota` of them per class.

    Counts are those of `rows` (apply exclusions first). Within a class: best score first, ties by
    id. The returned rows are ordered best score first, ties by id.
    """
    by_class: dict = {}
    for n, row in enumerate(rows, 1):
        if "pred" not in row:
            raise ValueError(f"row {n} (id '{row.get('id')}') has no 'pred' (predicted class)")
        by_class.setdefault(row["pred"], []).append((_rank_key(row, n), row))
    quota = per_class_quota({c: len(v) for c, v in by_class.items()}, budget, mode)
    chosen = []
    for c, members in by_class.items():
        members.sort(key=lambda t: t[0])
        chosen.extend(members[:quota[c]])
    chosen.sort(key=lambda t: t[0])
    return [row for _, row in chosen]


# --- exclusions -----------------------------------------------------------------------------------

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


def apply_exclusions(rows: Iterable[Mapping], excluded: set[str]) -> list:
    """The rows whose id (as text) is not excluded, in their original order."""
    return [row for row in rows if str(row["id"]) not in excluded]
