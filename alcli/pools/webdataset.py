"""WebDataset shards: tar files whose consecutive members are grouped into samples by key
(`dir/name` up to the first dot of the file name; the rest is the member's extension):
`.jpg`/`.png`/... an image, `.txt` a text, `.cls` an integer label; `.json` and other members are
ignored. A sample's id is the name of the member its input is read from (`dir/name.jpg`), as a
folder pool's id is the file's path under the folder, so the same images as files and as shards
have the same ids; its row's `path` is SHARD#MEMBER (alcli.pools.open_source reads it). Opening reads the tar headers (and the small `.cls` members) of
every shard into flat arrays (about 40 bytes a sample besides its id); an item is
read by seeking to its member, so shards spread over DataLoader workers and --shard without
reading one another. Shards are named one by one, or by a brace pattern: `pool-{000..009}.tar`,
as paths or object-store URLs (remote.py; a remote shard is read ahead in blocks of 8 MiB).
"""
from __future__ import annotations

import os
import re
import sys
import tarfile
from array import array
from pathlib import Path
from typing import NamedTuple

from ..errors import PoolError, first_line
from ..files import remote
from .common import Item, Pool, PoolKind, PoolOptions, Text, label_index, no_folders
from . import tables
from .tables import image_item, oversized, set_decoding

MAX_LABEL_BYTES = 1024  # a .cls member is a class index or name
IMAGE_KEYS = ("jpg", "jpeg", "png", "webp", "bmp", "tif", "tiff")
BRACE = re.compile(r"\{([^{}]*)\}")


def is_shard_spec(spec: str) -> bool:
    return spec.lower().endswith(".tar")


def _are_shards(spec, opts: PoolOptions) -> bool:
    """A .tar file or brace pattern of them, or a list of them (local; URLs: stores.py)."""
    specs = spec if isinstance(spec, list) else [spec]
    return bool(specs) and all(is_shard_spec(s) for s in specs)


def read_member(shard: str, name: str) -> bytes:
    """A shard's member, read back for a row's SHARD#MEMBER path."""
    try:
        with tarfile.open(shard, "r:") as tar:
            info = tar.getmember(name)  # reads the headers up to it
            if info.size > tables.MAX_CELL_BYTES:
                raise ValueError(f"member {name} of {shard} is {info.size} bytes")
            return tar.extractfile(info).read()
    except KeyError:
        raise ValueError(f"shard {shard} has no member {name}") from None
    except tarfile.TarError as err:
        raise ValueError(f"shard {shard} cannot be read ({err})") from None


KIND = PoolKind("tar shards", _are_shards,
                lambda spec, opts, stdin: no_folders(opts) or from_shards(
                    spec if isinstance(spec, list) else [spec], opts),
                options=("tokenizer", "class_names"), parts=(".tar",), read_part=read_member)


def expand_braces(spec: str) -> list[str]:
    """`a-{00..02}.tar` -> a-00.tar, a-01.tar, a-02.tar (zero padding kept); `{x,y}` -> x, y."""
    m = BRACE.search(spec)
    if m is None:
        return [spec]
    body, head, tail = m.group(1), spec[:m.start()], spec[m.end():]
    rng = re.fullmatch(r"(\d+)\.\.(\d+)", body)
    if rng:
        lo, hi = rng.group(1), rng.group(2)
        if int(lo) > int(hi):
            raise PoolError(f"shard pattern {spec}: the range {{{body}}} counts down")
        width = len(lo) if lo.startswith("0") else 0
        parts = [str(n).zfill(width) for n in range(int(lo), int(hi) + 1)]
    else:
        parts = body.split(",")
    return [name for part in parts for name in expand_braces(head + part + tail)]


class Member(NamedTuple):
    shard: int   # index into the pool's shard files
    offset: int  # where its data starts in the tar
    size: int


