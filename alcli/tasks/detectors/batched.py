"""The one-stage detectors (RetinaNet, FCOS, SSD) through the gradient engine: one module each
(alcli.tasks.detectors.retinanet, .fcos, .ssd) with the same four names, whose per-image losses are
per-example functions of one batched forward:

    servable(model)                              -> whether the module serves this detector
    Heads(model, OUTPUTS)(x [B, 3, H, W] transformed) -> out [B, A, D]   (backbone and head, the
                                                    feature maps' sizes kept in .sizes)
    dense_targets(model, image_list, anchors, sizes, originals, targets, dtype) -> t [B, A, E]
                                                 (anchors: per image [A, 4], of anchors_at)
    per_image_loss(out, t)                       -> [B]: each image's loss, normalised over
                                                    that image alone
    BY_LEVEL                                     whether torchvision's postprocess takes the
                                                    outputs and anchors split by pyramid level

The predictions the pseudo-labels come from are decoded from the same forward (`decoded`:
torchvision's own postprocess of the head outputs), so gradnorm and egl cost one forward and the
engine's backward, not a prediction forward besides.

Images whose transform (resize, normalise, pad) gives the same padded size go in one batch: the
tensor each gets alone, so the batch gives what the per-image loop gives.
"""
from __future__ import annotations

import weakref
from typing import Callable

import torch
from torch import nn

from . import fcos, retinanet, ssd

KINDS = (retinanet, fcos, ssd)


def kind(model: nn.Module):
    """The module serving this detector batched, or None (Faster R-CNN, DETR, and a training
    transform of several sizes, whose loss draws one per image: the loop)."""
    found = next((k for k in KINDS if k.servable(model)), None)
    return found if found is not None and one_size(model) else None


def one_size(model: nn.Module) -> bool:
    """Does the training transform resize as inference does (one min_size, resizing not skipped
    in training)? Then the tensor inference gives an image is the one its loss is taken at."""
    return len(model.transform.min_size) == 1 and not getattr(model.transform, "_skip_resize", False)


_heads: "weakref.WeakKeyDictionary[nn.Module, nn.Module]" = weakref.WeakKeyDictionary()


class Heads(nn.Module):
    """A one-stage detector's backbone and head on a transformed batch -> [B, A, D]: the head's
    `outputs` concatenated; the feature maps' sizes of the last call kept, for the anchors."""

    def __init__(self, model: nn.Module, outputs: tuple[str, ...]):
        super().__init__()
        self.backbone, self.head, self.outputs = model.backbone, model.head, outputs
        self.sizes: list[tuple[int, int]] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        features = self.backbone(x)  # SSD's may be one tensor
        features = [features] if isinstance(features, torch.Tensor) else list(features.values())
        self.sizes = [tuple(f.shape[-2:]) for f in features]
        out = self.head(features)
        return torch.cat([out[k] for k in self.outputs], -1)


def anchors_at(model: nn.Module, image_list, sizes: list[tuple[int, int]]) -> list[torch.Tensor]:
    """The model's anchors per image [A, 4] for feature maps of `sizes` (empty maps: the anchor
    generator reads only their shapes)."""
    x = image_list.tensors
    maps = [torch.empty(0, 0, h, w, dtype=x.dtype, device=x.device) for h, w in sizes]
    return model.anchor_generator(image_list, maps)


def heads(model: nn.Module) -> nn.Module:
    """The model's Heads, one per model: the engine keeps what it learned of a module (its probes)."""
    if model not in _heads:
        _heads[model] = Heads(model, kind(model).OUTPUTS)
    return _heads[model]


def padded_groups(model: nn.Module, images: list[torch.Tensor], seeds: list[int] | None = None
                  ) -> list[tuple[list[int], object]]:
    """(positions, ImageList) per padded size: each image transformed alone, those of one
    padded size stacked. `seeds`: each image's transform seeded by its own (a training transform
    of several sizes draws one, as the loop draws it)."""
    from torchvision.models.detection.image_list import ImageList

    def transformed(img: torch.Tensor, seed: int | None):
        if seed is None:
            return model.transform([img])[0]
        with torch.random.fork_rng(devices=[img.device] if img.device.type == "cuda" else []):
            torch.manual_seed(seed)
            return model.transform([img])[0]

    alone = [transformed(img, None if seeds is None else seeds[i]) for i, img in enumerate(images)]
    groups: dict[tuple, list[int]] = {}
    for i, one in enumerate(alone):
        groups.setdefault(tuple(one.tensors.shape), []).append(i)
    return [(members, ImageList(torch.cat([alone[i].tensors for i in members]),
                                [alone[i].image_sizes[0] for i in members]))
            for members in groups.values()]


