"""timm and safetensors: `--arch timm:NAME --arch-kwargs JSON` with weights in a .safetensors file
(never unpickled) or a timm training checkpoint (`state_dict`, `state_dict_ema` with --ema),
scored through the CLI against a float64 per-example loop."""
from __future__ import annotations

import argparse

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image
from typer.testing import CliRunner

from alcli.errors import CheckpointError
from alcli.files.checkpoint import load_model
from cli_errors import assert_one_error
from conftest import score_in as cli
from conftest import parse_csv

timm = pytest.importorskip("timm")
safetensors_torch = pytest.importorskip("safetensors.torch")

runner = CliRunner()
ARCH = ["--arch", "timm:test_resnet", "--arch-kwargs", '{"num_classes": 3}']


@pytest.fixture(scope="module")
def timm_ws(tmp_path_factory):
    root = tmp_path_factory.mktemp("timm_ws")
    torch.manual_seed(0)
    model = timm.create_model("test_resnet", pretrained=False, num_classes=3).eval()
    with torch.no_grad():  # running stats away from 0/1, so BatchNorm in eval mode is checked
        for m in model.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.running_mean.uniform_(-0.5, 0.5)
                m.running_var.uniform_(0.5, 2.0)
    safetensors_torch.save_file(model.state_dict(), str(root / "model.safetensors"))
    ema = {k: v + 0.01 if v.is_floating_point() else v for k, v in model.state_dict().items()}
    torch.save({"epoch": 3, "arch": "test_resnet", "state_dict": model.state_dict(),
                "state_dict_ema": {f"module.{k}": v for k, v in ema.items()},
                "args": argparse.Namespace(model="test_resnet", lr=0.1, img_size=None)},
               root / "checkpoint.pth.tar")
    rng = np.random.default_rng(0)
    (root / "images").mkdir()
    for i in range(5):
        Image.fromarray(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)).save(root / "images" / f"im{i}.png")
    return root


def test_timm_model_from_safetensors_scores_an_image_pool(timm_ws):
    rows = parse_csv(cli(timm_ws, "images", "-m", "model.safetensors", *ARCH, "-b", "2",
                         "-s", "gradnorm").stdout)
    model = timm.create_model("test_resnet", pretrained=False, num_classes=3)
    model.load_state_dict(safetensors_torch.load_file(str(timm_ws / "model.safetensors")))
    model = model.double().eval()
    params = list(model.parameters())
    assert len(rows) == 5
    for r in rows:
        x = torch.from_numpy(np.array(Image.open(timm_ws / "images" / r["id"]))).permute(2, 0, 1)
        logits = model(x.double()[None] / 255)
        pred = int(logits.argmax())
        grads = torch.autograd.grad(F.cross_entropy(logits, torch.tensor([pred])), params)
        assert int(r["pred"]) == pred
        assert float(r["score"]) == pytest.approx(float(torch.sqrt(sum(g.square().sum() for g in grads))),
                                                  rel=1e-4), r["id"]


def test_timm_training_checkpoint_and_its_ema_weights(timm_ws):
    plain = load_model(timm_ws / "checkpoint.pth.tar", arch="timm:test_resnet", arch_kwargs={"num_classes": 3})
    ema = load_model(timm_ws / "checkpoint.pth.tar", arch="timm:test_resnet", arch_kwargs={"num_classes": 3},
                     ema=True)
    saved = torch.load(timm_ws / "checkpoint.pth.tar", weights_only=False)
    for name, p in plain.state_dict().items():
        assert torch.equal(p, saved["state_dict"][name])
        assert torch.equal(ema.state_dict()[name], saved["state_dict_ema"][f"module.{name}"])
    scores = {r["id"]: r["score"] for r in parse_csv(cli(timm_ws, "images", "-m", "checkpoint.pth.tar",
                                                         *ARCH, "--ema", "-s", "entropy").stdout)}
    assert len(scores) == 5


@pytest.mark.parametrize("args, culprit", [
    (["-m", "model.safetensors", "--arch", "timm:no_such_net"], "timm has no model named 'no_such_net'"),
    (["-m", "model.safetensors"], "holds weights only; give the architecture with --arch"),
    (["-m", "model.safetensors", *ARCH, "--ema"], "is a .safetensors file, which holds one set of weights"),
    (["-m", "model.safetensors", "--arch", "timm:test_resnet"], "check arch_kwargs (e.g. num_classes)"),
    (["-m", "model.safetensors", "--arch", "timm:test_resnet", "--arch-kwargs", "{num_classes: 3}"],
     "option --arch-kwargs must be a JSON mapping"),
    (["-m", "model.safetensors", "--arch", "timm:test_resnet", "--arch-kwargs", "[3]"],
     "option --arch-kwargs must be a mapping of names to values"),
    (["-m", "broken.safetensors", *ARCH], "is not a readable .safetensors file"),
])
def test_timm_and_safetensors_errors_are_one_sentence(timm_ws, args, culprit):
    (timm_ws / "broken.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json")
    assert_one_error(cli(timm_ws, "images", *args, ok=False), culprit, " ".join(args))


def test_ema_missing_from_a_checkpoint(tmp_path):
    torch.save({"state_dict": torch.nn.Linear(2, 3).state_dict()}, tmp_path / "c.pt")
    with pytest.raises(CheckpointError, match="holds no EMA weights"):
        load_model(tmp_path / "c.pt", arch="torch.nn:Linear", arch_kwargs={"in_features": 2, "out_features": 3},
                   ema=True)
