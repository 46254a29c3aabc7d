"""nn.Embedding: example i's gradient puts sum_{t: idx_t = v} g_t into row v.

Squared norm without materialising [V, D]: sum_{t,s} [idx_t == idx_s] <g_t, g_s>.
Positions holding padding_idx receive no gradient.
"""
from __future__ import annotations

from torch import nn

from ..errors import UnsupportedModel
from ..outer import Outer
from .registry import register


@register(nn.Embedding, layout="anywhere")
def embedding_rule(module, call, wanted):
    if module.scale_grad_by_freq:
        raise UnsupportedModel("scale_grad_by_freq scales by counts over the whole batch")
    if module.max_norm is not None:
        raise UnsupportedModel("max_norm renormalises the weight in place during forward")
    idx = call.args[0]
    batch = idx.shape[0]
    idx = idx.reshape(batch, -1)                            # [B, T]
    g = call.grad_out.reshape(batch, idx.shape[1], module.embedding_dim)  # [B, T, D]
    if module.padding_idx is not None:
        g = g * (idx != module.padding_idx).unsqueeze(-1).to(g.dtype)
    if "weight" not in wanted:
        return {}
    if wanted["weight"]:  # the per-example gradient, as its factors: one-hot rows idx, g
        return {"weight": Outer(idx, g, module.num_embeddings)}
    same = (idx.unsqueeze(2) == idx.unsqueeze(1)).to(g.dtype)  # [B, T, T]
    return {"weight": (same * (g @ g.transpose(1, 2))).sum((1, 2))}
