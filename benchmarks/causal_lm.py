"""Causal LMs (issue 36): gradnorm (ghost, exact per-example norms of the mean next-token loss)
against the floor, one plain forward + backward of the summed per-example loss, side by side in
one process; and, per T, the peak memory of the floor, of ghost's first-call layout probe alone
and of gradnorm (a first call, probe included), each in a child process of its own (ru_maxrss:
the child's peak resident memory, less a child that only builds the model).

Models, random weights, eval mode, every parameter selected:
- gpt2-small: GPT2LMHeadModel at GPT-2 small's size (768 wide, 12 layers, 12 heads, vocabulary
  50257, tied input/output embeddings);
- tiny-llama: LlamaForCausalLM (512 wide, 8 layers, 8 heads with 4 key/value heads, SwiGLU 1408,
  RMSNorm, rotary positions, vocabulary 32000, tied embeddings).
Each batch: B sequences of T random tokens, the last quarter of the second one padding; the loss
over all real tokens.

    nice -n 10 python benchmarks/causal_lm.py [--models gpt2-small tiny-llama] [--length 512]
        [--batch 2] [--rounds 3 (0: no timing)] [--memory-lengths 512 1024 2048] [--threads N]
"""
from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # this checkout's alcli

from alcli.gradnorm import per_example_grad_norms  # noqa: E402
from alcli.tasks.causal_lm import lm_loss  # noqa: E402


def build(name: str):
    import transformers as tf
    torch.manual_seed(0)
    if name == "gpt2-small":
        return tf.GPT2LMHeadModel(tf.GPT2Config(n_positions=4096)).eval()
    return tf.LlamaForCausalLM(tf.LlamaConfig(
        vocab_size=32000, hidden_size=512, intermediate_size=1408, num_hidden_layers=8,
        num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=4096,
        tie_word_embeddings=True)).eval()


def batch(model, b: int, t: int):
    vocab = model.config.vocab_size
    ids = torch.randint(0, vocab, (b, t))
    mask = torch.ones(b, t, dtype=torch.long)
    if b > 1:
        mask[1, 3 * t // 4:] = 0
    targets = torch.where(F.pad(mask[:, 1:], (0, 1)) == 1, F.pad(ids[:, 1:], (0, 1)), -100)
    return {"input_ids": ids, "attention_mask": mask}, targets


def floor(model, inputs, targets):
    """One plain forward and backward of the summed per-example loss, all parameters."""
    for p in model.parameters():
        p.grad = None
    logits = model(**inputs).logits
    lm_loss(logits, targets).sum().backward()


def gradnorm(model, inputs, targets):
    return per_example_grad_norms(model, inputs, targets, loss_fn=lm_loss, method="ghost")


def timed(name: str, length: int, b: int, rounds: int) -> str:
    model = build(name)
    inputs, targets = batch(model, b, length)
    gradnorm(model, inputs, targets)  # ghost's first call probes the model
    floor(model, inputs, targets)
    times = {"floor": [], "gradnorm": []}
    for _ in range(rounds):  # interleaved
        for what, fn in (("floor", floor), ("gradnorm", gradnorm)):
            start = time.perf_counter()
            fn(model, inputs, targets)
            times[what].append(time.perf_counter() - start)
    f, g = statistics.median(times["floor"]), statistics.median(times["gradnorm"])
    return f"{name:11s} T={length:<5d} B={b}  floor {f:7.2f} s  gradnorm {g:7.2f} s  gradnorm / floor {g / f:5.2f}"


def probe(model, inputs, targets):
    """What ghost's first call does before its own pass: the plan and the layout probe."""
    from alcli.gradnorm.params import selection_for
    from alcli.gradnorm.plan import ghost_plan_for
    from alcli.gradnorm.layout import call_layouts
    plan = ghost_plan_for(model, selection_for(model, None), inputs)
    call_layouts(model, inputs, plan.modules)


RUNS = {"floor": floor, "probe": probe, "gradnorm": gradnorm}


def one(name: str, what: str, length: int, b: int) -> None:
    """In a child: build, run `what` once (nothing for "build"), print the peak resident memory (MiB)."""
    model = build(name)
    if what != "build":
        inputs, targets = batch(model, b, length)
        RUNS[what](model, inputs, targets)
    print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)


def _rss_mib(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/status") as f:
            return next(float(line.split()[1]) / 1024 for line in f if line.startswith("VmRSS"))
    except (OSError, StopIteration):
        return 0.0


def memory(name: str, length: int, b: int, threads: int, cap_mib: float = 0,
           whats=("build", "floor", "probe", "gradnorm")) -> str:
    """Peak resident memory above the built model of the floor, the layout probe alone and
    gradnorm, each in a child process of its own; a child past `cap_mib` of resident memory is
    killed ("over cap"); one that fails otherwise shows "failed"."""
    peaks = {}
    for what in whats:
        child = subprocess.Popen([sys.executable, __file__, "--one", name, what, str(length), str(b),
                                  "--threads", str(threads)], stdout=subprocess.PIPE, text=True)
        capped = False
        while child.poll() is None:  # a child past the cap is killed, and shows as such
            if cap_mib and _rss_mib(child.pid) > cap_mib:
                child.kill()
                capped = True
            time.sleep(0.05)
        out = child.stdout.read()
        peaks[what] = float(out.split()[-1]) if child.returncode == 0 else ("over cap" if capped else "failed")
    shown = {what: f"{peaks[what] - peaks['build']:8.0f}" if isinstance(peaks.get(what), float) else
             f"{peaks.get(what, '-'):>8s}" for what in ("floor", "probe", "gradnorm")}
    ratio = (f"{(peaks['gradnorm'] - peaks['build']) / (peaks['floor'] - peaks['build']):5.2f}"
             if isinstance(peaks.get("floor"), float) and isinstance(peaks.get("gradnorm"), float) else "    -")
    return (f"{name:11s} T={length:<5d} B={b}  MiB above the model: floor {shown['floor']}  probe "
            f"{shown['probe']}  gradnorm {shown['gradnorm']}  gradnorm / floor {ratio}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", nargs="+", default=["gpt2-small", "tiny-llama"])
    ap.add_argument("--length", type=int, default=512)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3, help="0: no timing")
    ap.add_argument("--memory-lengths", type=int, nargs="*", default=[512, 1024, 2048],
                    help="T of the memory runs (none: no memory runs)")
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    ap.add_argument("--cap-mib", type=float, default=9216, help="a child past this RSS is killed (0: no cap)")
    ap.add_argument("--no-probe", dest="probe", action="store_false", help="no run of the probe alone")
    ap.add_argument("--only", nargs="+", default=None, help="of floor, probe, gradnorm: only these")
    ap.add_argument("--one", nargs=4, help=argparse.SUPPRESS)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if args.one:
        name, what, length, b = args.one
        one(name, what, int(length), int(b))
        return
    if args.rounds:
        print(f"torch {torch.__version__}, {args.threads} threads, medians of {args.rounds} interleaved rounds")
        for name in args.models:
            print(timed(name, args.length, args.batch, args.rounds), flush=True)
    for length in args.memory_lengths:
        for name in args.models:
            print(memory(name, length, args.batch, args.threads, args.cap_mib,
                         ("build", *[w for w in ("floor", "probe", "gradnorm") if (args.probe or w != "probe")
                                     and (args.only is None or w in args.only)])), flush=True)

if __name__ == "__main__":
    main()
