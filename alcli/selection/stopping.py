"""When to stop labeling: the stabilizing-predictions rule (Bloodgood & Vijay-Shanker 2009; the
anchor is small-text's KappaAverage). Consecutive rounds' predictions on a stop set (the ids both
rounds' tables scored, their labels unused) are compared by Cohen's kappa; labeling stops once the
mean of the last `window` kappas reaches `threshold` (0.99 over 3 in the paper).

It lives with the selection stage because it reads what that stage reads (ranked rows: `id`,
`pred`); `alcli stop`, `alcli report` and `alcli simulate` all call it.
"""
from __future__ import annotations

from collections import Counter
from typing import Mapping, Sequence

THRESHOLD = 0.99  # Bloodgood & Vijay-Shanker's kappa
WINDOW = 3  # kappas averaged
# the fewest ids two rounds must share for their kappa to count: over fewer, one changed
# prediction already moves kappa below 0.99, so 0.99 cannot be told from 1 (and one shared id
# gives a kappa of 1 whatever the model does); Bloodgood & Vijay-Shanker's stop sets held 2,000
MIN_STOP_SET = 100


def predictions(rows: Sequence[Mapping]) -> dict[str, str]:
    """id -> its prediction as text (a class index or name, a label set 'a|b'); rows with no
    prediction (an empty cell) are not in the stop set."""
    return {str(r["id"]): str(r["pred"]) for r in rows if r.get("pred") not in (None, "")}


def kappa(a: Sequence[str], b: Sequence[str]) -> float:
    """Cohen's kappa of two equally long label sequences: (p_o - p_e) / (1 - p_e), p_o the share
    agreeing, p_e = sum over classes of the product of the two marginal shares. Both constant on
    one class (p_e = 1) agree completely: 1.0 (sklearn's formula gives 0/0 there)."""
    n = len(a)
    if n == 0 or n != len(b):
        raise ValueError("kappa needs two non-empty sequences of one length")
    p_o = sum(x == y for x, y in zip(a, b)) / n
    ca, cb = Counter(a), Counter(b)
    p_e = sum(ca[c] * cb[c] for c in ca) / (n * n)
    return 1.0 if p_e >= 1.0 else (p_o - p_e) / (1.0 - p_e)


def agreement(older: Mapping[str, str], newer: Mapping[str, str]) -> dict:
    """Two rounds' predictions (id -> pred) over the ids both hold: how many, how many changed,
    and their kappa (None when they share no id). The rule counts the kappa only over at least
    MIN_STOP_SET ids (`counted`)."""
    common = [i for i in newer if i in older]
    if not common:
        return {"common": 0, "changed": 0, "kappa": None}
    a, b = [older[i] for i in common], [newer[i] for i in common]
    return {"common": len(common), "changed": sum(x != y for x, y in zip(a, b)),
            "kappa": kappa(a, b)}


def counted(record: Mapping) -> float | None:
    """An agreement's kappa as the rule counts it: None over fewer than MIN_STOP_SET ids."""
    return record["kappa"] if record["common"] >= MIN_STOP_SET else None


def verdicts(kappas: Sequence[float | None], threshold: float = THRESHOLD,
             window: int = WINDOW) -> list[bool]:
    """For each round after the first (kappas[k] compares round k+1 with round k): does the rule
    say stop there? It does once the last `window` kappas exist and their mean is >= threshold."""
    out = []
    for k in range(len(kappas)):
        last = kappas[max(0, k + 1 - window):k + 1]
        out.append(len(last) == window and None not in last
                   and sum(last) / window >= threshold)
    return out


def rounds(preds: Sequence[Mapping[str, str]], threshold: float = THRESHOLD,
           window: int = WINDOW) -> dict:
    """Each round's predictions (id -> pred), oldest first -> the per-round record (round 0 has
    none to compare with), the round where the rule first says stop (None: go on) and whether the
    newest says stop."""
    per = [{"round": 0, "common": None, "changed": None, "kappa": None, "stop": False}]
    for k in range(1, len(preds)):
        per.append({"round": k, **agreement(preds[k - 1], preds[k])})
    says = verdicts([counted(p) for p in per[1:]], threshold, window)
    for p, stop in zip(per[1:], says):
        last = [counted(q) for q in per[max(1, p["round"] + 1 - window):p["round"] + 1]
                if counted(q) is not None]
        p["mean_kappa"] = sum(last) / len(last) if last else None  # over up to `window` kappas
        p["stop"] = stop
    first = next((p["round"] for p in per if p["stop"]), None)
    return {"threshold": threshold, "window": window, "rounds": per, "stop_round": first,
            "stop": bool(per[-1]["stop"])}


def verdict(result: dict) -> str:
    """The rule's answer (`rounds`' result) in one sentence."""
    rule = f"the mean kappa of the last {result['window']} rounds reaches {result['threshold']}"
    if result["stop"]:
        return f"stop: {rule} (first at round {result['stop_round']})"
    few = [r for r in result["rounds"][1:][-result["window"]:] if 0 < r["common"] < MIN_STOP_SET]
    if few:
        return (f"go on: rounds {few[-1]['round'] - 1} and {few[-1]['round']} share only "
                f"{few[-1]['common']} ids with a prediction, and a kappa counts over at least "
                f"{MIN_STOP_SET} (score the same stop set each round)")
    return f"go on: not yet {rule}"
