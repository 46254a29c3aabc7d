"""Use a model in eval mode and give it back exactly as it was."""
from __future__ import annotations

import contextlib

import torch
from torch import nn


@contextlib.contextmanager
def borrowed(model: nn.Module, grad_params: list[nn.Parameter]):
    """Eval mode; requires_grad only on `grad_params`; everything restored on exit.

    Unselected parameters stop requiring grad so autograd records nothing for them.
    """
    modes = [(m, m.training) for m in model.modules()]
    flags = [(p, p.requires_grad) for p in model.parameters()]
    grads = [(p, p.grad) for p in model.parameters()]
    wanted = {id(p) for p in grad_params}
    grad_mode = torch.is_grad_enabled()
    try:
        torch.set_grad_enabled(True)  # per-example gradients are wanted even under torch.no_grad()
        model.eval()
        for p, _ in flags:
            p.requires_grad_(id(p) in wanted)
        yield model
    finally:
        torch.set_grad_enabled(grad_mode)
        for m, mode in modes:
            m.training = mode
        for p, flag in flags:
            p.requires_grad_(flag)
        for p, grad in grads:
            p.grad = grad
