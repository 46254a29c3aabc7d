"""Which modules a method hooks, the rule serving each, and the parameters each rule covers."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .errors import UnsupportedModel
from .layout import call_layouts, first_example_uses
from .params import ParamSelection
from .rules import GENERIC, rule_for


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


def ghost_plan_for(model, selection: ParamSelection, inputs) -> HookPlan:
    """`plan_for`, with the parameters an ancestor of their module uses in its own forward
    (swin's attention calls F.linear with qkv.weight and never calls qkv) moved to that
    ancestor's generic rule, which sees every use inside its forward. Found by one forward of
    the first example, once per selection."""
    if "ghost" not in selection.plans:
        plan = plan_for(model, selection)
        outside = first_example_uses(model, inputs, plan.modules, covering_modules(plan))
        lifted = {pid: name for pid, name in (outside or {}).items() if name and _generic(model, name)}
        if lifted:
            plan = make_plan(model, selection, lifted)
        selection.plans["ghost"] = _lift_shared(model, selection, inputs, plan, lifted)
        # no parameter used outside its modules, and the plan as it was: the ghost forward
        # need not watch for such uses (uses.UseWatch) again
        selection.plans["uses checked"] = outside == {} and selection.plans["ghost"] is plan_for(model, selection)
    return selection.plans["ghost"]


def _lift_shared(model, selection, inputs, plan: HookPlan, lifted: dict) -> HookPlan:
    """A module whose calls see no example (xcit's position encoding: a Conv2d on a fixed grid,
    repeated for the batch by its parent; swin v2's cpb_mlp where no rule claims it) has no
    per-example output gradient; its parameters go up to the nearest ancestor with the generic
    rule, until that ancestor's output is batched. Returns `plan` as it came when that cannot be
    done (the ghost pass then refuses the module)."""
    base, lifted = plan, dict(lifted)
    deferred = pass_may_check(selection)
    depth = max((name.count(".") + 1 for name in plan.modules), default=0)
    for _ in range(depth + 1):  # each round moves parameters at least one level up
        layouts = call_layouts(model, inputs, plan.modules, deferred)
        shared = [name for name, calls in layouts.items() if calls and name and all(
            (not c.broadcast or plan.rules[name].layout == "own")  # ghost broadcasts no "own" call
            and all(d is None for d in c.out_dims) for c in calls)]
        if not shared:
            return plan
        for name in shared:
            parent = _generic_ancestor(model, name)
            if parent is None:
                return base
            lifted.update((id(p), parent) for p in plan.paths[name].values())
        plan = make_plan(model, selection, lifted)
        called = call_layouts(model, inputs, plan.modules, deferred)
        if any(not called[name] for name in set(lifted.values())):
            return base  # an ancestor never called: nothing would see those parameters
    return base


def pass_may_check(selection: ParamSelection) -> bool:
    """Whether ghost's pass may stand for a probe forward (layout.call_layouts' `deferred`): not
    where half-precision parameters, even frozen ones, change an example's rows with the batch
    size (by about 1e-3). Found once per selection."""
    if "pass checks" not in selection.plans:
        selection.plans["pass checks"] = all(p.dtype in (torch.float32, torch.float64)
                                             for p in selection.all_params if p.is_floating_point())
    return selection.plans["pass checks"]


def _generic(model, name: str) -> bool:
    return rule_for(model.get_submodule(name)).rule is GENERIC.rule


def _generic_ancestor(model, name: str) -> str | None:
    """The nearest ancestor (not the root) that the generic rule serves."""
    parts = name.split(".")[:-1]
    while parts:
        if _generic(model, ".".join(parts)):
            return ".".join(parts)
        parts.pop()
    return None


def covering_modules(plan: HookPlan) -> dict:
    """parameter id -> (its name, names of the hooked modules whose rules cover it)"""
    covered: dict[int, tuple[str, set]] = {}
    for name, paths in plan.paths.items():
        for path, p in paths.items():
            label = f"{name}.{path}" if name else path
            covered.setdefault(id(p), (label, set()))[1].add(name)
    return covered


def make_plan(model, selection: ParamSelection, lifted: dict | None = None) -> HookPlan:
    """Every module object once (under its first name), with the selected parameters its rule
    covers. A parameter is one tensor however many modules register it: a module drops the
    parameters also registered below it (`self.w = self.lin.weight`, Opacus' DPRNN registering
    each cell's weights on the RNN), since the deeper module's calls run inside its forward and
    its rule would count them twice. `lifted` (parameter id -> module name) gives parameters to
    an ancestor's generic rule instead. A use the plan does not cover is caught by uses.UseWatch."""
    lifted = lifted or {}
    if isinstance(model, torch.jit.ScriptModule):
        raise UnsupportedModel("the root module is a TorchScript module, which cannot take the forward "
                               "hooks this method needs")
    modules = dict(model.named_modules())
    claimed = {id(sub) for m in modules.values() for sub in _claimed_modules(m, rule_for(m).claims_children)}
    selected = {id(p) for p in selection.params}
    plan = HookPlan({}, {}, {})
    for name, module in modules.items():
        if id(module) in claimed:
            continue
        entry = rule_for(module)
        covered = [(attr, p) for attr, p in module._parameters.items()]
        for child in entry.claims_children:
            sub = getattr(module, child, None)
            if sub is not None:  # its parameters and those of the modules inside it
                covered += [(f"{child}.{path}", p) for path, p in sub.named_parameters()]
        paths = {path: p for path, p in covered if p is not None and id(p) in selected and id(p) not in lifted}
        if paths:
            deeper = _registered_below(module, entry.claims_children)
            paths = {path: p for path, p in paths.items() if id(p) not in deeper}
        if name in lifted.values():
            entry = GENERIC
            paths.update((path, p) for path, p in module.named_parameters()  # a tied one once
                         if lifted.get(id(p)) == name)
        if paths:
            plan.modules[name] = module
            plan.rules[name] = entry
            plan.paths[name] = paths
    return plan


def _claimed_modules(module, claims_children) -> list:
    """The children `module`'s rule claims and every module inside them (swin v2's cpb_mlp, a
    Sequential of Linears): the rule covers all their parameters, and none of them is hooked."""
    return [sub for child in claims_children if getattr(module, child, None) is not None
            for sub in getattr(module, child).modules()]


def _registered_below(module, claims_children) -> set[int]:
    """Ids of the parameters registered by modules inside `module`, other than the children its
    rule claims and the modules inside them (their parameters are the rule's own)."""
    claimed = {id(sub) for sub in _claimed_modules(module, claims_children)}
    return {id(p) for sub in module.modules() if sub is not module and id(sub) not in claimed
            for p in sub._parameters.values() if p is not None}


def describe(model, selection: ParamSelection) -> list[tuple[str, str, str, int]]:
    """[(module name, module type, rule name, selected parameter count)]: the ghost plan a run
    on this selection settled on, else the plan from the modules alone."""
    plan = selection.plans.get("ghost") or make_plan(model, selection)
    return [(name, type(plan.modules[name]).__name__, plan.rules[name].name,
             sum(p.numel() for p in plan.paths[name].values())) for name in plan.modules]


def rule_names(model, plan: HookPlan | None = None) -> dict[str, str]:
    """Module name -> the rule serving it under ghost ("via PARENT" for children whose parameters
    a parent's rule covers), for every module of the model (`alcli inspect`). Given the ghost plan
    of a run (`ghost_plan_for`), its modules show the rules it settled on."""
    names: dict[str, str] = {}
    for name, module in model.named_modules():
        if name in names:
            continue
        entry = rule_for(module)
        names[name] = entry.name
        for child in entry.claims_children:
            if getattr(module, child, None) is None:
                continue
            for sub_name, _ in getattr(module, child).named_modules(prefix=child):
                names[f"{name}.{sub_name}" if name else sub_name] = f"via {name or '(root)'}"
    for name, paths in (plan.paths.items() if plan is not None else ()):
        names[name] = plan.rules[name].name
        for path in paths:
            if "." in path:  # a child's parameter, covered here
                child = path.rsplit(".", 1)[0]
                names[f"{name}.{child}" if name else child] = f"via {name or '(root)'}"
    return names
