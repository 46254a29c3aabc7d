"""What every pool kind shares: the options (PoolOptions), the Dataset of (id, input, label)
items (Pool) and its image and tensor kinds, the collate that batches them, the image transform,
how labels are read, and the PoolKind object each kind's module defines (alcli/pools/__init__.py
walks them). Labels are class indices; -1 means unknown. Reading an example never raises: the item
carries the error instead, so a DataLoader worker can hand it back and the runner decides.
"""
from __future__ import annotations

import csv
import io
import json
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, NamedTuple

import numpy as np
import torch
from PIL import Image
from torch.utils.data import Dataset

from ..errors import ConfigError, PoolError, first_line
from ..files import remote
from ..files.config import Transform
from ..files.regular import check_regular

IMAGE_EXTS = (".png", ".jpg", ".jpeg", ".bmp", ".webp", ".tif", ".tiff")
TENSOR_EXTS = (".pt", ".pth", ".npy", ".npz")
MANIFEST_EXTS = (".csv", ".jsonl")
TEXT_EXTS = (".txt",)
CSV_FIELD_LIMIT = 64 * 2**20  # characters in one CSV field (the csv module's default: 128 K),
csv.field_size_limit(CSV_FIELD_LIMIT)  # so long texts, ids and headers read


@dataclass
class PoolOptions:
    labels_from_folders: bool = False
    transform: Transform = field(default_factory=Transform)
    channels: int | None = None  # what the model's first convolution takes; None if unknown
    null: bool = False           # paths on stdin separated by NUL (find -print0), not newlines
    text_column: str = "text"    # text pools: the manifest column holding the text
    tokenizer: Callable[[], Callable[[list[str]], dict]] | None = None  # makes the model's tokenizer
                                 # (texts -> dict of [B, T] tensors); None: the model has none
    decode: str = "cpu"          # "gpu": image pools hand over JPEG bytes, decoded on the device
    class_names: list[str] | None = None  # the classes' names, known before the pool (string
                                 # labels and class folders map to indices through them)
    class_names_file: str | None = None  # where they came from; None: the model's id2label
    labels_as_given: bool = False  # the task (--task, or what the model names) reads its labels
                                 # as given (Task.given_labels): every label is kept as given
    image_column: str | None = None  # table pools: the image column (None: 'image' if there)
    id_column: str | None = None     # table pools: the id column (None: the row numbers)
    label_column: str | None = None  # table pools: the label column (None: 'label' if there)
    prompts: bool = False            # rows of text, prompt + response, or messages (pools/prompts.py)
    split: str | None = None         # Hugging Face DatasetDict pools: the split scored
    fps: float | None = None         # video pools: frames sampled per second (None: --every)
    every: int | None = None         # video pools: every N-th frame (None and no fps: every one)


@dataclass(frozen=True)
class PoolKind:
    """One pool kind, as its module defines it: how a spec is recognised, how it opens, the
    PoolOptions fields it reads, and how the part of a file a row's path names after '#' is read
    back (the contact sheet, the report, -f paths)."""
    name: str
    recognises: Callable  # (spec: str or list of str, opts) -> is it this kind's
    opens: Callable       # (spec, opts, stdin) -> Pool
    options: tuple[str, ...] = ()  # the PoolOptions fields it reads beyond the transform
    parts: tuple[str, ...] = ()    # suffixes of the files whose parts FILE#PART names
    read_part: Callable | None = None  # (file, part) -> the bytes of an image file; ValueError
    files_of: Callable | None = None   # spec -> (id -> the file the id names, or None): -f paths
    extracted: bool = False  # Label Studio gets its parts as image files extracted beside the
                             # batch (it cannot show a video's frame in place)


class Item(NamedTuple):
    id: str
    input: torch.Tensor | None  # None when reading failed
    label: int                  # -1: unknown
    error: str | None
    path: str | None = None     # the file it was read from (image pools)


class Text(NamedTuple):
    """A text example's input: tokenized together with its batch, when collated."""
    text: str
    tokenize: Callable[[list[str]], dict]


