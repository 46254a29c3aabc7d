"""Shards: a deterministic 1/N of a pool, chosen by a stable hash of each example's id.

An id's shard is blake2b(id) mod N, so it depends on the id alone: not on listing order, on the
machine, or on Python's per-process string hashing. The pool fingerprint (count and the sum of the
ids' hashes) is order-independent too, so `alcli merge` can check that every part scored the same
pool even when each node listed it differently.
"""
from __future__ import annotations

import hashlib

from ..errors import ConfigError
from ..pools.common import Pool


def id_hash(id_: str) -> int:
    """A 64-bit hash of the id's UTF-8 bytes, the same everywhere."""
    return int.from_bytes(hashlib.blake2b(id_.encode("utf-8", "surrogatepass"), digest_size=8).digest(),
                          "big")


def parse_shard(spec: str | None) -> tuple[int, int] | None:
    """'K/N' -> (K, N) with 0 <= K < N (the config has already checked the form)."""
    if spec is None:
        return None
    k, n = (int(part) for part in spec.split("/"))
    if not 0 <= k < n:
        raise ConfigError(f"--shard {spec}: K must be between 0 and {n - 1}")
    return k, n


def fingerprint(ids: list[str]) -> str:
    """'COUNT:HEX' identifying a set of ids regardless of order."""
    total = 0
    for id_ in ids:
        total = (total + id_hash(id_)) % (1 << 64)
    return f"{len(ids)}:{total:016x}"


def shard_indices(ids: list[str], k: int, n: int) -> list[int]:
    """Positions of the ids that fall in shard k of n, in pool order."""
    return [i for i, id_ in enumerate(ids) if id_hash(id_) % n == k]


class SubPool(Pool):
    """The examples of `pool` at `indices`, in that order; otherwise the same pool."""

    def __init__(self, pool: Pool, indices: list[int]):
        self.base, self.indices = pool, indices
        self.name, self.kind = pool.name, pool.kind
        self.has_labels, self.classes = pool.has_labels, pool.classes
        self.to_float, self.decode_jpegs = pool.to_float, pool.decode_jpegs
        self.keeps_sizes = pool.keeps_sizes
        self.ids = [pool.ids[i] for i in indices]
        if hasattr(pool, "paths"):  # image pools: the files, for exports that need them
            self.paths = [pool.paths[i] for i in indices]

    def __getitem__(self, i: int):
        return self.base[self.indices[i]]
