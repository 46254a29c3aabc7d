"""Table pools: Parquet files or folders of them (pyarrow), and Hugging Face datasets written by
`save_to_disk`. Opening reads the id and label columns only, batch by batch; the image or text
column is read one chunk (PARQUET_BATCH rows of a Parquet row group, HF_CHUNK rows of an Arrow
record batch) at a time, when an item of it is asked for, so a pool read in order streams through
memory however large its row groups, and however well compressed. Each process (DataLoader worker)
opens the files itself and keeps the one chunk it last read, its reader positioned after it. A
cell over MAX_CELL_BYTES is an error row.

Image cells are encoded bytes, a path (relative to the file holding the table), or a struct with
`bytes` and `path` (how `datasets` stores an Image feature); they are decoded as image files are.
A row's `path` is the image's file, or for bytes FILE#COLUMN[ROW] (the row of that file; read back
by alcli.pools.open_source).
"""
from __future__ import annotations

import bisect
import io
import json
import os
import re
from pathlib import Path

import torch
from PIL import Image, UnidentifiedImageError

from ..errors import ConfigError, PoolError, first_line
from ..files import remote
from .common import (IMAGE_EXTS, Item, JpegBytes, Pool, PoolOptions, Text, label_index, named_label,
                   check_unique_ids, image_transform)
from ..files.regular import check_regular

TABLE_EXTS = (".parquet",)
HF_CHUNK = 1024  # rows of a Hugging Face dataset's record batch turned into Python values at once
PARQUET_BATCH = 256  # rows of a Parquet row group read at once
MAX_CELL_BYTES = 256 << 20  # an image or text cell (or tar member) larger is an error row


class Oversized(int):
    """A cell over MAX_CELL_BYTES, left unread: its size in bytes."""


def cells(column) -> list:
    """An Arrow column (image bytes, paths, {bytes, path} structs, texts) as Python values, each
    cell over MAX_CELL_BYTES an Oversized instead (never copied into a Python object)."""
    import pyarrow as pa
    import pyarrow.compute as pc
    data = column.field("bytes") if pa.types.is_struct(column.type) else column
    if not (pa.types.is_binary(data.type) or pa.types.is_large_binary(data.type)
            or _is_string_type(data.type)):
        return column.to_pylist()
    sizes = pc.fill_null(pc.binary_length(data), 0)
    over = pc.greater(sizes, MAX_CELL_BYTES)
    if not pc.any(over).as_py():
        return column.to_pylist()
    sizes = sizes.to_pylist()
    kept = pc.if_else(over, pa.nulls(len(column), column.type), column)  # [rows]
    return [Oversized(n) if n > MAX_CELL_BYTES else v for n, v in zip(sizes, kept.to_pylist())]


def oversized(where: str, what: str, size: int) -> str:
    limit = (f"{MAX_CELL_BYTES >> 20} MiB" if MAX_CELL_BYTES % (1 << 20) == 0
             else f"{MAX_CELL_BYTES} bytes")
    return f"{where}: its {what} is {size} bytes, over alcli's limit of {limit} (MAX_CELL_BYTES)"


def is_hf_dataset(path: Path) -> bool:
    """A folder written by Dataset.save_to_disk or DatasetDict.save_to_disk."""
    return path.is_dir() and ((path / "dataset_dict.json").is_file() or
                              (path / "state.json").is_file())


def is_parquet_folder(path: Path) -> bool:
    """A folder holding .parquet files (and no images) at its top."""
    names = [n.lower() for n in _names(path)]
    return (any(n.endswith(TABLE_EXTS) for n in names)
            and not any(n.endswith(IMAGE_EXTS) for n in names))


def _names(path: Path) -> list[str]:
    try:
        return [p.name for p in path.iterdir()]
    except OSError:
        return []


# --- readers: chunk k of a column -> its cells as Python values --------------------------------

