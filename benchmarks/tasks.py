"""Per-task gradient utilities against the floor, side by side in one process (issue 18):

- floor: one plain batched forward + backward of the summed per-example loss (the task's loss at
  the predicted labels), all parameters;
- gradnorm: per-example gradient norms at the predicted labels (ghost; one target set);
- egl: S = 8 label sets sampled from the model's predictions, through ONE backward (ghost);
- floor x S: one plain forward, then S plain backwards of the summed loss, one per sampled label
  set (retain_graph): what any method pays that pulls S different label sets back through the
  network (per example or not), so egl ÷ (floor x S) says how much of EGL's cost is inherent.

Models, random weights, eval mode:
- segmentation: torchvision fcn_resnet50 (weights=None, weights_backbone=None, 21 classes),
  3x128x128, batch 16; loss = mean cross-entropy over pixels;
- token classification: BertForTokenClassification, "bert-small" as in benchmarks/gradnorm.py
  (hidden 64, 2 layers, 2 heads, intermediate 256, vocab 1000), 9 labels, length 64, batch 32,
  a quarter of each sequence padding; loss = mean cross-entropy over valid tokens.

Rounds interleaved after a warm-up (ghost's first call probes the model), medians reported, with
gradnorm ÷ floor, egl ÷ floor, egl ÷ gradnorm and egl ÷ (floor x S).

    python benchmarks/tasks.py [--tasks segmentation token-classification] [--rounds 3] [--threads N]
                               [--batch B --size S]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # this checkout's alcli

from alcli.gradnorm import grad_norms_per_target
from alcli.gradnorm.model_io import batch_size, call_model, forward_logits, logits_of, map_batch
from alcli import tasks


def segmentation(batch: int = 16, size: int = 128):
    import torchvision
    torch.manual_seed(0)
    model = torchvision.models.segmentation.fcn_resnet50(weights=None, weights_backbone=None,
                                                         num_classes=21).eval()
    return model, torch.rand(batch, 3, size, size)


def token_classification(batch: int = 32, length: int = 64):
    from transformers import BertConfig, BertForTokenClassification
    torch.manual_seed(0)
    model = BertForTokenClassification(BertConfig(
        vocab_size=1000, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=256, max_position_embeddings=64, num_labels=9)).eval()
    ids = torch.randint(5, 1000, (batch, length))
    mask = torch.ones(batch, length, dtype=torch.long)
    mask[:, 3 * length // 4:] = 0
    ids[mask == 0] = 0
    return model, {"input_ids": ids, "attention_mask": mask}


MODELS = {"segmentation": segmentation, "token-classification": token_classification}
SAMPLES = 8  # EGL's label sets


def build(task: str, batch: int | None = None, size: int | None = None,
          device: torch.device = torch.device("cpu")):
    """(model, inputs) of `task` on `device`: the defaults above, or `batch` (and `size`)."""
    model, x = MODELS[task](*([batch] if batch else []), *([size] if size and batch else []))
    return model.to(device), map_batch(x, lambda t: t.to(device))


def egl_norms(task: str, model, x) -> torch.Tensor:
    """[SAMPLES, B] ghost norms for SAMPLES label sets drawn from the model's own predictions."""
    ids = list(range(batch_size(x)))
    return grad_norms_per_target(
        model, x, lambda z: tasks.sampled(task, z, tasks.valid_positions(task, z, x), ids, SAMPLES, 0),
        method="ghost", loss_fn=tasks.TASKS[task].loss)[0]


def measure(task: str, rounds: int, batch: int | None = None, size: int | None = None,
            device: torch.device = torch.device("cpu")) -> dict:
    model, x = build(task, batch, size, device)
    loss_fn = tasks.TASKS[task].loss
    with torch.no_grad():
        z = forward_logits(model, x)
    valid = tasks.valid_positions(task, z, x)
    ids = list(range(z.shape[0]))
    pseudo = tasks.predicted(task, z, valid)

    def floor():
        out = logits_of(call_model(model, x))
        loss_fn(out, pseudo).sum().backward()
        model.zero_grad(set_to_none=True)

    def gradnorm():
        grad_norms_per_target(model, x, lambda z: [tasks.predicted(task, z, tasks.valid_positions(task, z, x))],
                              method="ghost", loss_fn=loss_fn)

    def egl():
        egl_norms(task, model, x)

    sampled = tasks.sampled(task, z, valid, ids, SAMPLES, 0)

    def floor_s():
        out = logits_of(call_model(model, x))
        for s, targets in enumerate(sampled):
            loss_fn(out, targets).sum().backward(retain_graph=s < len(sampled) - 1)
        model.zero_grad(set_to_none=True)

    runs = {"floor": floor, "gradnorm": gradnorm, "egl8": egl, "floor_s": floor_s}
    for fn in runs.values():  # warm-up: ghost's probes, allocator
        fn()
    times = {name: [] for name in runs}
    names = list(runs)
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            start = time.perf_counter()
            runs[name]()
            if device.type == "cuda":
                torch.cuda.synchronize()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) for name, t in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", nargs="+", default=list(MODELS), choices=list(MODELS))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--batch", type=int, default=None, help="instead of 16 (segmentation) / 32 (tokens)")
    ap.add_argument("--size", type=int, default=None, help="with --batch: image side / token length")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, CPU, {torch.get_num_threads()} threads, {args.rounds} rounds, medians")
    print(f"{'task':22} {'floor s':>9} {'gradnorm s':>11} {'egl8 s':>9} {'floor x 8 s':>12} {'gn/floor':>9} "
          f"{'egl/floor':>10} {'egl/gn':>7} {'egl/(floor x 8)':>16}")
    for task in args.tasks:
        t = measure(task, args.rounds, args.batch, args.size)
        print(f"{task:22} {t['floor']:9.3f} {t['gradnorm']:11.3f} {t['egl8']:9.3f} {t['floor_s']:12.3f} "
              f"{t['gradnorm'] / t['floor']:9.2f} {t['egl8'] / t['floor']:10.2f} {t['egl8'] / t['gradnorm']:7.2f} "
              f"{t['egl8'] / t['floor_s']:16.2f}", flush=True)


if __name__ == "__main__":
    main()
