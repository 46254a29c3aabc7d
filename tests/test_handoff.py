"""Issue 22, hand-off and API: what a batch leaves alcli as (NUL-terminated paths and ids, contact
sheet captions, Label Studio image references, the terminal summary), what --exclude removes, and
the Python API's answers to odd rows, ids and arguments. Each test replays a reproducer from the
hostile-input report (BAD-13, 14, 17, 18, 20, 25, 28) on real files and processes."""
from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from PIL import Image, ImageDraw
from typer.testing import CliRunner

import alcli
from alcli.cli import app
from alcli.errors import AlcliError
from alcli.selection.export import _fit, _font, image_ref
from alcli.terminal import Reporter
from cli_errors import assert_one_error
from conftest import parse_csv

runner = CliRunner()
EVIL = "evil\nREADME.png"


def cli(*args):
    return runner.invoke(app, [str(a) for a in args])


def ok(result):
    assert result.exit_code == 0, result.stderr + result.stdout
    return result


# --- BAD-13: -f paths / -f ids and names holding a newline ----------------------------------------

@pytest.fixture
def nl_pool(in_ws, tmp_path):
    """nl/: two images and one whose file name holds a newline; scored into nl.csv."""
    pool = tmp_path / "nl"
    pool.mkdir()
    images = sorted(p for p, _ in in_ws.images.values() if p.suffix == ".png")[:3]
    for src, name in zip(images, ("ok0.png", "ok1.png", EVIL)):
        shutil.copy(src, pool / name)
    table = tmp_path / "nl.csv"
    ok(cli("score", pool, "-m", "model.pt", "-c", "config.yaml", "-s", "entropy", "-q", "-o",
           table))
    return pool, table


def test_score_refuses_a_name_with_a_newline_before_scoring_and_writes_nul_records_with_0(
        in_ws, nl_pool, tmp_path):
    pool, _ = nl_pool
    for fmt, shown in (("paths", repr(f"{pool}/{EVIL}")), ("ids", repr(EVIL))):
        result = cli("score", pool, "-m", "model.pt", "-c", "config.yaml", "-q", "-f", fmt)
        assert_one_error(result, "pass -0/--null", f"-f {fmt} without -0")
        assert shown in result.stderr and "a newline" in result.stderr
        out = tmp_path / f"refused.{fmt}"
        result = cli("score", pool, "-m", "model.pt", "-c", "config.yaml", "-q", "-f", fmt,
                     "-o", out)
        assert_one_error(result, "pass -0/--null", f"-f {fmt} -o without -0")
        assert not out.exists() and not Path(f"{out}.partial").exists()  # refused before scoring
    records = ok(cli("score", pool, "-m", "model.pt", "-c", "config.yaml", "-q", "-f", "ids",
                     "-0")).stdout
    assert records.endswith("\0") and "\n" not in records.replace(EVIL, "")
    assert sorted(records.split("\0")[:-1]) == sorted(["ok0.png", "ok1.png", EVIL])
    paths = ok(cli("score", pool, "-m", "model.pt", "-c", "config.yaml", "-q", "-f", "paths",
                   "-0")).stdout.split("\0")
    assert paths[-1] == "" and all(Path(p).is_file() for p in paths[:-1]) and len(paths) == 4


def test_select_and_merge_write_nul_records_with_0_and_refuse_newlines_without(
        in_ws, nl_pool, tmp_path):
    pool, table = nl_pool
    for fmt in ("ids", "paths"):
        assert_one_error(cli("select", table, "-n", 3, "-f", fmt), "pass -0/--null", fmt)
    ids = ok(cli("select", table, "-n", 3, "-f", "ids", "-0")).stdout
    assert sorted(ids.split("\0")[:-1]) == sorted(["ok0.png", "ok1.png", EVIL])
    assert_one_error(cli("select", table, "-n", 3, "-0"), "-f csv", "-0 with csv")
    # a NUL inside an id cannot be a NUL-terminated record either
    nul = tmp_path / "nul.csv"
    nul.write_text("rank,id,score\n1,a\x00b,0.5\n")
    assert_one_error(cli("select", nul, "-n", 1, "-f", "ids", "-0"), "a NUL", "NUL in an id")
    # merge writes the same records
    parts = [tmp_path / f"part{k}.csv" for k in range(2)]
    for k, part in enumerate(parts):
        ok(cli("score", pool, "-m", "model.pt", "-c", "config.yaml", "-s", "entropy", "-q",
               "--shard", f"{k}/2", "-o", part))
    assert_one_error(cli("merge", *parts, "-f", "ids", "-o", "-"), "pass -0/--null", "merge")
    merged = ok(cli("merge", *parts, "-f", "ids", "-0", "-o", "-")).stdout
    assert merged == ids


