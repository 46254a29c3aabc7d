"""Pool sources at scale: N rows of the demo's 8x8 digit PNGs (its 400 pool images, cycled; ids
im0000000...) as one Parquet file (1024-row row groups), as WebDataset shards (10 000 samples a
tar) and, up to --files-max rows, as a folder of files. Per source and size, each in a fresh
process, with the demo's settings (configs/default.yaml: its CNN, egl, batch 64, no workers):

  data   the pool opened as `alcli score` opens it and read through the scoring DataLoader, no
         model: seconds to open, to the first batch, rows/s after it
  e2e    `alcli score` end to end (api.score_to_table, into a table) on --shard 1/K, K chosen so
         that about --e2e-rows rows are scored; the pool is opened whole (ids of every row):
         seconds to the first scored batch, rows/s after it

and each process tree's peak PSS (psutil, sampled every 0.2 s; children run with
MALLOC_MMAP_THRESHOLD_=65536 so freed memory returns to the OS). The pools are written once under
--dir and kept (a later run reuses them).

    python benchmarks/sources.py --rows 100000 1000000 [--files-max 100000] [--e2e-rows 2000]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tarfile
import time
from pathlib import Path

from _memory import run_measured

REPO = Path(__file__).resolve().parents[1]
PER_SHARD = 10_000


# --- the pools -----------------------------------------------------------------------------

def demo_images() -> list[bytes]:
    return [p.read_bytes() for p in sorted((REPO / "data" / "demo" / "pool").rglob("*.png"))]


def write_pools(root: Path, n: int, files_max: int) -> dict[str, str]:
    """The pool as Parquet, shards and (n <= files_max) files under root; kept for reuse."""
    import io
    import pyarrow as pa
    import pyarrow.parquet as pq
    images = demo_images()
    ids = [f"im{i:07d}" for i in range(n)]
    pools = {}
    parquet = root / "pool.parquet"
    if not parquet.exists():
        root.mkdir(parents=True, exist_ok=True)
        schema = pa.schema([("id", pa.string()), ("image", pa.binary())])
        with pq.ParquetWriter(root / "tmp.parquet", schema) as w:
            for s in range(0, n, 65536):
                part = range(s, min(n, s + 65536))
                w.write_table(pa.table({"id": ids[s:part.stop],
                                        "image": [images[i % len(images)] for i in part]},
                                       schema=schema), row_group_size=1024)
        (root / "tmp.parquet").rename(parquet)
    pools["parquet"] = str(parquet)
    shards = root / "shards"
    last = (n - 1) // PER_SHARD
    if not (shards / "done").exists():
        shards.mkdir(parents=True, exist_ok=True)
        for s in range(0, n, PER_SHARD):
            with tarfile.open(shards / f"pool-{s // PER_SHARD:06d}.tar", "w") as tar:
                for i in range(s, min(n, s + PER_SHARD)):
                    data = images[i % len(images)]
                    info = tarfile.TarInfo(f"{ids[i]}.png")
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
        (shards / "done").touch()
    pools["webdataset"] = str(shards / f"pool-{{000000..{last:06d}}}.tar")
    if n <= files_max:
        files = root / "files"
        if not (root / "files.done").exists():
            for i in range(n):
                folder = files / ids[i][:-3]  # 1000 files a folder
                if i % 1000 == 0:
                    folder.mkdir(parents=True, exist_ok=True)
                (folder / f"{ids[i]}.png").write_bytes(images[i % len(images)])
            (root / "files.done").touch()
        pools["files"] = str(files)
    return pools


# --- the measurements, in a child process --------------------------------------------------

def settings_for(spec: str, **more):
    from alcli.files.config import load_settings
    extra = {"id_column": "id"} if spec.endswith(".parquet") else {}
    return load_settings(REPO / "configs" / "default.yaml", {"pool": spec, **extra, **more})


def child_data(spec: str) -> dict:
    import torch
    from alcli.score.runner import make_loader
    from alcli.session import model_for, pool_for
    settings = settings_for(spec)
    model = model_for(settings)
    t0 = time.perf_counter()
    pool = pool_for(settings, model)
    opened = time.perf_counter()
    first, n = None, 0
    for batch in make_loader(pool, settings.batch_size, settings.workers, torch.device("cpu")):
        if first is None:
            first, n0 = time.perf_counter(), len(batch.ids)
        n += len(batch.ids)
    end = time.perf_counter()
    return {"rows": n, "open_s": opened - t0, "first_batch_s": first - t0,
            "rows_per_s": (n - n0) / (end - first)}


def child_e2e(spec: str, shard: str, out: str) -> dict:
    from alcli import api
    settings = settings_for(spec, shard=shard, quiet=True)
    times: list[tuple[float, int]] = []  # (when, rows done by then), batch by batch
    t0 = time.perf_counter()
    result, _ = api.score_to_table(settings, out, on_batch=lambda k: times.append(
        (time.perf_counter(), k + (times[-1][1] if times else 0))))
    end = time.perf_counter()
    rows = result.finished.count
    first, k0 = times[0]
    return {"rows": rows, "first_batch_s": first - t0, "total_s": end - t0,
            "rows_per_s": (times[-1][1] - k0) / (times[-1][0] - first)}


def run_child(args: list[str]) -> dict:
    """A fresh process; its process tree's peak PSS sampled every 0.2 s."""
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536", "PYTHONWARNINGS": "ignore",
           "PYTHONPATH": str(REPO)}
    done, pss, _ = run_measured([sys.executable, __file__, "--child", *args], env, REPO)
    if done.returncode != 0:
        raise SystemExit(f"child {args} failed:\n{done.stderr}")
    return {**json.loads(done.stdout.strip().splitlines()[-1]), "peak_pss_mib": pss / 2**20}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, nargs="+", default=[100_000, 1_000_000])
    ap.add_argument("--files-max", type=int, default=100_000,
                    help="largest pool also written as a folder of files")
    ap.add_argument("--e2e-rows", type=int, default=2_000)
    ap.add_argument("--dir", default="/tmp/alcli_sources_bench")
    ap.add_argument("--sources", nargs="+", default=["parquet", "webdataset", "files"])
    ap.add_argument("--child", nargs="+")
    args = ap.parse_args()
    if args.child:
        mode, *rest = args.child
        print(json.dumps(child_data(*rest) if mode == "data" else child_e2e(*rest)))
        return
    print(f"{'source':<11} {'rows':>8} {'mode':>5} {'open s':>7} {'1st batch s':>11} {'rows/s':>8} "
          f"{'peak PSS MiB':>12}", flush=True)
    for n in args.rows:
        t = time.perf_counter()
        pools = write_pools(Path(args.dir) / str(n), n, args.files_max)
        print(f"# {n} rows written in {time.perf_counter() - t:.0f} s", flush=True)
        k = max(1, round(n / args.e2e_rows))
        for name, spec in pools.items():
            if name not in args.sources:
                continue
            for mode in ("data", "e2e"):
                out = Path(args.dir) / str(n) / f"scores-{name}.csv"
                child = ["data", spec] if mode == "data" else ["e2e", spec, f"0/{k}", str(out)]
                r = run_child(child)
                opened = f"{r['open_s']:>7.1f}" if "open_s" in r else f"{'':>7}"
                print(f"{name:<11} {r['rows']:>8} {mode:>5} {opened} {r['first_batch_s']:>11.1f} "
                      f"{r['rows_per_s']:>8.0f} {r['peak_pss_mib']:>12.0f}", flush=True)


if __name__ == "__main__":
    main()
