"""--strategy align (issue 54) against its definition, computed here one example at a time in
float64 with torch's own losses: ḡ the mean of the target rows' loss gradients; a labeled row's
cos(g_i, ḡ); an unlabeled row's sqrt(E_y~p[(g_i(y)·ḡ)²]) / ‖ḡ‖ over every class (classification)
or over egl's sampled label sets (segmentation). No alcli code computes the oracle's numbers."""
from __future__ import annotations

import copy
import csv

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import task_models as tm
from alcli import tasks
from alcli.files.config import Settings
from alcli.gradnorm.model_io import forward_logits
from alcli.pools.tensors import tensor_pool
from alcli.gradnorm.params import selection_for
from alcli.score.align import TargetGradient
from alcli.score.strategies import STRATEGIES, StrategyInputs
from alcli.score.target import target_for
from alcli.tasks.common import sampled
from cli_errors import assert_one_error
from shell import invoke_in


def mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 3)).double().eval()


def flat_grad(model, loss, names) -> torch.Tensor:
    params = dict(model.named_parameters())
    grads = torch.autograd.grad(loss, [params[n] for n in names], allow_unused=True, retain_graph=True)
    return torch.cat([(g if g is not None else torch.zeros_like(params[n])).reshape(-1)
                      for g, n in zip(grads, names)])


def oracle_target(model, xt, yt, names) -> torch.Tensor:
    return torch.stack([flat_grad(model, F.cross_entropy(model(xt[j:j + 1]), yt[j:j + 1]), names)
                        for j in range(len(yt))]).mean(0)


def as_target(gbar: torch.Tensor, model, names) -> TargetGradient:
    params, vectors, at = dict(model.named_parameters()), {}, 0
    for n in names:
        k = params[n].numel()
        vectors[n] = gbar[at:at + k].reshape(params[n].shape)
        at += k
    return TargetGradient(vectors, float(gbar.norm()), 0, "test")


@pytest.mark.parametrize("layers", [None, ["2"]])
def test_classification_cosines_and_spreads_against_the_loop(layers):
    model = mlp()
    g = torch.Generator().manual_seed(3)
    x, xt = torch.randn(9, 4, generator=g, dtype=torch.float64), torch.randn(5, 4, generator=g, dtype=torch.float64)
    y, yt = torch.tensor([0, 2, 1, 1, -1, -1, 0, -1, 2]), torch.tensor([1, 0, 2, 2, 1])
    names = selection_for(model, layers).names
    gbar = oracle_target(model, xt, yt, names)
    s = StrategyInputs(model=model, inputs=x, labels=y, logits=None, ids=[f"r{i}" for i in range(9)],
                       layers=layers, target=as_target(gbar, model, names))
    got = STRATEGIES["align"].fn(s)["score"]
    want = torch.empty(9, dtype=torch.float64)
    for i in range(9):
        z = model(x[i:i + 1])
        if y[i] >= 0:
            gi = flat_grad(model, F.cross_entropy(z, y[i:i + 1]), names)
            want[i] = gi @ gbar / (gi.norm() * gbar.norm())
        else:
            p = torch.softmax(z, 1)[0].detach()
            dots = torch.stack([flat_grad(model, F.cross_entropy(z, torch.tensor([c])), names) @ gbar
                                for c in range(3)])
            want[i] = (p * dots ** 2).sum().sqrt() / gbar.norm()
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-14)
    assert got[y >= 0].abs().max() <= 1 and (got[y < 0] > 0).all()


def test_the_target_gradient_is_the_mean_of_the_target_rows():
    model = mlp()
    g = torch.Generator().manual_seed(5)
    xt, yt = torch.randn(7, 4, generator=g, dtype=torch.float64), torch.tensor([0, 1, 2, 0, 1, 2, 2])
    names = selection_for(model, None).names
    settings = Settings(strategy="align", target="t.pt", batch_size=3, task="classification")
    got = target_for(settings, model, torch.device("cpu"), lambda s: tensor_pool(xt, yt))
    want = oracle_target(model, xt, yt, names)
    torch.testing.assert_close(torch.cat([got.vectors[n].reshape(-1) for n in names]), want,
                               rtol=1e-12, atol=1e-15)
    assert got.rows == 7 and abs(got.norm - float(want.norm())) < 1e-12


def test_a_target_row_without_a_label_is_one_sentence():
    model = mlp()
    settings = Settings(strategy="align", target="t.pt", task="classification")
    with pytest.raises(Exception, match="the row '1' has no label"):
        target_for(settings, model, torch.device("cpu"),
                   lambda s: tensor_pool(torch.randn(3, 4, dtype=torch.float64), torch.tensor([0, -1, 1])))


@pytest.mark.parametrize("name, task, data", [
    ("unet", "segmentation", lambda: tm.images(4, 16).double()),
    ("bert_tokens", "token-classification", lambda: tm.tokens(4)),
    ("bert_multilabel", "multilabel", lambda: tm.tokens(4))])
