"""FCOS through the gradient engine: its loss splits by image (a focal loss over every point, a
GIoU and a centre-ness loss over the foreground points, each over the image's own foreground
count), so images padded alike give a per-example function of one batched forward.

    batched.Heads(model, OUTPUTS)(x) -> out [B, A, C + 5]   (class logits, box deltas,
                                                                      centre-ness logit)
    dense_targets(...)                        -> t   [B, A, C + 10]  (one-hot class, box, anchor,
                                                                      centre-ness, foreground)
    per_image_loss(out, t)                    -> [B] = (focal + GIoU(fg) + BCE(fg)) / n_fg
"""
from __future__ import annotations

from types import SimpleNamespace

import torch
from torch import nn


def servable(model: nn.Module) -> bool:
    return type(model).__name__ == "FCOS"


OUTPUTS = ("cls_logits", "bbox_regression", "bbox_ctrness")  # batched.Heads concatenates these
BY_LEVEL = True  # torchvision's postprocess takes the outputs per pyramid level


def _matches(model: nn.Module, targets: list[dict], anchors: list[torch.Tensor], per_level: list[int]):
    """torchvision's own assignment of points to boxes (centre sampling, scale ranges, the
    smallest box): FCOS.compute_loss run with a head that hands its matches back."""
    catch = SimpleNamespace(center_sampling_radius=model.center_sampling_radius,
                            head=SimpleNamespace(compute_loss=lambda t, h, a, matched: matched))
    return type(model).compute_loss(catch, targets, {}, anchors, per_level)


def dense_targets(model: nn.Module, image_list, anchors: list[torch.Tensor], sizes, originals,
                  targets: list[dict], dtype) -> torch.Tensor:
    """Per image and point: the one-hot class, the matched box (its anchor for the background),
    the anchor, the centre-ness target (0 for the background) and whether it is foreground."""
    from torchvision.models.detection.transform import resize_boxes
    resized = [{"boxes": resize_boxes(t["boxes"].to(a.dtype), o, s), "labels": t["labels"]}
               for t, a, o, s in zip(targets, anchors, originals, image_list.image_sizes)]
    matched = _matches(model, resized, anchors, [h * w for h, w in sizes])
    classes = model.head.classification_head.num_classes
    rows = []
    for a, target, m in zip(anchors, resized, matched):
        fg = m >= 0
        box = a.clone()
        box[fg] = target["boxes"][m[fg]]
        codes = model.head.box_coder.encode(a, box)       # [A, 4] distances to the box's sides
        lr, tb = codes[:, [0, 2]], codes[:, [1, 3]]
        centre = torch.sqrt((lr.min(-1)[0] / lr.max(-1)[0]) * (tb.min(-1)[0] / tb.max(-1)[0]))
        out = torch.zeros(a.shape[0], classes + 10, dtype=dtype, device=a.device)
        out[fg, target["labels"][m[fg]]] = 1.0
        out[:, classes:classes + 4] = box.to(dtype)
        out[:, classes + 4:classes + 8] = a.to(dtype)
        out[fg, classes + 8] = centre[fg].to(dtype)
        out[:, classes + 9] = fg.to(dtype)
        rows.append(out)
    return torch.stack(rows)


def per_image_loss(out: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """[B]: the focal loss over every point plus the GIoU loss of the decoded boxes and the
    centre-ness BCE over the foreground points, over the image's foreground count (at least 1)."""
    from torchvision.models.detection._utils import BoxLinearCoder
    from torchvision.ops import generalized_box_iou_loss, sigmoid_focal_loss
    classes = out.shape[-1] - 5
    fg = t[..., classes + 9] > 0                                   # [B, A]
    image = torch.arange(out.shape[0], device=out.device)[:, None].expand_as(fg)[fg]  # [F]
    focal = sigmoid_focal_loss(out[..., :classes], t[..., :classes], reduction="none").sum((1, 2))
    boxes = BoxLinearCoder(normalize_by_size=True).decode(out[..., classes:classes + 4][fg],
                                                          t[..., classes + 4:classes + 8][fg])
    giou = generalized_box_iou_loss(boxes, t[..., classes:classes + 4][fg], reduction="none")
    centre = nn.functional.binary_cross_entropy_with_logits(
        out[..., classes + 4][fg], t[..., classes + 8][fg], reduction="none")
    per_point = torch.zeros_like(focal).index_add(0, image, giou + centre)
    return (focal + per_point) / fg.sum(1).clamp_min(1)
