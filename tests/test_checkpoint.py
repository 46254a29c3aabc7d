"""Checkpoint loading: the forms real training code writes, and one clear error for the rest."""
import warnings

import pytest
import torch
from torch import nn

from alcli.files.checkpoint import build_arch, load_model
from alcli.errors import CheckpointError

ARCH = "tinynet:TinyNet"
KW = {"num_classes": 3}


def same_outputs(a: nn.Module, b: nn.Module):
    x = torch.randn(4, 3, 6, 6, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        return torch.equal(a(x), b(x))


@pytest.fixture
def reference(in_ws):
    return in_ws.net(torch.float32)


def test_plain_state_dict_needs_arch(in_ws, reference):
    model = load_model(in_ws.model, arch=ARCH, arch_kwargs=KW)
    assert not model.training and same_outputs(model, reference)
    with pytest.raises(CheckpointError, match="holds weights only; give the architecture with --arch"):
        load_model(in_ws.model)


@pytest.mark.parametrize("wrap", [
    lambda sd: {"state_dict": {f"model.{k}": v for k, v in sd.items()}, "epoch": 1,
                "loops": {"fit": 1}, "optimizer_states": [{}]},                       # Lightning
    lambda sd: {f"module.{k}": v for k, v in sd.items()},                              # DDP
    lambda sd: {"model": {f"_orig_mod.{k}": v for k, v in sd.items()}},                # torch.compile
    lambda sd: {"model_state_dict": {f"model.module.{k}": v for k, v in sd.items()}, "step": 3},
    lambda sd: {"state_dict": {**{f"model.{k}": v for k, v in sd.items()},
                               "criterion.weight": torch.ones(3)}},                   # other modules
])
def test_nested_and_prefixed_dicts(in_ws, reference, tmp_path, wrap):
    torch.save(wrap(torch.load(in_ws.model)), tmp_path / "c.pt")
    assert same_outputs(load_model(tmp_path / "c.pt", arch=ARCH, arch_kwargs=KW), reference)


def test_mismatches_list_the_first_keys(in_ws, tmp_path):
    sd = torch.load(in_ws.model)
    torch.save({**sd, "fc.weight": torch.zeros(5, 36)}, tmp_path / "shape.pt")
    with pytest.raises(CheckpointError, match=r"fc.weight is \[5, 36\] in the file but \[3, 36\] in the model"):
        load_model(tmp_path / "shape.pt", arch=ARCH, arch_kwargs=KW)
    torch.save({"conv.weight": sd["conv.weight"], **{f"extra{i}": torch.zeros(1) for i in range(6)}},
               tmp_path / "keys.pt")
    with pytest.raises(CheckpointError) as err:
        load_model(tmp_path / "keys.pt", arch=ARCH, arch_kwargs=KW)
    msg = str(err.value)
    assert "missing conv.bias, fc.weight, fc.bias" in msg and "unexpected extra0" in msg
    assert "(and 2 more)" in msg and "\n" not in msg


def test_pickled_models_need_trust(in_ws, reference, tmp_path):
    torch.save(reference, tmp_path / "whole.pt")
    torch.save({"model": reference, "epoch": 2}, tmp_path / "inside.pt")
    for name in ("whole.pt", "inside.pt"):
        with pytest.raises(CheckpointError, match="runs code from the file; pass --trust-checkpoint"):
            load_model(tmp_path / name)
        assert same_outputs(load_model(tmp_path / name, trust=True), reference)


def test_torchscript_archive(in_ws, reference, tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.jit.save(torch.jit.script(reference), tmp_path / "ts.pt")
    with pytest.raises(CheckpointError, match="TorchScript archive, whose own code runs"):
        load_model(tmp_path / "ts.pt")
    assert same_outputs(load_model(tmp_path / "ts.pt", trust=True), reference)


def test_torch_export_archive_is_refused_clearly(in_ws, reference, tmp_path):
    torch.export.save(torch.export.export(reference, (torch.randn(2, 3, 6, 6),)), tmp_path / "e.pt2")
    with pytest.raises(CheckpointError, match="torch.export archive"):
        load_model(tmp_path / "e.pt2")


def test_not_a_checkpoint_and_missing_file(tmp_path):
    (tmp_path / "x.pt").write_text("hello")
    with pytest.raises(CheckpointError, match="x.pt is not a PyTorch checkpoint"):
        load_model(tmp_path / "x.pt", arch=ARCH)
    with pytest.raises(CheckpointError, match="does not exist"):
        load_model(tmp_path / "none.pt")
    torch.save({"epoch": 3}, tmp_path / "empty.pt")
    with pytest.raises(CheckpointError, match="holds no state_dict or model"):
        load_model(tmp_path / "empty.pt", arch=ARCH)


def test_build_arch(in_ws):
    assert isinstance(build_arch(ARCH, KW), nn.Module)
    net = build_arch("torchvision:resnet18", {"num_classes": 7})  # weights=None: no download
    assert net.fc.out_features == 7
    cases = [("resnet18", "must be torchvision:NAME, timm:NAME or package.module:callable"),
             ("torchvision:resnet1000", "torchvision has no model named 'resnet1000'"),
             ("nosuch.module:X", "cannot import module 'nosuch.module'"),
             ("tinynet:Nope", "has no attribute 'Nope'"),
             ("tinynet:torch", "is not callable"),
             ("torch:zeros", "not a torch.nn.Module")]
    for spec, needle in cases:
        with pytest.raises(CheckpointError, match=needle):
            build_arch(spec, {"size": [1]} if spec == "torch:zeros" else {})
    with pytest.raises(CheckpointError, match=r"could not be built with arch_kwargs \{'colour': 1\}"):
        build_arch(ARCH, {"colour": 1})
