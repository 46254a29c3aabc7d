"""Untrusted files run no code (/work/shared/hostile-inputs.md BAD-3, -4, -5, -15, -23, -26): code
that comes with the files (TorchScript, pickles, an --arch module in the working directory or the
config's folder, a Hugging Face directory's auto_map) runs only when the command line says so;
a config file cannot say so. Each attack leaves a marker file if its code runs."""
from __future__ import annotations

import json
import os
import pickle
import shutil
import struct
import subprocess
import sys
import time
import warnings
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn
from typer.testing import CliRunner

from alcli.cli import app
from alcli.errors import CheckpointError, ConfigError
from alcli.files.checkpoint import build_arch, load_model
from alcli.files.config import load_settings
from cli_errors import assert_one_error
from conftest import TINYNET, parse_csv

REPO = Path(__file__).resolve().parents[1]
runner = CliRunner()


def alcli_proc(cwd, *args, env=None, **kw):
    """`python -m alcli ARGS` in `cwd`: as a user runs it, with `cwd` first on sys.path."""
    return subprocess.run([sys.executable, "-m", "alcli", *map(str, args)], cwd=cwd,
                          env={**os.environ, "PYTHONWARNINGS": "ignore", **(env or {})},
                          capture_output=True, text=True, timeout=300, **kw)


