"""`--method replicate` against `--method loop` and the floor, side by side in one process (issue 9,
item 8: the seed's method 2 must beat its per-example loop).

Per model, in interleaved rounds (each round runs floor, replicate and loop once, in a rotating
order; the median is reported): the floor is a plain batched forward + backward of the summed loss
over all parameters; replicate and loop are `per_example_grad_norms(model, x, y, method=m)`.
replicate's norms are checked against loop's (the largest relative difference is printed, and
must stay under 1e-2: both are float32, and a forward that rounds differently, as a grouped
convolution did, moved one resnet18 example's norm by 1e-3).

    python benchmarks/replicate_vs_loop.py [--rounds N] [--threads 2,1] [--out FILE [--append]]
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from gradnorm import SimpleModel

from alcli.gradnorm import per_example_grad_norms


def cases():
    g = torch.Generator().manual_seed(1)
    torch.manual_seed(0)
    yield "seed SimpleModel, 3x10x10, batch 64", SimpleModel().eval(), \
        torch.rand(64, 3, 10, 10, generator=g), torch.randint(0, 10, (64,), generator=g)
    torch.manual_seed(0)
    mlp = nn.Sequential(nn.Flatten(), nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 256), nn.ReLU(),
                        nn.Linear(256, 10)).eval()
    yield "MLP 784-512-256-10, batch 64", mlp, torch.randn(64, 784, generator=g), \
        torch.randint(0, 10, (64,), generator=g)
    import torchvision
    torch.manual_seed(0)
    yield ("torchvision resnet18 (eval), 3x32x32, batch 32, 10 classes",
           torchvision.models.resnet18(weights=None, num_classes=10).eval(),
           torch.randn(32, 3, 32, 32, generator=g), torch.randint(0, 10, (32,), generator=g))


def contenders(model, x, y) -> dict:
    def floor():
        F.cross_entropy(model(x), y, reduction="none").sum().backward()
        model.zero_grad(set_to_none=True)
    return {"floor": floor,
            "replicate": lambda: per_example_grad_norms(model, x, y, method="replicate"),
            "loop": lambda: per_example_grad_norms(model, x, y, method="loop")}


def run(rounds: int) -> list[str]:
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    lines = [(f"torch {torch.__version__}, {platform.machine()}, {os.cpu_count()} CPUs (shared; load {load:.1f} "
              f"at start), torch threads {torch.get_num_threads()}, "
              f"median of {rounds} interleaved rounds (seconds per batch; x floor in brackets)"), ""]
    header = f"{'model':<58} {'floor':>9} {'replicate':>18} {'loop':>18} {'loop/replicate':>15}"
    lines += [header, "-" * len(header)]
    for title, model, x, y in cases():
        fns = contenders(model, x, y)
        a, b = fns["replicate"](), fns["loop"]()  # warm-up, and the check
        worst = float(((a - b).abs() / b.abs().clamp_min(1e-12)).max())
        assert worst < 1e-2, f"{title}: replicate and loop differ by {worst:.1e} relative"
        times = {k: [] for k in fns}
        order = list(fns)
        for r in range(rounds):
            for k in order[r % 3:] + order[:r % 3]:
                t = time.perf_counter()
                fns[k]()
                times[k].append(time.perf_counter() - t)
        med = {k: statistics.median(v) for k, v in times.items()}
        cell = {k: f"{med[k]:.4f} ({med[k] / med['floor']:.0f}x)" for k in ("replicate", "loop")}
        line = (f"{title:<58} {med['floor']:>9.4f} {cell['replicate']:>18} {cell['loop']:>18} "
                f"{med['loop'] / med['replicate']:>14.1f}x   max rel diff {worst:.0e}")
        print(line, flush=True)
        lines.append(line)
    return lines


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--out", default=None)
    parser.add_argument("--threads", default="",
                        help="comma-separated torch thread counts to run in turn (default: torch's own)")
    parser.add_argument("--append", action="store_true", help="append to --out instead of overwriting")
    args = parser.parse_args()
    lines = []
    for threads in [int(t) for t in args.threads.split(",") if t] or [None]:
        if threads:
            torch.set_num_threads(threads)
        lines += run(args.rounds) + [""]
    if args.out:
        with open(args.out, "a" if args.append else "w") as f:
            f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