class Batch(NamedTuple):
    ids: list[str]
    inputs: torch.Tensor | dict | None  # [B, ...]; text pools: a dict of [B, T] tensors
    labels: torch.Tensor         # [B] long, -1 unknown
    errors: list[tuple[str, str]]  # (id, message) of items that could not be read
    mismatch: str | None = None  # items of another shape than the first: a config error, not a bad file
    paths: list[str] | None = None  # the files, for image pools (the table's `path` column)
    texts: list[str] | None = None  # the texts, for text pools (the table's `text` column)


class Pool(Dataset):
    """A dataset with the ids known up front; `name` is what error messages call it."""

    name: str
    ids: list[str]
    has_labels: bool
    kind: str  # "images", "tensors" or "text"
    classes: list[str] | None = None  # class names, where the source names them (class folders)
    classes_from: str | None = None   # where `classes` came from, when not class folders
    outputs: int | None = None        # the model's number of classes, once the pre-flight saw it
    task_labels: dict | None = None   # id -> (where, label as given) for labels of other tasks than
                                      # classification (lists, numbers, mask files): alcli.tasks: Task.read_labels
    given_ids: list | None = None  # the caller's ids (any type) where `ids` holds their text
    to_float: Callable | None = None  # batch of stored inputs on the device -> model input
                                      # (images: uint8 -> normalized float); None: as they are
    decode_jpegs: Callable | None = None  # --decode gpu: (JPEG bytes, device) -> (uint8 images
                                          # [B', C, H, W], {position: reason} of those that fail)
    keeps_sizes: bool = False  # detection: images keep their own sizes, a batch holds a list of
                               # them (collate_sized)

    def __len__(self) -> int:
        return len(self.ids)


class JpegBytes(NamedTuple):
    """A JPEG file's bytes [n] uint8, handed over undecoded (--decode gpu)."""
    data: torch.Tensor


class ImagePool(Pool):
    kind = "images"

    def __init__(self, name: str, ids: list[str], paths: list[Path], labels: list[int],
                 transform: Callable, decode: str = "cpu"):
        self.name, self.ids, self.paths, self.labels = name, ids, paths, labels
        self.has_labels = any(label >= 0 for label in labels)
        self.transform = transform
        self.to_float = transform.to_float
        self.decode = decode
        self.decode_jpegs = transform.decode_jpegs if decode == "gpu" else None

    def __getitem__(self, i: int) -> Item:
        if self.decode == "gpu":
            return self._jpeg_bytes(i)
        try:
            with Image.open(_opened(self.paths[i])) as img:
                x = self.transform(img)
        except Exception as err:  # noqa: BLE001 - any unreadable file becomes an error row
            return Item(self.ids[i], None, self.labels[i],
                        f"cannot read image {self.paths[i]} ({first_line(err)})")
        return Item(self.ids[i], x, self.labels[i], None, str(self.paths[i]))

    def _jpeg_bytes(self, i: int) -> Item:
        try:
            data = _image_bytes(self.paths[i])
        except OSError as err:
            return Item(self.ids[i], None, self.labels[i],
                        f"cannot read image {self.paths[i]} ({first_line(err)})")
        if not data.startswith(b"\xff\xd8\xff"):
            return Item(self.ids[i], None, self.labels[i], f"image {self.paths[i]} is not a JPEG "
                        f"file (--decode gpu decodes JPEGs only)")
        return Item(self.ids[i], JpegBytes(torch.frombuffer(bytearray(data), dtype=torch.uint8)),
                    self.labels[i], None, str(self.paths[i]))


def _opened(path):
    """What Image.open reads: a local file (only a regular one: a FIFO would block it forever),
    or an object-store file's bytes (a manifest's image at a URL)."""
    if isinstance(path, remote.Remote):
        return io.BytesIO(remote.read_bytes(path))
    check_regular(path)
    return path


def _image_bytes(path) -> bytes:
    if isinstance(path, remote.Remote):
        return remote.read_bytes(path)
    check_regular(path)
    return Path(path).read_bytes()


