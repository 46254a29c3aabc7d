"""Diverse batch selection (BADGE) on factored last-layer gradient embeddings.

BADGE (Ash et al., 2020) embeds example i as the gradient of its loss, with the model's own
prediction ŷ_i as the label, w.r.t. the last linear layer's weight W [C, D]:

    u_i = (p_i − onehot(ŷ_i)) ⊗ h_i            # [C, D]; p = softmax output, h = penultimate features

and chooses the batch by k-means++ seeding in that space. We never materialise u (C·D numbers per
example). We keep a_i = p_i − onehot(ŷ_i) [C] and b_i = h_i [D], and use

    <a_i ⊗ b_i, a_j ⊗ b_j> = (a_i·a_j)(b_i·b_j)
    ||u_i − u_j||² = ||a_i||²||b_i||² + ||a_j||²||b_j||² − 2 (a_i·a_j)(b_i·b_j)

so one k-means++ step costs two mat-vecs (N×C and N×D) and memory stays O(N·(C+D)).

The random stream is a numpy Generator (PCG64) seeded with `seed`; each k-means++ step after the
first draws exactly one u = rng.random() and picks the first index whose cumulative D² weight
exceeds u·total. `kmeanspp_dense` follows the same stream on explicit embeddings, so for the same
seed both return the same picks (up to float rounding of the distances).
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from .rank import score_order

DEFAULT_CANDIDATE_FACTOR = 10  # select_diverse looks at the top (factor × budget) by score


def badge_factors(probs: torch.Tensor, features: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Factors of the BADGE embedding: a = p − onehot(argmax p) [N, C], b = h [N, D].

    Ties in argmax go to the lowest class index (torch.argmax returns the first maximum).
    """
    probs, features = torch.as_tensor(probs), torch.as_tensor(features)
    if probs.dim() != 2 or features.dim() != 2 or probs.shape[0] != features.shape[0]:
        raise ValueError(f"badge_factors needs probs [N, C] and features [N, D]; "
                         f"got {tuple(probs.shape)} and {tuple(features.shape)}")
    probs = probs.detach()
    onehot = torch.zeros_like(probs).scatter_(1, probs.argmax(dim=1, keepdim=True), 1.0)
    a = probs - onehot  # p − onehot(ŷ), on the device, no host sync
    return a, features.detach()


# --- k-means++ seeding -----------------------------------------------------------------------------

def _sample_d2(d2: np.ndarray, u: float) -> int | None:
    """First index whose cumulative weight exceeds u·total (None if the total is 0); zero-weight
    rows are never chosen."""
    cum = np.cumsum(d2)
    if not cum[-1] > 0:
        return None
    idx = min(int(np.searchsorted(cum, u * cum[-1], side="right")), len(d2) - 1)
    while d2[idx] <= 0:  # only reachable via the clamp above when the tail has zero weight
        idx -= 1
    return idx


def _matvec(m: torch.Tensor, v: torch.Tensor) -> np.ndarray:
    """m [R, K] @ v [K] -> numpy [R]. Small products run single-threaded in numpy: a threaded
    BLAS call costs more in thread wake-ups than the product itself (and much more when the
    CPU is shared); large ones are memory-bound and go to torch's threaded BLAS."""
    if m.numel() < (1 << 23):
        return np.einsum("ij,j->i", m.numpy(), v.numpy())
    return torch.mv(m, v).numpy()


def kmeanspp_factored(a, b, k: int, seed: int, *, first: int | None = None,
                      chunk: int = 65536) -> list[int]:
    """k-means++ seeding on u_i = a_i ⊗ b_i without forming u -> k distinct row indices, pick order.

    a [N, C], b [N, D]. The first center is `first`, or (as in BADGE) the largest ||u_i||, lowest
    index on ties. Each later center is drawn with probability ∝ D²(i), the squared distance to
    the nearest chosen center. If every remaining D² is 0 (fewer than k distinct embeddings), the
    lowest unchosen index is taken. The mat-vecs run in the factors' dtype, `chunk` rows at a time;
    distances are combined in float64. The formula cancels when u_i ≈ u_c, so a distance below
    64·eps(dtype)·(||u_i||² + ||u_c||²) counts as 0 (the two are duplicates at that precision).
    """
    a, b = ((t if t.is_floating_point() else t.double()).detach().cpu().contiguous()
            for t in (torch.as_tensor(a), torch.as_tensor(b)))
    n = _check_k(a, b, k)
    sq = np.empty(n)  # ||u_i||² = ||a_i||² ||b_i||²   [N] float64
    for s in range(0, n, chunk):
        sq[s:s + chunk] = (a[s:s + chunk].double().pow(2).sum(1)
                           * b[s:s + chunk].double().pow(2).sum(1)).numpy()
    c = int(np.argmax(sq)) if first is None else _check_first(first, n)
    tol = 64 * max(torch.finfo(a.dtype).eps, torch.finfo(b.dtype).eps)  # the coarser mat-vec
    rng = np.random.default_rng(seed)
    d2 = np.full(n, np.inf)  # [N] squared distance to the nearest chosen center
    chosen = [c]
    while len(chosen) < k:
        d2[c] = 0.0  # D² only decreases, so a chosen row keeps weight 0
        ac, bc = a[c], b[c]
        for s in range(0, n, chunk):  # ||u_i − u_c||² for rows s..e; elementwise work in numpy
            e = min(s + chunk, n)
            ab = _matvec(a[s:e], ac).astype(np.float64)
            ab *= _matvec(b[s:e], bc)  # (a_i·a_c)(b_i·b_c) = <u_i, u_c>
            both = sq[s:e] + sq[c]
            d = both - 2.0 * ab
            d[d <= tol * both] = 0.0  # cancellation noise where u_i ≈ u_c: a duplicate
            np.minimum(d2[s:e], d, out=d2[s:e])
        u = rng.random()
        nxt = _sample_d2(d2, u)
        chosen.append(_lowest_unchosen(n, chosen) if nxt is None else nxt)
        c = chosen[-1]
    return chosen


