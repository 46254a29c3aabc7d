"""Ranked tables: fixed column order, floats that round-trip, atomic writes, clear read errors."""
import io
import json
import math
import os

import pytest

from alcli.errors import TableError
from alcli.files.table import columns_of, read_table, render, write_table

ROWS = [
    {"rank": 1, "id": "a,b.png", "score": 0.1 + 0.2, "pred": 2, "confidence": 1 / 3, "loss": 1e-17,
     "margin": 0.5},
    {"rank": 2, "id": "007", "score": 1e-300, "pred": 0, "confidence": 0.9, "loss": 2.0, "margin": 0.25},
    {"rank": 3, "id": "x", "score": float("nan"), "pred": 1, "confidence": 0.5, "loss": float("inf"),
     "margin": 0.0},
]


def test_column_order():
    rows = [{"extra": 1, "loss": 0.1, "id": "a", "label": None, "score": 1.0, "rank": 1, "pred": 0,
             "confidence": 0.5}]
    assert columns_of(rows) == ["rank", "id", "score", "pred", "confidence", "label", "loss", "extra"]


def test_csv_round_trips_exactly(tmp_path):
    path = tmp_path / "t.csv"
    write_table(ROWS, path)
    text = path.read_text()
    assert text.splitlines()[0] == "rank,id,score,pred,confidence,loss,margin"
    assert '"a,b.png"' in text and "0.30000000000000004" in text
    back = read_table(path)
    for got, want in zip(back, ROWS):
        for key, value in want.items():
            if isinstance(value, float) and math.isnan(value):
                assert math.isnan(got[key])
            else:
                assert got[key] == value and type(got[key]) is type(value), key


def test_jsonl_round_trips_and_nan_is_null(tmp_path):
    path = tmp_path / "t.jsonl"
    write_table(ROWS, path, "jsonl")
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert lines[2]["score"] is None and lines[0]["id"] == "a,b.png"
    back = read_table(path)
    assert back[0]["score"] == ROWS[0]["score"] and math.isnan(back[2]["score"])
    assert back[1]["id"] == "007"


def test_ids_and_paths_formats_and_streams():
    out = io.StringIO()
    write_table(ROWS, out, "ids")
    assert out.getvalue() == "a,b.png\n007\nx\n"
    out = io.StringIO()
    write_table([{**r, "path": f"pool/{r['id']}"} for r in ROWS], out, "paths")
    assert out.getvalue() == "pool/a,b.png\npool/007\npool/x\n"
    with pytest.raises(TableError, match="no 'path'.*use -f ids"):
        write_table(ROWS, io.StringIO(), "paths")
    assert "".join(render(ROWS[:1], ["id", "score"])) == 'id,score\n"a,b.png",0.30000000000000004\n'


def test_atomic_write_replaces_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("old\n")
    write_table(ROWS, path)
    assert path.read_text().startswith("rank,") and os.listdir(tmp_path) == ["t.csv"]
    with pytest.raises(TableError, match="is a directory"):
        write_table(ROWS, tmp_path)
    with pytest.raises(TableError, match="cannot write output"):
        write_table(ROWS, tmp_path / "no" / "such" / "dir.csv")


def test_read_from_stdin_like_stream():
    rows = read_table(io.StringIO("id,score\nb,2\na,3.5\n"))
    assert rows == [{"id": "b", "score": 2.0}, {"id": "a", "score": 3.5}]
    rows = read_table(io.StringIO('{"id": 5, "score": 1}\n'))
    assert rows == [{"id": "5", "score": 1.0}]


@pytest.mark.parametrize("text, needle", [
    ("rank,id\n1,a\n", "has no 'score' column"),
    ("score\n1\n", "has no 'id' column"),
    ("id,score\na,high\n", "line 2: score 'high' is not a number"),
    ("id,score\na,\n", "line 2 has no score"),
    ("id,score,rank\na,1,first\n", "line 2: rank 'first' is not an integer"),
    ("id,score\na,1\na,2\n", "has the id 'a' twice"),
    ("id,score\n", "has no rows"),
    ("", "has no rows"),
    ('{"id": "a", "score": "x"}\n', "score 'x' is not a number"),
    ('{"id": "a", "score": 1}\n{oops\n', "line 2 is not valid JSON"),
    ('{"id": "a"}\n', "has no 'score' column"),
])
def test_read_errors_name_table_and_line(tmp_path, text, needle):
    path = tmp_path / "in.csv"
    path.write_text(text)
    with pytest.raises(TableError, match=needle) as err:
        read_table(path)
    assert "in.csv" in str(err.value)


def test_missing_table():
    with pytest.raises(TableError, match="table nowhere.csv does not exist"):
        read_table("nowhere.csv")
