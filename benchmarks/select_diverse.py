"""BADGE selection at scale: 1,000 of 100,000 with C=10 classes and D=512 features.

Random factors stand in for a scored pool (softmax of random logits, ReLU features). Prints the
time of `select_diverse` with its default shortlist (top 10 × budget by score) and over the whole
pool (classic BADGE), and, side by side on a smaller pool, factored vs explicit C·D k-means++.

    python benchmarks/select_diverse.py [--n 100000] [--budget 1000] [--d 512] [--c 10]
"""
from __future__ import annotations

import argparse
import os
import time

import torch

from alcli.selection.diverse import badge_factors, kmeanspp_dense, kmeanspp_factored, select_diverse


def pool(n: int, c: int, d: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    probs = torch.softmax(torch.randn(n, c, generator=g) * 3, dim=1)   # [N, C] float32
    feats = torch.relu(torch.randn(n, d, generator=g))                # [N, D] float32
    scores = torch.rand(n, generator=g, dtype=torch.float64)
    return [f"img{i:06d}.png" for i in range(n)], scores, probs, feats


def timed(fn):
    """(result, wall seconds); the CPU seconds of the last call are kept in timed.cpu."""
    t, c = time.perf_counter(), time.process_time()
    out = fn()
    timed.cpu = time.process_time() - c
    return out, time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=100_000)
    ap.add_argument("--budget", type=int, default=1_000)
    ap.add_argument("--c", type=int, default=10)
    ap.add_argument("--d", type=int, default=512)
    ap.add_argument("--small", type=int, default=2_000, help="pool for the dense comparison")
    args = ap.parse_args()
    torch.manual_seed(0)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs "
          f"(wall times stretch when the CPUs are shared)")

    ids, scores, probs, feats = pool(args.n, args.c, args.d)
    (a, b), t_fac = timed(lambda: badge_factors(probs, feats))
    factored_mb = (a.numel() * a.element_size() + b.numel() * b.element_size()) / 2**20
    dense_mb = args.n * args.c * args.d * 4 / 2**20
    print(f"pool N={args.n} C={args.c} D={args.d}: factors {factored_mb:.0f} MiB "
          f"(explicit C·D embeddings would be {dense_mb:.0f} MiB float32); "
          f"badge_factors {t_fac:.2f} s")

    shortlist = min(args.n, 10 * args.budget)
    batch, t_short = timed(lambda: select_diverse(ids, scores, a, b, args.budget, seed=0))
    print(f"select_diverse {args.budget} of {args.n}, shortlist {shortlist} (default): "
          f"{t_short:.2f} s wall, {timed.cpu:.2f} s CPU, {len(batch)} ids")
    batch_all, t_all = timed(lambda: select_diverse(ids, scores, a, b, args.budget, seed=0,
                                                    candidates=args.n))
    print(f"select_diverse {args.budget} of {args.n}, whole pool (classic BADGE): "
          f"{t_all:.2f} s wall, {timed.cpu:.2f} s CPU, {len(batch_all)} ids")

    m, k = args.small, min(args.budget, args.small // 10)
    sa, sb = a[:m].double(), b[:m].double()
    fac, t_f = timed(lambda: kmeanspp_factored(sa, sb, k, seed=0))
    emb = torch.einsum("nc,nd->ncd", sa, sb).reshape(m, -1)  # [m, C*D] explicit
    den, t_d = timed(lambda: kmeanspp_dense(emb, k, seed=0))
    print(f"k-means++ {k} of {m} (float64): factored {t_f:.2f} s, explicit C·D {t_d:.2f} s, "
          f"ratio {t_d / t_f:.1f}x, same picks: {fac == den}")


if __name__ == "__main__":
    main()
