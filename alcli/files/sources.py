"""Which source opens a pool: Parquet tables and Hugging Face datasets (tables.py), WebDataset tar
shards (webdataset.py), else the folders, manifests, texts and tensors of pool.py. Tables, shards
and image manifests may also be object-store URLs (remote.py). And the image a row's `path` names,
read back (the contact sheet): a file, a shard's member, a table's cell."""
from __future__ import annotations

import io
import os
import re
import tarfile
from pathlib import Path

from ..errors import ConfigError
from .pool import Pool, PoolOptions, from_manifest
from .prompts import from_prompt_file
from .pool import open_pool as open_file_pool
from .regular import check_regular
from .remote import is_url, kind, locate, reading, shown
from .tables import (MAX_CELL_BYTES, TABLE_EXTS, _arrow_batches, _image_cell, from_hf_dataset,
                     from_parquet, is_hf_dataset, is_parquet_folder)
from .webdataset import from_shards, is_shard_spec


def open_pool(spec: str | list[str], opts: PoolOptions, stdin=None) -> Pool:
    """Open the pool `spec` names (a path, '-' for stdin, a brace pattern of tar shards, or a
    list of image files or of tar shards)."""
    if isinstance(spec, list):
        if any(is_url(s) for s in spec):
            return _remote(spec, opts)
        if spec and all(is_shard_spec(s) for s in spec):
            return _no_folders(opts) or from_shards(spec, opts)
        return open_file_pool(spec, opts, stdin)
    if spec == "-":
        return open_file_pool(spec, opts, stdin)
    if opts.prompts and not is_url(spec):
        return from_prompt_file(spec, opts)
    if is_url(spec):
        return _remote([spec], opts)
    path = Path(spec)
    if is_shard_spec(spec):
        return _no_folders(opts) or from_shards([spec], opts)
    if is_hf_dataset(path):
        return _no_folders(opts) or from_hf_dataset(spec, opts)
    if (path.is_dir() and is_parquet_folder(path)) or (path.suffix.lower() in TABLE_EXTS
                                                       and path.is_file()):
        return _no_folders(opts) or from_parquet(spec, opts)
    return open_file_pool(spec, opts, stdin)


def _remote(specs: list[str], opts: PoolOptions) -> Pool:
    """Tar shards or a Parquet file or folder at object-store URLs."""
    if not all(is_url(s) for s in specs):
        raise ConfigError(f"pool {shown(specs[0])}: object-store URLs and local files cannot be "
                          f"mixed in one pool")
    if all(is_shard_spec(s) for s in specs):
        return _no_folders(opts) or from_shards(specs, opts)
    if len(specs) > 1:
        raise ConfigError(f"pool {shown(specs[0])}: several URLs must all name .tar shards")
    with reading("pool", specs[0]):
        found = locate(specs[0])
        if kind(found) == "directory" or found.path.lower().endswith(TABLE_EXTS):
            return _no_folders(opts) or from_parquet(found, opts)
        if found.path.lower().endswith((".csv", ".jsonl")):  # an image manifest, its images by URL
            return from_manifest(found, opts)
    raise ConfigError(f"pool {shown(specs[0])}: an object-store pool is a .parquet file, a folder "
                      f"of them, .tar shards, or a .csv/.jsonl manifest of images")


def _no_folders(opts: PoolOptions) -> None:
    if opts.labels_from_folders:
        raise ConfigError("--labels-from-folders needs a directory pool with class subfolders; "
                          "a table or shard pool takes its labels from --label-column or .cls")


# --- a row's source, read back -----------------------------------------------------------------

CELL = re.compile(r"(.+)\[(\d+)\]")  # COLUMN[ROW]
CONTAINERS = (".tar", ".parquet", ".arrow")  # files whose parts a row's path may name after '#'


def split_source(path: str) -> tuple[str, str | None]:
    """A row's `path` -> (the file, None), or (a shard or table file, what in it: MEMBER or
    COLUMN[ROW]) for SHARD#MEMBER and FILE#COLUMN[ROW] where no file has the whole name."""
    if "#" not in path or os.path.lexists(path):
        return path, None
    for at in (i for i, c in enumerate(path) if c == "#"):
        base = path[:at]
        if base.lower().endswith(CONTAINERS) and os.path.isfile(base):
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
        return io.BytesIO(Path(base).read_bytes())
    if base.lower().endswith(".tar"):
        data = _member(base, part)
    else:
        m = CELL.fullmatch(part)
        if m is None:
            raise ValueError(f"{path}: after '#' a table's cell is COLUMN[ROW]")
        cell = _cell(base, m.group(1), int(m.group(2)))
        data, file = _image_cell(cell, Path(base).parent)
        if data is None:
            check_regular(file)
            data = Path(file).read_bytes()
    return io.BytesIO(data)


def _member(shard: str, name: str) -> bytes:
    try:
        with tarfile.open(shard, "r:") as tar:
            info = tar.getmember(name)  # reads the headers up to it
            if info.size > MAX_CELL_BYTES:
                raise ValueError(f"member {name} of {shard} is {info.size} bytes")
            return tar.extractfile(info).read()
    except KeyError:
        raise ValueError(f"shard {shard} has no member {name}") from None
    except tarfile.TarError as err:
        raise ValueError(f"shard {shard} cannot be read ({err})") from None


def _cell(file: str, column: str, row: int):
    """Row `row` of `column` of a Parquet file or a dataset's Arrow stream file, as Python."""
    if file.lower().endswith(".parquet"):
        import pyarrow.parquet as pq
        meta = pq.ParquetFile(file)
        batches = (meta.read_row_group(g, columns=[column]) for g in range(meta.num_row_groups))
    else:
        batches = _arrow_batches(Path(file), [column])
    start = 0
    for batch in batches:
        if row < start + batch.num_rows:
            return batch.column(0)[row - start].as_py()
        start += batch.num_rows
    raise ValueError(f"{file} has no row {row}")
