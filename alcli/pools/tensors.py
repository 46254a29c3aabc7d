"""Tensor pools: a .pt/.pth (a tensor, or a dict with x and optional y, ids), .npy (x) or .npz
file; and in-memory data (the Python API: tensor_pool)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from ..errors import PoolError, first_line
from .common import TENSOR_EXTS, Item, Pool, PoolKind, PoolOptions, check_unique_ids


def _is_tensor_file(spec, opts: PoolOptions) -> bool:
    return isinstance(spec, str) and Path(spec).suffix.lower() in TENSOR_EXTS


KIND = PoolKind("tensor file", _is_tensor_file,
                lambda spec, opts, stdin: from_tensor_file(spec, opts))


class TensorPool(Pool):
    kind = "tensors"

    def __init__(self, name: str, x: torch.Tensor, y: torch.Tensor | None, ids: list[str] | None):
        n = x.shape[0]
        for what, other in (("y", y), ("ids", ids)):
            if other is not None and len(other) != n:
                raise PoolError(f"tensor pool {name}: '{what}' has {len(other)} entries but 'x' has {n}")
        self.name, self.x = name, x
        self.y = y.long() if y is not None else torch.full((n,), -1, dtype=torch.long)
        self.ids = [str(i) for i in ids] if ids is not None else [str(i) for i in range(n)]
        self.has_labels = bool((self.y >= 0).any())

    def __getitem__(self, i: int) -> Item:
        return Item(self.ids[i], self.x[i], int(self.y[i]), None)

def from_tensor_file(spec: str, opts: PoolOptions) -> Pool:
    """.pt (a tensor, or a dict with x and optional y, ids), .npy (x), .npz (x, optional y, ids)."""
    path = Path(spec)
    suffix = path.suffix.lower()
    try:
        if suffix in (".pt", ".pth"):
            data = torch.load(path, map_location="cpu", weights_only=True)
        elif suffix == ".npy":
            data = np.load(path, allow_pickle=False)
        else:
            with np.load(path, allow_pickle=False) as npz:
                data = {k: npz[k] for k in npz.files}
                if "x" not in data and len(data) == 1:
                    data = {"x": next(iter(data.values()))}
    except Exception as err:  # noqa: BLE001
        raise PoolError(f"tensor pool {path} cannot be read ({first_line(err)})") from None
    if not isinstance(data, dict):
        data = {"x": data}
    if "x" not in data:
        raise PoolError(f"tensor pool {path} must hold a tensor or a dict with 'x' "
                        f"(found keys: {', '.join(map(str, data))})")
    x, y, ids = (_as_tensor(data.get(k), path, k) for k in ("x", "y", "ids"))
    if x is None or x.dim() == 0 or x.shape[0] == 0:
        raise PoolError(f"tensor pool {path} holds no examples")
    if ids is not None:
        ids = [str(i.item()) if isinstance(i, torch.Tensor) else str(i) for i in ids]
        check_unique_ids(str(path), ids)
    if y is not None and y.is_floating_point():
        raise PoolError(f"tensor pool {path}: 'y' must hold integer class indices")
    return TensorPool(str(path), x, y, ids)


def _as_tensor(value, path: Path, key: str):
    if value is None or isinstance(value, torch.Tensor):
        return value
    if isinstance(value, np.ndarray):
        if value.dtype.kind in "US" and key == "ids":
            return [str(v) for v in value.tolist()]
        if value.dtype.kind not in "biuf":
            raise PoolError(f"tensor pool {path}: '{key}' has unsupported dtype {value.dtype}")
        return torch.from_numpy(np.ascontiguousarray(value))
    if key == "ids" and isinstance(value, (list, tuple)):
        return list(value)
    raise PoolError(f"tensor pool {path}: '{key}' must be a tensor or array, not {type(value).__name__}")

def tensor_pool(x, y=None, ids=None, name: str = "tensor pool") -> TensorPool:
    """A pool from in-memory data (the Python API): x [N, ...], optional labels y [N] and ids of
    any type (default: the positions 0..N-1). Rows scored in memory carry the ids as given; tables
    and ranking ties use their text."""
    try:
        x = torch.as_tensor(x)
        y = None if y is None else torch.as_tensor(y)
    except (TypeError, ValueError, RuntimeError) as err:
        kinds = " and ".join(type(p).__name__ for p in (x, y) if p is not None)
        raise PoolError(f"pool must be x, (x,), (x, y) or (x, y, ids) with x a tensor or array of "
                        f"inputs; a {kinds} cannot be made a tensor ({first_line(err)})") from None
    if x.dim() == 0:
        raise PoolError(f"{name}: the examples must be a tensor or array [N, ...], not a scalar")
    if y is not None and (y.shape != (x.shape[0],) or y.is_floating_point() or y.is_complex()):
        raise PoolError(f"{name}: labels y must be {x.shape[0]} integer class indices (-1 = "
                        f"unknown), one per example; got a {y.dtype} tensor of shape {list(y.shape)}")
    if isinstance(ids, (str, bytes)):
        raise PoolError(f"{name}: ids must be a list of {x.shape[0]} ids, one per example, not a "
                        f"{type(ids).__name__} (whose characters would become the ids)")
    given = list(range(x.shape[0])) if ids is None else list(ids)
    texts = [str(i) for i in given]
    check_unique_ids(name, texts)
    pool = TensorPool(name, x, y, texts)
    pool.given_ids = given
    return pool