class ParquetChunks:
    """Batches of Parquet row groups (files local Paths or remote.Remote); chunk k is rows
    batch*PARQUET_BATCH on of one row group: chunks[k] = (file index, group, batch)."""

    def __init__(self, files: list, chunks: list[tuple[int, int, int]], first_rows: list[int]):
        self.files, self.chunks, self.first_rows = files, chunks, first_rows  # row in its file
        self._open: dict[int, object] = {}
        self._reader: tuple | None = None  # ((file, group), the next batch, its iterator)
        self._pid = os.getpid()  # the process _open belongs to (a forked worker opens its own)

    def __getstate__(self):  # each worker opens the files itself
        return {**self.__dict__, "_open": {}, "_reader": None}

    def folder(self, k: int):
        return remote.parent(self.files[self.chunks[k][0]])

    def cell(self, k: int, column: str, offset: int) -> str:
        """Where the cell `offset` rows into chunk k is: FILE#COLUMN[ROW of that file]."""
        return f"{self.files[self.chunks[k][0]]}#{column}[{self.first_rows[k] + offset}]"

    def where(self, k: int) -> str:
        f, g, b = self.chunks[k]
        return f"row group {g} of {self.files[f]}" + (f" (its rows {b * PARQUET_BATCH} on)"
                                                       if b else "")

    def column(self, k: int, name: str) -> list:
        """Read forward from the last batch read in the same row group (readers go in order),
        else from the row group's start."""
        f, g, b = self.chunks[k]
        if f not in self._open or self._pid != os.getpid():
            self._open, self._pid, self._reader = {f: _parquet_file(self.files[f])}, os.getpid(), None
        if self._reader is None or self._reader[0] != (f, g, name) or self._reader[1] > b:
            batches = self._open[f].iter_batches(batch_size=PARQUET_BATCH, row_groups=[g],
                                                 columns=[name], use_threads=False)
            self._reader = ((f, g, name), 0, batches)
        key, at, batches = self._reader
        self._reader = None
        for _ in range(b - at):
            next(batches)
        batch = next(batches)
        self._reader = (key, b + 1, batches)
        return cells(batch.column(0))


class ArrowChunks:
    """A Hugging Face dataset's Arrow stream files, memory-mapped and read record batch by record
    batch; chunk k is HF_CHUNK rows of one batch: chunks[k] = (file index, batch, first row)."""

    def __init__(self, files: list[Path], root: Path, chunks: list[tuple[int, int, int]],
                 first_rows: list[int]):
        self.files, self.root, self.chunks, self.first_rows = files, root, chunks, first_rows
        self._reader: tuple | None = None  # ((file, column), the next batch, its reader, the last)
        self._pid = os.getpid()  # the process _reader belongs to (a forked worker opens its own)

    def __getstate__(self):
        return {**self.__dict__, "_reader": None}

    def folder(self, k: int) -> Path:
        return self.root

    def cell(self, k: int, column: str, offset: int) -> str:
        return f"{self.files[self.chunks[k][0]]}#{column}[{self.first_rows[k] + offset}]"

    def where(self, k: int) -> str:
        f, b, r = self.chunks[k]
        return f"rows {r} to {r + HF_CHUNK - 1} of record batch {b} of {self.files[f]}"

    def column(self, k: int, name: str) -> list:
        f, b, r = self.chunks[k]
        if self._pid != os.getpid():
            self._reader, self._pid = None, os.getpid()
        if self._reader is None or self._reader[0] != (f, name) or self._reader[1] > b + 1:
            self._reader = ((f, name), 0, arrow_batches(self.files[f], [name]), None)
        key, at, batches, last = self._reader
        self._reader = None
        for _ in range(b + 1 - at):  # the batch itself may be read already (its next chunk)
            last = next(batches)
        self._reader = (key, b + 1, batches, last)
        return cells(last.column(0).slice(r, HF_CHUNK))


def _parquet_file(file):
    import pyarrow.parquet as pq
    return pq.ParquetFile(remote.open_binary(file) if isinstance(file, remote.Remote) else file)


def _arrow_schema(file: Path):
    import pyarrow as pa
    return pa.ipc.open_stream(pa.memory_map(str(file))).schema


def arrow_batches(file: Path, columns: list[str]):
    """The record batches of an Arrow stream file, only `columns` decoded, one at a time."""
    import pyarrow as pa
    schema = _arrow_schema(file)
    fields = [schema.get_field_index(c) for c in columns] or [0]  # [] would read every one
    options = pa.ipc.IpcReadOptions(included_fields=fields, use_threads=False)
    yield from pa.ipc.open_stream(pa.memory_map(str(file)), options=options)


# --- the pool ----------------------------------------------------------------------------------

