"""Faster R-CNN through the gradient engine. Its loss splits by image once the random choices are
made: the RPN's loss is over the image's own sampled anchors (a BCE of their objectness, a
smooth-L1 of the positives' deltas, both over the image's sampled count), the box head's over the
image's own sampled proposals (a cross-entropy, a smooth-L1 of the positives' class deltas, over
its sampled count). So the choices are made first, without gradients and seeded per image as the
loop draws them (the training transform's size draw, the RPN's anchors, then the proposals), and
the proposals go in as an input: one batched forward then gives every image's loss.

    Heads(model)((x [B, 3, H, W], rois [B, R, 4]))  -> out [B, A + 4A + R (C + 4C)]
        (objectness and deltas per anchor; class logits and class deltas per proposal row)
    targets                                          -> t   [B, 1 + 7A + 7R]
        (A; per anchor: sampled, label, delta target, positive; per row: the same for the box head)
    per_image_loss(out, t)                           -> [B]

The R = S x k rows hold each of the S label sets' k sampled proposals (fewer padded, not counted):
the proposals depend on the label set, and one forward serves all S. The multi-scale RoI pooling
runs as every level's RoIAlign of every row, each row keeping its own level's (a static shape for
the engine; torchvision selects each level's rows).
"""
from __future__ import annotations

import warnings
import weakref

import torch
from torch import nn


def servable(model: nn.Module) -> bool:
    """torchvision's Faster R-CNN (not Mask or Keypoint R-CNN: their extra heads stay on the loop)."""
    return type(model).__name__ == "FasterRCNN"


class Heads(nn.Module):
    """The backbone, the RPN head and the box head at given proposals -> [B, A*5 + R*5C]."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.backbone, self.rpn_head = model.backbone, model.rpn.head
        self.box_head, self.box_predictor = model.roi_heads.box_head, model.roi_heads.box_predictor
        self.pool = model.roi_heads.box_roi_pool

    def forward(self, x: torch.Tensor, rois: torch.Tensor) -> torch.Tensor:
        from torchvision.models.detection.rpn import concat_box_prediction_layers
        from torchvision.ops import roi_align
        b, r = rois.shape[:2]
        features = self.backbone(x)
        objectness, deltas = self.rpn_head(list(features.values()))
        objectness, deltas = concat_box_prediction_layers(objectness, deltas)   # [B*A, 1], [B*A, 4]
        maps = [f for name, f in features.items() if name in self.pool.featmap_names]
        image = torch.arange(b, device=x.device, dtype=rois.dtype).repeat_interleave(r)[:, None]
        flat = torch.cat([image, rois.flatten(0, 1)], 1)                          # [B*R, 5]
        levels = self.pool.map_levels([rois.flatten(0, 1)])                       # [B*R]
        pooled = sum(roi_align(m, flat, self.pool.output_size, scale, self.pool.sampling_ratio)
                     * (levels == level).to(m.dtype)[:, None, None, None]
                     for level, (m, scale) in enumerate(zip(maps, self.pool.scales)))
        logits, box = self.box_predictor(self.box_head(pooled))                   # [B*R, C], [B*R, 4C]
        return torch.cat([objectness.reshape(b, -1), deltas.reshape(b, -1),
                          torch.cat([logits, box], 1).reshape(b, -1)], 1)


def per_image_loss(out: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """[B]: the box head's cross-entropy and smooth-L1 over the image's sampled proposals, then the
    RPN's BCE and smooth-L1 over its sampled anchors, summed in GeneralizedRCNN's order."""
    f = nn.functional
    b, a = out.shape[0], int(t[0, 0])
    r = (t.shape[1] - 1 - 7 * a) // 7
    c = (out.shape[1] - 5 * a) // (5 * r)
    rpn_t, roi_t = t[:, 1:1 + 7 * a].view(b, a, 7), t[:, 1 + 7 * a:].view(b, r, 7)
    objectness, deltas = out[:, :a], out[:, a:5 * a].view(b, a, 4)
    rows = out[:, 5 * a:].view(b, r, 5 * c)
    labels = roi_t[..., 1].long()
    ce = f.cross_entropy(rows[..., :c].flatten(0, 1), labels.flatten(), reduction="none").view(b, r)
    chosen = rows[..., c:].reshape(b, r, c, 4).gather(2, labels[..., None, None].expand(b, r, 1, 4))[:, :, 0]
    kept, sampled = roi_t[..., 0].sum(1), rpn_t[..., 0].sum(1)
    classifier = (ce * roi_t[..., 0]).sum(1) / kept
    box = (f.smooth_l1_loss(chosen, roi_t[..., 2:6], beta=1 / 9, reduction="none").sum(-1) * roi_t[..., 6]).sum(1) / kept
    bce = f.binary_cross_entropy_with_logits(objectness, rpn_t[..., 1], reduction="none")
    rpn_box = f.smooth_l1_loss(deltas, rpn_t[..., 2:6], beta=1 / 9, reduction="none").sum(-1)
    return classifier + box + (bce * rpn_t[..., 0]).sum(1) / sampled + (rpn_box * rpn_t[..., 6]).sum(1) / sampled


def _choices(model: nn.Module, image: torch.Tensor, target: dict, seed: int, anchors: torch.Tensor,
             proposals: torch.Tensor, dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One image at one label set, its random choices drawn as the loop draws them -> (rpn [A, 7],
    its sampled proposals [k', 4], their rows [k', 7])."""
    devices = [image.device] if image.device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        _, (resized,) = model.transform([image], [target])  # the training transform's size draw
        labels, matched = model.rpn.assign_targets_to_anchors([anchors], [resized])
        deltas = model.rpn.box_coder.encode(matched, [anchors])[0]
        (pos,), (neg,) = model.rpn.fg_bg_sampler(labels)
        chosen, _, classes, box_targets = model.roi_heads.select_training_samples([proposals.clone()], [resized])
    rpn = torch.cat([(pos | neg)[:, None], labels[0][:, None], deltas, pos[:, None]], 1).to(dtype)
    rows = torch.cat([torch.ones_like(classes[0])[:, None], classes[0][:, None], box_targets[0],
                      (classes[0] > 0)[:, None]], 1).to(dtype)
    return rpn, chosen[0], rows