def test_xargs_0_gets_each_selected_file_whole(in_ws, nl_pool):
    """The README's pipeline, NUL-separated: `alcli select -f paths -0 | xargs -0 ...`."""
    _, table = nl_pool
    select = subprocess.run([sys.executable, "-m", "alcli", "select", str(table), "-n", "3",
                             "-f", "paths", "-0"], capture_output=True, cwd=in_ws.root, timeout=120,
                            env={**os.environ, "PYTHONWARNINGS": "ignore"})
    assert select.returncode == 0, select.stderr
    found = subprocess.run(["xargs", "-0", "-n1", "sh", "-c", 'test -f "$1" && echo found', "sh"],
                           input=select.stdout, capture_output=True, timeout=60)
    assert found.stdout.decode().split() == ["found"] * 3, found


# --- BAD-14: the contact sheet and very long ids --------------------------------------------------

def test_contact_sheet_of_two_30000_character_ids(in_ws, tmp_path):
    image = next(p for p, _ in in_ws.images.values() if p.suffix == ".png")
    ids = ["L" * 30000 + str(i) for i in range(2)]
    table = tmp_path / "long.csv"
    with open(table, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["rank", "id", "score", "path"])
        w.writerows([[i + 1, id_, 1.0 - i / 10, image] for i, id_ in enumerate(ids)])
    sheet = tmp_path / "sheet.png"
    ok(cli("select", table, "-n", 2, "--contact-sheet", sheet, "-f", "ids", "-o", tmp_path / "b"))
    with Image.open(sheet) as im:
        assert im.format == "PNG"
    draw, font = ImageDraw.Draw(Image.new("RGB", (8, 8))), _font()
    caption = _fit(draw, ids[1], font, 160)
    assert caption.startswith("...L") and caption.endswith("L1")
    assert draw.textlength(caption, font=font) <= 160
    assert len(caption) > 10  # as much of the tail as fits, not just "..."
    assert _fit(draw, "short.png", font, 160) == "short.png"


# --- BAD-17 / BAD-20: --exclude -------------------------------------------------------------------

def test_one_exclusion_entry_removes_one_row_the_one_with_that_id(in_ws, tmp_path, monkeypatch):
    coll = tmp_path / "coll"
    (coll / "imgs" / "imgs").mkdir(parents=True)
    images = [p for p, _ in in_ws.images.values() if p.suffix == ".png"]
    for src, name in zip(images, ("imgs/a.png", "imgs/imgs/a.png", "imgs/c.png")):
        shutil.copy(src, coll / name)
    table = coll / "s.csv"
    ok(cli("score", coll / "imgs", "-m", "model.pt", "-c", "config.yaml", "-q", "-o", table,
           "--no-embeddings"))
    monkeypatch.chdir(coll)
    (coll / "labeled.txt").write_text("imgs/a.png\n")  # the id of one row, the file of the other
    result = ok(cli("select", table, "-n", 3, "--exclude", "labeled.txt", "-f", "ids"))
    assert sorted(result.stdout.split()) == ["a.png", "c.png"]
    assert "the entry 'imgs/a.png' of exclusions file labeled.txt is the id of one row and the " \
           "file of another (id 'a.png'); only the row with that id is excluded" in result.stderr
    (coll / "by_file.txt").write_text(f"{coll}/imgs/a.png\n")  # no row has this id: the file
    result = ok(cli("select", table, "-n", 3, "--exclude", "by_file.txt", "-f", "ids"))
    assert sorted(result.stdout.split()) == ["c.png", "imgs/a.png"]
    assert "is the id of one row" not in result.stderr


