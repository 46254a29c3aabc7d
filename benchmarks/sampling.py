"""Selection at scale: `--sampling power` (one key per row, one top-k) against BADGE's k-means++
(alcli.selection.diverse) for n candidates and a batch of k: time and peak memory of the choice
alone (time untraced; then the Python heap's peak in a second, traced run: tensors' storage is
not in it, so the peak RSS is shown too), side by side in one process.

    python benchmarks/sampling.py [--n 1000000] [--k 10000] [--badge-n 20000 100000] [--classes 10 --dim 64]

BADGE over all n at n = 1M and k = 10k takes k passes over n rows of (C + D) factors; it is timed
at the smaller --badge-n sizes and the time per (candidate x pick) is given, so the full size can
be read off.

    python benchmarks/sampling.py --grid [--grid-n 100000 1000000] [--grid-k 1000 10000]

runs each selection (power sampling; BADGE and Cluster-Margin with their default shortlist of
10 x k best scores) alone in a child process, one thread, and prints its time and the child's
peak RSS (benchmarks/_memory.py), input included (n ids, scores and factors).
"""
from __future__ import annotations

import argparse
import os
import resource
import sys
import time
import tracemalloc
from pathlib import Path

import torch

from alcli.selection.cluster_margin import select_cluster_margin
from alcli.selection.diverse import select_diverse
from alcli.selection.sampling import sample

GRID_METHODS = ("power", "badge", "cluster-margin")


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=1_000_000)
    ap.add_argument("--k", type=int, default=10_000)
    ap.add_argument("--badge-n", type=int, nargs="*", default=[20_000, 100_000])
    ap.add_argument("--badge-k", type=int, default=1000)
    ap.add_argument("--classes", type=int, default=10)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--grid", action="store_true", help="time and peak memory per child process")
    ap.add_argument("--grid-n", type=int, nargs="*", default=[100_000, 1_000_000])
    ap.add_argument("--grid-k", type=int, nargs="*", default=[1000, 10_000])
    ap.add_argument("--grid-methods", nargs="*", default=list(GRID_METHODS))
    ap.add_argument("--child", nargs=3, metavar=("METHOD", "N", "K"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(args.child[0], int(args.child[1]), int(args.child[2]), args.classes, args.dim)
    if args.grid:
        return grid(args)
    g = torch.Generator().manual_seed(0)
    scores = torch.rand(args.n, generator=g, dtype=torch.float64).tolist()
    rows = [{"id": f"ex{i:07d}", "score": s} for i, s in enumerate(scores)]
    print("| selection | n | k | seconds | peak Python heap (MB) | peak RSS so far (MB) |")
    print("|---|---|---|---|---|---|")
    for how in ("top", "power", "softmax"):
        start = time.perf_counter()
        batch = sample(rows, args.k, how, 1.0, 0)
        took = time.perf_counter() - start
        tracemalloc.start()  # a second run, for memory: tracing slows Python's allocations
        sample(rows, args.k, how, 1.0, 0)
        heap = tracemalloc.get_traced_memory()[1] / 2**20
        tracemalloc.stop()
        assert len(batch) == args.k
        print(f"| {how} | {args.n:,} | {args.k:,} | {took:.2f} | {heap:.0f} | {peak_rss_mb():.0f} |", flush=True)
    for n in args.badge_n:
        a = torch.randn(n, args.classes, generator=g)
        b = torch.randn(n, args.dim, generator=g)
        ids = [r["id"] for r in rows[:n]]
        start = time.perf_counter()
        picked = select_diverse(ids, scores[:n], a, b, args.badge_k, 0, candidates=n)
        took = time.perf_counter() - start
        tracemalloc.start()
        select_diverse(ids, scores[:n], a, b, args.badge_k, 0, candidates=n)
        heap = tracemalloc.get_traced_memory()[1] / 2**20
        tracemalloc.stop()
        assert len(picked) == args.badge_k
        per = took / (n * args.badge_k) * 1e9
        print(f"| BADGE (all candidates) | {n:,} | {args.badge_k:,} | {took:.2f} ({per:.1f} ns per candidate x pick; "
              f"n = {args.n:,}, k = {args.k:,}: about {per * args.n * args.k / 1e9 / 3600:.1f} h) | {heap:.0f} | "
              f"{peak_rss_mb():.0f} |", flush=True)


def child(method: str, n: int, k: int, classes: int, dim: int) -> None:
    """One selection of k among n random rows; prints its seconds (the input's build excluded)."""
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    scores = torch.rand(n, generator=g, dtype=torch.float64)
    ids = [f"ex{i:07d}" for i in range(n)]
    a = torch.softmax(3 * torch.randn(n, classes, generator=g), 1)  # stands in for p − onehot
    b = torch.relu(torch.randn(n, dim, generator=g))                 # [N, D] float32 features
    start = time.perf_counter()
    if method == "power":
        rows = [{"id": i, "score": s} for i, s in zip(ids, scores.tolist())]
        start = time.perf_counter()  # rows are the input sample() takes
        picked = sample(rows, k, "power", 1.0, 0)
    elif method == "badge":
        picked = select_diverse(ids, scores, a, b, k, 0)
    else:
        picked = select_cluster_margin(ids, scores, b, k, 0)
    took = time.perf_counter() - start
    assert len(picked) == k
    print(f"{took:.2f}")


def grid(args) -> None:
    sys.path.insert(0, str(Path(__file__).parent))
    from _memory import run_measured
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    print("| selection | n | k | seconds | peak RSS of the process (MB) |")
    print("|---|---|---|---|---|")
    for n in args.grid_n:
        for k in args.grid_k:
            for method in args.grid_methods:
                cmd = [sys.executable, __file__, "--child", method, str(n), str(k),
                       "--classes", str(args.classes), "--dim", str(args.dim)]
                done, _, rss = run_measured(cmd, env, Path.cwd())
                took = done.stdout.strip() if done.returncode == 0 else f"failed: {done.stderr[-200:]}"
                print(f"| {method} | {n:,} | {k:,} | {took} | {rss / 2**20:.0f} |", flush=True)


if __name__ == "__main__":
    main()
