"""Batches priced in boxes on a detection pool (issue 50): accuracy per ground-truth box labeled
for `select --cost boxes --budget-cost C` against plain top-k and random.

`alcli simulate` serves class labels only, so this runs structured_curves.py's detection loop
(digit_boxes: one to three digits pasted on grass with their boxes; tiny_fcos; test mAP@0.5) with
alcli's own scoring and selection, in process. Per seed, INIT random pool images start labeled;
each of ROUNDS rounds alcli scores the unlabeled pool with least-confidence and picks the
batch four ways:

    topk    alcli.select(rows, K)                                      K images
    cost    alcli.select(rows, len(rows), cost="boxes", budget_cost=C)  score per predicted box,
            C = the predicted boxes (what --cost boxes counts) of topk's batch in that round,
            averaged over seeds (topk runs first for every seed), so both spend about as much
    cost-gt the same with each row's true cost: cost="gt_boxes" (a column of the image's
            ground-truth boxes, as a user's own cost estimate would be joined to the table),
            C = topk's ground-truth boxes that round, averaged over seeds: the mechanism with a
            cost that is exact, apart from the proxy
    random  alcli.select(rows, K) with strategy random

then a fresh detector is trained on the labeled set (structured_curves.train: the same weights
for the same seed and label count). The x-axis is the ground-truth boxes labeled (what a labeler
pays), the y-axis test mAP@0.5. Per seed each curve is interpolated on the boxes range every
method covers (from the start to the smallest final count); AULC = its mean over that range;
mAP@B* = the interpolated mAP at its end; paired two-sided t-tests across seeds.

    python benchmarks/detection_cost.py --seeds 10 --json detcost.json
    python benchmarks/detection_cost.py --report-only --json detcost.json \
        --out benchmarks/results/detection-cost-cpu-2core.txt
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import structured_curves as sc  # noqa: E402  (puts the checkout's alcli first on sys.path)

import alcli  # noqa: E402
from alcli.selection.cost import row_cost  # noqa: E402

METHODS = ("topk", "cost", "cost-gt", "random")
DEFAULTS = {"pool": 100, "test": 50, "init": 10, "batch": 10, "rounds": 3, "epochs": 20}


def gt_boxes(data: sc.Data, ids) -> int:
    return int(sum(len(data.y[i]["labels"]) for i in ids))


def pick(method: str, net, data: sc.Data, unlabeled: np.ndarray, k: int, budget_cost: float | None,
         seed: int) -> tuple[np.ndarray, float]:
    """Pool indices of the batch and its predicted-box cost (as --cost boxes counts it)."""
    strategy = "random" if method == "random" else "least-confidence"
    rows = alcli.score_pool(pool=data.x[unlabeled], model=net, strategy=strategy, task="detection",
                            batch_size=256, device="cpu", seed=seed, quiet=True)
    if method.startswith("cost"):
        for r in rows:  # the labeler's true cost, as a joined column
            r["gt_boxes"] = gt_boxes(data, [unlabeled[int(r["id"])]])
        spec = "gt_boxes" if method == "cost-gt" else "boxes"
        batch = alcli.select(rows, len(rows), cost=spec, budget_cost=budget_cost, dedup=False,
                             seed=seed, quiet=True)
    else:  # plain ranking: no cost= (it would rank by score per cost)
        batch = alcli.select(rows, k, dedup=False, seed=seed, quiet=True)
    spent = sum(row_cost(r, "boxes") for r in batch)
    return unlabeled[[int(r["id"]) for r in batch]], float(spent)


def run_curve(data: sc.Data, method: str, seed: int, args, budgets: list | None = None) -> dict:
    labeled = np.sort(np.random.default_rng(seed).choice(data.pool, args.init, replace=False))
    net, first = sc.first_model(data, labeled, seed, args.epochs)
    curve = {"images": [len(labeled)], "boxes": [gt_boxes(data, labeled)], "map": [first],
             "batch_cost": []}
    for r in range(args.rounds):
        unlabeled = np.setdiff1d(data.pool, labeled)
        chosen, spent = pick(method, net, data, unlabeled, args.batch,
                             budgets[r] if budgets else None, seed * 1000 + r)
        labeled = np.sort(np.concatenate([labeled, chosen]))
        net = sc.train(data, labeled, seed, args.epochs)
        curve["images"].append(len(labeled))
        curve["boxes"].append(gt_boxes(data, labeled))
        curve["map"].append(sc.evaluate(net, data))
        curve["batch_cost"].append(spent)
    return curve


# -------------------------------------------------------------------------------------- analysis
def on_common_range(curves: dict) -> dict:
    """method -> (AULC, mAP at B*) of one seed's curves, interpolated on [start, B*], B* the
    smallest final boxes count among the methods (mAP linear between measured points)."""
    start = curves["topk"]["boxes"][0]
    end = min(c["boxes"][-1] for c in curves.values())
    grid = np.linspace(start, end, 200)
    out = {}
    for m, c in curves.items():
        y = np.interp(grid, c["boxes"], c["map"])
        out[m] = (float(np.trapezoid(y, grid) / (end - start)) if end > start else float(y[0]),
                  float(y[-1]))
    return out


def report(results: dict) -> str:
    seeds = sorted(results["curves"]["topk"], key=int)
    seeds = [s for s in seeds if all(s in results["curves"][m] for m in METHODS)]
    a = results["args"]
    lines = [f"# detection cost: digit_boxes, pool {a['pool']} / test {a['test']}, "
             f"{a['init']} start + {a['rounds']} rounds of {a['batch']} images (cost: "
             f"--budget-cost per round {', '.join(f'{b:g}' for b in results['budgets'])} "
             f"predicted boxes; cost-gt: "
             f"{', '.join(f'{b:g}' for b in results.get('gt_budgets', []))} ground-truth boxes), "
             f"{a['epochs']} epochs, {len(seeds)} seeds; "
             f"{results['machine']}", ""]
    per = {s: on_common_range({m: results["curves"][m][s] for m in METHODS}) for s in seeds}
    get = lambda m, key: np.array([results["curves"][m][s][key][-1] for s in seeds], float)  # noqa: E731
    aulc = {m: np.array([per[s][m][0] for s in seeds]) for m in METHODS}
    at_b = {m: np.array([per[s][m][1] for s in seeds]) for m in METHODS}
    lines.append("method  | AULC over GT boxes | mAP@B*       | final mAP    | GT boxes at end | "
                 "images at end")
    for m in METHODS:
        lines.append(f"{m:8s}| {aulc[m].mean():6.1f} ± {aulc[m].std(ddof=1):4.1f}      | "
                     f"{at_b[m].mean():5.1f} ± {at_b[m].std(ddof=1):4.1f} | "
                     f"{get(m, 'map').mean():5.1f} ± {get(m, 'map').std(ddof=1):4.1f} | "
                     f"{get(m, 'boxes').mean():6.1f}          | {get(m, 'images').mean():5.1f}")
    lines += ["", "per round, mean over seeds: the batch's images / its predicted-box cost (what "
              "--cost boxes counts) / its ground-truth boxes"]
    for m in METHODS:
        per_round = [np.mean([np.diff(results["curves"][m][s][k]) if k != "batch_cost"
                              else results["curves"][m][s][k] for s in seeds], 0)
                     for k in ("images", "batch_cost", "boxes")]
        lines.append(f"{m:8s}| " + " | ".join(f"{i:.1f} / {c:.1f} / {g:.1f}"
                                               for i, c, g in zip(*per_round)))
    lines += ["", "paired two-sided t-tests over seeds (difference of means; W/L seeds):"]
    for m, other in (("cost", "topk"), ("cost-gt", "topk"), ("cost", "random"),
                     ("cost-gt", "random"), ("topk", "random")):
        for name, v in (("AULC", aulc), ("mAP@B*", at_b)):
            d, p = sc.paired_t(v[m], v[other])
            w, l_ = int((v[m] > v[other]).sum()), int((v[m] < v[other]).sum())
            lines.append(f"  {m} - {other} {name}: {d:+.2f} points, p = {p:.3f}, W/L {w}/{l_}")
    lines += ["", "B*: per seed the smallest final GT-box count of the methods; AULC: mean "
              "mAP@0.5 (points) over [start, B*] GT boxes, linear between rounds.",
              f"per-seed wall time (s): {results.get('seconds', {})}"]
    return "\n".join(lines) + "\n"


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seeds", type=int, default=10)
    p.add_argument("--first-seed", type=int, default=0)
    for k, v in DEFAULTS.items():
        p.add_argument(f"--{k}", type=int, default=v)
    p.add_argument("--json", default="detection-cost.json")
    p.add_argument("--out", default=None, help="the report file (else stdout)")
    p.add_argument("--report-only", action="store_true")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(1)
    if args.report_only:
        with open(args.json) as f:
            results = json.load(f)
    else:
        data = sc.load_data("digit_boxes", pool_size=args.pool, test_size=args.test)
        results = {"args": {k: getattr(args, k) for k in DEFAULTS}, "budgets": [],
                   "machine": f"{platform.machine()}, torch {torch.__version__}, 1 thread",
                   "curves": {m: {} for m in METHODS}, "seconds": {}}
        seeds = range(args.first_seed, args.first_seed + args.seeds)
        save = lambda: json.dump(results, open(args.json, "w"))  # noqa: E731
        for s in seeds:  # topk first: its batches set the cost arm's budgets
            t0 = time.perf_counter()
            for m in ("topk", "random"):
                results["curves"][m][str(s)] = run_curve(data, m, s, args)
            results["seconds"][str(s)] = round(time.perf_counter() - t0)
            save()
            print(f"seed {s}: topk, random {results['seconds'][str(s)]} s", file=sys.stderr)
        topk = [results["curves"]["topk"][str(s)] for s in seeds]
        results["budgets"] = [float(b) for b in np.mean([c["batch_cost"] for c in topk], 0)]
        results["gt_budgets"] = [float(b) for b in np.mean([np.diff(c["boxes"]) for c in topk], 0)]
        for s in seeds:
            t0 = time.perf_counter()
            results["curves"]["cost"][str(s)] = run_curve(data, "cost", s, args, results["budgets"])
            results["curves"]["cost-gt"][str(s)] = run_curve(data, "cost-gt", s, args,
                                                             results["gt_budgets"])
            results["seconds"][str(s)] += round(time.perf_counter() - t0)
            save()
            print(f"seed {s}: cost done", file=sys.stderr)
    text = report(results)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
