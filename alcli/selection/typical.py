"""Cold start: TypiClust (Hacohen et al., ICML 2022) on the model's own penultimate features.

The first rounds of labeling, when the model's scores say little: cluster the pool, and label the
most typical example of each of the largest clusters no labeled example covers.

    clusters: k-means (k-means++ seeding, then Lloyd) of the features b_i [N, D] of the candidates
              and the labeled examples together, k = |labeled| + budget clusters
    typicality(x) = 1 / mean_{y in kNN(x)} ||x − y||,  kNN = the K = min(20, size − 1) nearest
              other members of x's cluster
    the batch: repeatedly take the cluster with the fewest labeled (and already picked) examples,
              the largest on ties (then the one whose first member comes first), and pick its most
              typical unpicked candidate. With k = |labeled| + budget there are at least `budget`
              clusters with no labeled example, so this is "the most typical example of each of
              the `budget` largest uncovered clusters".

Memory stays O(N·(D + k)) plus chunks: distances are computed `chunk` rows at a time, never as an
N × N matrix. A cluster larger than SAMPLE_CAP has its typicality computed for a seeded random
sample of SAMPLE_CAP members, measured against that sample (as TypiClust caps its kNN work).
"""
from __future__ import annotations

import heapq

import numpy as np
import torch

from .kmeans import kmeans as shared_kmeans

K_NEIGHBOURS = 20      # TypiClust's K
SAMPLE_CAP = 20_000    # members of one cluster whose typicality is computed
MAX_ITERS = 100        # Lloyd iterations at most (it stops when no assignment changes)


def kmeans(x, k: int, seed: int, *, chunk: int = 4096) -> torch.Tensor:
    """Cluster labels [N] in 0..k-1 of the rows of x [N, D] (float64), seeded: `kmeans.kmeans`
    with k-means++ seeding among all N rows and at most MAX_ITERS Lloyd iterations."""
    x = torch.as_tensor(x).detach().cpu().double()
    return shared_kmeans(x, k, seed, chunk=chunk, max_iters=MAX_ITERS, seed_rows=len(x))


def typicality(x, *, k: int = K_NEIGHBOURS, chunk: int = 1024) -> torch.Tensor:
    """[M] float64: 1 / mean distance of each row of x [M, D] to its min(k, M − 1) nearest other
    rows (inf where that distance is 0; a lone row: inf). Distances `chunk` rows at a time."""
    x = torch.as_tensor(x).detach().cpu().double()
    x = x - x.mean(0)
    m = len(x)
    kk = min(k, m - 1)
    if kk < 1:
        return torch.full((m,), float("inf"), dtype=torch.float64)
    sq = x.pow(2).sum(1)
    out = torch.empty(m, dtype=torch.float64)
    for s in range(0, m, chunk):
        xs = x[s:s + chunk]
        d = (sq[s:s + chunk, None] - 2 * xs @ x.T + sq).clamp_min_(0).sqrt_()  # [c, M]
        near = torch.topk(d, kk + 1, dim=1, largest=False).values  # its own 0 among them
        mean = (near.sum(1) - near[:, 0]) / kk  # drop one 0: the row itself
        out[s:s + chunk] = 1.0 / mean
    return out


def select_typical(features, labeled, budget: int, seed: int) -> list[int]:
    """TypiClust's batch: positions (into the candidates) of `budget` typical, uncovered examples.

    features: b [N_candidates, D] of the candidates; labeled: b [L, D] of the labeled examples
    (may be empty). Returned in pick order."""
    feats = torch.as_tensor(features).detach().cpu().double()
    lab = torch.as_tensor(labeled).detach().cpu().double().reshape(-1, feats.shape[1])
    n = len(feats)
    budget = min(budget, n)
    if budget < 1:
        return []
    both = torch.cat([feats, lab])
    k = min(len(lab) + budget, len(both))
    clusters = kmeans(both, k, seed)
    cand_of = clusters[:n]
    covered = torch.bincount(clusters[n:], minlength=k).tolist()
    size = torch.bincount(cand_of, minlength=k).tolist()
    by_cluster = torch.argsort(cand_of, stable=True).split(size)  # each cluster's positions, in order
    # the next cluster to draw from: fewest labeled (and picked), largest, first member first
    heap = [(covered[c], -size[c], int(by_cluster[c][0]), c) for c in range(k) if size[c] > 0]
    heapq.heapify(heap)
    members: dict[int, list[int]] = {}  # cluster -> candidate positions, most typical last
    picks: list[int] = []
    while len(picks) < budget:
        cov, neg_size, first, c = heapq.heappop(heap)
        if c not in members:
            members[c] = _by_typicality(feats, by_cluster[c], seed)[::-1]
        picks.append(members[c].pop())
        if neg_size < -1:
            heapq.heappush(heap, (cov + 1, neg_size + 1, first, c))
    return picks


def _by_typicality(feats: torch.Tensor, positions: torch.Tensor, seed: int) -> list[int]:
    """A cluster's candidate positions, most typical first (ties: the earlier position); a cluster
    over SAMPLE_CAP is judged on a seeded sample of it, the rest after in position order."""
    positions = positions.tolist()
    if len(positions) > SAMPLE_CAP:
        keep = np.sort(np.random.default_rng(seed).choice(len(positions), SAMPLE_CAP, replace=False))
        rest = sorted(set(positions) - {positions[i] for i in keep})
        positions = [positions[i] for i in keep]
    else:
        rest = []
    t = typicality(feats[positions]).tolist()
    order = sorted(range(len(positions)), key=lambda j: (-t[j], positions[j]))
    return [positions[j] for j in order] + rest
