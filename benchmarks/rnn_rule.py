"""The RNN layer rule (alcli/gradnorm/rules/rnn.py) against the floor and the generic rule it replaced.

In one process, on the CPU with one intra-op thread, at batch 32, models in eval mode: a text
classifier Embedding(1000, 64) -> nn.LSTM(64, 128, batch_first=True) (or nn.GRU) -> last step ->
Linear(128, 10) on sequences of 32 tokens. Contenders, in interleaved rounds (median reported, of
wall-clock time and of this thread's CPU time, which a busy machine inflates less):

- floor: one batched forward + backward of the summed cross-entropy over all parameters;
- ghost: `per_example_grad_norms(model, tokens, targets, method="ghost")` (the RNN rule);
- generic: the same with the RNN types' registry entries removed (the exact generic rule, which
  pulls the fused kernel back one example at a time).

    python benchmarks/rnn_rule.py [--rounds 7] [--batch 32] [--profile]
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
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # this checkout's alcli

from alcli.gradnorm import per_example_grad_norms  # noqa: E402
from alcli.gradnorm.rules.registry import RULES  # noqa: E402

VOCAB, EMBED, HIDDEN, CLASSES, STEPS = 1000, 64, 128, 10, 32


class Classifier(nn.Module):
    def __init__(self, rnn_type):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, EMBED)
        self.rnn = rnn_type(EMBED, HIDDEN, batch_first=True)
        self.head = nn.Linear(HIDDEN, CLASSES)

    def forward(self, tokens):
        out, _ = self.rnn(self.emb(tokens))
        return self.head(out[:, -1])


@contextlib.contextmanager
def without_rnn_rule():
    """The registry as it was before rules/rnn.py: the RNN types get the generic rule."""
    saved = {t: RULES.pop(t) for t in (nn.LSTM, nn.GRU, nn.RNN)}
    try:
        yield
    finally:
        RULES.update(saved)


def floor(model, tokens, targets):
    loss = F.cross_entropy(model(tokens), targets, reduction="sum")
    loss.backward()
    model.zero_grad(set_to_none=True)


def timed(fn, repeats):
    """-> (wall ms, this thread's CPU ms) per call. With one intra-op thread the CPU backward runs
    on this thread too, so its CPU time leaves out the time other processes took the core."""
    wall, cpu = time.perf_counter(), time.thread_time()
    for _ in range(repeats):
        fn()
    return ((time.perf_counter() - wall) / repeats * 1e3, (time.thread_time() - cpu) / repeats * 1e3)


def bench(rnn_type, batch, rounds):
    torch.manual_seed(0)
    model = Classifier(rnn_type).eval()
    old = copy.deepcopy(model)  # its own cached plan: built once without the RNN rule
    tokens = torch.randint(0, VOCAB, (batch, STEPS))
    targets = torch.randint(0, CLASSES, (batch,))

    def old_path():
        with without_rnn_rule():
            return per_example_grad_norms(old, tokens, targets, method="ghost")

    contenders = {
        "floor": lambda: floor(model, tokens, targets),
        "ghost": lambda: per_example_grad_norms(model, tokens, targets, method="ghost"),
        "generic": old_path,
    }
    ghost_norms, old_norms = contenders["ghost"](), old_path()  # warm-up: layouts, plans, checks
    contenders["floor"]()
    agree = torch.allclose(ghost_norms, old_norms, rtol=1e-3)
    repeats = {"floor": 5, "ghost": 5, "generic": 1}
    times = {name: [] for name in contenders}
    names = list(contenders)
    for r in range(rounds):
        for name in names[r % 3:] + names[:r % 3]:  # rotating order
            times[name].append(timed(contenders[name], repeats[name]))
    for clock, which in (("wall", 0), ("cpu", 1)):
        med = {name: statistics.median(t[which] for t in ts) for name, ts in times.items()}
        print(f"{rnn_type.__name__:5s} {clock:4s}  floor {med['floor']:7.2f} ms   ghost {med['ghost']:7.2f} ms "
              f"({med['ghost'] / med['floor']:.2f}x floor)   generic rule {med['generic']:8.2f} ms "
              f"({med['generic'] / med['floor']:.1f}x floor)   ghost == generic: {agree}")
    return model, tokens, targets


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--profile", action="store_true", help="profile ghost on the LSTM afterwards")
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"torch {torch.__version__}, CPU, 1 thread, batch {args.batch}, {STEPS} steps, "
          f"median of {args.rounds} rounds")
    model, tokens, targets = bench(nn.LSTM, args.batch, args.rounds)
    bench(nn.GRU, args.batch, args.rounds)
    if args.profile:
        from torch.profiler import profile
        with profile() as prof:
            for _ in range(5):
                per_example_grad_norms(model, tokens, targets, method="ghost")
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25))


if __name__ == "__main__":
    main()