def kmeanspp_dense(emb, k: int, seed: int, *, first: int | None = None) -> list[int]:
    """Reference k-means++ on explicit embeddings emb [N, C*D] (numpy, float64), same stream.

    Only for tests and small pools: it holds the N×C·D matrix.
    """
    emb = np.asarray(torch.as_tensor(emb).detach().cpu().numpy(), dtype=np.float64)
    n = emb.shape[0]
    if not 1 <= k <= n:
        raise ValueError(f"k must be between 1 and the pool size {n}; got {k}")
    c = int(np.argmax((emb ** 2).sum(1))) if first is None else _check_first(first, n)
    rng = np.random.default_rng(seed)
    d2 = np.full(n, np.inf)
    chosen = [c]
    while len(chosen) < k:
        d2 = np.minimum(d2, ((emb - emb[c]) ** 2).sum(1))
        d2[chosen] = 0.0
        u = rng.random()
        nxt = _sample_d2(d2, u)
        c = _lowest_unchosen(n, chosen) if nxt is None else nxt
        chosen.append(c)
    return chosen


def _check_first(first: int, n: int) -> int:
    if not 0 <= int(first) < n:
        raise ValueError(f"first center {first} is outside the pool of {n}")
    return int(first)


def _lowest_unchosen(n: int, chosen: list[int]) -> int:
    taken = set(chosen)
    return next(i for i in range(n) if i not in taken)


def _check_k(a: torch.Tensor, b: torch.Tensor, k: int) -> int:
    if a.dim() != 2 or b.dim() != 2 or a.shape[0] != b.shape[0]:
        raise ValueError(f"need a [N, C] and b [N, D] with the same N; "
                         f"got {tuple(a.shape)} and {tuple(b.shape)}")
    n = a.shape[0]
    if not 1 <= k <= n:
        raise ValueError(f"k must be between 1 and the pool size {n}; got {k}")
    return n


# --- the batch -------------------------------------------------------------------------------------

def select_diverse(ids: Sequence[str], scores, a, b, budget: int, seed: int, *,
                   candidates: int | None = None) -> list[str]:
    """BADGE batch of `budget` ids among the best-scoring examples, best score first (ties by id).

    How the score takes part: the examples are ranked by (−score, id) and only the top
    `candidates` (default min(N, 10 × budget), as in Cluster-Margin's "top-M then diversify") enter
    k-means++, whose first center is the single best-scoring example. So every chosen example is
    in the top `candidates` by score, the best one is always in the batch, and within that shortlist
    near-duplicates are avoided (a copy of a chosen example has D² ≈ 0; if the shortlist runs out of
    distinct embeddings, the best-scoring rest fill the batch). Pass candidates=len(ids)
    for classic BADGE over the whole pool. The result does not depend on the input row order.
    """
    ids = [str(i) for i in ids]
    s = np.asarray(torch.as_tensor(scores, dtype=torch.float64).cpu().numpy()).reshape(-1)
    a, b = torch.as_tensor(a), torch.as_tensor(b)
    n = len(ids)
    if not (len(s) == n == a.shape[0] == b.shape[0]):
        raise ValueError(f"select_diverse got {n} ids, {len(s)} scores, {a.shape[0]} rows of a "
                         f"and {b.shape[0]} rows of b; they must agree")
    check_scores_and_ids(ids, s, "select_diverse")
    if budget < 0:
        raise ValueError(f"budget must be >= 0; got {budget}")
    order = sorted(range(n), key=lambda i: score_order(float(s[i]), ids[i]))
    budget = min(budget, n)
    if budget == 0:
        return []
    m = min(n, DEFAULT_CANDIDATE_FACTOR * budget) if candidates is None else candidates
    if not budget <= m <= n:
        raise ValueError(f"candidates must be between the budget {budget} and the pool size {n}; "
                         f"got {m}")
    top = torch.tensor(order[:m], dtype=torch.long)
    picks = kmeanspp_factored(a[top], b[top], budget, seed, first=0)
    chosen = sorted(picks)  # positions in the score order == best score first, ties by id
    return [ids[order[p]] for p in chosen]


def check_scores_and_ids(ids: list, scores: np.ndarray, who: str):
    """Every score finite and every id once, or a ValueError naming the first bad id."""
    if not np.all(np.isfinite(scores)):
        bad = ids[int(np.flatnonzero(~np.isfinite(scores))[0])]
        raise ValueError(f"score of id '{bad}' is not a finite number")
    if len(set(ids)) != len(ids):
        raise ValueError(f"{who} got the same id twice")
