"""`alcli simulate`: learning curves on the user's own labeled pool, with the user's own training.

For each strategy and seed, starting from the same `init` random examples (per seed):

    round r:  labeled.csv (id, label[, path]) -> the training command -> checkpoint
              -> accuracy on the eval pool (the checkpoint's predictions against its labels)
              -> unless the last round: `select` (score the pool, exclude the labeled ids,
                 choose `budget`) -> their labels revealed, added to labeled.csv

Only the selected ids' labels are ever written for the training command; the pool's labels are
read once, up front, and kept here. Scoring and choosing are `score`'s and `select`'s
(api.run_select), evaluation is `score`'s rows (pred against label, api.run_score).
"""
from __future__ import annotations

import csv
import dataclasses
import math
import os
import re
import shlex
import subprocess
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .api import run_score, run_select
from .errors import AlcliError, ConfigError, PoolError, RunError
from .files.atomic import atomic_open, make_folder
from .files.classnames import class_name, read_class_names
from .files.config import DIVERSE_MODES, STRATEGY_NAMES, Settings
from .files.sources import open_pool
from .files.pool import PoolOptions

PLACEHOLDERS = ("labeled", "model", "round", "seed", "strategy", "workdir")
COLUMNS = ("strategy", "seed", "round", "labels", "accuracy")


@dataclass
class Plan:
    """What one simulation runs."""

    pool: str
    eval_pool: str
    train: str                 # the training command, with {labeled} and {model} in it
    strategies: list[str]      # NAME or NAME+badge / NAME+cluster-margin
    seeds: int
    init: int                  # random labeled examples before round 0
    budget: int                # examples selected per round
    rounds: int                # selections; rounds + 1 checkpoints are evaluated
    workdir: Path
    output: str | None = None  # the curves CSV, rewritten after every round


def check_strategies(spec: str) -> list[str]:
    """'margin,egl+badge,random' -> the list; an unknown name or mode is a ConfigError."""
    names = [s.strip() for s in spec.split(",") if s.strip()]
    if not names:
        raise ConfigError("option --strategies names no strategy; give e.g. margin,egl,random")
    for s in names:
        name, _, mode = s.partition("+")
        if name not in STRATEGY_NAMES or (mode and mode not in DIVERSE_MODES):
            raise ConfigError(f"option --strategies: '{s}' is not NAME or NAME+MODE with NAME one "
                              f"of {', '.join(STRATEGY_NAMES)} and MODE one of "
                              f"{', '.join(DIVERSE_MODES)}")
    return names


def pool_labels(settings: Settings, spec: str, what: str) -> tuple[list[str], list, list | None]:
    """(ids, each one's label as the training command reads it, each one's file or None) of a
    labeled pool; a pool without labels, or a row without one, is a PoolError naming it."""
    names = read_class_names(settings.class_names, settings.where("class_names")) \
        if settings.class_names else None
    opts = PoolOptions(settings.labels_from_folders, settings.transform,
                       text_column=settings.text_column, tokenizer=lambda: None,
                       class_names=names, image_column=settings.image_column,
                       id_column=settings.id_column, label_column=settings.label_column,
                       split=settings.split)
    pool = open_pool(spec, opts)
    if not pool.has_labels:
        folders = " (pass --labels-from-folders for class subfolders)" \
            if Path(spec).is_dir() and not settings.labels_from_folders else ""
        raise PoolError(f"{what} {spec} has no labels{folders}; simulate reveals the labels of "
                        f"the selected examples, so it needs a labeled pool")
    labels = getattr(pool, "labels", None)
    labels = [int(v) for v in (labels.tolist() if hasattr(labels, "tolist") else labels)] \
        if labels is not None else [int(pool[i].label) for i in range(len(pool))]
    missing = next((i for i, v in zip(pool.ids, labels) if v < 0), None)
    if missing is not None:
        raise PoolError(f"{what} {spec}: the example '{missing}' has no label; simulate needs "
                        f"every example labeled")
    paths = getattr(pool, "paths", None)
    shown = [class_name(v, pool.classes) for v in labels]
    return list(pool.ids), shown, [str(Path(p).resolve()) for p in paths] if paths else None


def simulate(base: Settings, plan: Plan, say=lambda line: None) -> list[dict]:
    """Every (strategy, seed, round) -> one curve row; the rows are also written to plan.output
    after every round, so a failure keeps the finished rounds."""
    ids, labels, paths = pool_labels(base, plan.pool, "the pool")
    if plan.init + plan.rounds * plan.budget > len(ids):
        raise ConfigError(f"--init {plan.init} + --rounds {plan.rounds} x --budget {plan.budget} "
                          f"needs more labels than the pool {plan.pool} has ({len(ids)} examples)")
    pool_labels(base, plan.eval_pool, "the eval pool")  # labeled, before any training
    make_folder(plan.workdir, f"the work folder {plan.workdir}")
    rows: list[dict] = []
    for seed in range(plan.seeds):
        start = np.random.default_rng(seed).choice(len(ids), plan.init, replace=False)
        for strategy in plan.strategies:
            labeled = [ids[i] for i in sorted(start.tolist())]  # the same start for every strategy
            for r in range(plan.rounds + 1):
                where = plan.workdir / strategy / f"seed{seed}" / f"round{r}"
                model = train(plan, where, labeled, ids, labels, paths, strategy, seed, r)
                acc = accuracy(base, plan.eval_pool, model)
                rows.append({"strategy": strategy, "seed": seed, "round": r,
                             "labels": len(labeled), "accuracy": acc})
                say(f"{strategy} seed {seed} round {r}: {len(labeled)} labels, "
                    f"accuracy {100 * acc:.1f}%")
                if plan.output:
                    write_curves(rows, plan.output)
                if r < plan.rounds:
                    labeled += choose(base, plan, model, strategy, seed, labeled)
                model.unlink()  # labeled.csv and train.log stay; checkpoints can be large
    return rows


