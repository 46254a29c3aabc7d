"""Hostile input, round 3 (issue 47): `alcli pull` against a hostile Label Studio
(tests/fake_label_studio.py, the modes of shared/hostile-inputs-3.md's fake_ls.py) ends in its
files or in one sentence, never a traceback; the token never leaves its server or shows; what a
server claims is checked before it is allocated; one pull's files appear together or not at all.
Masks are read back with PIL and numpy, never with alcli's reader."""
from __future__ import annotations

import csv
import json
import time

import numpy as np
import pytest
from PIL import Image
from typer.testing import CliRunner

from alcli.cli import app
from alcli.files import http
from cli_errors import assert_one_error
from fake_label_studio import serve

TOKEN = "SECRET-TOKEN-42"


def pull(tmp_path, monkeypatch, url, *args, token=TOKEN):
    monkeypatch.chdir(tmp_path)
    return CliRunner().invoke(app, ["pull", "-p", "P", *args],
                              env={"LABEL_STUDIO_URL": url, "LABEL_STUDIO_API_KEY": token})


def rows(path):
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def mask(tmp_path, row):
    return np.array(Image.open(tmp_path / row["mask"]))


@pytest.mark.parametrize("bad", ["\r", "\n", "\u00e9"])
def test_a_token_with_a_line_break_or_beyond_ascii_is_one_sentence_without_it(tmp_path, monkeypatch, bad):
    with serve("choices") as (url, log):  # R3-1
        result = pull(tmp_path, monkeypatch, url, "-o", "l.csv", token=TOKEN + bad + "x")
    assert_one_error(result, "access token (--token or LABEL_STUDIO_API_KEY) holds", bad)
    assert TOKEN not in result.output and log == []


def test_a_crlf_token_is_stripped(tmp_path, monkeypatch):
    with serve("choices") as (url, log):
        result = pull(tmp_path, monkeypatch, url, "-o", "l.csv", token=TOKEN + "\r\n")
    assert result.exit_code == 0, result.output
    assert {e["auth"] for e in log} == {f"Token {TOKEN}"}


def test_a_redirect_to_another_server_is_refused_and_the_token_stays(tmp_path, monkeypatch):
    with serve("choices") as (other, other_log):  # R3-2
        port = other.rsplit(":", 1)[1]
        with serve("redirect", f"http://localhost:{port}") as (url, log):
            result = pull(tmp_path, monkeypatch, url, "-o", "l.csv")
    assert_one_error(result, f"redirects to http://localhost:{port}, another server", "redirect")
    assert other_log == [] and TOKEN not in result.output
    assert not (tmp_path / "l.csv").exists()


def test_ids_sharing_a_stem_get_masks_of_their_own(tmp_path, monkeypatch):
    ids = ["x.png", "x.jpg", "sub/a", "sub/a.png", "X.PNG"]
    with serve("brush", json.dumps(ids)) as (url, _):  # R3-3
        result = pull(tmp_path, monkeypatch, url, "-o", "m.csv")
    assert result.exit_code == 0, result.output
    got = {r["id"]: r for r in rows(tmp_path / "m.csv")}
    assert list(got) == ids and len({r["mask"] for r in got.values()}) == len(ids)
    for k, id_ in enumerate(ids):  # even ones painted class 1 (c1), odd ones left unpainted
        values = np.unique(mask(tmp_path, got[id_])).tolist()
        assert values == ([1] if k % 2 == 0 else [65535]), id_


@pytest.mark.parametrize("label, index", [("c255", 255), ("c256", 256), ("c1", 1)])
def test_every_class_is_a_class_and_never_the_ignore_value(tmp_path, monkeypatch, label, index):
    with serve("brushclass", label) as (url, _):  # R3-4: the project offers c0..c299
        result = pull(tmp_path, monkeypatch, url, "-o", "c.csv")
    assert result.exit_code == 0, result.output
    m = mask(tmp_path, rows(tmp_path / "c.csv")[0])
    assert m.dtype == np.uint16 and np.unique(m).tolist() == [index]


def test_skipped_or_output_on_an_input_or_on_each_other_is_refused(tmp_path, monkeypatch):
    (tmp_path / "names.txt").write_text("cat\ndog\n")
    with serve("choices") as (url, _):  # R3-5
        same = pull(tmp_path, monkeypatch, url, "-o", "same.csv", "--skipped", "same.csv")
        names = pull(tmp_path, monkeypatch, url, "-o", "names.txt", "--class-names", "names.txt")
        coco = pull(tmp_path, monkeypatch, url, "-o", "l.csv", "--skipped", "l.coco.json")
    assert_one_error(same, "option --skipped same.csv is also option --output", "same")
    assert_one_error(names, "option --output names.txt is also the class names file", "names")
    assert_one_error(coco, "the COCO file of option --output l.coco.json is also option --skipped", "coco")
    assert (tmp_path / "names.txt").read_text() == "cat\ndog\n"
    assert not (tmp_path / "same.csv").exists()


@pytest.mark.parametrize("mode", ["pages", "newpages"])
def test_a_listing_that_never_ends_stops(tmp_path, monkeypatch, mode):
    monkeypatch.setattr("alcli.files.labelstudio_api.MAX_PAGES", 5)
    with serve(mode) as (url, log):  # R3-7: total 10^12, every page full
        result = pull(tmp_path, monkeypatch, url, "-o", "p.csv")
    assert result.exit_code == 0, result.output
    pages = [e for e in log if e["path"].startswith("/api/tasks?")]
    # the same ids again: the second page adds none; new ids every time: the page cap
    assert len(pages) == (2 if mode == "pages" else 5)
    # each task's annotation is empty: pulled as skipped (issue 49 item 11), every one of them
    assert len(rows(tmp_path / "p.skipped.csv")) == (100 if mode == "pages" else 500)


