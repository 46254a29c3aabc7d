"""The oracle: one forward and backward per example (the seed's method 1)."""
from __future__ import annotations

import torch

from .model_io import batch_size, batch_slice, forward_logits, repeat_first
from .params import ParamSelection


def loop_norms(model, inputs, targets_for, selection: ParamSelection, loss_fn):
    """-> [K, B] norms, one row per target set, and the batched logits [B, C]."""
    batch = batch_size(inputs)
    with torch.no_grad():
        logits = forward_logits(model, inputs)
    target_sets = targets_for(logits)
    sq = torch.zeros(len(target_sets), batch, dtype=torch.float64, device=logits.device)
    for i in range(batch):
        # example i as two copies, row 0's loss: never a batch of one (see ONE_EXAMPLE_BUG)
        logits_i = forward_logits(model, repeat_first(batch_slice(inputs, i, i + 1), 2))[:1]
        for k, targets in enumerate(target_sets):
            loss = loss_fn(logits_i, targets[i:i + 1]).sum()
            if not loss.requires_grad:
                continue  # the loss does not depend on the selected parameters
            grads = torch.autograd.grad(loss, selection.params, retain_graph=k + 1 < len(target_sets),
                                        allow_unused=True)
            for g in grads:
                if g is not None:
                    sq[k, i] += g.double().square().sum()  # stays on the device: no host sync
    return sq.sqrt(), logits
