"""When to stop, measured: `alcli simulate` on scikit-learn's 8x8 digits (1797 images, 10
classes; shipped inside scikit-learn, no download), or another of the learning-curve benchmark's
offline data sets (--dataset breast_cancer, mnist1d: benchmarks/learning_curves.py's load_data,
its test split the eval pool), with a small MLP trained from scratch each round, and the stabilizing-predictions rule (alcli/selection/stopping.py: Cohen's kappa of
consecutive rounds' predictions on the eval pool, its labels unused, mean of the last 3 >= 0.99)
read from simulate's `stop` column. Per strategy and seed: the round where the rule first says
stop, the labels there, the accuracy there and at the end of the curve, the first round whose
accuracy is within 1 point of the end's (`within_1pt`), and the labels saved.

    python benchmarks/stopping.py            # 3 seeds, margin and random, 25 rounds of 20
    python benchmarks/stopping.py --dataset breast_cancer --seeds 5 --rounds 20 --budget 10
    python benchmarks/stopping.py --quick    # 1 seed, margin, 4 rounds: a smoke run
    python benchmarks/stopping.py --dataset mnist1d --in-process --seeds 10 --rounds 12 --budget 40

--in-process: the same loop without `alcli simulate` (its training command starts a Python per
round: minutes a round on a loaded 2-core machine): the same MLP and training recipe as train.py,
margin (the smallest gap of the two largest probabilities) or random batches, and simulate's own
rule code (alcli.selection.stopping.agreement and verdicts on the eval split's predictions).

digits: the 400-image test split (seed 0) is the eval pool; the other 1397 are the pool.
"""
from __future__ import annotations

import argparse
import csv
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from sklearn.datasets import load_digits

NET = """import torch.nn as nn


def Net():
    return nn.Sequential(nn.Linear({dim}, 64), nn.ReLU(), nn.Linear(64, {classes}))
"""

TRAIN = """import csv, sys
import torch
from net import Net

torch.set_num_threads(1)
labeled, out, seed = sys.argv[1], sys.argv[2], int(sys.argv[3])
pool = torch.load("pool.pt")
index = {i: n for n, i in enumerate(pool["ids"])}
rows = list(csv.DictReader(open(labeled)))
x = pool["x"][[index[r["id"]] for r in rows]]
y = torch.tensor([int(r["label"]) for r in rows])
torch.manual_seed(seed)
net = Net()
opt = torch.optim.Adam(net.parameters(), lr=1e-2)
for _ in range(200):  # full batch: the labeled sets here are at most a few hundred
    opt.zero_grad()
    torch.nn.functional.cross_entropy(net(x), y).backward()
    opt.step()
torch.save(net.state_dict(), out)
"""


def write_data(folder: Path, dataset: str = "digits") -> str:
    """pool.pt, test.pt, net.py and train.py in folder; returns the data set's description."""
    if dataset == "digits":
        digits = load_digits()
        x = torch.tensor(digits.data / 16.0, dtype=torch.float32)
        y = torch.tensor(digits.target)
        order = np.random.default_rng(0).permutation(len(y))
        test, pool = order[:400], order[400:]
    else:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from learning_curves import load_data
        data = load_data(dataset)
        x, y, test, pool = data.x.flatten(1), data.y, data.test, data.pool
    for name, part in (("pool.pt", pool), ("test.pt", test)):
        torch.save({"x": x[part], "y": y[part], "ids": [f"d{i}" for i in part]}, folder / name)
    classes = int(y.max()) + 1
    (folder / "net.py").write_text(NET.format(dim=x.shape[1], classes=classes))
    (folder / "train.py").write_text(TRAIN)
    return (f"{dataset} ({len(pool)} pool, {len(test)} eval), MLP {x.shape[1]}-64-{classes}")


def in_process(folder: Path, seeds: list[int], strategies: list[str], init: int, budget: int,
               rounds: int) -> list[dict]:
    """simulate's curves (strategy, seed, round, labels, accuracy, kappa, stop) computed here."""
    import importlib.util
    from alcli.selection import stopping
    spec = importlib.util.spec_from_file_location("net", folder / "net.py")
    net_module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(net_module)
    pool, test = torch.load(folder / "pool.pt"), torch.load(folder / "test.pt")
    torch.set_num_threads(1)
    rows = []
    for seed in seeds:
        for strategy in strategies:
            labeled = sorted(np.random.default_rng(seed).choice(len(pool["ids"]), init,
                                                                replace=False).tolist())
            pick_rng = np.random.default_rng(1000 + seed)
            preds, kappas = None, []
            for r in range(rounds + 1):
                torch.manual_seed(seed)
                net = net_module.Net()
                opt = torch.optim.Adam(net.parameters(), lr=1e-2)
                x, y = pool["x"][labeled], pool["y"][labeled]
                for _ in range(200):  # train.py's recipe: full batch
                    opt.zero_grad()
                    torch.nn.functional.cross_entropy(net(x), y).backward()
                    opt.step()
                with torch.no_grad():
                    test_pred = net(test["x"]).argmax(1)
                    prob = net(pool["x"]).softmax(1)
                now = {i: str(int(p)) for i, p in zip(test["ids"], test_pred)}
                kappa = stopping.agreement(preds, now)["kappa"] if preds is not None else None
                kappas.append(kappa)
                preds = now
                rows.append({"strategy": strategy, "seed": str(seed), "round": str(r),
                             "labels": str(len(labeled)),
                             "accuracy": f"{float((test_pred == test['y']).float().mean()):.6f}",
                             "kappa": "" if kappa is None else f"{kappa:.6f}",
                             "stop": str(int(r > 0 and stopping.verdicts(kappas[1:])[-1]))})
                free = np.setdiff1d(np.arange(len(pool["ids"])), labeled)
                if strategy == "margin":
                    top2 = prob[free].topk(2, dim=1).values
                    chosen = free[np.argsort((top2[:, 0] - top2[:, 1]).numpy(),
                                             kind="stable")[:budget]]
                else:
                    chosen = pick_rng.choice(free, budget, replace=False)
                labeled = sorted(labeled + chosen.tolist())
    return rows


