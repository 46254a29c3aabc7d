"""`alcli simulate --strategies align --target T` (issue 54): each round's picks are the top of
align's unlabeled form on the rows not yet selected, sqrt(E_y~p[(g_i(y)·ḡ)²]) / ‖ḡ‖, computed here
in float64 for the round's logistic regression (ḡ: the target rows' mean cross-entropy gradient)
with no alcli code; the pool's labels, hidden until selected, never reach the score (the cosine at
the true label picks other rows here). Bad targets: one sentence, exit 1."""
from __future__ import annotations

import csv
import json

import pytest
import torch
import torch.nn.functional as F

from cli_errors import assert_one_error
from shell import PYTHON, invoke_in
from test_simulate import TOY, TRAIN, toy_table

ARCH = ("--arch", "torch.nn:Linear", "--arch-kwargs", '{"in_features": 4, "out_features": 3}',
        "--trust-checkpoint")
TRAIN_CMD = PYTHON + " train.py {labeled} {model} {workdir}/keep-{strategy}-{seed}-{round}"
PLAN = ("--eval", "test.pt", *ARCH, "--train", TRAIN_CMD, "--init", 6, "-n", 5, "--seeds", 1, "-q")


@pytest.fixture()
def folder(tmp_path):
    torch.save(toy_table(45, 0), tmp_path / "pool.pt")
    torch.save(toy_table(12, 1), tmp_path / "test.pt")
    target = toy_table(12, 2)
    rare = target["y"] == 2  # a target of one class
    torch.save({"x": target["x"][rare], "y": target["y"][rare]}, tmp_path / "target.pt")
    torch.save({"x": target["x"][rare]}, tmp_path / "unlabeled.pt")
    torch.save({"x": torch.randn(3, 5), "y": torch.tensor([0, 1, 2])}, tmp_path / "wide.pt")
    (tmp_path / "toy.py").write_text(TOY)
    (tmp_path / "train.py").write_text(TRAIN)
    return tmp_path


def scores_by_hand(state: dict, x: torch.Tensor, y: torch.Tensor, xt: torch.Tensor,
                   yt: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(unlabeled spread, cosine at the true label) per pool row, float64, one row at a time."""
    w = state["weight"].double().requires_grad_()
    b = state["bias"].double().requires_grad_()

    def grad(xi, c):  # the loss gradient of one row at class c, flattened [15]
        loss = F.cross_entropy((xi.double() @ w.T + b)[None], torch.tensor([c]))
        return torch.cat([g.reshape(-1) for g in torch.autograd.grad(loss, (w, b))])

    gbar = torch.stack([grad(xi, int(c)) for xi, c in zip(xt, yt)]).mean(0)
    spread, cosine = [], []
    for xi, yi in zip(x, y):
        p = torch.softmax(xi.double() @ w.detach().T + b.detach(), 0)
        dots = torch.stack([grad(xi, c) @ gbar for c in range(3)])
        spread.append((p * dots ** 2).sum().sqrt() / gbar.norm())
        g = grad(xi, int(yi))
        cosine.append(g @ gbar / (g.norm() * gbar.norm()))
    return torch.stack(spread), torch.stack(cosine)


def test_each_round_picks_the_top_of_the_unlabeled_form(folder):
    result = invoke_in(folder, "simulate", "pool.pt", *PLAN, "--rounds", 2, "--strategies", "align",
                       "--target", "target.pt", "-o", "curves.csv", "--workdir", "runs")
    assert result.exit_code == 0, result.stderr
    pool, target = torch.load(folder / "pool.pt"), torch.load(folder / "target.pt")
    index = {i: n for n, i in enumerate(pool["ids"])}
    leaked = 0
    for r in range(2):
        with open(folder / f"runs/align/seed0/round{r}/labeled.csv") as f:
            labeled = [row["id"] for row in csv.DictReader(f)]
        picked = json.loads((folder / f"runs/align/seed0/round{r}/done.json").read_text())["picked"]
        rest = [i for i in pool["ids"] if i not in labeled]
        rows = [index[i] for i in rest]
        state = torch.load(folder / f"runs/keep-align-0-{r}.pt")
        spread, cosine = scores_by_hand(state, pool["x"][rows], pool["y"][rows], target["x"], target["y"])
        order = spread.argsort(descending=True)
        assert spread[order[4]] > spread[order[5]] + 1e-9  # no tie at the cut
        assert set(picked) == {rest[int(n)] for n in order[:5]}, r
        leaked += set(picked) != {rest[int(n)] for n in cosine.argsort(descending=True)[:5]}
    assert leaked == 2  # the true labels would have chosen otherwise: the test can tell


def test_bad_targets_are_one_sentence(folder):
    cases = [(("--strategies", "align,margin", "--target", "unlabeled.pt"),
              "the target unlabeled.pt has no labels; align takes"),
             (("--strategies", "margin", "--target", "target.pt"),
              "option --target is read by the align strategy alone"),
             (("--strategies", "align",), "--strategies align needs --target POOL"),
             (("--strategies", "align", "--target", "wide.pt"),  # found by round 0's selection
              "round selection with align (seed 0): the model cannot run on examples of shape [5] from wide.pt")]
    for extra, culprit in cases:
        result = invoke_in(folder, "simulate", "pool.pt", *PLAN, "--rounds", 1, *extra,
                           "-o", "c.csv", "--workdir", "bad")
        assert_one_error(result, culprit, str(extra))
