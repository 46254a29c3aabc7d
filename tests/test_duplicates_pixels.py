"""Exact duplicates of images by their decoded pixels (alcli.pools.pixel_key, used by
alcli/selection/duplicates.py): real image files written by PIL; the oracle is the test's own
comparison of the decoded arrays (numpy), never alcli's key."""
from __future__ import annotations

import csv
import functools
from pathlib import Path

import numpy as np
from PIL import Image
from PIL.PngImagePlugin import PngInfo
from typer.testing import CliRunner

from alcli.cli import app
from alcli.files.embeddings import save_embeddings
from alcli.pools import pixel_key

REPO = Path(__file__).resolve().parents[1]
runner = CliRunner()


@functools.lru_cache(maxsize=1)
def _digits() -> np.ndarray:
    from sklearn.datasets import load_digits
    return load_digits().images[:3]


def digit(n: int) -> Image.Image:
    """The n-th of scikit-learn's 8x8 digits as a grey 8x8 picture."""
    return Image.fromarray((_digits()[n] * 15).astype(np.uint8), "L")


def same_pixels(a: Path, b: Path) -> bool:
    """The oracle: the decoded pictures are equal, compared as RGBA arrays."""
    return np.array_equal(np.asarray(Image.open(a).convert("RGBA")),
                          np.asarray(Image.open(b).convert("RGBA")))


def pictures(folder: Path) -> dict[str, Path]:
    """One picture in five files (PNG, PNG with other metadata under another name, BMP, TIFF,
    palette PNG), its JPEG re-encoding (other pixels), and two other pictures."""
    folder.mkdir(parents=True)
    im = digit(0)
    meta = PngInfo()
    meta.add_text("Comment", "a copy with other metadata")
    files = {"a.png": lambda p: im.save(p), "z_copy.png": lambda p: im.save(p, pnginfo=meta),
             "a.bmp": lambda p: im.save(p), "a.tif": lambda p: im.save(p),
             "a_palette.png": lambda p: im.convert("P").save(p),
             "a.jpg": lambda p: im.save(p, quality=30),
             "b.png": lambda p: digit(1).save(p), "c.png": lambda p: digit(2).save(p)}
    for name, write in files.items():
        write(folder / name)
    return {name: folder / name for name in files}


def test_one_picture_in_other_files_has_one_key_and_other_pixels_another(tmp_path):
    files = pictures(tmp_path / "pool")
    keys = {name: pixel_key(str(p)) for name, p in files.items()}
    for name, path in files.items():
        assert (keys[name] == keys["a.png"]) == same_pixels(path, files["a.png"]), name
    assert keys["a.bmp"] == keys["z_copy.png"] == keys["a_palette.png"] == keys["a.png"]
    assert len({keys["a.png"], keys["a.jpg"], keys["b.png"], keys["c.png"]}) == 4
    (tmp_path / "not.png").write_bytes(b"not an image")
    assert pixel_key(str(tmp_path / "not.png")) is None
    assert pixel_key(str(tmp_path / "missing.png")) is None


def read_groups(path: Path) -> dict[str, tuple[str, str]]:
    """{id: (group, kind)} of `alcli duplicates`' file."""
    with open(path, newline="") as fh:
        return {r["id"]: (r["group"], r["kind"]) for r in csv.DictReader(fh)}


def test_duplicates_of_a_scored_image_pool_are_exact_by_pixels(tmp_path, monkeypatch):
    """The demo model scores the folder; the copies with the same decoded pixels are one group,
    kind exact, whatever their file's name, metadata or lossless format."""
    files = pictures(tmp_path / "pool")
    monkeypatch.chdir(tmp_path)
    done = runner.invoke(app, ["score", "pool", "-c", str(REPO / "configs/default.yaml"),
                               "-o", "t.csv", "-q"])
    assert done.exit_code == 0, done.stderr
    done = runner.invoke(app, ["duplicates", "t.csv", "-o", "g.csv", "-q"])
    assert done.exit_code == 0, done.stderr
    groups = read_groups(tmp_path / "g.csv")
    twins = {n for n, p in files.items() if same_pixels(p, files["a.png"])}
    assert twins == {"a.png", "z_copy.png", "a.bmp", "a.tif", "a_palette.png"}
    assert {groups[n][0] for n in twins} == {groups["a.png"][0]}
    first = next(n for n in twins if groups[n][1] == "first")
    assert {groups[n][1] for n in twins - {first}} == {"exact"}
    assert groups.get("a.jpg", ("", "near"))[1] != "exact"


def test_pictures_with_the_same_features_but_other_pixels_are_not_one_group(tmp_path):
    """A dead layer gives every picture the same (zero) features: before, their bytes made them
    one exact group; by pixels only the true copy joins its original."""
    files = pictures(tmp_path / "pool")
    names = ["a.png", "b.png", "z_copy.png", "c.png"]
    lines = ["id,score,pred,path"] + [f"{n},{1 - k / 10},0,{files[n]}" for k, n in enumerate(names)]
    (tmp_path / "t.csv").write_text("\n".join(lines) + "\n")
    save_embeddings(str(tmp_path / "t.csv.emb.npz"), names, np.zeros((4, 2)), np.zeros((4, 8)))
    done = runner.invoke(app, ["duplicates", str(tmp_path / "t.csv"), "-o",
                               str(tmp_path / "g.csv"), "-q"])
    assert done.exit_code == 0, done.stderr
    groups = read_groups(tmp_path / "g.csv")
    expected = {n for n in names if same_pixels(files[n], files["a.png"])}
    assert set(groups) == expected == {"a.png", "z_copy.png"}
    assert groups["z_copy.png"][1] == "exact"