WIDTHS = {"bbox_regression": 4, "bbox_ctrness": 1}  # per anchor; the class logits take the rest


def decoded(model: nn.Module, out: torch.Tensor, image_list, sizes: list[tuple[int, int]],
            anchors: list[torch.Tensor], originals: list[tuple[int, int]]) -> list[dict]:
    """Heads' out [B, A, D] (detached, in eval mode) -> per image {boxes, labels, scores} in its
    original pixels: torchvision's own postprocess, what model(images) returns."""
    names = kind(model).OUTPUTS
    widths = [WIDTHS.get(name, 0) for name in names]
    widths = [w or out.shape[-1] - sum(widths) for w in widths]
    head_outputs = dict(zip(names, out.split(widths, -1)))
    if kind(model).BY_LEVEL:  # each level's share of the A anchors: its h * w points x anchors per point
        per_point = [h * w for h, w in sizes]
        per_level = [n * (out.shape[1] // sum(per_point)) for n in per_point]
        head_outputs = {name: list(v.split(per_level, 1)) for name, v in head_outputs.items()}
        anchors = [list(a.split(per_level)) for a in anchors]
    found = model.postprocess_detections(head_outputs, anchors, image_list.image_sizes)
    return model.transform.postprocess(found, image_list.image_sizes, originals)


def norms(model: nn.Module, images: list[torch.Tensor],
          target_sets: list[list[dict]] | Callable[[int, dict], list[dict]], method: str
          ) -> tuple[torch.Tensor, torch.Tensor, list[dict] | None]:
    """Images and K target sets (each a target per image) -> ([K, B] gradient norms, [K, B]
    losses, None): one forward and the engine's backward per padded size. `target_sets` may be a
    function (an image's position, its predictions) -> its K targets: the predictions are then
    decoded from that forward, and come back third (per image {boxes, labels, scores})."""
    from ...gradnorm import grad_norms_per_target
    k = kind(model)
    heads_ = heads(model)
    found: list[dict | None] = [None] * len(images)
    per_group = []
    with torch.no_grad():
        groups = padded_groups(model, images)
    for members, image_list in groups:
        originals = [tuple(images[i].shape[-2:]) for i in members]
        dense: list[torch.Tensor] = []

        def targets_for(out: torch.Tensor) -> list[torch.Tensor]:
            anchors = anchors_at(model, image_list, heads_.sizes)
            if callable(target_sets):  # out [2, ...] for one image (gradnorm.api.ONE_EXAMPLE_BUG)
                mine = decoded(model, out[:len(members)], image_list, heads_.sizes, anchors, originals)
                for i, f in zip(members, mine):
                    found[i] = f
                per_image = [target_sets(i, found[i]) for i in members]
                sets = [list(ts) for ts in zip(*per_image)]
            else:
                sets = [[ts[i] for i in members] for ts in target_sets]
            dense[:] = [k.dense_targets(model, image_list, anchors, heads_.sizes, originals, ts, out.dtype)
                        for ts in sets]
            # the engine runs a batch of one as two copies (gradnorm.api.ONE_EXAMPLE_BUG)
            return [t.repeat(out.shape[0] // t.shape[0], 1, 1) for t in dense]

        g, out = grad_norms_per_target(heads_, image_list.tensors, targets_for, method=method,
                                       loss_fn=k.per_image_loss)
        with torch.no_grad():
            values = torch.stack([k.per_image_loss(out, t) for t in dense])
        per_group.append((members, g, values))
    return (*in_order(per_group, len(images)), found if callable(target_sets) else None)


def in_order(per_group: list[tuple[list[int], torch.Tensor, torch.Tensor]], count: int
             ) -> tuple[torch.Tensor, torch.Tensor]:
    """Each group's (positions, [K, b] norms, [K, b] losses) -> [K, count] norms and losses in
    float64 on the CPU, each image at its position."""
    sets = per_group[0][1].shape[0] if per_group else 0
    grads = torch.zeros(sets, count, dtype=torch.float64)
    losses = torch.zeros_like(grads)
    for members, g, values in per_group:
        grads[:, members] = g.to(torch.float64).cpu()
        losses[:, members] = values.to(torch.float64).cpu()
    return grads, losses
