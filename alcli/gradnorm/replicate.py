"""The seed's method 2 done right: every module that owns a selected parameter runs with a
per-example copy of it, inside ONE batched forward and backward.

The copies are one stride-0 leaf per parameter, `p.expand(B, *p.shape)` (no memory, no deepcopy);
Linear, Conv1d/2d/3d and the norm layers run all copies at once as batched matmuls, grouped
convolutions and broadcast affines (replicate_layers.py); any other module's forward is vmapped
over the batch with example i using copy i. Either way the backward deposits example i's gradient
in row i of the leaf's gradient. For Linear and Conv weights the forward is the plain batched call
(all copies are equal) and the backward fills the copies' gradient with one batched matmul; a copy
used by one call only (no second call, no tied parameter) does not even materialise its
[B, *shape] gradient: its squared norms are taken inside the backward, a few examples at a time.
Repeated calls and tied parameters share the leaf, so their contributions add before the norm, as
they should.
"""
from __future__ import annotations

import torch
from torch import nn
from torch.func import functional_call, vmap
from torch.utils._pytree import tree_flatten, tree_unflatten

from ..errors import first_line
from .errors import UnsupportedModel
from .layout import MERGED, call_layouts
from .model_io import batch_size, forward_logits
from .params import ParamSelection
from .plan import plan_for
from .pytree import dims_like, squeeze_leaves, unsqueeze_leaves
from .replicate_layers import NOT_SERVED, Sink, batched_forward, square_norms
from .uses import UseWatch


def replicate_norms(model, inputs, targets_for, selection: ParamSelection, loss_fn):
    """-> [K, B] norms and [B, C] logits; `targets_for(logits)` gives the K target sets."""
    batch = batch_size(inputs)
    plan = plan_for(model, selection)
    for name in plan.modules:
        for other in plan.modules:
            if other != name and other.startswith(name + "." if name else ""):
                owner = f"module '{name}'" if name else "the root module"
                raise UnsupportedModel(f"{owner} owns selected parameters and so does its child "
                                       f"'{other}'; replicate cannot nest copies")
        if isinstance(plan.modules[name], nn.Embedding) and plan.modules[name].padding_idx is not None:
            raise UnsupportedModel(f"module '{name}' (Embedding): vmap's embedding rule gives the "
                                   "padding_idx row a gradient")
    layouts = call_layouts(model, inputs, plan.modules)
    copies: dict[int, torch.Tensor] = {}
    for p in selection.params:
        copy = p.detach().expand(batch, *p.shape)  # [B, *p.shape], stride 0 in dim 0
        copy.requires_grad_()
        copies[id(p)] = copy

    # a copy used by one call only can have its squared norms taken inside the backward, a few
    # examples at a time, instead of materialising its whole [B, *shape] gradient
    uses: dict[int, int] = {}
    for name, paths in plan.paths.items():
        for p in paths.values():
            uses[id(p)] = uses.get(id(p), 0) + len(layouts[name])
    sinks = {id(p): Sink() for p in selection.params if uses.get(id(p)) == 1}

    patched = []
    try:
        for name, module in plan.modules.items():
            if "forward" in module.__dict__:
                continue  # the same module object under a second name: already patched
            paths = plan.paths[name]
            module.forward = _replicated_forward(module, name, {path: copies[id(p)] for path, p in paths.items()},
                                                 layouts[name],
                                                 {path: sinks[id(p)] for path, p in paths.items() if id(p) in sinks})
            patched.append(module)
        # inside patched modules the copies stand in for the parameters: any use of a real one
        # is outside them and would be missed
        with UseWatch({id(p): (name, set()) for name, p in zip(selection.names, selection.params)}, []):
            logits = forward_logits(model, inputs)
    finally:
        for module in patched:
            del module.forward

    leaves = list(copies.values())
    target_sets = targets_for(logits)
    rows = []
    for k, targets in enumerate(target_sets):
        loss = loss_fn(logits, targets).sum()
        sq = torch.zeros(batch, dtype=torch.float64, device=logits.device)
        for sink in sinks.values():
            sink.sq = sq  # the backward adds the squared norms of the copies it takes in place
        if loss.requires_grad:  # else no selected parameter affects the loss
            grads = torch.autograd.grad(loss, leaves, retain_graph=k + 1 < len(target_sets), allow_unused=True)
            for g in grads:
                if g is not None:
                    sq += square_norms(g.reshape(batch, -1))
        rows.append(sq.sqrt())
    return torch.stack(rows), logits


def _replicated_forward(module, name: str, copies: dict, layouts: list, sinks: dict):
    """A forward that runs example i through `module` with parameter copies[path][i]."""
    original = type(module).forward
    label = f"module '{name}' ({type(module).__name__})" if name else "the root module"
    inside = [False]
    calls = iter(layouts)

    def forward(*args, **kwargs):
        if inside[0]:  # functional_call below re-enters module(...)
            return original(module, *args, **kwargs)
        layout = next(calls, None)
        if layout is None or MERGED in layout.out_dims or MERGED in layout.in_dims:
            raise UnsupportedModel(f"{label}: its inputs and outputs do not all carry the batch in one dim")
        fast = batched_forward(module, copies, args, kwargs, layout, sinks)
        if fast is not NOT_SERVED:
            return fast
        in_dims = dims_like((args, kwargs), layout.in_dims)
        structure = []

        def one_example(params, inputs_i):
            args_i, kwargs_i = unsqueeze_leaves(inputs_i, layout.in_dims)
            out = squeeze_leaves(functional_call(module, params, args_i, kwargs_i, strict=False), layout.out_dims)
            leaves, spec = tree_flatten(out)
            structure.append((spec, leaves))
            return tuple(leaf for leaf in leaves if isinstance(leaf, torch.Tensor))  # vmap returns tensors only

        inside[0] = True
        try:
            tensors = iter(vmap(one_example, in_dims=(0, in_dims))(copies, (args, kwargs)))
        except torch.OutOfMemoryError:
            raise  # the caller splits the batch
        except (RuntimeError, NotImplementedError, TypeError, ValueError) as err:
            reason = first_line(err)
            raise UnsupportedModel(f"{label} cannot run with per-example copies under vmap ({reason})") from err
        finally:
            inside[0] = False
        # vmap put the batch in dim 0 of every tensor; move it where the module keeps it
        spec, leaves = structure[-1]
        if any(isinstance(leaf, torch.Tensor) and d is None for leaf, d in zip(leaves, layout.out_dims)):
            raise UnsupportedModel(f"{label}: an output is shared by all examples")
        return tree_unflatten([next(tensors).movedim(0, d) if isinstance(leaf, torch.Tensor) else leaf
                               for leaf, d in zip(leaves, layout.out_dims)], spec)

    return forward
