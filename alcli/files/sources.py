"""Which source opens a pool: Parquet tables and Hugging Face datasets (tables.py), WebDataset tar
shards (webdataset.py), else the folders, manifests, texts and tensors of pool.py."""
from __future__ import annotations

from pathlib import Path

from ..errors import ConfigError
from .pool import Pool, PoolOptions
from .pool import open_pool as open_file_pool
from .tables import TABLE_EXTS, from_hf_dataset, from_parquet, is_hf_dataset, is_parquet_folder
from .webdataset import from_shards, is_shard_spec


def open_pool(spec: str | list[str], opts: PoolOptions, stdin=None) -> Pool:
    """Open the pool `spec` names (a path, '-' for stdin, a brace pattern of tar shards, or a
    list of image files or of tar shards)."""
    if isinstance(spec, list):
        if spec and all(is_shard_spec(s) for s in spec):
            return _no_folders(opts) or from_shards(spec, opts)
        return open_file_pool(spec, opts, stdin)
    if spec == "-":
        return open_file_pool(spec, opts, stdin)
    path = Path(spec)
    if is_shard_spec(spec):
        return _no_folders(opts) or from_shards([spec], opts)
    if is_hf_dataset(path):
        return _no_folders(opts) or from_hf_dataset(spec, opts)
    if (path.is_dir() and is_parquet_folder(path)) or (path.suffix.lower() in TABLE_EXTS
                                                       and path.is_file()):
        return _no_folders(opts) or from_parquet(spec, opts)
    return open_file_pool(spec, opts, stdin)


def _no_folders(opts: PoolOptions) -> None:
    if opts.labels_from_folders:
        raise ConfigError("--labels-from-folders needs a directory pool with class subfolders; "
                          "a table or shard pool takes its labels from --label-column or .cls")
