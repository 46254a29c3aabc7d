"""Catch parameters used where the method cannot see them.

Ghost rules see a parameter only through the calls of the module that owns it (or whose rule
claims it); replicate swaps in per-example copies only inside those modules. A forward that
uses the parameter elsewhere (a parent computing `h @ self.embed.weight.T`) would be silently
missed, so the first forward of a model runs under this watch and such a use is an error.
"""
from __future__ import annotations

from typing import Callable

import torch
from torch.overrides import TorchFunctionMode

from .errors import UnsupportedModel


class UseWatch(TorchFunctionMode):
    """`covered`: parameter id -> (name, modules allowed to use it); `stack`: running modules.
    A use with none of those modules running calls `on_outside(parameter id, entry)`, which by
    default raises UnsupportedModel."""

    def __init__(self, covered: dict, stack: list, on_outside=None):
        super().__init__()
        self.covered = covered
        self.stack = stack
        self.on_outside = on_outside or self._refuse

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if _op_name(func) not in METADATA:
            for leaf in _shallow_tensors(args, kwargs):
                entry = self.covered.get(id(leaf))
                if entry is not None and not entry[1].intersection(self.stack):
                    self.on_outside(id(leaf), entry)
        return func(*args, **kwargs)

    def _refuse(self, pid, entry):
        where = self.stack[-1] if self.stack else ""
        raise UnsupportedModel(f"parameter '{entry[0]}' is used outside the module that owns "
                               f"it (in {repr(where) if where else 'the root module'})")


# reading these from a parameter is not a use of its value
METADATA = {"shape", "device", "dtype", "requires_grad", "is_nested", "is_cuda", "is_leaf", "layout",
            "ndim", "grad", "grad_fn", "data", "is_sparse", "is_quantized", "is_meta", "names",
            "size", "dim", "numel", "stride", "is_floating_point", "is_complex", "element_size",
            "is_contiguous", "data_ptr", "storage_offset", "__len__", "__hash__", "__format__"}


def _op_name(func) -> str:
    name = getattr(func, "__name__", "")
    if name == "__get__":  # a property such as Tensor.shape or Tensor.T
        return getattr(getattr(func, "__self__", None), "__name__", name)
    return name


def _shallow_tensors(args, kwargs):
    for value in (*args, *kwargs.values()):
        if isinstance(value, torch.Tensor):
            yield value
        elif isinstance(value, (list, tuple)):
            yield from (v for v in value if isinstance(v, torch.Tensor))


def outside_uses(covered: dict, names: list) -> tuple[Callable, dict[int, str | None]]:
    """(note, found): note(args) records, in `found`, every parameter among `args` (an op's
    arguments, lists of tensors included) used with none of its covering modules running
    (`names`: the running modules): parameter id -> name of the module whose own forward uses it,
    the innermost running module that is an ancestor of all its covering modules (never the
    root), or None for a use in the root or in two such modules. The first example's forward
    calls it for every aten op (layout._DataDependentShapes); after it, {} means there is no
    outside use."""
    found: dict[int, str | None] = {}

    def record(pid, entry):
        owners = [n for n in names if n and all(m.startswith(n + ".") for m in entry[1])]
        user = owners[-1] if owners else None
        found[pid] = user if found.get(pid, user) == user else None

    def note(args):
        for arg in args:
            entry = covered.get(id(arg))
            if entry is not None:
                if not entry[1].intersection(names):
                    record(id(arg), entry)
            elif isinstance(arg, (list, tuple)):  # torch.cat's tensors
                note(arg)

    return note, found


class ModuleStack:
    """Tracks which modules are running (outermost first), to name the one where an error arose."""

    def __init__(self, model):
        self.model = model
        self.names: list[str] = []
        self.handles = []

    def __enter__(self):
        if isinstance(self.model, torch.jit.ScriptModule):
            return self  # takes no hooks; errors then name the root module
        for name, module in self.model.named_modules():
            self.handles.append(module.register_forward_pre_hook(self._push(name)))
            self.handles.append(module.register_forward_hook(self._pop))
        return self

    def __exit__(self, *exc):
        for handle in self.handles:
            handle.remove()
        return False

    def _push(self, name):
        def hook(module, args):
            self.names.append(name)
        return hook

    def _pop(self, module, args, output):
        self.names.pop()

    def where(self) -> str:
        """The innermost module running, as "module 'name' (Type)"."""
        if not self.names or not self.names[-1]:
            return "the root module"
        name = self.names[-1]
        return f"module '{name}' ({type(self.model.get_submodule(name)).__name__})"