class TablePool(Pool):
    """Rows of a table; `starts[k]` is the first row of chunk k (and starts[-1] the row count)."""

    def __init__(self, name: str, kind: str, column: str, ids: list[str], labels: list[int],
                 chunks, starts: list[int], opts: PoolOptions):
        self.name, self.kind, self.column = name, kind, column
        self.ids, self.labels, self.chunks, self.starts = ids, labels, chunks, starts
        self.has_labels = any(label >= 0 for label in labels)
        self._cells: tuple[int, list] | None = None  # (chunk, its cells): the one last read
        set_decoding(self, kind, opts)

    def __getstate__(self):
        return {**self.__dict__, "_cells": None}

    def __getitem__(self, i: int) -> Item:
        k = bisect.bisect_right(self.starts, i) - 1
        try:
            if self._cells is None or self._cells[0] != k:
                self._cells = None
                self._cells = (k, self.chunks.column(k, self.column))
        except Exception as err:  # noqa: BLE001 - a chunk that cannot be read: its rows are errors
            return Item(self.ids[i], None, self.labels[i],
                        f"cannot read {self.chunks.where(k)} ({first_line(err)})")
        cell = self._cells[1][i - self.starts[k]]
        if isinstance(cell, Oversized):
            return Item(self.ids[i], None, self.labels[i],
                        oversized(f"row {i} of {self.name}", f"{self.kind[:5]} cell", cell))
        if self.kind == "text":
            if not isinstance(cell, str):
                return Item(self.ids[i], None, self.labels[i], f"row {i} of {self.name} has no "
                            f"text in column '{self.column}'")
            return Item(self.ids[i], Text(cell, self.tokenize), self.labels[i], None)
        return self._image(i, cell, self.chunks.folder(k),
                           self.chunks.cell(k, self.column, i - self.starts[k]))

    def _image(self, i: int, cell, folder, source: str) -> Item:
        """`source`: where the cell is, the row's path when the image is in it (bytes)."""
        where = f"row {i} of {self.name}"
        try:
            data, path = image_cell(cell, folder)
            if data is None:
                if not isinstance(path, remote.Remote):
                    check_regular(path)
                data = remote.read_bytes(path)
        except Exception as err:  # noqa: BLE001 - any unreadable cell becomes an error row
            return Item(self.ids[i], None, self.labels[i],
                        f"cannot read the image in {where} ({first_line(err)})")
        return image_item(self.ids[i], self.labels[i], data, self.transform, self.decode,
                          where + (f" ({path})" if path else ""),
                          source if path is None else str(path))


def set_decoding(pool, kind: str, opts: PoolOptions) -> None:
    """What a table or shard pool of `kind` needs to turn its cells into inputs: the image
    transform (and, with --decode gpu, the device decoder), or the tokenizer."""
    pool.decode = opts.decode
    if kind == "images":
        pool.transform = image_transform(opts.transform, opts.channels)
        pool.to_float = pool.transform.to_float
        pool.decode_jpegs = pool.transform.decode_jpegs if opts.decode == "gpu" else None
    else:
        pool.tokenize = opts.tokenizer()


def image_item(id_: str, label: int, data: bytes, transform, decode: str, where: str,
               path: str | None = None) -> Item:
    """An encoded image -> its item: decoded and transformed as an image file is (--decode gpu:
    the JPEG bytes, decoded on the device); an error item when it cannot be decoded."""
    try:
        if decode == "gpu":
            if not data.startswith(b"\xff\xd8\xff"):
                raise ValueError("not a JPEG (--decode gpu decodes JPEGs only)")
            x = JpegBytes(torch.frombuffer(bytearray(data), dtype=torch.uint8))
        else:
            with Image.open(io.BytesIO(data)) as img:
                x = transform(img)
    except UnidentifiedImageError:  # its message names the BytesIO object
        return Item(id_, None, label, f"cannot read the image in {where} (its bytes are no image "
                    f"format PIL knows)")
    except Exception as err:  # noqa: BLE001 - any undecodable image becomes an error row
        return Item(id_, None, label, f"cannot read the image in {where} ({first_line(err)})")
    return Item(id_, x, label, None, path)


def image_cell(cell, folder) -> tuple[bytes | None, object]:
    """(the encoded image, or None to read it from the path; the path (a Path, or a
    remote.Remote in a remote table's folder), or None)."""
    if isinstance(cell, dict):
        if cell.get("bytes"):
            return cell["bytes"], None
        cell = cell.get("path")
    if isinstance(cell, (bytes, bytearray)):
        return bytes(cell), None
    if isinstance(cell, str) and cell:
        if isinstance(folder, remote.Remote):  # a remote table's files are in its store
            return None, remote.join(folder, cell)
        path = Path(cell)
        return None, path if path.is_absolute() else folder / path
    raise ValueError("the cell is empty")


