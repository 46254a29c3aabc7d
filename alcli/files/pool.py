"""Pool sources -> a torch Dataset of (id, input, label) items, and the collate that batches them.

A source is a small function `(spec, opts) -> Pool`, picked by what `spec` names: `-` (paths on
stdin), a directory of images, a manifest (.csv/.jsonl with a `path` column), a text pool (.txt, or
.csv/.jsonl with a `text` column; tokenized when a batch is collated), a tensor file
(.pt/.npy/.npz); tables and tar shards are in tables.py and webdataset.py, and sources.py picks
among them all. Labels are class indices; -1 means unknown. Reading an example never raises: the
item carries the error instead, so a DataLoader worker can hand it back and the runner decides.
"""
from __future__ import annotations

import csv
import io
import json
import os
import sys
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, NamedTuple

import numpy as np
import torch
from PIL import Image
from torch.utils.data import Dataset

from .config import Transform
from ..errors import ConfigError, PoolError, first_line
from .jsonl import json_objects
from . import remote
from .regular import check_regular

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
    prompts: bool = False            # rows of text, prompt + response, or messages (files/prompts.py)
    split: str | None = None         # Hugging Face DatasetDict pools: the split scored


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


class TensorPool(Pool):
    kind = "tensors"

    def __init__(self, name: str, x: torch.Tensor, y: torch.Tensor | None, ids: list[str] | None):
        n = x.shape[0]
        for what, other in (("y", y), ("ids", ids)):
            if other is not None and len(other) != n:
                raise PoolError(f"tensor pool {name}: '{what}' has {len(other)} entries but 'x' has {n}")
        self.name, self.x = name, x
        self.y = y.long() if y is not None else torch.full((n,), -1, dtype=torch.long)
        self.ids = [str(i) for i in ids] if ids is not None else [str(i) for i in range(n)]
        self.has_labels = bool((self.y >= 0).any())

    def __getitem__(self, i: int) -> Item:
        return Item(self.ids[i], self.x[i], int(self.y[i]), None)


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
            img = img.resize(_resized(img.size, self.t.resize), Image.BILINEAR)
        if self.t.center_crop is not None:
            img = img.crop(_crop_box(img.size, self.t.center_crop))
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
                w, h = _resized((img.shape[2], img.shape[1]), self.t.resize)
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


def _resized(size: tuple[int, int], resize) -> tuple[int, int]:
    """(width, height) after resizing: an int sets the shorter side, keeping the aspect ratio."""
    w, h = size
    if isinstance(resize, list):
        return resize[1], resize[0]
    if w <= h:
        return resize, int(resize * h / w)
    return int(resize * w / h), resize


def _crop_box(size: tuple[int, int], crop) -> tuple[int, int, int, int]:
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


def _image_pool(name: str, rows: list[tuple[str, Path, int]], opts: PoolOptions) -> ImagePool:
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


def from_directory(spec: str, opts: PoolOptions) -> Pool:
    """Every image under the folder (recursive, sorted); ids are paths relative to it.

    Every entry named like an image is listed, so one that is not a readable image file (a
    directory, a dangling link, a FIFO, a corrupt file) becomes an error row rather than vanishing.
    Links to folders are followed (as `find -L` does), except into a folder already open above."""
    root = Path(spec)
    files = sorted(_image_entries(root), key=lambda p: p.relative_to(root).as_posix())
    classes: dict[str, int] = {}
    by_name = None
    if opts.labels_from_folders:  # ImageFolder's convention: sorted class subfolders
        top = _folder_key(root)
        folders = sorted(e.name for e in os.scandir(root) if _folder_key(e) not in (None, top))
        by_name = _folders_by_name(root, folders, opts)
        classes = by_name or {name: i for i, name in enumerate(folders)}
    rows = []
    for p in files:
        rel = p.relative_to(root).as_posix()
        label = -1
        if opts.labels_from_folders:
            if "/" not in rel:
                raise PoolError(f"with --labels-from-folders every image must be in a class folder, "
                                f"but {p} is directly in {root}")
            label = classes[rel.split("/", 1)[0]]
        rows.append((rel, p, label))
    pool = _image_pool(str(root), rows, opts)
    if opts.labels_from_folders:
        pool.classes = opts.class_names if by_name else list(classes)
        pool.classes_from = names_source(opts.class_names_file) if by_name else None
    return pool


