"""How many target sets one vmapped backward should take (ghost.VMAP_ELEMENTS), side by side in
one process: EGL's K target sets through ghost with each limit on K x the largest tapped output's
elements (a limit of 1: one backward per target set; 2^40: all K in one vmapped backward).

Cases: the classification models of benchmarks/gradnorm.py at batch 64 with their 10 classes
(`simple`, `mlp`, `transformer`, `resnet18`), and the task models of benchmarks/tasks.py with
8 sampled label sets (`tok:B:T` BERT-small token classification, `seg:B:S` fcn_resnet50).
Rounds interleave the limits; medians in seconds; every limit's norms are checked equal.

    python benchmarks/egl_chunks.py [--cases simple,resnet18,seg:4:64] [--limits 40,21,0] [--rounds 3]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # this checkout's alcli

from alcli.gradnorm import ghost, grad_norms_per_target  # noqa: E402
from alcli.score import tasks  # noqa: E402


def egl_call(name: str):
    """() -> [B] EGL norms of the first target set for case `name`."""
    if name.startswith(("seg:", "tok:")):
        import tasks as task_bench
        kind, batch, size = name.split(":")
        task = {"seg": "segmentation", "tok": "token-classification"}[kind]
        model, x = task_bench.MODELS[task](int(batch), int(size))
        ids = list(range(int(batch)))
        return lambda: grad_norms_per_target(
            model, x, lambda z: tasks.sampled(task, z, tasks.valid_positions(task, z, x), ids, 8, 0),
            method="ghost", loss_fn=tasks.TASKS[task].loss)[0]
    from gradnorm import build_case
    case = build_case(name, torch.device("cpu"))
    return lambda: grad_norms_per_target(case.model, case.inputs,
                                         lambda z: list(z.argsort(1, descending=True)[:, :10].T),
                                         method="ghost")[0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default="simple,mlp,transformer,resnet18,tok:32:64,seg:4:64")
    ap.add_argument("--limits", default="40,24,22,21,20,0", help="log2 of VMAP_ELEMENTS values")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    limits = [int(v) for v in args.limits.split(",")]
    print(f"torch {torch.__version__}, CPU, {torch.get_num_threads()} threads, {args.rounds} rounds, "
          f"median seconds per EGL call; columns: log2(VMAP_ELEMENTS), 0 = one backward per target set")
    print(f"{'case':14} " + " ".join(f"{'2^' + str(v):>9}" for v in limits))
    for name in args.cases.split(","):
        run = egl_call(name)
        reference = run()  # warm-up: ghost's probes
        times: dict[int, list] = {v: [] for v in limits}
        for r in range(args.rounds):
            for v in limits[r % len(limits):] + limits[:r % len(limits)]:
                ghost.VMAP_ELEMENTS = 2 ** v
                start = time.perf_counter()
                norms = run()
                times[v].append(time.perf_counter() - start)
                torch.testing.assert_close(norms, reference, rtol=1e-4, atol=0)
        print(f"{name:14} " + " ".join(f"{statistics.median(times[v]):9.4f}" for v in limits), flush=True)


if __name__ == "__main__":
    main()
