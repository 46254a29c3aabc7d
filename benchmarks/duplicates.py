"""Near-duplicates (alcli/selection/duplicates.py): how well the groups find planted copies, what
the search costs at scale, and what `select` passes over on the demo.

    python benchmarks/duplicates.py copies           # demo digits + copies; texts + copies
    python benchmarks/duplicates.py scale --sizes 5000,20000,100000,300000 [--faiss-only-above 20000]
    python benchmarks/duplicates.py demo             # select -n 20 with and without dedup
    python benchmarks/duplicates.py million [--rows 1000000 --d 384]  # alcli duplicates / select
    python benchmarks/duplicates.py all --quick      # every part, small (a test runs this)

copies: 100 of the demo's 400 digit images (data/demo/pool) each get four copies (JPEG quality 75,
resized to 6x6 and back, a 1-pixel crop resized back, brightness x1.2), all scored with the demo
model (configs/default.yaml); per threshold, the recall of each kind of copy (its cosine to its
original), and the pair precision / recall / F1 of the groups (two rows in one group vs. planted
from one original). Texts: numpy's docstrings' first sentences, 100 with a copy in other case and
whitespace, grouped by the normalized text key.
million: a table of N rows (id, score, pred) with its .emb.npz written by save_embeddings (as
score writes it; D=384, a sentence encoder's width), 0.5% of the rows planted copies of another
row with noise x(1 + sigma eps), sigma uniform in [0.01, 0.08] (cosines 0.997-1, around the
threshold); `alcli duplicates` and `alcli select -n 100` (dedup on, with and without --diverse),
each in a child process: wall time, peak RSS and PSS; then the recall of the groups against an
exact search for a sample of rows (each sampled row's neighbours at or above the threshold among
all N, by blocks from the memory map).
scale: random-ish features (ReLU of normals, D=512) with 1% planted copies (+1% noise), stored as
a .npy read through a memory map; each size in a child process: the exact blocked search and
faiss's inverted file (index build, then query), wall time and the child's peak RSS (psutil).
"""
from __future__ import annotations

import argparse
import csv
import io
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from alcli.selection import duplicates as dup  # noqa: E402

KINDS = ("jpeg", "resize", "crop", "bright")
GRID = (0.99, 0.995, 0.997, 0.998, 0.999, 0.9995)


def _env() -> dict:
    return {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}


def _alcli(*args, cwd) -> subprocess.CompletedProcess:
    out = subprocess.run([sys.executable, "-m", "alcli", *map(str, args)], cwd=cwd, env=_env(),
                         capture_output=True, text=True)
    if out.returncode:
        raise SystemExit(f"alcli {' '.join(map(str, args))} failed: {out.stderr}")
    return out


# --- copies -----------------------------------------------------------------------------------

def _copy(kind: str, im):
    from PIL import Image, ImageEnhance
    if kind == "jpeg":
        buf = io.BytesIO()
        im.save(buf, "JPEG", quality=75)
        buf.seek(0)
        return Image.open(buf).convert("L")
    if kind == "resize":
        return im.resize((6, 6), Image.BILINEAR).resize((8, 8), Image.BILINEAR)
    if kind == "crop":
        return im.crop((0, 0, 7, 7)).resize((8, 8), Image.BILINEAR)
    return ImageEnhance.Brightness(im).enhance(1.2)


def planted_pool(folder: Path, originals: int, seed: int = 0) -> None:
    """The demo pool as o_<class>_<name>, and four copies c_<kind>_<class>_<name> of `originals`."""
    from PIL import Image
    files = sorted((REPO / "data/demo/pool").glob("*/*.png"))
    folder.mkdir(parents=True, exist_ok=True)
    for f in files:
        Image.open(f).save(folder / f"o_{f.parent.name}_{f.name}")
    for f in random.Random(seed).sample(files, originals):
        im = Image.open(f).convert("L")
        for kind in KINDS:
            _copy(kind, im).save(folder / f"c_{kind}_{f.parent.name}_{f.name}")


def _origin(id_: str) -> str:
    return id_[2:] if id_.startswith("o_") else id_.split("_", 2)[2]


