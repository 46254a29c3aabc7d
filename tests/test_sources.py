"""Pools where large data lives (issue 20): Parquet tables (a file, a folder of them; image bytes or
paths), Hugging Face datasets saved to disk. Each is the workspace's pool of image files written
as that source, and must give the folder's table: the same ids, scores and ranking, byte for byte
(one thread, -b 1). Unreadable rows go to errors.csv; --shard and --resume work; bad tables are
one sentence."""
from __future__ import annotations

import io
import shutil
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from typer.testing import CliRunner

from alcli.cli import app
from cli_errors import assert_one_error
from interrupted import kill_when_saved, start_score
from conftest import parse_csv

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

runner = CliRunner()
pytestmark = pytest.mark.usefixtures("one_thread")  # tables compared byte for byte
KEYS = ("rank", "id", "score", "pred", "confidence", "label", "loss", "text")  # not `path`: the folder's files


def score(ws, pool, *args, ok=True):
    """`alcli score POOL ARGS` with the classes named a, b, c (as the pool's class folders are)."""
    names = ws.root / "classes.txt"
    names.write_text("a\nb\nc\n")
    result = runner.invoke(app, ["score", str(pool), "-m", "model.pt", "-c", str(ws.config),
                                 "--class-names", str(names), "-b", "1", "-q", *map(str, args)])
    if ok:
        assert result.exit_code == 0, result.stderr + result.stdout
    return result


def folder_rows(ws, *args) -> list[dict]:
    """The table of the pool as a folder of files, labeled by its class folders."""
    return rows(score(ws, "pool", "--labels-from-folders", *args, "-o", "-"))


def rows(result_or_path) -> list[dict]:
    text = (Path(result_or_path).read_text() if isinstance(result_or_path, Path)
            else result_or_path.stdout)
    table = parse_csv(text)
    assert table and all(k in table[0] for k in ("rank", "id", "score", "pred")), text[:200]
    return [{k: r[k] for k in KEYS if k in r} for r in table]


def image_rows(ws) -> list[tuple[str, bytes, int]]:
    """(id, the file's bytes, label) of every image, in the folder pool's order."""
    return [(rel, ws.images[rel][0].read_bytes(), ws.images[rel][1]) for rel in sorted(ws.images)]


def write_parquet(path: Path, columns: dict, row_group_size: int = 4) -> Path:
    pq.write_table(pa.table(columns), path, row_group_size=row_group_size)
    return path


def bytes_table(ws, path: Path, **more) -> Path:
    ids, datas, labels = zip(*image_rows(ws))
    return write_parquet(path, {"id": list(ids), "image": list(datas), "label": list(labels), **more})


# --- Parquet ------------------------------------------------------------------------------------

def test_parquet_with_image_bytes_gives_the_folders_table(in_ws, tmp_path):
    folder = folder_rows(in_ws)
    table = bytes_table(in_ws, tmp_path / "pool.parquet")
    assert pq.ParquetFile(table).num_row_groups == 4  # 14 rows, 4 to a group: read group by group
    assert rows(score(in_ws, table, "--id-column", "id", "-o", "-")) == folder


def test_parquet_folder_with_relative_paths_and_other_column_names(in_ws, tmp_path):
    """Two files in a folder, paths relative to it, columns named by the config keys."""
    folder = folder_rows(in_ws)
    tables = tmp_path / "tables"
    shutil.copytree(in_ws.pool, tables / "files")
    everything = image_rows(in_ws)
    for part, chunk in (("part-0", everything[:9]), ("part-1", everything[9:])):
        write_parquet(tables / f"{part}.parquet",
                      {"key": [r[0] for r in chunk], "file": [f"files/{r[0]}" for r in chunk],
                       "cls": [r[2] for r in chunk]}, row_group_size=3)
    config = tmp_path / "config.yaml"
    config.write_text(in_ws.config.read_text() + "image_column: file\nid_column: key\n"
                      "label_column: cls\n")
    assert rows(score(in_ws, tables, "-c", config, "-o", "-")) == folder


def test_parquet_ids_default_to_row_numbers(in_ws, tmp_path):
    table = bytes_table(in_ws, tmp_path / "pool.parquet")
    folder = folder_rows(in_ws)
    by_row = rows(score(in_ws, table, "-o", "-"))
    names = sorted(in_ws.images)
    assert [names[int(r["id"])] for r in by_row] == [r["id"] for r in folder]
    assert [r["score"] for r in by_row] == [r["score"] for r in folder]


