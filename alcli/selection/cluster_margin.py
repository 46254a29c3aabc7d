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
from .rank import score_order

MAX_ITERS = 10    # Lloyd iterations at most (it stops earlier when no label changes)
SEED_ROWS = 4096  # k-means++ seeds among at most max(SEED_ROWS, SEED_FACTOR x m) sampled rows
SEED_FACTOR = 2
BLOCK = 1 << 22   # distances held at once while assigning rows to centers (16 MB in float32)


def assign(x: torch.Tensor, centers: torch.Tensor, chunk: int) -> torch.Tensor:
    """[N] index of each row's nearest center (the lowest index on ties), at most `chunk` rows
    and BLOCK distances at a time: the one distance block is [min(chunk, BLOCK / m), m]."""
    labels = torch.empty(len(x), dtype=torch.long)
    c2 = centers.pow(2).sum(1)
    rows = max(1, min(chunk, BLOCK // len(centers)))
    for s in range(0, len(x), rows):
        # ||x − c||² − ||x||² = ||c||² − 2 x·c: the same order of centers  [rows, m]
        d = torch.addmm(c2, x[s:s + rows], centers.T, alpha=-2)
        labels[s:s + rows] = d.argmin(1)
    return labels


def seeding(x: torch.Tensor, m: int, rng: np.random.Generator) -> list[int]:
    """k-means++ (Arthur & Vassilvitskii 2007): the first center uniform, each next one drawn with
    probability ∝ D², the squared distance to the nearest center so far (rng.integers(n), then
    one rng.random() per center). Memory: D² [N]; time O(N·m·D), one mat-vec per center in
    numpy's einsum, single-threaded: a threaded BLAS mat-vec cost 20 times more in thread
    wake-ups on a shared CPU."""
    xs = x.numpy()
    n = len(xs)
    sq = np.einsum("ij,ij->i", xs, xs, dtype=np.float64)  # ||x_i||²  [N]
    d2 = np.full(n, np.inf)
    centers = [int(rng.integers(n))]
    while True:
        c = centers[-1]
        d = sq - 2.0 * np.einsum("ij,j->i", xs, xs[c]).astype(np.float64) + sq[c]  # ||x − x_c||²
        np.minimum(d2, np.maximum(d, 0.0), out=d2)
        d2[c] = 0.0
        if len(centers) == m:
            return centers
        cum = np.cumsum(d2)
        if cum[-1] > 0:
            centers.append(min(int(np.searchsorted(cum, rng.random() * cum[-1], side="right")),
                               n - 1))
        else:  # fewer distinct rows than m: the lowest unchosen row
            taken = set(centers)
            centers.append(next(i for i in range(n) if i not in taken))


def kmeans(x, m: int, seed: int, *, chunk: int = 4096, max_iters: int = MAX_ITERS,
           seed_rows: int | None = None) -> torch.Tensor:
    """Cluster labels [N] in 0..m-1 of the rows of x [N, D], in x's float dtype (float64 for
    integers). First centers: k-means++ (`seeding`) among max(seed_rows (default SEED_ROWS),
    SEED_FACTOR x m) rows drawn without replacement (rng.choice, then sorted), or among all N
    when N is no more; numpy's PCG64 stream seeded by `seed`. Then Lloyd's
    iterations on all N rows; a cluster that empties keeps its center."""
    x = torch.as_tensor(x).detach().cpu()
    x = x if x.is_floating_point() else x.double()
    x = x - x.mean(0)  # centered: less cancellation in ||x||² − 2x·c + ||c||²
    n = len(x)
    if not 1 <= m <= n:
        raise ValueError(f"k-means needs 1 <= m <= {n} rows; got m = {m}")
    rng = np.random.default_rng(seed)
    s = max(SEED_ROWS if seed_rows is None else seed_rows, SEED_FACTOR * m)
    rows = np.sort(rng.choice(n, s, replace=False)) if s < n else np.arange(n)
    first = rows[seeding(x[torch.as_tensor(rows)], m, rng)]
    centers = x[torch.as_tensor(first, dtype=torch.long)].double()  # [m, D] means
    labels = torch.full((n,), -1, dtype=torch.long)
    for _ in range(max_iters):
        new = assign(x, centers.to(x.dtype), chunk)
        if torch.equal(new, labels):
            break
        labels = new
        counts = torch.bincount(labels, minlength=m)
        sums = torch.zeros_like(centers).index_add_(0, labels, x.double())
        filled = counts > 0
        centers[filled] = sums[filled] / counts[filled].unsqueeze(1)
    return labels


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
