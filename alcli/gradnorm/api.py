"""The engine's entry points: pick a method, borrow the model, return per-example norms."""
from __future__ import annotations

import functools
import warnings
import weakref
from typing import Callable, Sequence

import torch
from torch import nn

from .borrow import borrowed
from .errors import UnsupportedModel
from .ghost import ghost_norms
from .loop import loop_norms
from .loss import cross_entropy
from .model_io import (
    batch_size,
    float_dtype,
    forward_logits,
    repeat_first,
    zeros_like_one,
)
from .params import select_params, selection_for
from .plan import describe
from .replicate import replicate_norms
from .vmap import vmap_norms

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (logits, targets) -> [B]


METHOD_TABLE = {"loop": loop_norms, "replicate": replicate_norms, "vmap": vmap_norms, "ghost": ghost_norms}
METHODS = ("auto", "ghost", "replicate", "vmap", "loop")
AUTO_ORDER = ("ghost", "vmap", "loop")  # fastest exact first; loop always works

# model -> {(params key, loss_fn): (method, reason)}: what `auto` settled on, so later batches
# do not retry methods that failed on this model.
_auto_choice: "weakref.WeakKeyDictionary[nn.Module, dict]" = weakref.WeakKeyDictionary()


def per_example_grad_norms(model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor, *,
                           params: Sequence[str] | str | None = None, method: str = "auto",
                           loss_fn: LossFn | None = None, compile: bool = False) -> torch.Tensor:
    """L2 norm of the gradient of each example's own loss w.r.t. the selected parameters -> [B]."""
    norms, _ = grad_norms_per_target(model, inputs, [targets], params=params, method=method,
                                     loss_fn=loss_fn, compile=compile)
    return norms[0]


def grad_norms_per_target(model: nn.Module, inputs: torch.Tensor,
                          target_sets: Sequence[torch.Tensor] | Callable[[torch.Tensor], Sequence[torch.Tensor]],
                          *, params=None, method: str = "auto", loss_fn: LossFn | None = None,
                          compile: bool = False):
    """Norms for several target sets from one forward pass -> ([K, B] norms, [B, C] logits).

    Used for expected gradient length, where target set k is "every example's k-th most probable
    class". `target_sets` may be a function of the (detached) logits, so targets that depend on
    the model's predictions need no forward pass of their own. The norms come back in the
    model's dtype; the logits are detached.

    `compile`: the ghost method runs its layer rules and their sum as one torch.compile'd graph
    per (model, input signature), compiled on first use (seconds); other methods run as they are.
    """
    _outside_inference_mode()
    if method not in METHODS:
        raise ValueError(f"unknown method '{method}'; choose one of {', '.join(METHODS)}")
    loss_fn = loss_fn or cross_entropy
    selection = selection_for(model, params)
    targets_for = _targets(target_sets)
    if batch_size(inputs) == 1:  # never a batch of one: see ONE_EXAMPLE_BUG
        norms, logits = grad_norms_per_target(model, repeat_first(inputs, 2), _twice(target_sets),
                                              params=params, method=method, loss_fn=loss_fn, compile=compile)
        return norms[:, :1], logits[:1]
    run = _empty_batch if batch_size(inputs) == 0 else None
    if method != "auto":
        with borrowed(model, selection.params, selection.modules, selection.all_params):
            norms, logits = (run or _method(method, compile))(model, inputs, targets_for, selection, loss_fn)
        return norms.to(_dtype(selection, inputs)), logits.detach()

    key = (tuple(selection.names), id(loss_fn))
    known = _auto_choice.get(model)
    if known is None:
        known = _auto_choice[model] = {}
    # start from the method that served this model before; a batch it cannot serve (a
    # data-dependent forward) moves on to the next ones
    start = AUTO_ORDER.index(known[key][0]) if key in known else 0
    failures = []
    # only UnsupportedModel moves on: any other error in a method is a bug, and surfaces
    for name in AUTO_ORDER[start:]:
        try:
            with borrowed(model, selection.params, selection.modules, selection.all_params):
                norms, logits = (run or _method(name, compile))(model, inputs, targets_for, selection, loss_fn)
        except UnsupportedModel as err:
            failures.append(f"{name}: {err}")
            continue
        if key not in known or failures:
            known[key] = (name, "; ".join(failures + [_why(name, model, selection)]))
            if name != "ghost":
                warnings.warn(EngineFallback(f"per-example gradient norms of {type(model).__name__} "
                                             f"use the slower '{name}' method: {known[key][1]}",
                                             name), stacklevel=3)
        return norms.to(_dtype(selection, inputs)), logits.detach()
    raise UnsupportedModel("no method can serve this model: " + "; ".join(failures))


