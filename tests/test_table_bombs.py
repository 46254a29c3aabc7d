"""Small inputs that would make memory grow without bound, and dataset files that are not what
they claim (issue 37, items 6 and 9): Parquet row groups are read PARQUET_BATCH rows at a time,
Hugging Face Arrow files record batch by record batch, and a cell or tar member over
MAX_CELL_BYTES (lowered here) is an error row naming the limit while the other rows score as the
folder of files does; a .cls member over its limit, a state.json nested too deeply and a
`"splits"` that is a string are one sentence each."""
from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import pytest

from alcli.pools import tables
from cli_errors import assert_one_error
from conftest import parse_csv
from test_sources import folder_rows, image_rows, rows, score

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")
pytestmark = pytest.mark.usefixtures("one_thread")  # tables compared byte for byte


@pytest.fixture
def bomb(in_ws, monkeypatch):
    """(the image rows, the first one's image padded past the cap, its id): MAX_CELL_BYTES set
    to the largest image of the pool, so that only the padded one is over it (a PNG or JPEG
    with zeros after its end still decodes)."""
    everything = image_rows(in_ws)
    cap = max(len(data) for _, data, _ in everything)
    monkeypatch.setattr(tables, "MAX_CELL_BYTES", cap)
    rel, data, label = everything[0]
    return [(rel, data.ljust(cap + 1, b"\0"), label), *everything[1:]], rel, cap


def without(table: list[dict], rel: str) -> list[dict]:
    """The rows but `rel`'s, without their rank (the rest keep their order)."""
    return [{k: v for k, v in r.items() if k != "rank"} for r in table if r["id"] != rel]


def check(in_ws, tmp_path, pool, rel, cap, *args):
    out = tmp_path / "scores.csv"
    score(in_ws, pool, *args, "-o", out)
    errors = parse_csv(Path(f"{out}.errors.csv").read_text())
    assert [e["id"] for e in errors] == [rel]  # a shard sample's id is its member's name, as a file's
    assert f"is {cap + 1} bytes, over alcli's limit of {cap} bytes" in errors[0]["error"]
    assert without(rows(out), rel) == without(folder_rows(in_ws), rel)


def test_a_parquet_row_group_is_read_in_batches_and_a_cell_over_the_cap_is_an_error_row(
        in_ws, tmp_path, bomb, monkeypatch):
    everything, rel, cap = bomb
    monkeypatch.setattr(tables, "PARQUET_BATCH", 2)  # one row group of 14 rows: 7 batches
    ids, datas, labels = zip(*everything)
    table = tmp_path / "pool.parquet"
    pq.write_table(pa.table({"id": list(ids), "image": list(datas), "label": list(labels)}), table,
                   row_group_size=len(ids))
    check(in_ws, tmp_path, table, rel, cap, "--id-column", "id")
    same_shard(in_ws, table, rel)


def same_shard(in_ws, pool, rel):
    """A shard of the pool reads some batches and skips others: the folder's shard still."""
    part = rows(score(in_ws, pool, "--id-column", "id", "--shard", "1/3", "-o", "-"))
    assert 0 < len(part) < 10
    assert without(part, rel) == without(rows(score(in_ws, "pool", "--labels-from-folders",
                                                    "--shard", "1/3", "-o", "-")), rel)


def hf_dataset(folder: Path, columns: dict, batch: int) -> Path:
    """A `save_to_disk` folder by hand: one zstd-compressed Arrow stream of `batch`-row record
    batches, and its state.json."""
    folder.mkdir()
    table = pa.table(columns)
    options = pa.ipc.IpcWriteOptions(compression="zstd")
    with pa.ipc.new_stream(folder / "data-00000-of-00001.arrow", table.schema,
                           options=options) as writer:
        writer.write_table(table, max_chunksize=batch)
    (folder / "state.json").write_text(json.dumps(
        {"_data_files": [{"filename": "data-00000-of-00001.arrow"}]}))
    return folder


def test_an_arrow_dataset_is_read_by_record_batch_and_a_cell_over_the_cap_is_an_error_row(
        in_ws, tmp_path, bomb, monkeypatch):
    everything, rel, cap = bomb
    monkeypatch.setattr(tables, "HF_CHUNK", 2)  # record batches of 3 rows: chunks of 2, 1
    ids, datas, labels = zip(*everything)
    saved = hf_dataset(tmp_path / "ds", {"id": list(ids), "label": list(labels),
                                         "image": [{"bytes": d, "path": None} for d in datas]}, 3)
    check(in_ws, tmp_path, saved, rel, cap, "--id-column", "id")
    same_shard(in_ws, saved, rel)
    two = rows(score(in_ws, saved, "--id-column", "id", "--workers", "2", "-o", "-"))
    assert without(two, rel) == without(folder_rows(in_ws), rel)  # each worker reads on its own


def test_a_tar_member_over_the_cap_is_an_error_row(in_ws, tmp_path, bomb):
    everything, rel, cap = bomb
    shard = tmp_path / "pool.tar"
    with tarfile.open(shard, "w") as tar:
        for rel_, data, label in everything:
            key, ext = rel_.rsplit(".", 1)
            for name, content in ((f"{key}.{ext}", data), (f"{key}.cls", str(label).encode())):
                info = tarfile.TarInfo(name)
                info.size = len(content)
                tar.addfile(info, io.BytesIO(content))
    check(in_ws, tmp_path, shard, rel, cap)
    with tarfile.open(tmp_path / "cls.tar", "w") as tar:
        for name, content in (("a.png", everything[1][1]), ("a.cls", b"1" + b" " * 2000)):
            info = tarfile.TarInfo(name)
            info.size = len(content)
            tar.addfile(info, io.BytesIO(content))
    assert_one_error(score(in_ws, tmp_path / "cls.tar", "-o", "-", ok=False),
                     "sample a of", "a .cls member of 2001 bytes")


def test_dataset_json_nested_too_deeply_or_splits_as_a_string_is_one_sentence(in_ws, tmp_path):
    ids, datas, labels = zip(*image_rows(in_ws))
    saved = hf_dataset(tmp_path / "ds", {"id": list(ids), "image": list(datas)}, 5)
    state = saved / "state.json"
    state.write_text('{"_data_files": ' + "[" * 200_000 + "]" * 200_000 + "}")
    assert_one_error(score(in_ws, saved, "-o", "-", ok=False),
                     f"{state} cannot be read (its JSON is nested too deeply to hold the key "
                     f"'_data_files')", "deep state.json")
    state.write_text(json.dumps({"_data_files": "data-00000-of-00001.arrow"}))
    assert_one_error(score(in_ws, saved, "-o", "-", ok=False),
                     f"key '_data_files' of {state} must be a list", "string _data_files")
    root = tmp_path / "dd"
    (root / "train").mkdir(parents=True)
    (root / "dataset_dict.json").write_text(json.dumps({"splits": "train"}))
    assert_one_error(score(in_ws, root, "-o", "-", ok=False),
                     f"key 'splits' of {root / 'dataset_dict.json'} must be a list of split "
                     f"names, got str", "splits as a string")