def pair_scores(ids: list[str], first: np.ndarray) -> tuple[float, float, float]:
    """(precision, recall, F1) of the pairs in one group against the pairs from one original."""
    group: dict[int, list[str]] = {}
    for id_, f in zip(ids, first):
        group.setdefault(int(f), []).append(id_)
    found = {frozenset((a, b)) for g in group.values() for k, a in enumerate(g) for b in g[k + 1:]}
    origin: dict[str, list[str]] = {}
    for id_ in ids:
        origin.setdefault(_origin(id_), []).append(id_)
    true = {frozenset((a, b)) for g in origin.values() for k, a in enumerate(g) for b in g[k + 1:]}
    hit = len(found & true)
    p = hit / len(found) if found else 1.0
    r = hit / len(true) if true else 1.0
    return p, r, (2 * p * r / (p + r) if p + r else 0.0)


def copies(quick: bool) -> list[str]:
    from alcli.files.embeddings import open_features
    from alcli.files.table import read_table
    lines = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        planted_pool(tmp / "pool", 20 if quick else 100)
        _alcli("score", "pool", "-c", REPO / "configs/default.yaml", "-o", "t.csv", "-q", cwd=tmp)
        rows = sorted(read_table(tmp / "t.csv"), key=lambda r: int(r["rank"]))
        file_ids, b = open_features(str(tmp / "t.csv.emb.npz"))
        ids = [str(r["id"]) for r in rows]
        x = dup.Features(file_ids, b)(ids)[:]
    unit = x / np.linalg.norm(x, axis=1, keepdims=True)
    where = {i: n for n, i in enumerate(ids)}
    n_orig = sum(i.startswith("o_") for i in ids)
    lines.append(f"demo digits: {n_orig} originals, {len(ids) - n_orig} copies "
                 f"({', '.join(KINDS)}), features D={x.shape[1]} (the demo CNN's penultimate layer)")
    lines.append("")
    lines.append("| threshold | " + " | ".join(f"recall {k}" for k in KINDS)
                 + " | pair precision | pair recall | F1 | rows passed over |")
    lines.append("|---" * (5 + len(KINDS)) + "|")
    for t in GRID:
        recall = []
        for kind in KINDS:
            mine = [n for n, i in enumerate(ids) if i.startswith(f"c_{kind}_")]
            orig = [where["o_" + _origin(ids[n])] for n in mine]
            recall.append(float(np.mean((unit[mine] * unit[orig]).sum(1) >= t)))
        g = dup.groups(x, t, keys=[None] * len(ids))
        p, r, f1 = pair_scores(ids, g.first)
        mark = " (default)" if t == dup.THRESHOLD else ""
        lines.append(f"| {t}{mark} | " + " | ".join(f"{v:.2f}" for v in recall)
                     + f" | {p:.3f} | {r:.3f} | {f1:.3f} | {int((~g.kept()).sum())} |")
    lines.append("")
    lines.extend(text_copies(quick))
    return lines


def text_copies(quick: bool) -> list[str]:
    """Texts: the key (lowercase, whitespace collapsed) finds case and whitespace copies whatever
    the features; each text's features here are independent noise, so only the key can."""
    texts = sorted({(getattr(np, name).__doc__ or "").strip().split("\n")[0]
                    for name in dir(np) if not name.startswith("_")} - {""})
    rng = random.Random(0)
    copied = rng.sample(texts, 20 if quick else 100)

    def mangle(t: str) -> str:
        words = t.split(" ")
        return "  ".join(w.upper() if rng.random() < 0.5 else w for w in words) + " \n"
    rows = [{"id": f"o_{n}", "text": t} for n, t in enumerate(texts)]
    rows += [{"id": f"c_text_{texts.index(t)}", "text": mangle(t)} for t in copied]
    x = np.random.default_rng(0).normal(size=(len(rows), 64)).astype(np.float32)
    found = dup.groups(x, dup.THRESHOLD, keys=dup.row_keys(rows, x))
    ids = [r["id"] for r in rows]
    origin = [i[2:] if i.startswith("o_") else i.split("_", 2)[2] for i in ids]
    group: dict[int, set] = {}
    for o, f in zip(origin, found.first):
        group.setdefault(int(f), set()).add(o)
    pairs = sum(len(g) > 1 for g in group.values())
    same_text = len(texts) - len({dup.text_key(t) for t in texts})
    caught = sum(1 for n, r in enumerate(rows) if r["id"].startswith("c_")
                 and found.first[n] == ids.index("o_" + r["id"].split("_", 2)[2]))
    return [f"texts: {len(texts)} first lines of numpy docstrings, {len(copied)} copies in other "
            f"case and whitespace: {caught}/{len(copied)} copies grouped with their original by "
            f"the text key (exact: {int(found.exact.sum())} rows); groups mixing two originals: "
            f"{pairs} ({same_text} originals share a normalized text)"]


