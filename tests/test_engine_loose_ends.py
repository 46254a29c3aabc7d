"""Issue 53's loose ends: every classification strategy runs from the command line with
embeddings on and off, and scores the same either way (gradnorm once read its targets before the
forward that sets the logits had run, hidden when the embeddings' forward ran first)."""
from __future__ import annotations

import csv

import pytest
import torch
from torch import nn

from alcli.score.strategies import STRATEGIES
from shell import invoke_in

CLASSIFICATION = [name for name in STRATEGIES if name != "uncertain-boxes"]


@pytest.fixture(scope="module")
def tiny_pool(tmp_path_factory):
    root = tmp_path_factory.mktemp("loose_ends")
    torch.manual_seed(0)
    x, y = torch.randn(7, 4), torch.randint(0, 3, (7,))
    y[4:] = -1  # some labeled, some not
    torch.save({"x": x, "y": y}, root / "pool.pt")
    torch.save({"x": torch.randn(5, 4), "y": torch.randint(0, 3, (5,))}, root / "target.pt")
    torch.save(nn.Linear(4, 3).state_dict(), root / "lin.pt")
    return root


def scores(root, name: str, embeddings: bool) -> dict[str, float]:
    out = f"{name}-{embeddings}.csv"
    args = ["score", "pool.pt", "-m", "lin.pt", "--arch", "torch.nn:Linear", "--arch-kwargs",
            '{"in_features": 4, "out_features": 3}', "-s", name, "-b", "3", "-q", "-o", out,
            "--embeddings" if embeddings else "--no-embeddings"]
    if name == "align":
        args += ["--target", "target.pt"]
    result = invoke_in(root, *args)
    assert result.exit_code == 0, result.output
    with open(root / out, newline="") as f:
        return {r["id"]: float(r["score"]) for r in csv.DictReader(f)}


@pytest.mark.parametrize("name", CLASSIFICATION)
def test_every_strategy_with_embeddings_on_and_off(tiny_pool, name):
    on, off = scores(tiny_pool, name, True), scores(tiny_pool, name, False)
    assert len(off) == 7 and on.keys() == off.keys()
    for i in on:
        assert off[i] == pytest.approx(on[i], rel=1e-12, abs=1e-15), (name, i)



def test_multilabel_egl_pseudo_with_embeddings_on_and_off(tiny_pool):
    """egl --egl-samples pseudo (the norm at the predicted labels) read its targets before the
    engine's forward too."""
    torch.save({"x": torch.load(tiny_pool / "pool.pt")["x"]}, tiny_pool / "unlabeled.pt")
    got = {}
    for embeddings in (True, False):
        out = f"ml-{embeddings}.csv"
        result = invoke_in(tiny_pool, "score", "unlabeled.pt", "-m", "lin.pt", "--arch", "torch.nn:Linear",
                           "--arch-kwargs", '{"in_features": 4, "out_features": 3}', "--task", "multilabel",
                           "-s", "egl", "--egl-samples", "pseudo", "-b", "3", "-q", "-o", out,
                           "--embeddings" if embeddings else "--no-embeddings")
        assert result.exit_code == 0, result.output
        with open(tiny_pool / out, newline="") as f:
            got[embeddings] = {r["id"]: float(r["score"]) for r in csv.DictReader(f)}
    assert len(got[False]) == 7 and got[True].keys() == got[False].keys()
    for i in got[True]:
        assert got[False][i] == pytest.approx(got[True][i], rel=1e-12, abs=1e-15), i
