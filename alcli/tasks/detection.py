"""Object detection: torchvision's detectors (Faster R-CNN, RetinaNet, FCOS, SSD), one row per image.

A detector takes a list of images [3, H_i, W_i] in [0, 1] of any sizes (it resizes and normalises
them itself) and returns, per image, {boxes [K, 4] (x0, y0, x1, y1 in the image's pixels),
labels [K], scores [K]}; in training mode it takes targets of that form and returns its loss terms.

The per-image loss ℓ(x, T) is the detector's own training loss (the sum of its terms) for the
image alone: a batch of one, so its own resize and padding, and the terms torchvision normalises
over a batch (R-CNN's sampled anchors and proposals, FCOS's foreground count) normalised over this
image; normalisation layers and dropout as in inference; R-CNN's random choice of anchors and
proposals drawn from a generator fixed by (--seed, id), so a row is the same in any batch, shard
or resume. The utilities (`--strategy`):

- gradnorm: ||∇θ ℓ(x, T̂)||, T̂ the predicted boxes scoring at least --box-threshold;
- egl: the mean over S label sets T_s of ||∇θ ℓ(x, T_s)||, T_s keeping each predicted box j with
  its predicted class with probability p_j (its score), independently, as drawn from the model's
  own predictive distribution (exact for the sigmoid heads of RetinaNet and FCOS; for the softmax
  heads of R-CNN and SSD the other classes' mass counts as background); `--egl-samples pseudo` is T̂;
- loss: ℓ(x, T̂);
- entropy, margin: each predicted box's binary entropy H(p_j) or 1 - |2 p_j - 1|, aggregated over
  the image's boxes by --aggregate (0 for an image without boxes);
- least-confidence: 1 - max_j p_j (1 without boxes); uncertain-boxes: how many predicted boxes
  score below --box-threshold.

RetinaNet's, FCOS's and SSD's losses split by image, so their images go through the engine in one
batch per padded size (detectors.batched); Faster R-CNN's too once its random choices are drawn
(detectors.rcnn), and Mask and Keypoint R-CNN's with their second head. DETR's gradient
utilities run one backward per image and label set (a loop). The
predictions come from one no-grad forward per group of same-sized images, which a batch of one
would give; for the batched gradient utilities, from a pass they run anyway (detection.scored:
the one-stage detectors' decoded from the engine's own forward by torchvision's postprocess, the
R-CNNs' from the no-grad backbone pass their random choices are drawn from).
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import math
from typing import Callable

import torch
from torch import nn

from ..errors import PoolError, RunError
from ..files.classnames import class_name
from ..gradnorm import auto_choice
from .common import Task, aggregate, exact_dtype, seeded_uniform, uniforms
from .detectors import batched, rcnn, roi_align
from .shared.labelstudio import (Tag, class_index, json_list, loose_list, named_class,
                                 names_control, offered, row_size)

DETECTOR_CLASSES = ("GeneralizedRCNN", "RetinaNet", "FCOS", "SSD")  # torchvision's, by class name
UTILITIES = ("egl", "gradnorm", "loss", "entropy", "margin", "least-confidence", "uncertain-boxes",
             "random")
GRADIENT_UTILITIES = ("egl", "gradnorm")
METHOD_REASON = ("a detector's loss is not a per-example function of its batch: a backward per image "
                 "(Faster R-CNN's, RetinaNet's, FCOS's and SSD's are, and go through the engine batched)")


HF_MIN_SCORE = 0.05  # a DETR-style model's queries whose best class scores less predict no box


def is_hf(model: nn.Module) -> bool:
    """A Hugging Face `*ForObjectDetection` (DETR-style: queries of class logits and boxes)."""
    return type(model).__name__.endswith("ForObjectDetection") and \
        type(model).__module__.startswith("transformers")


def is_detector(model: nn.Module) -> bool:
    return is_hf(model) or (type(model).__module__.startswith("torchvision.models.detection") and any(
        k.__name__ in DETECTOR_CLASSES for k in type(model).__mro__))


def not_a_detector(model: nn.Module) -> str | None:
    """The sentence when --task detection is given a model that is not an object detector."""
    if not is_detector(model):
        return (f"--task detection needs an object detector (torchvision's Faster R-CNN, "
                f"RetinaNet, FCOS or SSD, --arch torchvision:NAME; or a Hugging Face "
                f"*ForObjectDetection directory), and the model is a {type(model).__name__}")
    return None


def classes(model: nn.Module) -> int | None:
    """How many classes the detector scores (R-CNN and SSD count the background as class 0)."""
    if is_hf(model):
        return model.config.num_labels  # its "no object" class comes after them
    predictor = getattr(getattr(model, "roi_heads", None), "box_predictor", None)  # R-CNN
    if predictor is not None:
        return predictor.cls_score.out_features
    head = getattr(getattr(model, "head", None), "classification_head", None)
    return getattr(head, "num_classes", getattr(head, "num_columns", None))


# --- predictions ------------------------------------------------------------------------------

def predict(model: nn.Module, images: list[torch.Tensor]) -> list[dict]:
    """One no-grad forward per group of same-sized images (no padding from a larger neighbour:
    each image's boxes are those it gets alone) -> per image {boxes, labels, scores}."""
    out: list[dict | None] = [None] * len(images)
    with torch.no_grad():
        for members in same_size(images):
            group = [images[i] for i in members]
            for i, found in zip(members, _hf_predict(model, group) if is_hf(model) else model(group)):
                out[i] = {k: v.detach() for k, v in found.items()}
    return out


def same_size(images: list[torch.Tensor]) -> list[list[int]]:
    """The positions of the images of each size, in order of first appearance."""
    groups: dict[tuple, list[int]] = {}
    for i, img in enumerate(images):
        groups.setdefault(tuple(img.shape), []).append(i)
    return list(groups.values())


def _hf_predict(model: nn.Module, images: list[torch.Tensor]) -> list[dict]:
    """Same-sized images -> each query's best class (no object left out) and its probability,
    and its box in pixels, for the queries scoring at least HF_MIN_SCORE."""
    h, w = images[0].shape[-2:]
    out = model(pixel_values=torch.stack(images))
    probs = out.logits.softmax(-1)[..., :-1]                 # [B, Q, C]: no object dropped
    scores, labels = probs.max(-1)
    scale = torch.tensor([w, h, w, h], dtype=out.pred_boxes.dtype, device=out.pred_boxes.device)
    boxes = _corners(out.pred_boxes) * scale                # [B, Q, 4] pixels
    keep = scores >= HF_MIN_SCORE
    return [{"boxes": b[k], "labels": c[k], "scores": p[k]} for b, c, p, k in zip(boxes, labels, scores, keep)]


def _corners(cxcywh: torch.Tensor) -> torch.Tensor:
    c, size = cxcywh[..., :2], cxcywh[..., 2:]
    return torch.cat([c - size / 2, c + size / 2], -1)


def _centres(xyxy: torch.Tensor) -> torch.Tensor:
    return torch.cat([(xyxy[..., :2] + xyxy[..., 2:]) / 2, xyxy[..., 2:] - xyxy[..., :2]], -1)


def _proper(boxes: torch.Tensor) -> torch.Tensor:
    """[K] bool: a positive width and height (a training target must have them)."""
    return (boxes[:, 2] > boxes[:, 0]) & (boxes[:, 3] > boxes[:, 1])


def kept(found: dict, threshold: float, extra: tuple[str, ...] = ()) -> dict:
    """The proper predicted boxes scoring at least `threshold`: the pseudo-labels, as a training
    target {boxes [K, 4], labels [K]} (and their scores, and the `extra` per-instance fields of
    keypoint or mask detectors)."""
    keep = (found["scores"] >= threshold) & _proper(found["boxes"])
    return {k: found[k][keep] for k in ("boxes", "labels", "scores", *extra)}


def sampled_targets(found: dict, id_, samples: int, seed: int, extra: tuple[str, ...] = ()) -> list[dict]:
    """S target sets: box j kept with its class (and `extra` fields) with probability p_j, fixed
    by (seed, id)."""
    boxes = found["boxes"]
    ok = _proper(boxes)
    k = boxes.shape[0]
    u = uniforms([id_], max(k, 1), samples, seed, boxes.device)[:, 0, :k]  # [S, K]
    p = found["scores"].to(u.dtype)
    return [{key: found[key][(u_s < p) & ok] for key in ("boxes", "labels", *extra)} for u_s in u]


# --- the per-image loss and its gradient norm ----------------------------------------------------

@contextlib.contextmanager
def loss_mode(model: nn.Module):
    """Training mode (a torchvision detector returns its losses only then) with normalisation
    layers and dropout as in inference; eval mode again after. A Hugging Face detector gives its
    loss in eval mode (its dropout is functional, on in training mode): it stays there."""
    if is_hf(model):
        yield
        return
    model.train()
    for module in model.modules():
        if isinstance(module, (nn.modules.batchnorm._BatchNorm, nn.Dropout)):
            module.eval()
    rpn = getattr(model, "rpn", None)
    assign = getattr(rpn, "assign_targets_to_anchors", None)
    if assign is not None:
        rpn.assign_targets_to_anchors = _labels_as_logits(assign, rpn)
    try:
        yield
    finally:
        model.eval()
        if assign is not None:
            del rpn.assign_targets_to_anchors


def _labels_as_logits(assign, rpn):
    """torchvision's RPN hands its objectness labels over as float32, and the BCE of float64
    logits at float32 labels is float32: the labels in the head's dtype keep a float64 model's
    loss float64 (the same labels, 0, 1 or -1, exactly)."""
    def assign_in_dtype(anchors, targets):
        labels, matched = assign(anchors, targets)
        dtype = next(rpn.head.parameters()).dtype
        return [l.to(dtype) for l in labels], matched
    return assign_in_dtype


def image_seed(seed: int, id_) -> int:
    """The seed of an image's anchor and proposal sampling: fixed by (--seed, id)."""
    digest = hashlib.blake2b(f"boxes\0{seed}\0{id_}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> 1


def image_loss(model: nn.Module, image: torch.Tensor, target: dict, seed: int) -> torch.Tensor:
    """ℓ(x, T): the detector's summed training loss for the image alone (in loss_mode)."""
    if is_hf(model):  # boxes as (cx, cy, w, h) in [0, 1]; the Hungarian matching draws nothing
        h, w = image.shape[-2:]
        scale = torch.tensor([w, h, w, h], dtype=image.dtype, device=image.device)
        labels = [{"class_labels": target["labels"], "boxes": _centres(target["boxes"].to(image.dtype)) / scale}]
        return model(pixel_values=image.unsqueeze(0), labels=labels).loss
    devices = [image.device] if image.device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        terms = model([image], [target])
    return sum(terms.values())


def grad_norm(model: nn.Module, image: torch.Tensor, target: dict, seed: int,
              params: list[torch.Tensor]) -> tuple[float, float]:
    """(||∇θ ℓ(x, T)||, ℓ(x, T)): the squares summed in float64 (float32 on MPS), as the
    engine's loop does (summed in float32, a 12.8M-weight layer's norm was off by up to 1e-3)."""
    return _norm_and_value(image_loss(model, image, target, seed), params)


def _norm_and_value(loss: torch.Tensor, params: list[torch.Tensor], keep: bool = False) -> tuple[float, float]:
    sq = 0.0
    for g in torch.autograd.grad(loss, params, allow_unused=True, retain_graph=keep):
        if g is not None:
            sq = sq + g.to(exact_dtype(g)).square().sum()  # stays on the device until float()
    return math.sqrt(float(sq)), float(loss.detach())


def is_rcnn(model: nn.Module) -> bool:
    """torchvision's two-stage detectors (Faster, Mask and Keypoint R-CNN): a backbone, an RPN
    and RoI heads."""
    return not is_hf(model) and any(k.__name__ == "GeneralizedRCNN" for k in type(model).__mro__)


def rcnn_set_norms(model: nn.Module, image: torch.Tensor, targets: list[dict], seed: int,
                   params: list[torch.Tensor]) -> list[tuple[float, float]]:
    """grad_norm of one image at each of its K target sets, the R-CNN's backbone and FPN run once:
    each set's RPN and RoI losses from those features, the sampling seeded as image_loss seeds it
    (the training transform's size draw, then the RPN's anchors, then the RoI proposals), one
    backward per set (in loss_mode); the RoI pools threaded (roi_align.swapped)."""
    from collections import OrderedDict
    devices = [image.device] if image.device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):  # the size each set's transform draws below
        torch.manual_seed(seed)
        batch, _ = model.transform([image])
    features = model.backbone(batch.tensors)
    if isinstance(features, torch.Tensor):
        features = OrderedDict([("0", features)])
    out = []
    with roi_align.swapped(model.roi_heads):
        for j, target in enumerate(targets):
            with torch.random.fork_rng(devices=devices):
                torch.manual_seed(seed)
                batch_j, resized = model.transform([image], [target])
                proposals, rpn_terms = model.rpn(batch_j, features, resized)
                _, roi_terms = model.roi_heads(features, proposals, batch_j.image_sizes, resized)
            loss = sum({**roi_terms, **rpn_terms}.values())  # the order GeneralizedRCNN sums them in
            out.append(_norm_and_value(loss, params, keep=j < len(targets) - 1))
    return out


# --- the utilities -------------------------------------------------------------------------------

def _binary_entropy(p: torch.Tensor) -> torch.Tensor:
    return -(torch.special.xlogy(p, p) + torch.special.xlogy(1 - p, 1 - p))


def _per_box(values: Callable[[torch.Tensor], torch.Tensor], found: list[dict], how: str) -> list[float]:
    """A value per predicted box, aggregated per image over its boxes (0 without boxes)."""
    k = max((f["scores"].numel() for f in found), default=0)
    p = torch.zeros(len(found), max(k, 1), dtype=torch.float64)
    valid = torch.zeros_like(p, dtype=torch.bool)
    for i, f in enumerate(found):
        n = f["scores"].numel()
        p[i, :n] = f["scores"].detach().to(torch.float64).cpu()
        valid[i, :n] = True
    return aggregate(values(p), valid, how).tolist()


def utility(strategy: str, model: nn.Module, images: list[torch.Tensor], found: list[dict],
            ids: list, settings, extra: tuple[str, ...] = (),
            target: Callable[[dict], dict] | None = None) -> tuple[list[float], list[float] | None]:
    """(score per image, loss per image or None) for `strategy`; the loss and the gradient ones at
    `target(instances)`, instances with their `extra` fields (keypoints, masks)."""
    target = target or box_target
    threshold = settings.box_threshold
    if strategy == "entropy":
        return _per_box(_binary_entropy, found, settings.aggregate), None
    if strategy == "margin":
        return _per_box(lambda p: 1 - (2 * p - 1).abs(), found, settings.aggregate), None
    if strategy == "least-confidence":
        return [1.0 - float(f["scores"].max()) if f["scores"].numel() else 1.0 for f in found], None
    if strategy == "uncertain-boxes":
        return [float((f["scores"] < threshold).sum()) for f in found], None
    if strategy == "random":
        return [seeded_uniform(settings.seed, i) for i in ids], None
    if strategy == "loss":
        with loss_mode(model), torch.no_grad():
            values = [float(image_loss(model, img, target(kept(f, threshold, extra)),
                                       image_seed(settings.seed, id_)))
                      for img, f, id_ in zip(images, found, ids)]
        return values, values
    sets = [label_sets(strategy, f, id_, settings, extra, target) for f, id_ in zip(found, ids)]
    return averaged(strategy, settings, *gradient_norms(model, images, sets, ids, settings))


def label_sets(strategy: str, found: dict, id_, settings, extra: tuple[str, ...] = (),
               target: Callable[[dict], dict] = None) -> list[dict]:
    """One image's target sets for a gradient utility: its pseudo-labels (gradnorm; egl with
    --egl-samples pseudo), else egl's S sampled sets."""
    target = target or box_target
    if one_set(strategy, settings):
        return [target(kept(found, settings.box_threshold, extra))]
    return [target(t) for t in sampled_targets(found, id_, int(settings.egl_samples), settings.seed, extra)]


def averaged(strategy: str, settings, norms: list[list[float]], losses: list[list[float]]
             ) -> tuple[list[float], list[float] | None]:
    """Each image's K norms and losses -> (its score: the mean norm, its loss at the pseudo-labels
    or None for sampled sets)."""
    return [sum(n) / len(n) for n in norms], ([v[0] for v in losses] if one_set(strategy, settings) else None)


def one_set(strategy: str, settings) -> bool:
    """Does the gradient utility take one label set, the pseudo-labels (else egl's S sampled)?"""
    return strategy == "gradnorm" or settings.egl_samples == "pseudo"


def scored(strategy: str, model: nn.Module, images: list[torch.Tensor], ids: list, settings,
           extra: tuple[str, ...] = (), target: Callable[[dict], dict] | None = None
           ) -> tuple[list[dict], list[float], list[float] | None]:
    """(predictions per image, score per image, loss per image or None) for `strategy`: the
    one-stage detectors' gradient utilities decode their predictions from the engine's own
    forward (detectors.batched), the R-CNNs' batched ones take them from the backbone pass their
    random choices are drawn from (detectors.rcnn), the rest from predict."""
    def sets_of(position: int, found: dict) -> list[dict]:
        return label_sets(strategy, found, ids[position], settings, extra, target)

    gradient = strategy in GRADIENT_UTILITIES and settings.method != "loop"
    count = 1 if one_set(strategy, settings) else int(settings.egl_samples)
    if gradient and batched.kind(model) is not None:
        grads, values, found = batched.norms(model, images, sets_of, settings.method)
    elif gradient and rcnn_batched(model, settings.method, count) and batched.one_size(model):
        with loss_mode(model):
            grads, values, found = rcnn.norms(model, images, sets_of, [image_seed(settings.seed, i) for i in ids],
                                              settings.method)
    else:
        found = predict(model, images)
        return (found, *utility(strategy, model, images, found, ids, settings, extra, target))
    return (found, *averaged(strategy, settings, grads.T.tolist(), values.T.tolist()))


def box_target(found: dict) -> dict:
    """A training target: boxes [N, 4], labels [N]."""
    return {"boxes": found["boxes"], "labels": found["labels"]}


def gradient_norms(model: nn.Module, images: list[torch.Tensor], sets: list[list[dict]], ids: list,
                   settings) -> tuple[list[list[float]], list[list[float]]]:
    """Each image's K target sets -> its K gradient norms and losses: RetinaNet's, FCOS's and
    SSD's images through the engine batched (detectors.batched), Faster, Mask and Keypoint
    R-CNN's too once their random choices are drawn (detectors.rcnn), else one image at a time
    (an R-CNN's backbone once per image for all K sets)."""
    per_set = [[s[j] for s in sets] for j in range(len(sets[0]))]
    if settings.method != "loop" and batched.kind(model) is not None:
        grads, values, _ = batched.norms(model, images, per_set, settings.method)
        return grads.T.tolist(), values.T.tolist()
    if rcnn_batched(model, settings.method, len(per_set)):
        with loss_mode(model):
            grads, values, _ = rcnn.norms(model, images, per_set, [image_seed(settings.seed, i) for i in ids],
                                       settings.method)
        return grads.T.tolist(), values.T.tolist()
    params = [p for p in model.parameters() if p.requires_grad]
    norms, losses = [], []
    with loss_mode(model):
        for img, targets, id_ in zip(images, sets, ids):
            seed = image_seed(settings.seed, id_)
            pairs = rcnn_set_norms(model, img, targets, seed, params) if is_rcnn(model) else \
                [grad_norm(model, img, t, seed, params) for t in targets]
            norms.append([n for n, _ in pairs])
            losses.append([v for _, v in pairs])
    return norms, losses


def rcnn_batched(model: nn.Module, setting: str, sets: int) -> bool:
    """An R-CNN through the engine: for one label set under auto (its S egl sets batched are on
    par with its loop, which shares the backbone, at a batch of 8 of one size, and slower on pools
    of mixed sizes: see docs/benchmarks.md), for any number under a named engine method."""
    return rcnn.servable(model) and setting != "loop" and (sets == 1 or setting != "auto")


def method(model: nn.Module, setting: str) -> tuple[str, str]:
    """(the method the gradient utilities ran with, why) for the summary and `alcli inspect`."""
    kind = batched.kind(model)
    ran = kind is not None or (rcnn.servable(model) and (setting != "auto" or rcnn.ran(model)))
    if setting != "loop" and ran:
        heads, loss = (batched.heads(model), kind.per_image_loss) if kind else (rcnn.heads(model), rcnn.per_image_loss)
        choice = auto_choice(heads, None, loss) if setting == "auto" else None
        name = choice[0] if choice else setting
        return name, (f"batched: {type(model).__name__}'s loss splits by image, each normalised over "
                      f"its own samples: images of one padded size go through the engine in one batch")
    if rcnn.servable(model) and setting == "auto":
        return "loop", ("an R-CNN's egl label sets: a backward per image and set, its backbone once "
                        "per image (batched, they are no faster on a CPU, and slower on mixed sizes)")
    if not is_hf(model) and not batched.one_size(model):
        return "loop", ("its training transform has several sizes, and its loss draws one per image: a "
                        "backward per image")
    return "loop", METHOD_REASON


def rows(model: nn.Module, images: list[torch.Tensor], ids: list, settings, names,
         given: list | None = None) -> list[dict]:
    """One row per image: score, pred (the classes of its pseudo-labels, by name where named),
    confidence (their mean score), loss (gradient utilities at the pseudo-labels), uncertain (boxes
    below the threshold), and `boxes` ([x0, y0, x1, y1, class, score] per pseudo-label, JSON, in
    the image's pixels) with its `width` and `height`. alcli review's run (`given`: each image's
    given boxes, Task.review_given) -> review_rows."""
    if settings.strategy == REVIEW and given is not None:
        return review_rows(model, images, ids, settings, given)
    if settings.strategy not in UTILITIES:
        raise RunError(f"--strategy {settings.strategy} is not defined for --task detection; "
                       f"use one of {', '.join(UTILITIES)}")
    found, scores, losses = scored(settings.strategy, model, images, ids, settings)
    return rows_of(images, found, ids, scores, losses, settings, names)


def rows_of(images: list[torch.Tensor], found: list[dict], ids: list, scores: list[float],
            losses: list[float] | None, settings, names, keep: Callable | None = None,
            extra: Callable = lambda pseudo: {}) -> list[dict]:
    """The rows `rows` describes, from the predictions and the utility's scores (and losses); a
    task built on detection's rows gives its own `keep` (pseudo-labels) and `extra(pseudo-labels)`,
    its own columns after `boxes` (keypoints)."""
    out = []
    for i, (img, f, id_) in enumerate(zip(images, found, ids)):
        pseudo = (keep or kept)(f, settings.box_threshold)
        boxes = [[*map(float, b), int(c), float(s)] for b, c, s in
                 zip(pseudo["boxes"].tolist(), pseudo["labels"].tolist(), pseudo["scores"].tolist())]
        classes_seen = sorted({b[4] for b in boxes})
        score = scores[i] if math.isfinite(scores[i]) else math.nan
        row = {"id": id_, "score": score,
               "pred": "|".join(str(class_name(c, names)) for c in classes_seen),
               "confidence": sum(b[5] for b in boxes) / len(boxes) if boxes else None}
        if losses is not None:
            row["loss"] = losses[i]
        row.update({"uncertain": int((f["scores"] < settings.box_threshold).sum()), "boxes": json.dumps(boxes),
                    **extra(pseudo), "width": int(img.shape[-1]), "height": int(img.shape[-2])})
        out.append(row)
    return out


def _rectangles(row, n, tag, names, ref) -> list[dict]:
    """Each box as `rectanglelabels` in percent of the image (x, y its top-left corner),
    clipped to the image, with the image's size in pixels and the box's score."""
    w, h = (row_size(row, n, key) for key in ("width", "height"))
    out = []
    for k, box in enumerate(json_list(row, n, "boxes")):
        if not (isinstance(box, list) and len(box) == 6 and
                all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
                    for v in box)):
            raise ValueError(f"row {n} (id '{row.get('id')}'): box {k + 1} is not [x0, y0, x1, "
                             f"y1, class_index, score] of finite numbers")
        x0, y0, x1, y1, index, score = box
        if x1 < x0 or y1 < y0:
            raise ValueError(f"row {n} (id '{row.get('id')}'): box {k + 1} ends before it starts "
                             f"(x1 < x0 or y1 < y0); boxes are [x0, y0, x1, y1, ...]")
        name = named_class(int(index), names) if float(index).is_integer() else None
        if name is None:
            continue
        x0, x1 = (min(max(v, 0.0), w) for v in (x0, x1))
        y0, y1 = (min(max(v, 0.0), h) for v in (y0, y1))
        out.append(tag.region(f"alcli-{n}-{k}", "rectanglelabels", {
            "x": 100.0 * x0 / w, "y": 100.0 * y0 / h, "width": 100.0 * (x1 - x0) / w,
            "height": 100.0 * (y1 - y0) / h, "rotation": 0, "rectanglelabels": [name]},
            original_width=w, original_height=h, image_rotation=0, score=float(score)))
    return out


