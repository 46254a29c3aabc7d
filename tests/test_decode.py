"""--decode gpu: JPEG files handed over as bytes and decoded (and sized) on the device. Here the
device is the CPU, which runs the same path as CUDA but for nvJPEG."""
import numpy as np
import pytest
import torch
from PIL import Image
from typer.testing import CliRunner

from alcli.cli import app
from alcli.files.config import Transform
from alcli.pools import open_pool
from alcli.pools.common import PoolOptions, collate
from conftest import parse_csv

runner = CliRunner()
NORM = {"mean": [0.5, 0.5, 0.5], "std": [0.25, 0.25, 0.25]}


@pytest.fixture
def jpegs(tmp_path):
    rng = np.random.default_rng(0)
    for i in range(9):
        size = (12, 10) if i % 2 else (10, 12)  # mixed shapes: resize + crop make them one
        arr = rng.integers(0, 256, (*size, 3), dtype=np.uint8)
        Image.fromarray(arr).save(tmp_path / f"im{i}.jpg", quality=95)
    return tmp_path


def _pool(folder, decode, transform):
    return open_pool(str(folder), PoolOptions(transform=transform, channels=3, decode=decode))


def test_device_decoding_matches_the_loaders(jpegs):
    t = Transform(resize=8, center_crop=6, normalize=NORM)
    cpu, dev = _pool(jpegs, "cpu", t), _pool(jpegs, "gpu", t)
    a = cpu.to_float(collate([cpu[i] for i in range(9)]).inputs)
    batch = collate([dev[i] for i in range(9)])
    assert isinstance(batch.inputs, list) and batch.inputs[0].dtype == torch.uint8  # bytes travel
    b = dev.to_float(batch.inputs, torch.device("cpu"))
    assert a.shape == b.shape == (9, 3, 6, 6)
    # same decoder family (libjpeg); resizing differs slightly between PIL and torchvision
    assert (a - b).abs().mean() < 0.05
    t_plain = Transform(normalize=NORM)  # no resize: decoded pixels as PIL decodes them
    same = [_pool(jpegs, d, t_plain) for d in ("cpu", "gpu")]
    x = same[0].to_float(collate([same[0][0]]).inputs)
    y = same[1].to_float(collate([same[1][0]]).inputs, torch.device("cpu"))
    torch.testing.assert_close(x, y)


def test_a_non_jpeg_is_skipped_with_its_reason(jpegs, in_ws):
    Image.new("RGB", (10, 12)).save(jpegs / "x.png")
    dev = _pool(jpegs, "gpu", Transform(resize=8, center_crop=6))
    item = dev[dev.ids.index("x.png")]
    assert item.input is None and "not a JPEG file (--decode gpu decodes JPEGs only)" in item.error


def test_score_with_device_decoding_ranks_like_the_loaders(jpegs, in_ws):
    (jpegs / "cfg.yaml").write_text("transform: {resize: 8, center_crop: 6, normalize: "
                                    "{mean: [0.5, 0.5, 0.5], std: [0.25, 0.25, 0.25]}}\n")
    args = ["score", str(jpegs), "-m", "model.pt", "--arch", "tinynet:TinyNet", "-c",
            str(jpegs / "cfg.yaml"), "-s", "entropy", "-q", "-o", "-"]
    rows = {}
    for decode in ("cpu", "gpu"):
        result = runner.invoke(app, args + ["--decode", decode])
        assert result.exit_code == 0, result.stderr
        rows[decode] = parse_csv(result.stdout)
    assert sorted(r["id"] for r in rows["cpu"]) == sorted(r["id"] for r in rows["gpu"])
    cpu = {r["id"]: float(r["score"]) for r in rows["cpu"]}
    gpu = {r["id"]: float(r["score"]) for r in rows["gpu"]}
    assert max(abs(cpu[i] - gpu[i]) for i in cpu) < 0.05 * max(cpu.values())
