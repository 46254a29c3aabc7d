"""Bounds and hostile pools (hostile-inputs report, BAD-9/10/11/12/16/19/20/22/27): FIFOs named
like images, symlinked and very deep folders, long CSV fields, bare CRs, coerced labels, stripped
stdin paths, hostile image settings, --workers, and a truncated JPEG under --decode gpu."""
from __future__ import annotations

import csv
import io
import json
import os
import shutil
import signal
import subprocess
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from typer.testing import CliRunner

from alcli.cli import app
from alcli.errors import CheckpointError, ConfigError, PoolError
from alcli.files import hf
from alcli.files.config import MAX_SIDE, Transform, load_settings, usable_cpus
from alcli.pools import open_pool
from alcli.pools.common import PoolOptions, collate
from alcli.pools.text import from_text_file
from alcli.selection.export import contact_sheet
from cli_errors import assert_one_error
from conftest import parse_csv, score_in

runner = CliRunner()
NORM = Transform(normalize={"mean": [0.5, 0.5, 0.5], "std": [0.25, 0.25, 0.25]})


def opts(**kw):
    return PoolOptions(**{"transform": NORM, "channels": 3, **kw})


def text_opts():
    return PoolOptions(tokenizer=lambda: None)  # as the report's reproducer: no model needed


@contextmanager
def deadline(seconds: int):
    """Fail instead of hanging (a blocked open() on a FIFO is interrupted by the alarm)."""
    def expired(*_):
        raise TimeoutError(f"still blocked after {seconds} s")
    old = signal.signal(signal.SIGALRM, expired)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def copy_images(workspace, folder: Path, n: int, skip: int = 0) -> list[str]:
    """n of the workspace's PNG images (after `skip`) copied into `folder`; their names."""
    folder.mkdir(parents=True, exist_ok=True)
    pngs = [p for p, _ in workspace.images.values() if p.suffix == ".png"][skip:skip + n]
    for path in pngs:
        shutil.copy(path, folder / path.name)
    return [path.name for path in pngs]


# --- BAD-9: FIFOs and other non-regular files ----------------------------------------------------

def test_a_fifo_named_like_an_image_is_an_error_row_not_a_hang(in_ws, tmp_path):
    names = copy_images(in_ws, tmp_path / "ff", 4)
    os.mkfifo(tmp_path / "ff" / "pipe.png")
    out = tmp_path / "ff.csv"
    with deadline(60):  # no DataLoader workers on the CPU: a blocked open() would be in this process
        result = runner.invoke(app, ["score", str(tmp_path / "ff"), "-m", "model.pt", "-c",
                                     "config.yaml", "-s", "margin", "-q", "-o", str(out)])
    assert result.exit_code == 0, result.stderr
    assert sorted(r["id"] for r in parse_csv(out.read_text())) == sorted(names)
    errors = parse_csv(Path(f"{out}.errors.csv").read_text())
    assert [e["id"] for e in errors] == ["pipe.png"]
    assert "not a regular file but a FIFO" in errors[0]["error"]


@pytest.mark.parametrize("decode", ["cpu", "gpu"])
def test_fifo_items_and_pool_files_are_never_opened(tmp_path, decode):
    os.mkfifo(tmp_path / "pipe.jpg")
    os.mkdir(tmp_path / "dir.jpg")
    pool = open_pool(str(tmp_path), opts(decode=decode))
    with deadline(20):
        items = {pool.ids[i]: pool[i] for i in range(len(pool))}
    assert "not a regular file but a FIFO" in items["pipe.jpg"].error
    assert "not a regular file but a directory" in items["dir.jpg"].error
    os.mkfifo(tmp_path / "pipe.csv")
    with deadline(20), pytest.raises(PoolError, match="pipe.csv cannot be read .not a regular file but a FIFO"):
        open_pool(str(tmp_path / "pipe.csv"), opts())


def test_contact_sheet_marks_a_fifo_unreadable(tmp_path):
    Image.new("RGB", (8, 8)).save(tmp_path / "ok.png")
    os.mkfifo(tmp_path / "pipe.png")
    rows = [{"id": "ok.png", "score": 1.0}, {"id": "pipe.png", "score": 0.5}]
    with deadline(20):
        failed = contact_sheet(rows, str(tmp_path), str(tmp_path / "sheet.png"))
    assert failed == ["pipe.png"]


# --- BAD-10: image sizes bounded, hostile preprocessor_config.json --------------------------------