def test_an_answer_past_the_size_cap_is_one_sentence(tmp_path, monkeypatch):
    monkeypatch.setattr(http, "MAX_ANSWER_BYTES", 4 << 20)
    with serve("big") as (url, _):  # an answer that never ends
        result = pull(tmp_path, monkeypatch, url, "-o", "b.csv")
    assert_one_error(result, "answered more than 4 MiB (GET /api/projects)", "big")


@pytest.mark.parametrize("size", [60000, 200000, 9000])
def test_a_brush_claiming_a_huge_size_is_refused_before_allocation(tmp_path, monkeypatch, size):
    with serve("brushsize", str(size)) as (url, _):  # R3-8: a 1-pixel stream claims size x size
        result = pull(tmp_path, monkeypatch, url, "-o", "s.csv")
    culprit = "more than the" if size * size > Image.MAX_IMAGE_PIXELS else "holds 4 values in"
    assert_one_error(result, culprit, str(size))
    assert not (tmp_path / "s.csv").exists()


@pytest.mark.parametrize("mode, culprit", [
    ("deep", "answered JSON nested more than 64 deep to GET /api/projects"),
    ("types", "answered GET /api/projects with JSON that is not a list of projects"),
    ("brushmix", "its brush regions are of different sizes (4x4 and 8x8)")])
def test_malformed_answers_are_one_sentence(tmp_path, monkeypatch, mode, culprit):
    with serve(mode) as (url, _):  # R3-10
        result = pull(tmp_path, monkeypatch, url, "-o", "x.csv")
    assert_one_error(result, culprit, mode)


@pytest.mark.parametrize("label, culprit", [
    ("dog", "has a box labeled 'dog', which is not among the class names of names.txt"),
    ("nan", "has a box whose coordinates are not numbers")])
def test_a_bad_box_leaves_the_last_pull_as_it_was(tmp_path, monkeypatch, label, culprit):
    (tmp_path / "names.txt").write_text("background\ncat\n")
    old = {"r.csv": "old labels\n", "r.coco.json": '{"old": 1}', "r.skipped.csv": "id,reason\n"}
    for name, text in old.items():
        (tmp_path / name).write_text(text)
    with serve("rect", label) as (url, _):  # R3-11
        result = pull(tmp_path, monkeypatch, url, "-o", "r.csv", "--class-names", "names.txt")
    assert_one_error(result, culprit, label)
    assert {p.name: p.read_text() for p in tmp_path.iterdir() if p.name != "names.txt"} == old


def test_a_pull_replaces_its_files_together(tmp_path, monkeypatch):
    (tmp_path / "r.coco.json").write_text('{"old": 1}')
    with serve("rect", "dog") as (url, _):
        result = pull(tmp_path, monkeypatch, url, "-o", "r.csv")
    assert result.exit_code == 0, result.output
    doc = json.loads((tmp_path / "r.coco.json").read_text())
    assert [i["file_name"] for i in doc["images"]] == ["a.png", "b.png"]
    assert [r["id"] for r in rows(tmp_path / "r.csv")] == ["a.png", "b.png"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.coco.json", "r.csv", "r.skipped.csv"]
    # a later pull of choices (no boxes) leaves no COCO file of the earlier round beside its labels
    with serve("choices") as (url, _):
        assert pull(tmp_path, monkeypatch, url, "-o", "r.csv").exit_code == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.csv", "r.skipped.csv"]


def test_a_dripping_server_meets_the_deadline(tmp_path, monkeypatch):
    monkeypatch.setattr(http, "DEADLINE_S", 2.0)
    started = time.monotonic()
    with serve("drip", "0.5") as (url, _):  # R3-16: one byte every 0.5 s, 30 bytes
        result = pull(tmp_path, monkeypatch, url, "-o", "d.csv")
        took = time.monotonic() - started
    assert_one_error(result, "took more than 2 s to answer (GET /api/projects)", "drip")
    assert took < 6


@pytest.mark.parametrize("url", ["http://user:pass@127.0.0.1:8080", "http://127.0.0.1:8080/?apikey=X",
                                 "http://127.0.0.1:8080/#x"])
def test_a_url_with_credentials_or_a_query_is_one_sentence(tmp_path, monkeypatch, url):
    result = pull(tmp_path, monkeypatch, url, "-o", "u.csv")  # R3-18
    assert_one_error(result, "holds a user name, a query or a fragment", url)
    assert "pass" not in result.stderr and "apikey=X" not in result.stderr


def test_choices_with_hostile_ids_are_written_as_data(tmp_path, monkeypatch):
    with serve("choices") as (url, _):  # R3-17: the labels file keeps the ids as they are
        result = pull(tmp_path, monkeypatch, url, "-o", "c.csv")
    assert result.exit_code == 0, result.output
    got = rows(tmp_path / "c.csv")
    assert [r["id"] for r in got] == ["a.png", "=HYPERLINK(\"http://x\")", "b\x00c.png", "l1\nl2.png"]


def test_http_reaches_servers_only_through_its_door():
    """A request alcli makes with its own client goes through alcli/files/http.py: no other module
    imports an HTTP client (fsspec's aiohttp for http(s) pools is configured in files/remote.py,
    not called)."""
    import ast
    from pathlib import Path

    import alcli
    clients = {"urllib.request", "http.client", "requests", "httpx", "urllib3", "socket"}
    root = Path(alcli.__file__).parent
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] + [f"{node.module}.{a.name}" for a in node.names] \
                if isinstance(node, ast.ImportFrom) else []
            if any(n in clients for n in names):
                found.append(str(path.relative_to(root)))
    assert sorted(set(found)) == ["files/http.py"]
