"""Choosing the labeling batch from ranked rows: top-k, per-class quotas, diverse (BADGE or
Cluster-Margin), or both."""
from __future__ import annotations

from collections.abc import Hashable

import torch

from .balance import per_class_quota
from .cluster_margin import select_cluster_margin
from .diverse import select_diverse
from .rank import order_key
from .sampling import sample


def choose(rows: list[dict], budget: int, *, per_class: str | None = None, factors=None,
           seed: int = 0, candidates: int | str | None = None, sampling: str = "top",
           beta: float = 1.0, diverse_mode: str = "badge",
           clusters: int | None = None) -> list[dict]:
    """The labeling batch from ranked, already filtered `rows`, best score first (ties by id).

    per_class: None, "proportional" or "equal": quotas per predicted class (`pred`) from
    balance.py, best scores first within a class. factors: (a [N, C], b [N, D]) BADGE factors
    aligned with `rows` for diverse selection (diverse.select_diverse, among the `candidates`
    best; default 10 x the budget; "all": classic BADGE over every row), per class when both are
    asked for. sampling: "top" (the best scores), or "power" / "softmax": drawn from the scores
    (sampling.py), within each class's quota. Rows keep their `rank` (their place in the whole
    table). diverse_mode "cluster-margin": cluster_margin.py on the features b instead of BADGE,
    into `clusters` clusters (default the quota). A ValueError names what is wrong.
    """
    if budget < 1:
        raise ValueError("budget must be at least 1")
    if per_class is None and factors is None:
        return sample(rows, budget, sampling, beta, seed)
    if isinstance(candidates, int) and candidates < budget:
        raise ValueError(f"--diverse-candidates {candidates} is smaller than the budget {budget}; "
                         f"diverse selection picks the batch among that many best-scoring examples")
    groups: dict = {None: list(range(len(rows)))}
    quota = {None: min(budget, len(rows))}
    if per_class is not None:
        groups = {}
        for i, row in enumerate(rows):
            if row.get("pred") is None:
                raise ValueError(f"--per-class needs each row's predicted class, but row "
                                 f"'{row['id']}' has no 'pred'")
            if not isinstance(row["pred"], Hashable):
                raise ValueError(f"--per-class groups rows by predicted class, but row "
                                 f"'{row['id']}' has the pred {row['pred']!r}, not a class")
            groups.setdefault(row["pred"], []).append(i)
        quota = per_class_quota({c: len(members) for c, members in groups.items()}, budget,
                                per_class)
    chosen: list[dict] = []
    for c, members in groups.items():
        if quota[c] == 0:
            continue
        if factors is None:
            chosen.extend(sample([rows[i] for i in members], quota[c], sampling, beta, seed))
            continue
        take = torch.tensor(members, dtype=torch.long)
        ids = [str(rows[i]["id"]) for i in members]
        m = (None if candidates is None else len(members) if candidates == "all"
             else min(candidates, len(members)))
        scores = [float(rows[i]["score"]) for i in members]
        if diverse_mode == "cluster-margin":
            picked = set(select_cluster_margin(ids, scores, factors[1][take], quota[c], seed,
                                               candidates=m, clusters=clusters))
        else:
            picked = set(select_diverse(ids, scores, factors[0][take], factors[1][take],
                                        quota[c], seed, candidates=m))
        chosen.extend(rows[i] for i, id_ in zip(members, ids) if id_ in picked)
    return sorted(chosen, key=order_key)
