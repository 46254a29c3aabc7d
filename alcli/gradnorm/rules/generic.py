"""Exact fallback for any module that owns parameters: re-run the module one example at a time
under torch.func and pull its output gradient back to the parameters,

    grad_i = d/dw <module(w, inputs_i), g_i>,   vmapped over i.

This covers parameters a module uses directly in its forward (a cls token, a learned scale),
including when it is a parent whose children run inside that forward.
"""
from __future__ import annotations

import torch
from torch.func import functional_call, grad, vmap
from torch.utils._pytree import tree_flatten, tree_map

from ..batching import input_batch_dims, output_batch_dims, squeeze_at, unsqueeze_at
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
    except (RuntimeError, NotImplementedError, TypeError, ValueError) as err:
        reason = (str(err).strip().splitlines() or [type(err).__name__])[0][:200]
        raise UnsupportedModel(f"the generic rule cannot vmap it ({reason})") from err
    return {path: g if wanted[path] else g.flatten(1).pow(2).sum(1) for path, g in grads.items()}


def _detach(leaf):
    return leaf.detach() if isinstance(leaf, torch.Tensor) else leaf
