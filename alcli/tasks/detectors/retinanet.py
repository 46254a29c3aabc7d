"""RetinaNet through the gradient engine: its loss splits by image (a focal loss and an L1 box loss
per image, each over that image's own foreground count, no sampling), so for images of one size
(padded alike, as each would be alone) the per-image losses are a per-example function of one
batched forward of the backbone and head, which the engine's batched methods differentiate.

    batched.Heads(model, OUTPUTS)(x) -> out [B, A, C + 4]   (class logits, box deltas)
    dense_targets(...)                        -> t   [B, A, C + 6]   (one-hot class, box targets,
                                                                      valid, foreground)
    per_image_loss(out, t)                    -> [B] = focal(valid) / n_fg + L1(foreground) / n_fg

This is the per-image loss of alcli.tasks.detection (the image alone); alcli.tasks.detectors.batched
runs it, and tests/test_detection.py compares the two.
"""
from __future__ import annotations

import torch
from torch import nn

from .matching import matched_anchors


def servable(model: nn.Module) -> bool:
    """torchvision's RetinaNet with its default L1 box loss (v2's GIoU is left to the loop)."""
    return type(model).__name__ == "RetinaNet" and \
        getattr(model.head.regression_head, "_loss_type", None) == "l1"


OUTPUTS = ("cls_logits", "bbox_regression")  # batched.Heads concatenates these
BY_LEVEL = True  # torchvision's postprocess takes the outputs per pyramid level


def dense_targets(model: nn.Module, image_list, anchors: list[torch.Tensor], sizes, originals,
                  targets: list[dict], dtype) -> torch.Tensor:
    """Per image and anchor: the one-hot class target, the encoded box target, and whether the
    anchor counts (not between the IoU thresholds) and is foreground -> [B, A, C + 6]."""
    classes = model.head.classification_head.num_classes
    rows = []
    for a, target, original, size in zip(anchors, targets, originals, image_list.image_sizes):
        out = torch.zeros(a.shape[0], classes + 6, dtype=dtype, device=a.device)
        boxes, matched = matched_anchors(model, a, target, original, size)
        fg = matched >= 0
        out[fg, target["labels"][matched[fg]]] = 1.0
        out[fg, classes:classes + 4] = model.box_coder.encode_single(boxes[matched[fg]], a[fg]).to(dtype)
        out[:, classes + 4] = (matched != model.proposal_matcher.BETWEEN_THRESHOLDS).to(dtype)
        out[:, classes + 5] = fg.to(dtype)
        rows.append(out)
    return torch.stack(rows)


def per_image_loss(out: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """[B]: the focal loss over the anchors that count plus the L1 loss of the foreground's box
    deltas, each over the image's foreground count (at least 1), as torchvision's heads sum them."""
    from torchvision.ops import sigmoid_focal_loss
    classes = out.shape[-1] - 4
    valid, fg = t[..., classes + 4], t[..., classes + 5]
    count = fg.sum(1).clamp_min(1)
    focal = sigmoid_focal_loss(out[..., :classes], t[..., :classes], reduction="none").sum(-1)
    l1 = (out[..., classes:] - t[..., classes:classes + 4]).abs().sum(-1)
    return ((focal * valid).sum(1) + (l1 * fg).sum(1)) / count