def instances(row, n) -> list[tuple]:
    """A row's boxes as (box, class, score, None) (Task.instances), checked as its pre-labels are."""
    _rectangles(row, n, Tag("label", "image"), None, None)  # a ValueError for a bad row
    return [(b[:4], int(b[4]), float(b[5]), None) for b in json_list(row, n, "boxes")]


def _boxes(regions, names) -> dict:
    """Rectangles (percent of the image) -> the labels file's `boxes`, [[x0, y0, x1, y1, class],
    ...] in pixels of the original image (class: its index among the names, else its name), and
    the image's `width` and `height`."""
    boxes, size = [], (None, None)
    for r in regions:
        v, w, h = r["value"], r["original_width"], r["original_height"]
        size = (w, h)
        for label in v.get("rectanglelabels", []):
            x0, y0 = v["x"] * w / 100.0, v["y"] * h / 100.0
            boxes.append([x0, y0, x0 + v["width"] * w / 100.0, y0 + v["height"] * h / 100.0,
                          class_index(label, names)])
    return {"boxes": json.dumps(boxes, ensure_ascii=False), "width": size[0], "height": size[1]}


def _unnamed(row, names) -> bool:
    found = [int(b[4]) for b in loose_list(row.get("boxes"))
             if isinstance(b, list) and len(b) == 6 and isinstance(b[4], (int, float))]
    return any(named_class(v, names) is None for v in found)


