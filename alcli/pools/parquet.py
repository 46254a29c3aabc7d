"""Parquet pools: a .parquet file or a folder of them, local or in an object store (stores.py);
read chunk by chunk by tables.py, a row's image cell read back as FILE#COLUMN[ROW]."""
from __future__ import annotations

from pathlib import Path

from .common import PoolKind, PoolOptions, no_folders
from .tables import TABLE_EXTS, from_parquet, is_parquet_folder, read_cell


def _is_parquet(spec, opts: PoolOptions) -> bool:
    if not isinstance(spec, str):
        return False
    path = Path(spec)
    return (path.is_dir() and is_parquet_folder(path)) or (path.suffix.lower() in TABLE_EXTS
                                                           and path.is_file())


KIND = PoolKind("Parquet table", _is_parquet,
                lambda spec, opts, stdin: no_folders(opts) or from_parquet(spec, opts),
                options=("image_column", "id_column", "label_column", "text_column", "tokenizer",
                         "class_names"),
                parts=(".parquet",), read_part=read_cell)
