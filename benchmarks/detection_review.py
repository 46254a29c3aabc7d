"""Detection label review: how well `alcli review`'s image score (alcli.tasks.detection.match,
through review_own, the very function the command calls on each labeled image) finds images
whose boxes were corrupted, with a detector whose predictions are controlled.

Why a controlled detector, not a trained one: training a Faster R-CNN to a useful recall takes
hours on this shared 2-core CPU, and the rule under test is the matching of given boxes against
predictions; the detector's quality is then a knob (recall, class accuracy, localization, false
positives), so the table says how the review degrades as the detector does. The gradient column
of `alcli review` (the loss at the given boxes) needs a real model and is not measured here.

Per seed: IMAGES images of 640x480, each with 1-6 objects (boxes 30-200 px, 10 classes in 5
confusable pairs); the detector sees each object with probability `recall`, its box jittered
(each side by a normal of `jitter` x the box's size), its class right with probability
`class_acc` (else the pair's other class), a confidence ~ Beta(8, 2) (a wrong class: Beta(3, 3));
plus Poisson(`fp`) false positives per image (confidence uniform 0.3-0.8) and, for every object,
a low duplicate below the threshold. Then 15% of the images get one corruption of their given
boxes, a quarter each: a box dropped, a box's class changed to another class, a spurious box
added where nothing is, a box shifted by its own width (IoU < 0.5). The review runs at
--box-threshold 0.5 (the default). Per detector: AUROC of the image score for the corrupted
images, precision at k (k = the number corrupted), the flag's precision and recall, AUROC per
kind of corruption (that kind's images against the clean ones); mean ± sd over seeds.

    python benchmarks/detection_review.py [--seeds 10] [--images 500] [--quick]
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from alcli.tasks import detection  # noqa: E402

W, H, CLASSES = 640, 480, 10
KINDS = ("dropped", "class", "spurious", "shifted")
DETECTORS = {  # name -> (recall, class accuracy, jitter, false positives per image)
    "good": (0.95, 0.97, 0.03, 0.1),
    "fair": (0.85, 0.90, 0.06, 0.3),
    "weak": (0.70, 0.80, 0.10, 0.6),
}


def scene(rng) -> list[list]:
    """1-6 boxes [x0, y0, x1, y1, class]."""
    out = []
    for _ in range(rng.integers(1, 7)):
        w, h = rng.uniform(30, 200, 2)
        x0, y0 = rng.uniform(0, W - w), rng.uniform(0, H - h)
        out.append([x0, y0, x0 + w, y0 + h, int(rng.integers(CLASSES))])
    return out


def partner(c: int) -> int:
    return c ^ 1  # classes 2k and 2k+1 are a confusable pair


def detect(truth: list[list], rng, recall: float, class_acc: float, jitter: float,
           fp: float) -> list[list]:
    """The controlled detector's predictions [x0, y0, x1, y1, class, confidence]."""
    preds = []
    for x0, y0, x1, y1, c in truth:
        w, h = x1 - x0, y1 - y0
        box = [x0 + rng.normal(0, jitter) * w, y0 + rng.normal(0, jitter) * h,
               x1 + rng.normal(0, jitter) * w, y1 + rng.normal(0, jitter) * h]
        box = [min(box[0], box[2] - 1), min(box[1], box[3] - 1), box[2], box[3]]
        if rng.random() < recall:
            right = rng.random() < class_acc
            preds.append([*box, c if right else partner(c),
                          float(rng.beta(8, 2) if right else rng.beta(3, 3))])
        preds.append([*box, c, float(rng.uniform(0.05, 0.3))])  # a low duplicate, not drawn
    for _ in range(rng.poisson(fp)):
        b = scene(rng)[0]
        preds.append([*b[:4], b[4], float(rng.uniform(0.3, 0.8))])
    return preds