def _image_entries(root: Path) -> list[Path]:
    """The entries named like images under `root`, walked with a stack (no depth limit), following
    links to folders but not into one open above (a link loop such as `loop -> .`)."""
    found = []
    stack = [(root, frozenset({_folder_key(root)}))]  # (folder, the folders open above and at it)
    while stack:
        folder, above = stack.pop()
        try:
            entries = list(os.scandir(folder))
        except OSError as err:
            raise PoolError(f"folder {folder} in pool {root} cannot be read ({first_line(err)})") from None
        for entry in entries:
            path = folder / entry.name
            if path.suffix.lower() in IMAGE_EXTS:
                found.append(path)
            key = _folder_key(entry)
            if key is not None and key not in above:
                stack.append((path, above | {key}))
    return found


def _folder_key(entry: os.DirEntry | Path) -> tuple[int, int] | None:
    """(device, inode) of a folder, links followed; None for anything else."""
    try:
        if not entry.is_dir():
            return None
        st = entry.stat()
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _folders_by_name(root: Path, folders: list[str], opts: PoolOptions) -> dict[str, int] | None:
    """Class folders -> the index of their name among the known class names; None when there
    are none, or when the model's names (id2label) do not name every folder (then the folders,
    sorted, are the classes). A folder a --class-names file does not name is an error."""
    names = opts.class_names
    if not names:
        return None
    missing = [f for f in folders if f not in names]
    if not missing:
        return {f: names.index(f) for f in folders}
    if opts.class_names_file is None:
        return None
    raise PoolError(f"class folder {root / missing[0]} is not one of the {len(names)} class names "
                    f"in {opts.class_names_file}")


def names_source(names_file: str | None) -> str:
    """Where class names came from, in words: a --class-names file, else the model's id2label."""
    return f"class names file {names_file}" if names_file else "the model's id2label"


def _named_label(value, where: str, opts: PoolOptions):
    """A label given as a class name -> its index; anything else as it is (for _label)."""
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


def from_stdin(spec: str, opts: PoolOptions, stream=None) -> Pool:
    """Image paths, one per line (or NUL-separated with opts.null); each path as given is its id:
    only the line's end (newline, or CR LF) is removed, so names may hold spaces or a bare CR."""
    stream = stream if stream is not None else sys.stdin
    text = _read_untranslated(stream)
    if opts.null:
        entries = text.split("\0")
    elif "\0" in text:
        raise PoolError("the paths on stdin are separated by NUL characters (find -print0?); "
                        "pass -0/--null to read them so")
    else:
        entries = [line.removesuffix("\r") for line in text.split("\n")]
    return from_files([e for e in entries if e], opts, "from stdin")


def _read_untranslated(stream) -> str:
    """A text stream's content with its line ends as sent (sys.stdin turns a bare CR into a newline)."""
    buffer = getattr(stream, "buffer", None)
    if buffer is None:
        return stream.read()
    return buffer.read().decode(stream.encoding or "utf-8", stream.errors or "strict")


def from_files(paths: list[str], opts: PoolOptions, name: str | None = None) -> Pool:
    """Image files named one by one (the command line, stdin); each path as given is its id."""
    return _image_pool(name or (paths[0] if len(paths) == 1 else f"of {len(paths)} image files"),
                       [(p, Path(p), -1) for p in paths], opts)


def _label(value, where: str) -> int:
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