def collate(items: list[Item]) -> Batch:
    """Stack the readable items; same-shaped inputs are required (use transform.resize)."""
    good = [it for it in items if it.error is None]
    errors = [(it.id, it.error) for it in items if it.error is not None]
    if not good:
        return Batch([], None, torch.empty(0, dtype=torch.long), errors)
    first = good[0]
    if isinstance(first.input, Text):
        return _collate_texts(good, errors)
    if isinstance(first.input, JpegBytes):  # decoded (and sized) on the device: see to_float
        return Batch([it.id for it in good], [it.input.data for it in good],
                     torch.tensor([it.label for it in good], dtype=torch.long), errors,
                     paths=[it.path for it in good])
    mismatch = None
    for it in good[1:]:
        if it.input.shape != first.input.shape and mismatch is None:
            mismatch = (f"example {it.id} has shape {list(it.input.shape)} but {first.id} has "
                        f"{list(first.input.shape)}; set transform.resize and "
                        f"transform.center_crop in the config")
            errors.append((it.id, mismatch))
    good = [it for it in good if it.input.shape == first.input.shape]
    paths = [it.path for it in good] if first.path is not None else None
    return Batch([it.id for it in good], torch.stack([it.input for it in good]),
                 torch.tensor([it.label for it in good], dtype=torch.long), errors, mismatch, paths)


def collate_sized(items: list[Item]) -> Batch:
    """The readable items' inputs as a list, each of its own size (detectors take them so)."""
    good = [it for it in items if it.error is None]
    errors = [(it.id, it.error) for it in items if it.error is not None]
    paths = [it.path for it in good] if good and good[0].path is not None else None
    return Batch([it.id for it in good], [it.input for it in good],
                 torch.tensor([it.label for it in good], dtype=torch.long), errors, None, paths)


# --- images -------------------------------------------------------------------------------------

class ImageTransform:
    """PIL image -> uint8 tensor [C, H, W] (channel mode, resize, center crop), made in the
    DataLoader's workers; `to_float` then turns a batch into the model's input on its device
    ([0, 1], normalize), so images travel as uint8, a quarter of float32.

    Resize and crop follow torchvision's conventions (bilinear; an int resizes the shorter side;
    a crop larger than the image pads with zeros) without importing torchvision (startup time).
    """

    def __init__(self, mode: str, t: Transform):
        self.mode, self.t = mode, t
        norm = t.normalize
        self.mean = None if norm is None else torch.tensor(norm["mean"]).view(-1, 1, 1)
        self.std = None if norm is None else torch.tensor(norm["std"]).view(-1, 1, 1)

    def __call__(self, img) -> torch.Tensor:
        if self.t.grayscale and img.mode != "L":
            img = img.convert("L")
        if img.mode != self.mode:
            img = img.convert(self.mode)
        if self.t.resize is not None:
            img = img.resize(resized(img.size, self.t.resize), Image.BILINEAR)
        if self.t.center_crop is not None:
            img = img.crop(crop_box(img.size, self.t.center_crop))
        x = torch.from_numpy(np.array(img, dtype=np.uint8))
        x = x.unsqueeze(0) if x.dim() == 2 else x.permute(2, 0, 1)  # [C, H, W]
        return x.contiguous()

    def to_float(self, x, device: torch.device | None = None) -> torch.Tensor:
        """uint8 [..., C, H, W] on any device -> float32 in [0, 1], normalized, on that device.
        A list of JPEG files' bytes (--decode gpu) is decoded on `device` first."""
        if isinstance(x, list):
            x, failed = self.decode_jpegs(x, device or torch.device("cpu"))
            if failed:  # the runner decodes first (`decoded`), making these error rows
                raise PoolError(f"image {min(failed) + 1} of the batch cannot be decoded "
                                f"({failed[min(failed)]})")
        x = x.to(torch.float32) / 255.0
        if self.mean is not None:
            x = (x - self.mean.to(x.device, non_blocking=True)) / self.std.to(x.device, non_blocking=True)
        return x

    def decode_jpegs(self, datas: list[torch.Tensor], device: torch.device
                     ) -> tuple[torch.Tensor | None, dict[int, str]]:
        """JPEG bytes -> uint8 [B', C, H, W] on `device` (nvJPEG on CUDA), in the channel mode,
        resized and cropped there as the PIL path would (bilinear, antialiased). Files the decoder
        refuses (truncated, corrupt) are left out: {position: reason} beside the images."""
        with warnings.catch_warnings():  # torchvision 0.29 calls its decoders deprecated
            warnings.simplefilter("ignore", DeprecationWarning)
            from torchvision.io import ImageReadMode, decode_jpeg  # only for --decode gpu (2 s)
            from torchvision.transforms.v2 import functional as TF
        gray = self.t.grayscale or self.mode == "L"
        mode = ImageReadMode.GRAY if gray else ImageReadMode.RGB
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            images, failed = _decode_each(decode_jpeg, datas, mode,
                                          device if device.type == "cuda" else "cpu")
        if not images:
            return None, failed
        out = []
        for img in images:  # [C, H, W] uint8
            img = img.to(device)
            if gray and self.mode != "L":
                img = img.expand(3, -1, -1)
            if self.t.resize is not None:
                w, h = resized((img.shape[2], img.shape[1]), self.t.resize)
                img = TF.resize(img, [h, w], antialias=True)
            if self.t.center_crop is not None:
                img = TF.center_crop(img, self.t.center_crop)
            out.append(img)
        if any(o.shape != out[0].shape for o in out):
            raise PoolError("images of different sizes in one batch; set transform.resize and "
                            "transform.center_crop in the config")
        return torch.stack(out), failed


