"""nn.Linear on inputs [B, d_in] or [B, *, d_in]: W grad_i = sum_t g_it a_it^T, b grad_i = sum_t g_it.

Hugging Face's Conv1D (GPT-2's projections) is a Linear with the weight stored transposed,
[d_in, d_out] (y = x W + b): the same rule, its per-example weight gradient transposed."""
from __future__ import annotations

from torch import nn

from ..outer import transposed
from .registry import flat_batch, linear_grads, register


@register(nn.Linear, "transformers.pytorch_utils.Conv1D", layout="anywhere")
def linear_rule(module, call, wanted):
    out = linear_grads(flat_batch(call.args[0]), flat_batch(call.grad_out), wanted, call.cache)  # [B, T, d]
    if wanted.get("weight") and not isinstance(module, nn.Linear):  # Conv1D: [B, d_in, d_out]
        out["weight"] = transposed(out["weight"])
    return out
