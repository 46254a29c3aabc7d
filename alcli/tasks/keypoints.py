"""Keypoint detection: torchvision's Keypoint R-CNN (--arch torchvision:keypointrcnn_resnet50_fpn),
one row per image. A detector (alcli.tasks.detection) whose every instance also has K keypoints:
per image {boxes [N, 4], labels [N], scores [N], keypoints [N, K, 3] (x, y, visible) in the image's
pixels, keypoints_scores [N, K]}; in training mode its loss adds the keypoint heatmaps'
cross-entropy to the box terms.

The per-image loss ℓ(x, T) is detection's (the image alone, normalisation as in inference, R-CNN's
sampling seeded by (--seed, id)) at targets T that carry each instance's keypoints: the pseudo-labels
T̂ are the predicted instances scoring at least --box-threshold with their predicted keypoints (all
visible); egl's label sets keep instance j with its keypoints with probability p_j. The cheap
utilities are detection's, over the instances' box scores; the gradient ones go through the engine
batched as Faster R-CNN's (detectors.rcnn: the keypoint head at each image's positive proposals,
its term normalised over that image's valid keypoints).

Rows are detection's (score, pred: the instances' classes, confidence, loss, uncertain, boxes,
width, height) and `keypoints`: per pseudo-label instance its K keypoints [x, y, score], JSON, the
score torchvision's (the logit at the peak of the keypoint's heatmap).
--class-names names the keypoints (in the model's order; as many names as the keypoint head
predicts, checked at the first batch, not against the classes), which Label Studio's
KeyPointLabels lists: one `keypointlabels` region per keypoint of every instance, x and y in
percent of the image, its score the sigmoid of the heatmap logit (0..1; `point_score`).
"""
from __future__ import annotations

import json
import math

import torch
from torch import nn

from ..errors import ConfigError, RunError
from . import detection
from .common import Task
from .shared.labelstudio import class_index, json_list, loose_list, named_class, names_control, row_size

POINT_WIDTH = 0.5  # a keypoint's drawn size in Label Studio, percent of the image width


def is_keypoint_detector(model: nn.Module) -> bool:
    return type(model).__module__.startswith("torchvision.models.detection") and \
        any(k.__name__ == "KeypointRCNN" for k in type(model).__mro__)


def not_a_keypoint_detector(model: nn.Module) -> str | None:
    if not is_keypoint_detector(model):
        return (f"--task keypoints needs a keypoint detector (torchvision's Keypoint R-CNN, --arch "
                f"torchvision:keypointrcnn_resnet50_fpn), and the model is a {type(model).__name__}")
    return None


def keypoint_count(model: nn.Module) -> int | None:
    """How many keypoints the model's keypoint head predicts per instance (None: not known)."""
    predictor = getattr(getattr(model, "roi_heads", None), "keypoint_predictor", None)
    count = getattr(predictor, "out_channels", None)
    if count is None:
        count = getattr(getattr(predictor, "kps_score_lowres", None), "out_channels", None)
    return count if isinstance(count, int) else None


def model_classes(model: nn.Module) -> None:
    """No class count for the pre-flight to hold the names to: --class-names names the
    keypoints, not the classes (`rows` checks them against the keypoint count)."""
    return None


def check_names(model: nn.Module, names, settings) -> None:
    """--class-names (the pool's names) must name each keypoint the head predicts: one sentence
    when their count differs."""
    count = keypoint_count(model)
    if names is None or count is None or len(names) == count:
        return
    where = settings.where("class_names") if hasattr(settings, "where") else "--class-names"
    source = getattr(settings, "class_names", None)
    shown = ", ".join(map(str, names[:5])) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
    raise ConfigError(f"{where}{f' {source}' if source else ''} names {len(names)} keypoints "
                      f"({shown}), but the model's keypoint head predicts {count}; for --task "
                      f"keypoints the names name the keypoints, one a line in the model's order")


EXTRA = ("keypoints", "keypoints_scores")  # the per-instance fields beside boxes, labels and scores


def kept(found: dict, threshold: float) -> dict:
    """The proper predicted instances scoring at least `threshold`, with their keypoints."""
    return detection.kept(found, threshold, EXTRA)


def target(found: dict) -> dict:
    """A training target: boxes [N, 4], labels [N], keypoints [N, K, 3] float32 (torchvision's)."""
    return {"boxes": found["boxes"], "labels": found["labels"], "keypoints": found["keypoints"].float()}


def rows(model: nn.Module, images: list[torch.Tensor], ids: list, settings, names) -> list[dict]:
    """One row per image: detection's columns (the instances' classes by index in pred: the names
    name the keypoints) and `keypoints`, [[x, y, score] * K] per pseudo-label instance, JSON."""
    if settings.strategy not in detection.UTILITIES:
        raise RunError(f"--strategy {settings.strategy} is not defined for --task keypoints; "
                       f"use one of {', '.join(detection.UTILITIES)}")
    check_names(model, names, settings)
    found, scores, losses = detection.scored(settings.strategy, model, images, ids, settings, EXTRA, target)
    return detection.rows_of(images, found, ids, scores, losses, settings, None,
                             keep=kept, extra=_keypoints_column)


