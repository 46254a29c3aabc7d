"""The embeddings file `TABLE.emb.npz`: each scored example's BADGE factors (see
alcli.selection.diverse), written by `alcli score --embeddings`, read by `alcli select --diverse`.
It records the run id of the table it was written with (TABLE.meta.json has the same), so that
`select` can tell a table's own embeddings from another run's."""
from __future__ import annotations

import base64
import math
import zipfile
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from ..errors import TableError
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


def destination(settings: Settings, table_dest: str | None) -> str | None:
    """Where `score` writes embeddings: None (not wanted; or a table on stdout, whose embeddings
    the job keeps under ./.alcli/), the configured file, or beside the table. By default
    (`embeddings` None) they are written wherever the model has a head to take them from."""
    if settings.embeddings is False:
        return None
    if settings.embeddings_file:
        return settings.embeddings_file
    if writes_stream(table_dest):
        return None
    return embeddings_path(str(table_dest))


def save_embeddings(path: str, ids: Sequence[str], a, b, run_id: str | None = None,
                    scores: Sequence[float] | None = None) -> None:
    """Write ids [N], a [N, C] and b [N, D] (and the table's `run_id`, and the rows' `scores`,
    by which `find_for_rows` knows a table read from a pipe) to an uncompressed .npz,
    atomically; a file that cannot be written is a TableError."""
    ids = [str(i) for i in ids]
    a = torch.as_tensor(a).detach().cpu().numpy()
    b = torch.as_tensor(b).detach().cpu().numpy()
    _check_factors(path, ids, a, b)
    extra = {"run_id": np.array(run_id)} if run_id else {}
    if scores is not None:
        extra["scores"] = np.asarray(scores, dtype=np.float64)
    try:
        with atomic_open(path, "wb") as fh:  # a file object, so numpy does not append ".npz"
            np.savez(fh, format=np.array(_FORMAT), ids=np.array(ids, dtype=np.str_), a=a, b=b,
                     **extra)
    except OSError as err:
        raise TableError(f"cannot write embeddings file {path} ({err.strerror or err})") from None


def load_embeddings(path: str, ids: Sequence[str] | None = None
                    ) -> tuple[list[str], torch.Tensor, torch.Tensor]:
    """Read (ids, a [N, C], b [N, D]) from `save_embeddings`' file.

    With `ids`, the rows come back in that order (a subset is fine, e.g. after exclusions); an id
    without an embedding is an error naming the id and the file.
    """
    _check_members(path)
    try:
        with np.load(path, allow_pickle=False) as z:
            missing = [k for k in ("format", "ids", "a", "b") if k not in z.files]
            if missing:
                raise EmbeddingsError(f"embeddings file {path} is not an alcli embeddings file "
                                      f"(missing {', '.join(missing)}).")
            fmt, file_ids = str(z["format"]), z["ids"]
            # memory maps where the members are stored plainly: only the rows asked for are read
            # into memory (a whole copy of a million rows' features is gigabytes)
            a, b = (_member_map(path, name) for name in ("a", "b"))
            a = z["a"] if a is None else a
            b = z["b"] if b is None else b
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
    _check_values(path, "a", a)
    _check_values(path, "b", b)
    if ids is None:
        return file_ids, torch.from_numpy(np.array(a)), torch.from_numpy(np.array(b))
    index = {i: n for n, i in enumerate(file_ids)}
    rows = []
    for i in ids:
        i = str(i)
        if i not in index:
            raise EmbeddingsError(f"embeddings file {path} has no embedding for id '{i}'; "
                                  f"was it written by the same `score` run as the table?")
        rows.append(index[i])
    take = np.asarray(rows, dtype=np.int64)
    return [str(i) for i in ids], torch.from_numpy(np.array(a[take])), torch.from_numpy(np.array(b[take]))


def embeddings_run_id(path: str) -> str | None:
    """The run id the embeddings file records (None: written without a table, or by an older
    alcli)."""
    _check_members(path)
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
        seen: set[str] = set()
        dup = next(i for i in ids if i in seen or seen.add(i))  # the first id met twice
        raise EmbeddingsError(f"embeddings for {path} list id '{dup}' more than once.")


