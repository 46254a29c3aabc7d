"""k-means for selection (Cluster-Margin's clusters, TypiClust's): k-means++ seeding on a seeded
sample of rows, then Lloyd's iterations on every row, distances a bounded block at a time (never
an N x m matrix)."""
from __future__ import annotations

import numpy as np
import torch

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
