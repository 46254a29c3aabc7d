"""Each task's default strategy (Task.default_strategy): chosen by the rule in docs/benchmarks.md
over the learning curves recorded in benchmarks/results/, and used when no --strategy is given."""
from __future__ import annotations

import dataclasses
import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn
from typer.testing import CliRunner

import alcli
from alcli.cli import app
from alcli.tasks import TASKS

ROOT = Path(__file__).resolve().parents[1]
EVIDENCE = ROOT / "benchmarks" / "results" / "structured-curves-defaults.json"
# classification's evidence: issue 39's rule over eight data sets (benchmarks/results/
# learning-curves-issue39-cpu-2core.md, "=> keep egl+div"); the others have no curves yet
INCUMBENT = "egl"


def _bench():
    spec = importlib.util.spec_from_file_location("structured_curves",
                                                  ROOT / "benchmarks" / "structured_curves.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks its module up there
    spec.loader.exec_module(module)
    return module


def test_each_default_is_the_rule_applied_to_its_recorded_evidence():
    pytest.importorskip("scipy")
    bench = _bench()
    evidence = json.loads(EVIDENCE.read_text())
    assert evidence["rule"] == bench.DEFAULT_RULE  # the rule stated is the rule applied
    for task, per_data in evidence["inputs"].items():
        picked = bench.pick_default(per_data)
        assert picked == evidence["defaults"][task], task
        assert TASKS[task].default_strategy == picked, \
            f"{task}'s default_strategy differs from what the rule picks from its evidence"
    for name, task in TASKS.items():  # no evidence: the incumbent stays
        if name not in evidence["inputs"]:
            assert task.default_strategy == INCUMBENT, name


def _data(aulc: dict[str, list[float]], seconds: dict[str, float]) -> dict:
    return {m: {"aulc": v, "seconds": seconds.get(m, 1.0)} for m, v in aulc.items()}


def test_the_rule_switches_only_on_a_significant_win_and_no_loss():
    pytest.importorskip("scipy")
    pick = _bench().pick_default
    egl = [50.0, 51.0, 49.0, 50.5, 50.2, 49.8]
    noise = [0.1, -0.2, 0.15, -0.1, 0.05, 0.0]
    better = [e + 2 + n for e, n in zip(egl, noise)]     # +2 points every seed: p << 0.05
    tied = [e + n for e, n in zip(egl, noise)]           # within noise
    worse = [e - 2 + n for e, n in zip(egl, noise)]
    one = _data({"random": tied, "egl": egl, "entropy": better}, {"entropy": 0.1})
    tie = _data({"random": tied, "egl": egl, "entropy": tied}, {"entropy": 0.1})
    loss = _data({"random": tied, "egl": egl, "entropy": worse}, {"entropy": 0.1})
    assert pick({"a": one, "b": tie}) == "entropy"        # better once, never worse
    assert pick({"a": tie, "b": tie}) == INCUMBENT         # cheaper but never better: egl stays
    assert pick({"a": one, "b": loss}) == INCUMBENT        # better once, worse once: egl stays
    # random and the benchmark's own peers (mc-var) are never a default, however good
    assert pick({"a": _data({"egl": egl, "random": better, "mc-var": better}, {})}) == INCUMBENT
    # the max aggregate is not a default's option: entropy-max's win does not count for entropy
    assert pick({"a": _data({"egl": egl, "entropy": tied, "entropy-max": better}, {})}) == INCUMBENT
    # classification's names (benchmarks/learning_curves.py): bait is the benchmark's, not alcli's
    assert pick({"a": _data({"egl+div": egl, "bait": better, "margin+div": better}, {})}) == "margin"
    # a strategy counts by its better variant (plain or +div), against egl's better one
    div = _data({"egl": egl, "egl+div": tied, "gradnorm": worse, "gradnorm+div": better}, {})
    assert pick({"a": div}) == "gradnorm"
    # two qualify: the cheaper (mean select seconds per round) wins
    two = _data({"egl": egl, "entropy": better, "margin": better},
                {"entropy": 0.5, "margin": 0.2})
    assert pick({"a": two}) == "margin"


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


def test_inspect_prints_the_tasks_default(in_ws):
    for task in ("classification", "segmentation", "regression"):
        result = CliRunner().invoke(app, ["inspect", "-m", "model.pt", "-c", str(in_ws.config),
                                          "--task", task])
        assert result.exit_code == 0, result.stderr
        assert f"default strategy: {TASKS[task].default_strategy} (when --strategy is not " \
               f"given" in result.stdout, result.stdout


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
