"""When to stop (alcli/selection/stopping.py, `alcli stop`, simulate's kappa and stop columns):
Cohen's kappa against sklearn's cohen_kappa_score, the rule's verdict against a hand-written
mean over the last kappas, the exit codes a script reads. (simulate's kappa column:
tests/test_simulate.py, against its checkpoints' float64 predictions.)"""
from __future__ import annotations

import json
import os

import numpy as np
import pytest
from sklearn.metrics import cohen_kappa_score

from alcli.selection import stopping
from typer.testing import CliRunner

from alcli.cli import app


class Ran:
    def __init__(self, result):
        self.returncode, self.stdout, self.stderr = result.exit_code, result.stdout, result.stderr


def alcli(*args, cwd):
    """`alcli ARGS` in this process, in `cwd`."""
    old = os.getcwd()
    os.chdir(cwd)
    try:
        return Ran(CliRunner().invoke(app, [str(a) for a in args]))
    finally:
        os.chdir(old)

CLASSES = ["cat", "dog", "bird", "fish"]


@pytest.mark.parametrize("seed", range(6))
def test_kappa_is_sklearns(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(5, 300))
    a = rng.choice(CLASSES[:int(rng.integers(2, 5))], n).tolist()
    flip = rng.random(n) < rng.uniform(0, 0.5)
    b = [rng.choice(CLASSES) if f else x for x, f in zip(a, flip)]
    assert stopping.kappa(a, b) == pytest.approx(cohen_kappa_score(a, b), abs=1e-12)


def test_kappa_of_one_constant_class_is_complete_agreement():
    assert stopping.kappa(["cat"] * 5, ["cat"] * 5) == 1.0


def mean_rule(kappas, threshold, window):
    """By hand: kappa j compares round j+1 with round j; there the rule says stop when the kappas
    j-window+1..j exist and their mean is >= threshold."""
    return [j + 1 >= window and float(np.mean(kappas[j + 1 - window:j + 1])) >= threshold
            for j in range(len(kappas))]


@pytest.mark.parametrize("threshold, window", [(0.99, 3), (0.9, 2), (0.5, 1)])
def test_the_rule_against_a_hand_written_mean(threshold, window):
    ks = [0.3, 0.95, 0.995, 1.0, 0.98, 0.999, 1.0, 1.0]
    assert stopping.verdicts(ks, threshold, window) == mean_rule(ks, threshold, window)


def write(path, preds, extra=()):
    lines = ["id,score,pred"] + [f"{i},{0.5},{p}" for i, p in preds.items()]
    path.write_text("\n".join([*lines, *extra]) + "\n")


def rounds_of(tmp_path, n_rounds, seed=0, n=200):
    """Tables whose predictions drift less each round (round k changes 30 / 2^k of them), the
    ids of each a shuffled, partly different subset of one pool."""
    rng = np.random.default_rng(seed)
    pool = [f"x{i}" for i in range(n)]
    preds = dict(zip(pool, rng.choice(CLASSES, n).tolist()))
    names, tables = [], []
    for k in range(n_rounds):
        for i in rng.choice(n, int(30 / 2 ** k), replace=False):
            preds[pool[i]] = rng.choice(CLASSES)
        kept = [pool[i] for i in rng.permutation(n)[:n - 10]]  # some ids scored in one round only
        tables.append({i: preds[i] for i in kept})
        names.append(tmp_path / f"round{k}.csv")
        write(names[-1], tables[-1])
    return names, tables


def expected(tables, threshold=0.99, window=3):
    kappas = []
    for old, new in zip(tables, tables[1:]):
        common = [i for i in new if i in old]
        kappas.append(cohen_kappa_score([old[i] for i in common], [new[i] for i in common]))
    return kappas, mean_rule(kappas, threshold, window)


def test_stop_prints_the_kappas_and_exits_3_then_0(tmp_path):
    names, tables = rounds_of(tmp_path, 9)
    kappas, says = expected(tables)
    first = says.index(True) + 1  # the round where the rule first says stop
    assert 3 < first < 8  # a case where it goes on, then stops
    out = alcli("stop", *names[:first], "--json", cwd=tmp_path)  # rounds 0 .. first-1
    assert out.returncode == 3, out.stderr
    got = json.loads(out.stdout)
    assert [r["kappa"] for r in got["rounds"][1:]] == pytest.approx(kappas[:first - 1], abs=1e-12)
    assert got["stop"] is False and got["stop_round"] is None
    out = alcli("stop", *names, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[-1].startswith("stop:") and f"round {first})" in lines[-1]
    for k, line in enumerate(lines[2:-1], 1):  # round, compared, changed, kappa, mean, stop, table
        cells = line.split("\t")
        assert float(cells[3]) == pytest.approx(kappas[k - 1], abs=1e-4)
        assert cells[5] == ("yes" if says[k - 1] else "no")


@pytest.mark.parametrize("args, needle", [
    (["round0.csv", "--kappa", "0"], "--kappa 0.0"),
    (["round0.csv", "--window", "0"], "--window 0"),
    (["round0.csv", "missing.csv"], "missing.csv"),
    (["round0.csv", "other.csv"], "share no id"),
])
def test_stop_bad_input_is_one_sentence(tmp_path, args, needle):
    rounds_of(tmp_path, 1)
    write(tmp_path / "other.csv", {"y1": "cat", "y2": "dog"})
    out = alcli("stop", *args, cwd=tmp_path)
    assert out.returncode == 1 and out.stderr.startswith("alcli: error:"), out.stderr
    assert needle in out.stderr and len(out.stderr.strip().splitlines()) == 1
    assert "Traceback" not in out.stderr


@pytest.mark.parametrize("shared, stops", [(1, False), (99, False), (100, True)])
def test_a_kappa_over_fewer_than_100_shared_ids_does_not_count(tmp_path, shared, stops):
    """Four rounds agreeing on every shared id: kappa 1 each time, but the rule counts a kappa
    only over at least 100 ids (one shared id stopped the loop with exit 0: hostile input R4-9)."""
    names = []
    for k in range(4):
        preds = {f"s{i}": CLASSES[i % len(CLASSES)] for i in range(shared)}
        preds.update({f"r{k}-{i}": CLASSES[0] for i in range(5)})  # each round's own ids
        names.append(tmp_path / f"round{k}.csv")
        write(names[-1], preds)
    out = alcli("stop", *names, "--json", cwd=tmp_path)
    got = json.loads(out.stdout)
    assert [r["kappa"] for r in got["rounds"][1:]] == [1.0, 1.0, 1.0]
    assert (out.returncode, got["stop"]) == ((0, True) if stops else (3, False)), out.stderr
    text = alcli("stop", *names, cwd=tmp_path).stdout.splitlines()[-1]
    assert text.startswith("stop:") if stops else f"share only {shared} ids" in text, text
