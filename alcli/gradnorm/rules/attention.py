"""nn.MultiheadAttention: its bare in_proj parameters (and out_proj, which its forward uses
without calling out_proj).

The attention core is recomputed from the captured inputs with q, k, v and the head output o as
leaves; one batched autograd.grad gives dL/dq, dL/dk, dL/dv per example, and each projection is a
Linear: W_q grad_i = sum_t dq_it query_it^T, and so on (Gram or materialised form per layer).
Configurations this recomputation does not cover (bias_k/bias_v, add_zero_attn) go to the
generic rule.
"""
from __future__ import annotations

import inspect
import math

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import UnsupportedModel
from . import register, sq_norm_of_product
from .generic import generic_rule

_SIGNATURE = inspect.signature(nn.MultiheadAttention.forward)


@register(nn.MultiheadAttention, layout="own", claims_children=("out_proj",))
def attention_rule(module, call, wanted):
    if module.bias_k is not None or module.add_zero_attn:
        return generic_rule(module, call, wanted)
    if call.args and call.layout.in_dims[0] != (0 if module.batch_first else 1):
        raise UnsupportedModel("its query does not carry the batch where batch_first says")
    cached = call.cache.get("core")
    if cached is None:
        cached = call.cache["core"] = _recompute(module, call)
    inputs, leaves, o, out, weights = cached
    grad_out, grad_weights = call.grad_out if isinstance(call.grad_out, tuple) else (call.grad_out, None)
    if not module.batch_first:
        grad_out = grad_out.transpose(0, 1)
    with torch.enable_grad():  # rules may run inside the backward pass, where grad mode is off
        objective = (out * grad_out).sum()
        if weights is not None and grad_weights is not None:
            objective = objective + (weights * grad_weights).sum()
        dq, dk, dv = torch.autograd.grad(objective, leaves, retain_graph=True)
    o = o.detach()

    def product(a, g, want_grad, key):
        return g.transpose(1, 2) @ a if want_grad else sq_norm_of_product(a, g, call.cache, key)

    def bias(g, want_grad):
        return g.sum(1) if want_grad else g.sum(1).pow(2).sum(1)

    result = {}
    pairs = list(zip(inputs, (dq, dk, dv), "qkv"))
    if "in_proj_weight" in wanted:
        parts = [product(a, g, wanted["in_proj_weight"], f"gram_{n}") for a, g, n in pairs]
        result["in_proj_weight"] = torch.cat(parts, 1) if wanted["in_proj_weight"] else sum(parts)
    for a, g, n in pairs:
        if f"{n}_proj_weight" in wanted:
            result[f"{n}_proj_weight"] = product(a, g, wanted[f"{n}_proj_weight"], f"gram_{n}")
    if "in_proj_bias" in wanted:
        parts = [bias(g, wanted["in_proj_bias"]) for g in (dq, dk, dv)]
        result["in_proj_bias"] = torch.cat(parts, 1) if wanted["in_proj_bias"] else sum(parts)
    if "out_proj.weight" in wanted:
        result["out_proj.weight"] = product(o, grad_out, wanted["out_proj.weight"], "gram_o")
    if "out_proj.bias" in wanted:
        result["out_proj.bias"] = bias(grad_out, wanted["out_proj.bias"])
    return result


def _recompute(module, call):
    """-> ((query, key, value) [B, T|S, E*], (q, k, v) leaves, o [B, T, E], output [B, T, E], weights)."""
    bound = _SIGNATURE.bind(module, *call.args, **call.kwargs)
    bound.apply_defaults()
    a = bound.arguments
    query, key, value = (t.detach() for t in (a["query"], a["key"], a["value"]))
    if not module.batch_first:  # [T, B, E] -> [B, T, E]
        query, key, value = (t.transpose(0, 1) for t in (query, key, value))
    embed, heads = module.embed_dim, module.num_heads
    if module._qkv_same_embed_dim:
        w_q, w_k, w_v = module.in_proj_weight.detach().chunk(3)
    else:
        w_q, w_k, w_v = (module.q_proj_weight.detach(), module.k_proj_weight.detach(),
                         module.v_proj_weight.detach())
    b_q = b_k = b_v = None
    if module.in_proj_bias is not None:
        b_q, b_k, b_v = module.in_proj_bias.detach().chunk(3)
    with torch.enable_grad():
        q, k, v = (F.linear(x, w, b).detach().requires_grad_()
                   for x, w, b in ((query, w_q, b_q), (key, w_k, b_k), (value, w_v, b_v)))
        batch, tgt, src = q.shape[0], q.shape[1], k.shape[1]
        head_dim = embed // heads
        qh = q.view(batch, tgt, heads, head_dim).transpose(1, 2)  # [B, H, T, hd]
        kh = k.view(batch, src, heads, head_dim).transpose(1, 2)  # [B, H, S, hd]
        vh = v.view(batch, src, heads, head_dim).transpose(1, 2)
        scores = qh @ kh.transpose(2, 3) / math.sqrt(head_dim)   # [B, H, T, S]
        scores = scores + _additive_mask(a["attn_mask"], a["key_padding_mask"], batch, heads, tgt, src,
                                         scores.dtype)
        attn = scores.softmax(-1)
        o = (attn @ vh).transpose(1, 2).reshape(batch, tgt, embed)  # out_proj's input
        out = F.linear(o, module.out_proj.weight.detach(), _detach(module.out_proj.bias))
        weights = None
        if a["need_weights"]:
            weights = attn.mean(1) if a["average_attn_weights"] else attn
    return (query, key, value), (q, k, v), o, out, weights


def _additive_mask(attn_mask, key_padding_mask, batch, heads, tgt, src, dtype):
    mask = torch.zeros(batch, heads, tgt, src, dtype=dtype, device=_device(attn_mask, key_padding_mask))
    for m, shape in ((attn_mask, None), (key_padding_mask, (batch, 1, 1, src))):
        if m is None:
            continue
        if m.dtype == torch.bool:
            m = torch.zeros(m.shape, dtype=dtype, device=m.device).masked_fill(m, float("-inf"))
        if shape is None:
            shape = (tgt, src) if m.dim() == 2 else (batch, heads, tgt, src)
        mask = mask + m.to(dtype).reshape(shape)
    return mask


def _device(*tensors):
    for t in tensors:
        if t is not None:
            return t.device
    return None


def _detach(t):
    return None if t is None else t.detach()
