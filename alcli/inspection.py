"""`alcli inspect`: the model's modules, which engine rule serves each, and the method `auto` picks."""
from __future__ import annotations

import warnings
from dataclasses import dataclass, field

import torch
from torch import nn

from .errors import PoolError, RunError
from .files.config import Settings
from .pools.common import Batch, collate, decoded
from .files.remote import shown
from .gradnorm import (EngineFallback, UnsupportedModel, auto_choice, grad_norms_per_target,
                       rule_names, select_params)
from .gradnorm.plan import ghost_plan_for
from . import tasks
from .score.runner import forward, to_model
from .session import check_layers, model_channels, model_for, pool_for


@dataclass
class ModuleInfo:
    name: str
    kind: str        # module class name
    params: int      # parameters it owns directly
    selected: bool   # in the gradient strategies' selection (--layers)
    rule: str        # the engine rule that serves it, "-" where the engine offers no lookup


@dataclass
class Inspection:
    model: str
    total_params: int
    selected_params: int
    channels: int | None
    modules: list[ModuleInfo] = field(default_factory=list)
    method: str = "auto"
    reason: str = ""
    task: str = "auto"  # --task, or what auto reads from the model (and, given a pool, its output)

    @property
    def default_strategy(self) -> str | None:
        """The task's --strategy when none is given (Task.default_strategy, with its --aggregate
        where that is not the mean); None: task unknown."""
        spec = tasks.TASKS.get(self.task)
        if spec is None:
            return None
        aggregate = "" if spec.default_aggregate == "mean" else f" --aggregate {spec.default_aggregate}"
        return spec.default_strategy + aggregate


def inspect_model(settings: Settings, *, model: nn.Module | None = None, pool=None,
                  stdin=None) -> Inspection:
    """Modules, parameter counts, selection and rules; and, given a pool, the method `auto` picks
    (found by running the engine on the pool's first two examples)."""
    net = model_for(settings, model).eval()
    check_layers(net, settings.layers)
    chosen = {id(p) for p in select_params(net, settings.layers).params}
    info = Inspection(model=shown(settings.model) if settings.model else type(net).__name__,
                      total_params=sum(p.numel() for p in net.parameters()),
                      selected_params=sum(p.numel() for p in net.parameters() if id(p) in chosen),
                      channels=model_channels(net))
    info.task = (settings.task if settings.task != "auto" else
                 tasks.from_model(net) or "auto (decided by the model's output; give a pool to see it)")
    rules = rule_names(net)
    for name, module in net.named_modules():
        own = list(module.parameters(recurse=False))
        if own:
            info.modules.append(ModuleInfo(name or "(root)", type(module).__name__,
                                           sum(p.numel() for p in own),
                                           any(id(p) in chosen for p in own), rules.get(name, "-")))
    spec = tasks.TASKS.get(info.task)
    if spec is not None and spec.method is not None:  # a detector: its own loop, not the engine's methods
        info.method, info.reason = spec.method(net, settings.method)
        return info
    if settings.method != "auto" and settings.pool is None and pool is None:
        info.method, info.reason = settings.method, "asked for with --method"
        return info
    if settings.pool is None and pool is None:
        info.reason = "decided at the first batch; give a pool to try it here"
        return info
    the_pool = pool_for(settings, net, pool, stdin)
    batch: Batch = collate([the_pool[i] for i in range(min(2, len(the_pool)))])
    batch = decoded(batch, the_pool, torch.device("cpu"))
    if batch.errors:
        raise PoolError(batch.errors[0][1])
    inputs = to_model(batch.inputs, net, torch.device("cpu"), the_pool.to_float)
    logits = forward(net, inputs, the_pool.name)
    info.task = tasks.resolve(settings.task, net, lambda: logits)
    tasks.check(info.task, logits)
    if settings.method != "auto":
        info.method, info.reason = settings.method, "asked for with --method"
        return info
    loss_fn, targets = tasks.TASKS[info.task].probe(logits, inputs)  # regression: each output itself
    with warnings.catch_warnings():  # the fallback is what this command reports
        warnings.simplefilter("ignore", EngineFallback)
        try:
            grad_norms_per_target(net, inputs, [targets], params=settings.layers, method="auto",
                                  loss_fn=loss_fn)
        except UnsupportedModel as err:
            raise RunError(f"no engine method can serve this model ({err})") from None
    info.method, info.reason = auto_choice(net, settings.layers, loss_fn) or ("auto", "")
    if info.method == "ghost":  # the rules this pool's run settled on
        rules = rule_names(net, ghost_plan_for(net, select_params(net, settings.layers), inputs))
        for row in info.modules:
            row.rule = rules.get("" if row.name == "(root)" else row.name, "-")
    return info