def from_manifest(spec, opts: PoolOptions) -> Pool:
    """A .csv or .jsonl with `path` (relative to the manifest), optional `id` and `label`; the
    manifest may be an object-store file (a remote.Remote), its images then beside it there."""
    path = spec if isinstance(spec, remote.Remote) else Path(spec)
    base = remote.parent(path)
    records: list[tuple[int, dict]] = []  # (line number, record)
    try:
        with _text_of(path) as f:
            if str(path).lower().endswith(".csv"):
                reader = csv.DictReader(f)
                if not reader.fieldnames or "path" not in reader.fieldnames:
                    raise PoolError(f"manifest {path} has no 'path' column "
                                    f"(columns: {_shortened(', '.join(reader.fieldnames or []))})")
                records = [(reader.line_num, row) for row in reader]
            else:
                records = list(json_objects(f, lambda n: f"manifest {path} line {n}", PoolError))
    except (OSError, UnicodeDecodeError) as err:
        raise PoolError(f"manifest {path} cannot be read as UTF-8 text ({first_line(err)})") from None
    except csv.Error as err:  # a field over CSV_FIELD_LIMIT, ...
        raise _csv_error(path, reader, err) from None
    rows, task_labels = [], {}
    for n, row in records:
        where = f"manifest {path} line {n}"
        if not row.get("path"):
            raise PoolError(f"{where} has no path")
        full = _image_path(str(row["path"]), base)
        id_ = row.get("id")
        raw = _task_label(row, opts, base)
        rows.append((str(id_) if id_ not in (None, "") else str(row["path"]), full,
                     -1 if raw is not None else _label(_named_label(row.get("label"), where, opts), where)))
        if raw is not None:
            task_labels[rows[-1][0]] = (where, raw)
    pool = _with_task_labels(_image_pool(str(path), rows, opts), task_labels)
    # the label columns a detector would take as given boxes (detection.given_boxes refuses them)
    pool.given_columns = (str(path), [c for c in ("boxes", "label")
                                      if any(row.get(c) not in (None, "", []) for _, row in records)])
    return pool


def _text_of(path):
    """A manifest open as text (UTF-8, a BOM dropped), local or in an object store."""
    if isinstance(path, remote.Remote):
        return io.StringIO(remote.read_bytes(path).decode("utf-8-sig"), newline="")
    return open(path, newline="", encoding="utf-8-sig")


def _image_path(value: str, base):
    """A manifest's image: a URL, an absolute path, or a path relative to the manifest's folder
    (in its object store for a remote manifest)."""
    if remote.is_url(value):
        return remote.locate(value)
    if isinstance(base, remote.Remote):
        return remote.join(base, value)
    p = Path(value)
    return p if p.is_absolute() else base / p


def _task_label(row: dict, opts: PoolOptions, base: Path):
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


def _with_task_labels(pool: Pool, task_labels: dict) -> Pool:
    if task_labels:
        pool.task_labels, pool.has_labels = task_labels, True
    return pool


def _csv_error(path: Path, reader: csv.DictReader, err: csv.Error) -> PoolError:
    line = reader.reader.line_num  # DictReader's own line_num is the last good row's
    return PoolError(f"manifest {path} line {line} cannot be read as CSV "
                     f"({first_line(err)})")


def _shortened(text: str, most: int = 200) -> str:
    return text if len(text) <= most else text[:most] + "..."


def from_tensor_file(spec: str, opts: PoolOptions) -> Pool:
    """.pt (a tensor, or a dict with x and optional y, ids), .npy (x), .npz (x, optional y, ids)."""
    path = Path(spec)
    suffix = path.suffix.lower()
    try:
        if suffix in (".pt", ".pth"):
            data = torch.load(path, map_location="cpu", weights_only=True)
        elif suffix == ".npy":
            data = np.load(path, allow_pickle=False)
        else:
            with np.load(path, allow_pickle=False) as npz:
                data = {k: npz[k] for k in npz.files}
                if "x" not in data and len(data) == 1:
                    data = {"x": next(iter(data.values()))}
    except Exception as err:  # noqa: BLE001
        raise PoolError(f"tensor pool {path} cannot be read ({first_line(err)})") from None
    if not isinstance(data, dict):
        data = {"x": data}
    if "x" not in data:
        raise PoolError(f"tensor pool {path} must hold a tensor or a dict with 'x' "
                        f"(found keys: {', '.join(map(str, data))})")
    x, y, ids = (_as_tensor(data.get(k), path, k) for k in ("x", "y", "ids"))
    if x is None or x.dim() == 0 or x.shape[0] == 0:
        raise PoolError(f"tensor pool {path} holds no examples")
    if ids is not None:
        ids = [str(i.item()) if isinstance(i, torch.Tensor) else str(i) for i in ids]
        check_unique_ids(str(path), ids)
    if y is not None and y.is_floating_point():
        raise PoolError(f"tensor pool {path}: 'y' must hold integer class indices")
    return TensorPool(str(path), x, y, ids)


def _as_tensor(value, path: Path, key: str):
    if value is None or isinstance(value, torch.Tensor):
        return value
    if isinstance(value, np.ndarray):
        if value.dtype.kind in "US" and key == "ids":
            return [str(v) for v in value.tolist()]
        if value.dtype.kind not in "biuf":
            raise PoolError(f"tensor pool {path}: '{key}' has unsupported dtype {value.dtype}")
        return torch.from_numpy(np.ascontiguousarray(value))
    if key == "ids" and isinstance(value, (list, tuple)):
        return list(value)
    raise PoolError(f"tensor pool {path}: '{key}' must be a tensor or array, not {type(value).__name__}")