class Samples:
    """Every sample of the shards, in order: its key, shard, label, and its image and text
    members (offset of the data in the tar, -1 for none; size; extension as named)."""

    def __init__(self):
        self.keys: list[str] = []
        self.labels: list[int] = []
        self.shard = array("i")
        self.image, self.image_size, self.image_rank = array("q"), array("q"), array("b")
        self.text, self.text_size = array("q"), array("q")
        self.image_ext: list[str] = []
        self.text_ext: list[str] = []

    def start(self, key: str, shard: int) -> None:
        self.keys.append(key)
        self.labels.append(-1)
        for column, value in ((self.shard, shard), (self.image, -1), (self.image_size, 0),
                              (self.image_rank, len(IMAGE_KEYS)), (self.text, -1),
                              (self.text_size, 0)):
            column.append(value)
        self.image_ext.append("")
        self.text_ext.append("")

    def add(self, ext: str, info: tarfile.TarInfo) -> None:
        """The member `info` with extension `ext` (as named) into the last sample (an image: the
        first of IMAGE_KEYS it has)."""
        kind = ext.lower()
        if kind in IMAGE_KEYS and IMAGE_KEYS.index(kind) < self.image_rank[-1]:
            self.image[-1], self.image_size[-1] = info.offset_data, info.size
            self.image_rank[-1], self.image_ext[-1] = IMAGE_KEYS.index(kind), sys.intern(ext)
        elif kind == "txt":
            self.text[-1], self.text_size[-1], self.text_ext[-1] = info.offset_data, info.size, ext

    def ids(self, kind: str) -> list[str]:
        """Each sample's id: the name of its image or text member (its key where it has none)."""
        exts = self.image_ext if kind == "images" else self.text_ext
        return [f"{key}.{ext}" if ext else key for key, ext in zip(self.keys, exts)]

    def members(self, kind: str) -> tuple[array, array]:
        """(offsets, sizes) of the image or text members."""
        return (self.image, self.image_size) if kind == "images" else (self.text, self.text_size)


class ShardPool(Pool):
    def __init__(self, name: str, kind: str, shards: list, samples: Samples, opts: PoolOptions):
        self.name, self.kind, self.shards = name, kind, shards
        self.ids, self.labels, self.shard_of = samples.ids(kind), samples.labels, samples.shard
        self.offsets, self.sizes = samples.members(kind)
        self.has_labels = any(label >= 0 for label in self.labels)
        self._file: tuple[int, object, int] | None = None  # (shard, its open file, the process)
        set_decoding(self, kind, opts)

    def __getstate__(self):  # each worker opens the shards itself
        return {**self.__dict__, "_file": None}

    def __getitem__(self, i: int) -> Item:
        what = "image" if self.kind == "images" else "text"
        where = f"sample {self.ids[i]}"
        if self.offsets[i] < 0:
            return Item(self.ids[i], None, self.labels[i], f"{where} has no {what} member")
        member = Member(self.shard_of[i], self.offsets[i], self.sizes[i])
        where += f" of {self.shards[member.shard]}"
        if member.size > tables.MAX_CELL_BYTES:
            return Item(self.ids[i], None, self.labels[i], oversized(where, f"{what} member",
                                                                     member.size))
        try:
            data = self._read(member)
        except Exception as err:  # noqa: BLE001 - a file or store that fails: an error row
            return Item(self.ids[i], None, self.labels[i],
                        f"cannot read {where} ({first_line(err)})")
        if self.kind == "text":
            try:
                return Item(self.ids[i], Text(data.decode("utf-8"), self.tokenize), self.labels[i],
                            None)
            except UnicodeDecodeError as err:
                return Item(self.ids[i], None, self.labels[i],
                            f"the text of {where} is not UTF-8 ({first_line(err)})")
        return image_item(self.ids[i], self.labels[i], data, self.transform, self.decode, where,
                          f"{self.shards[member.shard]}#{self.ids[i]}")

    def _read(self, member: Member) -> bytes:
        if self._file is None or self._file[0] != member.shard or self._file[2] != os.getpid():
            if self._file is not None and self._file[2] == os.getpid():
                self._file[1].close()
            self._file = None  # a forked worker opens its own: an offset shared would race
            self._file = (member.shard, remote.open_binary(self.shards[member.shard],
                                                           remote.TAR_BLOCK), os.getpid())
        f = self._file[1]
        f.seek(member.offset)
        data = f.read(member.size)
        if len(data) != member.size:
            raise OSError(f"the member ends after {len(data)} of {member.size} bytes")
        return data


def _split_name(name: str) -> tuple[str, str]:
    """'dir/a.b.jpg' -> ('dir/a', 'b.jpg'): the key and the extension, as WebDataset splits them."""
    folder, _, base = name.rpartition("/")
    stem, dot, ext = base.partition(".")
    return (f"{folder}/{stem}" if folder else stem), ext if dot else ""