def refuses_given_boxes(task: str, reviewed: bool = False, parts: str = ""):
    """Task.unanswered for a detector task: the sentence refusing a manifest's given boxes (a
    `boxes` or `label` column) for gradnorm and loss, which score each image at its predicted
    boxes: given boxes are read only by alcli review (`reviewed`: detection's). A task that adds
    `parts` to its boxes (masks, keypoints) is not reviewed: its loss at the given labels needs
    those parts as targets, and no pool kind reads them."""
    def given_boxes(pool, strategy: str) -> str | None:
        if strategy == REVIEW and not reviewed:
            return (f"alcli review does not check {task} labels: its loss at the given labels "
                    f"needs their {parts}, which no pool reads; it reviews a detector's boxes "
                    f"(--task detection) and class labels")
        path, columns = getattr(getattr(pool, "base", pool), "given_columns", (None, []))
        if not columns or (reviewed and strategy == REVIEW):
            return None
        return (f"manifest {path} has a '{columns[0]}' column, but {task} does not read given boxes "
                f"({strategy} would score each image at its predicted boxes): drop the column to score "
                f"at the predictions{', or check the boxes with alcli review' if reviewed else ''}")
    return given_boxes


# --- alcli review: the given boxes against the model's ------------------------------------------

REVIEW = "review"     # the strategy of alcli review's run (alcli.score.strategies)
MATCH_IOU = 0.5       # a prediction matches a given box at IoU >= 0.5 (COCO's AP50)