_heads: "weakref.WeakKeyDictionary[nn.Module, Heads]" = weakref.WeakKeyDictionary()


def heads(model: nn.Module) -> Heads:
    if model not in _heads:
        _heads[model] = Heads(model)
    return _heads[model]


_ran: "weakref.WeakSet[nn.Module]" = weakref.WeakSet()


def ran(model: nn.Module) -> bool:
    """Has this model's gradient been taken batched (`auto` batches one label set only)?"""
    return model in _ran


def norms(model: nn.Module, images: list[torch.Tensor], target_sets: list[list[dict]], seeds: list[int],
          method: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Images, K target sets (each a target per image) and each image's seed -> ([K, B] gradient
    norms, [K, B] losses): the choices first, then one forward and the engine's backward per
    padded size. Call in detection.loss_mode (the RPN keeps its training proposal counts)."""
    from torchvision.models.detection.rpn import concat_box_prediction_layers
    from ..gradnorm import grad_norms_per_target
    from .batched import padded_groups
    heads_ = heads(model)
    _ran.add(model)
    k = model.roi_heads.fg_bg_sampler.batch_size_per_image
    grads = torch.zeros(len(target_sets), len(images), dtype=torch.float64)
    losses = torch.zeros_like(grads)
    with torch.no_grad():
        groups = padded_groups(model, images)
    for members, image_list in groups:
        x = image_list.tensors
        with torch.no_grad():
            features = model.backbone(x)
            if model.roi_heads.box_roi_pool.scales is None:  # set by its first call, as in the loop
                model.roi_heads.box_roi_pool(features, [x.new_tensor([[0.0, 0.0, 1.0, 1.0]])] * len(members),
                                             image_list.image_sizes)
            maps = list(features.values())
            objectness, deltas = model.rpn.head(maps)
            anchors = model.rpn.anchor_generator(image_list, maps)
            per_level = [o[0].numel() for o in objectness]
            objectness, deltas = concat_box_prediction_layers(objectness, deltas)
            decoded = model.rpn.box_coder.decode(deltas, anchors).view(len(members), -1, 4)
            proposals, _ = model.rpn.filter_proposals(decoded, objectness, image_list.image_sizes, per_level)
        a = anchors[0].shape[0]
        rois = x.new_zeros(len(members), len(target_sets) * k, 4)
        rois[..., 2:] = 1.0                                         # padding rows: a unit box, not counted
        dense = [x.new_zeros(len(members), 1 + 7 * a + 7 * len(target_sets) * k) for _ in target_sets]
        for col, i in enumerate(members):
            for s, ts in enumerate(target_sets):
                rpn, chosen, rows = _choices(model, images[i], ts[i], seeds[i], anchors[col], proposals[col], x.dtype)
                rois[col, s * k:s * k + len(chosen)] = chosen
                roi_t = x.new_zeros(len(target_sets) * k, 7)
                roi_t[s * k:s * k + len(rows)] = rows
                dense[s][col] = torch.cat([x.new_tensor([a]), rpn.flatten(), roi_t.flatten()])

        def targets_for(out: torch.Tensor) -> list[torch.Tensor]:
            # the engine runs a batch of one as two copies (gradnorm.api.ONE_EXAMPLE_BUG)
            return [t.repeat(out.shape[0] // t.shape[0], 1) for t in dense]

        with warnings.catch_warnings():  # the S label sets' vmapped backward runs RoIAlign's one at a time
            warnings.filterwarnings("ignore", message=".*batching rule for torchvision::_roi_align_backward")
            g, out = grad_norms_per_target(heads_, (x, rois), targets_for, method=method, loss_fn=per_image_loss)
        with torch.no_grad():
            values = torch.stack([per_image_loss(out, t) for t in dense])
        grads[:, members] = g.to(torch.float64).cpu()
        losses[:, members] = values.to(torch.float64).cpu()
    return grads, losses
