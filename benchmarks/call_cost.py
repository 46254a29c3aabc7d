"""The cost that is not arithmetic (issue 23): first calls, ops per call, and where a call's time goes.

Per model (the seed's SimpleModel, its conv2 alone, resnet18, BERT-small, the LSTM classifier of
benchmarks/gradnorm.py, batches as there):

- **first call ÷ steady call**: each round deep-copies the model (a new module object, so every
  per-model cache is cold: the plan, the layout probes, the use watch), times its first
  per-example gradient norm call, then the median of 3 later calls; the median over rounds.
- **ops per call**: aten ops a steady call dispatches (all, and those a GPU would launch as
  kernels: views, detach and alias not counted), beside one plain forward+backward of the summed
  loss.
- **a steady call by phase**: forward with taps, cotangents, backward, rules, combining, the rest.
- **where a steady call's time goes**: wall time, the time inside aten ops (torch.profiler), and
  the rest (Python: alcli's, nn.Module's, hooks; the dispatcher), for alcli and the plain pass.

    python benchmarks/call_cost.py [--models simple,resnet18,...] [--rounds 5] [--device cuda]
"""
from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import time
import warnings

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from alcli.gradnorm import per_example_grad_norms  # noqa: E402
from gradnorm import OpCounter, build_case, floor_fn, sync  # noqa: E402

MODELS = ("simple", "simple-conv2", "resnet18", "bert-small", "lstm")
warnings.filterwarnings("ignore")


def norms_fn(case, model):
    return lambda: per_example_grad_norms(model, case.inputs, case.targets, params=case.params)


def first_vs_steady(case, device, rounds: int) -> dict:
    ratios, firsts, steadies = [], [], []
    for _ in range(rounds):
        model = copy.deepcopy(case.model)
        run = norms_fn(case, model)
        sync(device)
        start = time.perf_counter()
        run()
        sync(device)
        first = time.perf_counter() - start
        later = []
        for _ in range(3):
            start = time.perf_counter()
            run()
            sync(device)
            later.append(time.perf_counter() - start)
        steady = statistics.median(later)
        ratios.append(first / steady)
        firsts.append(first)
        steadies.append(steady)
    return {"first_ms": 1e3 * statistics.median(firsts), "steady_ms": 1e3 * statistics.median(steadies),
            "first_x_steady": statistics.median(ratios)}


def op_counts(fn) -> tuple[int, int]:
    """(kernels, all aten dispatches) of one call after two warm-up calls."""
    fn()
    fn()
    with OpCounter() as kernels, OpCounter(every=True) as every:
        fn()
    return kernels.count, every.count


def wall_times(fn, device, calls: int) -> list[float]:
    """Seconds per call of `fn`, one figure per run of `calls` calls, 5 runs after a warm-up call."""
    fn()
    walls = []
    for _ in range(5):
        sync(device)
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        sync(device)
        walls.append((time.perf_counter() - start) / calls)
    return walls


CLOCKS = {"wall": time.perf_counter, "cpu": time.thread_time}  # cpu: this thread's CPU time, which
# other jobs on a loaded machine do not add to (torch at one thread computes on the calling thread)


def interleaved_times(fns: dict, rounds: int, reps: int, clock=time.perf_counter) -> dict[str, list[float]]:
    """Seconds per call of each of `fns`, one figure per round of `reps` calls: every round runs
    every function, in an order rotated each round, so a CPU whose speed drifts slows all alike.
    `clock`: one of CLOCKS."""
    times = {name: [] for name in fns}
    order = list(fns)
    for r in range(rounds):
        shift = r % len(order)
        for name in order[shift:] + order[:shift]:
            start = clock()
            for _ in range(reps):
                fns[name]()
            times[name].append((clock() - start) / reps)
    return times


def where_time_goes(fn, device, calls: int = 20) -> dict:
    """Microseconds per call: the wall time (no profiler; median of 5 runs of `calls`), the time
    inside aten ops (torch.profiler's self CPU time of every aten op, summed: the arithmetic and
    its kernels' own set-up; on CUDA, the launches), and the rest: Python (alcli's, nn.Module's,
    hooks) and the dispatcher between ops."""
    from torch.profiler import ProfilerActivity, profile
    walls = wall_times(fn, device, calls)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(calls):
            fn()
    in_ops = sum(e.self_cpu_time_total for e in prof.key_averages() if e.key.startswith("aten::")) / calls
    wall = 1e6 * statistics.median(walls)
    return {"wall": wall, "in aten ops": in_ops, "rest (Python, dispatch)": max(wall - in_ops, 0.0)}


