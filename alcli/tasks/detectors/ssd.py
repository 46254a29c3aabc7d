"""SSD and SSDlite through the gradient engine: their loss splits by image (a smooth-L1 box loss
over the matched default boxes and a cross-entropy over them and the image's own hardest
negatives, three per positive, over the image's own foreground count), so images padded alike
give a per-example function of one batched forward.

    batched.Heads(model, OUTPUTS)(x) -> out [B, A, C + 4]   (class logits, box deltas)
    dense_targets(...)                        -> t   [B, A, 7]       (class, box target, matched,
                                                                      how many negatives)
    per_image_loss(out, t)                    -> [B] = (L1(fg) + CE(fg) + CE(hardest negatives)) / n_fg
"""
from __future__ import annotations

import torch
from torch import nn

from .matching import matched_anchors


def servable(model: nn.Module) -> bool:
    return type(model).__name__ == "SSD"


OUTPUTS = ("cls_logits", "bbox_regression")  # batched.Heads concatenates these
BY_LEVEL = False  # torchvision's postprocess takes the outputs whole


def dense_targets(model: nn.Module, image_list, anchors: list[torch.Tensor], sizes, originals,
                  targets: list[dict], dtype) -> torch.Tensor:
    """Per image and default box: its class (0: background), its encoded box target, whether it
    is matched, and the image's number of hard negatives (neg_to_pos_ratio x its positives)."""
    rows = []
    for a, target, original, size in zip(anchors, targets, originals, image_list.image_sizes):
        out = torch.zeros(a.shape[0], 7, dtype=dtype, device=a.device)
        boxes, matched = matched_anchors(model, a, target, original, size)
        fg = matched >= 0
        out[fg, 0] = target["labels"][matched[fg]].to(dtype)
        out[fg, 1:5] = model.box_coder.encode_single(boxes[matched[fg]], a[fg]).to(dtype)
        out[:, 5] = fg.to(dtype)
        out[:, 6] = model.neg_to_pos_ratio * float((out[:, 0] > 0).sum())
        rows.append(out)
    return torch.stack(rows)


def per_image_loss(out: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """[B]: the smooth-L1 loss of the matched boxes' deltas and the cross-entropy of the
    positives and of the image's hardest negatives (by their loss, the positives left out), over
    the image's foreground count (at least 1)."""
    classes = out.shape[-1] - 4
    labels = t[..., 0].long()                                          # [B, A]
    ce = nn.functional.cross_entropy(out[..., :classes].flatten(0, 1), labels.flatten(),
                                     reduction="none").view(labels.shape)
    box = nn.functional.smooth_l1_loss(out[..., classes:], t[..., 1:5], reduction="none").sum(-1)
    positive = labels > 0
    negative = ce.detach().masked_fill(positive, -float("inf"))
    rank = negative.sort(1, descending=True)[1].sort(1)[1]            # each box's place, hardest first
    hard = rank < t[..., 6]
    return ((box * t[..., 5]).sum(1) + (ce * positive).sum(1) + (ce * hard).sum(1)) / t[..., 5].sum(1).clamp_min(1)
