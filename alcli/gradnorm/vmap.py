"""torch.func: per-example gradients by vmap(grad(loss of one example)), in bounded chunks."""
from __future__ import annotations

import torch
from torch.func import functional_call, grad, vmap

from ..errors import first_line
from .errors import UnsupportedModel
from .model_io import (
    batch_size,
    batch_slice,
    forward_logits,
    logits_of,
    map_batch,
    model_args,
)
from .params import ParamSelection
from .uses import ModuleStack

CPU_BUDGET_BYTES = 1 << 29  # per-example gradients held at once on the CPU (512 MiB)


def chunk_elements(device: torch.device, element_size: int) -> int:
    """How many per-example gradient elements one chunk may hold: a quarter of the memory the
    device has free on CUDA (the forward and backward of the chunk need the rest), a fixed budget
    elsewhere."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return max(1, free // 4 // element_size)
    return CPU_BUDGET_BYTES // element_size


def vmap_norms(model, inputs, targets_for, selection: ParamSelection, loss_fn):
    """-> [K, B] norms and [B, C] logits; `targets_for(logits)` gives the K target sets."""
    batch = batch_size(inputs)
    params = {name: p.detach() for name, p in zip(selection.names, selection.params)}
    numel = sum(p.numel() for p in params.values())
    element = max((p.element_size() for p in params.values()), default=4)
    device = next(iter(params.values())).device if params else torch.device("cpu")
    chunk = max(1, min(batch, chunk_elements(device, element) // max(numel, 1)))

    in_loss = [False]  # a failure after the model's forward is the loss function's

    def loss_of_one(p, x, t):
        in_loss[0] = False
        logits_i = logits_of(functional_call(model, p, *model_args(map_batch(x, lambda t: t.unsqueeze(0)))))
        in_loss[0] = True
        return loss_fn(logits_i, t.unsqueeze(0)).sum()

    per_example = vmap(grad(loss_of_one), in_dims=(None, 0, 0))
    with torch.no_grad():
        logits = forward_logits(model, inputs)  # the targets may depend on them
    target_sets = targets_for(logits)
    stack = ModuleStack(model)
    try:
        with stack:
            rows = _chunked(per_example, params, inputs, target_sets, chunk)
    except torch.OutOfMemoryError:
        raise  # the caller splits the batch
    except (RuntimeError, NotImplementedError, TypeError) as err:
        where = "the loss function" if in_loss[0] else stack.where()
        raise UnsupportedModel(f"torch.func cannot vmap {where} ({first_line(err)})") from err
    return torch.stack(rows), logits


def _chunked(per_example, params, inputs, target_sets, chunk):
    """Per-example gradients for `chunk` examples at a time, reduced to norms at once."""
    batch = batch_size(inputs)
    rows = []
    for targets in target_sets:
        sq_parts = []
        for start in range(0, batch, chunk):
            grads = per_example(params, batch_slice(inputs, start, start + chunk), targets[start:start + chunk])
            sq_parts.append(sum(g.reshape(g.shape[0], -1).double().square().sum(1) for g in grads.values()))
        rows.append(torch.cat(sq_parts).sqrt())
    return rows