def _keypoints_column(pseudo: dict) -> dict:
    """`keypoints`: [[x, y, score] * K] per pseudo-label instance, JSON."""
    points = [[[float(x), float(y), float(s)] for (x, y, _), s in zip(kp, ks)]
              for kp, ks in zip(pseudo["keypoints"].tolist(), pseudo["keypoints_scores"].tolist())]
    return {"keypoints": json.dumps(points)}


def _points(row, n) -> list:
    instances = json_list(row, n, "keypoints")
    for j, points in enumerate(instances):
        if not (isinstance(points, list) and all(
                isinstance(p, list) and len(p) == 3 and all(
                    isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in p)
                for p in points)):
            raise ValueError(f"row {n} (id '{row.get('id')}'): instance {j + 1}'s keypoints are not "
                             f"a list of [x, y, score] of finite numbers")
    return instances


def point_score(logit: float) -> float:
    """A keypoint's pre-label score in 0..1: the sigmoid of its heatmap logit (the table's
    score, torchvision's keypoints_scores), computed without overflow at either end. Monotone in
    the logit (the order of the keypoints is the model's), not a calibrated probability."""
    if logit >= 0:
        return 1.0 / (1.0 + math.exp(-logit))
    e = math.exp(logit)
    return e / (1.0 + e)


def prelabels(row, n, tag, names, ref) -> list[dict]:
    """Each keypoint k of each instance j as a `keypointlabels` region named names[k], at its x, y
    in percent of the image (clipped to it), with the image's size in pixels and its score in
    0..1 (`point_score` of the row's heatmap logit)."""
    w, h = (row_size(row, n, key) for key in ("width", "height"))
    out = []
    for j, points in enumerate(_points(row, n)):
        for k, (x, y, score) in enumerate(points):
            name = named_class(k, names)
            if name is None:
                continue
            x, y = min(max(x, 0.0), w), min(max(y, 0.0), h)
            out.append(tag.region(f"alcli-{n}-{j}-{k}", "keypointlabels", {
                "x": 100.0 * x / w, "y": 100.0 * y / h, "width": POINT_WIDTH, "keypointlabels": [name]},
                original_width=w, original_height=h, image_rotation=0, score=point_score(float(score))))
    return out


def instances(row, n) -> list[tuple]:
    """Detection's instances, each with its keypoints (Task.instances)."""
    points = _points(row, n)
    boxes = detection.instances(row, n)
    if len(points) != len(boxes):
        raise ValueError(f"row {n} (id '{row.get('id')}') has {len(boxes)} boxes and keypoints of "
                         f"{len(points)} instances")
    return [(box, c, s, p) for (box, c, s, _), p in zip(boxes, points)]


def _points_back(regions, names) -> dict:
    """Keypoint regions (percent of the image) -> the labels file's `keypoints`, [[x, y, keypoint],
    ...] in pixels (keypoint: its index among the names, else its name; Label Studio does not
    group them into instances), with the image's `width` and `height`."""
    points, size = [], (None, None)
    for r in regions:
        v, w, h = r["value"], r["original_width"], r["original_height"]
        size = (w, h)
        points += [[v["x"] * w / 100.0, v["y"] * h / 100.0, class_index(label, names)]
                   for label in v.get("keypointlabels", [])]
    return {"keypoints": json.dumps(points, ensure_ascii=False), "width": size[0], "height": size[1]}


def _unnamed(row, names) -> bool:
    """A keypoint without a name (fewer names than keypoints) loses its region."""
    counts = [len(p) for p in loose_list(row.get("keypoints")) if isinstance(p, list)]
    return any(named_class(k, names) is None for k in range(max(counts, default=0)))


TASK = Task(
    name="keypoints", shape="a list of {boxes, labels, scores, keypoints} per image", fits=lambda out: False,
    names_model=is_keypoint_detector,
    no_badge="a keypoint detector's rows have no BADGE embeddings",
    prelabels=prelabels, unnamed=_unnamed, unnamed_note="keypoints without a name, left out",
    shown_by_rows=lambda row: "keypoints" in row,
    control=names_control("keypoints", "KeyPointLabels"), instances=instances,
    from_annotation=_points_back,
    names_classes=False,  # --class-names names the keypoints
    sized_images=True, model_kind="a keypoint detector", needs_model=not_a_keypoint_detector,
    model_classes=model_classes, predict=detection.predict, rows=rows, method=detection.method,
    gradient_utilities=detection.GRADIENT_UTILITIES, unanswered=detection.refuses_given_boxes("keypoints", parts="keypoints"),
    default_strategy="egl",  # no learning curves yet: the incumbent (tests/test_defaults.py)
)