# --- columns -----------------------------------------------------------------------------------

def _kind_and_column(name: str, schema, opts: PoolOptions) -> tuple[str, str]:
    """("images" or "text", the column to read): the image column if the table has it (or it was
    named), else the text column."""
    names = schema.names
    image = opts.image_column or "image"
    if image in names or opts.image_column:
        _check_column(name, schema, image, "image", _is_image_type)
        return "images", image
    if opts.text_column in names:
        _check_column(name, schema, opts.text_column, "text", _is_string_type)
        if opts.tokenizer is None:
            raise PoolError(f"text pool {name} needs a tokenizer: pass --model a Hugging Face "
                            f"model directory that holds one")
        return "text", opts.text_column
    raise PoolError(f"table {name} has no image column '{image}' and no text column "
                    f"'{opts.text_column}' (columns: {', '.join(names)}); name one with "
                    f"--image-column or --text-column")


def _check_column(name: str, schema, column: str, what: str, ok) -> None:
    if column not in schema.names:
        raise PoolError(f"table {name} has no {what} column '{column}' (columns: "
                        f"{', '.join(schema.names)})")
    kind = schema.field(column).type
    if not ok(kind):
        raise PoolError(f"table {name}: the {what} column '{column}' holds {kind}, not "
                        f"{_WANTED[what]}")


_WANTED = {"image": "encoded image bytes, paths or {bytes, path} structs", "text": "strings",
           "id": "strings or integers", "label": "integer class indices or class names"}


def _is_string_type(t) -> bool:
    import pyarrow.types as pt
    return pt.is_string(t) or pt.is_large_string(t)


def _is_image_type(t) -> bool:
    import pyarrow.types as pt
    if pt.is_struct(t):
        return {t.field(i).name for i in range(t.num_fields)} >= {"bytes", "path"}
    return pt.is_binary(t) or pt.is_large_binary(t) or _is_string_type(t)


def _is_id_type(t) -> bool:
    import pyarrow.types as pt
    return _is_string_type(t) or pt.is_integer(t)


def _is_label_type(t) -> bool:
    import pyarrow.types as pt
    return _is_string_type(t) or pt.is_integer(t) or pt.is_null(t)


def _key_columns(name: str, schema, opts: PoolOptions) -> tuple[str | None, str | None]:
    """(the id column or None: row numbers; the label column or None: no labels)."""
    if opts.id_column is not None:
        _check_column(name, schema, opts.id_column, "id", _is_id_type)
    label = opts.label_column or ("label" if "label" in schema.names else None)
    if label is not None:
        _check_column(name, schema, label, "label", _is_label_type)
    return opts.id_column, label


def _ids_and_labels(name: str, batches, id_col: str | None, label_col: str | None,
                    opts: PoolOptions) -> tuple[list[str], list[int]]:
    """The id and label columns, read batch by batch (the other columns are not read)."""
    ids: list[str] = []
    labels: list[int] = []
    for batch in batches:
        start = len(ids)
        n = batch.num_rows
        if id_col is None:
            ids.extend(str(r) for r in range(start, start + n))
        else:
            for r, v in enumerate(batch.column(id_col).to_pylist(), start):
                if v is None or v == "":
                    raise PoolError(f"row {r} of table {name} has no id in column '{id_col}'")
                ids.append(str(v))
        if label_col is None:
            labels.extend([-1] * n)
        else:
            for r, v in enumerate(batch.column(label_col).to_pylist(), start):
                where = f"row {r} of table {name}"
                labels.append(-1 if v is None or v == -1 else
                              label_index(named_label(v, where, opts), where))
    if not ids:
        raise PoolError(f"table {name} holds no rows")
    check_unique_ids(name, ids)
    return ids, labels


def _columns_read(id_col, label_col) -> list[str]:
    return [c for c in dict.fromkeys((id_col, label_col)) if c is not None]


# --- sources -----------------------------------------------------------------------------------

def _pyarrow(what: str, extra: str):
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise PoolError(f"{what} needs pyarrow; pip install 'alcli[{extra}]'") from None
    return pq


