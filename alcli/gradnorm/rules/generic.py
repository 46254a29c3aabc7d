"""Exact fallback for any module that owns parameters: re-run the module one example at a time
under torch.func and pull its output gradient back to the parameters,

    grad_i = d/dw <module(w, inputs_i), g_i>,   vmapped over i.

This covers parameters a module uses directly in its forward (a cls token, a learned scale),
including when it is a parent whose children run inside that forward. Modules whose ops have no
vmap rule (nn.LSTM's fused kernel) are pulled back one example at a time, through that module
only: slower, still exact, and still one batched pass through the rest of the model.
"""
from __future__ import annotations

import torch
from torch.func import functional_call, grad, vmap
from torch.utils._pytree import tree_flatten, tree_map, tree_unflatten

from ..batching import broadcast_dims, input_batch_dims, output_batch_dims, squeeze_at, unsqueeze_at
from ..errors import UnsupportedModel


def generic_rule(module, call, wanted):
    batch = call.batch
    own = {path: module.get_parameter(path).detach() for path in wanted}
    args, kwargs = tree_map(_detach, (call.args, call.kwargs))
    args_dims, kwargs_dims = input_batch_dims(module, args, kwargs, batch)
    out_dims = output_batch_dims(module, call.grad_out)

    def pullback(params, args_i, kwargs_i, grad_out_i):
        out = functional_call(module, params, unsqueeze_at(args_i, args_dims),
                              unsqueeze_at(kwargs_i, kwargs_dims), strict=False)
        out = squeeze_at(out, out_dims)
        outs, _ = tree_flatten(out)
        gs, _ = tree_flatten(grad_out_i)
        return sum((o * g).sum() for o, g in zip(outs, gs) if isinstance(o, torch.Tensor) and g is not None)

    try:
        with torch.no_grad():
            grads = vmap(grad(pullback), in_dims=(None, args_dims, kwargs_dims, out_dims))(
                own, args, kwargs, call.grad_out)
    except (RuntimeError, NotImplementedError, TypeError, ValueError):
        # some ops (e.g. nn.LSTM's fused kernel) have no vmap rule: pull back one example at a
        # time, through this module only
        grads = _looped_pullback(module, own, args, kwargs, args_dims, kwargs_dims, call.grad_out, out_dims)
    return {path: g if wanted[path] else g.flatten(1).pow(2).sum(1) for path, g in grads.items()}


def _detach(leaf):
    return leaf.detach() if isinstance(leaf, torch.Tensor) else leaf


def _looped_pullback(module, own, args, kwargs, args_dims, kwargs_dims, grad_out, out_dims):
    """Per-example gradients of <module(w, inputs_i), g_i>, one example at a time -> {path: [B, *]}."""
    per_path = {path: [] for path in own}
    for i in range(_batch_size(args, args_dims, grad_out, out_dims)):
        params = {path: p.clone().requires_grad_() for path, p in own.items()}
        with torch.enable_grad():
            out = functional_call(module, params, _take(args, args_dims, i), _take(kwargs, kwargs_dims, i),
                                  strict=False)
            outs, _ = tree_flatten(out)
            gs, _ = tree_flatten(_take(grad_out, out_dims, i))
            objective = sum((o * g).sum() for o, g in zip(outs, gs) if isinstance(o, torch.Tensor) and g is not None)
            grads = torch.autograd.grad(objective, list(params.values()), allow_unused=True)
        for path, g in zip(params, grads):
            per_path[path].append(torch.zeros_like(params[path]) if g is None else g)
    return {path: torch.stack(gs) for path, gs in per_path.items()}


def _take(tree, dims, i):
    """Example i of every batched leaf, keeping a size-1 batch dim."""
    leaves, spec = tree_flatten(tree)
    dim_leaves = broadcast_dims(dims, tree)
    return tree_unflatten([leaf.narrow(d, i, 1) if d is not None else leaf for leaf, d in zip(leaves, dim_leaves)],
                          spec)


def _batch_size(args, args_dims, grad_out, out_dims):
    for leaf, d in zip(tree_flatten(grad_out)[0], broadcast_dims(out_dims, grad_out)):
        if isinstance(leaf, torch.Tensor) and d is not None:
            return leaf.shape[d]
    raise UnsupportedModel("no batched output")
