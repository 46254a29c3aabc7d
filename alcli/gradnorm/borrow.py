"""Use a model in eval mode and give it back exactly as it was."""
from __future__ import annotations

import contextlib

import torch
from torch import nn


@contextlib.contextmanager
def borrowed(model: nn.Module, grad_params: list[nn.Parameter], modules: list | None = None,
             params: list | None = None):
    """Eval mode; requires_grad only on `grad_params`; timm's attention-bias caches keep nothing;
    everything restored on exit.

    Unselected parameters stop requiring grad so autograd records nothing for them. `modules`
    and `params` (every module and parameter, once each) may be given when already known.
    """
    modules = modules or list(model.modules())
    training = [m for m in modules if m.__dict__["training"]]  # none, for a model scored in eval mode
    caches = [(m, m.__dict__["attention_bias_cache"]) for m in modules
              if isinstance(m.__dict__.get("attention_bias_cache"), dict)]
    params = params or list({id(p): p for m in modules for p in m._parameters.values() if p is not None}.values())
    wanted = {id(p) for p in grad_params}
    flipped = [(p, p.requires_grad) for p in params if p.requires_grad != (id(p) in wanted)]
    grads = [(p, p.grad) for p in params]
    grad_mode = torch.is_grad_enabled()
    try:
        torch._C._set_grad_enabled(True)  # per-example gradients are wanted even under torch.no_grad()
        for m in training:
            m.__dict__["training"] = False  # what model.eval() sets, without Module.__setattr__
        for m, _ in caches:
            m.__dict__["attention_bias_cache"] = _Recomputed()
        for p, flag in flipped:
            p.requires_grad_(not flag)
        yield model
    finally:
        torch._C._set_grad_enabled(grad_mode)
        for m in training:
            m.__dict__["training"] = True
        for m, cache in caches:
            m.__dict__["attention_bias_cache"] = cache
        for p, flag in flipped:
            p.requires_grad_(flag)
        for p, grad in grads:  # only what changed: setting .grad costs more than reading it
            if p.grad is not grad:
                p.grad = grad


class _Recomputed(dict):
    """Stands in for timm's eval-mode `attention_bias_cache` (LeViT, EfficientFormer) while the
    engine runs: a cached `attention_biases[:, idx]` would be a constant to autograd (filled under
    no_grad, or holding the plain parameter where a method swaps in per-example copies), so every
    method would give those biases no gradient. It never reports a hit, so each lookup is made
    anew from the parameter (and stored only for the `cache[key]` read that follows)."""

    def __contains__(self, key) -> bool:
        return False
