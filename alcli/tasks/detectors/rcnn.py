"""Faster, Mask and Keypoint R-CNN through the gradient engine. The loss splits by image once the
random choices are made: the RPN's loss is over the image's own sampled anchors (a BCE of their
objectness, a smooth-L1 of the positives' deltas, both over the image's sampled count), the box
head's over the image's own sampled proposals (a cross-entropy, a smooth-L1 of the positives'
class deltas, over its sampled count), and the second head's over the image's positive proposals:
Mask R-CNN's a per-pixel BCE of the mask logits at the row's class against the target mask cropped
to the proposal, over its positives' pixels; Keypoint R-CNN's a cross-entropy of each keypoint's
heatmap (softmax over its S x S cells) at the cell of the target keypoint, over the image's valid
keypoints (inside the proposal and visible). So the choices are made first, without gradients and
seeded per image as the loop draws them (the training transform's size draw, the RPN's anchors,
then the proposals), and the proposals go in as inputs: one batched forward then gives every
image's loss.

    Heads(model)((x [B, 3, H, W], rois [B, R, 4][, pos_rois [B, P, 4], pos_index [B, P(, K)]]))
        -> out [B, A + 4A + R (C + 4C) + P E]
        (objectness and deltas per anchor; class logits and class deltas per proposal row; per
        positive row its E = M*M mask logits at its class, or its K keypoints' log-probabilities
        at their target cells)
    targets -> t [B, 5 + 7A + 7R + P (1 + E)]
        (A, R, P, E, whether keypoints; per anchor: sampled, label, delta target, positive; per row:
        the same for the box head; per positive row: whether it counts, then its target mask or
        its keypoints' validity)
    per_image_loss(out, t) -> [B]

The R = S x k rows hold each of the S label sets' k sampled proposals (fewer padded, not counted):
the proposals depend on the label set, and one forward serves all S; the positive rows likewise.
The multi-scale RoI pooling takes each row at its own pyramid level, picked inside the forward
(roi_align.pooled), so R and P, not the rows' levels, make the inputs' shapes, and batches of one
image size share the engine's layout (learnt per shape, at the cost of about ten images' forward).
"""
from __future__ import annotations

import contextlib
import warnings
import weakref
from typing import Callable

import torch
from torch import nn

from . import roi_align


def servable(model: nn.Module) -> bool:
    """torchvision's Faster, Mask and Keypoint R-CNN, with torchvision's mask or keypoint predictor
    (the targets are drawn at the heatmap size it gives: 2x or 4x the pooled size) and RoI pools
    roi_align.pooled computes."""
    from torchvision.models.detection.keypoint_rcnn import KeypointRCNNPredictor
    from torchvision.models.detection.mask_rcnn import MaskRCNNPredictor
    predictors = {"FasterRCNN": type(None), "MaskRCNN": MaskRCNNPredictor, "KeypointRCNN": KeypointRCNNPredictor}
    want = predictors.get(type(model).__name__)
    if want is None:
        return False
    second_pool, _, predictor, _, _ = _second(model.roi_heads)
    pools = [pool for pool in (model.roi_heads.box_roi_pool, second_pool) if pool is not None]
    return type(predictor) is want and all(roi_align.servable(pool) for pool in pools)


def _second(roi_heads: nn.Module) -> tuple:
    """The RoI heads' second head at the positive proposals: (pool, head, predictor, heatmap size
    per pooled size, whether keypoints), Nones for Faster R-CNN."""
    if roi_heads.has_mask():
        return roi_heads.mask_roi_pool, roi_heads.mask_head, roi_heads.mask_predictor, 2, False
    if roi_heads.has_keypoint():
        return roi_heads.keypoint_roi_pool, roi_heads.keypoint_head, roi_heads.keypoint_predictor, 4, True
    return None, None, None, 0, False


