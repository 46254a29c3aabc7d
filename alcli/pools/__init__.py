"""The pool kinds: one module each, each defining one PoolKind (common.py): how its spec is
recognised, how it opens, the options it reads, how a row's source is read back. KINDS is THE
registry: open_pool walks it in order and opens the first kind that recognises the spec, so a
narrower kind goes before a broader one (a Parquet folder before an image folder)."""
from __future__ import annotations

import io
import os
from pathlib import Path

from ..errors import ConfigError, PoolError, first_line
from ..files.regular import check_regular
from . import (filelist, folder, hf_dataset, manifest, parquet, prompts, stores, tensors, text,
               video, webdataset)
from .tables import MAX_CELL_BYTES
from .common import IMAGE_EXTS, MANIFEST_EXTS, TENSOR_EXTS, Pool, PoolKind, PoolOptions


def _unreadable(spec, opts: PoolOptions) -> bool:
    """Not a kind: the errors every local file's kind would give, said once before them (a
    missing path, --labels-from-folders on a file, a FIFO or device)."""
    return isinstance(spec, str)


def _refuse(spec: str, opts: PoolOptions, stdin=None) -> None:
    path = Path(spec)
    if not path.exists():
        raise PoolError(f"pool {spec} does not exist")
    if opts.labels_from_folders and not path.is_dir():
        raise ConfigError("--labels-from-folders needs a directory pool with class subfolders")
    if not path.is_dir():
        try:
            check_regular(path)  # a FIFO would block, a device could be endless
        except OSError as err:
            raise PoolError(f"pool {spec} cannot be read ({first_line(err)})") from None
    return None  # readable: the walk goes on


CHECKS = PoolKind("local file checks", _unreadable, _refuse)

KINDS: list[PoolKind] = [
    filelist.STDIN,        # -
    stores.KIND,           # object-store URLs: shards, Parquet, manifests (each kind's opener)
    prompts.KIND,          # a causal LM's rows (--task causal-lm)
    webdataset.KIND,       # .tar shards, brace patterns
    hf_dataset.KIND,       # save_to_disk folders
    parquet.KIND,          # .parquet files and folders of them
    filelist.FILE_LIST,    # several image files
    CHECKS,                # (not a kind: a missing or unreadable local path)
    video.KIND,            # .mp4/.mkv/.webm, or a folder of them
    folder.KIND,           # a folder of images
    text.KIND,             # .txt, or .csv/.jsonl with the text column
    manifest.KIND,         # .csv/.jsonl of image paths
    tensors.KIND,          # .pt/.pth/.npy/.npz
    filelist.IMAGE_FILE,   # one image file
]


def open_pool(spec: str | list[str], opts: PoolOptions, stdin=None) -> Pool:
    """Open the pool `spec` names (a path, '-' for stdin, a brace pattern of tar shards, a URL, or
    a list of image files or of tar shards): the first kind of KINDS that recognises it."""
    for kind in KINDS:
        if kind.recognises(spec, opts):
            pool = kind.opens(spec, opts, stdin)
            if pool is not None:
                return pool
    raise PoolError(f"pool {spec} is not a folder, an image ({', '.join(IMAGE_EXTS)}), a manifest "
                    f"({', '.join(MANIFEST_EXTS)}), a text file (.txt), a tensor file "
                    f"({', '.join(TENSOR_EXTS)}), a video ({', '.join(video.VIDEO_EXTS)}), a Parquet table "
                    f"(.parquet) or tar shards (.tar)")


# --- a row's source, read back -----------------------------------------------------------------

def _part_kind(base: str) -> PoolKind | None:
    """The kind whose files have parts (a shard's members, a table's cells) that `base` is one of."""
    for kind in KINDS:
        if kind.read_part is not None and base.lower().endswith(kind.parts):
            return kind
    return None


