"""Strategies against their definitions, computed independently in float64."""
import inspect
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from alcli.score.strategies import STRATEGIES, StrategyInputs, seeded_uniform


def mlp(dtype=torch.float64):
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(5, 7), nn.Tanh(), nn.Linear(7, 4)).to(dtype).eval()


def inputs(model, labels=None, **kw):
    x = torch.randn(6, 5, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    labels = torch.full((6,), -1) if labels is None else torch.tensor(labels)
    with torch.no_grad():
        logits = model(x)
    return StrategyInputs(model=model, inputs=x, labels=labels, logits=logits,
                          ids=[f"e{i}" for i in range(6)], **kw)


def loop_norm(model, x, target):
    loss = F.cross_entropy(model(x[None]), torch.tensor([target]))
    grads = torch.autograd.grad(loss, list(model.parameters()))
    return math.sqrt(sum(float(g.pow(2).sum()) for g in grads))


def test_registry_is_uniform():
    assert set(STRATEGIES) == {"egl", "gradnorm", "align", "loss", "entropy", "margin",
                               "least-confidence", "random", "uncertain-boxes", "review"}
    for s in STRATEGIES.values():
        assert list(inspect.signature(s.fn).parameters) == ["s"] and s.help
    assert {n for n, s in STRATEGIES.items() if s.gradients} == {"egl", "gradnorm", "align", "review"}


def test_egl_exact_and_top_classes():
    model = mlp()
    s = inputs(model)
    p = torch.softmax(s.logits, 1)
    full = STRATEGIES["egl"].fn(s)
    s.top_classes = 2
    top = STRATEGIES["egl"].fn(s)
    assert "mass_left" not in full
    for i in range(6):
        norms = [loop_norm(model, s.inputs[i], c) for c in range(4)]
        expected = sum(float(p[i, c]) * norms[c] for c in range(4))
        assert float(full["score"][i]) == pytest.approx(expected, rel=1e-6)
        best = torch.argsort(p[i], descending=True)[:2].tolist()
        assert float(top["score"][i]) == pytest.approx(sum(float(p[i, c]) * norms[c] for c in best), rel=1e-6)
        assert float(top["mass_left"][i]) == pytest.approx(1 - float(p[i, best].sum()), abs=1e-12)


def test_egl_default_is_top_10_beyond_10_classes_and_0_is_exact():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 7), nn.Tanh(), nn.Linear(7, 12)).double().eval()
    s = inputs(model)
    p = torch.softmax(s.logits, 1)
    default = STRATEGIES["egl"].fn(s)          # top_classes None: the 10 most probable of 12
    s.top_classes = 0
    exact = STRATEGIES["egl"].fn(s)            # 0: all 12, exact
    assert "mass_left" not in exact
    for i in range(6):
        norms = [loop_norm(model, s.inputs[i], c) for c in range(12)]
        best = torch.argsort(p[i], descending=True)[:10].tolist()
        assert float(exact["score"][i]) == pytest.approx(sum(float(p[i, c]) * norms[c] for c in range(12)), rel=1e-6)
        assert float(default["score"][i]) == pytest.approx(sum(float(p[i, c]) * norms[c] for c in best), rel=1e-6)
        assert float(default["mass_left"][i]) == pytest.approx(1 - float(p[i, best].sum()), abs=1e-12)


def test_gradnorm_uses_labels_where_known():
    model = mlp()
    s = inputs(model, labels=[3, -1, 0, 2, -1, 1])
    out = STRATEGIES["gradnorm"].fn(s)["score"]
    pred = s.logits.argmax(1)
    for i, label in enumerate(s.labels.tolist()):
        target = label if label >= 0 else int(pred[i])
        assert float(out[i]) == pytest.approx(loop_norm(model, s.inputs[i], target), rel=1e-6)


def test_gradnorm_honours_layers():
    model = mlp()
    s = inputs(model, layers=["2"])
    out = STRATEGIES["gradnorm"].fn(s)["score"]
    for i in range(6):
        target = int(s.logits[i].argmax())
        loss = F.cross_entropy(model(s.inputs[i][None]), torch.tensor([target]))
        grads = torch.autograd.grad(loss, list(model[2].parameters()))
        assert float(out[i]) == pytest.approx(math.sqrt(sum(float(g.pow(2).sum()) for g in grads)), rel=1e-6)


def test_uncertainty_strategies_match_numpy():
    logits = torch.tensor([[2.0, 1.0, 0.1], [0.0, 0.0, 0.0], [5.0, -1.0, 4.9]], dtype=torch.float64)
    s = StrategyInputs(model=None, inputs=None, labels=torch.tensor([1, -1, -1]), logits=logits, ids=list("abc"))
    p = np.exp(logits.numpy()) / np.exp(logits.numpy()).sum(1, keepdims=True)
    srt = np.sort(p, 1)[:, ::-1]
    np.testing.assert_allclose(STRATEGIES["entropy"].fn(s)["score"], -(p * np.log(p)).sum(1))
    np.testing.assert_allclose(STRATEGIES["least-confidence"].fn(s)["score"], 1 - srt[:, 0])
    margin = STRATEGIES["margin"].fn(s)
    np.testing.assert_allclose(margin["margin"], srt[:, 0] - srt[:, 1])
    np.testing.assert_allclose(margin["score"], 1 - (srt[:, 0] - srt[:, 1]))
    assert int(torch.argmax(margin["score"])) == 1  # smallest margin ranks first
    loss = STRATEGIES["loss"].fn(s)["score"]
    np.testing.assert_allclose(loss, [-np.log(p[0, 1]), -np.log(p[1, 0]), -np.log(p[2, 0])])


def test_random_depends_on_seed_and_id_only():
    s = StrategyInputs(model=None, inputs=None, labels=torch.full((3,), -1), logits=torch.zeros(3, 2),
                       ids=["x", "y", "z"], seed=7)
    a = STRATEGIES["random"].fn(s)["score"].tolist()
    assert a == [seeded_uniform(7, i) for i in "xyz"]
    assert all(0 <= v < 1 for v in a) and len(set(a)) == 3
    assert seeded_uniform(8, "x") != a[0]