def given_boxes(pool, ids: list, names) -> list[list | None]:
    """Task.review_given: each image's given boxes, [[x0, y0, x1, y1, class index], ...] in its
    pixels, from the manifest's `boxes` column (pull's labels.csv: a class by index among the
    class names, or by name); None for an image without the cell (unlabeled)."""
    cells = getattr(getattr(pool, "base", pool), "given_boxes", {})
    return [_given_of(*cells[i], names) if i in cells else None for i in ids]


def _given_of(where: str, cell, names) -> list[list]:
    """One `boxes` cell -> its boxes; PoolError naming the manifest line for anything else."""
    try:
        boxes = json.loads(cell) if isinstance(cell, str) else cell
    except ValueError:
        boxes = None
    if not isinstance(boxes, list):
        raise PoolError(f"{where}: boxes {str(cell)[:80]!r} is not a JSON list of [x0, y0, x1, y1, class]")
    out = []
    for k, box in enumerate(boxes, 1):
        ok = isinstance(box, list) and len(box) >= 5 and all(
            isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in box[:4])
        index = _class_of(box[4], names) if ok else None
        if index is None or box[2] <= box[0] or box[3] <= box[1]:
            raise PoolError(f"{where}: box {k} {json.dumps(box)[:80]} is not [x0, y0, x1, y1, class] "
                            f"with x1 > x0, y1 > y0 and a class index or one of the class names")
        out.append([*map(float, box[:4]), index])
    return out