def test_a_corrupt_image_cell_is_an_error_row_and_the_rest_scores_as_before(in_ws, tmp_path):
    ids, datas, labels = (list(c) for c in zip(*image_rows(in_ws)))
    bad = ids.index("b/img04.png")
    datas[bad] = datas[bad][:20]  # a truncated PNG
    table = write_parquet(tmp_path / "pool.parquet", {"id": ids, "image": datas, "label": labels})
    out = tmp_path / "scores.csv"
    result = score(in_ws, table, "--id-column", "id", "-o", out)
    errors = parse_csv((tmp_path / "scores.csv.errors.csv").read_text())
    assert [e["id"] for e in errors] == ["b/img04.png"]
    assert f"row {bad} of {table}" in errors[0]["error"]
    assert "skipped" in result.stderr
    folder = [r for r in folder_rows(in_ws) if r["id"] != "b/img04.png"]
    without_rank = lambda t: [{k: v for k, v in r.items() if k != "rank"} for r in t]
    assert without_rank(rows(out)) == without_rank(folder)


def test_a_corrupt_row_group_found_mid_run_lists_its_rows_and_the_rest_scores_as_before(in_ws,
                                                                                         tmp_path):
    """The image column of row group 1 is overwritten: opening reads the ids (intact), the run
    finds the group unreadable when it reaches it; its 4 rows go to errors.csv, as unreadable
    files do, and the other rows score as the folder's."""
    table = bytes_table(in_ws, tmp_path / "pool.parquet")
    chunk = pq.ParquetFile(table).metadata.row_group(1).column(1)  # the image column
    assert chunk.path_in_schema == "image"
    start = chunk.dictionary_page_offset or chunk.data_page_offset
    data = bytearray(table.read_bytes())
    data[start:start + chunk.total_compressed_size] = b"\xff" * chunk.total_compressed_size
    table.write_bytes(bytes(data))
    out = tmp_path / "scores.csv"
    result = score(in_ws, table, "--id-column", "id", "-o", out)
    lost = sorted(in_ws.images)[4:8]
    errors = parse_csv((tmp_path / "scores.csv.errors.csv").read_text())
    assert [e["id"] for e in errors] == lost
    assert all(f"cannot read row group 1 of {table}" in e["error"] for e in errors)
    assert "skipped 4 unreadable examples" in result.stderr
    without_rank = lambda t: [{k: v for k, v in r.items() if k != "rank"} for r in t]
    assert without_rank(rows(out)) == without_rank([r for r in folder_rows(in_ws)
                                                    if r["id"] not in lost])


def test_shard_of_a_parquet_pool_is_the_folders_shard(in_ws, tmp_path):
    table = bytes_table(in_ws, tmp_path / "pool.parquet")
    for k in range(2):
        part = rows(score(in_ws, table, "--id-column", "id", "--shard", f"{k}/2", "-o", "-"))
        assert part == folder_rows(in_ws, "--shard", f"{k}/2")
        assert 0 < len(part) < 14


def random_png_table(path: Path, n: int, seed: int, row_group: int) -> Path:
    """n random 6x6 PNGs as a Parquet table (id ex00000..., image bytes) in row groups."""
    rng = np.random.default_rng(seed)
    datas = []
    for _ in range(n):
        buf = io.BytesIO()
        Image.fromarray(rng.integers(0, 256, (6, 6, 3), dtype=np.uint8)).save(buf, "PNG")
        datas.append(buf.getvalue())
    return write_parquet(path, {"id": [f"ex{i:05d}" for i in range(n)], "image": datas}, row_group)


def test_kill_and_resume_on_a_parquet_pool_equal_the_uninterrupted_run(in_ws, tmp_path):
    n = 800
    table = random_png_table(tmp_path / "big.parquet", n, 3, 256)
    full, out = tmp_path / "full.csv", tmp_path / "resumed.csv"
    partial = Path(f"{out}.partial")

    def start(dest, *more):
        return start_score(in_ws.root, table, "-m", "model.pt", "-c", "config.yaml", "-b", "8",
                           "--id-column", "id", "-o", dest, "-q", "--checkpoint-every", "64", *more)
    saved = kill_when_saved(start(out), partial, 200)
    assert 0 < saved < n
    second = start(out, "--resume")
    _, err = second.communicate(timeout=300)
    assert second.returncode == 0, err
    assert "resuming: " in err
    reference = start(full)
    _, err = reference.communicate(timeout=300)
    assert reference.returncode == 0, err
    assert out.read_text() == full.read_text()


# --- Hugging Face datasets ----------------------------------------------------------------------

