"""Batched forwards for `replicate`'s per-example copies, without vmap, for the common layers.

Each takes the module, its copies ({param path: leaf [B, *shape]}, only for the selected
parameters; the others are used as they are) and the call's one input x with the batch in dim 0,
and runs all B examples at once so that autograd deposits example i's gradient in row i of each
leaf's gradient:

- Linear: one batched matmul, x [B, T, in] @ W_rep[B].T, plus bias_rep[:, None, :] (again the
  forward uses the one shared weight, the backward fills the copies' gradient with one bmm);
- Conv1d/2d/3d: what the groups trick (x [B, C, *S] -> [1, B*C, *S] against weight copies
  [B*out, in/groups, *k], groups = B*groups) computes, without materialising the copies: since all
  copies are equal the forward is the plain convolution, and the backward hands copy i example i's
  weight gradient from one batched matmul over unfolded patches (`_Copies`);
- LayerNorm, GroupNorm, BatchNorm in eval mode: the normalisation without affine, then the
  per-example affine copies by broadcasting.

`batched_forward` returns NOT_SERVED when the call is not one of these simple cases (the module
overrides forward, more than one input, the batch elsewhere than dim 0, a parameter path other
than weight/bias); the caller then vmaps the module as before.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .rules.conv import unfold_patches

NOT_SERVED = object()

_CONV = (nn.Conv1d, nn.Conv2d, nn.Conv3d)
_BATCHNORM = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)


class Sink:
    """Where a copy's per-example squared norms go when its gradient is not materialised: `sq`
    is the [B] float64 accumulator of the current backward."""
    sq: torch.Tensor | None = None


_CHUNK = 1 << 16  # elements of per-example gradient held at once when taking norms in the backward (cache-sized)


def square_norms(flat: torch.Tensor, chunk: int = 1024) -> torch.Tensor:
    """[B, n] -> [B] float64 squared row norms, without a float64 copy of the rows: dot products
    of chunks of `chunk` entries (one bmm, accumulated in the rows' dtype, short enough to stay
    accurate), summed in float64."""
    if flat.dtype == torch.float64:
        return flat.square().sum(1)
    if flat.dtype != torch.float32:  # half types: a bmm would round each chunk's sum to them
        flat = flat.float()
    batch, n = flat.shape
    whole = n // chunk * chunk
    sq = torch.zeros(batch, dtype=torch.float64, device=flat.device)
    if whole:
        main = flat[:, :whole].reshape(-1, 1, chunk)
        sq += torch.bmm(main, main.transpose(1, 2)).view(batch, -1).double().sum(1)
    if whole < n:
        sq += flat[:, whole:].double().square().sum(1)
    return sq


def batched_forward(module, copies: dict, args: tuple, kwargs: dict, layout, sinks: dict | None = None):
    """The module's output for the whole batch with per-example copies, or NOT_SERVED."""
    if kwargs or len(args) != 1 or not isinstance(args[0], torch.Tensor):
        return NOT_SERVED
    if list(layout.in_dims) != [0] or list(layout.out_dims) != [0]:
        return NOT_SERVED
    if not copies or not set(copies) <= {"weight", "bias"}:
        return NOT_SERVED
    x = args[0]
    if not x.is_floating_point() or any(c.dtype != x.dtype for c in copies.values()):
        return NOT_SERVED
    kind = type(module)
    sink = (sinks or {}).get("weight")
    if kind is nn.Linear or (isinstance(module, nn.Linear) and kind.forward is nn.Linear.forward):
        return _linear(module, copies, x, sink)
    for conv_type in _CONV:
        if kind is conv_type or (isinstance(module, conv_type) and kind.forward is conv_type.forward):
            return _conv(module, copies, x, sink)
    if kind is nn.LayerNorm:
        return _layer_norm(module, copies, x)
    if kind is nn.GroupNorm:
        return _group_norm(module, copies, x)
    if kind in _BATCHNORM:
        return _batch_norm(module, copies, x)
    return NOT_SERVED


def _linear(module, copies, x, sink):
    if x.dim() < 2:
        return NOT_SERVED
    batch = x.shape[0]
    w, b = copies.get("weight"), copies.get("bias")
    x3 = x.reshape(batch, -1, x.shape[-1])  # [B, T, in]
    if w is not None:
        out = _Copies.apply(x3, w, _LinearOps, sink)  # = bmm(x3, w.transpose(1, 2)), [B, T, out]
    else:
        out = F.linear(x3, module.weight)
    if module.bias is not None:
        out = out + (b[:, None, :] if b is not None else module.bias)
    return out.reshape(*x.shape[:-1], out.shape[-1])


def _conv(module, copies, x, sink):
    spatial = len(module.kernel_size)
    if x.dim() != spatial + 2:
        return NOT_SERVED  # unbatched input
    c_out = module.out_channels
    w, b = copies.get("weight"), copies.get("bias")
    if w is None:
        out = module._conv_forward(x, module.weight, None)
    else:
        out = _Copies.apply(x, w, _ConvOps(module), sink)
    if module.bias is not None:
        bias = b if b is not None else module.bias.unsqueeze(0)
        out = out + bias.reshape(bias.shape[0], c_out, *([1] * spatial))
    return out


