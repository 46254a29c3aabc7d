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


def plan_for(model, selection: ParamSelection) -> HookPlan:
    """`make_plan`, built once per selection (a selection is rebuilt when the model changes)."""
    if "hooks" not in selection.plans:
        selection.plans["hooks"] = make_plan(model, selection)
    return selection.plans["hooks"]


def make_plan(model, selection: ParamSelection) -> HookPlan:
    """Every module object once (under its first name), with the selected parameters its rule
    covers. A parameter is one tensor however many modules register it: a module drops the
    parameters also registered below it (`self.w = self.lin.weight`, Opacus' DPRNN registering
    each cell's weights on the RNN), since the deeper module's calls run inside its forward and
    its rule would count them twice. A use the plan does not cover is caught by uses.UseWatch."""
    if isinstance(model, torch.jit.ScriptModule):
        raise UnsupportedModel("the root module is a TorchScript module, which cannot take the forward "
                               "hooks this method needs")
    modules = dict(model.named_modules())
    claimed = {id(getattr(m, child)) for m in modules.values() for child in rule_for(m).claims_children
               if getattr(m, child, None) is not None}
    selected = {id(p) for p in selection.params}
    plan = HookPlan({}, {}, {})
    for name, module in modules.items():
        if id(module) in claimed:
            continue
        entry = rule_for(module)
        covered = [(attr, p) for attr, p in module._parameters.items()]
        for child in entry.claims_children:
            sub = getattr(module, child, None)
            if sub is not None:
                covered += [(f"{child}.{attr}", p) for attr, p in sub._parameters.items()]
        paths = {path: p for path, p in covered if p is not None and id(p) in selected}
        if paths:
            deeper = _registered_below(module, entry.claims_children)
            paths = {path: p for path, p in paths.items() if id(p) not in deeper}
        if paths:
            plan.modules[name] = module
            plan.rules[name] = entry
            plan.paths[name] = paths
    return plan


def _registered_below(module, claims_children) -> set[int]:
    """Ids of the parameters registered by modules inside `module`, other than the children its
    rule claims (their parameters are the rule's own)."""
    claimed = {id(getattr(module, child, None)) for child in claims_children}
    return {id(p) for sub in module.modules() if sub is not module and id(sub) not in claimed
            for p in sub._parameters.values() if p is not None}


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
