"""Each call of chosen modules, seen from Python: their forwards wrapped for one forward pass
(no hook machinery in Module.__call__, about 10 µs per module and call on a CPU) and put back
after. Ghost taps its modules' outputs through it; the layout probes record their calls."""
from __future__ import annotations

from contextlib import contextmanager

import torch


@contextmanager
def each_call(modules: dict, after, before=None):
    """`after(name, args, kwargs, output)` after each call of each of `modules` (name -> module),
    its result, when not None, the call's output; `before(name)` before it. A forward already an
    attribute of the module (another wrapper, set for this pass) is wrapped and put back after.
    A TorchScript module takes forward hooks instead."""
    handles, patched = [], []
    try:
        for name, module in modules.items():
            if isinstance(module, torch.jit.ScriptModule):
                if before is not None:
                    handles.append(module.register_forward_pre_hook(lambda m, a, name=name: before(name)))
                handles.append(module.register_forward_hook(
                    lambda m, a, k, out, name=name: after(name, a, k, out), with_kwargs=True))
                continue
            patched.append((module, module.__dict__.get("forward")))
            module.__dict__["forward"] = _wrapped(module.forward, name, after, before)
        yield
    finally:
        for handle in handles:
            handle.remove()
        for module, own in reversed(patched):
            if own is None:
                del module.__dict__["forward"]
            else:
                module.__dict__["forward"] = own


def _wrapped(forward, name, after, before):
    def call(*args, **kwargs):
        if before is not None:
            before(name)
        output = forward(*args, **kwargs)
        replaced = after(name, args, kwargs, output)
        return output if replaced is None else replaced
    return call
