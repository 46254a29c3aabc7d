"""Moved to alcli/pools/ (issue 52). Kept for this round only, so branches written against the old
path merge: open_pool is the pools registry's entry."""
from ..pools import open_pool, open_source, source_exists, split_source  # noqa: F401