def test_exclusions_nested_100000_deep_are_one_sentence(in_ws, tmp_path):
    table = tmp_path / "t.csv"
    table.write_text("rank,id,score\n1,a,0.5\n2,b,0.4\n")
    deep = "[" * 100000 + "]" * 100000
    (tmp_path / "ex.json").write_text(deep)
    (tmp_path / "ex.jsonl").write_text('{"id": "a"}\n' + deep + "\n")
    result = cli("select", table, "-n", 1, "--exclude", tmp_path / "ex.json")
    assert_one_error(result, "ex.json: JSON arrays or objects nested too deeply", "json")
    result = cli("select", table, "-n", 1, "--exclude", tmp_path / "ex.jsonl")
    assert_one_error(result, "ex.jsonl, line 2: JSON arrays or objects nested too deeply", "jsonl")


# --- BAD-18: rich markup in ids -------------------------------------------------------------------

def test_terminal_summary_prints_markup_in_ids_as_text(capsys, monkeypatch):
    monkeypatch.setenv("FORCE_COLOR", "1")  # rich's Console(force_terminal=True), from the env
    monkeypatch.setenv("COLUMNS", "200")
    r = Reporter()
    r.terminal = True  # as on a terminal: the rich table, not plain lines
    top = [{"rank": 1, "id": "a[/b].png", "score": 0.5, "pred": 1},
           {"rank": 2, "id": "[bold]x[/bold].png", "score": 0.25, "pred": 0}]
    r.summary({"examples": 2, "seconds": 1.0, "per_second": 2.0, "device": "cpu[/x]",
               "strategy": "margin", "method": None}, top)
    err = capsys.readouterr().err
    assert "a[/b].png" in err and "[bold]x[/bold].png" in err and "cpu[/x]" in err
    assert "\x1b[" in err  # rendered for a terminal


def test_inspect_prints_a_model_path_with_markup_as_text(in_ws, tmp_path):
    model = tmp_path / "m[" / "x].pt"
    model.parent.mkdir()
    shutil.copy(in_ws.model, model)
    result = ok(cli("inspect", "-m", model, "-c", "config.yaml"))
    assert f"{model}: " in result.stdout


# --- BAD-25: --image-root -------------------------------------------------------------------------

def test_image_root_normalises_ids_and_refuses_those_leaving_it():
    assert image_ref("a/./b//c.png", "/srv/pool") == "/srv/pool/a/b/c.png"
    assert image_ref("a/../b.png", "http://h/pool") == "http://h/pool/b.png"
    assert image_ref("x y.png", "http://h/data/local-files/?d=pool") == \
        "http://h/data/local-files/?d=pool/x%20y.png"
    for bad in ("../hp/ok01.png", "../../w/..", "a/../../x.png"):
        for root in ("http://h/data/local-files/?d=pool", "/srv/pool"):
            with pytest.raises(ValueError, match=f"the id '{bad}' goes above the image root"):
                image_ref(bad, root)
    for root in ("http://h/files/", "/srv/pool"):
        with pytest.raises(ValueError, match="'/abs/x.png' is an absolute path"):
            image_ref("/abs/x.png", root)


def test_labelstudio_tasks_refuse_an_id_outside_the_image_root(tmp_path):
    table = tmp_path / "t.csv"
    table.write_text("rank,id,score\n1,ok.png,0.5\n2,../hp/ok00.png,0.4\n")
    out = tmp_path / "tasks.json"
    result = cli("select", table, "-n", 2, "-f", "labelstudio", "--image-root", "/srv/pool",
                 "-o", out)
    assert_one_error(result, "--image-root /srv/pool: the id '../hp/ok00.png' goes above", "path")
    assert not out.exists()
    result = cli("select", table, "-n", 1, "-f", "labelstudio", "--image-root", "http://h/pool")
    assert json.loads(ok(result).stdout)[0]["data"]["image"] == "http://h/pool/ok.png"
    # an exclusion list is still matched with such ids in the table
    (tmp_path / "done.txt").write_text("http://h/pool/ok.png\n")
    result = ok(cli("select", table, "-n", 2, "--image-root", "http://h/pool", "--exclude",
                    tmp_path / "done.txt", "-f", "ids"))
    assert result.stdout.split() == ["../hp/ok00.png"]