def grad_dots_per_target(model: nn.Module, inputs: torch.Tensor,
                         target_sets: Sequence[torch.Tensor] | Callable[[torch.Tensor], Sequence[torch.Tensor]],
                         direction: dict[str, torch.Tensor], *, params=None, loss_fn: LossFn | None = None):
    """Each example's loss gradient at each target set, its norm and its inner product with a
    fixed vector V over the selected parameters (`direction`: each one's name -> V's part, of its
    shape) -> ([K, B] norms, [K, B] inner products g_i·V, [B, C] logits), in float64 (float32 on
    MPS). One ghost backward per target set gives both: the layer rules' per-example gradients,
    factored where the factors are smaller (outer.dot), each taken as it arrives. The ghost
    method only: UnsupportedModel where it cannot serve the model."""
    _outside_inference_mode()
    selection = selection_for(model, params)
    targets_for = _targets(target_sets)
    if batch_size(inputs) == 1:  # never a batch of one: see ONE_EXAMPLE_BUG
        norms, dots, logits = grad_dots_per_target(model, repeat_first(inputs, 2), _twice(target_sets),
                                                   direction, params=params, loss_fn=loss_fn)
        return norms[:, :1], dots[:, :1], logits[:1]
    by_id = {id(p): direction[n] for n, p in zip(selection.names, selection.params)}
    with borrowed(model, selection.params, selection.modules, selection.all_params):
        if batch_size(inputs) == 0:
            norms, logits = _empty_batch(model, inputs, targets_for, selection, loss_fn)
            return norms, norms.clone(), logits.detach()
        both, logits = ghost_norms(model, inputs, targets_for, selection, loss_fn or cross_entropy,
                                   direction=by_id)  # [K, 2, B]
    both = both.detach()
    return both[:, 0], both[:, 1], logits.detach()


def _outside_inference_mode() -> None:
    if torch.is_inference_mode_enabled():
        raise RuntimeError("per-example gradients cannot be computed inside torch.inference_mode(); "
                           "call the engine outside it")


def _targets(target_sets) -> Callable:
    """The K target sets as a function of the logits: the caller's (checked), or a fixed list."""
    if callable(target_sets):
        return _checked(target_sets)
    fixed = list(target_sets)
    return lambda logits: fixed


def _method(name: str, compile: bool):
    if compile and name == "ghost":
        return functools.partial(ghost_norms, compiled=True)
    return METHOD_TABLE[name]


# PyTorch (2.14.1, CPU) differentiates BatchNorm2d wrongly at batch size 1 when the output
# gradient is channels_last with a batch stride other than C*H*W (what `x.flatten(2).transpose(1,
# 2)` after a conv+BatchNorm stem sends back): its backward reads the NHWC gradient as NCHW.
# tests/test_gradnorm_oracle.py holds a reproducer. A batch of one example therefore runs as two
# copies (row 0 kept), here and in the loop method.
ONE_EXAMPLE_BUG = "BatchNorm2d backward at batch size 1 (tests/test_gradnorm_oracle.py)"


def _twice(target_sets):
    """Target sets for a batch of one example run as two copies."""
    if callable(target_sets):
        return target_sets  # it gets the two copies' logits and gives targets for both
    return [t.repeat(2, *[1] * (t.dim() - 1)) for t in target_sets]


class EngineFallback(UserWarning):
    """`auto` settled on a method other than ghost for a model; the message says why, and
    `method` which."""

    def __init__(self, message: str, method: str):
        super().__init__(message)
        self.method = method


def _empty_batch(model, inputs, targets_for, selection, loss_fn):
    """B = 0: no example, no norm -> [K, 0] norms and the model's (empty) logits [0, C]. A model
    whose forward cannot take an empty batch gives its logits' shape from a zero example."""
    with torch.no_grad():
        try:
            logits = forward_logits(model, inputs)
        except torch.OutOfMemoryError:
            raise
        except Exception:  # the model's own forward refuses B = 0 (e.g. x.view(B, -1))
            logits = forward_logits(model, zeros_like_one(inputs))[:0]
    target_sets = targets_for(logits)
    return torch.zeros(len(target_sets), 0, dtype=torch.float64, device=logits.device), logits


def auto_choice(model: nn.Module, params=None, loss_fn: LossFn | None = None):
    """(method, reason) that `auto` settled on for this model, or None before its first call."""
    selection = select_params(model, params)
    return _auto_choice.get(model, {}).get((tuple(selection.names), id(loss_fn or cross_entropy)))


def _why(method: str, model, selection) -> str:
    if method != "ghost":
        return f"{method} serves this model"
    generic = [name or "(root)" for name, _, rule, _ in describe(model, selection) if rule == "generic"]
    if not generic:
        return "ghost: a layer rule serves every selected module"
    return "ghost: layer rules, and the exact generic rule for " + ", ".join(generic[:5]) + (
        f" and {len(generic) - 5} more" if len(generic) > 5 else "")


def explain(model: nn.Module, params=None, loss_fn: LossFn | None = None) -> dict:
    """What the engine will do for this model: the rule serving each selected module and
    the method `auto` settled on with its reason (None before its first call)."""
    selection = select_params(model, params)
    return {"rules": describe(model, selection), "auto": auto_choice(model, params, loss_fn),
            "selected_params": sum(p.numel() for p in selection.params)}


def _checked(choose):
    def targets_for(logits):
        sets = list(choose(logits.detach()))
        if not sets:
            raise ValueError("target_sets gave no target set")
        return sets
    return targets_for


def model_dtype(model: nn.Module) -> torch.dtype | None:
    """The dtype of the model's first floating-point parameter (None if it has none)."""
    for p in model.parameters():
        if p.is_floating_point():
            return p.dtype
    return None


def _dtype(selection, inputs: torch.Tensor) -> torch.dtype:
    """The dtype the norms come back in: the model's (its first floating-point parameter's, as
    model_dtype; `selection.all_params` holds them in the model's order), else the inputs'."""
    for p in selection.all_params:
        if p.is_floating_point():
            return p.dtype
    return float_dtype(inputs) or torch.get_default_dtype()