def summary(curves: list[dict]) -> list[dict]:
    out = []
    for key in dict.fromkeys((r["strategy"], r["seed"]) for r in curves):
        mine = [r for r in curves if (r["strategy"], r["seed"]) == key]
        stop = next((r for r in mine if r["stop"] == "1"), None)
        end = mine[-1]
        near = next(r for r in mine if float(r["accuracy"]) >= float(end["accuracy"]) - 0.01)
        out.append({"strategy": key[0], "seed": key[1],
                    "stop_round": stop["round"] if stop else "none",
                    "labels_at_stop": stop["labels"] if stop else "",
                    "acc_at_stop": f"{100 * float(stop['accuracy']):.1f}" if stop else "",
                    "labels_at_end": end["labels"],
                    "acc_at_end": f"{100 * float(end['accuracy']):.1f}",
                    "best_acc": f"{100 * max(float(r['accuracy']) for r in mine):.1f}",
                    "within_1pt_round": near["round"], "labels_within_1pt": near["labels"],
                    "labels_saved": int(end["labels"]) - int(stop["labels"]) if stop else 0})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--dataset", default="digits", choices=["digits", "breast_cancer", "mnist1d"])
    ap.add_argument("--seeds", default="3")
    ap.add_argument("--rounds", type=int, default=25)
    ap.add_argument("--init", type=int, default=20)
    ap.add_argument("--budget", type=int, default=20)
    ap.add_argument("--strategies", default="margin,random")
    ap.add_argument("--out", default="benchmarks/results/stopping.md")
    ap.add_argument("--in-process", action="store_true", help="the loop here, not by simulate")
    ap.add_argument("--keep", metavar="CSV", help="simulate's curves file (default: a temporary one)")
    ap.add_argument("--curves", metavar="CSV", help="summarize this simulate curves file (a "
                    "run stopped part way) instead of running")
    args = ap.parse_args()
    seeds, rounds, strategies = (("1", 4, "margin") if args.quick
                                 else (args.seeds, args.rounds, args.strategies))
    protocol = f"init {args.init}, {args.budget} a round, {rounds} rounds"
    if args.curves:
        with open(args.curves) as f:
            curves = list(csv.DictReader(f))
        write(curves, rounds, None, args.out, f"{args.dataset}, {protocol}")
        return
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        what = f"{write_data(folder, args.dataset)}, {protocol}"
        if args.in_process:
            began = time.perf_counter()
            curves = in_process(folder, [int(v) for v in range(int(seeds))] if seeds.isdigit()
                                else [int(v) for v in seeds.split(",")],
                                strategies.split(","), args.init, args.budget, rounds)
            write(curves, rounds, time.perf_counter() - began, args.out,
                  f"{what} (in process, not by simulate)")
            if args.keep:
                with open(args.keep, "w", newline="") as f:
                    w = csv.DictWriter(f, list(curves[0]))
                    w.writeheader()
                    w.writerows(curves)
            return
        # simulate rewrites the curves after every round: --keep keeps them if the run is cut short
        curves_file = Path(args.keep).resolve() if args.keep else folder / "curves.csv"
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            [str(folder), str(Path(__file__).resolve().parents[1]), os.environ.get("PYTHONPATH", "")]),
            "OMP_NUM_THREADS": "1"}
        began = time.perf_counter()
        subprocess.run([sys.executable, "-m", "alcli", "simulate", "pool.pt", "--eval", "test.pt",
                        "--arch", "net:Net", "--trust-checkpoint", "--train",
                        f"{sys.executable} train.py {{labeled}} {{model}} {{seed}}",
                        "--init", str(args.init), "-n", str(args.budget), "--rounds", str(rounds), "--strategies",
                        strategies, "--seeds", seeds, "-o", str(curves_file), "-q"],
                       cwd=folder, env=env, check=True)
        took = time.perf_counter() - began
        with open(curves_file) as f:
            curves = list(csv.DictReader(f))
    write(curves, rounds, took, None if args.quick else args.out, what)


def write(curves: list[dict], rounds: int, took: float | None, out: str | None,
          what: str = "digits (1397 pool, 400 eval), MLP 64-64-10, init 20, 20 a round, 25 rounds"
          ) -> None:
    """The summary table and each curve's kappas, printed and written to `out`; only the curves
    that reached their last round."""
    rows = [r for r in summary(curves)
            if int(max(int(c["round"]) for c in curves
                       if (c["strategy"], c["seed"]) == (r["strategy"], r["seed"]))) == rounds]
    cols = list(rows[0])
    lines = [f"{what}; "
             f"rule: kappa >= 0.99 averaged over the last 3 rounds"
             + (f"; {took:.0f} s" if took else "; finished curves only"), "",
             "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(str(r[c]) for c in cols) + " |" for r in rows]
    lines += ["", "per-round kappa (strategy, seed: kappa of rounds 1..):"]
    for key in dict.fromkeys((r["strategy"], r["seed"]) for r in rows):
        ks = [r["kappa"][:6] for r in curves if (r["strategy"], r["seed"]) == key][1:]
        lines.append(f"- {key[0]}, seed {key[1]}: {' '.join(ks)}")
    text = "\n".join(lines) + "\n"
    print(text)
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(text)


if __name__ == "__main__":
    main()