@pytest.mark.parametrize("content, needle", [
    ({"do_resize": True, "size": 3.5}, "size must be a positive integer"),
    ({"size": {"height": "abc", "width": 8}}, "size must be a positive integer"),
    ({"image_mean": "abc", "image_std": [0.5]}, "image_mean must be a number or a list of numbers"),
    ([1, 2], "must hold a JSON object of image settings"),
    ({"rescale_factor": "x"}, "rescale_factor must be a number"),
    ({"size": {"height": 100000, "width": 100000}}, f"size .* is over alcli's maximum of {MAX_SIDE}"),
    ({"do_center_crop": True, "crop_size": 5000}, f"crop_size 5000 is over alcli's maximum of {MAX_SIDE}"),
    ({"image_mean": [0.5, 0.5], "image_std": [0.5, 0]}, "image_std positive"),
    ({"size": {"longest": 3}}, "neither height/width nor shortest_edge"),
])
def test_hostile_image_settings_are_one_sentence_naming_file_and_key(tmp_path, content, needle):
    (tmp_path / "preprocessor_config.json").write_text(json.dumps(content))
    with pytest.raises(CheckpointError, match=needle) as err:
        hf.image_transform(tmp_path)
    assert "preprocessor_config.json" in str(err.value) and len(str(err.value)) < 400


def test_good_image_settings_still_read(tmp_path):
    (tmp_path / "preprocessor_config.json").write_text(json.dumps(
        {"size": {"height": 16, "width": MAX_SIDE}, "do_center_crop": True, "crop_size": {"shortest_edge": 8},
         "rescale_factor": 1 / 255, "image_mean": 0.5, "image_std": [0.25]}))
    t = hf.image_transform(tmp_path)
    assert (t.resize, t.center_crop, t.normalize) == ([16, MAX_SIDE], 8, {"mean": [0.5], "std": [0.25]})


def test_hostile_preprocessor_config_through_the_cli(tmp_path):
    pytest.importorskip("transformers")
    import hf_models
    hf_models.vit().save_pretrained(tmp_path / "hfimg")
    Image.new("RGB", (16, 16)).save(tmp_path / "x.png")
    (tmp_path / "hfimg" / "preprocessor_config.json").write_text('{"do_resize": true, "size": 3.5}')
    result = score_in(tmp_path, "x.png", "-m", "hfimg", "-s", "margin", ok=False)
    assert_one_error(result, "preprocessor_config.json: size", "size 3.5")


@pytest.mark.parametrize("key", ["resize", "center_crop"])
def test_config_transform_sizes_are_bounded(tmp_path, key):
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(f"transform: {{{key}: [100000, 100000]}}\n")
    with pytest.raises(ConfigError, match=f"key 'transform.{key}' in .*cfg.yaml must be at most "
                                          f"{MAX_SIDE} pixels per side"):
        load_settings(cfg)
    cfg.write_text(f"transform: {{{key}: {MAX_SIDE}}}\n")
    assert getattr(load_settings(cfg).transform, key) == MAX_SIDE


# --- BAD-11: --workers bounded by the CPUs ---------------------------------------------------------

def test_workers_above_the_cpu_count_are_refused(in_ws):
    # a pool that does not exist: were the bound gone, this would fail there instead of forking
    result = score_in(in_ws.root, "no-such-pool", "-m", "model.pt", "-c", "config.yaml",
                      "--workers", "100000", ok=False)
    assert_one_error(result, f"option --workers must be at most the {usable_cpus()} CPUs", "workers")
    assert load_settings(overrides={"workers": usable_cpus()}).workers == usable_cpus()


# --- BAD-12 / BAD-20: symlinked folders, link loops, deep trees ----------------------------------

@pytest.fixture
def sym(workspace, tmp_path):
    """The report's layout: sym/a holds images, sym/b is a link to ../real_b."""
    a = copy_images(workspace, tmp_path / "sym" / "a", 6)
    b = copy_images(workspace, tmp_path / "real_b", 5, skip=6)
    os.symlink("../real_b", tmp_path / "sym" / "b")
    return tmp_path / "sym", a, b


def test_symlinked_class_folders_are_followed(sym):
    root, a, b = sym
    pool = open_pool(str(root), opts(labels_from_folders=True))
    assert pool.ids == sorted([f"a/{n}" for n in a] + [f"b/{n}" for n in b])
    assert pool.classes == ["a", "b"]
    assert [pool[i].label for i in range(len(pool))] == [0] * len(a) + [1] * len(b)


