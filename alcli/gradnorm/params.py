"""Resolve the `params=` selection into parameters and the modules that own them."""
from __future__ import annotations

import fnmatch
from dataclasses import dataclass

from torch import nn


@dataclass
class Selection:
    """The selected parameters, keyed by their first name in `model.named_parameters()`."""

    names: list[str]  # e.g. ["conv2.weight"]
    params: list[nn.Parameter]
    # owner module name -> [(attribute name, parameter)] for every module that directly owns a
    # selected parameter (a tied parameter appears under each module that holds it)
    owners: dict[str, list[tuple[str, nn.Parameter]]]


def _module_matches(module_name: str, patterns: list[str]) -> bool:
    for pattern in patterns:
        if fnmatch.fnmatchcase(module_name, pattern):
            return True
        if module_name == pattern or module_name.startswith(pattern + "."):
            return True  # "layer4" selects everything inside layer4
    return False


def select_params(model: nn.Module, params: list[str] | str | None) -> Selection:
    """`None` selects every parameter with requires_grad; patterns select modules' parameters.

    A pattern matches a module name with shell wildcards (`"layer4.*"`), or a module and all its
    children (`"layer4"`); a full parameter name (`"fc.weight"`) selects just that parameter.
    """
    if isinstance(params, str):
        params = [params]
    chosen: dict[int, nn.Parameter] = {}
    if params is None:
        for p in model.parameters():
            if p.requires_grad:
                chosen[id(p)] = p
    else:
        param_names = dict(model.named_parameters(remove_duplicate=False))
        for pattern in params:
            hits = [p for name, p in param_names.items()
                    if name == pattern or fnmatch.fnmatchcase(name, pattern)
                    or _module_matches(name.rpartition(".")[0], [pattern])]
            if not hits:
                raise ValueError(f"--layers pattern '{pattern}' matches no module or parameter of the model")
            for p in hits:
                chosen[id(p)] = p
    if not chosen:
        raise ValueError("no parameters are selected: the model has no parameter with requires_grad")

    names, plist = [], []
    for name, p in model.named_parameters():
        if id(p) in chosen:
            names.append(name)
            plist.append(p)
    owners: dict[str, list[tuple[str, nn.Parameter]]] = {}
    for mod_name, module in model.named_modules(remove_duplicate=False):
        for attr, p in module.named_parameters(recurse=False):
            if id(p) in chosen:
                owners.setdefault(mod_name, []).append((attr, p))
    return Selection(names, plist, owners)
