"""Semantic segmentation: a class per pixel. logits [B, C, H, W], targets [B, H, W] long, the mean
cross-entropy over an example's valid pixels. Labels as given: a mask image (column `mask`, or
`label`), a class index per pixel, 255 = ignore (65535 for a model of more than 255 classes,
whose masks are 16-bit), resized and cropped as the images are. Its rows
show the classes predicted at any pixel, joined by |. Label Studio: a BrushLabels config (torchvision's
class 0, background, not offered: unpainted pixels are it), brush pre-labels from a row's
`pred_mask` (a PNG of class indices at the original image's size; `score` writes it as
OUTPUT.masks/<files/names.id_file>, and the row names it relative to the table's folder, as a
manifest's paths are: `select` and `push` read it from there), and annotations read back as
such a PNG (unpainted pixels: background where class 0 is it, else the ignore value).
"""
from __future__ import annotations

import math
import os

import numpy as np
import torch
from PIL import Image
from torch import nn

from ..errors import PoolError, RunError, first_line
from ..files.names import id_file
from ..pools.common import Pool, crop_box, resized
from .common import (IGNORE, Task, all_positions, categorical, egl_sampled, given_or_predicted,
                     labels_to_dense, mean_ce, named_set, per_position, position_badge,
                     position_loss, predicted, refuse_single_labels, set_columns)
from .shared.labels import base, reader
from .shared.labelstudio import (check_brush_size, mask_to_rle, named_class, names_control,
                                 offered, rle_to_mask)

MASK_IGNORE = 255  # a mask pixel of this value counts in no loss (65535 past 255 classes)


def mask_dtype(classes: int):
    """The narrowest mask dtype whose ignore value is no class: uint8 up to 255 classes."""
    return np.uint8 if classes <= MASK_IGNORE else np.uint16


def ignore_value(classes: int) -> int:
    """The pixel value that counts in no loss for a model of `classes` classes: 255, or 65535 for
    more than 255 (where 255 is a class)."""
    return int(np.iinfo(mask_dtype(classes)).max)


def segmentation_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """logits [B, C, H, W], targets [B, H, W] -> mean cross-entropy over valid pixels [B]."""
    return mean_ce(logits, targets, 1)


def _seg_targets(labels, valid, logits):
    h, w = logits.shape[2:]
    return labels_to_dense(labels, valid, logits).reshape(*labels.shape[:-1], h, w)


def _mask(path, where: str, classes: int, size: tuple[int, int], pool: Pool) -> torch.Tensor:
    """A mask image of class indices (`ignore_value` = ignore), resized and cropped as the pool's images are
    (nearest neighbour; a crop past the edge is ignored), of the model's output size -> [H, W]."""
    transform = getattr(getattr(base(pool), "transform", None), "t", None)
    try:
        with Image.open(path) as img:
            if img.mode not in ("L", "P", "I", "I;16"):
                raise PoolError(f"{where}: mask {path} is a {img.mode} image, not one of class "
                                f"indices (a single-channel PNG, 255 = ignore)")
            img.load()
            if transform is not None and transform.resize is not None:
                img = img.resize(_resized(img.size, transform.resize), Image.NEAREST)
            if transform is not None and transform.center_crop is not None:
                img = _crop_ignoring(img, transform.center_crop, ignore_value(classes))
            m = np.array(img).astype(np.int64)
    except PoolError:
        raise
    except Exception as err:  # noqa: BLE001 - any unreadable mask is a sentence naming it
        raise PoolError(f"{where}: mask {path} cannot be read ({first_line(err)})") from None
    if tuple(m.shape) != size:
        raise PoolError(f"{where}: mask {path} is {m.shape[1]}x{m.shape[0]} pixels but the model's "
                        f"output for its image is {size[1]}x{size[0]}")
    ignore = ignore_value(classes)
    bad = (m != ignore) & ((m < 0) | (m >= classes))
    if bad.any():
        raise PoolError(f"{where}: mask {path} holds class {int(m[bad][0])}, but the model has "
                        f"{classes} classes (0..{classes - 1}; {ignore} = ignore)")
    return torch.from_numpy(np.where(m == ignore, IGNORE, m))


def _crop_ignoring(img, crop, ignore: int):
    box = _crop_box(img.size, crop)
    canvas = Image.new(img.mode, (box[2] - box[0], box[3] - box[1]), ignore)
    canvas.paste(img, (-box[0], -box[1]))
    return canvas


def _read(value, where, i, logits, pool, words) -> torch.Tensor:
    return _mask(value, where, logits.shape[1], tuple(logits.shape[2:]), pool)


def _brushes(row, n, tag, names, ref) -> list[dict]:
    """The row's `pred_mask` (a PNG of class indices at the original image's size; none: no
    pre-label) as one brush region per class painted in it (background and 255 left out). A
    relative path is the table's (selection.pick joins it to the table's folder when it reads
    one); rows in memory keep it as given."""
    path = row.get("pred_mask")
    if not path:
        return []
    try:
        with Image.open(path) as img:
            m = np.array(img)
    except Exception as err:  # noqa: BLE001 - any unreadable mask is a sentence naming it
        raise ValueError(f"row {n} (id '{row.get('id')}'): pred_mask {path} cannot be read "
                         f"({first_line(err)})") from None
    if m.ndim != 2:
        raise ValueError(f"row {n} (id '{row.get('id')}'): pred_mask {path} is not a single-channel "
                         f"image of class indices")
    h, w = m.shape
    out = []
    for index in np.unique(m).tolist():
        name = named_class(index, names)
        if index == ignore_value(len(names or ())) or name is None or name not in offered(names or [name]):
            continue
        out.append(tag.region(f"alcli-{n}-{index}", "brushlabels", {
            "format": "rle", "rle": mask_to_rle(m == index), "brushlabels": [name]},
            original_width=w, original_height=h, image_rotation=0))
    return out


