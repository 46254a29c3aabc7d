"""The R-CNNs' RoI pool: torchvision's RoIAlign (MultiScaleRoIAlign) against alcli's
`roi_align.pooled_rows` (one embedding bag over the pyramid's cells), forward and backward, side
by side in one process, median of several rounds, on one and on two threads; and their largest
difference in float64.

    python benchmarks/roi_pool.py [--rows 4096] [--rounds 3]

A batch of 8 images at 320 px: maps of 256 channels at strides 4 to 32 (FPN's), random boxes of 1
to 100 px over the image, each pooled at its level (7 x 7 bins, 2 x 2 samples: torchvision's box
pool).
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
from torchvision.ops import MultiScaleRoIAlign

from alcli.tasks.detectors import roi_align

NAMES = ["0", "1", "2", "3"]


def inputs(rows: int, dtype=torch.float32):
    g = torch.Generator().manual_seed(0)
    maps = {n: torch.randn(8, 256, 80 >> i, 80 >> i, generator=g, dtype=dtype) for i, n in enumerate(NAMES)}
    corner = torch.rand(rows, 2, generator=g, dtype=dtype) * 320 - 5
    boxes = torch.cat([corner, corner + torch.rand(rows, 2, generator=g, dtype=dtype) * 100 + 1], 1)
    image = torch.randint(0, 8, (rows,), generator=g)
    return maps, boxes, image


def both(pool, maps, boxes, image):
    """{name: fn(maps) -> [R, C, 7, 7]}: torchvision's pool and pooled_rows at the same rows."""
    per_image = [boxes[image == i] for i in range(8)]
    order = torch.argsort(image, stable=True)  # torchvision's rows come image by image
    return {"torchvision": lambda m: pool(m, per_image, [(320, 320)] * 8),
            "alcli": lambda m: roi_align.pooled_rows(list(m.values()), pool, boxes[order], image[order])}


def timed(fn, maps, rounds: int) -> tuple[float, float]:
    """(forward, backward) seconds, medians."""
    fwd, bwd = [], []
    for _ in range(rounds + 1):
        leaves = {n: m.detach().requires_grad_() for n, m in maps.items()}
        start = time.perf_counter()
        out = fn(leaves)
        mid = time.perf_counter()
        torch.autograd.grad(out, list(leaves.values()), torch.ones_like(out))
        fwd.append(mid - start)
        bwd.append(time.perf_counter() - mid)
    return statistics.median(fwd[1:]), statistics.median(bwd[1:])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=4096)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    pool = MultiScaleRoIAlign(NAMES, 7, 2)
    maps, boxes, image = inputs(args.rows, torch.float64)
    fns = both(pool, maps, boxes, image)
    leaves = {n: m.detach().requires_grad_() for n, m in maps.items()}
    outs = {k: fn(leaves) for k, fn in fns.items()}
    cot = torch.randn_like(outs["alcli"])
    grads = {k: torch.autograd.grad(o, list(leaves.values()), cot) for k, o in outs.items()}
    print(f"float64: largest difference, forward {(outs['alcli'] - outs['torchvision']).abs().max():.1e}, "
          f"backward {max((a - b).abs().max() for a, b in zip(grads['alcli'], grads['torchvision'])):.1e}")
    maps, boxes, image = inputs(args.rows)
    fns = both(pool, maps, boxes, image)
    print(f"{args.rows} rows, median of {args.rounds}\n| threads | pool | forward (s) | backward (s) |\n|---|---|---|---|")
    for threads in (1, 2):
        torch.set_num_threads(threads)
        for name, fn in fns.items():
            f, b = timed(fn, maps, args.rounds)
            print(f"| {threads} | {name} | {f:.3f} | {b:.3f} |", flush=True)


if __name__ == "__main__":
    main()