def test_link_loops_neither_hang_nor_duplicate(sym):
    root, a, b = sym
    os.symlink(".", root / "loop")          # back to the pool itself
    os.symlink("..", root / "a" / "up")     # back to a folder above
    os.symlink(root / "a", root / "b" / "side")  # a folder elsewhere: followed, as find -L does
    pool = open_pool(str(root), opts(labels_from_folders=True))
    expected = [f"a/{n}" for n in a] + [f"b/{n}" for n in b] + [f"b/side/{n}" for n in a]
    assert pool.ids == sorted(expected)
    assert pool.classes == ["a", "b"]  # `loop` is the pool itself, not a class


def test_a_1100_level_folder_tree_is_walked(workspace, tmp_path):
    deep = tmp_path / "deep"
    deep.mkdir()
    for _ in range(1100):  # as the reproducer: mkdir d && cd d (os.makedirs recurses too)
        deep = deep / "d"
        os.mkdir(deep)
    copy_images(workspace, deep, 1)
    pool = open_pool(str(tmp_path / "deep"), opts())
    assert len(pool) == 1 and pool.ids[0].count("/") == 1100 and pool[0].error is None
    for f in os.listdir(deep):  # removed here: pytest's cleanup (shutil.rmtree) recurses
        os.remove(deep / f)
    while deep != tmp_path:
        os.rmdir(deep)
        deep = deep.parent


# --- BAD-20 / BAD-16: long CSV fields and headers --------------------------------------------------

def test_a_200k_char_csv_header_and_text_read(workspace, tmp_path):
    image = next(iter(workspace.images.values()))[0]
    wide = tmp_path / "wide.csv"
    wide.write_text(f"path,{'x' * 200_000}\n{image},1\n")
    assert len(open_pool(str(wide), opts())) == 1
    no_path = tmp_path / "nopath.csv"
    no_path.write_text(f"file,{'x' * 200_000}\n{image},1\n")
    with pytest.raises(PoolError, match="has no 'path' column") as err:
        open_pool(str(no_path), opts())
    assert len(str(err.value)) < 400
    long = tmp_path / "long.csv"
    long.write_text("id,text\n1,hi\n2," + "word " * 40000 + "\n")
    pool = from_text_file(str(long), text_opts())
    assert pool.ids == ["1", "2"] and len(pool.texts[1]) == 200_000


def test_a_field_over_the_limit_is_one_sentence_naming_file_and_line(workspace, tmp_path):
    image = next(iter(workspace.images.values()))[0]
    (tmp_path / "m.csv").write_text(f"path,note\n{image},short\n{image},{'y' * 5000}\n")
    (tmp_path / "t.csv").write_text(f"text\nshort\n{'y' * 5000}\n")
    old = csv.field_size_limit(1000)  # stands in for CSV_FIELD_LIMIT (64 MiB)
    try:
        with pytest.raises(PoolError, match=r"manifest .*m.csv line 3 cannot be read as CSV"):
            open_pool(str(tmp_path / "m.csv"), opts())
        with pytest.raises(PoolError, match=r"manifest .*t.csv line 3 cannot be read as CSV"):
            from_text_file(str(tmp_path / "t.csv"), text_opts())
    finally:
        csv.field_size_limit(old)


# --- BAD-16: .txt lines as wc -l and sed count them -------------------------------------------------

def test_txt_ids_are_sed_line_numbers_and_a_bare_cr_stays_in_its_text(tmp_path):
    t = tmp_path / "t.txt"
    t.write_bytes("one\ntwo\rthree\nfour\n\n  \ncrlf\r\nlast\u2028line".encode())
    pool = from_text_file(str(t), text_opts())
    assert list(zip(pool.ids, pool.texts)) == [
        ("1", "one"), ("2", "two\rthree"), ("3", "four"), ("6", "crlf"), ("7", "last\u2028line")]
    for id_, text in zip(pool.ids, pool.texts):
        line = subprocess.run(["sed", "-n", f"{id_}p", str(t)], capture_output=True).stdout
        assert line.decode().rstrip("\n").removesuffix("\r") == text
    wc = subprocess.run(["wc", "-l"], stdin=open(t, "rb"), capture_output=True, text=True).stdout
    assert int(wc) == 6  # the last line has no newline: sed still prints it as line 7


# --- BAD-22: JSONL labels are integers, not coerced ------------------------------------------------