# --- BAD-28: the Python API -----------------------------------------------------------------------

@pytest.fixture(scope="module")
def scored():
    torch.manual_seed(0)
    x = torch.rand(20, 4)
    model = torch.nn.Linear(4, 3)
    rows = alcli.score_pool((x, None, [f"r{i}" for i in range(20)]), model, embeddings=True,
                            strategy="margin")
    assert rows.embeddings is not None
    return rows, x, model


def test_select_refuses_an_exclude_that_is_no_set_file_or_list(scored):
    rows, _, _ = scored
    for bad in (5, 1.5, b"r1"):
        with pytest.raises(AlcliError, match=r"^exclude= takes ids: a set, list, tuple or other "):
            alcli.select(rows, 5, exclude=bad)
    assert "r0" not in [r["id"] for r in alcli.select(rows, 20, exclude={"r0"})]


def test_diverse_selection_names_a_row_without_an_embedding(scored):
    rows, _, _ = scored
    renamed = alcli.api.Rows([dict(r) for r in rows])
    renamed.embeddings = rows.embeddings
    renamed[3]["id"] = "renamed"
    appended = alcli.api.Rows([*rows, {"id": "extra", "score": 9.0}])
    appended.embeddings = rows.embeddings
    for changed, name in ((renamed, "renamed"), (appended, "extra")):
        for diverse in (True, None):  # asked for, or by default with the embeddings at hand
            with pytest.raises(AlcliError, match=f"^the row '{name}' has no embedding.*"
                                                 f"diverse=False"):
                alcli.select(changed, 5, **({} if diverse is None else {"diverse": diverse}))
        assert len(alcli.select(changed, 5, diverse=False)) == 5


@pytest.mark.parametrize("rows, message", [
    ([1, 2, 3], r"^rows\[0\] is not a dict with 'id' and 'score' \(type int\)"),
    ([{"id": "a", "score": 1.0}, {"id": "b"}], r"^rows\[1\] has no 'score'"),
    ([{"score": 1.0}], r"^rows\[0\] has no 'id'"),
    ([{"id": "a", "score": 1.0}, {"id": "b", "score": "high"}],
     r"^rows\[1\] \(id 'b'\): score 'high' is not a number"),
    ([{"id": "a", "score": 1.0}, {"id": "a", "score": 2.0}],
     r"^rows\[0\] and rows\[1\] have the same id 'a'"),
    ([{"id": 1, "score": 1.0}, {"id": "1", "score": 2.0}],
     r"^rows\[0\] and rows\[1\] have the same id '1'"),
])
def test_select_names_the_row_at_fault(rows, message):
    with pytest.raises(AlcliError, match=message):
        alcli.select(rows, 2)


def test_select_per_class_names_a_pred_that_is_no_class():
    rows = [{"id": "a", "score": 1.0, "pred": [1, 2]}, {"id": "b", "score": 0.5, "pred": 1}]
    with pytest.raises(AlcliError, match=r"row 'a' has the pred \[1, 2\], not a class"):
        alcli.select(rows, 1, per_class="equal")
    # rows without a score (None) are fine: ranked last
    assert [r["id"] for r in alcli.select([{"id": 1, "score": None},
                                           {"id": 2, "score": 0.1}], 2)] == [2, 1]


def test_score_pool_refuses_ids_given_as_one_string(scored):
    _, _, model = scored
    for ids in ("ab", b"ab"):
        with pytest.raises(AlcliError, match=r"ids must be a list of 2 ids, one per example, not "
                                             r"a (str|bytes)"):
            alcli.score_pool((torch.rand(2, 4), None, ids), model, strategy="margin")
    rows = alcli.score_pool((torch.rand(2, 4), None, ("a", "b")), model, strategy="margin")
    assert sorted(r["id"] for r in rows) == ["a", "b"]
