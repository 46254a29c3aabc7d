"""The seed model's ghost norms written out by hand: what the arithmetic alone costs (issue 23).

The same forward with taps, one backward into them and the same layer math as the engine's rules
(conv patches, the materialised product for conv1, the Gram form for conv2, ||a||^2 ||g||^2 for
fc), with none of the engine's machinery (no hooks, plans, layouts, borrowing or bookkeeping).
Timed against the floor (a plain forward+backward of the summed loss) and the engine, interleaved
in one process; the hand-written norms are checked against the engine's first.

    python benchmarks/seed_by_hand.py [--batch 64] [--rounds 40] [--before DIR] [--clock cpu]

What is left between the engine and this is the engine's fixed cost per call; what is left
between this and the floor is arithmetic no driver can remove.
"""
from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from alcli.gradnorm import per_example_grad_norms  # noqa: E402
from alcli.gradnorm.rules.conv import unfold_patches  # noqa: E402
from call_cost import CLOCKS, interleaved_times  # noqa: E402
from gradnorm import build_case, floor_fn  # noqa: E402


def by_hand(model, x, y):
    """[B] norms of SimpleModel (conv1 3->10, conv2 10->20 stride 2, fc 500->10, no biases)."""
    batch = x.shape[0]
    zero = torch.zeros((), dtype=x.dtype)
    taps = [zero.expand(batch, 10, 10, 10).requires_grad_(), zero.expand(batch, 20, 5, 5).requires_grad_(),
            zero.expand(batch, 10).requires_grad_()]
    h1 = model.conv1(x) + taps[0]
    h2 = (model.conv2(h1) + taps[1]).view(batch, -1)
    logits = model.fc(h2) + taps[2]
    with torch.no_grad():
        cotangent = logits.softmax(-1) - F.one_hot(y, 10)
    g1, g2, g3 = torch.autograd.grad(logits, taps, cotangent)
    a1 = unfold_patches(model.conv1, x).flatten(0, 1)           # [B, 27, 100]
    n1 = torch.bmm(g1.reshape(batch, 10, -1), a1.mT).square().sum((1, 2))
    a2 = unfold_patches(model.conv2, h1.detach()).flatten(0, 1)  # [B, 90, 25]
    g2 = g2.reshape(batch, 20, -1)
    n2 = (torch.bmm(a2.mT, a2) * torch.bmm(g2.mT, g2)).sum((1, 2))
    n3 = h2.detach().square().sum(1) * g3.square().sum(1)
    return torch.stack([n1, n2, n3]).double().sum(0).sqrt()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--before", help="another checkout (a git worktree): its engine timed beside, "
                                             "as benchmarks/before_after.py does")
    parser.add_argument("--clock", choices=sorted(CLOCKS), default="wall",
                        help="wall time, or this thread's CPU time (steadier on a loaded machine)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    case = build_case("simple", torch.device("cpu"))
    case.inputs, case.targets = case.inputs[:args.batch], case.targets[:args.batch]
    model, x, y = case.model, case.inputs, case.targets
    fns = {"floor": floor_fn(case), "engine": lambda: per_example_grad_norms(model, x, y),
           "by hand": lambda: by_hand(model, x, y)}
    if args.before:
        from before_after import import_before
        before, other = import_before(args.before), copy.deepcopy(model)
        fns["before"] = lambda: before.per_example_grad_norms(other, x, y)
    engine, hand = fns["engine"]().double(), fns["by hand"]()
    if not torch.allclose(engine, hand, rtol=1e-4):
        raise SystemExit(f"the hand-written norms differ from the engine's by {(engine - hand).abs().max():.3g}")
    times = interleaved_times(fns, args.rounds, 10, CLOCKS[args.clock])
    print(f"torch {torch.__version__}, cpu, {torch.get_num_threads()} threads, {args.clock} clock, seed SimpleModel, batch {args.batch}")
    for k, v in times.items():
        ratio = statistics.median(t / f for t, f in zip(v, times["floor"]))
        print(f"{k:8} {1e6 * statistics.median(v):8.0f} us  {ratio:.2f}x the floor")
    for who in ("before", "engine") if args.before else ("engine",):
        ratio = statistics.median(e / h for e, h in zip(times[who], times["by hand"]))
        print(f"{who} ÷ by hand, the median of each round's ratio: {ratio:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
