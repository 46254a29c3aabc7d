"""Detection speed: alcli's per-image utilities ÷ one plain forward+backward of the batch's summed
training loss (the floor), side by side in one process, median of several rounds: gradnorm and
egl with S label sets as `auto` runs them (batched through the engine for RetinaNet, FCOS and
SSD) and, beside them, the per-image loop (`--method loop`).

    nice -n 10 python benchmarks/detection.py [--size 320] [--batch 8] [--samples 8] [--rounds 1]

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


def timed(fn, rounds: int, warm: bool = True) -> float:
    if warm:
        fn()  # warm-up (the engine's first call learns the model's layout)
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", type=int, default=320)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--samples", type=int, default=8, help="egl's label sets S")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    ap.add_argument("--only", nargs="*", default=DETECTORS)
    ap.add_argument("--no-loop", action="store_true", help="leave the loop's columns out")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    g = torch.Generator().manual_seed(0)
    images = [torch.rand(3, args.size, args.size, generator=g) for _ in range(args.batch)]
    ids = [f"img{i}" for i in range(args.batch)]
    print(f"batch {args.batch} x {args.size}px, {args.threads} threads, median of {args.rounds}, egl S = {args.samples}")
    print("| detector | method | floor (s) | gradnorm ÷ floor | egl ÷ floor | loop: gradnorm ÷ floor | loop: egl ÷ floor | boxes/image |")
    print("|---|---|---|---|---|---|---|---|")
    for name in args.only:
        model = build(name, args.size)
        found = detection.predict(model, images)
        targets = [{k: v for k, v in detection.kept(f, 0.05).items() if k != "scores"} for f in found]
        t_floor = timed(lambda: floor(model, images, targets), args.rounds)

        def ratio(strategy: str, method: str) -> str:
            settings = SimpleNamespace(box_threshold=0.05, aggregate="mean", seed=0, egl_samples=args.samples,
                                       method=method)
            t = timed(lambda: detection.utility(strategy, model, images, detection.predict(model, images),
                                                ids, settings), args.rounds, warm=method != "loop")
            return f"{t / t_floor:.2f}x"

        batched = detection.method(model, "auto")[1].startswith("batched")
        cells = [ratio("gradnorm", "auto"), ratio("egl", "auto")]
        loop = ["(as left)"] * 2 if not batched else ["-"] * 2 if args.no_loop else \
            [ratio("gradnorm", "loop"), ratio("egl", "loop")]
        boxes = statistics.mean(len(t["boxes"]) for t in targets)
        print(f"| {name} | {detection.method(model, 'auto')[0]} | {t_floor:.3f} | {' | '.join(cells + loop)} | "
              f"{boxes:.0f} |", flush=True)


if __name__ == "__main__":
    main()
