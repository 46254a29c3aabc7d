"""The one order of ranked rows (dicts with at least `id` and `score`): score descending, ties by
id, NaN scores last."""
from __future__ import annotations

import math


def score_order(score, id_) -> tuple:
    """Sort key: best score first, NaN (or None) last, ties broken by id. The one order of the
    package: tables, batches, shortlists."""
    nan = score is None or (isinstance(score, float) and math.isnan(score))
    return (nan, 0.0 if nan else -score, str(id_))  # ids of any type: ties by their text


def order_key(row: dict) -> tuple:
    """`score_order` of a row."""
    return score_order(row["score"], row["id"])


def rank(rows: list[dict]) -> list[dict]:
    """`rows` in ranked order, each with `rank` set (1 = best) as its first key."""
    return [{"rank": i, **{k: v for k, v in row.items() if k != "rank"}}
            for i, row in enumerate(sorted(rows, key=order_key), 1)]


def is_scored(row: dict) -> bool:
    """Whether the row's score is a finite number (NaN / missing rows cannot take part in
    per-class or diverse selection)."""
    score = row["score"]
    return isinstance(score, (int, float)) and math.isfinite(score)
