"""torchvision's swin ShiftedWindowAttention (v1) and ShiftedWindowAttentionV2: qkv and proj, whose
weights their forwards pass to `shifted_window_attention` without calling them, v1's relative
position bias table, and v2's logit scale and continuous position bias MLP (cpb_mlp).

During the ghost forward the module runs this file's capturing forward, the same math as
torchvision's (eval mode) with taps. The input [B, H, W, C] is padded to whole windows, rolled by
the shift, and cut into nW windows of N = wh*ww tokens: X [B*nW, N, C], batch the outer factor, so
example i's tokens are X.reshape(B, T, C)[i] with T = nW*N (padded tokens included: their input
is zero, but their qkv output is the bias, and they are keys and values). h heads of C/h.

v1 (`swin_forward`, taps: qkv, P, out)
- qkv = X W_qkv^T + b_qkv, tapped [B*nW, N, 3C]: a Linear over T tokens per example,
  W grad_i = sum_t dqkv_it x_it^T, b grad_i = sum_t dqkv_it.
- logits [B*nW, h, N, N] = (q / sqrt(C/h)) k^T + P (+ the shift mask), with P [h, N, N] the
  relative position bias, P[h, n, m] = table[index[n*N + m], h]. P is added as a tap of shape
  [B, 1, h, N, N] to the logits viewed [B, nW, h, N, N], so its gradient is example i's
  sum over windows of dL/dlogits, and table grad_i[r, h] = sum over n*N+m with index = r of it
  (an index_add into [B, R, h], R = (2wh-1)(2ww-1): small, left for the driver to square).
- out = O W_proj^T + b_proj, tapped [B*nW, N, C], with O the attention output: a Linear again.

v2 (`swin_v2_forward`, taps: qkv, s, P, out)
- qkv = X W_qkv^T + b'_qkv with b' = b_qkv, its k part (the middle third) zeroed (torchvision
  zeroes it in a clone on every call): qkv.bias grad_i = sum_t dqkv_it with the k part zeroed.
- logits = cos * s + P (+ the shift mask): cos [B*nW, h, N, N] = normalize(q) normalize(k)^T,
  s [h, 1, 1] = exp(clamp(logit_scale, max=log 100)), P [1, h, N, N] = 16 sigmoid(M gathered by
  relative_position_index), M [R, h] = cpb_mlp(relative_coords_table).
  s and P are the same for every example, so each is expanded per example and tapped: s as
  [B, 1, h, 1, 1] multiplying the logits viewed [B, nW, h, N, N], P as [B, 1, h, N, N] added to
  them. The taps' gradients are example i's ds_i (summed over windows and token pairs) and dP_i
  (summed over windows). (s, P) is a function of logit_scale and cpb_mlp's parameters alone
  (`v2_shared`), so their per-example gradients are its vector-Jacobian product with (ds_i, dP_i):
  one torch.func.vjp, vmapped over the B cotangents ([B, *shape], small: left to the driver).
- out: as v1.
This mirrors torchvision 0.29's `shifted_window_attention` (tests/test_gradnorm_swin.py checks
that the outputs are bit-identical to the modules'). Dropout is a no-op in eval mode; a module in
training mode with dropout is refused. Subclasses with another forward or another
`get_relative_position_bias` get the generic rule.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch.func import functional_call, vjp, vmap

from ..errors import UnsupportedModel
from .registry import linear_grads, register, require_batch_dim

NAME = "torchvision.models.swin_transformer.ShiftedWindowAttention"
V2_NAME = "torchvision.models.swin_transformer.ShiftedWindowAttentionV2"


def _accepts(name):
    def accepts(module) -> bool:
        base = next(t for t in type(module).__mro__ if f"{t.__module__}.{t.__qualname__}" == name)
        return (type(module).get_relative_position_bias is base.get_relative_position_bias
                and len(module.window_size) == 2 and len(module.shift_size) == 2)
    return accepts


class _Grid(NamedTuple):
    """Where one call's windows lie: input and padded sizes, effective shift, window count."""
    batch: int
    height: int
    width: int
    pad_h: int
    pad_w: int
    shift: tuple
    n_win: int


