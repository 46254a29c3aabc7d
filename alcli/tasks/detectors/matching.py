"""The anchor matching RetinaNet's and SSD's batched targets share: an image's given boxes resized
to the model's input, and each anchor's matched box by the model's own proposal_matcher."""
from __future__ import annotations

import torch
from torch import nn


def matched_anchors(model: nn.Module, anchors: torch.Tensor, target: dict, original, size
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """(the boxes [M, 4] at the input's size, per anchor the index of its box [A]: -1 below the
    matcher's low threshold, -2 between its thresholds, -1 for all where the image has none)."""
    from torchvision.models.detection.transform import resize_boxes  # a detector's run has it loaded
    from torchvision.ops import box_iou
    boxes = resize_boxes(target["boxes"].to(anchors.dtype), original, size)
    if boxes.numel() == 0:
        return boxes, torch.full((anchors.shape[0],), -1, dtype=torch.long, device=anchors.device)
    return boxes, model.proposal_matcher(box_iou(boxes, anchors))