def _class_of(value, names) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    if isinstance(value, str) and names and value in list(map(str, names)):
        return list(map(str, names)).index(value)
    return None


def review_rows(model: nn.Module, images: list[torch.Tensor], ids: list, settings,
                given: list[list | None]) -> list[dict]:
    """alcli review's run: per image its loss and gradient norm at the given boxes (score, loss),
    and `units`: [[given boxes, every prediction [x0, y0, x1, y1, class, score], --box-threshold,
    width, height]] ([] without given boxes), which review_own matches."""
    found = predict(model, images)
    labeled = [i for i, g in enumerate(given) if g is not None]
    norms, losses = [[math.nan]] * len(images), [[math.nan]] * len(images)
    if labeled:
        sets = [[_target(given[i], images[i])] for i in labeled]
        got = gradient_norms(model, [images[i] for i in labeled], sets, [ids[i] for i in labeled], settings)
        for i, n, v in zip(labeled, *got):
            norms[i], losses[i] = n, v
    out = []
    for img, f, id_, g, n, v in zip(images, found, ids, given, norms, losses):
        preds = [[*map(float, b), int(c), float(p)] for b, c, p in
                 zip(f["boxes"].tolist(), f["labels"].tolist(), f["scores"].tolist())]
        w, h = int(img.shape[-1]), int(img.shape[-2])
        units = [] if g is None else [[g, preds, float(settings.box_threshold), w, h]]
        out.append({"id": id_, "score": n[0], "loss": v[0], "units": json.dumps(units)})
    return out


