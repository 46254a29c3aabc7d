"""Batches priced in labeling cost (select --cost, --budget-cost): each row's cost from a table
column or a measure the table already carries, the batch chosen by utility per cost (the score
divided by the cost, so diverse selection and per-class quotas work on it unchanged), then cut,
in that order, to the total cost allowed (greedy knapsack by ratio)."""
from __future__ import annotations

import json
import math
from typing import Mapping, Sequence

from .rank import order_key

# measure -> (the column it counts, what it is): a JSON list per row, its length the cost
MEASURES = {"boxes": ("boxes", "a detector's predicted boxes"),
            "words": ("pred_words", "token classification's words")}


def row_cost(row: Mapping, spec: str) -> float:
    """The row's cost: a measure's count (at least 1: a row with nothing predicted is still
    looked at), or the column's value, a positive finite number. ValueError naming the row."""
    column = MEASURES[spec][0] if spec in MEASURES else spec
    value = row.get(column)
    if spec in MEASURES:
        try:
            items = json.loads(value) if isinstance(value, str) else value
        except (ValueError, RecursionError):  # json recurses once per level
            items = None
        if not isinstance(items, list):
            raise ValueError(f"--cost {spec}: row '{row.get('id')}' has no JSON list in its "
                             f"'{column}' column")
        return float(max(1, len(items)))
    try:
        cost = float(value)
    except (TypeError, ValueError):
        cost = math.nan
    if not (math.isfinite(cost) and cost > 0):
        raise ValueError(f"--cost {spec}: row '{row.get('id')}' has the cost {value!r}; a cost "
                         f"is a number above 0")
    return cost


def check_column(rows: Sequence[Mapping], spec: str) -> None:
    column = MEASURES[spec][0] if spec in MEASURES else spec
    if rows and column not in rows[0]:
        measures = ", ".join(f"{m} ({what})" for m, (_, what) in MEASURES.items())
        raise ValueError(f"--cost {spec}: the table has no column '{column}'; give a column of "
                         f"costs or one of the measures {measures}")


def per_cost(rows: Sequence[Mapping], spec: str) -> list[dict]:
    """The rows with their `cost` and, for choosing, `score` = score / cost, best ratio first
    (ties by id); the original score kept as `_score`, the `rank` (the place in the table) kept."""
    check_column(rows, spec)
    out = []
    for row in rows:
        cost = row_cost(row, spec)
        score = float(row["score"]) if row.get("score") is not None else math.nan
        out.append({**row, "cost": cost, "_score": row["score"], "score": score / cost})
    return sorted(out, key=order_key)


def fits(rows: Sequence[Mapping], total: float) -> int:
    """How many of `rows` (best ratio first) the greedy walk keeps under `total`."""
    return len(within(rows, total))


def within(rows: Sequence[Mapping], total: float | None, rest: Sequence[Mapping] = (),
           most: int | None = None) -> list[dict]:
    """Walk `rows` by ratio (best first), then the `rest` not among them, keeping each whose
    cost still fits under `total` (and at most `most` rows): the chosen batch cut to the budget,
    what it leaves unspent filled greedily."""
    if total is None:
        return list(rows)
    taken = {str(r["id"]) for r in rows}
    order = sorted(rows, key=order_key) + sorted(
        (r for r in rest if str(r["id"]) not in taken), key=order_key)
    kept, spent = [], 0.0
    for row in order:
        if most is not None and len(kept) == most:
            break
        if spent + row["cost"] <= total:
            kept.append(row)
            spent += row["cost"]
    return kept


def restored(rows: Sequence[Mapping]) -> list[dict]:
    """The chosen rows with their own score back (the batch file shows what score wrote)."""
    back = [{**{k: v for k, v in r.items() if k != "_score"}, "score": r["_score"]} for r in rows]
    return sorted(back, key=order_key)
