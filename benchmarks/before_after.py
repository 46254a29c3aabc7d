"""Another checkout's engine against this one's, interleaved in one process (issue 23).

Two separate runs on a shared or throttled CPU differ by more than the changes being measured, so
this imports the other checkout's `alcli` package under the name `alcli_before` (its imports are
relative) and times, per model of benchmarks/gradnorm.py, the floor (a plain forward+backward of
the summed loss), the other engine and this one in rotating order, round after round:

- steady call ÷ floor, the median over rounds of each round's ratio;
- first call ÷ steady call on fresh deep copies (every per-model cache cold), alternating which
  engine goes first (`--first-rounds` copies each);
- aten dispatches and kernels of a steady call (call_cost.op_counts).

Both engines' norms are checked against each other first (rtol 1e-4).

    git worktree add /tmp/before <commit>
    python benchmarks/before_after.py --before /tmp/before [--models simple,lstm] [--rounds 15]
"""
from __future__ import annotations

import argparse
import copy
import importlib
import os
import shutil
import statistics
import sys
import tempfile
import time
import warnings

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from call_cost import CLOCKS, interleaved_times, op_counts  # noqa: E402
from gradnorm import build_case, floor_fn  # noqa: E402

warnings.filterwarnings("ignore")
MODELS = ("simple", "simple-conv2", "lstm", "bert-small", "mlp", "transformer")


def import_before(checkout: str):
    """The other checkout's alcli.gradnorm, imported as alcli_before.gradnorm."""
    where = tempfile.mkdtemp(prefix="alcli-before-")
    shutil.copytree(os.path.join(checkout, "alcli"), os.path.join(where, "alcli_before"))
    sys.path.insert(0, where)
    return importlib.import_module("alcli_before.gradnorm")


def compare(name: str, engines: dict, rounds: int, first_rounds: int | None = None, clock=time.perf_counter) -> dict:
    case = build_case(name, torch.device("cpu"))
    models = {who: copy.deepcopy(case.model) for who in engines}
    fns = {"floor": floor_fn(case)}
    for who, engine in engines.items():
        fns[who] = (lambda e, m: lambda: e.per_example_grad_norms(m, case.inputs, case.targets,
                                                                  params=case.params))(engine, models[who])
    before, after = (fns[who]().double() for who in engines)
    if not torch.allclose(before, after, rtol=1e-4):
        raise SystemExit(f"{name}: the two engines disagree (max abs diff {(before - after).abs().max():.3g})")
    for fn in fns.values():
        fn()
    start = time.perf_counter()
    fns["floor"]()
    reps = max(1, int(0.05 / (time.perf_counter() - start)))  # ~50 ms per timed sample
    times = interleaved_times(fns, rounds, reps, clock)
    firsts = {who: [] for who in engines}
    for r in range(first_rounds or max(3, rounds // 3)):
        for who in (list(engines) if r % 2 == 0 else list(engines)[::-1]):
            model = copy.deepcopy(case.model)
            run = lambda: engines[who].per_example_grad_norms(model, case.inputs, case.targets,  # noqa: E731
                                                              params=case.params)
            start = clock()
            run()
            first = clock() - start
            later = []
            for _ in range(3):
                start = clock()
                run()
                later.append(clock() - start)
            firsts[who].append(first / statistics.median(later))
    row = {"floor ms": 1e3 * statistics.median(times["floor"])}
    for who in engines:
        row[f"{who} ÷ floor"] = statistics.median(t / f for t, f in zip(times[who], times["floor"]))
    for who in engines:
        row[f"{who} first ÷ steady"] = statistics.median(firsts[who])
    for who in engines:
        row[f"{who} kernels"], row[f"{who} dispatches"] = op_counts(fns[who])
    return row


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--before", required=True, help="the other checkout (a git worktree)")
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--first-rounds", type=int, default=None,
                        help="fresh copies per engine for first ÷ steady (default: rounds / 3, at least 3)")
    parser.add_argument("--clock", choices=sorted(CLOCKS), default="wall",
                        help="wall time, or this thread's CPU time (steadier on a loaded machine)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    engines = {"before": import_before(args.before), "after": importlib.import_module("alcli.gradnorm")}
    print(f"torch {torch.__version__}, cpu, {torch.get_num_threads()} threads, {args.clock} clock; before: {args.before}")
    for name in args.models.split(","):
        row = compare(name, engines, args.rounds, args.first_rounds, CLOCKS[args.clock])
        print(f"{name:<13} " + "  ".join(f"{k} {v:.2f}" + ("x" if "÷" in k else "") if isinstance(v, float)
                                         else f"{k} {v}" for k, v in row.items()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
