"""Normalisation layers: y = x_hat * w + b, so w grad_i = sum over positions of g * x_hat, b grad_i = sum g.

x_hat is recomputed from the captured input: running statistics for BatchNorm in eval mode,
per-example statistics for LayerNorm / GroupNorm / RMSNorm. Per-example gradients are [B, C]
(or [B, *normalized_shape]), so they are always materialised.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import UnsupportedModel
from .registry import register


def _affine_grads(x_hat, g, keep_dims: int, wanted):
    """Sum g * x_hat and g over every dim except batch and the trailing/channel `keep_dims`."""
    out = {}
    for name, per_example in (("weight", lambda: g * x_hat), ("bias", lambda: g)):
        if name in wanted:
            grad = _sum_to(per_example(), keep_dims)
            out[name] = grad if wanted[name] else grad.reshape(grad.shape[0], -1).square().sum(1)
    return out


def _sum_to(t, keep):
    if keep == "channel":  # [B, C, *] -> [B, C]
        return t.flatten(2).sum(2) if t.dim() > 2 else t
    return t.reshape(t.shape[0], -1, *t.shape[t.dim() - keep:]).sum(1)  # keep the last `keep` dims


@register(nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.SyncBatchNorm, layout="batch_first")
def batchnorm_rule(module, call, wanted):
    if module.running_mean is None or module.running_var is None:
        raise UnsupportedModel("BatchNorm without running statistics normalises with batch "
                               "statistics, which couples the examples")
    x = call.args[0]
    shape = (1, -1) + (1,) * (x.dim() - 2)
    x_hat = (x - module.running_mean.view(shape)) * torch.rsqrt(module.running_var.view(shape) + module.eps)
    return _affine_grads(x_hat, call.grad_out, "channel", wanted)


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