def hf_dataset(ws, folder: Path, split: str | None = None) -> Path:
    datasets = pytest.importorskip("datasets")
    ids, _, labels = zip(*image_rows(ws))
    features = datasets.Features({"id": datasets.Value("string"), "image": datasets.Image(),
                                  "label": datasets.ClassLabel(names=["a", "b", "c"])})
    ds = datasets.Dataset.from_dict(
        {"id": list(ids), "image": [str(ws.images[i][0]) for i in ids], "label": list(labels)},
        features=features)
    if split is None:
        ds.save_to_disk(str(folder))
    else:
        other = ds.select(range(3))
        datasets.DatasetDict({split: ds, "other": other}).save_to_disk(str(folder))
    return folder


def test_hf_dataset_gives_the_folders_table(in_ws, tmp_path):
    saved = hf_dataset(in_ws, tmp_path / "ds")
    moved = tmp_path / "moved"
    shutil.move(saved, moved)  # the images are in the dataset's own files, not read from the pool
    assert rows(score(in_ws, moved, "--id-column", "id", "-o", "-")) == \
        folder_rows(in_ws)


def test_a_class_label_feature_names_the_classes(in_ws, tmp_path):
    saved = hf_dataset(in_ws, tmp_path / "ds")
    result = runner.invoke(app, ["score", str(saved), "-m", "model.pt", "-c", str(in_ws.config),
                                 "-b", "1", "-q", "--id-column", "id", "-o", "-"])
    assert result.exit_code == 0, result.stderr
    assert rows(result) == folder_rows(in_ws)  # pred and label: a, b, c, as the class folders


def test_hf_dataset_dict_needs_a_split_and_scores_the_one_named(in_ws, tmp_path):
    saved = hf_dataset(in_ws, tmp_path / "dd", split="train")
    assert rows(score(in_ws, saved, "--split", "train", "--id-column", "id", "-o", "-")) == \
        folder_rows(in_ws)
    assert_one_error(score(in_ws, saved, "-o", "-", ok=False), "--split", "no split")
    assert_one_error(score(in_ws, saved, "--split", "test", "-o", "-", ok=False), "'test'",
                     "no such split")


# --- bad tables ---------------------------------------------------------------------------------

def test_a_missing_column_names_it_and_the_columns_there_are(in_ws, tmp_path):
    table = bytes_table(in_ws, tmp_path / "pool.parquet")
    result = score(in_ws, table, "--id-column", "name", "-o", "-", ok=False)
    assert_one_error(result, "no id column 'name' (columns: id, image, label)", "id column")
    result = score(in_ws, table, "--image-column", "img", "-o", "-", ok=False)
    assert_one_error(result, "no image column 'img' (columns: id, image, label)", "image column")
    plain = write_parquet(tmp_path / "plain.parquet", {"id": ["x"], "value": [1.5]})
    assert_one_error(score(in_ws, plain, "-o", "-", ok=False),
                     "no image column 'image' and no text column 'text' (columns: id, value)",
                     "neither")


def test_a_wrongly_typed_column_names_it_and_its_type(in_ws, tmp_path):
    table = bytes_table(in_ws, tmp_path / "pool.parquet", number=list(range(14)),
                        score=[0.5] * 14)
    assert_one_error(score(in_ws, table, "--image-column", "number", "-o", "-", ok=False),
                     "the image column 'number' holds int64", "image type")
    assert_one_error(score(in_ws, table, "--label-column", "score", "-o", "-", ok=False),
                     "the label column 'score' holds double", "label type")


def test_a_file_that_is_not_parquet_is_one_sentence(in_ws, tmp_path):
    table = bytes_table(in_ws, tmp_path / "pool.parquet")
    cut = tmp_path / "cut.parquet"
    cut.write_bytes(table.read_bytes()[:-100])  # the footer is gone
    assert_one_error(score(in_ws, cut, "-o", "-", ok=False),
                     f"table {cut} cannot be read as Parquet", "truncated")


def test_parquet_read_by_two_loader_workers_gives_the_folders_table(in_ws, tmp_path):
    """Each worker opens the file itself (the pool is pickled without its open handles)."""
    table = bytes_table(in_ws, tmp_path / "pool.parquet")
    assert rows(score(in_ws, table, "--id-column", "id", "--workers", "2", "-o", "-")) == \
        folder_rows(in_ws)


TEXTS = ["the cat sat on the mat", "a dog ran fast", "big red bird flew away and then stopped",
         "small", "the blue bird sat on a big mat and then flew away"]


