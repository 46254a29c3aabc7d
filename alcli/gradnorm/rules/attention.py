"""nn.MultiheadAttention: its bare in_proj parameters, and out_proj, whose weight its forward
uses without calling out_proj.

During the ghost forward the module runs this file's `attention_forward`, the same math as
MultiheadAttention's with the projections exposed: the in-projection output (q|k|v, one tensor
for self-attention) and the out-projection output are tapped, so the single backward delivers
dL/dq, dL/dk, dL/dv and dL/dout per example. Each projection is then a Linear:
W_q grad_i = sum_t dq_it query_it^T (Gram or materialised form), bias grad_i = sum_t dq_it.
Configurations outside that math (bias_k/bias_v, add_zero_attn) get the generic rule.
"""
from __future__ import annotations

import inspect
import math

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import UnsupportedModel
from .registry import register, require_batch_dim, sq_norm_of_product

_SIGNATURE = inspect.signature(nn.MultiheadAttention.forward)


def _accepts(module) -> bool:
    return module.bias_k is None and not module.add_zero_attn


def attention_forward(module, args, kwargs, tap):
    """MultiheadAttention.forward with taps -> (its output, (query, key, value, o) batch-first for
    the rule). The taps, in order: q|k|v (self-attention) or q, k, v; then the output."""
    bound = _SIGNATURE.bind(module, *args, **kwargs)
    bound.apply_defaults()
    a = bound.arguments
    query, key, value = a["query"], a["key"], a["value"]
    if query.dim() != 3:
        raise UnsupportedModel("unbatched attention input")
    if not module.batch_first:  # [T, B, E] -> [B, T, E]
        query, key, value = (t.transpose(0, 1) for t in (query, key, value))
    embed, heads = module.embed_dim, module.num_heads
    self_attention = query is key and key is value and module._qkv_same_embed_dim
    if self_attention:
        qkv = tap(F.linear(query, module.in_proj_weight, module.in_proj_bias))  # [B, T, 3E]
        q, k, v = qkv.chunk(3, dim=-1)
    else:
        w_q, w_k, w_v = _in_weights(module)
        b_q, b_k, b_v = (None,) * 3 if module.in_proj_bias is None else module.in_proj_bias.chunk(3)
        q, k, v = (tap(F.linear(x, w, b)) for x, w, b in ((query, w_q, b_q), (key, w_k, b_k), (value, w_v, b_v)))
    batch, tgt, src = q.shape[0], q.shape[1], k.shape[1]
    head_dim = embed // heads
    qh = q.reshape(batch, tgt, heads, head_dim).transpose(1, 2)  # [B, H, T, hd]
    kh = k.reshape(batch, src, heads, head_dim).transpose(1, 2)  # [B, H, S, hd]
    vh = v.reshape(batch, src, heads, head_dim).transpose(1, 2)
    mask = _additive_mask(a["attn_mask"], a["key_padding_mask"], batch, heads, tgt, src, q.dtype, q.device)
    weights = None
    if a["need_weights"]:
        scores = qh @ kh.transpose(2, 3) / math.sqrt(head_dim)  # [B, H, T, S]
        attn = (scores if mask is None else scores + mask).softmax(-1)
        o = attn @ vh
        weights = attn.mean(1) if a["average_attn_weights"] else attn
    else:
        causal = bool(a["is_causal"]) and mask is None
        o = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask, is_causal=causal)
    o = o.transpose(1, 2).reshape(batch, tgt, embed)  # [B, T, E], out_proj's input
    out = tap(F.linear(o, module.out_proj.weight, module.out_proj.bias))
    if not module.batch_first:
        out = out.transpose(0, 1)
    return (out, weights), (query, key, value, o)


@register(nn.MultiheadAttention, layout="own", claims_children=("out_proj",), capture=attention_forward,
          accepts=_accepts)
def attention_rule(module, call, wanted):
    require_batch_dim(call, 0 if module.batch_first else 1)
    query, key, value, o = call.args
    *in_grads, grad_out = call.grad_out  # [dqkv] or [dq, dk, dv], then dL/dout; all [B, T, *]

    def product(a, g, want_grad, key_name):
        return g.transpose(1, 2) @ a if want_grad else sq_norm_of_product(a, g, call.cache, key_name)

    def bias(g, want_grad):
        return g.sum(1) if want_grad else g.sum(1).square().sum(1)

    result = {}
    if len(in_grads) == 1:  # self-attention: one fused q|k|v projection
        pairs = [(query, in_grads[0], "gram_in")]
    else:
        pairs = list(zip((query, key, value), in_grads, ("gram_q", "gram_k", "gram_v")))
    if "in_proj_weight" in wanted:
        parts = [product(a, g, wanted["in_proj_weight"], name) for a, g, name in pairs]
        result["in_proj_weight"] = torch.cat(parts, 1) if wanted["in_proj_weight"] else sum(parts)
    for (a, g, name), which in zip(pairs, "qkv"):
        if f"{which}_proj_weight" in wanted:
            result[f"{which}_proj_weight"] = product(a, g, wanted[f"{which}_proj_weight"], name)
    if "in_proj_bias" in wanted:
        parts = [bias(g, wanted["in_proj_bias"]) for g in in_grads]
        result["in_proj_bias"] = torch.cat(parts, 1) if wanted["in_proj_bias"] else sum(parts)
    if "out_proj.weight" in wanted:
        result["out_proj.weight"] = product(o, grad_out, wanted["out_proj.weight"], "gram_o")
    if "out_proj.bias" in wanted:
        result["out_proj.bias"] = bias(grad_out, wanted["out_proj.bias"])
    return result


def _in_weights(module):
    if module._qkv_same_embed_dim:
        return module.in_proj_weight.chunk(3)
    return module.q_proj_weight, module.k_proj_weight, module.v_proj_weight


def _additive_mask(attn_mask, key_padding_mask, batch, heads, tgt, src, dtype, device):
    """MultiheadAttention's two masks as one float mask [B, H, T, S] (bool True = masked out), or None."""
    if attn_mask is None and key_padding_mask is None:
        return None
    mask = torch.zeros(batch, heads, tgt, src, dtype=dtype, device=device)
    for m, shape in ((attn_mask, None), (key_padding_mask, (batch, 1, 1, src))):
        if m is None:
            continue
        if m.dtype == torch.bool:
            m = torch.zeros(m.shape, dtype=dtype, device=m.device).masked_fill(m, float("-inf"))
        if shape is None:
            shape = (tgt, src) if m.dim() == 2 else (batch, heads, tgt, src)
        mask = mask + m.to(dtype).reshape(shape)
    return mask
