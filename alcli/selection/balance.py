"""Class balance for a labeling batch: how many of the budget each predicted class gets.

Quota ties go to the earlier class; classes sort numerically when they are numbers.
"""
from __future__ import annotations

from typing import Hashable, Mapping

MODES = ("proportional", "equal")


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