def test_other_tasks_cosines_and_sampled_spreads_against_the_loop(name, task, data):
    model = copy.deepcopy(getattr(tm, name)()).double().eval()
    x = data()
    names = selection_for(model, None).names
    with torch.no_grad():
        z = forward_logits(model, x)
    labels = tasks.sampled(task, z, tasks.valid_positions(task, z, x), list(range(4)), 1, 9)[0]
    known = torch.tensor([True, True, False, False])

    def loss(i, t):  # example i's loss at targets t (its own row), float64, alone
        out = model(**tm._one(x, i)) if isinstance(x, dict) else model(tm._one(x, i))
        return tm.oracle_loss(task, tm._logits(out)[:1], t)

    gbar = torch.stack([flat_grad(model, loss(j, labels[j:j + 1]), names) for j in range(2)]).mean(0)
    unknown = torch.full_like(labels, tm.IGNORE) if task != "multilabel" else labels
    s = StrategyInputs(model=model, inputs=x, labels=torch.full((4,), -1), logits=None,
                       ids=[f"s{i}" for i in range(4)], task=task, egl_samples=3,
                       given=lambda logits: (torch.where(known.view(-1, *[1] * (labels.dim() - 1)),
                                                         labels, unknown), known),
                       target=as_target(gbar, model, names))
    got = STRATEGIES["align"].fn(s)["score"]
    sets = sampled(s.spec, z, s.valid, s.ids, 3, 0)
    want = torch.empty(4, dtype=torch.float64)
    for i in range(4):
        if known[i]:
            gi = flat_grad(model, loss(i, labels[i:i + 1]), names)
            want[i] = gi @ gbar / (gi.norm() * gbar.norm())
        else:
            dots = [flat_grad(model, loss(i, t[i:i + 1]), names) @ gbar for t in sets]
            want[i] = torch.stack(dots).square().mean().sqrt() / gbar.norm()
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-14)


def test_align_from_the_command_line(tmp_path):
    torch.manual_seed(0)
    x, y = torch.randn(12, 4), torch.randint(0, 3, (12,))
    y[8:] = -1
    xt, yt = torch.randn(6, 4), torch.randint(0, 3, (6,))
    torch.save({"x": x, "y": y}, tmp_path / "pool.pt")
    torch.save({"x": xt, "y": yt}, tmp_path / "target.pt")
    lin = nn.Linear(4, 3)
    torch.save(lin.state_dict(), tmp_path / "lin.pt")
    arch = ["-m", "lin.pt", "--arch", "torch.nn:Linear", "--arch-kwargs",
            '{"in_features": 4, "out_features": 3}', "--no-embeddings", "-q"]
    result = invoke_in(tmp_path, "score", "pool.pt", *arch, "-s", "align", "--target", "target.pt",
                       "-o", "a.csv")
    assert result.exit_code == 0, result.output
    with open(tmp_path / "a.csv", newline="") as f:
        got = {int(r["id"]): float(r["score"]) for r in csv.DictReader(f)}
    model = lin.double()
    names = ["weight", "bias"]
    gbar = oracle_target(model, xt.double(), yt, names)
    for i in range(12):
        z = model(x[i:i + 1].double())
        if y[i] >= 0:
            gi = flat_grad(model, F.cross_entropy(z, y[i:i + 1]), names)
            want = float(gi @ gbar / (gi.norm() * gbar.norm()))
        else:
            p = torch.softmax(z, 1)[0].detach()
            dots = torch.stack([flat_grad(model, F.cross_entropy(z, torch.tensor([c])), names) @ gbar
                                for c in range(3)])
            want = float((p * dots ** 2).sum().sqrt() / gbar.norm())
        assert got[i] == pytest.approx(want, rel=1e-4, abs=1e-6), i
    # --target alone, align without --target, a target without labels: one sentence each
    torch.save({"x": xt}, tmp_path / "unlabeled.pt")
    torch.save({"x": xt, "y": torch.tensor([0, 1, 2, 5, 1, 1])}, tmp_path / "past.pt")
    torch.save({"x": torch.randn(6, 5), "y": yt}, tmp_path / "wide.pt")
    for args, culprit in [(["--target", "target.pt", "-s", "margin"], "is read by --strategy align alone"),
                          (["-s", "align"], "--strategy align needs --target POOL"),
                          (["-s", "align", "--target", "unlabeled.pt"], "has no label"),
                          # the target is pre-flight checked as a pool: its labels, its inputs
                          (["-s", "align", "--target", "past.pt"], "example 3 of past.pt has label 5, but the model has 3 classes"),
                          (["-s", "align", "--target", "wide.pt"], "cannot run on examples of shape [5] from wide.pt")]:
        assert_one_error(invoke_in(tmp_path, "score", "pool.pt", *arch, *args, "-o", "b.csv"),
                         culprit, str(args))
