"""Which modules a method hooks, the rule serving each, and the parameters each rule covers."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .errors import UnsupportedModel
from .params import ParamSelection
from .rules import rule_for


@dataclass
class HookPlan:
    """Which modules are hooked and which parameter paths each rule must cover."""
    modules: dict    # module name -> module
    rules: dict      # module name -> rules.Entry
    paths: dict      # module name -> {param path within module: parameter}


def make_plan(model, selection: ParamSelection) -> HookPlan:
    if isinstance(model, torch.jit.ScriptModule):
        raise UnsupportedModel("a TorchScript module cannot take the forward hooks this method needs")
    modules = dict(model.named_modules(remove_duplicate=False))
    claimed_children: set[str] = set()
    plan = HookPlan({}, {}, {})
    for name, module in modules.items():
        for child in rule_for(module).claims_children:
            claimed_children.add(f"{name}.{child}" if name else child)
    selected = {id(p) for p in selection.params}
    for name, module in modules.items():
        if name in claimed_children:
            continue
        entry = rule_for(module)
        paths = {attr: p for attr, p in module._parameters.items() if p is not None and id(p) in selected}
        for child in entry.claims_children:
            sub = getattr(module, child, None)
            if sub is not None:
                for attr, p in sub._parameters.items():
                    if p is not None and id(p) in selected:
                        paths[f"{child}.{attr}"] = p
        if paths:
            plan.modules[name] = module
            plan.rules[name] = entry
            plan.paths[name] = paths
    return plan


def describe(model, selection: ParamSelection) -> list[tuple[str, str, str, int]]:
    """[(module name, module type, rule name, selected parameter count)] for `alcli inspect`."""
    plan = make_plan(model, selection)
    return [(name, type(plan.modules[name]).__name__, plan.rules[name].name,
             sum(p.numel() for p in plan.paths[name].values())) for name in plan.modules]


def rule_names(model) -> dict[str, str]:
    """Module name -> the rule serving it under ghost ("via PARENT" for children whose parameters
    a parent's rule covers), for every module of the model (`alcli inspect`)."""
    names: dict[str, str] = {}
    for name, module in model.named_modules():
        if name in names:
            continue
        entry = rule_for(module)
        names[name] = entry.name
        for child in entry.claims_children:
            names[f"{name}.{child}" if name else child] = f"via {name or '(root)'}"
    return names
