"""Moved to alcli/pools/ (issue 52). Kept for this round only, so branches written against the old
path merge: open_pool is the pools registry's entry (alcli.pools.open_pool)."""
from ..pools import open_pool  # noqa: F401 - the pools registry's entry
from ..pools.common import (IMAGE_EXTS, Batch, Item, Pool, PoolOptions, Text,  # noqa: F401
                            check_unique_ids, collate, collate_sized, decoded, image_transform,
                            names_source)
from ..pools.tensors import tensor_pool  # noqa: F401
