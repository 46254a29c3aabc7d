"""nn.Conv1d/2d/3d (stride, padding incl. 'same' and non-zero modes, dilation, groups).

A convolution is a Linear applied at every output position t to the unfolded input patch:
W grad_i = sum_t g_it a_it^T per group, with a_it the (C_in/groups * prod(kernel)) patch.
Where the patches would be a large copy of the input (depthwise convolutions, large maps) W grad_i
comes from the convolution's own weight backward instead, the batch folded into the groups.
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


def weight_backward(module, x, g, rows: int = 0):
    """x [N, C_in, *S], g [N, C_out, *O] -> per-example weight gradients [N, *weight.shape]: the
    convolution's own weight backward with the batch folded into the groups (example n's groups
    are n*groups ... (n+1)*groups - 1 of a [1, N*C_in, *S] input), so no patch is copied.
    With `rows` = k: x [N*k, C_in, *S], g [N, k, C_out, *O]; the k rows of an example go in as
    the backward's batch ([k, N*C_in, *S]), which sums them: no per-row gradient is formed."""
    spatial = len(module.kernel_size)
    padding = module.padding
    if isinstance(padding, str) or module.padding_mode != "zeros":  # 'same', circular, ...: padded here
        mode = "constant" if module.padding_mode == "zeros" else module.padding_mode
        if any(module._reversed_padding_repeated_twice):
            x = F.pad(x, module._reversed_padding_repeated_twice, mode=mode)
        padding = (0,) * spatial
    if rows:  # [N*k, C, ...] -> [k, N*C, ...]
        batch = g.shape[0]
        x = x.unflatten(0, (batch, rows)).movedim(1, 0).flatten(1, 2)
        g = g.movedim(1, 0).flatten(1, 2)
    else:
        batch = x.shape[0]
        x, g = x.reshape(1, -1, *x.shape[2:]), g.reshape(1, -1, *g.shape[2:])
    shape = module.weight.shape  # the weight's values are read for the input gradient only: a stride-0 zero
    weight = _zero(g.dtype, g.device).expand(batch * shape[0], *shape[1:])
    grad = torch.ops.aten.convolution_backward(
        g, x, weight, None, module.stride, padding, module.dilation, False, (0,) * spatial,
        batch * module.groups, (False, True, False))[1]                     # [N*C_out, C_in/groups, *K]
    return grad.view(batch, *shape)


_ZEROS: dict = {}  # (dtype, device) -> a 0-dim zero


def _zero(dtype, device) -> torch.Tensor:
    key = (dtype, device)
    if key not in _ZEROS:
        _ZEROS[key] = torch.zeros((), dtype=dtype, device=device)
    return _ZEROS[key]


def conv_dot(module, call, directions):
    """<W grad_i, V> = sum_t g_it^T V a_it = <g_i, conv(x_i; V)>: one convolution of the input
    with V as its weight, no per-example gradient [B, *weight.shape]; the bias's <sum_t g_it, V>."""
    x, g = call.args[0], call.grad_out
    rows = g.shape[1] if g.dim() == x.dim() + 1 else 0  # k rows per example: x [B*k, ...], g [B, k, ...]
    out = {}
    if "weight" in directions:
        y = module._conv_forward(x, directions["weight"].to(x.dtype), None)   # [B(*k), C_out, *O]
        if rows:
            y = y.unflatten(0, (g.shape[0], rows))
        out["weight"] = (y.to(g.dtype) * g).flatten(1).sum(1)
    if "bias" in directions:
        g_sum = (g.sum(1) if rows else g).flatten(2).sum(2)                   # [B, C_out]
        out["bias"] = g_sum @ directions["bias"].to(g.dtype)
    return out


@register(nn.Conv1d, nn.Conv2d, nn.Conv3d, layout="batch_first", blocks=True, dot=conv_dot)
def conv_rule(module, call, wanted):
    x = call.args[0]
    if x.dim() != len(module.kernel_size) + 2:
        raise UnsupportedModel("unbatched convolution input")
    g = call.grad_out
    rows = g.shape[1] if g.dim() == x.dim() + 1 else 0  # k rows per example: x [B*k, ...], g [B, k, ...]
    batch, c_out = g.shape[0], g.shape[2 if rows else 1]
    out = {}
    if "weight" in wanted and _by_weight_backward(module, g.numel() // (batch * c_out)):  # T: an example's positions
        w = weight_backward(module, x, g, rows)
        out["weight"] = w if wanted["weight"] else w.square().flatten(1).sum(1)
    elif "weight" in wanted:
        out["weight"] = _patch_weight(module, call.cache, x, g, rows, wanted["weight"])
    if "bias" in wanted:  # [B, C_out]: the driver squares small gradients all at once
        out["bias"] = (g.sum(1) if rows else g).flatten(2).sum(2)
    return out


def _by_weight_backward(module, steps: int) -> bool:
    """Whether the weight backward (`weight_backward`) serves this call: where the patches
    would be a copy of x (a kernel, stride or padding other than 1, 1, 0) holding more numbers
    than the per-example gradient, T > C_out/groups (SSDlite's depthwise convolutions; a
    ResNet's early 3x3 ones). Elsewhere the patches' Gram product or a batched matmul is cheaper."""
    ones = (1,) * len(module.kernel_size)
    view = (module.kernel_size == ones and module.stride == ones
            and not any(module._reversed_padding_repeated_twice))
    return not view and steps > module.out_channels // module.groups


def _patch_weight(module, cache, x, g, rows: int, per_example: bool):
    """Per-example weight gradients [B, *weight.shape] (`per_example`) or their squared norms
    [B] from the unfolded input patches: W grad_i = sum_t g_it a_it^T per group."""
    if rows:  # an example's positions are all its rows' positions: T -> k*T below
        g = g.movedim(1, 2).flatten(3)                 # [B, C_out, k*T]
    batch, c_out, groups = g.shape[0], g.shape[1], module.groups
    # 3-D batched matmuls over (example, group): one bmm each, no broadcasting matmul's views
    g = g.reshape(batch * groups, c_out // groups, -1)  # [B*groups, C_out/groups, T]
    a = cache.get("patches")
    if a is None:
        a = unfold_patches(module, x)                  # [B(*k), groups, K, T]
        if rows:
            a = a.unflatten(0, (batch, rows)).permute(0, 2, 3, 1, 4).flatten(3)  # [B, groups, K, k*T]
        a = cache["patches"] = a.flatten(0, 1)         # [B*groups, K, T]
    k, steps = a.shape[1], a.shape[2]
    if per_example:
        return torch.bmm(g, a.mT).reshape(batch, *module.weight.shape)
    if steps * steps <= k * g.shape[1]:
        # Gram form <A^T A, G^T G> per group: [T, T] is no larger than the [C_out/groups, K] product
        gram_a = cache.get("gram")
        if gram_a is None:
            gram_a = cache["gram"] = torch.bmm(a.mT, a)  # [B*groups, T, T]
        return (gram_a * torch.bmm(g.mT, g)).reshape(batch, -1).sum(1)
    return torch.bmm(g, a.mT).square().reshape(batch, -1).sum(1)