def open_pool(spec: str | list[str], opts: PoolOptions, stdin=None) -> Pool:
    """Pick the source for `spec` (a path, '-' for stdin, or a list of image files) and open it."""
    if isinstance(spec, list):
        return _named_files(spec, opts)
    if spec == "-":
        return from_stdin(spec, opts, stdin)
    path = Path(spec)
    if not path.exists():
        raise PoolError(f"pool {spec} does not exist")
    if opts.labels_from_folders and not path.is_dir():
        raise ConfigError("--labels-from-folders needs a directory pool with class subfolders")
    suffix = path.suffix.lower()
    if path.is_dir():
        return from_directory(spec, opts)
    try:
        check_regular(path)  # a FIFO would block, a device could be endless
    except OSError as err:
        raise PoolError(f"pool {spec} cannot be read ({first_line(err)})") from None
    if suffix in TEXT_EXTS or (suffix in MANIFEST_EXTS and is_text_manifest(path, opts.text_column)):
        return from_text_file(spec, opts)
    if suffix in MANIFEST_EXTS:
        return from_manifest(spec, opts)
    if suffix in TENSOR_EXTS:
        return from_tensor_file(spec, opts)
    if suffix in IMAGE_EXTS:
        return from_files([spec], opts)
    raise PoolError(f"pool {spec} is not a folder, an image ({', '.join(IMAGE_EXTS)}), a manifest "
                    f"({', '.join(MANIFEST_EXTS)}), a text file (.txt), a tensor file "
                    f"({', '.join(TENSOR_EXTS)}), a Parquet table (.parquet) or tar shards (.tar)")

def _named_files(paths: list[str], opts: PoolOptions) -> Pool:
    """Several POOL arguments: each must be an image file (one folder, manifest or tensor file
    is a pool on its own)."""
    if opts.labels_from_folders:
        raise ConfigError("--labels-from-folders needs one directory pool with class subfolders")
    for p in paths:
        if p == "-" or Path(p).suffix.lower() not in IMAGE_EXTS or Path(p).is_dir():
            raise PoolError(f"pool {p}: several POOL arguments must all be image files "
                            f"({', '.join(IMAGE_EXTS)}); a folder, manifest, tensor file or - "
                            f"is a pool on its own")
        if not Path(p).exists():
            raise PoolError(f"pool file {p} does not exist")
    return from_files(paths, opts)


# --- text ---------------------------------------------------------------------------------------

class TextPool(Pool):
    kind = "text"

    def __init__(self, name: str, ids: list[str], texts: list[str], labels: list[int],
                 tokenize: Callable[[list[str]], dict]):
        self.name, self.ids, self.texts, self.labels = name, ids, texts, labels
        self.has_labels = any(label >= 0 for label in labels)
        self.tokenize = tokenize

    def __getitem__(self, i: int) -> Item:
        return Item(self.ids[i], Text(self.texts[i], self.tokenize), self.labels[i], None)


def _collate_texts(good: list[Item], errors: list) -> Batch:
    """Text items tokenized as one batch: padded to its longest, attention masks included."""
    inputs = good[0].input.tokenize([it.input.text for it in good])
    return Batch([it.id for it in good], inputs,
                 torch.tensor([it.label for it in good], dtype=torch.long), errors,
                 texts=[it.input.text for it in good])


def is_text_manifest(path: Path, column: str) -> bool:
    """Does the .csv header, or the first .jsonl object, have the text column?"""
    try:
        with open(path, newline="") as f:
            if path.suffix.lower() == ".csv":
                reader = csv.DictReader(f)
                return column in (reader.fieldnames or [])
            for _, obj in json_objects(f, lambda n: f"manifest {path} line {n}", PoolError):
                return column in obj
    except (OSError, UnicodeDecodeError) as err:
        raise PoolError(f"manifest {path} cannot be read ({first_line(err)})") from None
    except csv.Error as err:
        raise _csv_error(path, reader, err) from None
    return False


