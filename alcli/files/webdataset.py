"""WebDataset shards: tar files whose members are grouped into samples by key (`dir/name` up to the
first dot of the file name; the rest is the member's extension): `.jpg`/`.png`/... an image,
`.txt` a text, `.cls` an integer label; `.json` and other members are ignored. A sample's key is
its id. Opening reads the tar headers (and the small `.cls` members) of every shard; an item is
read by seeking to its member, so shards spread over DataLoader workers and --shard without
reading one another. Shards are named one by one, or by a brace pattern: `pool-{000..009}.tar`,
as paths or object-store URLs (remote.py; a remote shard is read ahead in blocks of 8 MiB).
"""
from __future__ import annotations

import os
import re
import tarfile
from pathlib import Path
from typing import NamedTuple

from ..errors import PoolError, first_line
from . import remote
from .pool import Item, Pool, PoolOptions, Text, _label, check_unique_ids
from .tables import image_item, set_decoding

IMAGE_KEYS = ("jpg", "jpeg", "png", "webp", "bmp", "tif", "tiff")
BRACE = re.compile(r"\{([^{}]*)\}")


def is_shard_spec(spec: str) -> bool:
    return spec.lower().endswith(".tar")


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


class ShardPool(Pool):
    def __init__(self, name: str, kind: str, shards: list, ids: list[str],
                 members: list[Member | None], labels: list[int], opts: PoolOptions):
        self.name, self.kind, self.shards = name, kind, shards
        self.ids, self.members, self.labels = ids, members, labels
        self.has_labels = any(label >= 0 for label in labels)
        self._file: tuple[int, object, int] | None = None  # (shard, its open file, the process)
        set_decoding(self, kind, opts)

    def __getstate__(self):  # each worker opens the shards itself
        return {**self.__dict__, "_file": None}

    def __getitem__(self, i: int) -> Item:
        member = self.members[i]
        what = "image" if self.kind == "images" else "text"
        where = f"sample {self.ids[i]}"
        if member is None:
            return Item(self.ids[i], None, self.labels[i], f"{where} has no {what} member")
        where += f" of {self.shards[member.shard]}"
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
        return image_item(self.ids[i], self.labels[i], data, self.transform, self.decode, where)

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
    return (f"{folder}/{stem}" if folder else stem), ext.lower() if dot else ""


def _scan(shard, index: int, samples: dict, order: list[str]) -> None:
    """Each member of the tar (a Path or remote.Remote) -> samples[key][ext] = Member; .cls
    contents read now."""
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
                if key not in samples:
                    samples[key] = {}
                    order.append(key)
                elif "#shard" in samples[key] and samples[key]["#shard"] != index:
                    raise PoolError(f"shard {shard} has the sample {key}, which another shard "
                                    f"has too")
                samples[key]["#shard"] = index
                if ext == "cls":
                    samples[key][ext] = tar.extractfile(info).read().decode("utf-8", "replace")
                else:
                    samples[key][ext] = Member(index, info.offset_data, info.size)
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
    samples: dict[str, dict] = {}
    order: list[str] = []
    for index, shard in enumerate(shards):
        _scan(shard, index, samples, order)
    name = remote.shown(specs[0]) if len(specs) == 1 else f"of {len(shards)} shards"
    if not order:
        raise PoolError(f"shard pool {name} holds no samples")
    has_images = any(ext in s for s in samples.values() for ext in IMAGE_KEYS)
    has_texts = any("txt" in s for s in samples.values())
    if not has_images and not has_texts:
        raise PoolError(f"shard pool {name} has no samples with an image "
                        f"(.{', .'.join(IMAGE_KEYS)}) or a text (.txt)")
    kind = "images" if has_images else "text"
    if kind == "text" and opts.tokenizer is None:
        raise PoolError(f"text pool {name} needs a tokenizer: pass --model a Hugging Face model "
                        f"directory that holds one")
    check_unique_ids(name, order)
    wanted = IMAGE_KEYS if kind == "images" else ("txt",)
    members = [next((samples[k][e] for e in wanted if e in samples[k]), None) for k in order]
    labels = [_label(samples[k].get("cls", "").strip() or None,
                     f"sample {k} of {shards[samples[k]['#shard']]}") for k in order]
    return ShardPool(name, kind, shards, order, members, labels, opts)