class _Copies(torch.autograd.Function):
    """out = ops.forward(x, copy i) for example i, where every copy equals the parameter (the leaf
    is p.expand(B, *p.shape)): the forward is ONE batched call with the shared weight, which is the
    same computation as a grouped convolution / batched matmul over the copies without
    materialising B copies. The backward gives x its usual gradient and the leaf example i's
    gradient in row i (`ops.grad_copies`: one batched matmul)."""

    @staticmethod
    def forward(ctx, x, copies, ops, sink):
        ctx.ops, ctx.sink = ops, sink
        ctx.save_for_backward(x, copies)
        return ops.forward(x, copies[0])

    @staticmethod
    def backward(ctx, grad_out):
        x, copies = ctx.saved_tensors
        grad_x = ctx.ops.grad_input(x, copies[0], grad_out) if ctx.needs_input_grad[0] else None
        grad_copies = None
        if ctx.needs_input_grad[1]:
            if ctx.sink is None:
                grad_copies = ctx.ops.grad_copies(x, grad_out)
            else:  # the copy's only use: its norms now, a few examples at a time (no [B, *shape] gradient)
                batch, each = x.shape[0], copies[0].numel()
                step = max(1, _CHUNK // max(each, 1))
                parts = [square_norms(ctx.ops.grad_copies(x[i:i + step], grad_out[i:i + step]).reshape(-1, each))
                         for i in range(0, batch, step)]
                ctx.sink.sq += torch.cat(parts)
        return grad_x, grad_copies, None, None


class _LinearOps:
    """x [B, T, in], weight [out, in]."""

    @staticmethod
    def forward(x, weight):
        return F.linear(x, weight)

    @staticmethod
    def grad_input(x, weight, grad_out):
        return grad_out @ weight

    @staticmethod
    def grad_copies(x, grad_out):
        return torch.bmm(grad_out.transpose(1, 2), x)  # [B, out, in]


class _ConvOps:
    """x [B, C_in, *S] through a Conv1d/2d/3d module's own padding, stride, dilation and groups."""

    def __init__(self, module):
        self.module = module

    def forward(self, x, weight):
        return self.module._conv_forward(x, weight, None)

    def grad_input(self, x, weight, grad_out):
        m = self.module
        if m.padding_mode == "zeros" and not isinstance(m.padding, str):
            spatial = len(m.kernel_size)
            return torch.ops.aten.convolution_backward(
                grad_out, x, weight, None, m.stride, m.padding, m.dilation, False, [0] * spatial, m.groups,
                [True, False, False])[0]
        with torch.enable_grad():  # padding modes and 'same': differentiate the forward again
            leaf = x.detach().requires_grad_()
            return torch.autograd.grad(self.forward(leaf, weight.detach()), leaf, grad_out)[0]

    def grad_copies(self, x, grad_out):
        m = self.module
        batch = x.shape[0]
        patches = unfold_patches(m, x)  # [B, groups, C_in/groups * K, T], rows like weight.flatten(1)
        g = grad_out.reshape(batch, m.groups, m.out_channels // m.groups, -1)
        return (g @ patches.transpose(2, 3)).reshape(batch, *m.weight.shape)


def _affine(module, copies, x_hat, channel_dim_last: bool):
    """x_hat * weight + bias with per-example copies, channels in dim 1 (or the trailing dims)."""
    if channel_dim_last:  # LayerNorm: parameters cover the trailing normalized_shape dims
        middle = x_hat.dim() - 1 - len(module.normalized_shape)

        def shape(t):
            return t.reshape(t.shape[0], *([1] * middle), *t.shape[1:])
    else:
        rest = x_hat.dim() - 2

        def shape(t):
            return t.reshape(*t.shape, *([1] * rest))
    w, b = copies.get("weight"), copies.get("bias")
    if module.weight is not None:
        x_hat = x_hat * shape(w if w is not None else module.weight.unsqueeze(0))
    if module.bias is not None:
        x_hat = x_hat + shape(b if b is not None else module.bias.unsqueeze(0))
    return x_hat


def _layer_norm(module, copies, x):
    if x.dim() < len(module.normalized_shape) + 1:
        return NOT_SERVED
    x_hat = F.layer_norm(x, module.normalized_shape, None, None, module.eps)
    return _affine(module, copies, x_hat, True)


def _group_norm(module, copies, x):
    if x.dim() < 2:
        return NOT_SERVED
    x_hat = F.group_norm(x, module.num_groups, None, None, module.eps)
    return _affine(module, copies, x_hat, False)


def _batch_norm(module, copies, x):
    # eval mode with running statistics only: each example is normalised on its own; in training
    # mode the batch statistics mix the examples, which the vmap path handles (or declines)
    if module.training or module.running_mean is None or x.dim() < 2:
        return NOT_SERVED
    try:
        module._check_input_dim(x)
    except ValueError:
        return NOT_SERVED  # the module's own forward raises it
    x_hat = F.batch_norm(x, module.running_mean, module.running_var, None, None, False, 0.0, module.eps)
    return _affine(module, copies, x_hat, False)
