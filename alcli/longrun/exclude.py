"""`score --exclude`: the pool without the examples the exclusion files name, before any scoring.

Entries match examples as `select --exclude` matches rows (selection/exclusions.py): by id, or
by the example's file. The pool is narrowed before the pre-flight checks read a first example,
so an excluded example is never opened. What was left out goes into the run's key (a resumed run
or a shard to merge must exclude the same) and into OUTPUT.meta.json, where `select TABLE
--exclude` with the same files finds the examples that have no row.
"""
from __future__ import annotations

import os

from ..errors import ConfigError
from ..files.config import Settings
from ..pools.common import Pool, check_unique_ids
from ..selection.exclusions import ExclusionsError, excluded_ids, read_exclusion_files
from .shard import SubPool, fingerprint


class Exclusion:
    """Reads the exclusion files when made (a bad file fails before the model loads); called with
    the opened pool, returns the pool without the examples they name."""

    def __init__(self, settings: Settings):
        self.where = settings.where("exclude")
        self.image_root = settings.image_root
        try:
            self.sources = read_exclusion_files(settings.exclude)
        except ExclusionsError as err:
            raise ConfigError(f"{self.where}: {str(err).rstrip('.')}") from None
        self.left_out: list[dict] = []  # {"id", "path"} of each excluded example, in pool order
        self.notes: list[str] = []      # warnings: entries that name no example

    def __call__(self, pool: Pool) -> Pool:
        if len(pool) == 0:
            return pool  # the pre-flight check says the pool is empty
        check_unique_ids(pool.name, pool.ids)
        paths = getattr(pool, "paths", None)
        rows = [{"id": id_, "path": str(paths[n]) if paths is not None else None}
                for n, id_ in enumerate(pool.ids)]
        try:
            excluded, self.notes = excluded_ids(self.sources, rows, self.image_root,
                                                what="pool example")
        except ExclusionsError as err:
            raise ConfigError(f"{self.where}: {str(err).rstrip('.')}") from None
        keep = [n for n, id_ in enumerate(pool.ids) if id_ not in excluded]
        if not keep:
            raise ConfigError(f"{self.where} excludes every one of the {len(pool)} examples of "
                              f"pool {pool.name}; nothing is left to score")
        self.left_out = [{"id": row["id"], "path": row["path"] and os.path.abspath(row["path"])}
                         for row in rows if row["id"] in excluded]
        return SubPool(pool, keep) if self.left_out else pool

    def key(self) -> dict:
        """The run key's part: which examples were left out (none: no key, as without --exclude)."""
        return {"excluded": fingerprint([e["id"] for e in self.left_out])} if self.left_out else {}
