"""nn.Conv1d/2d/3d (stride, padding incl. 'same' and non-zero modes, dilation, groups).

A convolution is a Linear applied at every output position t to the unfolded input patch:
W grad_i = sum_t g_it a_it^T per group, with a_it the (C_in/groups * prod(kernel)) patch.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import UnsupportedModel
from .registry import register


def unfold_patches(module, x):
    """x [B, C_in, *S] -> patches [B, groups, C_in/groups * K, T], rows ordered like weight.flatten(1)."""
    batch, spatial = x.shape[0], len(module.kernel_size)
    if (spatial == 2 and module.padding_mode == "zeros" and not isinstance(module.padding, str)
            and x.device.type == "cuda" and module.kernel_size != (1, 1)):
        # one im2col kernel: [B, C_in * K, T]. Elsewhere the strided copy below is 1.4-3x faster
        # (CPU, torch 2.14), and a 1x1 kernel's patches are a view of x
        patches = F.unfold(x, module.kernel_size, module.dilation, module.padding, module.stride)
        return patches.reshape(batch, module.groups, -1, patches.shape[-1])
    mode = "constant" if module.padding_mode == "zeros" else module.padding_mode
    if any(module._reversed_padding_repeated_twice):
        x = F.pad(x, module._reversed_padding_repeated_twice, mode=mode)
    for d in range(spatial):
        k, s, dil = module.kernel_size[d], module.stride[d], module.dilation[d]
        x = x.unfold(2 + d, dil * (k - 1) + 1, s)  # appends a window dim
        if dil > 1:
            x = x[..., ::dil]
    out_shape = x.shape[2:2 + spatial]
    # [B, C, O..., k...] -> [B, C, k..., O...] -> [B, groups, C/groups * K, T]
    perm = [0, 1, *range(2 + spatial, 2 + 2 * spatial), *range(2, 2 + spatial)]
    return x.permute(perm).reshape(batch, module.groups, -1, out_shape.numel())


@register(nn.Conv1d, nn.Conv2d, nn.Conv3d, layout="batch_first", blocks=True)
def conv_rule(module, call, wanted):
    x = call.args[0]
    if x.dim() != len(module.kernel_size) + 2:
        raise UnsupportedModel("unbatched convolution input")
    g = call.grad_out
    rows = g.shape[1] if g.dim() == x.dim() + 1 else 0  # k rows per example: x [B*k, ...], g [B, k, ...]
    if rows:  # an example's positions are all its rows' positions: T -> k*T below
        g = g.movedim(1, 2).flatten(3)                 # [B, C_out, k*T]
    batch, c_out = g.shape[:2]
    groups = module.groups
    # 3-D batched matmuls over (example, group): one bmm each, no broadcasting matmul's views
    g = g.reshape(batch * groups, c_out // groups, -1)  # [B*groups, C_out/groups, T]
    out = {}
    if "weight" in wanted:
        a = call.cache.get("patches")
        if a is None:
            a = unfold_patches(module, x)                  # [B(*k), groups, K, T]
            if rows:
                a = a.unflatten(0, (batch, rows)).permute(0, 2, 3, 1, 4).flatten(3)  # [B, groups, K, k*T]
            a = call.cache["patches"] = a.flatten(0, 1)   # [B*groups, K, T]
        k, steps = a.shape[1], a.shape[2]
        o = g.shape[1]
        if wanted["weight"]:
            out["weight"] = torch.bmm(g, a.mT).reshape(batch, *module.weight.shape)
        elif steps * steps <= k * o:
            # Gram form <A^T A, G^T G> per group: [T, T] is no larger than the [o, k] product
            gram_a = call.cache.get("gram")
            if gram_a is None:
                gram_a = call.cache["gram"] = torch.bmm(a.mT, a)  # [B*groups, T, T]
            out["weight"] = (gram_a * torch.bmm(g.mT, g)).reshape(batch, -1).sum(1)
        else:
            out["weight"] = torch.bmm(g, a.mT).square().reshape(batch, -1).sum(1)
    if "bias" in wanted:
        out["bias"] = g.sum(2).reshape(batch, c_out)  # [B, C_out]: the driver squares small gradients all at once
    return out