def _decode_each(decode_jpeg, datas: list[torch.Tensor], mode, device
                 ) -> tuple[list[torch.Tensor], dict[int, str]]:
    """The batch decoded in one call; if a file fails it, one by one, so only that file is lost."""
    try:
        return list(decode_jpeg(datas, mode=mode, device=device)), {}
    except (RuntimeError, ValueError):
        pass
    images, failed = [], {}
    for i, data in enumerate(datas):
        try:
            images.append(decode_jpeg(data, mode=mode, device=device))
        except (RuntimeError, ValueError) as err:
            failed[i] = first_line(err)
    return images, failed


def decoded(batch: Batch, pool: Pool, device: torch.device) -> Batch:
    """--decode gpu: the batch's JPEG bytes -> uint8 images [B, C, H, W] on `device`; a file the
    decoder refuses becomes one of the batch's errors, as an unreadable file does in the loader."""
    if not isinstance(batch.inputs, list) or not batch.inputs or batch.inputs[0].dim() != 1:
        return batch  # not JPEG bytes (1-D): a tensor, or images of their own sizes (collate_sized)
    images, failed = pool.decode_jpegs(batch.inputs, device)
    keep = [i for i in range(len(batch.ids)) if i not in failed]
    errors = batch.errors + [(batch.ids[i], f"cannot read image {batch.paths[i]} ({failed[i]})")
                             for i in sorted(failed)]
    return Batch([batch.ids[i] for i in keep], images, batch.labels[keep], errors, batch.mismatch,
                 [batch.paths[i] for i in keep])


def resized(size: tuple[int, int], resize) -> tuple[int, int]:
    """(width, height) after resizing: an int sets the shorter side, keeping the aspect ratio."""
    w, h = size
    if isinstance(resize, list):
        return resize[1], resize[0]
    if w <= h:
        return resize, int(resize * h / w)
    return int(resize * w / h), resize


