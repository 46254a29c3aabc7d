"""Ghost on torchvision swin_t and swin_v2_t with the swin rules (`alcli/gradnorm/rules/swin.py`),
beside the floor and what each attention got before its rule, in one process:

- floor: one batched forward + backward of the summed cross-entropy over all parameters;
- swin_t: ghost, swin rule (per_example_grad_norms(method="ghost")) vs ghost, generic rule (the
  same on a copy of the model planned with the v1 registry entry removed: ShiftedWindowAttention
  then goes to the generic rule, as before);
- swin_v2_t: ghost, swin v2 rule vs vmap (torch.func, what `auto` settled on before the v2 rule:
  ghost declined cpb_mlp, whose input is shared by all examples).

swin_t / swin_v2_t (weights=None, num_classes=10), 3x64x64, batch 32, eval mode, one intra-op
thread; per model, rounds interleaved in a rotating order after a warm-up, medians reported. The
two per-example results of each model are checked against each other (rtol 1e-4).

    python benchmarks/swin_rule.py [--models v1 v2] [--rounds 5] [--batch 32] [--size 64] [--threads 1]
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


def attention_rules(model, kind):
    rows = describe(model, select_params(model, None))
    return sorted({rule for _, module_type, rule, _ in rows if module_type == kind})


def floor_of(model, x, y):
    def floor():
        F.cross_entropy(model(x), y, reduction="none").sum().backward()
        model.zero_grad(set_to_none=True)
    return floor


def bench_v1(x, y):
    """-> (title, notes, contenders) for swin_t, after a checked warm-up."""
    model = torchvision.models.swin_t(weights=None, num_classes=10).eval()
    generic_model = copy.deepcopy(model)

    def ghost_swin():
        return per_example_grad_norms(model, x, y, method="ghost")

    def ghost_generic():
        with without_swin_rule():  # the plan is built (and cached) on the first call
            return per_example_grad_norms(generic_model, x, y, method="ghost")

    rules = attention_rules(model, "ShiftedWindowAttention")
    with without_swin_rule():
        generic = attention_rules(generic_model, "ShiftedWindowAttention")
    a, b = ghost_swin(), ghost_generic()  # the warm-up
    floor = floor_of(model, x, y)
    floor()
    torch.testing.assert_close(a, b, rtol=1e-4, atol=0)
    notes = f"attention rules: with the entry {rules}, without {generic}; the two ghost results agree (rtol 1e-4)"
    return "swin_t", notes, {"floor": floor, "ghost, swin rule": ghost_swin, "ghost, generic rule": ghost_generic}


def bench_v2(x, y):
    """-> (title, notes, contenders) for swin_v2_t, after a checked warm-up."""
    model = torchvision.models.swin_v2_t(weights=None, num_classes=10).eval()

    def ghost_swin():
        return per_example_grad_norms(model, x, y, method="ghost")

    def vmap():
        return per_example_grad_norms(model, x, y, method="vmap")

    rules = attention_rules(model, "ShiftedWindowAttentionV2")
    a, b = ghost_swin(), vmap()  # the warm-up
    floor = floor_of(model, x, y)
    floor()
    torch.testing.assert_close(a, b, rtol=1e-4, atol=0)
    notes = f"attention rules: {rules}; ghost and vmap agree (rtol 1e-4)"
    return "swin_v2_t", notes, {"floor": floor, "ghost, swin v2 rule": ghost_swin, "vmap (auto before)": vmap}


def timed(contenders, rounds):
    times = {name: [] for name in contenders}
    names = list(contenders)
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            t = time.perf_counter()
            contenders[name]()
            times[name].append(time.perf_counter() - t)
    return times


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", choices=["v1", "v2"], default=["v1", "v2"])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--size", type=int, default=64)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    for version in args.models:
        torch.manual_seed(0)
        x = torch.randn(args.batch, 3, args.size, args.size)
        y = torch.randint(0, 10, (args.batch,))
        title, notes, contenders = (bench_v1 if version == "v1" else bench_v2)(x, y)
        times = timed(contenders, args.rounds)
        base = statistics.median(times["floor"])
        print(f"torchvision {title}(num_classes=10), 3x{args.size}x{args.size}, batch {args.batch}, eval, "
              f"{args.threads} thread(s), median of {args.rounds} rounds after a warm-up; "
              f"torch {torch.__version__}")
        print(notes)
        print(f"{'contender':<22}{'median s':>10}{'x floor':>9}   rounds (s)")
        for name, row in times.items():
            med, rounds = statistics.median(row), " ".join(f"{t:.3f}" for t in row)
            print(f"{name:<22}{med:>10.3f}{med / base:>8.2f}x   {rounds}")
        print()


if __name__ == "__main__":
    main()
