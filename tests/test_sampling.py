"""`select --sampling power|softmax` (alcli.selection.sampling): batches drawn from the scores with
the probabilities Kirsch et al. give, seeded by id, at any pool size."""
from __future__ import annotations

import csv
import math

import pytest

from alcli.files.config import SAMPLINGS as CONFIG_SAMPLINGS
from alcli.selection.choose import choose
from alcli.selection.sampling import SAMPLINGS
from shell import completed_in

SCORES = {"a": 4.0, "b": 2.0, "c": 1.0, "d": 1.0}


def rows(scores=SCORES):
    return [{"id": k, "score": v, "pred": k in "ab"} for k, v in scores.items()]


def test_the_config_knows_every_sampling():
    assert CONFIG_SAMPLINGS == SAMPLINGS


@pytest.mark.parametrize("how, beta, weight", [
    ("power", 1.0, lambda s: s), ("power", 2.0, lambda s: s * s), ("softmax", 0.5, lambda s: math.exp(0.5 * s))])
def test_one_draw_follows_the_stated_probabilities(how, beta, weight):
    """Over 3000 seeds, how often each row is drawn alone, against w_i / sum(w) (4 sigma)."""
    n = 3000
    counts = dict.fromkeys(SCORES, 0)
    for seed in range(n):
        counts[choose(rows(), 1, sampling=how, beta=beta, seed=seed)[0]["id"]] += 1
    total = sum(weight(s) for s in SCORES.values())
    for id_, s in SCORES.items():
        p = weight(s) / total
        assert abs(counts[id_] / n - p) < 4 * math.sqrt(p * (1 - p) / n), (id_, counts)


def test_two_draws_without_replacement_follow_plackett_luce():
    """P({a, b}) for k = 2 under power sampling: drawn a then b, or b then a."""
    n, hits = 3000, 0
    w = SCORES
    for seed in range(n):
        hits += {r["id"] for r in choose(rows(), 2, sampling="power", seed=seed)} == {"a", "b"}
    total = sum(w.values())
    p = w["a"] / total * w["b"] / (total - w["a"]) + w["b"] / total * w["a"] / (total - w["b"])
    assert abs(hits / n - p) < 4 * math.sqrt(p * (1 - p) / n)


def test_a_batch_depends_on_the_seed_and_ids_not_the_order():
    many = [{"id": f"x{i}", "score": 1.0 + (i % 7)} for i in range(200)]
    batch = choose(many, 20, sampling="power", seed=3)
    assert choose(list(reversed(many)), 20, sampling="power", seed=3) == batch
    assert choose(many, 20, sampling="power", seed=4) != batch
    assert len({r["id"] for r in batch}) == 20
    assert [r["score"] for r in batch] == sorted((r["score"] for r in batch), reverse=True)


def test_a_cold_beta_is_the_top_k():
    many = [{"id": f"x{i}", "score": float(i)} for i in range(1, 50)]
    top = choose(many, 5)
    assert choose(many, 5, sampling="softmax", beta=1000.0, seed=1) == top


def test_rows_without_a_finite_score_come_last_and_per_class_quotas_hold():
    mixed = rows() + [{"id": "n", "score": math.nan, "pred": True}]
    assert {r["id"] for r in choose(mixed, 5, sampling="power", seed=0)} == set(SCORES) | {"n"}
    assert "n" not in {r["id"] for r in choose(mixed, 4, sampling="power", seed=0)}
    batch = choose(rows(), 2, per_class="equal", sampling="power", seed=0)
    assert sorted(r["pred"] for r in batch) == [False, True]


def test_power_refuses_a_negative_score():
    with pytest.raises(ValueError, match="row 'b' has the negative score -2"):
        choose(rows({"a": 1.0, "b": -2.0}), 1, sampling="power")


def table(tmp_path):
    path = tmp_path / "scores.csv"
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["rank", "id", "score"])
        for i in range(30):
            w.writerow([i + 1, f"e{i:02d}", 30 - i])
    return path


def select(*args, cwd):
    return completed_in(cwd, "select", *args)  # in this process: an interpreter start costs more


def test_select_draws_a_batch_on_the_command_line(tmp_path):
    path = table(tmp_path)
    done = select(str(path), "-n", "5", "--sampling", "power", "--seed", "7", "-f", "ids", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    drawn = done.stdout.split()
    listed = [{"id": f"e{i:02d}", "score": float(30 - i)} for i in range(30)]
    assert drawn == [r["id"] for r in choose(listed, 5, sampling="power", seed=7)]
    assert drawn != [f"e{i:02d}" for i in range(5)]
    bad = select(str(path), "-n", "5", "--sampling", "power", "--diverse", cwd=tmp_path)
    assert bad.returncode == 1 and len(bad.stderr.strip().splitlines()) == 1
    assert "--sampling" in bad.stderr and "--diverse" in bad.stderr
