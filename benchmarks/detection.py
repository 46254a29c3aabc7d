"""Detection speed: alcli's per-image utilities ÷ one plain forward+backward of the batch's summed
training loss (the floor), side by side in one process, median of several rounds.

    python benchmarks/detection.py [--size 128] [--batch 4] [--rounds 3] [--threads N]

Random weights, `--size` square images (SSD resizes to 320 itself), targets = the predicted
boxes scoring at least 0.05 (the same pseudo-labels for the floor and for alcli).
"""
from __future__ import annotations

import argparse
import statistics
import time
from types import SimpleNamespace

import torch
import torchvision

from alcli.tasks import detection

DETECTORS = ("fasterrcnn_mobilenet_v3_large_320_fpn", "fasterrcnn_resnet50_fpn", "retinanet_resnet50_fpn",
             "fcos_resnet50_fpn", "ssdlite320_mobilenet_v3_large")


def build(name: str, size: int) -> torch.nn.Module:
    kw = {} if name.startswith("ssd") else {"min_size": size, "max_size": size}
    if name.startswith(("retinanet", "fcos")):
        kw["score_thresh"] = 0.01  # random heads score about 0.01: some boxes to learn from
    torch.manual_seed(0)
    return torchvision.models.get_model(name, weights=None, weights_backbone=None, num_classes=5, **kw).eval()


def floor(model, images, targets) -> None:
    """One forward+backward of the batch's summed loss: what training one batch costs."""
    with detection.loss_mode(model):
        loss = sum(model(images, targets).values())
        loss.backward()
    model.zero_grad(set_to_none=True)


def timed(fn, rounds: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", type=int, default=128)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    ap.add_argument("--only", nargs="*", default=DETECTORS)
    ap.add_argument("--method", default="auto", help="auto (RetinaNet batched through the engine) or loop")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    g = torch.Generator().manual_seed(0)
    images = [torch.rand(3, args.size, args.size, generator=g) for _ in range(args.batch)]
    ids = [f"img{i}" for i in range(args.batch)]
    print(f"batch {args.batch} x {args.size}px, {args.threads} threads, median of {args.rounds}, --method {args.method}")
    print("| detector | floor (s) | predict | gradnorm | gradnorm ÷ floor | egl-4 ÷ floor | boxes/image |")
    print("|---|---|---|---|---|---|---|")
    for name in args.only:
        model = build(name, args.size)
        found = detection.predict(model, images)
        targets = [{k: v for k, v in detection.kept(f, 0.05).items() if k != "scores"} for f in found]
        settings = SimpleNamespace(box_threshold=0.05, aggregate="mean", seed=0, egl_samples=4,
                                   method=args.method)
        t_floor = timed(lambda: floor(model, images, targets), args.rounds)
        t_pred = timed(lambda: detection.predict(model, images), args.rounds)
        t_grad = timed(lambda: detection.utility("gradnorm", model, images, detection.predict(model, images),
                                                 ids, settings), args.rounds)
        t_egl = timed(lambda: detection.utility("egl", model, images, detection.predict(model, images),
                                                ids, settings), max(1, args.rounds // 2))
        boxes = statistics.mean(len(t["boxes"]) for t in targets)
        print(f"| {name} ({detection.method(model, args.method)[0]}) | {t_floor:.3f} | {t_pred:.3f} | {t_grad:.3f} | {t_grad / t_floor:.2f}x | "
              f"{t_egl / t_floor:.2f}x | {boxes:.0f} |", flush=True)


if __name__ == "__main__":
    main()
