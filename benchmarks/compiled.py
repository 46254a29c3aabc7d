"""`--compile` against the plain ghost call (issue 23), side by side in one process.

Per model (benchmarks/gradnorm.py's cases): the first compiled call (the compile itself), the
steady call ÷ the floor (one plain forward+backward of the summed loss) for ghost and ghost with
`compile=True`, timed interleaved round by round, and what a steady call launches: top-level
aten ops and inductor's fused kernels, views left out (torch.profiler; on CUDA, the kernel and
CUDA-graph launches themselves). `--egl K` asks for K target sets (egl over K classes) instead of
the one set of labels.

    python benchmarks/compiled.py [--models simple,resnet18,...] [--rounds 15] [--egl 10] [--device cuda]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import warnings

import torch
import torch._inductor.config

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from alcli.gradnorm import grad_norms_per_target  # noqa: E402
from call_cost import interleaved_times  # noqa: E402
from gradnorm import build_case, floor_fn, sync, timed  # noqa: E402

MODELS = ("simple", "simple-conv2", "mlp", "resnet18", "transformer", "bert-small", "lstm")
VIEWS = {"expand", "view", "select", "detach", "t", "_unsafe_view", "unsqueeze", "squeeze", "alias",
         "permute", "transpose", "as_strided", "slice", "unflatten", "flatten", "movedim", "split",
         "unbind", "narrow", "diagonal", "reshape", "_reshape_alias", "expand_as", "view_as", "numpy_T"}
LAUNCHES = ("cudaLaunchKernel", "cuLaunchKernel", "cudaGraphLaunch", "cudaLaunchKernelExC", "cuLaunchKernelEx")
warnings.filterwarnings("ignore")
torch._inductor.config.cpp.enable_kernel_profile = True  # fused CPU kernels show in the profiler


def engine_fn(case, k: int, compile: bool):
    def targets(logits):
        return list(logits.argsort(1, descending=True).T[:k]) if k > 1 else [case.targets]
    return lambda: grad_norms_per_target(case.model, case.inputs, targets, params=case.params,
                                         compile=compile)[0]


def launched(fn, device) -> int:
    """What one steady call launches: CUDA kernel and graph launches on CUDA; elsewhere top-level
    aten ops (not views) and inductor's fused kernels."""
    fn()
    fn()
    sync(device)
    with torch.profiler.profile() as prof:
        fn()
        sync(device)
    events = prof.events()
    if device.type == "cuda":
        return sum(e.name in LAUNCHES for e in events)

    def outermost(e):
        p = e.cpu_parent
        while p is not None:
            if p.name.startswith("aten::") or "cpp_fused" in p.name:
                return False
            p = p.cpu_parent
        return True
    return sum(1 for e in events if outermost(e) and (
        "cpp_fused" in e.name or (e.name.startswith("aten::") and e.name[6:] not in VIEWS)))


def compare(case, device, k: int, rounds: int) -> dict:
    """The first compiled call (s), steady ghost and compiled calls ÷ the floor and in ms (median
    of interleaved rounds), and what a steady call of each launches."""
    eager, compiled = engine_fn(case, k, False), engine_fn(case, k, True)
    _, compile_s = timed(compiled, device)
    diff = (compiled().double() - eager().double()).abs().max() / eager().double().abs().max()
    if diff > 1e-4:
        raise SystemExit(f"{case.name}: the compiled norms differ from ghost's by {diff:.3g} (relative)")

    def synced(fn):
        def run():
            fn()
            sync(device)
        return run
    reps = 10 if case.name.startswith("simple") or case.name == "mlp" else 2
    times = interleaved_times({"floor": synced(floor_fn(case)), "ghost": synced(eager), "compiled": synced(compiled)},
                              rounds, reps)
    ratio = {k: statistics.median(t / f for t, f in zip(v, times["floor"])) for k, v in times.items()}
    return {"compile s": compile_s, "ghost": ratio["ghost"], "compiled": ratio["compiled"],
            "ghost ms": 1e3 * statistics.median(times["ghost"]), "compiled ms": 1e3 * statistics.median(times["compiled"]),
            "launches ghost": launched(eager, device), "launches compiled": launched(compiled, device)}


HEADER = (f"{'model':<14} {'compile s':>10} {'ghost':>8} {'compiled':>9} {'ghost ms':>9} {'compiled ms':>12} "
          f"{'launches ghost':>15} {'compiled':>9}")


def row(name: str, r: dict) -> str:
    return (f"{name:<14} {r['compile s']:>10.1f} {r['ghost']:>7.2f}x {r['compiled']:>8.2f}x {r['ghost ms']:>9.2f} "
            f"{r['compiled ms']:>12.2f} {r['launches ghost']:>15} {r['launches compiled']:>9}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--egl", type=int, default=1, metavar="K", help="target sets per call (1: the labels)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (0: torch's default)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    print(f"torch {torch.__version__}, device {device}, threads {torch.get_num_threads()}, "
          f"{args.egl} target set(s) per call, {args.rounds} rounds")
    print(HEADER)
    for name in args.models.split(","):
        print(row(name, compare(build_case(name, device), device, args.egl, args.rounds)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