def crop_box(size: tuple[int, int], crop) -> tuple[int, int, int, int]:
    w, h = size
    ch, cw = (crop, crop) if isinstance(crop, int) else crop
    left = int(round((w - cw) / 2.0)) if w >= cw else -((cw - w) // 2)
    top = int(round((h - ch) / 2.0)) if h >= ch else -((ch - h) // 2)
    return left, top, left + cw, top + ch


def image_transform(t: Transform, channels: int | None) -> ImageTransform:
    """The transform for images fed to a model whose first convolution takes `channels`."""
    modes = {1: "L", 3: "RGB", 4: "RGBA"}
    if channels is None:
        channels = 1 if t.grayscale else 3
    if channels not in modes:
        raise PoolError(f"the model takes {channels}-channel inputs, which images cannot provide; "
                        f"use a tensor pool (.pt, .npy, .npz)")
    if t.normalize is not None:
        n = len(t.normalize["mean"])
        if n not in (1, channels):
            raise ConfigError(f"transform.normalize has {n} mean/std values but the model takes "
                              f"{channels}-channel images")
    return ImageTransform(modes[channels], t)


def image_pool(name: str, rows: list[tuple[str, Path, int]], opts: PoolOptions) -> ImagePool:
    if not rows:
        raise PoolError(f"pool {name} holds no images (looked for {', '.join(IMAGE_EXTS)})")
    check_unique_ids(name, [r[0] for r in rows])
    ids, paths, labels = (list(col) for col in zip(*rows))
    return ImagePool(name, ids, paths, labels, image_transform(opts.transform, opts.channels),
                     opts.decode)


def check_unique_ids(name: str, ids: list[str]) -> None:
    seen: dict[str, int] = {}
    for i, id_ in enumerate(ids):
        if id_ in seen:
            raise PoolError(f"pool {name} has the id '{id_}' twice (entries {seen[id_] + 1} and {i + 1})")
        seen[id_] = i


def names_source(names_file: str | None) -> str:
    """Where class names came from, in words: a --class-names file, else the model's id2label."""
    return f"class names file {names_file}" if names_file else "the model's id2label"


def named_label(value, where: str, opts: PoolOptions):
    """A label given as a class name -> its index; anything else as it is (for label_index)."""
    if not isinstance(value, str) or not value.strip():
        return value
    try:
        int(value)
        return value
    except ValueError:
        pass
    names = opts.class_names
    if names is None:
        raise PoolError(f"{where}: label '{value}' is not a class index (an integer), and no "
                        f"class names are known to look it up; pass --class-names FILE (one name "
                        f"per line, in the model's class order)")
    if value.strip() not in names:
        raise PoolError(f"{where}: label '{value}' is not one of the {len(names)} class names of "
                        f"{names_source(opts.class_names_file)}")
    return names.index(value.strip())


def label_index(value, where: str) -> int:
    if value is None or value == "":
        return -1
    if isinstance(value, (bool, float)):  # JSON true or 2.7: not silently 1 or 2
        raise PoolError(f"{where}: label {json.dumps(value)} is not a class index (an integer)")
    try:
        label = int(value)
    except (TypeError, ValueError):
        raise PoolError(f"{where}: label {value!r} is not a class index (an integer)") from None
    if label < 0:
        raise PoolError(f"{where}: label {label} is negative")
    return label


def task_label(row: dict, opts: PoolOptions, base: Path):
    """A row's label for another task than classification, as given (alcli.tasks: Task.read_labels reads it
    once the task is known): a mask file (column `mask`, or a `label` naming an image file, made
    relative to the manifest), a list, `a|b`, or any label when the task is known to be another;
    None for a class index (or no label)."""
    value = row.get("mask")
    value = row.get("label") if value in (None, "") else value
    if value is None or value == "":
        return None
    if isinstance(value, str) and (row.get("mask") not in (None, "") or value.lower().endswith(IMAGE_EXTS)):
        return str(Path(value) if Path(value).is_absolute() else base / value)
    if opts.labels_as_given or isinstance(value, list) or \
            (isinstance(value, str) and "|" in value):
        return value
    return None


def with_task_labels(pool: Pool, task_labels: dict) -> Pool:
    if task_labels:
        pool.task_labels, pool.has_labels = task_labels, True
    return pool


def csv_error(path: Path, reader: csv.DictReader, err: csv.Error) -> PoolError:
    line = reader.reader.line_num  # DictReader's own line_num is the last good row's
    return PoolError(f"manifest {path} line {line} cannot be read as CSV "
                     f"({first_line(err)})")


def shortened(text: str, most: int = 200) -> str:
    return text if len(text) <= most else text[:most] + "..."


def _collate_texts(good: list[Item], errors: list) -> Batch:
    """Text items tokenized as one batch: padded to its longest, attention masks included."""
    inputs = good[0].input.tokenize([it.input.text for it in good])
    return Batch([it.id for it in good], inputs,
                 torch.tensor([it.label for it in good], dtype=torch.long), errors,
                 texts=[it.input.text for it in good])


def no_folders(opts: PoolOptions) -> None:
    """None, or ConfigError for --labels-from-folders on a pool that has no class folders."""
    if opts.labels_from_folders:
        raise ConfigError("--labels-from-folders needs a directory pool with class subfolders; "
                          "a table or shard pool takes its labels from --label-column or .cls")