def test_a_text_table_gives_the_jsonl_pools_table(tmp_path):
    pytest.importorskip("transformers")
    import json
    import hf_models
    import torch
    torch.manual_seed(0)
    tok = hf_models.tokenizer(tmp_path / "bert")
    hf_models.bert(len(hf_models.VOCAB)).save_pretrained(tmp_path / "bert")
    tok.save_pretrained(tmp_path / "bert")
    ids, labels = [f"t{i}" for i in range(len(TEXTS))], [i % 3 for i in range(len(TEXTS))]
    (tmp_path / "texts.jsonl").write_text("".join(
        json.dumps({"id": i, "text": t, "label": y}) + "\n" for i, t, y in zip(ids, TEXTS, labels)))
    write_parquet(tmp_path / "texts.parquet", {"id": ids, "sentence": TEXTS, "label": labels}, 2)

    def table(pool, *args):
        result = runner.invoke(app, ["score", str(tmp_path / pool), "-m", str(tmp_path / "bert"),
                                     "-b", "1", "-q", "-o", "-", *args])
        assert result.exit_code == 0, result.stderr
        return rows(result)
    assert table("texts.parquet", "--text-column", "sentence", "--id-column", "id") == \
        table("texts.jsonl")


# --- WebDataset shards --------------------------------------------------------------------------

def write_shards(ws, folder: Path, per_shard: int = 5, spoil: str | None = None) -> list[Path]:
    """The images as samples `KEY.png` (or .jpg, .bmp) + `KEY.cls`, `per_shard` to a tar; the
    member of `spoil` holds a cut PNG. Also `manifest.csv`: the same pool as files, ids as the
    folder pool's (the members' names)."""
    import tarfile
    folder.mkdir()
    everything = image_rows(ws)
    shards = []
    for s in range(0, len(everything), per_shard):
        shards.append(folder / f"pool-{s // per_shard:06d}.tar")
        with tarfile.open(shards[-1], "w") as tar:
            for rel, data, label in everything[s:s + per_shard]:
                key, ext = rel.rsplit(".", 1)
                if rel == spoil:
                    data = data[:20]
                for name, content in ((f"{key}.{ext}", data), (f"{key}.cls", str(label).encode())):
                    info = tarfile.TarInfo(name)
                    info.size = len(content)
                    tar.addfile(info, io.BytesIO(content))
    with open(folder / "manifest.csv", "w") as f:
        f.write("id,path,label\n" + "".join(f"{rel},{ws.images[rel][0]},{label}\n"
                                            for rel, _, label in everything))
    return shards


def test_shards_by_brace_pattern_and_by_list_give_the_files_table(in_ws, tmp_path):
    shards = write_shards(in_ws, tmp_path / "wds")
    assert len(shards) == 3
    files = rows(score(in_ws, tmp_path / "wds" / "manifest.csv", "-o", "-"))
    assert rows(score(in_ws, tmp_path / "wds" / "pool-{000000..000002}.tar", "-o", "-")) == files
    assert rows(score(in_ws, *shards, "-o", "-")) == files
    part = rows(score(in_ws, tmp_path / "wds" / "pool-{000000..000002}.tar", "--shard", "1/2",
                      "-o", "-"))
    assert part == rows(score(in_ws, tmp_path / "wds" / "manifest.csv", "--shard", "1/2", "-o", "-"))
    assert 0 < len(part) < 14


def test_a_corrupt_member_is_an_error_row_and_the_rest_scores_as_before(in_ws, tmp_path):
    write_shards(in_ws, tmp_path / "wds", spoil="c/img05.jpg")
    out = tmp_path / "scores.csv"
    score(in_ws, tmp_path / "wds" / "pool-{000000..000002}.tar", "-o", out)
    errors = parse_csv((tmp_path / "scores.csv.errors.csv").read_text())
    assert [e["id"] for e in errors] == ["c/img05.jpg"]
    assert "pool-000002.tar" in errors[0]["error"] and "no image format" in errors[0]["error"]
    files = [r for r in rows(score(in_ws, tmp_path / "wds" / "manifest.csv", "-o", "-"))
             if r["id"] != "c/img05.jpg"]
    without_rank = lambda t: [{k: v for k, v in r.items() if k != "rank"} for r in t]
    assert without_rank(rows(out)) == without_rank(files)


