"""nn.Linear on inputs [B, d_in] or [B, *, d_in]: W grad_i = sum_t g_it a_it^T, b grad_i = sum_t g_it.

Hugging Face's Conv1D (GPT-2's projections) is a Linear with the weight stored transposed,
[d_in, d_out] (y = x W + b): the same rule, its per-example weight gradient transposed."""
from __future__ import annotations

from torch import nn

from .registry import flat_batch, register, sq_norm_of_product


@register(nn.Linear, "transformers.pytorch_utils.Conv1D", layout="anywhere")
def linear_rule(module, call, wanted):
    a = flat_batch(call.args[0])   # [B, T, d_in]
    g = flat_batch(call.grad_out)  # [B, T, d_out]
    out = {}
    if "weight" in wanted:
        if wanted["weight"]:
            out["weight"] = g.transpose(1, 2) @ a  # [B, d_out, d_in]
            if not isinstance(module, nn.Linear):  # Conv1D: [B, d_in, d_out]
                out["weight"] = out["weight"].transpose(1, 2)
        else:
            out["weight"] = sq_norm_of_product(a, g, call.cache, "gram")
    if "bias" in wanted:
        bias_grad = g.sum(1) if g.shape[1] > 1 else g[:, 0]  # [B, d_out]
        out["bias"] = bias_grad  # the driver squares small per-example gradients all at once
    return out
