"""Exact fallback for any module that owns parameters: re-run the module one example at a time
under torch.func and pull its output gradient back to the parameters,

    grad_i = d/dw <module(w, inputs_i), g_i>,   vmapped over i.

This covers parameters a module uses directly in its forward (a cls token, a learned scale),
including when it is a parent whose children run inside that forward. Modules whose ops have no
vmap rule (a fused RNN kernel, in an nn.LSTM subclass with a forward of its own: rules/rnn.py
serves nn.LSTM itself) are pulled back one example at a time, through that module only: slower,
still exact, and still one batched pass through the rest of the model.
"""
from __future__ import annotations

import torch
from torch.func import functional_call, grad, vmap
from torch.utils._pytree import tree_flatten, tree_map, tree_unflatten

from ...errors import first_line
from ..errors import UnsupportedModel
from ..pytree import dims_like, squeeze_leaves, unsqueeze_leaves


def generic_rule(module, call, wanted):
    if all(d is None for d in call.layout.out_dims):
        raise UnsupportedModel("its output is shared by all examples (a parametrization computing "
                               "a weight?), so its gradient is not per-example")
    own = {path: module.get_parameter(path).detach() for path in wanted}
    inputs = tree_map(_detach, (call.args, call.kwargs))
    in_dims = dims_like(inputs, call.layout.in_dims)
    out_dims = dims_like(call.grad_out, call.layout.out_dims)

    def pullback(params, inputs_i, grad_out_i):
        args, kwargs = unsqueeze_leaves(inputs_i, call.layout.in_dims)
        out = functional_call(module, params, args, kwargs, strict=False)
        outs = tree_flatten(squeeze_leaves(out, call.layout.out_dims))[0]
        gs = tree_flatten(grad_out_i)[0]
        return _total([(o * g).sum() for o, g in zip(outs, gs) if isinstance(o, torch.Tensor) and g is not None])

    try:
        with torch.no_grad():
            grads = vmap(grad(pullback), in_dims=(None, in_dims, out_dims))(own, inputs, call.grad_out)
    except torch.OutOfMemoryError:
        raise  # the caller splits the batch
    except (RuntimeError, NotImplementedError, TypeError, ValueError):
        # some ops (e.g. a fused RNN kernel) have no vmap rule: pull back one example at a
        # time, through this module only
        grads = _looped_pullback(module, own, inputs, call.layout, call.grad_out)
    return {path: g if wanted[path] else g.reshape(g.shape[0], -1).square().sum(1) for path, g in grads.items()}


def _looped_pullback(module, own, inputs, layout, grad_out):
    """Per-example gradients of <module(w, inputs_i), g_i>, one example at a time -> {path: [B, *]}."""
    per_path = {path: [] for path in own}
    batch = next(leaf.shape[d] for leaf, d in zip(tree_flatten(grad_out)[0], layout.out_dims)
                 if d is not None and isinstance(leaf, torch.Tensor))
    for i in range(batch):
        params = {path: p.clone().requires_grad_() for path, p in own.items()}
        with torch.enable_grad():
            args, kwargs = _take(inputs, layout.in_dims, i)
            try:
                out = functional_call(module, params, args, kwargs, strict=False)
            except torch.OutOfMemoryError:
                raise  # the caller splits the batch
            except (RuntimeError, NotImplementedError, TypeError, ValueError, IndexError) as err:
                reason = first_line(err)
                raise UnsupportedModel(f"it cannot run one example at a time ({reason})") from err
            outs = tree_flatten(out)[0]
            gs = tree_flatten(_take(grad_out, layout.out_dims, i))[0]
            objective = _total([(o * g).sum() for o, g in zip(outs, gs)
                                if isinstance(o, torch.Tensor) and g is not None])
            grads = torch.autograd.grad(objective, list(params.values()), allow_unused=True)
        for path, g in zip(params, grads):
            per_path[path].append(torch.zeros_like(params[path]) if g is None else g)
    return {path: torch.stack(gs) for path, gs in per_path.items()}


def _total(terms):
    """Sum of tensors, starting from the first (not from a Python 0, a CPU scalar beside device tensors)."""
    total = terms[0]
    for t in terms[1:]:
        total = total + t
    return total


def _take(tree, dims, i):
    """Example i of every batched leaf, keeping a size-1 batch dim."""
    leaves, spec = tree_flatten(tree)
    return tree_unflatten([leaf.narrow(d, i, 1) if d is not None and isinstance(leaf, torch.Tensor) else leaf
                           for leaf, d in zip(leaves, dims)], spec)


def _detach(leaf):
    return leaf.detach() if isinstance(leaf, torch.Tensor) else leaf
