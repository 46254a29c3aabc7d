"""Hugging Face dataset pools: a folder written by `save_to_disk` (a Dataset, or a DatasetDict of
which --split picks one); read chunk by chunk by tables.py, a row's image cell read back from its
Arrow file as FILE#COLUMN[ROW]."""
from __future__ import annotations

from pathlib import Path

from .common import PoolKind, PoolOptions, no_folders
from .tables import from_hf_dataset, is_hf_dataset, read_cell


def _is_dataset(spec, opts: PoolOptions) -> bool:
    return isinstance(spec, str) and is_hf_dataset(Path(spec))


KIND = PoolKind("Hugging Face dataset", _is_dataset,
                lambda spec, opts, stdin: no_folders(opts) or from_hf_dataset(spec, opts),
                options=("split", "image_column", "id_column", "label_column", "text_column",
                         "tokenizer", "class_names"),
                parts=(".arrow",), read_part=read_cell)
