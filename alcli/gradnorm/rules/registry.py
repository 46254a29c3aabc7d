"""The registry of layer rules (see `rules/__init__.py` for the contract) and the math they share."""
from __future__ import annotations

import contextlib
import contextvars
from typing import Any, Callable, NamedTuple

import torch

from ..errors import UnsupportedModel
from ..outer import Outer


class RuleCall(NamedTuple):
    """What a rule sees of one call of its module."""
    args: tuple      # the call's positional inputs, batch where the rule's `layout` says
    kwargs: dict
    grad_out: Any    # d(sum of losses)/d(output), same pytree as the output; row i is example i's
    cache: dict      # the rule's own, kept across the target sets of one batch
    layout: Any      # layout.Layout (batch dim of every input/output leaf), for "own" rules


Rule = Callable[..., dict]  # (module, RuleCall, wanted: {path: bool}) -> {path: tensor}


class Entry(NamedTuple):
    rule: Rule
    layout: str                       # "batch_first" | "anywhere" | "own"
    claims_children: tuple = ()       # children whose parameters the rule also covers
    capture: Callable | None = None   # a forward that taps tensors inside the module (attention)
    accepts: Callable | None = None   # module -> bool; other configurations get the generic rule
    rows: bool = False                # "batch_first" rules computing each row of a 2-D input [N, C]
                                      # alone (eval BatchNorm): rows merged with the batch, [B*k, C],
                                      # are handed over as [B, C, k]
    blocks: bool = False              # "batch_first" rules that sum an example's k rows of a
                                      # [B*k, ...] input (a detector's head on its proposals): the
                                      # input stays [B*k, ...], the output gradient comes [B, k, ...]
    dot: Callable | None = None       # (module, RuleCall, {path: V}) -> {path: [B] <g_i, V>} without
                                      # per-example gradients (ghost_norms' direction); None: the
                                      # driver dots the per-example gradients the rule gives

    @property
    def name(self) -> str:
        """The rule's file, as `alcli inspect` shows it."""
        return self.rule.__module__.rsplit(".", 1)[-1]


# True while the rules run under vmap over EGL's K target sets (ghost._backwards): an op without a
# batching rule is decomposed there into several per layer, so a rule may pick a form vmap batches
_UNDER_TARGET_VMAP = contextvars.ContextVar("under_target_vmap", default=False)


def under_target_vmap() -> bool:
    return _UNDER_TARGET_VMAP.get()


@contextlib.contextmanager
def target_vmap():
    token = _UNDER_TARGET_VMAP.set(True)
    try:
        yield
    finally:
        _UNDER_TARGET_VMAP.reset(token)


RULES: dict = {}  # a module type, or "package.module.Class" for optional packages' types


def register(*types, layout: str, claims_children: tuple = (), capture=None, accepts=None, rows=False,
             blocks=False, dot=None):
    """Register a rule for module types, or for classes named "package.module.Class" (types of
    optional packages such as transformers, matched without importing them)."""
    def wrap(rule: Rule) -> Rule:
        for module_type in types:
            RULES[module_type] = Entry(rule, layout, claims_children, capture, accepts, rows, blocks, dot)
        return rule
    return wrap


def registered(module_type: type) -> Entry | None:
    return RULES.get(module_type) or RULES.get(f"{module_type.__module__}.{module_type.__qualname__}")


def require_batch_dim(call, dim: int):
    """For "own" rules that read the batch from a fixed dim: the call's first input and first
    output must hold the examples there, one row each (not shared, merged or permuted)."""
    if call.layout.in_dims[:1] != [dim] or call.layout.out_dims[:1] != [dim]:
        raise UnsupportedModel(f"its input and output do not hold the batch in dim {dim}, one "
                               "example per row")


def flat_batch(t):
    """[B, *, d] -> [B, T, d] (T = product of the middle dims, 1 for 2-D input)."""
    return t.reshape(t.shape[0], -1, t.shape[-1])


def linear_grads(a, g, wanted: dict, cache: dict, prefix: str = "") -> dict:
    """A linear map's `{prefix}weight` [d_out, d_in] and `{prefix}bias` from inputs a [B, T, d_in]
    and output gradients g [B, T, d_out]: the weight's per-example gradient G_i^T A_i, as its
    factors (outer.Outer), where `wanted` says so, else its squared norm; the bias's per-example
    gradient sum_t g_it [B, d_out] (small: the driver squares those all at once)."""
    out = {}
    weight, bias = prefix + "weight", prefix + "bias"
    if weight in wanted:
        out[weight] = Outer(g, a, g.shape[-1]) if wanted[weight] else sq_norm_of_product(a, g, cache, weight)
    if bias in wanted:
        out[bias] = g.sum(1) if g.shape[1] > 1 else g[:, 0]
    return out


def sq_norm_of_product(a, g, cache: dict | None = None, key: str = "", g_grams: dict | None = None):
    """Per-example ||G_i^T A_i||_F^2 for A [B, T, k], G [B, T, o] -> [B].

    T == 1: ||g||^2 ||a||^2 (Goodfellow 2015). Otherwise the Gram form
    <A_i A_i^T, G_i G_i^T> when T^2 <= k*o, else the materialised [B, o, k] product.
    `g_grams`, a dict given with every product of the same G, computes G G^T once for them all
    (an LSTM's W_ih and W_hh share their G).
    """
    batch, steps, k = a.shape
    o = g.shape[-1]
    if steps == 1:  # three kernels: no selects, no vecdot decomposition
        return a.square().sum((1, 2)) * g.square().sum((1, 2))
    if steps * steps <= k * o:
        gram_a = None if cache is None else cache.get(key)
        if gram_a is None:
            gram_a = a @ a.transpose(1, 2)  # [B, T, T]
            if cache is not None:
                cache[key] = gram_a
        gram_g = None if g_grams is None else g_grams.get("gram")
        if gram_g is None:
            gram_g = g @ g.transpose(1, 2)  # [B, T, T]
            if g_grams is not None:
                g_grams["gram"] = gram_g
        return (gram_a * gram_g).sum((1, 2))
    return (g.transpose(1, 2) @ a).pow(2).sum((1, 2))
