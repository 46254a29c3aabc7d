"""`alcli report`'s page for a large batch: its size and the time to write it, and (with
--screenshot) a picture of a detection round's page for the guide.

    python benchmarks/report_page.py                       # 1,000-item batch of 1,000 images
    python benchmarks/report_page.py --quick               # 50 items
    python benchmarks/report_page.py --screenshot docs/report-detection.png

The batch: N distinct 256x192 JPEG photos (crops of scikit-image's sample images, each with two
to four predicted boxes drawn), a pool table of 10 N rows with 10 classes, an embeddings file of
64-dimensional features, two earlier rounds and labels. Time: `alcli report` in this process,
after one warm-up on a 5-item batch (imports, fonts).

The screenshot's round is scored for real by `alcli score` with torchvision's
fasterrcnn_mobilenet_v3_large_320_fpn at random weights (no download): the page is what is shown,
its boxes are arbitrary.
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from PIL import Image
from skimage import data as samples

from alcli.files.embeddings import save_embeddings

PHOTOS = ("astronaut", "coffee", "chelsea", "rocket", "hubble_deep_field", "immunohistochemistry")


def photos():
    return [np.asarray(Image.fromarray(getattr(samples, n)()).convert("RGB")) for n in PHOTOS]


def write_round(folder: Path, n: int, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    pics = photos()
    classes = [f"class{k}" for k in range(10)]
    pool = 10 * n
    rows = []
    for i in range(pool):
        row = {"id": f"img{i:05d}.jpg", "score": float(rng.gamma(2.0)), "pred": classes[i % 10],
               "confidence": float(rng.uniform(0.3, 1.0)), "width": 256, "height": 192}
        boxes = []
        for _ in range(int(rng.integers(2, 5))):
            x0, y0 = rng.uniform(0, 180), rng.uniform(0, 120)
            boxes.append([x0, y0, x0 + rng.uniform(20, 70), y0 + rng.uniform(20, 60),
                          int(rng.integers(0, 10)), float(rng.uniform(0.3, 1))])
        row["boxes"] = json.dumps(boxes)
        rows.append(row)
    rows.sort(key=lambda r: -r["score"])
    for k, r in enumerate(rows):
        r["rank"] = k + 1
    cols = ["rank", "id", "score", "pred", "confidence", "boxes", "width", "height"]
    for name, part in (("scores.csv", rows), ("batch.csv", rows[:n])):
        with open(folder / name, "w", newline="") as f:
            w = csv.DictWriter(f, cols, extrasaction="ignore")
            w.writeheader()
            w.writerows(part)
    for r in rows[:n]:  # distinct pictures: a random 256x192 crop of a sample photo
        pic = pics[int(rng.integers(len(pics)))]
        y, x = rng.integers(0, pic.shape[0] - 192), rng.integers(0, pic.shape[1] - 256)
        Image.fromarray(pic[y:y + 192, x:x + 256]).save(folder / r["id"], quality=90)
    for k in (1, 2):  # earlier rounds: the same ids, some predictions different
        with open(folder / f"old{k}.csv", "w", newline="") as f:
            w = csv.DictWriter(f, ["id", "score", "pred"])
            w.writeheader()
            w.writerows({"id": r["id"], "score": r["score"],
                         "pred": r["pred"] if rng.random() > 0.05 * k else classes[0]}
                        for r in rows)
    with open(folder / "labels.csv", "w", newline="") as f:
        f.write("id,label\n" + "".join(f"{r['id']},{r['pred']}\n" for r in rows[n:2 * n]))
    save_embeddings(str(folder / "scores.csv.emb.npz"), [r["id"] for r in rows],
                    np.ones((pool, 1), np.float32), rng.normal(size=(pool, 64)).astype(np.float32))


def alcli(folder: Path, *args: str) -> None:
    subprocess.run([sys.executable, "-m", "alcli", *args], cwd=folder, check=True,
                   env={**os.environ, "OMP_NUM_THREADS": "1"})


def measure(n: int) -> str:
    from alcli import report as round_page
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        write_round(folder, n)
        old = os.getcwd()
        os.chdir(folder)
        try:
            times = []
            for _ in range(2):
                began = time.perf_counter()
                rnd = round_page.read_round("scores.csv", "batch.csv", ["old2.csv", "old1.csv"],
                                            "labels.csv")
                text, unreadable = round_page.page(rnd, None)
                Path("round.html").write_text(text)
                times.append(time.perf_counter() - began)
            assert not unreadable
            size = Path("round.html").stat().st_size
        finally:
            os.chdir(old)
    return (f"| {n} | {10 * n} | {size / 1e6:.2f} MB | {size / n / 1e3:.1f} kB | "
            f"{min(times):.1f} s |")


def screenshot(dest: str) -> None:
    import torch
    import torchvision
    from playwright.sync_api import sync_playwright
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        (folder / "imgs").mkdir()
        for name, pic in zip(PHOTOS, photos()):
            Image.fromarray(pic).resize((320, 240)).save(folder / "imgs" / f"{name}.png")
        kwargs = {"num_classes": 4, "box_detections_per_img": 4}
        torch.manual_seed(0)
        model = torchvision.models.detection.fasterrcnn_mobilenet_v3_large_320_fpn(
            weights=None, weights_backbone=None, **kwargs)
        torch.save(model.state_dict(), folder / "det.pt")
        (folder / "names.txt").write_text("background\nperson\ncup\ncat\n")
        common = ["--model", "det.pt", "--arch", "torchvision:fasterrcnn_mobilenet_v3_large_320_fpn",
                  "--arch-kwargs", json.dumps(kwargs), "--box-threshold", "0", "--class-names",
                  "names.txt", "-q"]
        alcli(folder, "score", "imgs", *common, "-s", "entropy", "-o", "old.csv")
        alcli(folder, "score", "imgs", *common, "-s", "gradnorm", "-o", "scores.csv")
        alcli(folder, "select", "scores.csv", "-n", "4", "-o", "batch.csv", "-q")
        alcli(folder, "report", "scores.csv", "--batch", "batch.csv", "--previous", "old.csv",
              "--image-dir", "imgs", "-o", "round.html", "-q")
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=["--no-sandbox"])
            page = browser.new_page(viewport={"width": 900, "height": 700})
            page.goto((folder / "round.html").as_uri())
            page.screenshot(path=str(folder / "shot.png"), full_page=True)
            browser.close()
        shot = Image.open(folder / "shot.png").convert("RGB")
        shot = shot.crop((0, 0, shot.width, min(shot.height, 1100)))
        shot.quantize(64).save(dest, optimize=True)
    print(f"wrote {dest} ({os.path.getsize(dest) / 1e3:.0f} kB)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--screenshot", metavar="PNG")
    args = ap.parse_args()
    if args.screenshot:
        screenshot(args.screenshot)
        return
    print("| batch | pool rows | page | per item | time to write |\n|---|---|---|---|---|")
    for n in ((50,) if args.quick else (100, 1000)):
        print(measure(n), flush=True)


if __name__ == "__main__":
    main()