def split_source(path: str) -> tuple[str, str | None]:
    """A row's `path` -> (the file, None), or (a container file, what in it: a shard's MEMBER,
    a table's COLUMN[ROW], ...) for FILE#PART where no file has the whole name."""
    if "#" not in path or os.path.lexists(path):
        return path, None
    for at in (i for i, c in enumerate(path) if c == "#"):
        base = path[:at]
        if _part_kind(base) is not None and os.path.isfile(base):
            return base, path[at + 1:]
    return path, None


def source_exists(path: str) -> bool:
    return os.path.isfile(split_source(path)[0])


def open_source(path: str) -> io.BytesIO:
    """The bytes a row's `path` names (split_source). OSError or ValueError when they cannot be
    read."""
    base, part = split_source(path)
    check_regular(base)  # a FIFO would block
    if part is None:
        with open(base, "rb") as f:  # capped as a table's cell is: a row may name any file
            if os.fstat(f.fileno()).st_size > MAX_CELL_BYTES:
                raise ValueError(f"{base} is larger than {MAX_CELL_BYTES >> 20} MiB")
            data = f.read(MAX_CELL_BYTES + 1)
        if len(data) > MAX_CELL_BYTES:  # grown while read
            raise ValueError(f"{base} is larger than {MAX_CELL_BYTES >> 20} MiB")
        return io.BytesIO(data)
    return io.BytesIO(_part_kind(base).read_part(base, part))


def pixel_key(path: str) -> str | None:
    """The exact-duplicate key of the picture a row's `path` names: sha1 of its decoded pixels
    (as RGBA, with the size), so that one picture under two names, with other metadata, or saved
    in another lossless format has one key; None when it cannot be read as an image. One picture
    in memory at a time."""
    import hashlib

    from PIL import Image
    try:
        with Image.open(open_source(path)) as img:
            rgba = img.convert("RGBA")
    except (OSError, ValueError, Image.DecompressionBombError):
        return None
    digest = hashlib.sha1(f"{rgba.size[0]}x{rgba.size[1]}:".encode())
    digest.update(rgba.tobytes())
    return "pixels:" + digest.hexdigest()


def extracted(path: str) -> bool:
    """Does a hand-off get the part of a file that `path` names as an image file of its own (a
    video's frame, for Label Studio)?"""
    base, part = split_source(path)
    return part is not None and _part_kind(base).extracted


# --- what commands ask of a pool's spec before or without opening it ----------------------------

def reads_stdin(spec) -> bool:
    """Is the pool the paths on stdin ('-')?"""
    return filelist.STDIN.recognises(spec, PoolOptions())


def missing(spec) -> bool:
    """Is the pool a local path that does not exist? (Shards and URLs: each named in its own error.)"""
    return isinstance(spec, str) and not reads_stdin(spec) and not Path(spec).exists() \
        and not webdataset.KIND.recognises(spec, PoolOptions()) \
        and not stores.KIND.recognises(spec, PoolOptions())


def is_folder(spec) -> bool:
    """Is the pool a folder of images (where class subfolders could be the labels)?"""
    return folder.KIND.recognises(spec, PoolOptions())


def holds_tensors(spec) -> bool:
    """Is the pool a tensor file (nothing to draw on a contact sheet)?"""
    return tensors.KIND.recognises(spec, PoolOptions())


def local_file(spec) -> bool:
    """Is the pool one local file (a text pool's texts can be read back from it)?"""
    return isinstance(spec, str) and not reads_stdin(spec) and Path(spec).is_file()


def id_files(spec):
    """id -> the file under the pool `spec` a row's id names (None when the pool says nothing
    about that id): the first kind that recognises `spec` and maps ids to files."""
    if not isinstance(spec, str) or reads_stdin(spec):  # a list of image files: ids are their paths
        return lambda i: None
    for kind in KINDS:
        if kind.files_of is not None and kind.recognises(spec, PoolOptions()):
            return kind.files_of(spec)
    return lambda i: None