def swin_forward(module, args, kwargs, tap):
    """ShiftedWindowAttention.forward with taps -> (its output, (X, O) as [B, T, C] for the rule).
    The taps, in order: the qkv output, the relative position bias per example, the proj output."""
    x, grid = _to_windows(module, args, kwargs)                          # X [B*nW, N, C]
    qkv = tap(F.linear(x, module.qkv.weight, module.qkv.bias))
    q, k, v = _heads(qkv, module.num_heads)
    attn = (q * (x.shape[-1] // module.num_heads) ** -0.5).matmul(k.transpose(-2, -1))  # [B*nW, h, N, N]
    bias = _gather(module.relative_position_bias_table, module.relative_position_index)  # P [1, h, N, N]
    bias = tap(bias.expand(grid.batch, *bias.shape))                    # per example [B, 1, h, N, N]
    return _attend(module, _per_example(attn, grid) + bias, v, x, grid, tap)


def swin_v2_forward(module, args, kwargs, tap):
    """ShiftedWindowAttentionV2.forward with taps -> (its output, (X, O) as [B, T, C]). The taps,
    in order: the qkv output, the logit scale per example, the position bias per example, the
    proj output."""
    x, grid = _to_windows(module, args, kwargs)
    scale, bias = v2_shared(module, _shared_inputs(module))              # [h, 1, 1], [1, h, N, N]
    qkv = tap(F.linear(x, module.qkv.weight, _zero_k(module.qkv.bias)))
    q, k, v = _heads(qkv, module.num_heads)
    attn = F.normalize(q, dim=-1) @ F.normalize(k, dim=-1).transpose(-2, -1)  # cos [B*nW, h, N, N]
    attn = _per_example(attn, grid) * tap(scale.expand(grid.batch, 1, *scale.shape))  # [B, 1, h, 1, 1]
    attn = attn + tap(bias.expand(grid.batch, *bias.shape))                            # [B, 1, h, N, N]
    return _attend(module, attn, v, x, grid, tap)


@register(NAME, layout="own", claims_children=("qkv", "proj"), capture=swin_forward, accepts=_accepts(NAME))
def swin_rule(module, call, wanted):
    require_batch_dim(call, 0)
    x, o = call.args                     # [B, T, C]
    g_qkv, g_bias, g_out = call.grad_out  # [B*nW, N, 3C], [B, 1, h, N, N], [B*nW, N, C]
    result = _linear_grads(call, wanted, x, g_qkv, o, g_out)
    if "relative_position_bias_table" in wanted:
        table = module.relative_position_bias_table                       # [R, h]
        per_pair = g_bias.reshape(x.shape[0], table.shape[1], -1).transpose(1, 2)  # [B, N*N, h]
        grad = torch.zeros(x.shape[0], *table.shape, dtype=per_pair.dtype, device=per_pair.device)
        result["relative_position_bias_table"] = grad.index_add(1, module.relative_position_index, per_pair)
    return result


@register(V2_NAME, layout="own", claims_children=("qkv", "proj", "cpb_mlp"), capture=swin_v2_forward,
          accepts=_accepts(V2_NAME))
def swin_v2_rule(module, call, wanted):
    require_batch_dim(call, 0)
    x, o = call.args                                 # [B, T, C]
    g_qkv, g_scale, g_bias, g_out = call.grad_out    # [B*nW, N, 3C], [B, 1, h, 1, 1], [B, 1, h, N, N], [B*nW, N, C]
    result = _linear_grads(call, wanted, x, g_qkv, o, g_out)
    if "qkv.bias" in result:
        result["qkv.bias"] = _zero_k(result["qkv.bias"])  # the k part never reaches the logits
    shared = [path for path in wanted if path == "logit_scale" or path.startswith("cpb_mlp.")]
    if shared:
        inputs = {path: t.detach().to(g_bias.dtype) for path, t in _shared_inputs(module).items()}
        _, pullback = vjp(lambda own: v2_shared(module, {**inputs, **own}), {p: inputs[p] for p in shared})
        # example i's cotangents: ds_i [h, 1, 1] and dP_i [1, h, N, N]
        result.update(vmap(pullback)((g_scale.flatten(1, 2), g_bias))[0])
    return result


def v2_shared(module, tensors):
    """(s [h, 1, 1], P [1, h, N, N]): v2's logit scale and position bias, shared by all examples,
    from `tensors` (logit_scale, relative_coords_table and cpb_mlp's parameters and buffers by
    path, as `_shared_inputs` names them): torchvision's `get_relative_position_bias` and clamp."""
    scale = torch.clamp(tensors["logit_scale"], max=math.log(100.0)).exp()
    mlp = {path[len("cpb_mlp."):]: t for path, t in tensors.items() if path.startswith("cpb_mlp.")}
    table = functional_call(module.cpb_mlp, mlp, (tensors["relative_coords_table"],))
    bias = _gather(table.view(-1, module.num_heads), module.relative_position_index)
    return scale, 16 * torch.sigmoid(bias)


def _shared_inputs(module) -> dict:
    """What v2's scale and bias are computed from, by path: logit_scale, relative_coords_table,
    and cpb_mlp's parameters and buffers ("cpb_mlp.0.weight")."""
    tensors = {"logit_scale": module.logit_scale, "relative_coords_table": module.relative_coords_table}
    tensors.update((f"cpb_mlp.{path}", t) for path, t in module.cpb_mlp.named_parameters())
    tensors.update((f"cpb_mlp.{path}", t) for path, t in module.cpb_mlp.named_buffers())
    return tensors


def _linear_grads(call, wanted, x, g_qkv, o, g_out) -> dict:
    """qkv's and proj's per-example gradients (or squared norms): Linears over each example's T
    window tokens."""
    batch, steps = x.shape[:2]
    result = {}
    for child, a, g in (("qkv", x, g_qkv), ("proj", o, g_out)):
        result.update(linear_grads(a, g.reshape(batch, steps, -1), wanted, call.cache, f"{child}."))
    return result


def _zero_k(qkv_bias):
    """[..., 3C] with the k part (the middle third) zeroed, in a clone, as torchvision's v2 does
    to qkv.bias (None stays None)."""
    if qkv_bias is None:
        return None
    qkv_bias = qkv_bias.clone()
    length = qkv_bias.shape[-1] // 3
    qkv_bias[..., length:2 * length].zero_()
    return qkv_bias


def _to_windows(module, args, kwargs):
    """The input [B, H, W, C] padded, rolled and cut into windows -> (X [B*nW, N, C], grid)."""
    x = args[0] if args else kwargs["x"]
    if module.training and (module.attention_dropout > 0 or module.dropout > 0):
        raise UnsupportedModel("dropout in training mode")
    batch, height, width, dim = x.shape
    wh, ww = module.window_size
    x = F.pad(x, (0, 0, 0, (ww - width % ww) % ww, 0, (wh - height % wh) % wh))
    pad_h, pad_w = x.shape[1], x.shape[2]
    shift = (0 if wh >= pad_h else module.shift_size[0], 0 if ww >= pad_w else module.shift_size[1])
    if sum(shift) > 0:
        x = torch.roll(x, shifts=(-shift[0], -shift[1]), dims=(1, 2))
    grid = _Grid(batch, height, width, pad_h, pad_w, shift, (pad_h // wh) * (pad_w // ww))
    x = x.view(batch, pad_h // wh, wh, pad_w // ww, ww, dim).permute(0, 1, 3, 2, 4, 5)
    return x.reshape(batch * grid.n_win, wh * ww, dim), grid


def _heads(qkv, heads):
    """qkv [B*nW, N, 3C] -> q, k, v [B*nW, h, N, C/h]."""
    rows, n, dim3 = qkv.shape
    return qkv.reshape(rows, n, 3, heads, dim3 // (3 * heads)).permute(2, 0, 3, 1, 4)


def _per_example(attn, grid):
    """[B*nW, h, N, N] -> [B, nW, h, N, N]."""
    return attn.view(grid.batch, grid.n_win, *attn.shape[1:])


def _attend(module, attn, v, x, grid, tap):
    """The logits [B, nW, h, N, N] (bias added) -> shift mask, softmax, attention output O, proj
    (tapped), windows back to [B, H, W, C]. Returns (output, (X, O) as [B, T, C])."""
    batch, n_win, heads, n = attn.shape[:4]
    dim = x.shape[-1]
    if sum(grid.shift) > 0:
        attn = attn + _shift_mask(x, grid.pad_h, grid.pad_w, module.window_size, grid.shift).unsqueeze(1).unsqueeze(0)
    attn = F.softmax(attn.view(batch * n_win, heads, n, n), dim=-1)
    o = attn.matmul(v).transpose(1, 2).reshape(batch * n_win, n, dim)    # O [B*nW, N, C]
    out = tap(F.linear(o, module.proj.weight, module.proj.bias))
    (wh, ww), pad_h, pad_w = module.window_size, grid.pad_h, grid.pad_w
    out = out.view(batch, pad_h // wh, pad_w // ww, wh, ww, dim).permute(0, 1, 3, 2, 4, 5)
    out = out.reshape(batch, pad_h, pad_w, dim)
    if sum(grid.shift) > 0:
        out = torch.roll(out, shifts=grid.shift, dims=(1, 2))
    out = out[:, :grid.height, :grid.width, :].contiguous()
    return out, (x.reshape(batch, n_win * n, dim), o.reshape(batch, n_win * n, dim))


def _gather(table, index):
    """torchvision's `_get_relative_position_bias`: a table [R, h] gathered to [1, h, N, N] (with
    index_select, the same values as its table[index], an op that never syncs with the host)."""
    n = math.isqrt(index.numel())
    bias = table.index_select(0, index).view(n, n, -1)
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