def corrupt(truth: list[list], kind: str, rng) -> list[list]:
    given = [list(b) for b in truth]
    k = int(rng.integers(len(given)))
    if kind == "dropped":  # (images of two boxes or more: main gives one-box images `class`)
        del given[k]
    elif kind == "class":
        given[k][4] = int((given[k][4] + rng.integers(1, CLASSES)) % CLASSES)
    elif kind == "spurious":
        given.append(scene(rng)[0])
    else:  # shifted by its own width (or height): IoU with the truth below 0.5
        x0, y0, x1, y1, c = given[k]
        dx = (x1 - x0) * (1 if x0 < W / 2 else -1)
        given[k] = [x0 + dx, y0, x1 + dx, y1, c]
    return given


def auroc(is_error: np.ndarray, score: np.ndarray) -> float:
    from sklearn.metrics import roc_auc_score
    return float(roc_auc_score(is_error, score))


def one_seed(seed: int, images: int, detector: tuple) -> dict:
    rng = np.random.default_rng(seed)
    truths = [scene(rng) for _ in range(images)]
    # the corrupted images: 15%, a quarter of each kind; `dropped` needs two boxes or more
    order = rng.permutation(images)
    bad = order[:int(0.15 * images)]
    kinds = np.array(["clean"] * images, dtype=object)
    for n, i in enumerate(bad):
        kinds[i] = KINDS[n % 4]
    for i in bad:  # an image of one box cannot lose it and stay labeled: another kind instead
        if kinds[i] == "dropped" and len(truths[i]) == 1:
            kinds[i] = "class"
    given = [corrupt(t, k, rng) if k != "clean" else t for t, k in zip(truths, kinds)]
    units = [[[g, detect(t, rng, *detector), 0.5, W, H]] for g, t in zip(given, truths)]
    rows = detection.review_own(units, None)
    score = np.array([r["score"] for r in rows])
    flagged = np.array([r["flagged"] for r in rows])
    err = kinds != "clean"
    k = int(err.sum())
    top = np.argsort(-score, kind="stable")[:k]
    out = {"auroc": auroc(err, score), "p@k": float(err[top].mean()),
           "flag precision": float(err[flagged].mean()) if flagged.any() else float("nan"),
           "flag recall": float(flagged[err].mean()), "flagged clean": float(flagged[~err].mean())}
    for kind in KINDS:
        mine = (kinds == kind) | ~err
        if (kinds == kind).any():
            out[f"auroc {kind}"] = auroc(err[mine], score[mine])
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--images", type=int, default=500)
    ap.add_argument("--quick", action="store_true", help="2 seeds, 100 images")
    ap.add_argument("--out", help="also write the markdown here")
    args = ap.parse_args()
    seeds, images = (2, 100) if args.quick else (args.seeds, args.images)
    began = time.perf_counter()
    cols = ["auroc", "p@k", "flag precision", "flag recall", "flagged clean"] + \
        [f"auroc {k}" for k in KINDS]
    lines = [f"{images} images a seed (1-6 boxes, {CLASSES} classes in 5 confusable pairs), 15% "
             f"corrupted (a quarter each: {', '.join(KINDS)}), {seeds} seeds; the score of "
             f"alcli review's image (detection.review_own) at --box-threshold 0.5; mean ± sd "
             f"over seeds", "",
             "| detector (recall, class acc., jitter, FP/image) | " + " | ".join(cols) + " |",
             "|---" * (len(cols) + 1) + "|"]
    for name, det in DETECTORS.items():
        runs = [one_seed(s, images, det) for s in range(seeds)]
        cells = [f"{np.nanmean([r[c] for r in runs]):.3f} ± {np.nanstd([r[c] for r in runs]):.3f}"
                 for c in cols]
        lines.append(f"| {name} {det} | " + " | ".join(cells) + " |")
    lines += ["", f"({time.perf_counter() - began:.0f} s)"]
    text = "\n".join(lines)
    print(text)
    if args.out:
        with open(args.out, "w") as fh:
            fh.write(text + "\n")


if __name__ == "__main__":
    main()
