"""Which source opens a pool: Parquet tables and Hugging Face datasets (tables.py), WebDataset tar
shards (webdataset.py), else the folders, manifests, texts and tensors of pool.py. Tables, shards
and image manifests may also be object-store URLs (remote.py)."""
from __future__ import annotations

from pathlib import Path

from ..errors import ConfigError
from .pool import Pool, PoolOptions, from_manifest
from .pool import open_pool as open_file_pool
from .remote import is_url, kind, locate, reading, shown
from .tables import TABLE_EXTS, from_hf_dataset, from_parquet, is_hf_dataset, is_parquet_folder
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