MAX_INFLATION = 64  # a compressed member may hold this many times its stored bytes at most
FINITE_BLOCK = 65536  # rows checked for NaN and infinity at a time (b may be a memory map)


def _check_members(path: str) -> None:
    """Each .npy member's header against the member's size in the zip, before numpy allocates
    the shape a header claims (a 1 KB file can claim [10^7, 10^7]); a compressed member may not
    inflate more than MAX_INFLATION times (float features barely compress; zeros do, 1000:1)."""
    try:
        with zipfile.ZipFile(path) as zf:
            for info in zf.infolist():
                if not info.filename.endswith(".npy"):
                    continue
                if (info.compress_type != zipfile.ZIP_STORED
                        and info.file_size > MAX_INFLATION * max(info.compress_size, 1024)):
                    raise EmbeddingsError(
                        f"embeddings file {path}: member {info.filename} inflates from "
                        f"{info.compress_size} to {info.file_size} bytes, more than "
                        f"{MAX_INFLATION} times; write it with np.savez, uncompressed.")
                with zf.open(info) as fh:
                    version = np.lib.format.read_magic(fh)
                    read_header = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                                   else np.lib.format.read_array_header_2_0)
                    shape, _, dtype = read_header(fh)
                    header = fh.tell()
                if dtype.hasobject:
                    continue  # np.load refuses it (allow_pickle=False), in one sentence
                claimed = header + math.prod(shape) * dtype.itemsize
                if claimed != info.file_size:
                    raise EmbeddingsError(
                        f"embeddings file {path}: member {info.filename} claims shape "
                        f"{tuple(shape)} of {dtype} ({claimed} bytes) but holds "
                        f"{info.file_size} bytes.")
    except EmbeddingsError:
        raise
    except (OSError, ValueError, zipfile.BadZipFile, EOFError, KeyError) as err:
        raise EmbeddingsError(f"cannot read embeddings file {path}: {err}.") from err


def _check_values(path: str, name: str, x: np.ndarray) -> None:
    """Features are floats, every one finite (a NaN row is no direction: diverse selection and
    near-duplicate search would go on without a word); checked a block of rows at a time."""
    if x.dtype.kind != "f":
        raise EmbeddingsError(f"embeddings file {path}: {name} holds {x.dtype}, not floats.")
    for s in range(0, len(x), FINITE_BLOCK):
        bad = ~np.isfinite(np.asarray(x[s:s + FINITE_BLOCK])).all(axis=1)
        if bad.any():
            raise EmbeddingsError(f"embeddings file {path}: {name} row {s + int(bad.argmax())} "
                                  f"holds NaN or infinity; score the pool again.")


# --- one example's factors in a row of OUTPUT.partial -------------------------------------------

def encode_factors(a, b) -> list[str]:
    """One example's a [C] and b [D] as [dtype, base64 of a, base64 of b] (exact, little-endian):
    how they travel with the row through OUTPUT.partial, shards, resume and torchrun."""
    a, b = np.ascontiguousarray(a), np.ascontiguousarray(b)
    dtype = a.dtype.newbyteorder("<")
    return [dtype.str, base64.b64encode(a.astype(dtype).tobytes()).decode(),
            base64.b64encode(b.astype(dtype).tobytes()).decode()]


def decode_factors(value) -> tuple[np.ndarray, np.ndarray]:
    """`encode_factors`' list back to (a [C], b [D]); a ValueError if it is not one."""
    if not (isinstance(value, list) and len(value) == 3 and all(isinstance(v, str) for v in value)):
        raise ValueError("not an [dtype, a, b] list")
    dtype = np.dtype(value[0])
    if dtype.kind != "f":
        raise ValueError(f"dtype {value[0]} is not a float type")
    return (np.frombuffer(base64.b64decode(value[1]), dtype=dtype),
            np.frombuffer(base64.b64decode(value[2]), dtype=dtype))


# --- a table read from a pipe: its embeddings found by content -----------------------------------

STREAM_KEEP = 4  # embeddings files of tables written to stdout kept under ./.alcli (newest)


def stream_embeddings_path(folder: Path, run_id: str) -> Path:
    """Where a table written to stdout keeps its embeddings: FOLDER/stdout-RUNID.emb.npz."""
    return folder / f"stdout-{run_id}{EMBEDDINGS_SUFFIX}"


