"""How many target sets one vmapped backward should take (ghost.VMAP_ELEMENTS), side by side in
one process: EGL's K target sets through ghost with each limit on K x the largest tapped output's
elements (2^0: one backward per target set; all: all K in one vmapped backward).

Cases: the classification models of benchmarks/gradnorm.py at batch 64 with their 10 classes
(`simple`, `mlp`, `transformer`, `resnet18`), and the task models of benchmarks/tasks.py with
8 sampled label sets (`tok:B:T` BERT-small token classification, `seg:B:S` fcn_resnet50).
Rounds interleave the limits; medians in seconds; every limit's norms are checked equal.

    python benchmarks/egl_chunks.py [--cases simple,resnet18,seg:4:64] [--limits all,21,0] [--rounds 3]
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


def egl_call(name: str, device: torch.device = torch.device("cpu")):
    """() -> [B] EGL norms of the first target set for case `name`, on `device`."""
    if name.startswith(("seg:", "tok:")):
        import tasks as task_bench
        kind, batch, size = name.split(":")
        task = {"seg": "segmentation", "tok": "token-classification"}[kind]
        model, x = task_bench.build(task, int(batch), int(size), device)
        return lambda: task_bench.egl_norms(task, model, x)
    from gradnorm import build_case
    case = build_case(name, device)
    return lambda: grad_norms_per_target(case.model, case.inputs,
                                         lambda z: list(z.argsort(1, descending=True)[:, :10].T),
                                         method="ghost")[0]


def limits_table(cases: list[str], limits: list, rounds: int, device: torch.device, say) -> None:
    """Median seconds per EGL call for each case and each limit (log2 of the elements; None: all
    K in one vmapped backward), every limit's norms checked equal to the first's."""
    def label(v):
        return "all K" if v is None else f"2^{v}"
    say(f"{'case':14} " + " ".join(f"{label(v):>9}" for v in limits))
    defaults = ghost.VMAP_ELEMENTS, ghost.VMAP_ELEMENTS_CUDA
    try:
        for name in cases:
            run = egl_call(name, device)
            reference = run()  # warm-up: ghost's probes
            times: dict = {v: [] for v in limits}
            for r in range(rounds):
                for v in limits[r % len(limits):] + limits[:r % len(limits)]:
                    limit = None if v is None else 2 ** v
                    ghost.VMAP_ELEMENTS = ghost.VMAP_ELEMENTS_CUDA = limit
                    start = time.perf_counter()
                    norms = run()
                    if device.type == "cuda":
                        torch.cuda.synchronize()
                    times[v].append(time.perf_counter() - start)
                    torch.testing.assert_close(norms, reference, rtol=1e-4, atol=0)
            say(f"{name:14} " + " ".join(f"{statistics.median(times[v]):9.4f}" for v in limits))
    finally:
        ghost.VMAP_ELEMENTS, ghost.VMAP_ELEMENTS_CUDA = defaults


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default="simple,mlp,transformer,resnet18,tok:32:64,seg:4:64")
    ap.add_argument("--limits", default="all,24,22,21,20,0",
                    help="log2 of VMAP_ELEMENTS values; all: every target set in one vmapped backward")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    limits = [None if v == "all" else int(v) for v in args.limits.split(",")]
    print(f"torch {torch.__version__}, CPU, {torch.get_num_threads()} threads, {args.rounds} rounds, "
          f"median seconds per EGL call; columns: log2(VMAP_ELEMENTS), 0 = one backward per target set")
    limits_table(args.cases.split(","), limits, args.rounds, torch.device("cpu"), lambda line: print(line, flush=True))


if __name__ == "__main__":
    main()
