"""Cluster-Margin (Citovsky et al., NeurIPS 2021): a diverse batch of any size that never holds
n x k distances.

    shortlist: the k_m best-scoring rows (lowest margin under --strategy margin), k_m =
               --diverse-candidates (default 10 x budget)
    clusters:  k-means of their penultimate features b [k_m, D] into m clusters (default m = the
               budget): k-means++ seeding drawn by `seed` among max(4096, 2m) sampled rows,
               then Lloyd's iterations on all k_m rows until no label changes (at most
               MAX_ITERS = 10)
    the batch: the clusters from smallest to largest (ties: the cluster whose best row ranks
               first), one row per cluster per pass, each cluster's rows best score first, until
               `budget` rows are picked

The paper clusters the whole pool once by agglomerative clustering (average linkage), which holds
O(n²) distances. k-means of the shortlist keeps memory at O(k_m·D + m·D) plus one block of at
most 4M distances (`chunk` rows, fewer for a large m), never a k_m x m matrix; time is
O(k_m·m·D) per Lloyd iteration (a matrix product) and O(m²·D) for the seeding (one mat-vec per
center). Within a cluster the paper draws a row at random; here the best score goes first, so
the batch depends on the seed only through the clustering.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from .diverse import DEFAULT_CANDIDATE_FACTOR, check_scores_and_ids
from .kmeans import kmeans
from .rank import score_order


def round_robin(labels: Sequence[int], budget: int) -> list[int]:
    """Positions picked from clusters `labels` [k_m] (positions in score order, best first):
    clusters from smallest to largest, ties by their best position; one per cluster per pass.

    A cluster of size s runs out after s passes and, the clusters being sorted by size, the ones
    left in pass p are a suffix of that order: O(k_m) in all."""
    members: dict[int, list[int]] = {}
    for pos, c in enumerate(labels):
        members.setdefault(int(c), []).append(pos)  # best score first within a cluster
    order = sorted(members.values(), key=lambda ms: (len(ms), ms[0]))
    budget = min(budget, len(labels))
    picks: list[int] = []
    start, p = 0, 0
    while len(picks) < budget:
        while len(order[start]) <= p:
            start += 1
        for ms in order[start:]:
            picks.append(ms[p])
            if len(picks) == budget:
                break
        p += 1
    return picks


def select_cluster_margin(ids: Sequence[str], scores, b, budget: int, seed: int, *,
                          candidates: int | None = None, clusters: int | None = None,
                          chunk: int = 4096) -> list[str]:
    """Cluster-Margin's batch of `budget` ids, best score first (ties by id).

    b [N, D]: the rows' penultimate features (TABLE.emb.npz's b). candidates: k_m, the shortlist
    (default min(N, 10 x budget)); clusters: m (default the budget, at most k_m). The result does
    not depend on the input row order."""
    ids = [str(i) for i in ids]
    s = np.asarray(torch.as_tensor(scores, dtype=torch.float64).cpu().numpy()).reshape(-1)
    b = torch.as_tensor(b)
    n = len(ids)
    if not (len(s) == n == b.shape[0]) or b.dim() != 2:
        raise ValueError(f"Cluster-Margin got {n} ids, {len(s)} scores and features of shape "
                         f"{tuple(b.shape)}; it needs one [N, D] row per id")
    check_scores_and_ids(ids, s, "Cluster-Margin")
    budget = min(budget, n)
    if budget < 1:
        return []
    km = min(n, DEFAULT_CANDIDATE_FACTOR * budget) if candidates is None else candidates
    if not budget <= km <= n:
        raise ValueError(f"candidates must be between the budget {budget} and the pool size {n}; "
                         f"got {km}")
    m = min(budget if clusters is None else clusters, km)
    if m < 1:
        raise ValueError(f"--diverse-clusters must be at least 1; got {clusters}")
    order = sorted(range(n), key=lambda i: score_order(float(s[i]), ids[i]))[:km]
    labels = kmeans(b[torch.tensor(order, dtype=torch.long)], m, seed, chunk=chunk)
    picks = sorted(round_robin(labels.tolist(), budget))  # positions in score order
    return [ids[order[p]] for p in picks]