# --- scale ------------------------------------------------------------------------------------

def make_features(path: Path, n: int, d: int, seed: int = 0, block: int = 65_536) -> None:
    """n random-ish rows (ReLU of normals) with 1% planted copies (+1% noise), to a .npy."""
    out = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=(n, d))
    rng = np.random.default_rng(seed)
    for s in range(0, n, block):
        out[s:s + block] = np.maximum(rng.standard_normal((min(block, n - s), d), np.float32), 0)
    copies = rng.choice(n, size=(n // 100, 2), replace=False)
    for a, b in copies:
        out[b] = out[a] * (1 + 0.01 * rng.standard_normal(d, np.float32))
    out.flush()
    del out


def child(args) -> None:
    """One measurement in this process: prints JSON."""
    import torch
    torch.set_num_threads(args.threads)
    x = np.load(args.file, mmap_mode="r")
    out = {}
    if args.method == "exact":
        t = time.perf_counter()
        i, _, _ = dup.pairs_exact(x, args.threshold)
        out = {"query_s": time.perf_counter() - t, "pairs": len(i)}
    else:
        t = time.perf_counter()
        index = dup.ivf_index(x)
        out["build_s"] = time.perf_counter() - t
        t = time.perf_counter()
        i, _, _ = dup.search(index, x, args.threshold)
        out.update(query_s=time.perf_counter() - t, pairs=len(i))
    print(json.dumps(out))


def scale(sizes: list[int], d: int, threads: int, exact_up_to: int) -> list[str]:
    from _memory import run_measured
    lines = [f"D={d}, {threads} thread(s), threshold {dup.THRESHOLD}, 1% planted copies; "
             f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs", "",
             "| rows | method | index build s | query s | pairs found / planted | peak RSS MiB | "
             "features file MiB |", "|---|---|---|---|---|---|---|"]
    with tempfile.TemporaryDirectory(dir=os.environ.get("DUP_TMP")) as tmp:
        for n in sizes:
            path = Path(tmp) / f"x{n}.npy"
            make_features(path, n, d)
            for method in ("exact", "faiss"):
                if method == "exact" and n > exact_up_to:
                    continue
                cmd = [sys.executable, __file__, "_child", "--file", str(path), "--method", method,
                       "--threshold", str(dup.THRESHOLD), "--threads", str(threads)]
                done, _, rss = run_measured(cmd, _env(), REPO)
                if done.returncode:
                    lines.append(f"| {n} | {method} | failed: {done.stderr.strip()[-200:]} |")
                    continue
                got = json.loads(done.stdout.strip().splitlines()[-1])
                build = f"{got['build_s']:.1f}" if "build_s" in got else "-"
                lines.append(f"| {n:,} | {method} | {build} | {got['query_s']:.1f} | "
                             f"{got['pairs']:,} / {n // 100:,} | {rss / 2**20:.0f} | "
                             f"{path.stat().st_size / 2**20:.0f} |")
                print(lines[-1], flush=True)
            path.unlink()
    return lines


# --- million ------------------------------------------------------------------------------------

def million_table(folder: Path, n: int, d: int, seed: int = 0, block: int = 65_536) -> np.ndarray:
    """t.csv and t.csv.emb.npz of n rows; returns the planted pairs [P, 2] (original, copy)."""
    from alcli.files.embeddings import save_embeddings
    rng = np.random.default_rng(seed)
    x = np.lib.format.open_memmap(folder / "x.npy", mode="w+", dtype=np.float32, shape=(n, d))
    for s in range(0, n, block):
        x[s:s + block] = np.maximum(rng.standard_normal((min(block, n - s), d), np.float32), 0)
    planted = rng.choice(n, size=(n // 200, 2), replace=False)
    sigma = rng.uniform(0.01, 0.08, len(planted)).astype(np.float32)
    for (a, b), s in zip(planted, sigma):
        x[b] = x[a] * (1 + s * rng.standard_normal(d, np.float32))
    x.flush()
    ids = [f"r{i:07d}" for i in range(n)]
    score = rng.random(n)
    with open(folder / "t.csv", "w") as fh:
        fh.write("id,score,pred\n")
        fh.writelines(f"{i},{v:.6f},{k % 10}\n" for k, (i, v) in enumerate(zip(ids, score)))
    save_embeddings(str(folder / "t.csv.emb.npz"), ids, np.zeros((n, 2), np.float32), x)
    del x
    return planted


def exact_neighbours(x, sample: np.ndarray, threshold: float, block: int = 65_536) -> dict:
    """{sampled row: set of rows whose cosine with it is >= threshold}, by blocks of x."""
    q = dup._unit(x[np.sort(sample)]).numpy()
    rows = np.sort(sample)
    found: dict[int, set] = {int(r): set() for r in rows}
    for s in range(0, len(x), block):
        cos = q @ dup._unit(x[s:s + block]).numpy().T                # [sample, block]
        i, j = np.nonzero(cos >= threshold)
        for a, b in zip(rows[i], j + s):
            if a != b:
                found[int(a)].add(int(b))
    return found


def million(n: int, d: int, sample: int) -> list[str]:
    from _memory import run_measured
    lines = [f"N={n:,} rows, D={d}, threshold {dup.THRESHOLD}, {n // 200:,} planted copies "
             f"(sigma 0.01-0.08); OMP_NUM_THREADS={_env()['OMP_NUM_THREADS']}; load average "
             f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs", "",
             "| command | wall s | peak RSS MiB | peak PSS MiB | result |", "|---|---|---|---|---|"]
    with tempfile.TemporaryDirectory(dir=os.environ.get("DUP_TMP")) as tmp:
        tmp = Path(tmp)
        t = time.perf_counter()
        planted = million_table(tmp, n, d)
        emb = tmp / "t.csv.emb.npz"
        print(f"table written in {time.perf_counter() - t:.0f} s; embeddings file "
              f"{emb.stat().st_size / 2**20:.0f} MiB", flush=True)
        runs = [("duplicates", ["duplicates", "t.csv", "-o", "groups.csv"]),
                ("select -n 100 --no-diverse", ["select", "t.csv", "-n", "100", "--no-diverse",
                                                "-o", "b1.csv"]),
                ("select -n 100", ["select", "t.csv", "-n", "100", "-o", "b2.csv"])]
        for name, args in runs:
            t = time.perf_counter()
            done, pss, rss = run_measured([sys.executable, "-m", "alcli", *args], _env(), tmp)
            wall = time.perf_counter() - t
            said = done.stderr.strip().splitlines() or ["-"]
            note = next((ln for ln in said if "passed over" in ln), said[-1])
            note = note.split(" (")[0][:160].replace("|", "/")
            if done.returncode:
                note = f"failed: {done.stderr.strip()[-300:]}"
            lines.append(f"| alcli {name} | {wall:.0f} | {rss / 2**20:.0f} | {pss / 2**20:.0f} | "
                         f"{note} |")
            print(lines[-1], flush=True)
        with open(tmp / "groups.csv", newline="") as fh:
            groups = list(csv.DictReader(fh))
        group_of = {int(r["id"][1:]): int(r["group"]) for r in groups}
        x = np.load(tmp / "x.npy", mmap_mode="r")
        rng = np.random.default_rng(1)
        pick = np.unique(np.concatenate([rng.choice(n, sample, replace=False),
                                         planted[rng.choice(len(planted), sample // 2, replace=False)].ravel()]))
        t = time.perf_counter()
        truth = exact_neighbours(x, pick, dup.THRESHOLD)
        with_dup = [r for r, nb in truth.items() if nb]
        listed = sum(r in group_of for r in with_dup)
        together = sum(any(group_of.get(r) == group_of.get(b) for b in truth[r]) for r in with_dup
                       if r in group_of)
        false = sum(1 for r, nb in truth.items() if not nb and r in group_of)
        cos = (dup._unit(x[planted[:, 0]]) * dup._unit(x[planted[:, 1]])).sum(1).numpy()
        above = cos >= dup.THRESHOLD
        same = np.array([group_of.get(int(a), -1) == group_of.get(int(b), -2) for a, b in planted])
        lines += ["", f"groups: {len({r['group'] for r in groups}):,}, rows listed "
                  f"{len(groups):,}; exact search for {len(pick):,} sampled rows (half of them "
                  f"from planted pairs) took {time.perf_counter() - t:.0f} s", "",
                  "| measure | value |", "|---|---|",
                  f"| sampled rows with a neighbour >= threshold (exact search) | {len(with_dup):,} |",
                  f"| of them listed in a group (recall) | {listed:,} ({listed / max(1, len(with_dup)):.4f}) |",
                  f"| of them in one group with such a neighbour | {together:,} ({together / max(1, len(with_dup)):.4f}) |",
                  f"| sampled rows without one, listed anyway | {false:,} |",
                  f"| planted pairs with cosine >= threshold | {int(above.sum()):,} of {len(planted):,} |",
                  f"| of them in one group | {int(same[above].sum()):,} ({same[above].mean():.4f}) |",
                  f"| planted pairs below the threshold put in one group | {int(same[~above].sum()):,} |"]
    return lines


# --- demo ---------------------------------------------------------------------------------------

def demo(budget: int) -> list[str]:
    from alcli.files.embeddings import open_features
    from alcli.files.table import read_table
    lines = [f"demo: data/demo/pool scored with configs/default.yaml; select -n {budget} from "
             f"it and from the pool with the planted copies", "",
             "| pool | select | batch pairs >= threshold | max cosine in batch | note |",
             "|---|---|---|---|---|"]
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        planted_pool(tmp / "planted", 100)
        for pool in (REPO / "data/demo/pool", tmp / "planted"):
            name = "demo" if pool.name == "pool" else "demo + 400 copies"
            table = tmp / f"{name[:4]}{len(name)}.csv"
            _alcli("score", pool, "-c", REPO / "configs/default.yaml", "-o", table, "-q", cwd=tmp)
            file_ids, b = open_features(f"{table}.emb.npz")
            feats = dup.Features(file_ids, b)
            for flags in ([], ["--no-dedup"], ["--no-diverse"], ["--no-diverse", "--no-dedup"]):
                done = _alcli("select", table, "-n", budget, *flags, "-o", tmp / "b.csv", cwd=tmp)
                ids = [str(r["id"]) for r in read_table(tmp / "b.csv")]
                u = dup._unit(feats(ids)[:]).numpy()
                cos = u @ u.T
                np.fill_diagonal(cos, -1)
                above = int((np.triu(cos, 1) >= dup.THRESHOLD).sum())
                note = next((ln.split("warning: ", 1)[1] for ln in done.stderr.splitlines()
                             if "passed over" in ln), "")
                note = note.split(" (")[0] if note else "-"
                lines.append(f"| {name} | {' '.join(flags) or '(default)'} | {above} | "
                             f"{cos.max():.4f} | {note} |")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("part", choices=["copies", "scale", "demo", "million", "all", "_child"])
    ap.add_argument("--quick", action="store_true", help="small sizes, a few seconds")
    ap.add_argument("--sizes", default="5000,10000,20000,50000,100000")
    ap.add_argument("--exact-up-to", type=int, default=100_000, help="no exact search above")
    ap.add_argument("--d", type=int, default=512)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--budget", type=int, default=20)
    ap.add_argument("--rows", type=int, default=1_000_000, help="million: the table's rows")
    ap.add_argument("--sample", type=int, default=2000, help="million: rows checked by exact search")
    ap.add_argument("--file")
    ap.add_argument("--method")
    ap.add_argument("--threshold", type=float)
    args = ap.parse_args()
    if args.part == "_child":
        return child(args)
    sizes = [2000, 4000] if args.quick else [int(s) for s in args.sizes.split(",")]
    d = 64 if args.quick else args.d
    out = []
    if args.part in ("copies", "all"):
        out += ["## Planted copies", ""] + copies(args.quick) + [""]
    if args.part in ("scale", "all"):
        out += ["## Search at scale", ""] + scale(sizes, d, args.threads, args.exact_up_to) + [""]
    if args.part == "million":
        d = 384 if args.d == 512 and "--d" not in sys.argv else args.d
        out += ["## One million rows", ""] + million(args.rows, d, args.sample) + [""]
    if args.part in ("demo", "all") and not args.quick:
        out += ["## select on the demo", ""] + demo(args.budget) + [""]
    print("\n".join(out))


if __name__ == "__main__":
    main()
