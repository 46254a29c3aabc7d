"""Selection at scale: `--sampling power` (one key per row, one top-k) against BADGE's k-means++
(alcli.selection.diverse) for n candidates and a batch of k: time and peak memory of the choice
alone (time untraced; then the Python heap's peak in a second, traced run: tensors' storage is
not in it, so the peak RSS is shown too), side by side in one process.

    python benchmarks/sampling.py [--n 1000000] [--k 10000] [--badge-n 20000 100000] [--classes 10 --dim 64]

BADGE over all n at n = 1M and k = 10k takes k passes over n rows of (C + D) factors; it is timed
at the smaller --badge-n sizes and the time per (candidate x pick) is given, so the full size can
be read off.
"""
from __future__ import annotations

import argparse
import resource
import time
import tracemalloc

import torch

from alcli.selection.diverse import select_diverse
from alcli.selection.sampling import sample


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
    args = ap.parse_args()
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


if __name__ == "__main__":
    main()
