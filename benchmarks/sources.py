"""Pool sources through the data path alone (no model): the same N small PNG images as a folder of
files, as one Parquet file (1024-row row groups) and as WebDataset shards (10 000 samples each).
Per source, in a fresh process: seconds to open the pool, seconds to the first batch, rows per
second through a DataLoader (batch 256, no workers), and the process's peak RSS.

    python benchmarks/sources.py --rows 100000 [--dir /tmp/sources_bench]
"""
from __future__ import annotations

import argparse
import io
import json
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
from PIL import Image

REPO = Path(__file__).resolve().parents[1]
MEASURE = r'''
import json, resource, sys, time
sys.path.insert(0, sys.argv[2])
from torch.utils.data import DataLoader
from alcli.files.config import Transform
from alcli.files.pool import PoolOptions, collate
from alcli.files.sources import open_pool
t0 = time.perf_counter()
pool = open_pool(sys.argv[1], PoolOptions(transform=Transform(), id_column="id"))
opened = time.perf_counter()
first, n = None, 0
for batch in DataLoader(pool, batch_size=256, collate_fn=collate):
    first = first or time.perf_counter()
    n += len(batch.ids)
end = time.perf_counter()
print(json.dumps({"rows": n, "open_s": opened - t0, "first_batch_s": first - t0,
                  "rows_per_s": n / (end - opened),
                  "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
'''


def write_pools(root: Path, n: int) -> dict[str, str]:
    import pyarrow as pa
    import pyarrow.parquet as pq
    rng = np.random.default_rng(0)
    datas = []
    for _ in range(n):
        buf = io.BytesIO()
        Image.fromarray(rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)).save(buf, "PNG")
        datas.append(buf.getvalue())
    ids = [f"im{i:07d}" for i in range(n)]
    files = root / "files"
    files.mkdir(parents=True)
    for id_, data in zip(ids, datas):
        (files / f"{id_}.png").write_bytes(data)
    pq.write_table(pa.table({"id": ids, "image": datas}), root / "pool.parquet", row_group_size=1024)
    shards = root / "shards"
    shards.mkdir()
    per = 10_000
    for s in range(0, n, per):
        with tarfile.open(shards / f"pool-{s // per:06d}.tar", "w") as tar:
            for id_, data in zip(ids[s:s + per], datas[s:s + per]):
                info = tarfile.TarInfo(f"{id_}.png")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    last = (n - 1) // per
    return {"files": str(files), "parquet": str(root / "pool.parquet"),
            "webdataset": str(shards / f"pool-{{000000..{last:06d}}}.tar")}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=20_000)
    ap.add_argument("--dir", default="/tmp/alcli_sources_bench")
    args = ap.parse_args()
    root = Path(args.dir) / str(args.rows)
    if root.exists():
        raise SystemExit(f"{root} exists; remove it or pass another --dir")
    pools = write_pools(root, args.rows)
    print(f"{'source':<11} {'rows':>8} {'open s':>8} {'1st batch s':>11} {'rows/s':>9} {'peak RSS MiB':>12}")
    for name, spec in pools.items():
        out = subprocess.run([sys.executable, "-c", MEASURE, spec, str(REPO)], capture_output=True,
                             text=True, check=True).stdout
        r = json.loads(out)
        print(f"{name:<11} {r['rows']:>8} {r['open_s']:>8.2f} {r['first_batch_s']:>11.2f} "
              f"{r['rows_per_s']:>9.0f} {r['peak_rss_mib']:>12.0f}")


if __name__ == "__main__":
    main()
