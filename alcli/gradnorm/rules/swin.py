"""torchvision's swin ShiftedWindowAttention (v1): qkv and proj, whose weights its forward passes
to `shifted_window_attention` without calling them, and its relative position bias table.

During the ghost forward the module runs this file's `swin_forward`, the same math as torchvision's
(eval mode) with three taps. The input [B, H, W, C] is padded to whole windows, rolled by the
shift, and cut into nW windows of N = wh*ww tokens: X [B*nW, N, C], batch the outer factor, so
example i's tokens are X.reshape(B, T, C)[i] with T = nW*N (padded tokens included: their input
is zero, but their qkv output is the bias, and they are keys and values).
- qkv = X W_qkv^T + b_qkv, tapped [B*nW, N, 3C]: a Linear over T tokens per example,
  W grad_i = sum_t dqkv_it x_it^T, b grad_i = sum_t dqkv_it.
- logits [B*nW, h, N, N] = (q / sqrt(C/h)) k^T + P (+ the shift mask), with P [h, N, N] the
  relative position bias, P[h, n, m] = table[index[n*N + m], h]. P is added as a tap of shape
  [B, 1, h, N, N] to the logits viewed [B, nW, h, N, N], so its gradient is example i's
  sum over windows of dL/dlogits, and table grad_i[r, h] = sum over n*N+m with index = r of it
  (an index_add into [B, R, h], R = (2wh-1)(2ww-1): small, left for the driver to square).
- out = O W_proj^T + b_proj, tapped [B*nW, N, C], with O the attention output: a Linear again.
This mirrors torchvision 0.29's `shifted_window_attention` for v1 (tests/test_gradnorm_swin.py
checks that the output is bit-identical to the module's). Dropout is a no-op in eval mode; a
module in training mode with dropout is refused. Subclasses with another forward
(ShiftedWindowAttentionV2) or another `get_relative_position_bias` get the generic rule.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..errors import UnsupportedModel
from .registry import register, sq_norm_of_product

NAME = "torchvision.models.swin_transformer.ShiftedWindowAttention"


def _accepts(module) -> bool:
    base = next(t for t in type(module).__mro__ if f"{t.__module__}.{t.__qualname__}" == NAME)
    return (type(module).get_relative_position_bias is base.get_relative_position_bias
            and len(module.window_size) == 2 and len(module.shift_size) == 2)


def swin_forward(module, args, kwargs, tap):
    """ShiftedWindowAttention.forward with taps -> (its output, (X, O) as [B, T, C] for the rule).
    The taps, in order: the qkv output, the relative position bias per example, the proj output."""
    x = args[0] if args else kwargs["x"]
    if module.training and (module.attention_dropout > 0 or module.dropout > 0):
        raise UnsupportedModel("dropout in training mode")
    batch, height, width, dim = x.shape
    (wh, ww), heads = module.window_size, module.num_heads
    x = F.pad(x, (0, 0, 0, (ww - width % ww) % ww, 0, (wh - height % wh) % wh))
    pad_h, pad_w = x.shape[1], x.shape[2]
    shift = [0 if wh >= pad_h else module.shift_size[0], 0 if ww >= pad_w else module.shift_size[1]]
    if sum(shift) > 0:
        x = torch.roll(x, shifts=(-shift[0], -shift[1]), dims=(1, 2))
    n_win, n = (pad_h // wh) * (pad_w // ww), wh * ww
    x = x.view(batch, pad_h // wh, wh, pad_w // ww, ww, dim).permute(0, 1, 3, 2, 4, 5)
    x = x.reshape(batch * n_win, n, dim)                                  # X [B*nW, N, C]
    qkv = tap(F.linear(x, module.qkv.weight, module.qkv.bias))
    q, k, v = qkv.reshape(batch * n_win, n, 3, heads, dim // heads).permute(2, 0, 3, 1, 4)
    attn = (q * (dim // heads) ** -0.5).matmul(k.transpose(-2, -1))       # [B*nW, h, N, N]
    bias = tap(_bias(module).expand(batch, 1, heads, n, n))               # P per example
    attn = attn.view(batch, n_win, heads, n, n) + bias
    if sum(shift) > 0:
        attn = attn + _shift_mask(x, pad_h, pad_w, module.window_size, shift).unsqueeze(1).unsqueeze(0)
    attn = F.softmax(attn.view(batch * n_win, heads, n, n), dim=-1)
    o = attn.matmul(v).transpose(1, 2).reshape(batch * n_win, n, dim)     # O [B*nW, N, C]
    out = tap(F.linear(o, module.proj.weight, module.proj.bias))
    out = out.view(batch, pad_h // wh, pad_w // ww, wh, ww, dim).permute(0, 1, 3, 2, 4, 5)
    out = out.reshape(batch, pad_h, pad_w, dim)
    if sum(shift) > 0:
        out = torch.roll(out, shifts=(shift[0], shift[1]), dims=(1, 2))
    out = out[:, :height, :width, :].contiguous()
    return out, (x.reshape(batch, n_win * n, dim), o.reshape(batch, n_win * n, dim))


@register(NAME, layout="own", claims_children=("qkv", "proj"), capture=swin_forward, accepts=_accepts)
def swin_rule(module, call, wanted):
    x, o = call.args                     # [B, T, C]
    g_qkv, g_bias, g_out = call.grad_out  # [B*nW, N, 3C], [B, 1, h, N, N], [B*nW, N, C]
    batch, steps = x.shape[:2]
    g_qkv, g_out = g_qkv.reshape(batch, steps, -1), g_out.reshape(batch, steps, -1)  # [B, T, *]
    result = {}
    for child, a, g in (("qkv", x, g_qkv), ("proj", o, g_out)):
        if f"{child}.weight" in wanted:
            result[f"{child}.weight"] = (g.transpose(1, 2) @ a if wanted[f"{child}.weight"]
                                         else sq_norm_of_product(a, g, call.cache, child))
        if f"{child}.bias" in wanted:
            result[f"{child}.bias"] = g.sum(1)  # [B, out]: the driver squares small gradients at once
    if "relative_position_bias_table" in wanted:
        table = module.relative_position_bias_table                       # [R, h]
        per_pair = g_bias.reshape(batch, table.shape[1], -1).transpose(1, 2)  # [B, N*N, h]
        grad = torch.zeros(batch, *table.shape, dtype=per_pair.dtype, device=per_pair.device)
        result["relative_position_bias_table"] = grad.index_add(1, module.relative_position_index, per_pair)
    return result


def _bias(module):
    """torchvision's `_get_relative_position_bias`: the table gathered to [1, h, N, N] (with
    index_select, the same values as its table[index], an op that never syncs with the host)."""
    n = module.window_size[0] * module.window_size[1]
    bias = module.relative_position_bias_table.index_select(0, module.relative_position_index).view(n, n, -1)
    return bias.permute(2, 0, 1).contiguous().unsqueeze(0)


def _shift_mask(x, pad_h, pad_w, window, shift):
    """torchvision's mask for shifted windows [nW, N, N]: -100 between tokens from different
    regions of the rolled map, 0 within one."""
    mask = x.new_zeros((pad_h, pad_w))
    h_slices = ((0, -window[0]), (-window[0], -shift[0]), (-shift[0], None))
    w_slices = ((0, -window[1]), (-window[1], -shift[1]), (-shift[1], None))
    count = 0
    for h in h_slices:
        for w in w_slices:
            mask[h[0]:h[1], w[0]:w[1]] = count
            count += 1
    mask = mask.view(pad_h // window[0], window[0], pad_w // window[1], window[1])
    mask = mask.permute(0, 2, 1, 3).reshape(-1, window[0] * window[1])
    mask = mask.unsqueeze(1) - mask.unsqueeze(2)
    return mask.masked_fill(mask != 0, (-100.0)).masked_fill(mask == 0, 0.0)