def phases(fn, device, calls: int = 50) -> dict:
    """Microseconds per steady ghost call, by phase (timers around the engine's steps; a call's
    wall time, without timers, beside them):
    forward (the model's forward with the hooks and taps), cotangents (the loss gradient at the
    logits), backward (autograd from the logits into the taps, without the rules run inside it),
    rules (the layer rules, run as each tap's gradient arrives), combine (squared norms summed
    into [B] norms) and the rest (entry point, selection, borrowing the model, layout lookup,
    hook registration, bookkeeping)."""
    from alcli.gradnorm import ghost
    spent = dict.fromkeys(("forward", "cotangents", "autograd", "rules", "combine"), 0.0)

    def timed(name, inner):
        def wrapper(*args, **kwargs):
            sync(device)
            start = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                sync(device)
                spent[name] += time.perf_counter() - start
        return wrapper

    walls = wall_times(fn, device, calls)
    patches = [(ghost, "forward_logits", "forward"), (ghost, "_cotangents", "cotangents"),
               (torch.autograd, "grad", "autograd"), (ghost._Pass, "_run", "rules"),
               (ghost._Pass, "finish", "combine")]
    saved = [(owner, attr, getattr(owner, attr)) for owner, attr, _ in patches]
    try:
        for owner, attr, name in patches:
            setattr(owner, attr, timed(name, getattr(owner, attr)))
        fn()
        spent.update(dict.fromkeys(spent, 0.0))
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        total = time.perf_counter() - start
    finally:
        for owner, attr, inner in saved:
            setattr(owner, attr, inner)
    per_call = {name: 1e6 * t / calls for name, t in spent.items()}
    per_call["backward"] = per_call.pop("autograd") - per_call["rules"]  # the rules run inside it
    per_call["rest"] = 1e6 * total / calls - sum(per_call.values())
    return {"wall": 1e6 * statistics.median(walls), **{k: per_call[k] for k in
            ("forward", "cotangents", "backward", "rules", "combine", "rest")}}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    print(f"torch {torch.__version__}, device {device}, threads {torch.get_num_threads()}")
    print(f"{'model':<14} {'first ms':>9} {'steady ms':>10} {'first/steady':>13} "
          f"{'kernels plain':>14} {'kernels alcli':>14} {'dispatches plain':>17} {'dispatches alcli':>17}")
    profiles = {}
    for name in args.models.split(","):
        case = build_case(name, device)
        timing = first_vs_steady(case, device, args.rounds)
        plain_k, plain_all = op_counts(floor_fn(case))
        ours_k, ours_all = op_counts(norms_fn(case, case.model))
        print(f"{name:<14} {timing['first_ms']:>9.1f} {timing['steady_ms']:>10.2f} "
              f"{timing['first_x_steady']:>12.2f}x {plain_k:>14} {ours_k:>14} {plain_all:>17} {ours_all:>17}")
        profiles[name] = {"plain": where_time_goes(floor_fn(case), device),
                          "alcli": where_time_goes(norms_fn(case, case.model), device)}
    print("\na steady ghost call by phase, us per call (timers around the engine's steps; wall: without them)")
    print(f"{'model':<14} {'wall':>8} " + " ".join(f"{k:>10}" for k in
          ("forward", "cotangents", "backward", "rules", "combine", "rest")))
    for name in args.models.split(","):
        case = build_case(name, device)
        parts = phases(norms_fn(case, case.model), device)
        print(f"{name:<14} " + " ".join(f"{v:>{8 if k == 'wall' else 10}.0f}" for k, v in parts.items()))
    print("\nwhere a steady call's time goes, us per call (aten ops: torch.profiler's self time)")
    print(f"{'model':<14} {'':>6} {'wall':>9} {'in aten ops':>12} {'rest (Python, dispatch)':>24}")
    for name, both in profiles.items():
        for who, parts in both.items():
            print(f"{name:<14} {who:>6} " + " ".join(f"{v:>{w}.0f}" for v, w in zip(parts.values(), (9, 12, 24))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