def train(plan: Plan, where: Path, labeled: list[str], ids: list[str], labels: list,
          paths: list | None, strategy: str, seed: int, r: int) -> Path:
    """labeled.csv written, the training command run -> the checkpoint it wrote."""
    where.mkdir(parents=True, exist_ok=True)
    index = {i: n for n, i in enumerate(ids)}
    listing, model, log = where / "labeled.csv", where / "model.pt", where / "train.log"
    with open(listing, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["id", "label"] + (["path"] if paths else []))
        for i in labeled:
            w.writerow([i, labels[index[i]]] + ([paths[index[i]]] if paths else []))
    model.unlink(missing_ok=True)
    values = {"labeled": listing, "model": model, "round": r, "seed": seed, "strategy": strategy,
              "workdir": plan.workdir}
    # one pass, each value one shell word whatever it holds ($, ;, spaces, a placeholder's name)
    command = re.sub(r"\{(" + "|".join(PLACEHOLDERS) + r")\}",
                     lambda m: shlex.quote(str(values[m.group(1)])), plan.train)
    with open(log, "w") as out:
        done = subprocess.run(command, shell=True, stdout=out, stderr=subprocess.STDOUT)
    if done.returncode != 0:
        last = last_line(log)
        last = last if len(last) <= 160 else "..." + last[-157:]
        tail = f" (its last line: {last})" if last else ""
        raise RunError(f"the training command exited with code {done.returncode} in round {r} "
                       f"(strategy {strategy}, seed {seed}); its output is in {log}{tail}")
    if not model.is_file():
        raise RunError(f"the training command wrote no checkpoint {model} in round {r} "
                       f"(strategy {strategy}, seed {seed}); it must save the model to {{model}}")
    return model


LOG_TAIL = 64 * 1024  # bytes read from the end of train.log to quote its last line


def last_line(log: Path, cap: int = LOG_TAIL) -> str:
    """The log's last non-blank line, read from its last `cap` bytes only (a log can be huge,
    or one long line: then its end)."""
    with open(log, "rb") as f:
        size = f.seek(0, os.SEEK_END)
        f.seek(max(0, size - cap))
        tail = f.read(cap).decode(errors="replace")
    return next((line.strip() for line in reversed(tail.splitlines()) if line.strip()), "")


def accuracy(base: Settings, eval_pool: str, model: Path) -> float:
    """The share of the eval pool the checkpoint predicts right (pred against label)."""
    settings = dataclasses.replace(base, pool=eval_pool, model=str(model), strategy="margin",
                                   sources=dict(base.sources))
    rows = [r for r in run_score(settings, embeddings=False).rows if r.get("label") is not None]
    return sum(str(r["pred"]) == str(r["label"]) for r in rows) / len(rows)


def choose(base: Settings, plan: Plan, model: Path, strategy: str, seed: int,
           labeled: list[str]) -> list[str]:
    """The next batch's ids: `select` on the pool with this round's checkpoint, the labeled ids
    excluded (plain NAME: the top scores; NAME+MODE: that diverse mode)."""
    name, _, mode = strategy.partition("+")
    settings = dataclasses.replace(base, pool=plan.pool, model=str(model), strategy=name,
                                   budget=plan.budget, seed=seed, diverse=bool(mode),
                                   diverse_mode=mode or "badge", sampling="top", typical=False,
                                   sources=dict(base.sources))
    try:
        return [str(r["id"]) for r in run_select(settings, exclude_ids=labeled).rows]
    except AlcliError as err:
        raise type(err)(f"round selection with {strategy} (seed {seed}): {err}") from None


def write_curves(rows: list[dict], dest: str) -> None:
    with atomic_open(dest, "w", newline="") as f:
        w = csv.DictWriter(f, COLUMNS)
        w.writeheader()
        for r in rows:
            w.writerow({**r, "accuracy": f"{r['accuracy']:.6f}"})


def aulc(rows: list[dict]) -> dict[str, tuple[float, float]]:
    """strategy -> (mean, std over seeds) of the AULC: the mean accuracy over the evaluated
    rounds, in points (as benchmarks/learning_curves.py's AUC)."""
    per: dict[str, dict[int, list[float]]] = {}
    for r in rows:
        per.setdefault(r["strategy"], {}).setdefault(r["seed"], []).append(100 * r["accuracy"])
    out = {}
    for strategy, seeds in per.items():
        values = [sum(v) / len(v) for v in seeds.values()]
        mean = sum(values) / len(values)
        std = math.sqrt(sum((v - mean) ** 2 for v in values) / len(values))
        out[strategy] = (mean, std)
    return out


def plot(rows: list[dict], dest: str) -> bool:
    """Mean accuracy per label count, one line per strategy, as a PNG; False without matplotlib."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, ax = plt.subplots(figsize=(6, 4))
    for strategy in dict.fromkeys(r["strategy"] for r in rows):
        mine = [r for r in rows if r["strategy"] == strategy]
        xs = sorted({r["labels"] for r in mine})
        ys = [100 * np.mean([r["accuracy"] for r in mine if r["labels"] == x]) for x in xs]
        ax.plot(xs, ys, marker="o", label=strategy)
    ax.set_xlabel("labeled examples")
    ax.set_ylabel("accuracy on the eval pool (%)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(dest, dpi=100)
    plt.close(fig)
    return True