def from_parquet(spec, opts: PoolOptions) -> Pool:
    """A .parquet file, or a folder of them (read in sorted order, subfolders included); `spec`
    a path or a remote.Remote."""
    _pyarrow(f"table pool {spec}", "tables")
    if isinstance(spec, remote.Remote):
        with remote.reading("table pool", spec):
            is_dir = spec.fs.isdir(spec.path)
            files = remote.files_under(spec, ".parquet") if is_dir else [spec]
        spec = str(spec)
        if not files:
            raise PoolError(f"folder {spec} holds no .parquet files (a pool in an object store is "
                            f"a .parquet file, a folder of them, or .tar shards)")
    else:
        root = Path(spec)
        files = sorted(root.rglob("*.parquet")) if root.is_dir() else [root]
    metas, schema = [], None
    for f in files:
        try:
            meta = _parquet_file(f)
        except Exception as err:  # noqa: BLE001 - not Parquet, truncated, unreadable
            remote.raise_store_error("table", f, err)
            raise PoolError(f"table {f} cannot be read as Parquet ({first_line(err)})") from None
        if schema is None:
            schema = meta.schema_arrow
        elif meta.schema_arrow.names != schema.names:
            raise PoolError(f"table {f} has the columns {', '.join(meta.schema_arrow.names)}, "
                            f"but {files[0]} has {', '.join(schema.names)}")
        metas.append(meta)
    kind, column = _kind_and_column(spec, schema, opts)
    id_col, label_col = _key_columns(spec, schema, opts)
    groups = [(f, g) for f, meta in enumerate(metas) for g in range(meta.num_row_groups)]
    chunks, starts, first_rows = [], [0], []
    in_file = [0] * len(files)  # rows of each file's groups so far
    for f, g in groups:
        rows = metas[f].metadata.row_group(g).num_rows
        for b in range(-(-rows // PARQUET_BATCH)):
            chunks.append((f, g, b))
            first_rows.append(in_file[f] + b * PARQUET_BATCH)
            starts.append(starts[-1] + min(PARQUET_BATCH, rows - b * PARQUET_BATCH))
        in_file[f] += rows

    def batches():
        for f, g in groups:
            try:
                yield from metas[f].iter_batches(batch_size=PARQUET_BATCH, row_groups=[g],
                                                 columns=_columns_read(id_col, label_col))
            except Exception as err:  # noqa: BLE001
                raise PoolError(f"row group {g} of table {files[f]} cannot be read "
                                f"({first_line(err)})") from None
    ids, labels = _ids_and_labels(spec, batches(), id_col, label_col, opts)
    if len(ids) != starts[-1]:
        raise PoolError(f"table {spec} holds {len(ids)} rows, but its row groups say {starts[-1]}")
    return TablePool(spec, kind, column, ids, labels, ParquetChunks(files, chunks, first_rows),
                     starts, opts)


def from_hf_dataset(spec: str, opts: PoolOptions) -> Pool:
    """A folder written by `save_to_disk`: a Dataset, or a DatasetDict of which --split picks one."""
    _pyarrow(f"dataset {spec}", "datasets")
    root = Path(spec)
    split_dir, name = root, spec
    if (root / "dataset_dict.json").is_file():
        splits = _splits(root)
        split = opts.split or (splits[0] if len(splits) == 1 else None)
        if split not in splits:
            raise ConfigError(f"dataset {spec} has the splits {', '.join(splits)}; "
                              + (f"it has no split '{opts.split}'" if opts.split else
                                 "pick one with --split"))
        split_dir, name = root / split, f"{spec} (split {split})"
    elif opts.split is not None:
        raise ConfigError(f"--split {opts.split}: dataset {spec} is one Dataset, not a DatasetDict "
                          f"of splits")
    files = _arrow_files(split_dir, name)
    try:
        schema = _arrow_schema(files[0])
    except Exception as err:  # noqa: BLE001
        raise PoolError(f"dataset {name} cannot be read ({first_line(err)})") from None
    kind, column = _kind_and_column(name, schema, opts)
    id_col, label_col = _key_columns(name, schema, opts)
    chunks, starts, first_rows = [], [0], []

    def batches():  # the id and label columns, batch by batch; the chunks each batch makes
        for f, file in enumerate(files):
            try:
                if _arrow_schema(file).names != schema.names:
                    raise ValueError(f"{file} has other columns than {files[0]}")
                in_file = 0
                for b, batch in enumerate(arrow_batches(file, _columns_read(id_col, label_col))):
                    for r in range(0, batch.num_rows, HF_CHUNK):
                        chunks.append((f, b, r))
                        first_rows.append(in_file + r)
                        starts.append(starts[-1] + min(HF_CHUNK, batch.num_rows - r))
                    in_file += batch.num_rows
                    yield batch
            except Exception as err:  # noqa: BLE001
                raise PoolError(f"dataset {name} cannot be read ({first_line(err)})") from None
    ids, labels = _ids_and_labels(name, batches(), id_col, label_col, opts)
    pool = TablePool(name, kind, column, ids, labels,
                     ArrowChunks(files, split_dir, chunks, first_rows), starts, opts)
    names = _class_label_names(schema, label_col)
    if names and opts.class_names is None:  # a ClassLabel feature names the classes
        pool.classes, pool.classes_from = names, f"the ClassLabel feature '{label_col}' of {name}"
    return pool


def _class_label_names(schema, column: str | None) -> list[str] | None:
    """The names of a ClassLabel feature, from the features `datasets` keeps in the schema."""
    try:
        info = json.loads((schema.metadata or {})[b"huggingface"])
        feature = info["info"]["features"][column]
    except (KeyError, ValueError, TypeError):
        return None
    names = feature.get("names") if isinstance(feature, dict) else None
    is_class_label = isinstance(feature, dict) and feature.get("_type") == "ClassLabel"
    return [str(n) for n in names] if is_class_label and isinstance(names, list) else None


def _splits(root: Path) -> list[str]:
    file = root / "dataset_dict.json"
    splits = _json_key(file, "splits", f"dataset {root}")
    if not isinstance(splits, list) or not all(isinstance(n, str) for n in splits):
        raise PoolError(f"dataset {root}: key 'splits' of {file} must be a list of split names, "
                        f"got {type(splits).__name__} {json.dumps(splits)[:80]}")
    return splits


def _json_key(file: Path, key: str, name: str):
    """`key` of the JSON object in `file`; one sentence naming both when it cannot be read."""
    try:
        value = json.loads(file.read_text())
    except RecursionError:  # json's decoder recurses once per level
        raise PoolError(f"{name}: {file} cannot be read (its JSON is nested too deeply to hold "
                        f"the key '{key}')") from None
    except (OSError, ValueError) as err:
        raise PoolError(f"{name}: {file} cannot be read ({first_line(err)})") from None
    if not isinstance(value, dict) or key not in value:
        raise PoolError(f"{name}: {file} has no key '{key}'")
    return value[key]


def _arrow_files(folder: Path, name: str) -> list[Path]:
    file = folder / "state.json"
    entries = _json_key(file, "_data_files", f"dataset {name}")
    if not isinstance(entries, list) or not all(
            isinstance(e, dict) and isinstance(e.get("filename"), str) for e in entries):
        raise PoolError(f"dataset {name}: key '_data_files' of {file} must be a list of "
                        f"{{\"filename\": ...}} objects")
    if not entries:
        raise PoolError(f"dataset {name} holds no data files")
    return [folder / e["filename"] for e in entries]


# --- a row's cell, read back ------------------------------------------------------------------------

CELL = re.compile(r"(.+)\[(\d+)\]")  # COLUMN[ROW]


def read_cell(file: str, part: str) -> bytes:
    """The image a row's FILE#COLUMN[ROW] path names: the cell's bytes, or the file it names."""
    m = CELL.fullmatch(part)
    if m is None:
        raise ValueError(f"{file}#{part}: after '#' a table's cell is COLUMN[ROW]")
    data, path = image_cell(_cell(file, m.group(1), int(m.group(2))), Path(file).parent)
    if data is None:
        check_regular(path)
        data = Path(path).read_bytes()
    return data


def _cell(file: str, column: str, row: int):
    """Row `row` of `column` of a Parquet file or a dataset's Arrow stream file, as Python."""
    if file.lower().endswith(".parquet"):
        import pyarrow.parquet as pq
        meta = pq.ParquetFile(file)
        batches = (meta.read_row_group(g, columns=[column]) for g in range(meta.num_row_groups))
    else:
        batches = arrow_batches(Path(file), [column])
    start = 0
    for batch in batches:
        if row < start + batch.num_rows:
            return batch.column(0)[row - start].as_py()
        start += batch.num_rows
    raise ValueError(f"{file} has no row {row}")
