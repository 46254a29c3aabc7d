"""Resolve the `params=` selection into parameters and the modules that own them."""
from __future__ import annotations

import fnmatch
import weakref
from dataclasses import dataclass, field

from torch import nn


@dataclass
class ParamSelection:
    """The selected parameters, keyed by their first name in `model.named_parameters()`."""

    names: list[str]  # e.g. ["conv2.weight"]
    params: list[nn.Parameter]
    # owner module name -> [(attribute name, parameter)] for every module that directly owns a
    # selected parameter (a tied parameter appears under each module that holds it)
    owners: dict[str, list[tuple[str, nn.Parameter]]]
    # every module and every parameter of the model, once each: what `borrowed` sets and restores
    modules: list = field(default_factory=list, repr=False)
    all_params: list = field(default_factory=list, repr=False)
    plans: dict = field(default_factory=dict, repr=False)  # method -> what it builds once per selection


# model -> {params key: (model fingerprint, ParamSelection)}
_SELECTIONS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def selection_for(model: nn.Module, params) -> ParamSelection:
    """`select_params`, built once per (model, params) and reused while the model's modules,
    parameters and requires_grad flags stay the same (plans hang off the selection)."""
    key = (params,) if params is None or isinstance(params, str) else tuple(params)
    fingerprint = _structure(model)
    per_model = _SELECTIONS.get(model)
    known = None if per_model is None else per_model.get(key)
    if known is None or known[0] != fingerprint:
        known = _SELECTIONS.setdefault(model, {})[key] = (fingerprint, select_params(model, params))
    return known[1]


def _structure(model: nn.Module) -> tuple[list, list]:
    """Every module and parameter of the model once (ids, in model.modules() order) with the
    parameters' requires_grad flags: what a selection is built from. One walk over `_modules`,
    without the names model.modules() and model.parameters() build (a fifth of their cost)."""
    modules, params, seen = [], [], set()
    todo = [model]
    while todo:
        module = todo.pop()
        if module is None or id(module) in seen:
            continue
        seen.add(id(module))
        modules.append(id(module))
        for p in module._parameters.values():
            if p is not None:
                params.append(id(p))
                params.append(p.requires_grad)
        if module._modules:
            todo += reversed(module._modules.values())
    return modules, params


def _module_matches(module_name: str, patterns: list[str]) -> bool:
    for pattern in patterns:
        if fnmatch.fnmatchcase(module_name, pattern):
            return True
        if module_name == pattern or module_name.startswith(pattern + "."):
            return True  # "layer4" selects everything inside layer4
    return False


def select_params(model: nn.Module, params: list[str] | str | None) -> ParamSelection:
    """`None` selects every parameter with requires_grad; patterns select modules' parameters.

    A pattern matches a module name with shell wildcards (`"layer4.*"`), or a module and all its
    children (`"layer4"`); a full parameter name (`"fc.weight"`) selects just that parameter.
    """
    if isinstance(params, str):
        params = [params]
    # one walk: (module name, module, its own parameters), tied modules and parameters included
    walk = [(name, module, [(attr, p) for attr, p in module._parameters.items() if p is not None])
            for name, module in model.named_modules(remove_duplicate=False)]
    chosen: dict[int, nn.Parameter] = {}
    if params is None:
        chosen = {id(p): p for _, _, own in walk for _, p in own if p.requires_grad}
    else:
        for pattern in params:
            hits = [p for mod_name, _, own in walk for attr, p in own
                    if _param_matches(f"{mod_name}.{attr}" if mod_name else attr, mod_name, pattern)]
            if not hits:
                raise ValueError(f"--layers pattern '{pattern}' matches no module or parameter of the model")
            chosen.update((id(p), p) for p in hits)
    if not chosen:
        raise ValueError("no parameters are selected: the model has no parameter with requires_grad")

    names, plist, seen = [], [], set()
    owners: dict[str, list[tuple[str, nn.Parameter]]] = {}
    for mod_name, _, own in walk:
        for attr, p in own:
            if id(p) not in chosen:
                continue
            owners.setdefault(mod_name, []).append((attr, p))
            if id(p) not in seen:  # its first name, as model.named_parameters() gives it
                seen.add(id(p))
                names.append(f"{mod_name}.{attr}" if mod_name else attr)
                plist.append(p)
    modules = list({id(m): m for _, m, _ in walk}.values())
    every = list({id(p): p for _, _, own in walk for _, p in own}.values())
    return ParamSelection(names, plist, owners, modules, every)


def _param_matches(param_name: str, module_name: str, pattern: str) -> bool:
    return (param_name == pattern or fnmatch.fnmatchcase(param_name, pattern)
            or _module_matches(module_name, [pattern]))