def _nearest(m: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """[H, W] -> [h, w] for size (w, h): each pixel takes the value under its centre,
    source index floor((i + 1/2) * H / h), in integers (no rounding at the edges)."""
    (big_h, big_w), (w, h) = m.shape, size
    ys = (2 * np.arange(h) + 1) * big_h // (2 * h)
    xs = (2 * np.arange(w) + 1) * big_w // (2 * w)
    return m[ys[:, None], xs[None, :]]


def _write_masks(logits: torch.Tensor, rows: list[dict], paths, folder: str) -> None:
    """logits [B, C, H, W] -> each row's predicted mask (argmax, class indices) resized (nearest)
    to its image's original size (nearest: `_nearest`), written as folder/<id_file>; the row's
    `pred_mask` is its path relative to the table's folder (`folder` is the table's sidecar
    OUTPUT.masks, beside it): OUTPUT.masks/<id_file>."""
    labels = logits.argmax(1).to(torch.int32).cpu().numpy()  # [B, H, W]
    dtype = mask_dtype(logits.shape[1])
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as err:
        raise RunError(f"cannot make the folder {folder} for the predicted masks ({first_line(err)})") from None
    for row, path, m in zip(rows, paths, labels):
        try:
            with Image.open(path) as img:
                size = img.size  # (width, height)
        except Exception as err:  # noqa: BLE001 - any unreadable image is a sentence naming it
            raise PoolError(f"{path}: cannot read its size for the predicted mask ({first_line(err)})") from None
        name = id_file(row["id"], ".png")
        out = os.path.join(folder, name)
        try:
            Image.fromarray(_nearest(m, size).astype(dtype)).save(out)
        except OSError as err:
            raise RunError(f"cannot write the predicted mask {out} ({first_line(err)})") from None
        row["pred_mask"] = os.path.join(os.path.basename(os.path.normpath(folder)), name)  # the table's folder's


def _painted(regions, names) -> dict:
    """Brush regions -> the labels file's `mask`: class indices [H, W] (`mask_dtype`; a later region
    over an earlier one), unpainted pixels background (class 0, where names[0] is it) or the ignore
    value. The size a region claims is checked against its stream and a cap before any allocation."""
    if not names:
        raise ValueError("a segmentation mask holds class indices, and no class names are known")
    unpainted = 0 if offered(names) != list(dict.fromkeys(names)) else ignore_value(len(names))
    mask = None
    for r in regions:
        h, w = r["original_height"], r["original_width"]
        check_brush_size(r["value"]["rle"], h, w)
        if mask is None:
            mask = np.full((h, w), unpainted, mask_dtype(len(names)))
        elif mask.shape != (h, w):
            raise ValueError(f"its brush regions are of different sizes ({mask.shape[1]}x"
                             f"{mask.shape[0]} and {w}x{h})")
        for label in r["value"].get("brushlabels", []):
            if label not in names:
                raise ValueError(f"the brush label '{label}' is not among the class names")
            mask[rle_to_mask(r["value"]["rle"], h, w)] = list(names).index(label)
    return {"mask": mask}


def _dists(z: torch.Tensor) -> torch.Tensor:
    return categorical(z, 1)


TASK = Task(
    name="segmentation", shape="[batch, classes, height, width]", fits=lambda z: z.dim() == 4,
    names_model=lambda model: type(model).__module__.startswith("torchvision.models.segmentation"),
    from_rank=4,
    loss=segmentation_loss, dists=_dists, label_targets=_seg_targets,
    valid=all_positions(lambda z: math.prod(z.shape[2:])), classes=lambda z: z.shape[1],
    targets=given_or_predicted, egl=egl_sampled, uncertainty=per_position, table_loss=position_loss,
    columns=set_columns(), pred_values=named_set,
    read_labels=reader(lambda z: torch.full((z.shape[0], *z.shape[2:]), IGNORE, dtype=torch.long), _read),
    check_labels=refuse_single_labels("segmentation"),
    head_types=(nn.Linear, nn.Conv2d),  # a 1x1 convolution heads segmentation models
    badge=position_badge(_dists),
    probe=lambda z, inputs: (TASK.loss, predicted(TASK, z, TASK.valid(z, inputs))),
    control=names_control("segmentation", "BrushLabels", labels=offered),
    prelabels=_brushes, from_annotation=_painted, row_files=_write_masks,
    loss_over_positions=True,
    no_position=lambda z: None if math.prod(z.shape[2:]) else (
        f"the model returns segmentation outputs of shape {list(z.shape)}, with no pixel to score; "
        f"its inputs are too small for it (see --resize)"),
    # the rule in docs/benchmarks.md over benchmarks/results/structured-curves-defaults.json: max
    # entropy, the one setting nothing beat on any of the three data sets (egl lost on mosaics)
    default_strategy="entropy", default_aggregate="max",
)