def one_error_line(stderr: str, *needles: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("alcli: error: "), stderr
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


# --- BAD-3: a TorchScript archive runs its own code -------------------------------------------

class _WritesAFile(nn.Module):
    """TinyNet whose forward also creates and fills a file (torch.from_file, shared)."""

    def __init__(self, net: nn.Module, marker: str):
        super().__init__()
        self.net, self.marker = net, marker

    def forward(self, x):
        t = torch.from_file(self.marker, shared=True, size=4, dtype=torch.uint8)
        t.fill_(65)
        return self.net(x) + t[0].float() * 0


def test_torchscript_runs_only_with_trust_checkpoint(in_ws, tmp_path):
    marker = tmp_path / "WRITTEN_BY_MODEL"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.jit is deprecated
        torch.jit.script(_WritesAFile(in_ws.net(torch.float32), str(marker))).save(str(tmp_path / "ts.pt"))
    for args in (["score", "pool", "-m", tmp_path / "ts.pt", "-q", "-o", tmp_path / "s.csv"],
                 ["inspect", "-m", tmp_path / "ts.pt", "--pool", "pool"]):
        result = runner.invoke(app, [str(a) for a in args])
        assert_one_error(result, f"{tmp_path / 'ts.pt'} is a TorchScript archive", args[0])
        assert "pass --trust-checkpoint" in result.stderr
        assert not marker.exists() and not (tmp_path / "s.csv").exists()
    trusted = runner.invoke(app, ["score", "pool", "-m", str(tmp_path / "ts.pt"), "-q", "-o", "-",
                                  "--trust-checkpoint", "-s", "entropy"])
    assert trusted.exit_code == 0, trusted.stderr
    assert len(parse_csv(trusted.stdout)) == len(in_ws.images)
    assert marker.read_bytes() == b"AAAA"  # trusted: its code ran, as documented


# --- BAD-5: --arch module:callable from the working directory or the config's folder -----------

HELPER = TINYNET + '''
import pathlib
pathlib.Path(__file__).with_name("RAN_helper_py").write_text("x")
Net = TinyNet
'''


@pytest.fixture
def untrusted_folder(in_ws, tmp_path):
    """A folder someone sent: ./configs/default.yaml naming `helper:Net` and helper.py beside it."""
    proj = tmp_path / "proj"
    (proj / "configs").mkdir(parents=True)
    shutil.copy(in_ws.model, proj / "configs" / "model.pt")
    shutil.copytree(in_ws.pool / "a", proj / "images")
    (proj / "configs" / "default.yaml").write_text(
        "model: model.pt\narch: helper:Net\narch_kwargs: {num_classes: 3}\npool: ../images\n")
    (proj / "helper.py").write_text(HELPER)
    return proj


def test_implicit_config_cannot_import_code_from_the_working_directory(untrusted_folder, monkeypatch):
    proj = untrusted_folder
    proc = alcli_proc(proj, "score", "-q", "-o", "../o.csv")
    assert proc.returncode == 1 and proc.stdout == "", proc.stderr
    one_error_line(proc.stderr, "arch 'helper:Net'", "helper.py", "working directory",
                   "--trust-checkpoint")
    monkeypatch.chdir(proj)
    assert_one_error(runner.invoke(app, ["inspect"]), "arch 'helper:Net' names code", "inspect")
    assert not (proj / "RAN_helper_py").exists()
    proc = alcli_proc(proj, "score", "-q", "-o", "-", "-s", "entropy", "--trust-checkpoint")
    assert proc.returncode == 0, proc.stderr
    assert len(parse_csv(proc.stdout)) == len(list((proj / "images").rglob("*.png")))
    assert (proj / "RAN_helper_py").exists()


def test_arch_flag_naming_working_directory_code_needs_trust(untrusted_folder, monkeypatch):
    monkeypatch.chdir(untrusted_folder)
    result = runner.invoke(app, ["score", "images", "-m", "configs/model.pt", "--arch", "helper:Net",
                                 "-q", "-o", "-"])
    assert_one_error(result, "names code in the working directory", "--arch helper:Net")
    assert not (untrusted_folder / "RAN_helper_py").exists()
    # an installed module of the same name does not make the local file trusted: the local one
    # is what `python -m alcli` would import (tabnanny: a standard module nothing here imports)
    assert "tabnanny" not in sys.modules
    (untrusted_folder / "tabnanny.py").write_text("raise SystemExit('ran')\n")
    with pytest.raises(CheckpointError, match=r"tabnanny\.py\), not an installed package"):
        build_arch("tabnanny:check", {})


def test_code_in_the_configs_folder_needs_trust(in_ws, tmp_path, monkeypatch):
    """Even when that folder is on sys.path (PYTHONPATH), the config cannot name code beside it."""
    folder = tmp_path / "sent"
    folder.mkdir()
    (folder / "sentnet.py").write_text(HELPER)
    (folder / "cfg.yaml").write_text(f"model: {in_ws.model}\narch: sentnet:Net\n"
                                     f"arch_kwargs: {{num_classes: 3}}\n")
    monkeypatch.syspath_prepend(str(folder))
    result = runner.invoke(app, ["score", "pool", "-c", str(folder / "cfg.yaml"), "-q", "-o", "-"])
    assert_one_error(result, "names code in the config's folder", "a module beside the config")
    assert "sentnet.py" in result.stderr and not (folder / "RAN_helper_py").exists()


def test_installed_and_environment_modules_need_no_flag(in_ws, tmp_path, monkeypatch):
    assert isinstance(build_arch("torch.nn:Linear", {"in_features": 2, "out_features": 3}), nn.Linear)
    assert isinstance(build_arch("tinynet:TinyNet", {}), nn.Module)  # a PYTHONPATH folder (conftest)
    # a site-packages inside the working directory (./.venv) is not the working directory
    site = tmp_path / ".venv" / "lib" / "site-packages"
    site.mkdir(parents=True)
    (site / "venvnet_pkg.py").write_text(TINYNET)
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.chdir(tmp_path)
    assert isinstance(build_arch("venvnet_pkg:TinyNet", {}), nn.Module)
    # alcli's own modules, even from a checkout that is the working directory
    monkeypatch.chdir(REPO)
    assert isinstance(build_arch("alcli.demo:DigitsCNN", {}), nn.Module)


def test_an_installed_function_as_arch_needs_trust(in_ws, tmp_path, monkeypatch):
    """A config naming any installed function would otherwise run it with arch_kwargs as its
    arguments: `subprocess:getoutput` with {cmd: ...} is a shell."""
    monkeypatch.chdir(tmp_path)
    marker = tmp_path / "RAN_shell"
    (tmp_path / "cfg.yaml").write_text(f"model: {in_ws.model}\narch: subprocess:getoutput\n"
                                       f"arch_kwargs: {{cmd: 'touch {marker}'}}\n")
    result = runner.invoke(app, ["score", str(in_ws.pool), "-c", "cfg.yaml", "-q", "-o", "-"])
    assert_one_error(result, "arch 'subprocess:getoutput' is a function, not a torch.nn.Module class",
                     "an installed function")
    assert "--trust-checkpoint" in result.stderr and not marker.exists()
    with pytest.raises(CheckpointError, match="not a torch.nn.Module class"):
        build_arch("torchvision.models:resnet18", {})  # torchvision:resnet18 is the way
    assert isinstance(build_arch("torchvision.models:resnet18", {"num_classes": 3}, trust=True),
                      nn.Module)


def test_the_shipped_demo_config_needs_no_flag(monkeypatch):
    monkeypatch.chdir(REPO)  # ./configs/default.yaml: arch alcli.demo:DigitsCNN
    result = runner.invoke(app, ["inspect"])
    assert result.exit_code == 0, result.stderr
    assert "data/demo/model.pt" in result.stdout


# --- a config file cannot grant trust -----------------------------------------------------------

@pytest.mark.parametrize("key, flag", [("trust_checkpoint", "--trust-checkpoint"),
                                       ("trust_remote_code", "--trust-remote-code")])
def test_a_config_cannot_grant_trust(tmp_path, key, flag):
    (tmp_path / "c.yaml").write_text(f"{key}: true\n")
    with pytest.raises(ConfigError) as err:
        load_settings(tmp_path / "c.yaml")
    assert f"key '{key}' in {tmp_path / 'c.yaml'}" in str(err.value)
    assert "command line only" in str(err.value) and f"pass {flag}" in str(err.value)
    assert getattr(load_settings(None, {key: True}), key) is True  # the flag (or Python argument)


def test_a_config_granting_trust_runs_nothing(in_ws, tmp_path):
    """BAD-5's second half: `trust_checkpoint: true` beside a pickle that would run code."""
    marker = tmp_path / "RAN_pickle"

    class Evil:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    torch.save({"state_dict": Evil()}, tmp_path / "evil.pt")
    (tmp_path / "c.yaml").write_text("model: evil.pt\ntrust_checkpoint: true\n")
    result = runner.invoke(app, ["score", "pool", "-c", str(tmp_path / "c.yaml"), "-q", "-o", "-"])
    assert_one_error(result, "key 'trust_checkpoint'", "trust in a config")
    assert not marker.exists()


# --- BAD-4: Hugging Face remote code (auto_map) --------------------------------------------------

CONFIGURATION_X = '''
import pathlib
pathlib.Path({marker!r}).joinpath("RAN_configuration_x").write_text("x")
from transformers import BertConfig

class XConfig(BertConfig):
    model_type = "xbert"
'''
MODELING_X = '''
import pathlib
pathlib.Path({marker!r}).joinpath("RAN_modeling_x").write_text("x")
from transformers import BertForSequenceClassification
from .configuration_x import XConfig

class XModel(BertForSequenceClassification):
    config_class = XConfig
'''


@pytest.fixture(scope="module")
def remote_code_dir(tmp_path_factory):
    """A real save_pretrained BERT directory turned into one with custom code: config.json names
    model_type xbert (unknown to transformers) and auto_map, beside configuration_x.py and
    modeling_x.py, which leave RAN_* files in `markers` when imported."""
    pytest.importorskip("transformers")
    import hf_models
    root = tmp_path_factory.mktemp("remote")
    hf, markers = root / "hf", root / "markers"
    markers.mkdir()
    torch.manual_seed(0)
    hf_models.bert(len(hf_models.VOCAB)).save_pretrained(hf)
    hf_models.tokenizer(hf).save_pretrained(hf)
    cfg = json.loads((hf / "config.json").read_text())
    cfg.update(model_type="xbert", architectures=["XModel"],
               auto_map={"AutoConfig": "configuration_x.XConfig",
                         "AutoModelForSequenceClassification": "modeling_x.XModel"})
    (hf / "config.json").write_text(json.dumps(cfg))
    (hf / "configuration_x.py").write_text(CONFIGURATION_X.format(marker=str(markers)))
    (hf / "modeling_x.py").write_text(MODELING_X.format(marker=str(markers)))
    (root / "texts.txt").write_text("the cat sat on the mat\na dog ran fast\n")
    return root


def test_remote_code_is_refused_without_a_prompt(remote_code_dir):
    """No flag: one sentence, nothing on stdout, no code run, and no wait on an open stdin that
    sends nothing (transformers' prompt would wait on it), nor a "y" read from it."""
    root = remote_code_dir
    args = [sys.executable, "-m", "alcli", "score", "texts.txt", "-m", "hf", "-s", "loss", "-o", "out.csv"]
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    with open(root / "stdout", "w") as out, open(root / "stderr", "w") as err:
        proc = subprocess.Popen(args, cwd=root, env=env, stdin=subprocess.PIPE, stdout=out, stderr=err)
        start = time.monotonic()
        try:
            rc = proc.wait(timeout=120)  # stdin stays open and silent meanwhile
        finally:
            proc.kill()
            proc.stdin.close()
    assert rc == 1 and (root / "stdout").read_text() == ""
    one_error_line((root / "stderr").read_text(), "model directory hf", "auto_map", "--trust-remote-code")
    assert time.monotonic() - start < 110
    yes = subprocess.run(args, cwd=root, env=env, input="y\n" * 50, capture_output=True, text=True,
                         timeout=120)
    assert yes.returncode == 1 and yes.stdout == ""
    one_error_line(yes.stderr, "--trust-remote-code")
    assert not list((root / "markers").iterdir()) and not (root / "out.csv").exists()


def test_remote_code_runs_with_trust_remote_code(remote_code_dir, tmp_path):
    root = remote_code_dir
    proc = alcli_proc(root, "score", "texts.txt", "-m", "hf", "-s", "entropy", "-q", "-o", "-",
                      "--trust-remote-code", env={"HF_MODULES_CACHE": str(tmp_path / "modules")},
                      stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr
    assert len(parse_csv(proc.stdout)) == 2
    assert {p.name for p in (root / "markers").iterdir()} == {"RAN_configuration_x", "RAN_modeling_x"}
    for p in (root / "markers").iterdir():
        p.unlink()


def test_a_tokenizer_with_auto_map_is_refused(tmp_path):
    pytest.importorskip("transformers")
    import hf_models
    hf = tmp_path / "hf"
    hf_models.bert(len(hf_models.VOCAB)).save_pretrained(hf)
    hf_models.tokenizer(hf).save_pretrained(hf)
    cfg = json.loads((hf / "tokenizer_config.json").read_text())
    cfg["auto_map"] = {"AutoTokenizer": ["tokenization_x.XTokenizer", None]}
    (hf / "tokenizer_config.json").write_text(json.dumps(cfg))
    (tmp_path / "texts.txt").write_text("the cat\n")
    result = runner.invoke(app, ["score", str(tmp_path / "texts.txt"), "-m", str(hf), "-q", "-o", "-"])
    assert_one_error(result, "tokenizer_config.json has auto_map", "custom tokenizer")
    assert "--trust-remote-code" in result.stderr


# --- BAD-15, BAD-26: damaged and foreign .pt files -------------------------------------------------

def _flip_member_bytes(path: Path) -> str:
    """Flip the first 8 bytes of the largest tensor in a torch.save zip; the member's name."""
    with zipfile.ZipFile(path) as zf:
        info = max((i for i in zf.infolist() if "/data/" in i.filename), key=lambda i: i.file_size)
    data = bytearray(path.read_bytes())
    name_len, extra_len = struct.unpack("<HH", data[info.header_offset + 26:info.header_offset + 30])
    start = info.header_offset + 30 + name_len + extra_len
    for i in range(start, start + 8):
        data[i] ^= 0xFF
    path.write_bytes(bytes(data))
    return info.filename


def test_a_corrupted_checkpoint_is_refused(in_ws, tmp_path):
    shutil.copy(in_ws.model, tmp_path / "bad.pt")
    member = _flip_member_bytes(tmp_path / "bad.pt")
    with pytest.raises(CheckpointError) as err:
        load_model(tmp_path / "bad.pt", arch="tinynet:TinyNet", arch_kwargs={"num_classes": 3})
    assert str(err.value) == (f"model file {tmp_path / 'bad.pt'} is damaged: its member {member} "
                              f"fails its CRC check")
    result = runner.invoke(app, ["score", "pool", "-m", str(tmp_path / "bad.pt"), "-c", "config.yaml",
                                 "-q", "-o", "-"])
    assert_one_error(result, member, "a flipped byte in the weights")
    assert isinstance(load_model(in_ws.model, arch="tinynet:TinyNet", arch_kwargs={"num_classes": 3}),
                      nn.Module)  # the intact file loads


def test_random_bytes_are_no_checkpoint_and_not_an_invitation_to_trust(in_ws, tmp_path):
    noise = np.random.default_rng(0).integers(0, 256, 1024, dtype=np.uint8).tobytes()
    (tmp_path / "random.pt").write_bytes(noise)
    (tmp_path / "random80.pt").write_bytes(b"\x80\x00" + noise)  # a pickle's first byte, no protocol
    for name in ("random.pt", "random80.pt"):
        for trust in (False, True):
            with pytest.raises(CheckpointError) as err:
                load_model(tmp_path / name, trust=trust)
            assert "is not a PyTorch checkpoint (it is neither a zip archive nor a pickle" in str(err.value)
            assert "trust" not in str(err.value)
    marker = tmp_path / "RAN_pickle"

    class Evil:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    with open(tmp_path / "plain.pt", "wb") as f:
        pickle.dump({"a": Evil()}, f)  # a real pickle still says what it is
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nor does torch warn ("Detected pickle protocol 4")
        with pytest.raises(CheckpointError, match="holds a pickled Python object"):
            load_model(tmp_path / "plain.pt")
    assert not marker.exists()


# --- BAD-23: a YAML alias bomb -------------------------------------------------------------------

def _alias_bomb(levels: int, key: str = "arch_kwargs") -> str:
    text = f"arch: torch.nn:Linear\n{key}:\n  b0: &b0 [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]\n"
    for i in range(1, levels + 1):
        text += f"  b{i}: &b{i} [" + ", ".join([f"*b{i - 1}"] * 10) + "]\n"
    return text


def test_a_yaml_alias_bomb_is_refused_in_one_short_sentence(in_ws, tmp_path):
    (tmp_path / "bomb.yaml").write_text(_alias_bomb(6))  # 1 KB, 10**7 values expanded
    start = time.monotonic()
    with pytest.raises(ConfigError, match="more than 100000 values once its YAML aliases are expanded"):
        load_settings(tmp_path / "bomb.yaml")
    assert time.monotonic() - start < 10
    (tmp_path / "loop.yaml").write_text("arch_kwargs: {a: &a [*a]}\n")  # a recursive alias
    with pytest.raises(ConfigError, match="YAML aliases"):
        load_settings(tmp_path / "loop.yaml")
    # a smaller one loads, and the messages quoting it stay short
    (tmp_path / "small.yaml").write_text(_alias_bomb(3))
    result = runner.invoke(app, ["score", "pool", "-m", "model.pt", "-c", str(tmp_path / "small.yaml"),
                                 "-q", "-o", "-"])
    assert_one_error(result, "could not be built with arch_kwargs {'b0': [1, 2, 3, 4, ...]", "bomb")
    assert len(result.stderr) < 500
    (tmp_path / "bs.yaml").write_text(_alias_bomb(3, "arch_kwargs") + "batch_size: *b3\n")
    with pytest.raises(ConfigError) as err:
        load_settings(tmp_path / "bs.yaml")
    assert "key 'batch_size'" in str(err.value) and len(str(err.value)) < 400


def test_an_error_quoting_a_huge_config_value_stays_short(in_ws, tmp_path):
    (tmp_path / "long.yaml").write_text("model: " + "/".join(["x" * 200] * 500) + "\n")
    result = runner.invoke(app, ["score", "pool", "-c", str(tmp_path / "long.yaml"), "-q", "-o", "-"])
    assert_one_error(result, "xxx", "a 100 KB model path")
    assert len(result.stderr) < 2100