class Heads(nn.Module):
    """The backbone, the RPN head, the box head at given proposals and, for Mask and Keypoint
    R-CNN, the mask or keypoint head at given positive proposals -> [B, A*5 + R*5C + P*E]."""

    def __init__(self, model: nn.Module):
        super().__init__()
        heads = model.roi_heads
        self.backbone, self.rpn_head = model.backbone, model.rpn.head
        self.box_head, self.box_predictor, self.pool = heads.box_head, heads.box_predictor, heads.box_roi_pool
        self.pos_pool, self.pos_head, self.pos_predictor, _, self.keypoints = _second(heads)
        self.k = heads.fg_bg_sampler.batch_size_per_image  # a label set's sampled proposals per image

    def forward(self, x: torch.Tensor, rois: torch.Tensor, pos_rois: torch.Tensor | None = None,
                pos_index: torch.Tensor | None = None) -> torch.Tensor:
        from torchvision.models.detection.rpn import concat_box_prediction_layers
        b, sets = rois.shape[0], rois.shape[1] // self.k
        features = self.backbone(x)
        objectness, deltas = self.rpn_head(list(features.values()))
        objectness, deltas = concat_box_prediction_layers(objectness, deltas)   # [B*A, 1], [B*A, 4]
        parts = [objectness.reshape(b, -1), deltas.reshape(b, -1)]
        # one call of the heads per label set: a set's backward reaches its own (_Parts), not all S
        maps = roi_align.maps_of(self.pool, features)
        table = roi_align.cell_table(maps)
        for s in range(sets):  # [B, k, 4] -> [B*k, C], [B*k, 4C] -> [B, k*5C]
            set_rois = rois[:, s * self.k:(s + 1) * self.k]
            logits, box = self.box_predictor(self.box_head(roi_align.pooled(maps, self.pool, set_rois, table)))
            parts.append(torch.cat([logits, box], 1).reshape(b, -1))
        if pos_rois is not None:
            if self.pos_pool.featmap_names != self.pool.featmap_names:  # else the box pool's table
                maps = roi_align.maps_of(self.pos_pool, features)
                table = roi_align.cell_table(maps)
            most = pos_rois.shape[1] // sets
            for s in range(sets):
                rows = slice(s * most, (s + 1) * most)
                parts.append(self._second(roi_align.pooled(maps, self.pos_pool, pos_rois[:, rows], table),
                                          pos_index[:, rows]))
        return _Parts.apply(*parts)

    def _second(self, pooled: torch.Tensor, pos_index: torch.Tensor) -> torch.Tensor:
        """The second head at one set's positive rows, pooled [B*P, C, s, s] -> [B, P*E]."""
        b = pos_index.shape[0]
        logits = self.pos_predictor(self.pos_head(pooled))
        if self.keypoints:  # [B*P, K, S, S] -> each heatmap's log-softmax over its S*S cells at the target's
            logp = logits.flatten(2).log_softmax(-1)
            return logp.gather(2, pos_index.reshape(-1, logp.shape[1], 1)).reshape(b, -1)   # [B, P*K]
        m = logits.shape[-1]  # [B*P, C, M, M] -> the mask logits at the row's class
        at = pos_index.flatten()[:, None, None, None].expand(-1, 1, m, m)
        return logits.gather(1, at).reshape(b, -1)                                        # [B, P*M*M]


class _Parts(torch.autograd.Function):
    """cat(parts, 1), whose backward gives a part with an all-zero gradient None, so autograd skips
    what made it. Label set s's loss reaches the RPN's parts and set s's own rows only: its
    backward runs set s's box and second-head calls, not all S sets' (S x S x k rows)."""

    @staticmethod
    def forward(ctx, *parts):
        ctx.widths = [p.shape[1] for p in parts]
        return torch.cat(parts, 1)

    @staticmethod
    def backward(ctx, grad):
        parts = grad.split(ctx.widths, 1)
        try:
            reached = torch.stack([p.ne(0).any() for p in parts]).tolist()   # one host sync
        except RuntimeError:  # the S sets' gradients vmapped as one: every part, as a plain cat
            return parts
        return tuple(p if r else None for p, r in zip(parts, reached))


