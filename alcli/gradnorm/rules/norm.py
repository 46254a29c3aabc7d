"""Normalisation layers: y = x_hat * w + b, so w grad_i = sum over positions of g * x_hat, b grad_i = sum g.

x_hat is recomputed from the captured input: running statistics for BatchNorm in eval mode,
per-example statistics for LayerNorm / GroupNorm / RMSNorm. Per-example gradients are [B, C]
(or [B, *normalized_shape]), so they are always materialised.
"""
from __future__ import annotations

import weakref

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import UnsupportedModel
from .registry import register, under_target_vmap


def _affine_grads(x_hat, g, keep_dims, wanted):
    """Sum g * x_hat and g over every dim except batch and the trailing/channel `keep_dims`.
    Per-example gradients go back as they are (small: [B, C]); the driver squares them all at once."""
    out = {}
    if "weight" in wanted:
        out["weight"] = _sum_to(g * x_hat, keep_dims)
    if "bias" in wanted:
        out["bias"] = _sum_to(g, keep_dims)
    return out


def _sum_to(t, keep):
    if keep == "channel":  # [B, C, *] -> [B, C]
        return t.flatten(2).sum(2) if t.dim() > 2 else t
    return t.reshape(t.shape[0], -1, *t.shape[t.dim() - keep:]).sum(1)  # keep the last `keep` dims


# module -> (running_var, its version, eps, 1/sqrt(running_var + eps)): computed once per model state
_INVSTD: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _invstd(module) -> torch.Tensor:
    var = module.running_var
    if torch.compiler.is_compiling():  # one fused kernel in the compiled graph; no cache to guard on
        return torch.rsqrt(var.detach() + module.eps)
    known = _INVSTD.get(module)
    if known is None or known[0] is not var or known[1] != var._version or known[2] != module.eps \
            or known[3].dtype != var.dtype:
        known = _INVSTD[module] = (var, var._version, module.eps, torch.rsqrt(var.detach() + module.eps))
    return known[3]


def _channel(stat, x):
    """A per-channel statistic [C] shaped to broadcast over x [B, C, *]."""
    return stat.to(x.dtype).view(-1, *([1] * (x.dim() - 2)))


@register(nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.SyncBatchNorm, layout="batch_first", rows=True)
def batchnorm_rule(module, call, wanted):
    if module.running_mean is None or module.running_var is None:
        raise UnsupportedModel("BatchNorm without running statistics normalises with batch "
                               "statistics, which couples the examples")
    x, g = call.args[0], call.grad_out
    if under_target_vmap() and not torch.compiler.is_compiling():
        # vmap has no batching rule for the fused backward and splits it into ~10 ops per layer:
        # x_hat = (x - mean) * invstd (x is the same for every target set: computed once, unbatched)
        g_sum = _sum_to(g, "channel")                                  # [B, C] = bias grad
        out = {"bias": g_sum} if "bias" in wanted else {}
        if "weight" in wanted:
            x_hat = (x - _channel(module.running_mean, x)) * _channel(_invstd(module), x)
            out["weight"] = _sum_to(g * x_hat.to(g.dtype), "channel")
        return out
    # BatchNorm's own eval-mode weight and bias backward (sum g * x_hat, sum g per channel, one
    # pass), with the batch folded into the channels: [1, B*C, *], example b's channel c as b*C + c
    batch, channels = x.shape[:2]
    mean = module.running_mean.to(g.dtype).repeat(batch)                 # [B*C]
    invstd = _invstd(module).to(g.dtype).repeat(batch)
    ones = torch.ones_like(mean)  # the weight: read for the input gradient only, not asked for here
    _, weight, bias = torch.ops.aten.native_batch_norm_backward(
        g.reshape(1, batch * channels, *g.shape[2:]), x.reshape(1, batch * channels, *x.shape[2:]),
        ones, mean, module.running_var.to(g.dtype).repeat(batch), mean, invstd, False, module.eps,
        (False, "weight" in wanted, "bias" in wanted))
    out = {}
    if "weight" in wanted:
        out["weight"] = weight.view(batch, channels)                   # [B, C]
    if "bias" in wanted:
        out["bias"] = bias.view(batch, channels)
    return out


@register(nn.LayerNorm, layout="anywhere")
def layernorm_rule(module, call, wanted):
    x = call.args[0]
    x_hat = F.layer_norm(x, module.normalized_shape, None, None, module.eps)
    return _affine_grads(x_hat, call.grad_out, len(module.normalized_shape), wanted)


@register(nn.GroupNorm, layout="batch_first")
def groupnorm_rule(module, call, wanted):
    x = call.args[0]
    x_hat = F.group_norm(x, module.num_groups, None, None, module.eps)
    return _affine_grads(x_hat, call.grad_out, "channel", wanted)


if hasattr(nn, "RMSNorm"):
    @register(nn.RMSNorm, layout="anywhere")
    def rmsnorm_rule(module, call, wanted):
        x = call.args[0]
        x_hat = F.rms_norm(x, module.normalized_shape, None, module.eps)
        return _affine_grads(x_hat, call.grad_out, len(module.normalized_shape), wanted)


# Hugging Face's RMSNorm of Llama, Qwen2 and Mistral (one forward, copied per model):
# y = w * (x_hat in x's dtype), x_hat = x / sqrt(mean(x^2) + eps) computed in float32
@register("transformers.models.llama.modeling_llama.LlamaRMSNorm",
          "transformers.models.qwen2.modeling_qwen2.Qwen2RMSNorm",
          "transformers.models.mistral.modeling_mistral.MistralRMSNorm", layout="anywhere",
          accepts=lambda m: isinstance(getattr(m, "variance_epsilon", None), float) and m.weight.dim() == 1)
def hf_rmsnorm_rule(module, call, wanted):
    x = call.args[0]
    x32 = x.to(torch.float32)
    x_hat = (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + module.variance_epsilon)).to(x.dtype)
    return _affine_grads(x_hat.to(call.grad_out.dtype), call.grad_out, 1, wanted)
