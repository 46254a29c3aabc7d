"""From scores to a labeling batch. Rows are dicts with at least `id` and `score`.

The order is the same everywhere: score descending, ties by id, NaN scores last. Later selectors
(per-class, exclusions, diverse) take ranked rows and a budget and return the chosen rows.
"""
from __future__ import annotations

import math


def order_key(row: dict) -> tuple:
    """Sort key: best score first, NaN last, ties broken by id."""
    score = row["score"]
    nan = score is None or (isinstance(score, float) and math.isnan(score))
    return (nan, 0.0 if nan else -score, row["id"])


def rank(rows: list[dict]) -> list[dict]:
    """`rows` in ranked order, each with `rank` set (1 = best) as its first key."""
    return [{"rank": i, **{k: v for k, v in row.items() if k != "rank"}}
            for i, row in enumerate(sorted(rows, key=order_key), 1)]


def top_k(rows: list[dict], budget: int) -> list[dict]:
    """The `budget` best rows (all of them when the pool is smaller), ranked."""
    if budget < 1:
        raise ValueError("budget must be at least 1")
    return rank(rows)[:budget]
