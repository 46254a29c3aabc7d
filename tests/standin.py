"""A stand-in device for the CPU-only suite: PyTorch's `meta` device, watched by a dispatch mode.

A model's first batch runs on the CPU (the engine may probe there: layouts, checks, what `auto`
settles on); then the model moves to `meta`, where tensors have shapes and devices but no data,
and every later batch runs under `DeviceWatch`, which fails on

- an op mixing tensors of different devices (a CPU accumulator added to a device result), and
- a host sync: an op whose output depends on the data on the host (`item`, `_local_scalar_dense`,
  `equal`, `is_nonzero`), an op whose output shape depends on the data (`nonzero`, boolean
  masking), or a copy from the device to the CPU.

The runner brings each batch's rows home in one copy; `allow_copies_home=True` lets copies to the
CPU through (as zeros: meta has no data to copy) and counts them, so a test can hold the runner
to one per batch.
"""
from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

DEVICE = torch.device("meta")


class DeviceWatch(TorchDispatchMode):
    def __init__(self, allow_copies_home: bool = False):
        super().__init__()
        self.allow_copies_home = allow_copies_home
        self.copies_home = 0
        self.ops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        self.ops += 1
        name = func.overloadpacket.__name__
        devices = {t.device for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)}
        if len(devices) > 1 and func is not torch.ops.aten.copy_.default and name != "_to_copy":
            raise AssertionError(f"aten.{name} mixes devices {sorted(map(str, devices))}")
        on_device = any(d.type != "cpu" for d in devices)  # the same ops on CPU tensors wait for nothing
        if on_device and (torch.Tag.data_dependent_output in func.tags or torch.Tag.dynamic_output_shape in func.tags
                          or name in ("item", "_local_scalar_dense", "nonzero", "equal", "is_nonzero")):
            raise AssertionError(f"aten.{name} syncs with the host")
        if self._copy_home(func, args, kwargs, devices):
            if not self.allow_copies_home:
                raise AssertionError(f"aten.{name} copies from the device to the host")
            self.copies_home += 1
            out = args[0] if func is torch.ops.aten.copy_.default else None
            if out is not None:
                return out  # the pinned host buffer, left as it is (meta has no data)
            src = args[0]
            return torch.zeros(src.shape, dtype=kwargs.get("dtype") or src.dtype, device="cpu")
        return func(*args, **kwargs)

    @staticmethod
    def _copy_home(func, args, kwargs, devices) -> bool:
        if func is torch.ops.aten.copy_.default:
            return args[0].device.type == "cpu" and args[1].device.type != "cpu"
        if func.overloadpacket.__name__ == "_to_copy":
            target = kwargs.get("device")
            return target is not None and torch.device(target).type == "cpu" and args[0].device.type != "cpu"
        return False


def to_standin(model: torch.nn.Module) -> torch.nn.Module:
    """The same module objects (so the engine's per-model caches carry over), tensors on meta."""
    return model.to(DEVICE)


def standin(x):
    """A tensor with x's shape and dtype on the stand-in device."""
    return torch.empty(x.shape, dtype=x.dtype, device=DEVICE)