def _target(boxes: list[list], image: torch.Tensor) -> dict:
    """Given boxes -> a training target {boxes [N, 4] in the image's dtype, labels [N]}."""
    t = torch.tensor([b[:4] for b in boxes], dtype=image.dtype, device=image.device).reshape(-1, 4)
    return {"boxes": t, "labels": torch.tensor([b[4] for b in boxes], dtype=torch.int64, device=image.device)}


def iou(a: list[float], b: list[float]) -> float:
    """Intersection over union of two boxes [x0, y0, x1, y1]."""
    w = min(a[2], b[2]) - max(a[0], b[0])
    h = min(a[3], b[3]) - max(a[1], b[1])
    inter = max(w, 0.0) * max(h, 0.0)
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter / union if union > 0 else 0.0


def greedy(given: list, preds: list, same_class: bool) -> list[tuple[int, int]]:
    """COCO's matching: the predictions by score, highest first, each taking the free given box
    it overlaps most (IoU >= MATCH_IOU; of its class when `same_class`) -> (given, prediction)."""
    free, pairs = set(range(len(given))), []
    for j in sorted(range(len(preds)), key=lambda j: -preds[j][5]):
        fits = [(iou(given[i], preds[j]), -i) for i in free
                if (not same_class or given[i][4] == preds[j][4])]
        best = max(fits, default=(0.0, 0))
        if best[0] >= MATCH_IOU:
            free.discard(-best[1])
            pairs.append((-best[1], j))
    return pairs


