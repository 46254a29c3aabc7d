"""Pools at object-store URLs (s3://, gs://, az://, http(s)://): tar shards, a Parquet file or
folder, or an image manifest, each opened by its own kind's module; files/remote.py is the layer
beneath (fsspec, the store's errors in one sentence)."""
from __future__ import annotations

from ..errors import ConfigError
from ..files.remote import is_url, kind, locate, reading, shown
from .common import Pool, PoolKind, PoolOptions, no_folders
from .manifest import from_manifest
from .tables import TABLE_EXTS, from_parquet
from .webdataset import from_shards, is_shard_spec


def _has_url(spec, opts: PoolOptions) -> bool:
    return any(is_url(s) for s in (spec if isinstance(spec, list) else [spec]))


def _remote(spec, opts: PoolOptions, stdin=None) -> Pool:
    """Tar shards or a Parquet file or folder at object-store URLs."""
    specs = spec if isinstance(spec, list) else [spec]
    if not all(is_url(s) for s in specs):
        raise ConfigError(f"pool {shown(specs[0])}: object-store URLs and local files cannot be "
                          f"mixed in one pool")
    if all(is_shard_spec(s) for s in specs):
        return no_folders(opts) or from_shards(specs, opts)
    if len(specs) > 1:
        raise ConfigError(f"pool {shown(specs[0])}: several URLs must all name .tar shards")
    with reading("pool", specs[0]):
        found = locate(specs[0])
        if kind(found) == "directory" or found.path.lower().endswith(TABLE_EXTS):
            return no_folders(opts) or from_parquet(found, opts)
        if found.path.lower().endswith((".csv", ".jsonl")):  # an image manifest, its images by URL
            return from_manifest(found, opts)
    raise ConfigError(f"pool {shown(specs[0])}: an object-store pool is a .parquet file, a folder "
                      f"of them, .tar shards, or a .csv/.jsonl manifest of images")


KIND = PoolKind("object store", _has_url, _remote)
