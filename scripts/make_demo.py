"""Build the shipped demo in data/demo/ from scikit-learn's bundled 8x8 digits (no download).

    pip install -e '.[dev]' && python scripts/make_demo.py

Writes, all from a fixed seed:
  data/demo/model.pt       state_dict of alcli.demo:DigitsCNN trained on the training split
  data/demo/pool/D/N.png   the held-out split as 8x8 grayscale PNGs, D = true digit, N = sklearn index
  data/demo/manifest.csv   id,path,label for the same images (paths relative to the manifest)
  data/demo/pool.npz       the same pool as model-ready tensors: x [N,1,8,8], y [N], ids [N]
configs/default.yaml points at them, so `alcli score` with no arguments ranks the pool.
"""
from __future__ import annotations

import argparse
import csv
import shutil
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

from alcli.demo import DigitsCNN

ROOT = Path(__file__).resolve().parents[1]
POOL_SIZE = 400
MEAN, STD = 0.3, 0.4  # of the training pixels scaled to [0, 1], rounded; also in configs/default.yaml


def load_digits_uint8():
    """The 1797 digits as uint8 images [N, 8, 8] (0..16 scaled to 0..255, as the PNGs store them)."""
    from sklearn.datasets import load_digits
    digits = load_digits()
    images = np.round(digits.images * (255.0 / 16.0)).astype(np.uint8)
    return images, digits.target.astype(np.int64)


def to_model_input(images: np.ndarray) -> torch.Tensor:
    """uint8 [N, 8, 8] -> normalized float32 [N, 1, 8, 8], exactly what the image pool yields."""
    x = torch.from_numpy(images).float().div(255.0).unsqueeze(1)
    return (x - MEAN) / STD


def split(n: int, seed: int):
    order = np.random.default_rng(seed).permutation(n)
    return np.sort(order[POOL_SIZE:]), np.sort(order[:POOL_SIZE])  # train, pool


def train(x: torch.Tensor, y: torch.Tensor, seed: int, epochs: int) -> DigitsCNN:
    torch.manual_seed(seed)
    model = DigitsCNN()
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    gen = torch.Generator().manual_seed(seed)
    for _ in range(epochs):
        for idx in torch.randperm(len(x), generator=gen).split(64):
            opt.zero_grad()
            F.cross_entropy(model(x[idx]), y[idx]).backward()
            opt.step()
    return model.eval()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT / "data" / "demo")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--epochs", type=int, default=8)
    args = ap.parse_args()

    images, labels = load_digits_uint8()
    train_idx, pool_idx = split(len(images), args.seed)
    x_train, y_train = to_model_input(images[train_idx]), torch.from_numpy(labels[train_idx])
    model = train(x_train, y_train, args.seed, args.epochs)

    x_pool, y_pool = to_model_input(images[pool_idx]), torch.from_numpy(labels[pool_idx])
    with torch.no_grad():
        acc_train = (model(x_train).argmax(1) == y_train).float().mean().item()
        acc_pool = (model(x_pool).argmax(1) == y_pool).float().mean().item()

    out: Path = args.out
    shutil.rmtree(out / "pool", ignore_errors=True)
    out.mkdir(parents=True, exist_ok=True)
    torch.save(model.state_dict(), out / "model.pt")
    rows = []
    for i in pool_idx:
        rel = f"pool/{labels[i]}/{i:04d}.png"
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(images[i], mode="L").save(out / rel, optimize=True)
        rows.append({"id": rel[len("pool/"):], "path": rel, "label": int(labels[i])})
    with open(out / "manifest.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=["id", "path", "label"], lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
    np.savez_compressed(out / "pool.npz", x=x_pool.numpy(), y=y_pool.numpy(),
                        ids=np.array([r["id"] for r in rows]))
    size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    print(f"train {len(train_idx)} examples, accuracy {acc_train:.3f}; pool {len(pool_idx)} examples, "
          f"accuracy {acc_pool:.3f}; wrote {out} ({size / 1024:.0f} KiB)")


if __name__ == "__main__":
    main()
