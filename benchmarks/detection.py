"""Detection speed: alcli's per-image utilities ÷ one plain forward+backward of the batch's summed
training loss (the floor), side by side in one process, median of several rounds: gradnorm and
egl with S label sets batched through the engine (as `auto` runs them, but the R-CNNs' egl, which
`auto` loops: `--method ghost`) and, beside them, the per-image loop (`--method loop`). Every
utility includes its predictions; "predictions alone" is what they cost by themselves (a no-grad
`model(images)`), which the batched utilities take from a pass they run anyway. Their warm-up call
runs on other images of the same size, as a pool's next batch is other images (rounds after the
first repeat the batch).

    nice -n 10 python benchmarks/detection.py [--size 320] [--batch 8] [--samples 8] [--rounds 1]

Random weights, `--size` square images (SSD resizes to 320 itself), targets = the predicted
instances scoring at least 0.05, with their masks or keypoints (the same pseudo-labels for the
floor and for alcli).
"""
from __future__ import annotations

import argparse
import statistics
import time
from types import SimpleNamespace

import torch
import torchvision

from alcli.tasks import detection, instances, keypoints
from alcli.tasks.detectors import rcnn

DETECTORS = ("fasterrcnn_mobilenet_v3_large_320_fpn", "fasterrcnn_resnet50_fpn", "retinanet_resnet50_fpn",
             "fcos_resnet50_fpn", "ssdlite320_mobilenet_v3_large", "maskrcnn_resnet50_fpn",
             "keypointrcnn_resnet50_fpn")
# per detector: (its instances above a threshold, a training target of them, the per-instance
# fields beside boxes) of the task module that scores it (instance segmentation, keypoints)
TASK_OF = {"maskrcnn": (instances.kept, instances.target, instances.EXTRA),
           "keypointrcnn": (keypoints.kept, keypoints.target, keypoints.EXTRA)}
BOXES = (detection.kept, detection.box_target, ())


def build(name: str, size: int, proposals: int | None = None) -> torch.nn.Module:
    """`proposals`: an R-CNN's RPN proposals kept and boxes sampled per image (a dry run's few;
    None: torchvision's 2000/1000 and 512)."""
    kw = {} if name.startswith("ssd") else {"min_size": size, "max_size": size}
    if name.startswith(("retinanet", "fcos")):
        kw["score_thresh"] = 0.01  # random heads score about 0.01: some boxes to learn from
    if proposals and "rcnn" in name:
        kw.update({f"rpn_{when}_nms_top_n_{mode}": proposals for when in ("pre", "post")
                   for mode in ("train", "test")}, box_batch_size_per_image=proposals)
    torch.manual_seed(0)
    model = torchvision.models.get_model(name, weights=None, weights_backbone=None, num_classes=5, **kw).eval()
    if name.startswith("retinanet"):  # its prior puts every score near 0.01, under the 0.05 of the targets
        model.head.classification_head.cls_logits.bias.data += 2.0
    return model


def floor(model, images, targets) -> None:
    """One forward+backward of the batch's summed loss: what training one batch costs."""
    with detection.loss_mode(model):
        loss = sum(model(images, targets).values())
        loss.backward()
    model.zero_grad(set_to_none=True)


def timed(fn, rounds: int, warm: bool = True, sync=lambda: None, warm_fn=None) -> float:
    if warm:
        (warm_fn or fn)()  # warm-up (the engine's first call learns the model's layout)
        sync()
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def measure(name: str, images: list[torch.Tensor], samples: int, rounds: int, loop: bool = True,
            sync=lambda: None, warm: bool = True, proposals: int | None = None) -> dict:
    """One detector's row: how `auto` runs it, the floor's seconds, gradnorm and egl ÷ the floor
    as `auto` runs them and on the per-image loop (None where `auto` is the loop or loop=False);
    warm=False: no warm-up call (a dry run); proposals: build()'s."""
    device = images[0].device
    model = build(name, images[0].shape[-1], proposals).to(device)
    kept, target, extra = next((t for prefix, t in TASK_OF.items() if name.startswith(prefix)), BOXES)
    ids = [f"img{i}" for i in range(len(images))]
    found = detection.predict(model, images)
    targets = [target(kept(f, 0.05)) for f in found]
    t_floor = timed(lambda: floor(model, images, targets), rounds, warm=warm, sync=sync)
    # the predictions alone (model(images), no-grad): part of every utility, not of the floor
    t_predict = timed(lambda: detection.predict(model, images), rounds, warm=warm, sync=sync)

    # the utilities' warm-up runs on other images of the same size: a pool's next batch is other
    # images, so a layout the engine learns from one batch's contents (not its sizes) would show
    g = torch.Generator(device=device).manual_seed(1)
    others = [torch.rand(i.shape, generator=g, device=device) for i in images]

    def ratio(strategy: str, method: str) -> float:
        settings = SimpleNamespace(box_threshold=0.05, aggregate="mean", seed=0, egl_samples=samples,
                                   method=method)
        t = timed(lambda: detection.scored(strategy, model, images, ids, settings, extra, target),
                  rounds, warm=warm and method != "loop", sync=sync,
                  warm_fn=lambda: detection.scored(strategy, model, others, ids, settings, extra, target))
        return t / t_floor

    # the R-CNNs' egl batched: `auto` loops their label sets (the loop columns give that)
    gradnorm, egl = ratio("gradnorm", "auto"), ratio("egl", "ghost" if rcnn.servable(model) else "auto")
    how = detection.method(model, "auto")  # after a run: Faster R-CNN's gradnorm is batched once it ran
    on_loop = not how[1].startswith("batched")
    return {"method": how[0], "floor": t_floor, "predict": t_predict / t_floor, "gradnorm": gradnorm, "egl": egl,
            "loop gradnorm": None if on_loop or not loop else ratio("gradnorm", "loop"),
            "loop egl": None if on_loop or not loop else ratio("egl", "loop"),
            "on loop": on_loop, "boxes": statistics.mean(len(t["boxes"]) for t in targets)}


HEADER = ("| detector | method | floor (s) | predictions alone ÷ floor | gradnorm ÷ floor | egl ÷ floor | "
          "loop: gradnorm ÷ floor | loop: egl ÷ floor | boxes/image |\n|---|---|---|---|---|---|---|---|---|")


def row(name: str, m: dict) -> str:
    def cell(key: str) -> str:
        return "(as left)" if m["on loop"] else "-" if m[key] is None else f"{m[key]:.2f}x"
    return (f"| {name} | {m['method']} | {m['floor']:.3f} | {m['predict']:.2f}x | {m['gradnorm']:.2f}x | {m['egl']:.2f}x | "
            f"{cell('loop gradnorm')} | {cell('loop egl')} | {m['boxes']:.0f} |")


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
    print(f"batch {args.batch} x {args.size}px, {args.threads} threads, median of {args.rounds}, egl S = {args.samples}")
    print(HEADER)
    for name in args.only:
        print(row(name, measure(name, images, args.samples, args.rounds, loop=not args.no_loop)), flush=True)


if __name__ == "__main__":
    main()
