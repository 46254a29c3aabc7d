"""--exclude matches rows by id, by file (absolute, relative to the cwd, un-normalised) and by Label
Studio task, from every format alcli writes; a file that matches nothing is an error."""
import json
import os

import pytest
from typer.testing import CliRunner

from alcli.cli import app
from conftest import parse_csv

runner = CliRunner()


@pytest.fixture
def table(in_ws, tmp_path):
    out = tmp_path / "scores.csv"
    result = runner.invoke(app, ["score", "pool", "-c", str(in_ws.config), "-m", "model.pt",
                                 "-s", "entropy", "-q", "-o", str(out)])
    assert result.exit_code == 0, result.stderr
    return out


def _select(table, *args):
    return runner.invoke(app, ["select", str(table), "-n", "100", "--no-diverse", *map(str, args)])


def _ids(result):
    assert result.exit_code == 0, result.stderr
    return [r["id"] for r in parse_csv(result.stdout)]


def _excluding(table, tmp_path, name, text, *args):
    (tmp_path / name).write_text(text)
    return _select(table, "--exclude", tmp_path / name, *args)


def test_every_way_of_naming_an_example_excludes_it(in_ws, table, tmp_path):
    every = _ids(_select(table))
    a, b = every[0], every[1]
    abs_a = str(in_ws.images[a][0])
    cases = {
        "ids.txt": f"{a}\n{b}\n",
        "abs.txt": f"{abs_a}\n{in_ws.images[b][0]}\n",                     # absolute paths
        "rel.txt": f"pool/{a}\n./pool/x/../{b}\n",                          # cwd-relative, un-normalised
        "table.csv": "".join(open(table).readlines()[:3]),                   # alcli's own csv
        "rows.jsonl": json.dumps({"id": a, "score": 1}) + "\n" + json.dumps({"id": b}) + "\n",
        "ls_export.json": json.dumps([{"id": 17, "data": {"image": f"https://h/pool/{a}"}},
                                      {"id": 18, "data": {"image": f"https://h/pool/{b}"}}]),
    }
    for name, text in cases.items():
        got = _ids(_excluding(table, tmp_path, name, text, "--image-root", "https://h/pool"))
        assert got == [i for i in every if i not in (a, b)], name
    # alcli's own Label Studio output (data.alcli_id) and -f jsonl output
    for fmt, name in (("labelstudio", "tasks.json"), ("jsonl", "picked.jsonl")):
        out = tmp_path / name
        assert _select(table, "-n", 2, "-f", fmt, "-o", out).exit_code == 0
        assert _ids(_select(table, "--exclude", out)) == every[2:], fmt


def test_a_file_matching_nothing_is_an_error_and_a_partial_match_a_warning(table, tmp_path):
    every = _ids(_select(table))
    none = _excluding(table, tmp_path, "typo.txt", "pool/nope.png\nb/img99.png\n")
    assert none.exit_code == 1 and "Traceback" not in none.stderr
    assert "typo.txt" in none.stderr and "'pool/nope.png'" in none.stderr
    assert len(none.stderr.strip().splitlines()) == 1
    some = _excluding(table, tmp_path, "some.txt", f"{every[0]}\nother.png\n")
    assert _ids(some) == every[1:]
    assert "1 of the 2 entries" in some.stderr and "'other.png'" in some.stderr
