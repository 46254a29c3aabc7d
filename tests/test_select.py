"""Selection: score order, ties by id, NaN last; the select command and Python API on real tables."""
import math

import pytest
from typer.testing import CliRunner

import alcli
from alcli.cli import app
from alcli.selection.choose import choose
from alcli.selection.rank import order_key, rank
from conftest import parse_csv

runner = CliRunner()
ROWS = [{"id": "c", "score": 1.0}, {"id": "a", "score": 1.0}, {"id": "n", "score": float("nan")},
        {"id": "b", "score": 2.0}, {"id": "d", "score": -1.0}]


def test_rank_orders_by_score_then_id_nan_last():
    ranked = rank(ROWS)
    assert [r["id"] for r in ranked] == ["b", "a", "c", "d", "n"]
    assert [r["rank"] for r in ranked] == [1, 2, 3, 4, 5]
    assert list(ranked[0]) == ["rank", "id", "score"]
    assert sorted(ROWS, key=order_key) == [{k: v for k, v in r.items() if k != "rank"} for r in ranked]


def test_top_k():
    assert [r["id"] for r in choose(ROWS, 2)] == ["b", "a"]
    assert len(choose(ROWS, 50)) == 5
    with pytest.raises(ValueError):
        choose(ROWS, 0)


def test_select_command_breaks_ties_by_id_and_keeps_columns(tmp_path):
    table = tmp_path / "t.csv"
    table.write_text("rank,id,score,pred,confidence,extra\n1,z,5,0,0.9,u\n2,y,5,1,0.8,v\n3,x,nan,1,0.7,w\n"
                     "4,w,7,2,0.6,t\n")
    result = runner.invoke(app, ["select", str(table), "-n", "3"])
    assert result.exit_code == 0, result.stderr
    rows = parse_csv(result.stdout)
    assert [(r["rank"], r["id"], r["extra"]) for r in rows] == [("1", "w", "t"), ("2", "y", "v"), ("3", "z", "u")]
    jsonl = runner.invoke(app, ["select", str(table), "-n", "4", "-f", "jsonl"])
    assert jsonl.stdout.splitlines()[-1].startswith('{"rank": 4, "id": "x", "score": null')


def test_select_reads_its_own_jsonl_and_writes_files(tmp_path):
    table = tmp_path / "t.jsonl"
    table.write_text('{"id": "p", "score": 0.5}\n{"id": "q", "score": 0.25}\n')
    out = tmp_path / "batch.csv"
    result = runner.invoke(app, ["select", str(table), "-n", "1", "-o", str(out)])
    assert result.exit_code == 0 and result.stdout == ""
    assert out.read_text() == "rank,id,score\n1,p,0.5\n"


def test_budget_from_config_and_bad_budget(tmp_path):
    table = tmp_path / "t.csv"
    table.write_text("id,score\na,1\nb,2\n")
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"scores: {table}\nbudget: 1\nformat: ids\n")
    result = runner.invoke(app, ["select", "-c", str(cfg)])
    assert result.exit_code == 0, result.stderr
    assert result.stdout == "b\n"
    bad = runner.invoke(app, ["select", str(table), "-n", "0"])
    assert bad.exit_code == 1 and "--budget" in bad.stderr


def test_python_select_from_file_rows_and_pool(in_ws, tmp_path):
    table = tmp_path / "t.csv"
    table.write_text("id,score\na,1\nb,2\nc,1.5\n")
    assert [r["id"] for r in alcli.select(str(table), 2)] == ["b", "c"]
    assert [r["id"] for r in alcli.select([{"id": "u", "score": 0.0}, {"id": "v", "score": 1.0}], 1)] == ["v"]
    picked = alcli.select(budget=3, pool="pool", model="model.pt", config=in_ws.config, strategy="entropy",
                          diverse=False)
    scored = alcli.score_pool("pool", model="model.pt", config=in_ws.config, strategy="entropy")
    assert picked == scored[:3]
    assert all(math.isfinite(r["score"]) for r in picked)
    with pytest.raises(alcli.AlcliError, match="no budget"):
        alcli.select(str(table))
