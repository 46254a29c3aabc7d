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
from ..layout import MERGED
from ..pytree import dims_like, squeeze_leaves, unmerge_blocks, unsqueeze_leaves


def generic_rule(module, call, wanted):
    if all(d is None for d in call.layout.out_dims):
        raise UnsupportedModel("its output is shared by all examples (a parametrization computing "
                               "a weight?), so its gradient is not per-example")
    own = {path: module.get_parameter(path).detach() for path in wanted}
    layout = call.layout
    inputs, in_vmap, in_batch = unmerge_blocks(tree_map(_detach, (call.args, call.kwargs)),
                                               layout.in_dims, layout.in_blocks)
    grad_out, out_vmap, out_batch = unmerge_blocks(call.grad_out, layout.out_dims, layout.out_blocks)
    if any(d is None and isinstance(g, torch.Tensor) for g, d in zip(tree_flatten(grad_out)[0], out_vmap)):
        raise UnsupportedModel("one of its outputs is shared by all examples, so that output's "
                               "gradient is the whole batch's, not each example's")
    if all(d is None for d in in_vmap):  # every input shared: the batch arises inside
        grads = _shared_input_pullback(module, own, inputs, grad_out, out_vmap, layout)
        return _as_wanted(grads, wanted)
    in_dims = dims_like(inputs, in_vmap)
    out_dims = dims_like(grad_out, out_vmap)

    def pullback(params, inputs_i, grad_out_i):
        args, kwargs = unsqueeze_leaves(inputs_i, in_batch)
        out = functional_call(module, params, args, kwargs, strict=False)
        outs = tree_flatten(squeeze_leaves(out, out_batch))[0]
        gs = tree_flatten(grad_out_i)[0]
        return _total([(o * g).sum() for o, g in zip(outs, gs) if isinstance(o, torch.Tensor) and g is not None])

    try:
        with torch.no_grad():
            grads = vmap(grad(pullback), in_dims=(None, in_dims, out_dims))(own, inputs, grad_out)
    except torch.OutOfMemoryError:
        raise  # the caller splits the batch
    except (RuntimeError, NotImplementedError, TypeError, ValueError):
        # some ops (e.g. a fused RNN kernel) have no vmap rule: pull back one example at a
        # time, through this module only
        grads = _looped_pullback(module, own, (inputs, in_vmap, in_batch), (grad_out, out_vmap, out_batch))
    return _as_wanted(grads, wanted)


def _as_wanted(grads: dict, wanted: dict) -> dict:
    """Per-example gradients [B, *] where `wanted`, squared norms [B] elsewhere."""
    return {path: g if wanted[path] else g.reshape(g.shape[0], -1).square().sum(1) for path, g in grads.items()}


def _looped_pullback(module, own, inputs, grad_out):
    """Per-example gradients of <module(w, inputs_i), g_i>, one example at a time -> {path: [B, *]}.
    `inputs` and `grad_out` are (tree, vmap dims, batch dims) as pytree.unmerge_blocks gives them."""
    per_path = {path: [] for path in own}
    tree, vmap_dims, _ = grad_out
    batch = next(leaf.shape[d] for leaf, d in zip(tree_flatten(tree)[0], vmap_dims)
                 if d is not None and isinstance(leaf, torch.Tensor))
    for i in range(batch):
        params = {path: p.clone().requires_grad_() for path, p in own.items()}
        with torch.enable_grad():
            args, kwargs = _take(*inputs, i)
            try:
                out = functional_call(module, params, args, kwargs, strict=False)
            except torch.OutOfMemoryError:
                raise  # the caller splits the batch
            except (RuntimeError, NotImplementedError, TypeError, ValueError, IndexError) as err:
                reason = first_line(err)
                raise UnsupportedModel(f"it cannot run one example at a time ({reason})") from err
            outs = tree_flatten(out)[0]
            gs = tree_flatten(_take(*grad_out, i))[0]
            objective = _total([(o * g).sum() for o, g in zip(outs, gs)
                                if isinstance(o, torch.Tensor) and g is not None])
            grads = torch.autograd.grad(objective, list(params.values()), allow_unused=True)
        for path, g in zip(params, grads):
            per_path[path].append(torch.zeros_like(params[path]) if g is None else g)
    return {path: torch.stack(gs) for path, gs in per_path.items()}


def _shared_input_pullback(module, own, inputs, grad_out, out_dims, layout):
    """A module whose inputs no example owns but whose output is batched (xcit's position
    encoding, repeated for the batch): example i's gradient is the pullback of the output
    gradient with every other example's rows zeroed, vmapped over the one-hot rows -> {path: [B, *]}.
    `grad_out` has its blocks unflattened (pytree.unmerge_blocks); the output is unflattened alike."""
    gs = tree_flatten(grad_out)[0]
    if any(d == MERGED for g, d in zip(gs, out_dims) if isinstance(g, torch.Tensor)):
        raise UnsupportedModel("its output merges the batch with another dimension")
    batch = next(g.shape[d] for g, d in zip(gs, out_dims) if isinstance(g, torch.Tensor))
    args, kwargs = inputs

    def pullback(params, onehot):  # onehot [B]
        out = functional_call(module, params, args, kwargs, strict=False)
        outs = tree_flatten(unmerge_blocks(out, layout.out_dims, layout.out_blocks)[0])[0]
        return _total([(o * g * onehot.view([-1 if i == d else 1 for i in range(g.dim())])).sum()
                       for o, g, d in zip(outs, gs, out_dims) if isinstance(g, torch.Tensor)])

    eye = torch.eye(batch, dtype=gs[0].dtype, device=gs[0].device)
    with torch.no_grad():
        return vmap(grad(pullback), in_dims=(None, 0))(own, eye)


def _total(terms):
    """Sum of tensors, starting from the first (not from a Python 0, a CPU scalar beside device tensors)."""
    total = terms[0]
    for t in terms[1:]:
        total = total + t
    return total


def _take(tree, vmap_dims, batch_dims, i):
    """Example i of every batched leaf, with its size-1 batch dim where it has one."""
    leaves, spec = tree_flatten(tree)
    taken = []
    for leaf, d, keep in zip(leaves, vmap_dims, batch_dims):
        if d is not None and isinstance(leaf, torch.Tensor):
            leaf = leaf.select(d, i)
            leaf = leaf.unsqueeze(keep) if keep is not None else leaf
        taken.append(leaf)
    return tree_unflatten(taken, spec)


def _detach(leaf):
    return leaf.detach() if isinstance(leaf, torch.Tensor) else leaf
