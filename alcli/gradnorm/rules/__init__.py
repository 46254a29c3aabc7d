"""Layer rules: one file per layer family, each registered for its module types.

A rule has one signature:

    rule(module, call: RuleCall, wanted) -> {param_path: tensor}

`call` is what the ghost pass captured for one call of `module` (`registry.RuleCall`): `args`,
`kwargs` (its inputs), `grad_out` (d(sum of losses)/d(output), same pytree as the output; row i is
example i's own output gradient because examples do not interact in eval mode), `cache` (a dict
the rule may fill to reuse work across target sets) and `layout` (the batch dim of every leaf).
`wanted` maps each selected parameter path (`"weight"`, `"out_proj.bias"`) to True when the
per-example gradient [B, *shape] is needed (the parameter is used more than once and the uses add
before the norm), False when its per-example squared norm [B] is enough.

A rule that cannot serve a particular call raises `UnsupportedModel` with the reason.

Each rule also says where it expects the batch (`layout`):
- "batch_first": dim 0 of its input and output, as for convolutions and BatchNorm ([N, C, ...]);
- "anywhere": the driver moves the batch dim of the first input and the output to dim 0
  (Linear, LayerNorm, Embedding see [T, B, d] in a seq-first transformer);
- "own": the rule reads `call.layout` itself (the generic rule), or records its inputs batch-first
  with its own capturing forward (MultiheadAttention).
"""
from __future__ import annotations

from torch import nn

from . import attention, conv, embedding, linear, norm, rnn, swin  # noqa: F401  (they register themselves)
from .generic import generic_rule
from .registry import Entry, RuleCall, registered

__all__ = ["GENERIC", "Entry", "RuleCall", "rule_for"]

GENERIC = Entry(generic_rule, "own")


def rule_for(module: nn.Module) -> Entry:
    """The rule serving a module; the exact generic rule when none is registered.

    A registered rule serves subclasses only when they keep the registered type's forward.
    """
    for module_type in type(module).__mro__:
        entry = registered(module_type)
        if entry is not None:
            if type(module).forward is module_type.forward:
                if entry.accepts is None or entry.accepts(module):
                    return entry
                return GENERIC._replace(claims_children=entry.claims_children)
            break
    return GENERIC
