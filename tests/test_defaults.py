"""Each task's default strategy (Task.default_strategy): chosen by the rule in docs/benchmarks.md
over the learning curves recorded in benchmarks/results/, and used when no --strategy is given."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn
from typer.testing import CliRunner

import alcli
from alcli.cli import app
from alcli.tasks import TASKS
import benchmark_scripts

ROOT = Path(__file__).resolve().parents[1]
EVIDENCE = ROOT / "benchmarks" / "results" / "structured-curves-defaults.json"
INCUMBENT = ("egl", "mean")  # a task without learning curves keeps the exact gradient


def _bench():
    return benchmark_scripts.load("structured_curves")


def _default(task) -> tuple[str, str]:
    return task.default_strategy, task.default_aggregate


def test_each_default_is_the_rule_applied_to_its_recorded_evidence():
    pytest.importorskip("scipy")
    bench = _bench()
    evidence = json.loads(EVIDENCE.read_text())
    assert evidence["rule"] == bench.DEFAULT_RULE  # the rule stated is the rule applied
    # the recorded inputs are the committed curves' (a curve changed without its inputs fails)
    rebuilt = bench.all_inputs(bench.merge_json(list(bench.CURVE_FILES)))
    assert json.loads(json.dumps(rebuilt)) == evidence["inputs"]
    for task, per_data in evidence["inputs"].items():
        picked = bench.pick_default(per_data)
        assert list(picked) == evidence["defaults"][task], task
        assert _default(TASKS[task]) == picked, \
            f"{task}'s default differs from what the rule picks from its evidence"
    for name, task in TASKS.items():  # no evidence: the incumbent stays
        if name not in evidence["inputs"]:
            assert _default(task) == INCUMBENT, name


def _data(aulc: dict[str, list[float]], seconds: dict[str, float]) -> dict:
    return {m: {"aulc": v, "seconds": seconds.get(m, 1.0)} for m, v in aulc.items()}


EGL = [50.0, 51.0, 49.0, 50.5, 50.2, 49.8]
NOISE = [0.1, -0.2, 0.15, -0.1, 0.05, 0.0]
TIED = [e + n for e, n in zip(EGL, NOISE)]              # within noise of EGL: p > 0.05
BETTER = [e + 2 + n for e, n in zip(EGL, NOISE)]        # +2 points every seed: p << 0.05
WORSE = [e - 2 + n for e, n in zip(EGL, NOISE)]


def test_the_rule_picks_the_cheapest_setting_nothing_beats():
    pytest.importorskip("scipy")
    pick = _bench().pick_default
    # tied everywhere: the cheapest kind (a forward only < gradnorm < egl), whatever the seconds
    tie = _data({"random": TIED, "egl": EGL, "gradnorm": TIED, "entropy": TIED}, {"entropy": 9.0})
    assert pick({"a": tie, "b": tie}) == ("entropy", "mean")
    assert pick({"a": _data({"egl": EGL, "gradnorm": TIED}, {})}) == ("gradnorm", "mean")
    # cheaper but beaten on one data set: the dearer one nothing beats
    lost = _data({"random": TIED, "egl": EGL, "gradnorm": TIED, "entropy": WORSE}, {})
    assert pick({"a": tie, "b": lost}) == ("gradnorm", "mean")
    # beaten by random counts as beaten: entropy below random, egl (noisy) tied with both
    loose = [e + 1 + n for e, n in zip(EGL, [3.0, -2.5, 2.0, -1.0, 3.5, -3.0])]
    below = _data({"random": [e + 1 for e in TIED], "egl": loose, "entropy": EGL}, {})
    assert pick({"a": below}) == ("egl", "mean")
    # a peer (mc-var) beats but is never picked; nothing unbeaten: the fewest data sets beaten
    peer = _data({"mc-var": BETTER, "egl": EGL, "gradnorm": WORSE}, {})
    assert pick({"a": peer}) == ("gradnorm", "mean")              # both beaten once: the cheaper
    assert pick({"a": peer, "b": _data({"egl": EGL, "gradnorm": WORSE}, {})}) == ("egl", "mean")
    # equally cheap and unbeaten (the noisy one ties with both): the higher mean AULC
    noisy = [e + 0.5 + n for e, n in zip(EGL, [3.0, -2.5, 2.0, -1.0, 3.5, -3.0])]
    assert pick({"a": _data({"egl": EGL, "entropy": TIED, "entropy-max": noisy}, {})}) == \
        ("entropy", "max")
    assert pick({"a": _data({"egl": EGL, "entropy": noisy, "entropy-max": TIED}, {})}) == \
        ("entropy", "mean")
    # the max aggregate is a setting of its own: its win does not count for the mean's
    agg = _data({"egl": EGL, "entropy": WORSE, "entropy-max": BETTER}, {})
    assert pick({"a": agg}) == ("entropy", "max")
    # a setting counts by its better variant (plain or +div)
    div = _data({"egl": EGL, "egl+div": BETTER, "gradnorm": WORSE, "gradnorm+div": BETTER}, {})
    assert pick({"a": div}) == ("gradnorm", "mean")
    # classification's names (benchmarks/learning_curves.py): bait is the benchmark's, not alcli's
    cls = _data({"egl+div": EGL, "bait": TIED, "margin+div": TIED}, {})
    assert pick({"a": cls}) == ("margin", "mean")


class Regressor(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 1)

    def forward(self, x):
        return self.fc(x)


def _scores(rows) -> dict:
    return {r["id"]: r["score"] for r in rows}


def test_score_takes_the_tasks_default_when_no_strategy_is_given(monkeypatch):
    torch.manual_seed(0)
    x, net = torch.randn(12, 4), Regressor()
    options = dict(task="regression", device="cpu", quiet=True)
    egl = _scores(alcli.score_pool((x,), net, strategy="egl", **options))
    random = _scores(alcli.score_pool((x,), net, strategy="random", **options))
    assert egl != random
    # egl, the incumbent: the exact oracle 2 ||d f(x) / d theta|| = 2 sqrt(||x||² + 1), float64
    oracle = 2 * (x.double().square().sum(1) + 1).sqrt()
    assert np.allclose([egl[i] for i in range(12)], oracle.numpy(), rtol=1e-5)
    assert _scores(alcli.score_pool((x,), net, **options)) == egl
    monkeypatch.setitem(TASKS, "regression",
                        dataclasses.replace(TASKS["regression"], default_strategy="random"))
    assert _scores(alcli.score_pool((x,), net, **options)) == random      # the task's default
    assert _scores(alcli.score_pool((x,), net, strategy="egl", **options)) == egl  # given: kept


def test_a_default_aggregate_comes_with_the_default_strategy_only(monkeypatch):
    """segmentation's default (max entropy over pixels) against a float64 oracle; a given
    --aggregate is kept, and a given --strategy takes the settings' aggregate, not the task's."""
    torch.manual_seed(0)
    x, net = torch.randn(6, 1, 5, 5), nn.Conv2d(1, 3, 3, padding=1)
    monkeypatch.setitem(TASKS, "segmentation", dataclasses.replace(
        TASKS["segmentation"], default_strategy="entropy", default_aggregate="max"))
    with torch.no_grad():
        p = net.double()(x.double()).softmax(1)                          # [B, C, H, W]
    entropy = -(p * p.log()).sum(1).flatten(1)                           # [B, H*W]
    net.float()
    options = dict(task="segmentation", device="cpu", quiet=True)
    found = _scores(alcli.score_pool((x,), net, **options))
    assert np.allclose([found[i] for i in range(6)], entropy.max(1).values.numpy(), rtol=1e-5)
    mean = _scores(alcli.score_pool((x,), net, aggregate="mean", **options))
    assert np.allclose([mean[i] for i in range(6)], entropy.mean(1).numpy(), rtol=1e-5)
    given = _scores(alcli.score_pool((x,), net, strategy="entropy", **options))
    assert given == mean


def test_a_config_key_counts_as_given(monkeypatch, tmp_path):
    torch.manual_seed(0)
    x, net = torch.randn(12, 4), Regressor()
    config = tmp_path / "c.yaml"
    config.write_text("strategy: egl\n")
    monkeypatch.setitem(TASKS, "regression",
                        dataclasses.replace(TASKS["regression"], default_strategy="random"))
    rows = _scores(alcli.score_pool((x,), net, config=str(config), task="regression",
                                    device="cpu", quiet=True))
    oracle = 2 * (x.double().square().sum(1) + 1).sqrt()  # egl's, as above: not the default's
    assert np.allclose([rows[i] for i in range(12)], oracle.numpy(), rtol=1e-5)


def test_inspect_prints_the_tasks_default(in_ws, monkeypatch):
    monkeypatch.setitem(TASKS, "regression", dataclasses.replace(
        TASKS["regression"], default_strategy="entropy", default_aggregate="top:0.5"))
    shown = {"classification": TASKS["classification"].default_strategy,
             "regression": "entropy --aggregate top:0.5"}
    for task, default in shown.items():
        result = CliRunner().invoke(app, ["inspect", "-m", "model.pt", "-c", str(in_ws.config),
                                          "--task", task])
        assert result.exit_code == 0, result.stderr
        assert f"default strategy: {default} (when --strategy is not given" in result.stdout, \
            result.stdout


def test_a_strategy_a_command_sets_itself_is_kept():
    """simulate and review run strategies of their own through settings copied with another
    strategy (dataclasses.replace, no option naming it): the task's default must not replace it."""
    from alcli.api import run_score, settings_for
    torch.manual_seed(0)
    x, net = torch.randn(12, 4), Regressor()
    options = dict(task="regression", device="cpu", quiet=True)
    base = settings_for(**options)
    rows = run_score(dataclasses.replace(base, strategy="random", sources=dict(base.sources)),
                     model=net, pool=(x,), embeddings=False).rows
    random = _scores(alcli.score_pool((x,), net, strategy="random", **options))
    assert _scores(rows) == random != _scores(alcli.score_pool((x,), net, **options))
