"""End-to-end scoring pipeline vs the compute alone: throughput and peak memory at two pool sizes.

Generates pools of 32x32 PNG files in a temporary folder, saves a torchvision resnet18
(weights=None, num_classes=10) state_dict, and scores each pool through alcli's own path
(`api.score_to_table`: DataLoader with workers, streaming rows to OUT.partial, ranking into OUT),
each size in a fresh subprocess. In another fresh subprocess it decodes the same images into the
same batches and times, on those tensors, (a) `runner.score_batch` (the strategy's whole compute:
the logits forward plus the engine) and (b) the engine call alone (`grad_norms_per_target` at the
targets the strategy uses). Peak memory of each scoring subprocess is sampled with psutil (the
process tree's PSS, so forked DataLoader workers are not counted twice) and ru_maxrss; children
run with MALLOC_MMAP_THRESHOLD_=65536 so memory freed by Python/torch returns to the OS.

Targets (issue 4), printed PASS/MISS: end-to-end >= 0.8x the compute on decoded tensors at every
size (data loading overlapped with compute, not serial), and peak memory at the larger pool within
10% of the smaller.

    python benchmarks/pipeline.py [--sizes 512 5120] [--batch-size 64] [--workers 0]
                                  [--strategy gradnorm] [--engine-examples 512] [--json OUT]
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

from _memory import run_measured

HERE = Path(__file__).resolve().parent
REPO = HERE.parent


# --------------------------------------------------------------------------------- the workspace
def make_workspace(root: Path, size: int, seed: int = 0) -> dict:
    """`size` PNGs (32x32 RGB, smooth shapes plus noise, so they compress like photos), a resnet18
    state_dict and a config."""
    import numpy as np
    import torch
    import torchvision
    from PIL import Image

    pool = root / f"pool{size}"
    pool.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:32, 0:32] / 31.0
    for i in range(size):
        a, b, c = rng.uniform(0, 1, 3)
        base = np.stack([a * xx + (1 - a) * yy, b * yy, c * (1 - xx)], axis=-1)
        img = np.clip(base * 255 + rng.normal(0, 20, (32, 32, 3)), 0, 255).astype(np.uint8)
        Image.fromarray(img, "RGB").save(pool / f"{i:06d}.png")
    model = root / "resnet18.pt"
    if not model.exists():
        torch.manual_seed(seed)
        torch.save(torchvision.models.resnet18(weights=None, num_classes=10).state_dict(), model)
    config = root / "config.yaml"
    config.write_text("arch: torchvision:resnet18\narch_kwargs: {num_classes: 10}\n"
                      "transform: {normalize: {mean: [0.49, 0.48, 0.45], std: [0.25, 0.24, 0.26]}}\n")
    return {"pool": str(pool), "model": str(model), "config": str(config)}


# ------------------------------------------------------------------------------------- children
def child_e2e(args) -> dict:
    """Score the pool through alcli's path; count, seconds, ru_maxrss."""
    from alcli import api
    settings = api.settings_for(args.config, pool=args.pool, model=args.model,
                                strategy=args.strategy, batch_size=args.batch_size,
                                workers=args.workers, device="cpu", quiet=True)
    out = Path(args.out)
    first: list[tuple[float, int]] = []  # (time, examples) when the first batch is done

    def on_batch(k):
        if not first:
            first.append((time.perf_counter(), k))

    start = time.perf_counter()
    result, _ = api.score_to_table(settings, str(out), on_batch=on_batch)
    end = time.perf_counter()
    count = result.finished.count
    return {"count": count, "seconds": end - start, "method": result.stats.method,
            # steady state: after the first batch (torch's one-time kernel setup) to the table written
            "steady_count": count - first[0][1], "steady_seconds": end - first[0][0],
            "maxrss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}


def child_compute(args) -> dict:
    """The same batches, decoded first: score_batch and the engine alone on the tensors."""
    import torch
    from alcli import api, session
    from alcli.pools.common import collate
    from alcli.gradnorm import grad_norms_per_target
    from alcli.score.runner import forward, score_batch, to_model
    settings = api.settings_for(args.config, pool=args.pool, model=args.model,
                                strategy=args.strategy, batch_size=args.batch_size, device="cpu")
    net = session.model_for(settings).eval()
    pool = session.pool_for(settings, net)
    n = min(len(pool), args.engine_examples)
    batches = [collate([pool[i] for i in range(s, min(n, s + args.batch_size))])
               for s in range(0, n, args.batch_size)]
    device = torch.device("cpu")
    score_batch(net, batches[0], settings, device, pool)  # warm-up, untimed
    inputs = [to_model(b.inputs, net, device, pool.to_float) for b in batches]
    # the engine alone, at the targets the gradnorm strategy uses (the predicted class)
    targets = [forward(net, x, pool.name).argmax(dim=1) for x in inputs]
    scoring = engine = 0.0
    count = 0
    for i, (batch, x, t) in enumerate(zip(batches, inputs, targets)):  # interleaved, rotating
        for which in (("score", "engine") if i % 2 == 0 else ("engine", "score")):
            start = time.perf_counter()
            if which == "score":
                count += len(score_batch(net, batch, settings, device, pool))
                scoring += time.perf_counter() - start
            else:
                grad_norms_per_target(net, x, [t], params=settings.layers, method=settings.method)
                engine += time.perf_counter() - start
    return {"count": count, "scoring_seconds": scoring, "engine_seconds": engine}


def run_child(mode: str, args, ws: dict, size: int, out: Path | None = None) -> dict:
    """One fresh subprocess; its process tree's peak PSS/RSS sampled every 0.2 s."""
    cmd = [sys.executable, __file__, "--child", mode, "--pool", ws["pool"], "--model", ws["model"],
           "--config", ws["config"], "--strategy", args.strategy, "--batch-size", str(args.batch_size),
           "--workers", str(args.workers), "--engine-examples", str(args.engine_examples)]
    if out is not None:
        cmd += ["--out", str(out)]
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536", "PYTHONWARNINGS": "ignore"}
    done, pss, rss = run_measured(cmd, env, REPO)
    if done.returncode != 0:
        raise SystemExit(f"{mode} child for {size} failed:\n{done.stderr}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    result.update(peak_pss_mib=pss / 2**20, peak_rss_mib=rss / 2**20)
    return result


# ------------------------------------------------------------------------------------------ main
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs=2, default=[512, 5120], metavar=("SMALL", "LARGE"))
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--workers", type=int, default=0, help="DataLoader workers (default 0, as alcli score)")
    ap.add_argument("--strategy", default="gradnorm")
    ap.add_argument("--engine-examples", type=int, default=512,
                    help="examples (the pool's first) for the decoded-tensor timings")
    ap.add_argument("--json", help="write every number here")
    ap.add_argument("--child", choices=("e2e", "compute"), help=argparse.SUPPRESS)
    ap.add_argument("--pool", help=argparse.SUPPRESS)
    ap.add_argument("--model", help=argparse.SUPPRESS)
    ap.add_argument("--config", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        sys.path.insert(0, str(REPO))
        print(json.dumps(child_e2e(args) if args.child == "e2e" else child_compute(args)))
        return

    small, large = sorted(args.sizes)
    print(f"pipeline benchmark: resnet18 (weights=None, 10 classes), 32x32 PNG pools of {small} and "
          f"{large}, strategy {args.strategy}, batch {args.batch_size}, {args.workers} DataLoader "
          f"worker(s), CPU ({os.cpu_count()} cores)", flush=True)
    results: dict = {"sizes": {}, "args": {k: v for k, v in vars(args).items()
                                           if k in ("batch_size", "workers", "strategy",
                                                    "engine_examples")}}
    with tempfile.TemporaryDirectory(prefix="alcli-bench-") as tmp:
        root = Path(tmp)
        for size in (small, large):
            t0 = time.perf_counter()
            ws = make_workspace(root, size)
            print(f"  generated {size} PNGs in {time.perf_counter() - t0:.1f} s", flush=True)
            r = run_child("e2e", args, ws, size, root / f"scores{size}.csv")
            results["sizes"][size] = r
            print(f"  scored {size}: {_steady(r):.1f} examples/s, peak PSS "
                  f"{r['peak_pss_mib']:.0f} MiB", flush=True)
            if size == small:
                c = run_child("compute", args, ws, size)
                results["compute"] = c
                print(f"  decoded-tensor timings on {c['count']} examples done", flush=True)

    c = results["compute"]
    scoring_rate = c["count"] / c["scoring_seconds"]
    engine_rate = c["count"] / c["engine_seconds"]
    print()
    header = (f"{'pool':>6} {'end-to-end ex/s':>16} {'(whole call)':>13} {'vs scoring':>11} "
              f"{'vs engine':>10} {'peak PSS MiB':>13} {'peak RSS MiB':>13} {'ru_maxrss MiB':>14}")
    print(header)
    print("-" * len(header))
    for size in (small, large):
        r = results["sizes"][size]
        rate = _steady(r)
        print(f"{size:>6} {rate:>16.1f} {r['count'] / r['seconds']:>13.1f} "
              f"{rate / scoring_rate:>10.2f}x {rate / engine_rate:>9.2f}x "
              f"{r['peak_pss_mib']:>13.0f} {r['peak_rss_mib']:>13.0f} {r['maxrss_kib'] / 1024:>14.0f}")
    print("end-to-end ex/s: after the first batch until the table is written (steady state); "
          "(whole call): including model load, listing, pre-flight and the first batch")
    print(f"\ndecoded tensors, the pool's first {c['count']} examples in the same batches "
          f"(after a warm-up batch; the two timed batch by batch, alternating):")
    print(f"  scoring (runner.score_batch: logits forward + engine): {scoring_rate:.1f} examples/s")
    print(f"  engine alone (grad_norms_per_target):                  {engine_rate:.1f} examples/s")

    print()
    ok = True
    for size in (small, large):
        r = results["sizes"][size]
        ratio = _steady(r) / scoring_rate
        ok &= _target(f"end-to-end at {size} >= 0.8x the same compute on decoded tensors", ratio >= 0.8,
                      f"{ratio:.2f}x")
    for size in (small, large):
        r = results["sizes"][size]
        ratio = _steady(r) / engine_rate
        _target(f"end-to-end at {size} >= 0.8x the engine call alone (strict reading)", ratio >= 0.8,
                f"{ratio:.2f}x")
    grow = results["sizes"][large]["peak_pss_mib"] / results["sizes"][small]["peak_pss_mib"]
    ok &= _target(f"peak memory at {large} within 10% of {small}", grow <= 1.10,
                  f"{grow:.3f}x ({results['sizes'][small]['peak_pss_mib']:.0f} -> "
                  f"{results['sizes'][large]['peak_pss_mib']:.0f} MiB PSS)")
    results["rates"] = {"scoring": scoring_rate, "engine": engine_rate}
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


def _steady(r: dict) -> float:
    return r["steady_count"] / r["steady_seconds"] if r["steady_count"] else r["count"] / r["seconds"]


def _target(what: str, passed: bool, detail: str) -> bool:
    print(f"{'PASS' if passed else 'MISS'}: {what}: {detail}")
    return passed


if __name__ == "__main__":
    main()