def prune_stream_embeddings(folder: Path, keep: int = STREAM_KEEP) -> None:
    """Only the `keep` newest embeddings files of stdout tables stay in `folder`."""
    files = sorted(folder.glob(f"stdout-*{EMBEDDINGS_SUFFIX}"), key=_mtime, reverse=True)
    for old in files[keep:]:
        old.unlink(missing_ok=True)


def find_for_rows(folder: Path, rows: Sequence[dict]) -> str | None:
    """The newest embeddings file in `folder` written by the `score` run a table came from: it
    holds every row's id with the very same score (floats are written exactly). None: none does."""
    wanted = {str(r["id"]): r.get("score") for r in rows}
    for path in sorted(folder.glob(f"*{EMBEDDINGS_SUFFIX}"), key=_mtime, reverse=True):
        try:
            _check_members(str(path))
            with np.load(path, allow_pickle=False) as z:
                if "scores" not in z.files or "ids" not in z.files:
                    continue
                scores = dict(zip((str(i) for i in z["ids"].tolist()), z["scores"].tolist()))
        except (OSError, ValueError, zipfile.BadZipFile, EOFError):  # EmbeddingsError among them
            continue
        if all(i in scores and _same(scores[i], s) for i, s in wanted.items()):
            return str(path)
    return None


def _same(stored: float, score) -> bool:
    if score is None or (isinstance(score, float) and math.isnan(score)):
        return math.isnan(stored)
    return stored == score


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


# --- the features b, read from disk a block at a time ---------------------------------------------

def open_features(path: str) -> tuple[list[str], np.ndarray]:
    """(ids, b [N, D]) of an embeddings file, b a read-only memory map of the file (numpy's .npz
    is an uncompressed zip: the array lies in it as plain bytes), so that near-duplicate search
    reads it a block at a time; an array stored compressed is read whole."""
    _check_members(path)
    try:
        with np.load(path, allow_pickle=False) as z:
            missing = [k for k in ("format", "ids", "b") if k not in z.files]
            if missing:
                raise EmbeddingsError(f"embeddings file {path} is not an alcli embeddings file "
                                      f"(missing {', '.join(missing)}).")
            if str(z["format"]) != _FORMAT:
                raise EmbeddingsError(f"embeddings file {path} has format '{z['format']}', "
                                      f"expected '{_FORMAT}'.")
            ids = z["ids"]
            b = _member_map(path)
            b = z["b"] if b is None else b
    except EmbeddingsError:
        raise
    except (OSError, ValueError, zipfile.BadZipFile, EOFError, KeyError) as err:
        raise EmbeddingsError(f"cannot read embeddings file {path}: {err}.") from err
    if ids.ndim != 1 or b.ndim != 2 or len(ids) != len(b) or b.dtype.kind != "f":
        raise EmbeddingsError(f"embeddings file {path} does not hold one row of features per id "
                              f"(ids {ids.shape}, features {b.shape} {b.dtype}).")
    ids = [str(i) for i in ids.tolist()]
    if len(set(ids)) != len(ids):
        raise EmbeddingsError(f"embeddings file {path} lists an id more than once.")
    _check_values(path, "b", b)
    return ids, b


def _member_map(path: str, name: str = "b") -> np.ndarray | None:
    """NAME.npy inside the .npz as a memory map, or None when it is stored compressed."""
    with zipfile.ZipFile(path) as zf:
        info = zf.getinfo(f"{name}.npy")
    if info.compress_type != zipfile.ZIP_STORED:
        return None
    with open(path, "rb") as fh:
        fh.seek(info.header_offset)
        local = fh.read(30)  # the zip's local file header: name and extra field lengths at 26
        name_len, extra_len = int.from_bytes(local[26:28], "little"), int.from_bytes(local[28:30], "little")
        fh.seek(info.header_offset + 30 + name_len + extra_len)
        version = np.lib.format.read_magic(fh)
        read_header = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                       else np.lib.format.read_array_header_2_0)
        shape, fortran, dtype = read_header(fh)
        offset = fh.tell()
    if dtype.hasobject or len(shape) != 2 or 0 in shape:
        return None
    return np.memmap(path, dtype=dtype, mode="r", offset=offset, shape=shape,
                     order="F" if fortran else "C")
