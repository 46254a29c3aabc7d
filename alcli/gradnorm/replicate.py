"""The seed's method 2 done right: every module that owns a selected parameter runs with a
per-example copy of it, inside ONE batched forward and backward.

The copies are one stride-0 leaf per parameter, `p.expand(B, *p.shape)` (no memory, no deepcopy);
the module's forward is vmapped over the batch with example i using copy i, so the backward
deposits example i's gradient in row i of the leaf's gradient. Repeated calls and tied
parameters share the leaf, so their contributions add before the norm, as they should.
"""
from __future__ import annotations

import torch
from torch.func import functional_call, vmap

from torch.utils._pytree import tree_flatten, tree_unflatten

from .batching import broadcast_dims, input_batch_dims, output_batch_dims, squeeze_at, unsqueeze_at
from .errors import UnsupportedModel
from .ghost import make_plan
from .uses import UseWatch
from .params import Selection


def replicate_norms(model, inputs, target_sets, selection: Selection, loss_fn):
    """-> [K, B] norms and [B, C] logits."""
    batch = inputs.shape[0]
    plan = make_plan(model, selection)
    for name in plan.modules:
        for other in plan.modules:
            if other != name and other.startswith(name + "." if name else ""):
                owner = f"module '{name}'" if name else "the root module"
                raise UnsupportedModel(f"{owner} owns selected parameters and so does its child "
                                       f"'{other}'; replicate cannot nest copies")
    copies: dict[int, torch.Tensor] = {}
    for p in selection.params:
        copy = p.detach().expand(batch, *p.shape)  # [B, *p.shape], stride 0 in dim 0
        copy.requires_grad_()
        copies[id(p)] = copy

    patched = []
    try:
        for name, module in plan.modules.items():
            if "forward" in module.__dict__:
                continue  # the same module object under a second name: already patched
            paths = plan.paths[name]
            module.forward = _replicated_forward(module, name, {path: copies[id(p)] for path, p in paths.items()},
                                                 batch)
            patched.append(module)
        # inside patched modules the copies stand in for the parameters: any use of a real one
        # is outside them and would be missed
        with UseWatch({id(p): (name, set()) for name, p in zip(selection.names, selection.params)}, []):
            logits = model(inputs)
    finally:
        for module in patched:
            del module.forward

    leaves = list(copies.values())
    rows = []
    for k, targets in enumerate(target_sets):
        loss = loss_fn(logits, targets).sum()
        grads = torch.autograd.grad(loss, leaves, retain_graph=k + 1 < len(target_sets), allow_unused=True)
        sq = sum(g.flatten(1).double().pow(2).sum(1) for g in grads if g is not None)
        rows.append(torch.as_tensor(sq, dtype=torch.float64).expand(batch).sqrt())
    return torch.stack(rows), logits


def _replicated_forward(module, name: str, copies: dict, batch: int):
    """A forward that runs example i through `module` with parameter copies[attr][i]."""
    original = type(module).forward
    label = f"module '{name}' ({type(module).__name__})" if name else "the root module"
    inside = [False]

    def forward(*args, **kwargs):
        if inside[0]:  # functional_call below re-enters module(...)
            return original(module, *args, **kwargs)
        args_dims, kwargs_dims = input_batch_dims(module, args, kwargs, batch)
        structure = []  # (output pytree spec, which leaves are tensors, their batch dims)

        def one_example(params, args_i, kwargs_i):
            out = functional_call(module, params, unsqueeze_at(args_i, args_dims),
                                  unsqueeze_at(kwargs_i, kwargs_dims), strict=False)
            nested_dims = output_batch_dims(module, out)
            dims = broadcast_dims(nested_dims, out)
            out = squeeze_at(out, nested_dims)
            leaves, spec = tree_flatten(out)
            is_tensor = [isinstance(leaf, torch.Tensor) for leaf in leaves]
            structure.append((spec, leaves, is_tensor, dims))
            return tuple(leaf for leaf, t in zip(leaves, is_tensor) if t)  # vmap returns tensors only

        inside[0] = True
        try:
            tensors = iter(vmap(one_example, in_dims=(0, args_dims, kwargs_dims))(copies, args, kwargs))
        except (RuntimeError, NotImplementedError, TypeError, ValueError) as err:
            reason = (str(err).strip().splitlines() or [type(err).__name__])[0][:200]
            raise UnsupportedModel(f"{label} cannot run with per-example copies under vmap ({reason})") from err
        finally:
            inside[0] = False
        # vmap put the batch in dim 0 of every tensor; move it where the module keeps it
        spec, leaves, is_tensor, dims = structure[-1]
        rebuilt = [next(tensors).movedim(0, d or 0) if t else leaf for leaf, t, d in zip(leaves, is_tensor, dims)]
        return tree_unflatten(rebuilt, spec)

    return forward

