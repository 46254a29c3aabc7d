"""select --cost / --budget-cost (alcli/selection/cost.py): the batch against the test's own
greedy walk by score per cost under the total, costs from a column and from a detector's boxes,
diverse batches kept under the total, and bad input as one sentence."""
from __future__ import annotations

import csv
import json

import numpy as np
import pytest

from alcli.files.embeddings import save_embeddings
from shell import invoke_in  # noqa: E402


run = invoke_in  # alcli ARGS in this process, in cwd


def table(root, n=40, seed=0):
    """A detection-like table: each row's boxes (0 to 6), a `minutes` column, random scores."""
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        boxes = [[0, 0, 5, 5, 0, 0.9]] * int(rng.integers(0, 7))
        rows.append({"id": f"r{i:02d}", "score": float(rng.gamma(2.0)), "pred": f"c{i % 3}",
                     "boxes": json.dumps(boxes), "minutes": float(rng.uniform(0.5, 9))})
    rows.sort(key=lambda r: (-r["score"], r["id"]))
    for k, r in enumerate(rows, 1):
        r["rank"] = k
    with open(root / "t.csv", "w", newline="") as f:
        w = csv.DictWriter(f, ["rank", "id", "score", "pred", "boxes", "minutes"])
        w.writeheader()
        w.writerows(rows)
    return rows


def greedy(rows, cost, total, most=None):
    """By hand: best score / cost first (ties by id), each row kept while the total fits."""
    order = sorted(rows, key=lambda r: (-r["score"] / cost(r), r["id"]))
    kept, spent = [], 0.0
    for r in order:
        if most is not None and len(kept) == most:
            break
        if spent + cost(r) <= total:
            kept.append(r["id"])
            spent += cost(r)
    return kept, spent


def batch(result):
    assert result.exit_code == 0, result.stderr + result.stdout
    return list(csv.DictReader(result.stdout.splitlines()))


def boxes(r):
    return max(1, len(json.loads(r["boxes"])))


@pytest.mark.parametrize("total", [5, 12.5, 40])
def test_boxes_within_the_total_as_the_greedy_walk(tmp_path, total):
    rows = table(tmp_path)
    want, spent = greedy(rows, boxes, total)
    out = batch(run(tmp_path, "select", "t.csv", "--cost", "boxes", "--budget-cost", total))
    assert sorted(r["id"] for r in out) == sorted(want)
    by_id = {r["id"]: r for r in rows}
    for r in out:  # the row as the table has it (its score, its rank), with its cost
        assert float(r["score"]) == pytest.approx(by_id[r["id"]]["score"])
        assert int(r["rank"]) == by_id[r["id"]]["rank"] and float(r["cost"]) == boxes(by_id[r["id"]])
    assert [float(r["score"]) for r in out] == sorted((float(r["score"]) for r in out), reverse=True)


def test_a_column_of_costs_with_a_count_cap_and_the_summary(tmp_path):
    rows = table(tmp_path, seed=1)
    want, spent = greedy(rows, lambda r: r["minutes"], 30, most=4)
    result = run(tmp_path, "select", "t.csv", "--cost", "minutes", "--budget-cost", 30, "-n", 4,
                 "-o", "b.csv")
    assert result.exit_code == 0, result.stderr
    out = list(csv.DictReader(open(tmp_path / "b.csv")))
    assert sorted(r["id"] for r in out) == sorted(want) and len(out) <= 4
    assert f"the batch costs {spent:g} (minutes) of --budget-cost 30" in result.stderr


def test_cost_without_a_total_picks_n_by_score_per_cost(tmp_path):
    rows = table(tmp_path, seed=2)
    want, _ = greedy(rows, boxes, float("inf"), most=6)
    out = batch(run(tmp_path, "select", "t.csv", "--cost", "boxes", "-n", 6))
    assert sorted(r["id"] for r in out) == sorted(want)


def test_a_diverse_batch_stays_under_the_total(tmp_path):
    rows = table(tmp_path, n=60, seed=3)
    rng = np.random.default_rng(0)
    save_embeddings(str(tmp_path / "t.csv.emb.npz"), [r["id"] for r in rows],
                    rng.normal(size=(60, 3)), rng.normal(size=(60, 4)))
    out = batch(run(tmp_path, "select", "t.csv", "--diverse", "--cost", "minutes",
                    "--budget-cost", 25, "--seed", 1))
    spent = sum(float(r["cost"]) for r in out)
    assert out and spent <= 25
    # nothing left out would still fit: the unspent rest is smaller than every row not taken
    left = [r["minutes"] for r in rows if r["id"] not in {o["id"] for o in out}]
    assert 25 - spent < min(left)


@pytest.mark.parametrize("args, needle", [
    (["--cost", "hours", "-n", "2"], "no column 'hours'"),
    (["--budget-cost", "3"], "needs --cost"),
    (["--cost", "boxes", "--budget-cost", "0"], "--budget-cost"),
    (["--cost", "pred", "-n", "2"], "a cost is a number above 0"),
])
def test_bad_input_is_one_sentence(tmp_path, args, needle):
    table(tmp_path)
    result = run(tmp_path, "select", "t.csv", *args)
    assert result.exit_code == 1, result.stderr + result.stdout
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("alcli: error:") and needle in lines[0], lines
