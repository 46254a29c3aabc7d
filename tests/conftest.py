"""Shared fixtures for the CLI tests: a small real workspace on disk (model, images, manifest,
tensors, config) and the independent float64 oracle the scores are checked against."""
from __future__ import annotations

import csv
import io
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image

from label_studio_server import server  # noqa: F401  (the Label Studio server tests/integration shares)

# subprocesses (`python -m alcli`, torchrun) run this checkout's alcli, not an installed one,
# whatever their working directory
REPO = Path(__file__).resolve().parents[1]
os.environ["PYTHONPATH"] = os.pathsep.join(
    [str(REPO), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))])

# one intra-op thread in this process and the subprocesses it starts (unless OMP_NUM_THREADS says
# otherwise): the models here are tiny, and on a 2-core CPU shared with other work OpenMP threads
# spin waiting for each other (the Hugging Face engine tests ran 5-10x slower with two)
os.environ.setdefault("OMP_NUM_THREADS", "1")
torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))

TINYNET = textwrap.dedent('''
    import torch
    from torch import nn

    class TinyNet(nn.Module):
        """3x6x6 images -> logits [B, num_classes]."""
        def __init__(self, num_classes=3, channels=3):
            super().__init__()
            self.conv = nn.Conv2d(channels, 4, 3, padding=1)
            self.pool = nn.MaxPool2d(2)
            self.fc = nn.Linear(4 * 3 * 3, num_classes)

        def forward(self, x):
            return self.fc(self.pool(torch.relu(self.conv(x))).flatten(1))
''')
CLASSES = ("a", "b", "c")
MEAN, STD = 0.5, 0.25
CONFIG = textwrap.dedent(f'''
    arch: tinynet:TinyNet
    arch_kwargs: {{num_classes: 3}}
    transform:
      normalize: {{mean: [{MEAN}, {MEAN}, {MEAN}], std: [{STD}, {STD}, {STD}]}}
    batch_size: 5
''')


class Workspace:
    """Paths of the files the `workspace` fixture wrote, plus helpers to read them independently.
    TinyNet lives in `lib`, a folder on sys.path and PYTHONPATH, as a model package the user
    installed: `tinynet:TinyNet` imports without --trust-checkpoint (code in the working
    directory would need it; tests/test_trust.py)."""

    def __init__(self, root: Path):
        self.root = root
        self.lib = root / "lib"
        self.model = root / "model.pt"
        self.pool = root / "pool"
        self.manifest = root / "manifest.csv"
        self.config = root / "config.yaml"
        self.tensors = root / "pool.pt"
        self.images: dict[str, tuple[Path, int]] = {}  # id (relative path) -> (file, label)

    def net(self, dtype=torch.float64):
        from tinynet import TinyNet
        model = TinyNet(3)
        model.load_state_dict(torch.load(self.model, weights_only=True))
        return model.to(dtype).eval()

    def image_input(self, rel: str) -> torch.Tensor:
        """The model input for one image, computed here without alcli: [3, 6, 6] float64."""
        with Image.open(self.images[rel][0]) as img:
            arr = np.asarray(img.convert("RGB"), dtype=np.float64) / 255.0
        return (torch.from_numpy(arr).permute(2, 0, 1) - MEAN) / STD


def oracle_grad_norm(model, x: torch.Tensor, target: int) -> float:
    """The seed's loop for one example: ||d loss(x, target) / d params|| in float64."""
    params = [p for p in model.parameters()]
    loss = F.cross_entropy(model(x[None].double()), torch.tensor([target]))
    grads = torch.autograd.grad(loss, params)
    return float(torch.sqrt(sum(g.pow(2).sum() for g in grads)))


def parse_csv(text: str) -> list[dict]:
    return list(csv.DictReader(io.StringIO(text)))


@pytest.fixture(scope="session")
def workspace(tmp_path_factory) -> Workspace:
    root = tmp_path_factory.mktemp("alcli_ws")
    ws = Workspace(root)
    ws.lib.mkdir()
    (ws.lib / "tinynet.py").write_text(TINYNET)
    sys.path.append(str(ws.lib))  # for this process and, through PYTHONPATH, its subprocesses
    os.environ["PYTHONPATH"] += os.pathsep + str(ws.lib)
    torch.manual_seed(0)
    from tinynet import TinyNet
    net = TinyNet(3)
    with torch.no_grad():
        for p in net.parameters():
            p.mul_(3.0)  # confident but not saturated predictions: scores spread out
    torch.save(net.state_dict(), ws.model)

    rng = np.random.default_rng(0)
    rows = []
    for i in range(14):
        label = i % 3
        ext = {5: ".jpg", 7: ".bmp"}.get(i, ".png")
        sub = f"{CLASSES[label]}/deep" if i == 9 else CLASSES[label]
        rel = f"{sub}/img{i:02d}{ext}"
        path = ws.pool / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(rng.integers(0, 256, (6, 6, 3), dtype=np.uint8), "RGB").save(path)
        ws.images[rel] = (path, label)
        rows.append((rel, f"pool/{rel}", label))
    (ws.pool / "notes.txt").write_text("not an image\n")
    with open(ws.manifest, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["id", "path", "label"])
        w.writerows(rows)
    ws.config.write_text(CONFIG)
    ids = sorted(ws.images)
    x = torch.stack([ws.image_input(r) for r in ids]).float()
    y = torch.tensor([ws.images[r][1] for r in ids])
    torch.save({"x": x, "y": y, "ids": ids}, ws.tensors)
    return ws


@pytest.fixture
def in_ws(workspace, monkeypatch) -> Workspace:
    """Run inside the workspace, whose relative paths (model.pt, pool, config.yaml) tests use."""
    monkeypatch.chdir(workspace.root)
    return workspace


def score_in(root, *args, ok=True):
    """`alcli score ARGS -q -o -` run with `root` as the working directory (Typer's CliRunner);
    checked to exit 0 unless `ok` is False."""
    from typer.testing import CliRunner
    from alcli.cli import app
    old = os.getcwd()
    os.chdir(root)
    try:
        result = CliRunner().invoke(app, ["score", *map(str, args), "-q", "-o", "-"])
    finally:
        os.chdir(old)
    if ok:
        assert result.exit_code == 0, result.stderr + result.stdout
    return result


@pytest.fixture(scope="session")
def demo_run() -> subprocess.CompletedProcess:
    """`python -m alcli score` with no arguments, from the checkout's root: the shipped demo
    (configs/default.yaml, 400 digits) ranked once for the tests that read its table or summary."""
    return subprocess.run([sys.executable, "-m", "alcli", "score"], cwd=REPO, capture_output=True,
                          text=True, timeout=300,
                          env={**os.environ, "PYTHONWARNINGS": "ignore", "COLUMNS": "100"})


@pytest.fixture
def one_thread():
    """Byte-for-byte comparisons between runs: one intra-op thread keeps reductions in one order."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