def match(given: list, preds: list, threshold: float) -> dict:
    """One image's given boxes against its predictions scoring >= threshold: matched by IoU and
    class (greedy); of the rest, given and predicted boxes matched by IoU alone disagree on the
    class; the given boxes left are `spurious` (the model would not draw them), the predictions
    left `missed` (objects found unlabeled). The score: the missed predictions' and the
    disagreeing predictions' confidences, plus each spurious box's 1 - p, p the highest score of
    any prediction of its class at IoU >= MATCH_IOU with it (0 without one)."""
    drawn = [p for p in preds if p[5] >= threshold]
    pairs = greedy(given, drawn, True)
    left_g = [i for i in range(len(given)) if i not in {i for i, _ in pairs}]
    left_p = [j for j in range(len(drawn)) if j not in {j for _, j in pairs}]
    cross = [(left_g[i], left_p[j]) for i, j in greedy([given[i] for i in left_g], [drawn[j] for j in left_p], False)]
    spurious = [i for i in left_g if i not in {i for i, _ in cross}]
    missed = [j for j in left_p if j not in {j for _, j in cross}]
    seen = [max((p[5] for p in preds if p[4] == given[i][4] and iou(given[i], p) >= MATCH_IOU), default=0.0)
            for i in spurious]
    score = sum(drawn[j][5] for j in missed) + sum(drawn[j][5] for _, j in cross) + sum(1.0 - p for p in seen)
    return {"spurious": [given[i] for i in spurious], "missed": [drawn[j] for j in missed],
            "mismatched": [[given[i], drawn[j]] for i, j in cross], "drawn": drawn, "score": score}