def _scan(shard, index: int, samples: Samples) -> None:
    """The members of the tar (a Path or remote.Remote) into `samples`, a new sample where the
    key changes; .cls contents read now."""
    try:
        size = remote.size(shard)
        with remote.open_binary(shard, remote.TAR_BLOCK) as f, \
                tarfile.open(fileobj=f, mode="r:") as tar:
            for info in tar:
                if not info.isfile():
                    continue
                if info.offset_data + info.size > size:
                    raise PoolError(f"shard {shard}: member {info.name} is truncated (it needs "
                                    f"{info.size} bytes, the file holds "
                                    f"{max(0, size - info.offset_data)})")
                key, ext = _split_name(info.name)
                if not samples.keys or samples.keys[-1] != key or samples.shard[-1] != index:
                    samples.start(key, index)
                if ext.lower() == "cls":
                    if info.size > MAX_LABEL_BYTES:
                        raise PoolError(f"sample {key} of {shard}: its .cls member is {info.size} "
                                        f"bytes, over alcli's limit of {MAX_LABEL_BYTES} for a "
                                        f"label")
                    text = tar.extractfile(info).read().decode("utf-8", "replace")
                    samples.labels[-1] = label_index(text.strip() or None, f"sample {key} of {shard}")
                else:
                    samples.add(ext, info)
            _check_end(shard, tar.fileobj, tar.offset, size)
    except PoolError:
        raise
    except tarfile.TarError as err:
        raise PoolError(f"shard {shard} cannot be read as a tar file ({first_line(err)})") from None
    except Exception as err:  # noqa: BLE001 - OSError, or the store's own
        remote.raise_store_error("shard", shard, err)
        raise PoolError(f"shard {shard} cannot be read ({first_line(err)})") from None


def _check_end(shard: Path, f, offset: int, size: int) -> None:
    """After the last member come zero blocks (at least two: the end of the archive); tarfile
    stops quietly at a header cut short, so a truncated shard is found here."""
    f.seek(offset)
    rest = f.read()
    if len(rest) < 1024 or rest.count(0) != len(rest):
        raise PoolError(f"shard {shard} is truncated or corrupt after byte {offset} (a tar ends "
                        f"with zero blocks; this one has {size - offset} other bytes there)")


def from_shards(specs: list[str], opts: PoolOptions) -> Pool:
    """Tar shards named one by one or by brace patterns, in the order named."""
    names = [name for spec in specs for name in expand_braces(spec)]
    shards = [remote.locate(n) if remote.is_url(n) else Path(n) for n in names]
    for shard in shards:
        with remote.reading("shard", shard):
            if remote.kind(shard) != "file":
                raise PoolError(f"shard {shard} is not a file")
    samples = Samples()
    for index, shard in enumerate(shards):
        _scan(shard, index, samples)
    name = remote.shown(specs[0]) if len(specs) == 1 else f"of {len(shards)} shards"
    if not samples.keys:
        raise PoolError(f"shard pool {name} holds no samples")
    has_images = max(samples.image) >= 0
    has_texts = max(samples.text) >= 0
    if not has_images and not has_texts:
        raise PoolError(f"shard pool {name} has no samples with an image "
                        f"(.{', .'.join(IMAGE_KEYS)}) or a text (.txt)")
    kind = "images" if has_images else "text"
    if kind == "text" and opts.tokenizer is None:
        raise PoolError(f"text pool {name} needs a tokenizer: pass --model a Hugging Face model "
                        f"directory that holds one")
    _check_unique(samples, shards)
    return ShardPool(name, kind, shards, samples, opts)


def _check_unique(samples: Samples, shards: list) -> None:
    """A key twice: in two shards, or apart in one (WebDataset keeps a sample's members
    together)."""
    if len(set(samples.keys)) == len(samples.keys):
        return
    seen: dict[str, int] = {}
    for i, key in enumerate(samples.keys):
        if key in seen:
            first, again = samples.shard[seen[key]], samples.shard[i]
            if first != again:
                raise PoolError(f"shard {shards[again]} has the sample {key}, which another "
                                f"shard has too")
            raise PoolError(f"shard {shards[again]} has the members of sample {key} apart; a "
                            f"sample's members follow one another in a shard")
        seen[key] = i