def test_bad_shards_are_one_sentence(in_ws, tmp_path):
    shards = write_shards(in_ws, tmp_path / "wds")
    pattern = tmp_path / "wds" / "pool-{000000..000003}.tar"
    assert_one_error(score(in_ws, pattern, "-o", "-", ok=False),
                     f"shard {tmp_path / 'wds' / 'pool-000003.tar'} does not exist", "missing shard")
    cut = tmp_path / "cut.tar"
    for at, culprit in ((1200, f"shard {cut} is truncated or corrupt after byte 1024"),  # a header
                        (560, f"shard {cut}: member a/deep/img09.png is truncated")):  # a member
        cut.write_bytes(shards[0].read_bytes()[:at])
        assert_one_error(score(in_ws, cut, "-o", "-", ok=False), culprit, f"cut at {at}")
    again = tmp_path / "again.tar"
    again.write_bytes(shards[0].read_bytes())
    assert_one_error(score(in_ws, shards[0], again, "-o", "-", ok=False),
                     "has the sample a/deep/img09, which another shard has too", "same key twice")


def select(ws, table, *args) -> "Result":
    result = runner.invoke(app, ["select", str(table), "-n", "4", "-q", *map(str, args)])
    assert result.exit_code == 0, result.stderr + result.stdout
    return result


def test_the_same_images_as_files_and_as_shards_have_the_same_ids_so_one_exclusion_list_serves_both(
        in_ws, tmp_path):
    """Issue 35 item 9: a shard sample's id is its image member's name, as a folder's file's id is
    its path under the folder; a list written from either table excludes the same examples."""
    write_shards(in_ws, tmp_path / "wds")
    shards = tmp_path / "wds" / "pool-{000000..000002}.tar"
    folder, sharded = tmp_path / "folder.csv", tmp_path / "shards.csv"
    score(in_ws, "pool", "--labels-from-folders", "-o", folder)
    score(in_ws, shards, "-o", sharded)
    assert rows(sharded) == rows(folder)
    for written_from, other in ((folder, shards), (sharded, "pool")):
        done = tmp_path / f"done-{written_from.stem}.txt"
        select(in_ws, written_from, "-f", "ids", "-o", done)
        left = rows(score(in_ws, other, "--exclude", done, "-o", "-"))
        assert len(left) == 14 - 4
        assert not {r["id"] for r in left} & set(done.read_text().split())


def test_shard_and_parquet_tables_name_each_rows_source_for_paths_and_the_contact_sheet(
        in_ws, tmp_path):
    """Issue 35 item 10: a shard row's `path` is SHARD#MEMBER, a Parquet (or saved dataset's Arrow)
    row with the image's bytes FILE#COLUMN[ROW]; `-f paths` writes them and the contact sheet
    reads the images there: the sheet is the folder table's, pixel for pixel (same ids, scores
    and images)."""
    write_shards(in_ws, tmp_path / "wds")
    parquet = bytes_table(in_ws, tmp_path / "pool.parquet")
    dataset = hf_dataset(in_ws, tmp_path / "ds")
    arrow, = dataset.glob("*.arrow")
    folder = tmp_path / "folder.csv"
    score(in_ws, "pool", "--labels-from-folders", "-o", folder)
    expected = tmp_path / "folder.png"
    select(in_ws, folder, "--contact-sheet", expected, "-o", tmp_path / "folder-batch.csv")
    members = {rel: n for n, rel in enumerate(sorted(in_ws.images))}  # id -> its sample's number
    for name, pool, args, source in (
            ("shards", tmp_path / "wds" / "pool-{000000..000002}.tar", [],
             lambda i: f"{tmp_path / 'wds' / f'pool-{members[i] // 5:06d}.tar'}#{i}"),
            ("parquet", parquet, ["--id-column", "id"],
             lambda i: f"{parquet}#image[{members[i]}]"),
            ("dataset", dataset, ["--id-column", "id"], lambda i: f"{arrow}#image[{members[i]}]")):
        table = tmp_path / f"{name}.csv"
        score(in_ws, pool, *args, "-o", table)
        written = parse_csv(table.read_text())
        assert [r["path"] for r in written] == [source(r["id"]) for r in written], name
        paths = select(in_ws, table, "-f", "paths").stdout.splitlines()
        assert paths == [source(i) for i in select(in_ws, table, "-f", "ids").stdout.splitlines()]
        sheet = tmp_path / f"{name}.png"
        result = select(in_ws, table, "--contact-sheet", sheet, "-o", tmp_path / f"{name}-batch.csv")
        assert "could not be read" not in result.stderr, name
        assert np.array_equal(np.asarray(Image.open(sheet)), np.asarray(Image.open(expected))), name
