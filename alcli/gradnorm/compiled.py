"""`--compile`: a function torch.compile'd once per device type, its graphs reused while the
guards hold (same plan, shapes and dtypes); a new model or input shape compiles another graph."""
from __future__ import annotations

import torch

# graphs kept per compiled function: one per (model, input signature) in a run; past the limit
# torch runs the function uncompiled (exact; its ops then run one by one)
RECOMPILE_LIMIT = 64
# on CUDA the graph replays as a CUDA graph: one launch for all its kernels (fixed shapes)
CUDA_MODE = "reduce-overhead"

_compiled: dict = {}


def compile_once(fn, device: torch.device):
    """`fn` compiled for `device`'s type; what it returns is the caller's to keep."""
    key = (fn, device.type)
    if key not in _compiled:
        cuda = device.type == "cuda"
        compiled = torch.compile(fn, mode=CUDA_MODE if cuda else None)

        def run(*args):
            with torch._dynamo.config.patch(recompile_limit=RECOMPILE_LIMIT):
                out = compiled(*args)
            # a CUDA graph's output is overwritten by its next replay
            return out.clone() if cuda else out
        _compiled[key] = run
    return _compiled[key]
