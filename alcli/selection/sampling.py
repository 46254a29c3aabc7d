"""Stochastic batch acquisition (Kirsch et al., TMLR 2023): a batch drawn from the scores instead of
their top k, which keeps a large batch from piling onto one region of near-equal top scores.

    power:   P(i) ∝ s_i^β        softmax: P(i) ∝ exp(β s_i)        (β = --sampling-beta)

k examples without replacement by the Gumbel-top-k trick: the k largest keys β log s_i + G_i
(softmax: β s_i + G_i), G_i = -log(-log u_i) a Gumbel draw with u_i fixed by (seed, id), so a batch
does not depend on the rows' order. One key per row and one top-k: O(n) time and memory for any
n and k. A row without a finite score gets the key -inf (chosen last, by the usual order).
"""
from __future__ import annotations

import hashlib
import math

import torch

from .rank import order_key

SAMPLINGS = ("top", "power", "softmax")


def uniform(seed: int, id_) -> float:
    """A number in (0, 1) fixed by (seed, id)."""
    digest = hashlib.blake2b(f"sampling\0{seed}\0{id_}".encode(), digest_size=8).digest()
    return (int.from_bytes(digest, "big") + 0.5) / 2.0 ** 64


def keys(rows: list[dict], how: str, beta: float, seed: int) -> torch.Tensor:
    """[N] float64 Gumbel-top-k keys; a ValueError names a row whose score power cannot take."""
    scores = torch.tensor([float(r["score"]) if r.get("score") is not None else math.nan for r in rows],
                          dtype=torch.float64)
    finite = torch.isfinite(scores)
    if how == "power" and bool((scores[finite] < 0).any()):
        bad = rows[int(((scores < 0) & finite).nonzero()[0])]
        raise ValueError(f"--sampling power draws in proportion to score^β and row '{bad['id']}' has "
                         f"the negative score {bad['score']}; use --sampling softmax")
    logits = beta * (torch.log(scores) if how == "power" else scores)
    u = torch.tensor([uniform(seed, r["id"]) for r in rows], dtype=torch.float64)
    key = logits - torch.log(-torch.log(u))
    return torch.where(finite & ~torch.isnan(key), key, torch.full_like(key, -math.inf))


def sample(rows: list[dict], k: int, how: str, beta: float, seed: int) -> list[dict]:
    """k rows drawn without replacement (`top`: the k best), best score first."""
    if how == "top":
        return sorted(rows, key=order_key)[:k]
    key = keys(rows, how, beta, seed)
    k = min(k, len(rows))
    top = torch.topk(key, k).indices.tolist() if k else []
    drawn = [rows[i] for i in top if key[i] > -math.inf]
    if len(drawn) < k:  # rows without a finite score: only when nothing else is left
        rest = sorted((r for i, r in enumerate(rows) if key[i] == -math.inf), key=order_key)
        drawn += rest[:k - len(drawn)]
    return sorted(drawn, key=order_key)
