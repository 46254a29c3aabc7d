"""The embeddings file `TABLE.emb.npz`: each scored example's BADGE factors (see
alcli.selection.diverse), written by `alcli score --embeddings`, read by `alcli select --diverse`.
It records the run id of the table it was written with (TABLE.meta.json has the same), so that
`select` can tell a table's own embeddings from another run's."""
from __future__ import annotations

import zipfile
from typing import Sequence

import numpy as np
import torch

from ..errors import ConfigError, TableError
from .atomic import atomic_open, writes_stream
from .config import Settings

EMBEDDINGS_SUFFIX = ".emb.npz"
_FORMAT = "alcli-badge-embeddings-v1"


class EmbeddingsError(TableError, ValueError):
    """An embeddings file is unreadable or does not match its table; the message names the file."""


def embeddings_path(table_path: str) -> str:
    """Where the embeddings of a ranked table live: beside it, `TABLE.emb.npz`."""
    if table_path in ("", "-"):
        raise ValueError("embeddings need a table written to a file, not stdout")
    return table_path + EMBEDDINGS_SUFFIX


def destination(settings: Settings, table_dest: str | None, one_process: bool = True) -> str | None:
    """Where `score` writes embeddings: None (not wanted), the configured file, or beside the
    table. By default (`embeddings` None) they are written when the table goes to a file and the
    whole pool is scored in `one_process` (no --resume, --shard or torchrun)."""
    if settings.embeddings is False:
        return None
    if settings.embeddings is None and (writes_stream(table_dest) or not one_process):
        return None
    if settings.embeddings_file:
        return settings.embeddings_file
    if writes_stream(table_dest):
        raise ConfigError(f"{settings.where('embeddings')} writes the embeddings beside the table, "
                          f"so the table must go to a file: pass -o/--output FILE")
    return embeddings_path(str(table_dest))


def save_embeddings(path: str, ids: Sequence[str], a, b, run_id: str | None = None) -> None:
    """Write ids [N], a [N, C] and b [N, D] (and the table's `run_id`) to an uncompressed .npz,
    atomically; a file that cannot be written is a TableError."""
    ids = [str(i) for i in ids]
    a = torch.as_tensor(a).detach().cpu().numpy()
    b = torch.as_tensor(b).detach().cpu().numpy()
    _check_factors(path, ids, a, b)
    try:
        with atomic_open(path, "wb") as fh:  # a file object, so numpy does not append ".npz"
            np.savez(fh, format=np.array(_FORMAT), ids=np.array(ids, dtype=np.str_), a=a, b=b,
                     **({"run_id": np.array(run_id)} if run_id else {}))
    except OSError as err:
        raise TableError(f"cannot write embeddings file {path} ({err.strerror or err})") from None


def load_embeddings(path: str, ids: Sequence[str] | None = None
                    ) -> tuple[list[str], torch.Tensor, torch.Tensor]:
    """Read (ids, a [N, C], b [N, D]) from `save_embeddings`' file.

    With `ids`, the rows come back in that order (a subset is fine, e.g. after exclusions); an id
    without an embedding is an error naming the id and the file.
    """
    try:
        with np.load(path, allow_pickle=False) as z:
            missing = [k for k in ("format", "ids", "a", "b") if k not in z.files]
            if missing:
                raise EmbeddingsError(f"embeddings file {path} is not an alcli embeddings file "
                                      f"(missing {', '.join(missing)}).")
            fmt, file_ids, a, b = str(z["format"]), z["ids"], z["a"], z["b"]
    except EmbeddingsError:
        raise
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as err:
        raise EmbeddingsError(f"cannot read embeddings file {path}: {err}.") from err
    if fmt != _FORMAT:
        raise EmbeddingsError(f"embeddings file {path} has format '{fmt}', expected '{_FORMAT}'.")
    file_ids = [str(i) for i in file_ids.tolist()] if file_ids.ndim == 1 else None
    if file_ids is None:
        raise EmbeddingsError(f"embeddings file {path} has ids that are not a 1-D list.")
    _check_factors(path, file_ids, a, b)
    a, b = torch.from_numpy(a), torch.from_numpy(b)
    if ids is None:
        return file_ids, a, b
    index = {i: n for n, i in enumerate(file_ids)}
    rows = []
    for i in ids:
        i = str(i)
        if i not in index:
            raise EmbeddingsError(f"embeddings file {path} has no embedding for id '{i}'; "
                                  f"was it written by the same `score` run as the table?")
        rows.append(index[i])
    take = torch.tensor(rows, dtype=torch.long)
    return [str(i) for i in ids], a[take], b[take]


def embeddings_run_id(path: str) -> str | None:
    """The run id the embeddings file records (None: written without a table, or by an older
    alcli)."""
    try:
        with np.load(path, allow_pickle=False) as z:
            return str(z["run_id"]) if "run_id" in z.files else None
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as err:
        raise EmbeddingsError(f"cannot read embeddings file {path}: {err}.") from err


def _check_factors(path: str, ids: list[str], a: np.ndarray, b: np.ndarray) -> None:
    if a.ndim != 2 or b.ndim != 2:
        raise EmbeddingsError(f"embeddings for {path} need a [N, C] and b [N, D]; "
                              f"got shapes {a.shape} and {b.shape}.")
    if not (len(ids) == a.shape[0] == b.shape[0]):
        raise EmbeddingsError(f"embeddings for {path} disagree on the number of examples: "
                              f"{len(ids)} ids, {a.shape[0]} rows of a, {b.shape[0]} rows of b.")
    if len(set(ids)) != len(ids):
        dup = next(i for n, i in enumerate(ids) if i in ids[:n])
        raise EmbeddingsError(f"embeddings for {path} list id '{dup}' more than once.")
