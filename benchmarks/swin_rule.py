"""Ghost on torchvision swin_t with the swin rule (`alcli/gradnorm/rules/swin.py`) vs the generic
rule it replaced for ShiftedWindowAttention, beside the floor, in one process:

- floor: one batched forward + backward of the summed cross-entropy over all parameters;
- ghost, swin rule: per_example_grad_norms(method="ghost");
- ghost, generic rule: the same on a copy of the model planned with the swin registry entry
  removed (the attention module then goes to the generic rule, as before).

swin_t(weights=None, num_classes=10), 3x64x64, batch 32, eval mode, one intra-op thread; rounds
interleaved in a rotating order after a warm-up, medians reported. The two ghost results are
checked against each other (rtol 1e-4).

    python benchmarks/swin_rule.py [--rounds 5] [--batch 32] [--size 64] [--threads 1]
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # this checkout's alcli

import torchvision

from alcli.gradnorm import per_example_grad_norms
from alcli.gradnorm.params import select_params
from alcli.gradnorm.plan import describe
from alcli.gradnorm.rules import registry
from alcli.gradnorm.rules.swin import NAME


@contextlib.contextmanager
def without_swin_rule():
    """The registry as it was before the swin rule: ShiftedWindowAttention gets the generic rule."""
    entry = registry.RULES.pop(NAME)
    try:
        yield
    finally:
        registry.RULES[NAME] = entry


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--size", type=int, default=64)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)

    model = torchvision.models.swin_t(weights=None, num_classes=10).eval()
    generic_model = copy.deepcopy(model)
    x = torch.randn(args.batch, 3, args.size, args.size)
    y = torch.randint(0, 10, (args.batch,))

    def floor():
        F.cross_entropy(model(x), y, reduction="none").sum().backward()
        model.zero_grad(set_to_none=True)

    def ghost_swin():
        return per_example_grad_norms(model, x, y, method="ghost")

    def ghost_generic():
        with without_swin_rule():  # the plan is built (and cached) on the first call
            return per_example_grad_norms(generic_model, x, y, method="ghost")

    contenders = {"floor": floor, "ghost, swin rule": ghost_swin, "ghost, generic rule": ghost_generic}

    def attention_rules(m):
        rows = describe(m, select_params(m, None))
        return sorted({rule for _, kind, rule, _ in rows if kind == "ShiftedWindowAttention"})

    rules = {"swin": attention_rules(model)}
    with without_swin_rule():
        rules["generic"] = attention_rules(generic_model)
    a, b = ghost_swin(), ghost_generic()  # the warm-up
    floor()
    torch.testing.assert_close(a, b, rtol=1e-4, atol=0)

    times = {name: [] for name in contenders}
    names = list(contenders)
    for r in range(args.rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            t = time.perf_counter()
            contenders[name]()
            times[name].append(time.perf_counter() - t)

    base = statistics.median(times["floor"])
    print(f"torchvision swin_t(num_classes=10), 3x{args.size}x{args.size}, batch {args.batch}, eval, "
          f"{args.threads} thread(s), median of {args.rounds} rounds after a warm-up; "
          f"torch {torch.__version__}")
    print(f"attention rules: with the entry {rules['swin']}, without {rules['generic']}; "
          f"the two ghost results agree (rtol 1e-4)")
    print(f"{'contender':<22}{'median s':>10}{'x floor':>9}   rounds (s)")
    for name in names:
        med, rounds = statistics.median(times[name]), " ".join(f"{t:.3f}" for t in times[name])
        print(f"{name:<22}{med:>10.3f}{med / base:>8.2f}x   {rounds}")


if __name__ == "__main__":
    main()
