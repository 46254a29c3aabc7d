"""Instance segmentation: torchvision's Mask R-CNN (--arch torchvision:maskrcnn_resnet50_fpn),
one row per image. A detector (alcli.tasks.detection) whose every instance also has a mask: per
image {boxes [N, 4], labels [N], scores [N], masks [N, 1, H, W] (each pixel's probability, in the
image's pixels)}; in training mode its loss adds the masks' per-pixel binary cross-entropy to the
box terms.

The per-image loss ℓ(x, T) is detection's (the image alone, normalisation as in inference, R-CNN's
sampling seeded by (--seed, id)) at targets T that carry each instance's mask: the pseudo-labels
T̂ are the predicted instances scoring at least --box-threshold with their masks (pixels of
probability at least 0.5); egl's label sets keep instance j with its mask with probability p_j.
The cheap utilities are detection's, over the instances' box scores; the gradient ones go through
the engine batched as Faster R-CNN's (detectors.rcnn: the mask head at each image's positive
proposals, its term normalised over that image's positives).

Rows are detection's (score, pred, confidence, loss, uncertain, boxes, width, height) and `masks`:
per pseudo-label instance its mask as COCO's uncompressed run-length code {"size": [H, W],
"counts": [...]} (runs of 0s and 1s, column by column, starting with 0s), JSON. Label Studio
pre-labels are the instances' rectangles (detection's rectanglelabels).
"""
from __future__ import annotations

import json

import torch
from torch import nn

from ..errors import RunError
from . import detection
from .common import Task
from .shared.labelstudio import names_control

MASK_THRESHOLD = 0.5  # a pixel of a predicted mask belongs to the instance at this probability


def is_mask_detector(model: nn.Module) -> bool:
    return type(model).__module__.startswith("torchvision.models.detection") and \
        any(k.__name__ == "MaskRCNN" for k in type(model).__mro__)


def not_a_mask_detector(model: nn.Module) -> str | None:
    if not is_mask_detector(model):
        return (f"--task instance-segmentation needs an instance segmenter (torchvision's Mask R-CNN, "
                f"--arch torchvision:maskrcnn_resnet50_fpn), and the model is a {type(model).__name__}")
    return None


EXTRA = ("masks",)  # the per-instance fields beside boxes, labels and scores


def kept(found: dict, threshold: float) -> dict:
    """The proper predicted instances scoring at least `threshold`, with their masks."""
    return detection.kept(found, threshold, EXTRA)


def target(found: dict) -> dict:
    """A training target: boxes [N, 4], labels [N], masks [N, H, W] uint8 (the pixels at least
    MASK_THRESHOLD)."""
    return {"boxes": found["boxes"], "labels": found["labels"],
            "masks": (found["masks"][:, 0] >= MASK_THRESHOLD).to(torch.uint8)}


def rows(model: nn.Module, images: list[torch.Tensor], ids: list, settings, names) -> list[dict]:
    """One row per image: detection's columns and `masks`, a run-length code per pseudo-label
    instance, JSON."""
    if settings.strategy not in detection.UTILITIES:
        raise RunError(f"--strategy {settings.strategy} is not defined for --task instance-segmentation; "
                       f"use one of {', '.join(detection.UTILITIES)}")
    found, scores, losses = detection.scored(settings.strategy, model, images, ids, settings, EXTRA, target)
    return detection.rows_of(images, found, ids, scores, losses, settings, names,
                             keep=kept, extra=_masks_column)


def run_lengths(mask: torch.Tensor) -> dict:
    """COCO's uncompressed RLE of a binary mask [H, W]: the lengths of its runs of 0s and 1s in
    column-major order, the first a run of 0s (of length 0 when the first pixel is set)."""
    h, w = mask.shape
    flat = mask.T.reshape(-1).to(torch.int8).cpu()
    starts = torch.nonzero(flat[1:] != flat[:-1]).flatten() + 1           # where a new run begins
    bounds = torch.cat([torch.zeros(1, dtype=torch.long), starts, torch.tensor([flat.numel()])])
    counts = (bounds[1:] - bounds[:-1]).tolist() if flat.numel() else []
    if flat.numel() and int(flat[0]) == 1:
        counts = [0] + counts
    return {"size": [int(h), int(w)], "counts": counts}


def _masks_column(pseudo: dict) -> dict:
    """`masks`: a run-length code per pseudo-label instance, JSON."""
    return {"masks": json.dumps([run_lengths(m[0] >= MASK_THRESHOLD) for m in pseudo["masks"]])}


TASK = Task(
    name="instance-segmentation", shape="a list of {boxes, labels, scores, masks} per image",
    fits=lambda out: False, names_model=is_mask_detector,
    no_badge="an instance segmenter's rows have no BADGE embeddings",
    prelabels=detection._rectangles, unnamed=detection._unnamed, shown_by_rows=lambda row: "masks" in row,
    control=names_control("instance-segmentation", "RectangleLabels"),
    sized_images=True, model_kind="an instance segmenter", needs_model=not_a_mask_detector,
    model_classes=detection.classes, predict=detection.predict, rows=rows, method=detection.method,
    gradient_utilities=detection.GRADIENT_UTILITIES, unanswered=detection.refuses_given_boxes("instance-segmentation", parts="masks"),
    default_strategy="egl",  # no learning curves yet: the incumbent (tests/test_defaults.py)
)