def from_text_file(spec: str, opts: PoolOptions) -> Pool:
    """Texts: a .txt file (one per line; its line number is its id), or a .csv/.jsonl manifest with
    the `text_column` column and optional `id` (default: the line number) and `label`."""
    path = Path(spec)
    rows: list[tuple] = []  # (id, text, label, (where, another task's label) or None)
    suffix = path.suffix.lower()
    try:
        # .txt: lines end at \n only (as for wc -l and sed), a bare CR stays in its text
        with open(path, newline="\n" if suffix == ".txt" else "", encoding="utf-8") as f:
            if suffix == ".txt":
                rows = [(str(n), _line_text(line), -1, None) for n, line in enumerate(f, 1) if line.strip()]
            elif suffix == ".csv":
                reader = csv.DictReader(f)
                rows = [_text_row(path, reader.line_num, row, opts) for row in reader]
            else:
                rows = [_text_row(path, n, row, opts)
                        for n, row in json_objects(f, lambda n: f"manifest {path} line {n}", PoolError)]
    except (OSError, UnicodeDecodeError) as err:
        raise PoolError(f"text pool {path} cannot be read ({first_line(err)})") from None
    except csv.Error as err:
        raise _csv_error(path, reader, err) from None
    if not rows:
        raise PoolError(f"text pool {path} holds no texts")
    if opts.tokenizer is None:
        raise PoolError(f"text pool {path} needs a tokenizer: pass --model a Hugging Face model "
                        f"directory that holds one")
    check_unique_ids(str(path), [r[0] for r in rows])
    ids, texts, labels, raws = (list(col) for col in zip(*rows))
    return _with_task_labels(TextPool(str(path), ids, texts, labels, opts.tokenizer()),
                             {i: raw for i, raw in zip(ids, raws) if raw is not None})


def _line_text(line: str) -> str:
    """A line without its end: the newline, or the CR LF of a Windows file."""
    return line.removesuffix("\n").removesuffix("\r")


def _text_row(path: Path, n: int, row: dict, opts: PoolOptions) -> tuple[str, str, int, tuple | None]:
    where, column = f"manifest {path} line {n}", opts.text_column
    text = row.get(column)
    if not isinstance(text, str):
        raise PoolError(f"{where} has no text in column '{column}'" if text is None else
                        f"{where}: '{column}' must be a string, not {type(text).__name__}")
    id_ = row.get("id")
    raw = _task_label(row, opts, path.parent)
    return ((str(id_) if id_ not in (None, "") else str(n)), text,
            -1 if raw is not None else _label(_named_label(row.get("label"), where, opts), where),
            None if raw is None else (where, raw))


def tensor_pool(x, y=None, ids=None, name: str = "tensor pool") -> TensorPool:
    """A pool from in-memory data (the Python API): x [N, ...], optional labels y [N] and ids of
    any type (default: the positions 0..N-1). Rows scored in memory carry the ids as given; tables
    and ranking ties use their text."""
    try:
        x = torch.as_tensor(x)
        y = None if y is None else torch.as_tensor(y)
    except (TypeError, ValueError, RuntimeError) as err:
        kinds = " and ".join(type(p).__name__ for p in (x, y) if p is not None)
        raise PoolError(f"pool must be x, (x,), (x, y) or (x, y, ids) with x a tensor or array of "
                        f"inputs; a {kinds} cannot be made a tensor ({first_line(err)})") from None
    if x.dim() == 0:
        raise PoolError(f"{name}: the examples must be a tensor or array [N, ...], not a scalar")
    if y is not None and (y.shape != (x.shape[0],) or y.is_floating_point() or y.is_complex()):
        raise PoolError(f"{name}: labels y must be {x.shape[0]} integer class indices (-1 = "
                        f"unknown), one per example; got a {y.dtype} tensor of shape {list(y.shape)}")
    if isinstance(ids, (str, bytes)):
        raise PoolError(f"{name}: ids must be a list of {x.shape[0]} ids, one per example, not a "
                        f"{type(ids).__name__} (whose characters would become the ids)")
    given = list(range(x.shape[0])) if ids is None else list(ids)
    texts = [str(i) for i in given]
    check_unique_ids(name, texts)
    pool = TensorPool(name, x, y, texts)
    pool.given_ids = given
    return pool


__all__ = ["Batch", "Item", "Pool", "PoolOptions", "Text", "TextPool", "check_unique_ids", "collate",
           "image_transform", "open_pool", "tensor_pool", "IMAGE_EXTS"]