def review_own(units: list[list], names) -> list[dict]:
    """Task.review_own: each labeled image's columns (docs/review.md#detection): its own `score`
    (match's), the counts and JSON lists of the spurious, missed and mismatched boxes, `boxes`
    (the predictions >= the threshold, the hand-off's prediction) and `label_boxes` (the given
    boxes, its annotation to verify)."""
    out = []
    for [(given, preds, threshold, width, height)] in units:
        m = match(given, preds, threshold)
        named = lambda boxes: "|".join(str(class_name(c, names)) for c in sorted({b[4] for b in boxes})) or "[]"
        out.append({"flagged": bool(m["spurious"] or m["missed"] or m["mismatched"]), "score": m["score"],
                    "label": named(given), "pred": named(m["drawn"]),
                    "spurious": len(m["spurious"]), "missed": len(m["missed"]),
                    "mismatched": len(m["mismatched"]),
                    "spurious_boxes": json.dumps(m["spurious"]), "missed_boxes": json.dumps(m["missed"]),
                    "mismatched_boxes": json.dumps(m["mismatched"]),
                    "boxes": json.dumps(m["drawn"]), "label_boxes": json.dumps([[*b, 1.0] for b in given]),
                    "width": width, "height": height})
    return out


TASK = Task(
    name="detection", shape="a list of {boxes, labels, scores} per image", fits=lambda out: False,
    names_model=lambda model: type(model).__module__.startswith("torchvision.models.detection")
    or type(model).__name__.endswith("ForObjectDetection"),
    no_badge="a detector's rows have no BADGE embeddings",
    prelabels=_rectangles, unnamed=_unnamed, shown_by_rows=lambda row: "boxes" in row,
    control=names_control("detection", "RectangleLabels", labels=offered), from_annotation=_boxes,
    instances=instances,
    sized_images=True, model_kind="an object detector", needs_model=not_a_detector,
    normalised_outside=is_hf, model_classes=classes, predict=predict, rows=rows, method=method,
    gradient_utilities=GRADIENT_UTILITIES, unanswered=refuses_given_boxes("detection", reviewed=True),
    review_given=given_boxes, review_own=review_own,
    # the rule in docs/benchmarks.md over the reduced digit_boxes curves (structured-curves-
    # defaults.json): nothing beat random; gradnorm lost to least-confidence (p 0.044), egl
    # tied at 50x its time; of the unbeaten forward-only utilities, the highest AULC
    default_strategy="least-confidence",
)