def test_jsonl_bool_and_float_labels_are_refused(workspace, tmp_path):
    image = str(next(iter(workspace.images.values()))[0])
    m = tmp_path / "m.jsonl"
    for bad, shown in ((True, "true"), (2.7, "2.7"), (2.0, "2.0")):
        m.write_text(json.dumps({"path": image, "id": "ok", "label": 1}) + "\n"
                     + json.dumps({"path": image, "id": "bad", "label": bad}) + "\n")
        with pytest.raises(PoolError, match=f"m.jsonl line 2: label {shown} is not a class index"):
            open_pool(str(m), opts())
    m.write_text(json.dumps({"path": image, "label": 3}) + "\n"
                 + json.dumps({"path": image, "id": "s", "label": "2"}) + "\n")
    pool = open_pool(str(m), opts())
    assert [pool[0].label, pool[1].label] == [3, 2]


def test_jsonl_bool_label_through_the_cli(in_ws, tmp_path):
    image = str(next(iter(in_ws.images.values()))[0])
    (tmp_path / "m.jsonl").write_text(json.dumps({"path": image, "label": True}) + "\n")
    result = score_in(in_ws.root, str(tmp_path / "m.jsonl"), "-m", "model.pt", "-c", "config.yaml",
                      ok=False)
    assert_one_error(result, "m.jsonl line 1: label true is not a class index", "label true")


# --- BAD-27: stdin paths as given ------------------------------------------------------------------

def test_stdin_paths_keep_their_spaces_and_a_bare_cr(in_ws, tmp_path, monkeypatch):
    source = next(iter(in_ws.images.values()))[0]
    monkeypatch.chdir(tmp_path)  # the paths are relative, as the report's
    for name in (" space .png", "cr\rname.png", "plain.png"):
        shutil.copy(source, tmp_path / name)
    listing = " space .png\n\ncr\rname.png\r\nplain.png\n"
    result = runner.invoke(app, ["score", "-", "-m", str(in_ws.model), "--arch", "tinynet:TinyNet",
                                 "-c", str(in_ws.config), "-s", "margin", "-q", "-o", "-",
                                 "-f", "jsonl"], input=listing.encode())
    assert result.exit_code == 0, result.stderr
    assert sorted(json.loads(line)["id"] for line in result.stdout.splitlines()) == sorted(
        [" space .png", "cr\rname.png", "plain.png"])
    pool = open_pool("-", opts(), stdin=io.StringIO(" a.png \n\n b.png\r\n"))
    assert pool.ids == [" a.png ", " b.png"]


# --- BAD-19: a truncated JPEG under --decode gpu ---------------------------------------------------

@pytest.fixture
def jpegs(tmp_path):
    rng = np.random.default_rng(1)
    folder = tmp_path / "jp"
    folder.mkdir()
    for i in range(5):
        Image.fromarray(rng.integers(0, 256, (6, 6, 3), dtype=np.uint8)).save(folder / f"im{i}.jpg")
    data = (folder / "im0.jpg").read_bytes()
    (folder / "a_cut.jpg").write_bytes(data[:len(data) // 2])  # first in order: the pre-flight probe meets it
    return folder


def test_decode_gpu_lists_a_truncated_jpeg_as_an_error_row(in_ws, jpegs, tmp_path):
    out = tmp_path / "jp.csv"
    result = runner.invoke(app, ["score", str(jpegs), "-m", "model.pt", "-c", "config.yaml",
                                 "--decode", "gpu", "--device", "cpu", "-s", "margin", "-b", "4",
                                 "-q", "-o", str(out)])
    assert result.exit_code == 0, result.stderr
    assert sorted(r["id"] for r in parse_csv(out.read_text())) == [f"im{i}.jpg" for i in range(5)]
    errors = parse_csv(Path(f"{out}.errors.csv").read_text())
    assert [e["id"] for e in errors] == ["a_cut.jpg"]
    assert errors[0]["error"].startswith(f"cannot read image {jpegs / 'a_cut.jpg'} (")


def test_decoded_batch_of_only_bad_jpegs_is_all_errors(jpegs):
    from alcli.pools.common import decoded
    pool = open_pool(str(jpegs), opts(decode="gpu"))
    batch = decoded(collate([pool[0]]), pool, torch.device("cpu"))
    assert batch.ids == [] and [e[0] for e in batch.errors] == ["a_cut.jpg"]
    batch = decoded(collate([pool[i] for i in range(3)]), pool, torch.device("cpu"))
    assert batch.ids == ["im0.jpg", "im1.jpg"] and batch.inputs.shape == (2, 3, 6, 6)
    assert batch.labels.shape == (2,) and batch.paths == [str(jpegs / "im0.jpg"), str(jpegs / "im1.jpg")]
