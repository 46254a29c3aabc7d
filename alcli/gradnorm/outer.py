"""Per-example gradients of a parameter several calls use, held as factors where that is cheaper.

A linear map's per-example weight gradient is a sum of outer products, sum_t r_t c_t^T [R, C]:
a Linear's r_t = g_t (output gradient), c_t = a_t (input); an embedding's r_t = onehot(idx_t),
c_t = g_t. `Outer(rows, cols, size)` holds those factors. A parameter used more than once (a
tied input/output embedding, a Linear called twice) needs the norm of the SUM of its uses'
gradients: ||sum_p X_p||^2 = sum_p ||X_p||^2 + 2 sum_{p<q} <X_p, X_q>, and for two Outer terms
<P, Q> = sum_{t,s} <r_t, r'_s> <c_t, c'_s>, a [T, S] product per example (a one-hot row's inner
products are a gather or an index match), so GPT-2's tied [V, d] = [50257, 768] per-example
gradient is never formed. A term stays factors while all of the parameter's factors hold no
more numbers than its gradient (sum_p T_p (R + C) <= R C, an index row counting 1), which also
keeps the pairwise products (N T_p (R + C) for N tokens in all) no dearer than forming each
term's gradient (T_p R C); a term past that is added into the parameter's one dense sum.
`dot` takes the sum's inner product with a fixed V [R, C] the same way: sum_t r_t^T V c_t.
"""
from __future__ import annotations

from typing import NamedTuple

import torch


class Outer(NamedTuple):
    """Example i's gradient sum_t rows[i, t] (x) cols[i, t], [R, C]."""
    rows: torch.Tensor  # [B, T, R], or [B, T] integer indices of one-hot rows
    cols: torch.Tensor  # [B, T, C]
    size: int           # R


def indexed(term: Outer) -> bool:
    return not term.rows.is_floating_point()


def transposed(term):
    """The gradient of the transposed weight (Hugging Face's Conv1D stores [d_in, d_out])."""
    if isinstance(term, Outer):
        return Outer(term.cols, term.rows, term.cols.shape[-1])
    return term.transpose(1, 2)


def dense(term) -> torch.Tensor:
    """[B, R, C] (a dense term as it is)."""
    if not isinstance(term, Outer):
        return term
    if not indexed(term):
        return term.rows.transpose(1, 2) @ term.cols
    batch, steps, width = term.cols.shape
    flat = (term.rows + term.size * torch.arange(batch, device=term.rows.device).unsqueeze(1)).flatten()
    out = torch.zeros(batch * term.size, width, dtype=term.cols.dtype, device=term.cols.device)
    out = out.index_add(0, flat, term.cols.reshape(-1, width))  # out of place: vmaps over K
    return out.view(batch, term.size, width)


def add(terms: list, term) -> list:
    """A parameter's terms (its dense sum first, if any, then factored terms) with `term` added."""
    factored = sum(_numbers(t) for t in terms if isinstance(t, Outer))
    if isinstance(term, Outer) and factored + _numbers(term) <= term.size * term.cols.shape[-1]:
        return [*terms, term]
    if terms and not isinstance(terms[0], Outer):
        return [terms[0] + dense(term), *terms[1:]]
    return [dense(term), *terms]


def _numbers(term: Outer) -> int:
    """How many numbers the factors hold per example: T (R + C), an index row counting 1."""
    return term.cols.shape[1] * ((1 if indexed(term) else term.size) + term.cols.shape[-1])


def sq_norm(terms: list, acc: torch.dtype) -> torch.Tensor:
    """[B] squared norms of the sum of `terms`, added up in `acc`."""
    total = None
    for i, p in enumerate(terms):
        part = _sq_dense(p, acc) if not isinstance(p, Outer) else _inner(p, p).to(acc)
        for q in terms[i + 1:]:
            part = part + 2 * _inner(p, q).to(acc)
        total = part if total is None else total + part
    return total


def _inner(p, q) -> torch.Tensor:
    """[B] <P_i, Q_i> (Frobenius) of a dense or factored P and a factored Q, without [B, R, C]."""
    if not isinstance(p, Outer):  # sum_s r_s^T P c_s
        picked = (torch.gather(p, 1, q.rows.unsqueeze(-1).expand(*q.rows.shape, p.shape[-1])) if indexed(q)
                  else q.rows @ p)                                     # [B, S, C]
        return (picked * q.cols).sum((1, 2))
    if indexed(p) and not indexed(q):  # <P, Q> = <Q, P>: the one-hot side second
        p, q = q, p
    cols = p.cols @ q.cols.transpose(1, 2)                             # [B, T, S]
    if not indexed(q):
        rows = p.rows @ q.rows.transpose(1, 2)
    elif indexed(p):
        rows = (p.rows.unsqueeze(2) == q.rows.unsqueeze(1)).to(cols.dtype)
    else:  # <r_t, onehot(j_s)> = r_t[j_s]
        rows = torch.gather(p.rows, 2, q.rows.unsqueeze(1).expand(-1, p.rows.shape[1], -1))
    return (rows * cols).sum((1, 2))


def dot(terms: list, v: torch.Tensor, acc: torch.dtype) -> torch.Tensor:
    """[B] <sum of `terms`, V> for one fixed V of the parameter's shape (a linear map's [R, C]),
    added up in `acc`. A factored term needs no [B, R, C] gradient: sum_t r_t^T V c_t, an
    index row's r_t^T V being V's row idx_t."""
    total = None
    for p in terms:
        part = _dot(p, v.to(p.cols.dtype if isinstance(p, Outer) else p.dtype)).to(acc)
        total = part if total is None else total + part
    return total


def _dot(p, v: torch.Tensor) -> torch.Tensor:
    if not isinstance(p, Outer):  # [B, *shape] . V: a matrix-vector product over the flattened shape
        return p.reshape(p.shape[0], -1) @ v.reshape(-1)
    if indexed(p):
        picked = v[p.rows]                                             # [B, T, C]
    else:
        picked = p.rows @ v                                            # [B, T, R] @ [R, C] -> [B, T, C]
    return (picked * p.cols).sum((1, 2))


SQ_BLOCK = 1 << 22  # elements of the batch's per-example gradients squared at once in float64


def _sq_dense(g: torch.Tensor, acc: torch.dtype) -> torch.Tensor:
    """[B, *shape] -> [B] sums of squares in `acc`, a block of columns at a time, so that a large
    per-example gradient is never copied whole into float64."""
    flat = g.reshape(g.shape[0], -1)
    step = max(1, SQ_BLOCK // max(flat.shape[0], 1))
    parts = [part.to(acc).square().sum(1) for part in flat.split(step, 1)]
    total = parts[0]
    for part in parts[1:]:
        total = total + part
    return total
