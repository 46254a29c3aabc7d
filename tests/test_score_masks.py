"""`alcli score --task segmentation` writes each row's predicted mask (argmax, class indices) at
its image's original size into OUTPUT.masks/, named in the row's `pred_mask`, which `push` turns
into brush pre-labels. Checked against the model's argmax computed here, each original pixel
taking the model's pixel under its centre (exact fractions, one pixel at a time)."""
from __future__ import annotations

import csv
import math
import os
from fractions import Fraction
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from typer.testing import CliRunner

import task_models as tm
from alcli.cli import app

SIZES = [(20, 30), (40, 18), (33, 33)]  # (height, width), all different
UNET = ["--arch", "task_models:TinyUNet", "--trust-checkpoint"]  # tests/ is on sys.path
MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]


def run(root: Path, *args):
    old = os.getcwd()
    os.chdir(root)
    try:
        result = CliRunner().invoke(app, [str(a) for a in args])
    finally:
        os.chdir(old)
    assert result.exit_code == 0, result.stderr + result.stdout
    return result


def oracle(model, path: Path) -> np.ndarray:
    """The model's argmax on the image as alcli prepares it (24x24, bilinear), resized to the
    image's own size (nearest, pixel centres)."""
    with Image.open(path) as img:
        w, h = img.size
        x = np.asarray(img.convert("RGB").resize((24, 24), Image.BILINEAR), dtype=np.float32) / 255
    x = (torch.from_numpy(x).permute(2, 0, 1) - torch.tensor(MEAN).view(3, 1, 1)) / torch.tensor(STD).view(3, 1, 1)
    with torch.no_grad():
        labels = model(x[None]).argmax(1, keepdim=True).float()  # [1, 1, 24, 24]
    labels = labels[0, 0].to(torch.uint8).numpy()
    out = np.zeros((h, w), np.uint8)
    for y in range(h):  # each pixel: the model's pixel under its centre, in exact fractions
        for x in range(w):
            out[y, x] = labels[math.floor(Fraction(2 * y + 1, 2 * h) * 24), math.floor(Fraction(2 * x + 1, 2 * w) * 24)]
    return out


def test_score_writes_each_rows_predicted_mask_at_its_images_size(tmp_path):
    rng = np.random.default_rng(0)
    (tmp_path / "imgs").mkdir()
    for i, (h, w) in enumerate(SIZES):
        Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(tmp_path / "imgs" / f"i {i}.png")
    model = tm.unet()
    torch.save(model.state_dict(), tmp_path / "seg.pt")
    run(tmp_path, "score", "imgs", "--model", "seg.pt", *UNET, "--normalize", "imagenet", "--resize", "24x24",
        "--task", "segmentation", "--strategy", "entropy", "-b", "2", "-o", "out.csv", "-q")
    with open(tmp_path / "out.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 3
    assert len({r["pred_mask"] for r in rows}) == 3
    classes_seen = set()
    for row in rows:
        mask_path = tmp_path / row["pred_mask"]  # relative to the table's folder
        assert mask_path.parent == tmp_path / "out.csv.masks"
        with Image.open(mask_path) as img:
            got = np.array(img)
        want = oracle(model, tmp_path / "imgs" / row["id"])
        assert got.shape == want.shape  # the original (height, width)
        np.testing.assert_array_equal(got, want)
        classes_seen |= set(np.unique(want).tolist())
    assert len(classes_seen) > 1  # the masks are not one flat class


def test_no_masks_folder_for_a_table_on_stdout(tmp_path):
    (tmp_path / "imgs").mkdir()
    Image.fromarray(np.zeros((16, 16, 3), np.uint8)).save(tmp_path / "imgs" / "a.png")
    torch.save(tm.unet().state_dict(), tmp_path / "seg.pt")
    out = run(tmp_path, "score", "imgs", "--model", "seg.pt", *UNET, "--task", "segmentation", "--strategy", "entropy",
              "-o", "-", "-q")
    assert "pred_mask" not in out.stdout.splitlines()[0]
    assert out.stderr.count("predicted masks are not written") == 1
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".masks")] == []
