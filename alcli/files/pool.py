"""Moved to alcli/pools/ (issue 52). Kept for this round only, so branches written against the old
path merge: open_pool is the pools registry's entry (alcli.pools.open_pool)."""
from ..pools import open_pool  # noqa: F401 - the pools registry's entry
from ..pools.common import (IMAGE_EXTS, MANIFEST_EXTS, TENSOR_EXTS, TEXT_EXTS, Batch,  # noqa: F401
                            ImagePool, Item, Pool, PoolOptions, Text, check_unique_ids, collate,
                            collate_sized, decoded, image_transform, names_source)
from ..pools.filelist import from_files, from_stdin  # noqa: F401
from ..pools.folder import from_directory  # noqa: F401
from ..pools.manifest import from_manifest  # noqa: F401
from ..pools.tensors import TensorPool, from_tensor_file, tensor_pool  # noqa: F401
from ..pools.text import TextPool, from_text_file  # noqa: F401