def per_image_loss(out: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """[B]: the box head's cross-entropy and smooth-L1 over the image's sampled proposals, the mask
    head's per-pixel BCE over its positive ones (Mask R-CNN) or the keypoint head's cross-entropy
    over its valid keypoints (Keypoint R-CNN), then the RPN's BCE and smooth-L1 over its sampled
    anchors, summed in GeneralizedRCNN's order. t's first 5 columns: A, R, P, E, whether keypoints."""
    f = nn.functional
    b = out.shape[0]
    a, r, p, e, keypoints = (int(v) for v in t[0, :5])
    c = (out.shape[1] - 5 * a - p * e) // (5 * r)
    at = 5 + 7 * a + 7 * r                                          # where the positive rows' columns start
    rpn_t, roi_t = t[:, 5:5 + 7 * a].view(b, a, 7), t[:, 5 + 7 * a:at].view(b, r, 7)
    objectness, deltas = out[:, :a], out[:, a:5 * a].view(b, a, 4)
    rows = out[:, 5 * a:5 * a + 5 * r * c].view(b, r, 5 * c)
    labels = roi_t[..., 1].long()
    ce = f.cross_entropy(rows[..., :c].flatten(0, 1), labels.flatten(), reduction="none").view(b, r)
    chosen = rows[..., c:].reshape(b, r, c, 4).gather(2, labels[..., None, None].expand(b, r, 1, 4))[:, :, 0]
    kept, sampled = roi_t[..., 0].sum(1), rpn_t[..., 0].sum(1)
    loss = (ce * roi_t[..., 0]).sum(1) / kept
    loss = loss + (f.smooth_l1_loss(chosen, roi_t[..., 2:6], beta=1 / 9, reduction="none").sum(-1)
                   * roi_t[..., 6]).sum(1) / kept
    second = out[:, 5 * a + 5 * r * c:].view(b, p, e)
    if p and keypoints:  # the mean cross-entropy over the valid keypoints (0 without, as torchvision's)
        valid = t[:, at:at + p, None] * t[:, at + p:].view(b, p, e)
        loss = loss - (second * valid).sum((1, 2)) / valid.sum((1, 2)).clamp(min=1)
    elif p:  # the mean BCE over the positive rows' M x M pixels (0 without positives, as torchvision's)
        weight, pixels = t[:, at:at + p], t[:, at + p:].view(b, p, e)
        bce = f.binary_cross_entropy_with_logits(second, pixels, reduction="none")
        loss = loss + (bce.sum(-1) * weight).sum(1) / (weight.sum(1) * e).clamp(min=1)
    bce = f.binary_cross_entropy_with_logits(objectness, rpn_t[..., 1], reduction="none")
    rpn_box = f.smooth_l1_loss(deltas, rpn_t[..., 2:6], beta=1 / 9, reduction="none").sum(-1)
    return loss + (bce * rpn_t[..., 0]).sum(1) / sampled + (rpn_box * rpn_t[..., 6]).sum(1) / sampled


def _choices(model: nn.Module, image: torch.Tensor, target: dict, seed: int, anchors: torch.Tensor,
             proposals: torch.Tensor, dtype) -> tuple:
    """One image at one label set, its random choices drawn as the loop draws them -> (rpn [A, 7],
    its sampled proposals [k', 4], their rows [k', 7], and for Mask or Keypoint R-CNN (its positive
    proposals [P, 4], their index [P] (the class: Mask R-CNN) or [P, K] (each keypoint's target
    cell), their payload [P, E] (the target mask, or each keypoint's validity)), else None)."""
    from torchvision.models.detection.roi_heads import keypoints_to_heatmap, project_masks_on_boxes
    devices = [image.device] if image.device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        _, (resized,) = model.transform([image], [target])  # the training transform's size draw
        labels, matched = model.rpn.assign_targets_to_anchors([anchors], [resized])
        deltas = model.rpn.box_coder.encode(matched, [anchors])[0]
        (pos,), (neg,) = model.rpn.fg_bg_sampler(labels)
        chosen, gt, classes, box_targets = model.roi_heads.select_training_samples([proposals.clone()], [resized])
    # an image without instances: torchvision matches every anchor and proposal to a zero box, whose
    # delta targets are -inf; only positives' count (torchvision indexes them), so 0 elsewhere, or
    # inf * 0 would make the batched loss NaN
    deltas = torch.where(pos.bool()[:, None], deltas, torch.zeros_like(deltas))
    box_targets = torch.where((classes[0] > 0)[:, None], box_targets[0], torch.zeros_like(box_targets[0]))
    rpn = torch.cat([(pos | neg)[:, None], labels[0][:, None], deltas, pos[:, None]], 1).to(dtype)
    rows = torch.cat([torch.ones_like(classes[0])[:, None], classes[0][:, None], box_targets,
                      (classes[0] > 0)[:, None]], 1).to(dtype)
    pool, _, _, per_pooled, keypoints = _second(model.roi_heads)
    if pool is None:
        return rpn, chosen[0], rows, None
    positive = classes[0] > 0
    boxes, matched_gt, size = chosen[0][positive], gt[0][positive], per_pooled * pool.output_size[0]
    if keypoints:
        cells, valid = keypoints_to_heatmap(resized["keypoints"][matched_gt], boxes, size)
        return rpn, chosen[0], rows, (boxes, cells, valid.to(dtype))
    masks = project_masks_on_boxes(resized["masks"], boxes, matched_gt, size).to(dtype)
    return rpn, chosen[0], rows, (boxes, classes[0][positive], masks.flatten(1))


POSITIVE_SLOTS = 32  # a label set's positive rows are padded to a multiple of this (at most 128 at torchvision's defaults)


def positive_rows(heads_: Heads, features, image_list, choices: list[list[tuple]]):
    """The positive proposals of every image and label set -> (pos_rois [B, P, 4], pos_index
    [B, P(, K)], per set [S, B, P, 1 + E]: whether the row counts, its payload), each set's rows in
    a slot of its own of POSITIVE_SLOTS-rounded size (so that batches share a few input shapes);
    None without a second head or without a positive proposal."""
    if choices[0][0][3] is None:
        return None
    roi_align.with_scales(heads_.pos_pool, features, image_list.image_sizes)
    sets, b = len(choices[0]), len(choices)
    most = max(len(c[3][0]) for per_set in choices for c in per_set)
    if most == 0:
        return None
    most = -(-most // POSITIVE_SLOTS) * POSITIVE_SLOTS
    x, (_, index, payload) = choices[0][0][0], choices[0][0][3]
    rois = x.new_zeros(b, sets * most, 4)
    rois[..., 2:] = 1.0                                             # padding rows: a unit box, not counted
    indices = index.new_zeros(b, sets * most, *index.shape[1:])
    t = x.new_zeros(sets, b, sets * most, 1 + payload.shape[-1])
    for col, per_set in enumerate(choices):
        for s, (_, _, _, (boxes, index, payload)) in enumerate(per_set):
            rows = slice(s * most, s * most + len(boxes))
            rois[col, rows], indices[col, rows] = boxes, index
            t[s, col, rows, 0] = 1.0
            t[s, col, rows, 1:] = payload
    return rois, indices, t


_heads: "weakref.WeakKeyDictionary[nn.Module, Heads]" = weakref.WeakKeyDictionary()


def heads(model: nn.Module) -> Heads:
    if model not in _heads:
        _heads[model] = Heads(model)
    return _heads[model]


_ran: "weakref.WeakSet[nn.Module]" = weakref.WeakSet()


def ran(model: nn.Module) -> bool:
    """Has this model's gradient been taken batched (`auto` batches one label set only)?"""
    return model in _ran


@contextlib.contextmanager
def inference(model: nn.Module):
    """The transform, RPN and RoI heads as in eval mode (test proposal counts, postprocessed
    detections), inside detection.loss_mode."""
    parts = (model.transform, model.rpn, model.roi_heads)
    modes = [p.training for p in parts]
    for p in parts:
        p.training = False
    try:
        yield
    finally:
        for p, mode in zip(parts, modes):
            p.training = mode


def norms(model: nn.Module, images: list[torch.Tensor],
          target_sets: list[list[dict]] | Callable[[int, dict], list[dict]], seeds: list[int],
          method: str) -> tuple[torch.Tensor, torch.Tensor, list[dict] | None]:
    """Images, K target sets (each a target per image) and each image's seed -> ([K, B] gradient
    norms, [K, B] losses, None): the choices first, then one forward and the engine's backward per
    padded size. Call in detection.loss_mode (the RPN keeps its training proposal counts).
    `target_sets` may be a function (an image's position, its predictions) -> its K targets (when
    batched.one_size): the predictions then come from the backbone pass the choices are drawn
    from (its RPN and RoI heads in eval mode), and come back third, as model(images) gives them."""
    from torchvision.models.detection.rpn import concat_box_prediction_layers
    from ...gradnorm import grad_norms_per_target
    from .batched import in_order, padded_groups
    heads_ = heads(model)
    _ran.add(model)
    k = model.roi_heads.fg_bg_sampler.batch_size_per_image
    found: list[dict | None] = [None] * len(images)
    per_group = []
    with torch.no_grad():
        groups = padded_groups(model, images, seeds)  # the training transform's size draw, as the loop's
    for members, image_list in groups:
        x = image_list.tensors
        with torch.no_grad():
            features = model.backbone(x)
            roi_align.with_scales(model.roi_heads.box_roi_pool, features, image_list.image_sizes)
            maps = list(features.values())
            objectness, deltas = model.rpn.head(maps)
            anchors = model.rpn.anchor_generator(image_list, maps)
            per_level = [o[0].numel() for o in objectness]
            objectness, deltas = concat_box_prediction_layers(objectness, deltas)
            decoded = model.rpn.box_coder.decode(deltas, anchors).view(len(members), -1, 4)
            proposals, _ = model.rpn.filter_proposals(decoded, objectness, image_list.image_sizes, per_level)
            if callable(target_sets):
                with inference(model):
                    tested, _ = model.rpn.filter_proposals(decoded, objectness, image_list.image_sizes, per_level)
                    mine, _ = model.roi_heads(features, tested, image_list.image_sizes)
                    mine = model.transform.postprocess(mine, image_list.image_sizes,
                                                       [tuple(images[i].shape[-2:]) for i in members])
                for i, f in zip(members, mine):
                    found[i] = f
        if callable(target_sets):
            group_sets = [list(ts) for ts in zip(*[target_sets(i, found[i]) for i in members])]  # [K][b]
        else:
            group_sets = [[ts[i] for i in members] for ts in target_sets]
        sets, a, b, r = len(group_sets), anchors[0].shape[0], len(members), len(group_sets) * k
        choices = [[_choices(model, images[i], ts[col], seeds[i], anchors[col], proposals[col], x.dtype)
                    for ts in group_sets] for col, i in enumerate(members)]
        rois = x.new_zeros(b, r, 4)
        rois[..., 2:] = 1.0                                         # padding rows: a unit box, not counted
        roi_t = x.new_zeros(sets, b, r, 7)
        rpn_t = x.new_zeros(sets, b, 7 * a)
        for col, per_set in enumerate(choices):
            for s, (rpn, chosen, rows, _) in enumerate(per_set):
                rois[col, s * k:s * k + len(chosen)] = chosen
                roi_t[s, col, s * k:s * k + len(rows)] = rows
                rpn_t[s, col] = rpn.flatten()
        inputs, positives = (x, rois), positive_rows(heads_, features, image_list, choices)
        p, e = 0, 0
        if positives is not None:
            pos_rois, pos_index, pos_t = positives                  # [B, P, 4], [B, P(, K)], [S, B, P, 1 + E]
            p, e = pos_rois.shape[1], pos_t.shape[-1] - 1
            inputs = (x, rois, pos_rois, pos_index)
        header = x.new_tensor([a, rois.shape[1], p, e, heads_.keypoints]).expand(b, 5)
        dense = [torch.cat([header, rpn_t[s], roi_t[s].flatten(1)]
                           + ([pos_t[s, ..., 0], pos_t[s, ..., 1:].flatten(1)] if p else []), 1)
                 for s in range(sets)]

        def targets_for(out: torch.Tensor) -> list[torch.Tensor]:
            # the engine runs a batch of one as two copies (gradnorm.api.ONE_EXAMPLE_BUG)
            return [t.repeat(out.shape[0] // t.shape[0], 1) for t in dense]

        with warnings.catch_warnings():  # the S label sets' vmapped backward runs the RoI pool's one at a time
            warnings.filterwarnings("ignore", message=".*batching rule for aten::_embedding_bag_backward")
            g, out = grad_norms_per_target(heads_, inputs, targets_for, method=method, loss_fn=per_image_loss)
        with torch.no_grad():
            values = torch.stack([per_image_loss(out, t) for t in dense])
        per_group.append((members, g, values))
    return (*in_order(per_group, len(images)), found if callable(target_sets) else None)
