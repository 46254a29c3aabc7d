"""Label review: how well `alcli review`'s rankings and flags find injected label errors, beside
cleanlab's `find_label_issues` and `get_label_quality_scores` on the same predicted probabilities.

Per data set and seed: a random half is the clean training split (an MLP trained on it, full-batch
Adam), the other half the held-out split whose labels are corrupted: `symmetric` (10% of rows to
a uniformly drawn other class) or `pairs` (20% of rows to their class's partner; the classes
paired greedily by the clean model's confusion on its training split). alcli reviews the
held-out split (api.review_to_table, one `--strategy review` run); cleanlab gets the
probabilities that run used (each row's `units`). Per ranking: AUROC of the true errors and
precision at k = the number injected; per flagging: precision and recall; then a paired Wilcoxon
test over seeds of alcli's default ranking against cleanlab's best quality score (by mean AUROC).

    nice -n 10 python benchmarks/label_review.py [--seeds 10] [--datasets digits,mnist1d] [--quick]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

import numpy as np
import torch
from torch import nn

from alcli import api
from alcli.review import DEFAULT_RANKING

RANKINGS = ("margin", "self-confidence", "loss", "gradnorm")
COLUMNS = {"margin": "margin", "self-confidence": "self_confidence", "loss": "loss",
           "gradnorm": "gradnorm"}
CLEANLAB = ("self_confidence", "normalized_margin", "confidence_weighted_entropy")


def load(name: str):
    """(x [N, D] float32 standardized, y [N]) of a data set shipped inside a package."""
    if name == "digits":
        from sklearn.datasets import load_digits
        raw = load_digits()
        x, y = raw.data, raw.target
    elif name == "breast_cancer":
        from sklearn.datasets import load_breast_cancer
        raw = load_breast_cancer()
        x, y = raw.data, raw.target
    elif name == "mnist1d":
        from mnist1d.data import make_dataset
        raw = make_dataset()
        x, y = np.concatenate([raw["x"], raw["x_test"]]), np.concatenate([raw["y"], raw["y_test"]])
    else:
        raise SystemExit(f"unknown data set {name}")
    x = (x - x.mean(0)) / np.maximum(x.std(0), 1e-6)
    return torch.tensor(x, dtype=torch.float32), torch.tensor(y, dtype=torch.long)


def train(x, y, classes: int, seed: int, steps: int) -> nn.Module:
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(x.shape[1], 64), nn.ReLU(), nn.Linear(64, classes))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2, weight_decay=1e-4)
    for _ in range(steps):
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    return model.eval()


def confusable_pairs(model: nn.Module, x, y, classes: int) -> np.ndarray:
    """partner[c]: classes paired greedily by the symmetric mean probability of each other."""
    with torch.no_grad():
        p = torch.softmax(model(x), 1).numpy()
    conf = np.zeros((classes, classes))
    for c in range(classes):
        conf[c] = p[y.numpy() == c].mean(0)
    conf = conf + conf.T
    np.fill_diagonal(conf, -1)
    partner, free = np.arange(classes), set(range(classes))
    for flat in np.argsort(-conf, axis=None):
        a, b = divmod(int(flat), classes)
        if a in free and b in free and a != b:
            partner[a], partner[b] = b, a
            free -= {a, b}
    return partner


def corrupt(y, kind: str, classes: int, partner, rng) -> tuple[torch.Tensor, np.ndarray]:
    n = len(y)
    noisy, is_error = y.clone(), np.zeros(n, dtype=bool)
    if kind == "symmetric":
        rows = rng.choice(n, int(round(0.10 * n)), replace=False)
        for i in rows:
            noisy[i] = int(rng.choice([c for c in range(classes) if c != int(y[i])]))
    else:
        rows = [i for i in rng.choice(n, int(round(0.20 * n)), replace=False)
                if partner[int(y[i])] != int(y[i])]
        for i in rows:
            noisy[i] = int(partner[int(y[i])])
    is_error[rows] = True
    return noisy, is_error


def auroc(is_error, badness) -> float:
    from sklearn.metrics import roc_auc_score
    return float(roc_auc_score(is_error, badness))


def precision_at_k(is_error, badness) -> float:
    k = int(is_error.sum())
    top = np.argsort(-np.asarray(badness), kind="stable")[:k]
    return float(is_error[top].mean())


def prec_rec(is_error, flagged) -> tuple[float, float]:
    flagged = np.asarray(flagged, dtype=bool)
    hits = (flagged & is_error).sum()
    return (float(hits / flagged.sum()) if flagged.any() else float("nan"),
            float(hits / is_error.sum()))


def one_run(x, y, classes, seed, kind, steps, folder) -> dict:
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(y))
    tr, ho = order[: len(y) // 2], order[len(y) // 2:]
    model = train(x[tr], y[tr], classes, seed, steps)
    partner = confusable_pairs(model, x[tr], y[tr], classes)
    noisy, is_error = corrupt(y[ho], kind, classes, partner, rng)
    settings = api.settings_for(strategy="review", batch_size=256, embeddings=False, quiet=True)
    t = time.perf_counter()
    reviewed, run = api.review_to_table(settings, os.path.join(folder, "r.csv"), DEFAULT_RANKING,
                                        model=model, pool=(x[ho], noisy))
    seconds = time.perf_counter() - t
    by_id = {r["id"]: r for r in reviewed.rows}
    units = {r["id"]: json.loads(r["units"]) for r in run.rows}
    order_ids = range(len(ho))  # a tensor pool's ids: its row indices
    probs = np.array([units[i][0][2] for i in order_ids])             # [N, C], alcli's own
    labels = noisy.numpy()
    out = {"seconds": seconds, "accuracy": float((probs.argmax(1) == y[ho].numpy()).mean()),
           "errors": int(is_error.sum())}
    for name in RANKINGS:
        col = COLUMNS[name]
        v = np.array([float(by_id[i][col]) for i in order_ids])
        bad = -v if name in ("margin", "self-confidence") else v
        out[f"alcli {name}"] = (auroc(is_error, bad), precision_at_k(is_error, bad))
    # diagnostic: the gradnorm of the last layer's output, ||p - e_y||, without the feature norm
    # ||h|| that the gradient of the last layer's weights multiplies it by
    onehot = np.eye(probs.shape[1])[labels]
    residual = np.linalg.norm(probs - onehot, axis=1)
    out["diagnostic norm(p - onehot(y))"] = (auroc(is_error, residual), precision_at_k(is_error, residual))
    flagged = np.array([by_id[i]["flagged"] for i in order_ids])
    out["alcli flags"] = prec_rec(is_error, flagged)
    from cleanlab.filter import find_label_issues
    from cleanlab.rank import get_label_quality_scores
    for method in CLEANLAB:
        q = get_label_quality_scores(labels, probs, method=method)
        out[f"cleanlab {method}"] = (auroc(is_error, -q), precision_at_k(is_error, -q))
    out["cleanlab find_label_issues"] = prec_rec(is_error, find_label_issues(labels, probs))
    out["cleanlab confident_learning"] = prec_rec(
        is_error, find_label_issues(labels, probs, filter_by="confident_learning"))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--datasets", default="digits,mnist1d")
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--steps", type=int, default=300, help="full-batch Adam steps of the MLP")
    ap.add_argument("--quick", action="store_true", help="digits, 2 seeds, 100 steps")
    ap.add_argument("--out", default=None, help="write the report (markdown) here as well")
    args = ap.parse_args()
    if args.quick:
        args.datasets, args.seeds, args.steps = "digits", 2, 100
    torch.set_num_threads(1)
    lines = [f"# Label review: alcli review vs cleanlab {__import__('cleanlab').__version__}", "",
             f"`python benchmarks/label_review.py --datasets {args.datasets} --seeds {args.seeds} "
             f"--steps {args.steps}`; CPU, 1 thread. Mean over seeds (± std). AUROC of the injected "
             f"errors and precision at k (k = the number injected); flags: precision / recall. "
             f"alcli's default ranking: {DEFAULT_RANKING}.", ""]
    with tempfile.TemporaryDirectory() as folder:
        for name in args.datasets.split(","):
            x, y = load(name)
            classes = int(y.max()) + 1
            for kind in ("symmetric", "pairs"):
                runs = [one_run(x, y, classes, seed, kind, args.steps, folder)
                        for seed in range(args.seeds)]
                lines += report(name, kind, runs, len(y) - len(y) // 2)
                print("\n".join(lines[-40:]), file=sys.stderr)
    text = "\n".join(lines) + "\n"
    sys.stdout.write(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)


def report(name, kind, runs, n) -> list[str]:
    noise = "10% symmetric" if kind == "symmetric" else "20% between confusable pairs"
    acc = np.mean([r["accuracy"] for r in runs])
    lines = [f"## {name}, {noise} ({n} held-out rows, {len(runs)} seeds; clean model's held-out "
             f"accuracy {acc:.3f}; review {np.mean([r['seconds'] for r in runs]):.2f} s)", "",
             "| ranking | AUROC | precision at k |", "|---|---|---|"]
    rankings = [k for k in runs[0] if k.startswith(("alcli ", "cleanlab ", "diagnostic ")) and
                not k.endswith(("flags", "find_label_issues", "confident_learning"))]
    for key in rankings:
        a = np.array([r[key][0] for r in runs])
        p = np.array([r[key][1] for r in runs])
        lines.append(f"| {key} | {a.mean():.4f} ± {a.std():.4f} | {p.mean():.3f} ± {p.std():.3f} |")
    lines += ["", "| flags | precision | recall |", "|---|---|---|"]
    for key in ("alcli flags", "cleanlab confident_learning", "cleanlab find_label_issues"):
        pr = np.array([r[key] for r in runs])
        lines.append(f"| {key} | {np.nanmean(pr[:, 0]):.3f} | {pr[:, 1].mean():.3f} |")
    best = max((k for k in rankings if k.startswith("cleanlab")),
               key=lambda k: np.mean([r[k][0] for r in runs]))
    ours = np.array([r[f"alcli {DEFAULT_RANKING}"][0] for r in runs])
    theirs = np.array([r[best][0] for r in runs])
    diff = ours - theirs
    if np.allclose(diff, 0, atol=1e-12):
        test = "identical AUROC on every seed (no test needed)"
    else:
        from scipy.stats import wilcoxon
        test = f"Wilcoxon p = {wilcoxon(ours, theirs).pvalue:.3g}"
    grad = np.array([r["alcli gradnorm"][0] for r in runs])
    from scipy.stats import wilcoxon
    lines += ["", f"alcli {DEFAULT_RANKING} - {best}: mean AUROC difference {diff.mean():+.4f}, "
              f"{test}. alcli gradnorm - {best}: {np.mean(grad - theirs):+.4f} "
              f"(better on {int((grad > theirs).sum())} of {len(runs)} seeds, Wilcoxon p = "
              f"{wilcoxon(grad, theirs).pvalue:.3g}).", ""]
    return lines


if __name__ == "__main__":
    main()
