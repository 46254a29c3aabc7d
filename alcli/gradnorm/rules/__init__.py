"""Layer rules: one file per layer family, each registered for its module types.

A rule has one signature:

    rule(module, call, wanted) -> {param_path: tensor}

`call` holds what the ghost pass captured for one call of `module`: `call.args`, `call.kwargs`
(its inputs), `call.grad_out` (d(sum of losses)/d(output), same pytree as the output; row i is
example i's own output gradient because examples do not interact in eval mode) and `call.cache`
(a dict the rule may fill to reuse work across target sets). `wanted` maps each selected
parameter path (`"weight"`, `"out_proj.bias"`) to True when the per-example gradient
[B, *shape] is needed (the parameter is used more than once and the uses add before the norm),
False when its per-example squared norm [B] is enough.

A rule that cannot serve a particular call raises `UnsupportedModel` with the reason.

Each rule also says where it expects the batch (`layout`):
- "batch_first": dim 0 of its input and output, as for convolutions and BatchNorm ([N, C, ...]);
- "anywhere": the driver moves the batch dim of the first input and the output to dim 0
  (Linear, LayerNorm, Embedding see [T, B, d] in a seq-first transformer);
- "own": the rule reads `call.layout` itself (MultiheadAttention, the generic rule).
"""
from __future__ import annotations

from typing import Callable, NamedTuple

import torch
from torch import nn

Rule = Callable[..., dict]


class Entry(NamedTuple):
    name: str                        # the rule's file, as `alcli inspect` shows it
    rule: Rule
    claims_children: tuple[str, ...]  # children whose parameters the rule also covers
    layout: str                      # "batch_first" | "anywhere" | "own"
    capture: Callable | None = None  # a forward that taps tensors inside the module (see attention)
    accepts: Callable | None = None  # module -> bool; configurations the rule does not cover get
                                     # the generic rule


RULES: dict[type, Entry] = {}


def register(*types: type, layout: str, claims_children: tuple[str, ...] = (), capture=None, accepts=None):
    def wrap(rule: Rule) -> Rule:
        for module_type in types:
            RULES[module_type] = Entry(rule.__module__.rsplit(".", 1)[-1], rule, claims_children, layout,
                                       capture, accepts)
        return rule
    return wrap


def rule_for(module: nn.Module) -> Entry:
    """The rule serving a module; the exact generic rule when none is registered.

    A registered rule serves subclasses only when they keep the registered type's forward.
    """
    for module_type in type(module).__mro__:
        if module_type in RULES:
            entry = RULES[module_type]
            if type(module).forward is module_type.forward:
                if entry.accepts is None or entry.accepts(module):
                    return entry
                return Entry("generic", generic_rule, entry.claims_children, "own")
            break
    return Entry("generic", generic_rule, (), "own")


def flat_batch(t):
    """[B, *, d] -> [B, T, d] (T = product of the middle dims, 1 for 2-D input)."""
    return t.reshape(t.shape[0], -1, t.shape[-1])


def sq_norm_of_product(a, g, cache: dict | None = None, key: str = ""):
    """Per-example ||G_i^T A_i||_F^2 for A [B, T, k], G [B, T, o] -> [B].

    T == 1: ||g||^2 ||a||^2 (Goodfellow 2015). Otherwise the Gram form
    <A_i A_i^T, G_i G_i^T> when T^2 <= k*o, else the materialised [B, o, k] product.
    """
    batch, steps, k = a.shape
    o = g.shape[-1]
    if steps == 1:
        return torch.linalg.vecdot(a[:, 0], a[:, 0]) * torch.linalg.vecdot(g[:, 0], g[:, 0])
    if steps * steps <= k * o:
        gram_a = None if cache is None else cache.get(key)
        if gram_a is None:
            gram_a = a @ a.transpose(1, 2)  # [B, T, T]
            if cache is not None:
                cache[key] = gram_a
        return (gram_a * (g @ g.transpose(1, 2))).sum((1, 2))
    return (g.transpose(1, 2) @ a).pow(2).sum((1, 2))


# the rule files register themselves; they import `register` from above
from . import attention, conv, embedding, linear, norm  # noqa: E402,F401
from .generic import generic_rule  # noqa: E402
