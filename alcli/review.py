"""`alcli review`: a labeled pool's labels most likely wrong, from one scoring run.

The run is `score --strategy review` (gradnorm at the given label, alcli.score.strategies): each
row brings its loss and gradient norm at the given label, and its `units`, the labeled decisions
the task makes of it (`Task.review_units`: classification one, the row's class; multilabel one per
label, present or absent; token classification one per labeled word), each (group, given class,
p [K], where). Here, for every unit:

    self-confidence  p_given
    margin           (p_given - max_{k != given} p_k + 1) / 2      cleanlab's normalized margin
    flag             confident learning (Northcutt et al. 2021): t_{g,k} = mean p_k over the
                     units of group g labeled k; a unit's classes above their threshold,
                     {k : p_k >= t_{g,k}}; it is flagged when the most probable of them is not
                     its given class, and that class is its suggestion (else its argmax)

and for a row: its worst unit's self-confidence and margin, flagged when any unit is, its
suggestion (`Task.review_pred`) and the suggestion's probability (its worst unit's). A task
without classes (regression) computes these columns itself (`Task.review_own`). The score
ranks the rows by one of RANKINGS, most likely wrong first. Rows without a label are left out.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

from .errors import PoolError
from .selection.rank import rank
from .tasks import TASKS

# ranking -> a row's score (higher: more likely a wrong label)
RANKINGS = {
    "self-confidence": lambda row: 1.0 - row["self_confidence"],
    "margin": lambda row: 1.0 - row["margin"],
    "loss": lambda row: row["loss"],
    "gradnorm": lambda row: row["gradnorm"],
}
DEFAULT_RANKING = "self-confidence"  # benchmarks/label_review.py: the best AUROC of the four


@dataclass
class Reviewed:
    rows: list[dict]                 # ranked, most likely wrong first
    unlabeled: int                   # rows left out: no label
    flagged: int
    thresholds: dict = field(default_factory=dict)  # (group, class) -> t


def review_rows(scored: list[dict], task: str, names: list[str] | None, ranking: str,
                pool_name: str = "the pool") -> Reviewed:
    """The rows of a `--strategy review` run -> the review table's rows (see the module's doc)."""
    units = {row["id"]: json.loads(row["units"]) for row in scored}
    labeled = [row for row in scored if units[row["id"]]]
    if not labeled:
        raise PoolError(f"{pool_name} has no labels: alcli review checks given labels (a label "
                        f"column, class folders with --labels-from-folders, pull's labels.csv)")
    spec = TASKS[task]
    if spec.review_own is not None:  # a task without classes (regression) reviews its own units
        t = {}
        columns = spec.review_own([units[row["id"]] for row in labeled], names)
    else:
        t = thresholds(u for row in labeled for u in units[row["id"]])
        columns = [_class_columns(units[row["id"]], t, spec.review_pred, names) for row in labeled]
    out = [_review_row(row, cols, ranking) for row, cols in zip(labeled, columns)]
    return Reviewed(rank(out), len(scored) - len(labeled), sum(r["flagged"] for r in out), t)


def thresholds(units) -> dict[tuple[int, int], float]:
    """t_{g,k}: the mean p_k over the units of group g whose given class is k."""
    sums: dict[tuple[int, int], list[float]] = {}
    for group, given, p, *_ in units:
        total = sums.setdefault((group, given), [0.0, 0])
        total[0] += p[given]
        total[1] += 1
    return {key: s / n for key, (s, n) in sums.items()}


def suggestion(group: int, given: int, p: list[float], t: dict) -> tuple[int, bool]:
    """(the unit's suggested class, flagged): the most probable class at or above its threshold,
    flagged when that is not `given`; without one above, the argmax, unflagged."""
    above = [k for k in range(len(p)) if (group, k) in t and p[k] >= t[(group, k)]]
    if not above:
        return max(range(len(p)), key=lambda k: p[k]), False
    best = max(above, key=lambda k: (p[k], k == given))  # a tie keeps the given class
    return best, best != given


def margin(given: int, p: list[float]) -> float:
    """cleanlab's normalized margin: (p_given - max_{k != given} p_k + 1) / 2, in [0, 1]."""
    other = max((q for k, q in enumerate(p) if k != given), default=0.0)
    return (p[given] - other + 1.0) / 2.0


def _class_columns(units: list, t: dict, review_pred, names) -> dict:
    """A row's columns from its units' probabilities (see the module's doc)."""
    picks = [suggestion(u[0], u[1], u[2], t) for u in units]
    worst = min(range(len(units)), key=lambda i: units[i][2][units[i][1]])
    return {"flagged": any(f for _, f in picks),
            **review_pred(units, [k for k, _ in picks], names),
            "confidence": units[worst][2][picks[worst][0]],
            "self_confidence": min(u[2][u[1]] for u in units),
            "margin": min(margin(u[1], u[2]) for u in units)}


def _review_row(row: dict, columns: dict, ranking: str) -> dict:
    out = {"id": row["id"], "score": 0.0, "flagged": columns.pop("flagged"),
           "label": row.get("label"), **columns, "loss": row.get("loss"), "gradnorm": row["score"]}
    score = RANKINGS[ranking](out)
    out["score"] = score if score is not None and math.isfinite(score) else math.nan
    for key in ("path", "text"):
        if key in row:
            out[key] = row[key]
    return out
