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

import contextlib
import csv
import dataclasses
import json
import math
import os
import re
import shlex
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .api import run_score, run_select
from .errors import AlcliError, ConfigError, PoolError, RunError, first_line
from .files.atomic import atomic_open, make_folder
from .files.classnames import class_name, read_class_names
from .files.config import DIVERSE_MODES, STRATEGY_NAMES, Settings
from .files.outputs import check_not_input, inputs_of, is_under
from .files.remote import is_url
from .longrun.shard import SubPool
from .pools import is_folder, open_pool
from .pools.common import Pool, PoolOptions
from .score.strategies import STRATEGIES
from .selection import stopping

PLACEHOLDERS = ("labeled", "model", "pool", "round", "seed", "strategy", "workdir")
COLUMNS = ("strategy", "seed", "round", "labels", "accuracy", "kappa", "stop")
# kappa: Cohen's kappa of this round's and the previous round's predictions on the eval pool (its
# labels unused: the stop set); stop: 1 where the stabilizing-predictions rule says stop
# (alcli/selection/stopping.py, kappa >= 0.99 averaged over the last 3 rounds)


@dataclass
class Plan:
    """What one simulation runs."""

    pool: str
    eval_pool: str
    train: str                 # the training command, with {labeled} and {model} in it
    strategies: list[str]      # NAME or NAME+badge / NAME+cluster-margin
    seeds: list[int]
    init: int                  # random labeled examples before round 0
    budget: int                # examples selected per round
    rounds: int                # selections; rounds + 1 checkpoints are evaluated
    workdir: Path
    output: str | None = None  # the curves CSV, rewritten after every round
    settings: dict = dataclasses.field(default_factory=dict)  # the scoring flags given


# what a finished round must have been run with to be reused (strategies and seeds may grow)
SAME = ("pool", "eval_pool", "train", "init", "budget", "rounds", "settings")


def parse_seeds(spec: str) -> list[int]:
    """'3' -> [0, 1, 2] (a count); '5-9' -> [5..9]; '0,3,7' -> [0, 3, 7]; else a ConfigError."""
    spec = spec.strip()
    try:
        if re.fullmatch(r"\d+", spec):
            seeds = list(range(int(spec)))
        elif re.fullmatch(r"\d+-\d+", spec):
            first, last = map(int, spec.split("-"))
            seeds = list(range(first, last + 1))
        else:
            seeds = [int(v) for v in spec.split(",") if v.strip()]
    except ValueError:
        seeds = []
    if not seeds or min(seeds) < 0 or len(set(seeds)) != len(seeds):
        raise ConfigError(f"option --seeds: '{spec}' is not a count N (seeds 0..N-1), a range "
                          f"A-B or a list of distinct seeds A,B,C")
    return seeds


PLACEHOLDER = re.compile(r"(?<!\$)\{(" + "|".join(PLACEHOLDERS) + r")\}")  # ${VAR} is the shell's


def check_train(command: str) -> None:
    """A {name} in the training command that alcli does not fill is a ConfigError (${VAR}, the
    shell's, is left alone); so is a placeholder inside the command's own quotes or after a
    backslash: alcli quotes each value as one shell word, and quoted again, a value's $(...) or
    `...` would run (and its quotes reach the command)."""
    for name in re.findall(r"(?<!\$)\{([A-Za-z_]\w*)\}", command):
        if name not in PLACEHOLDERS:
            raise ConfigError(f"option --train: {{{name}}} is not a placeholder alcli fills; it "
                              f"fills {', '.join('{' + p + '}' for p in PLACEHOLDERS)}")
    quoted = _quoted_placeholder(command)
    if quoted:
        raise ConfigError(f"option --train: {quoted}; alcli quotes each placeholder's value as "
                          f"one shell word itself, so write it bare (e.g. --out {{model}}, not "
                          f"--out \"{{model}}\")")


def _quoted_placeholder(command: str) -> str | None:
    """How the first placeholder that sits inside quotes ('...', "...", $'...') or right after a
    backslash is placed, or None. The shell's quoting is followed as far as it matters here:
    $(...) and `...` (also inside "...") start unquoted text again, and a # at a word's start
    (unquoted) begins a comment."""
    starts = {m.start(): m.group(0) for m in PLACEHOLDER.finditer(command)}
    stack = [""]  # "" unquoted, "'", '"', "$'", "$(", "`"
    i = 0
    while i < len(command):
        c, where = command[i], stack[-1]
        if i in starts and where in ("'", '"', "$'"):
            return (f"{starts[i]} sits inside the command's own quotes "
                    f"({where}...{where[-1]})")
        if c == "\\" and where != "'":  # escapes the next character
            if i + 1 in starts:
                return f"{starts[i + 1]} follows a backslash"
            i += 2
            continue
        if where == "'" or where == "$'":
            if c == "'":
                stack.pop()
        elif where == '"':
            if c == '"':
                stack.pop()
            elif command.startswith("$(", i):
                stack.append("$(")
                i += 1
            elif c == "`":
                stack.append("`")
        else:  # unquoted: the top level, inside $(...) or `...`
            if c == "#" and (i == 0 or command[i - 1] in " \t\n;&|()"):
                end = command.find("\n", i)
                i = len(command) if end < 0 else end
                continue
            if command.startswith("$'", i):
                stack.append("$'")
                i += 1
            elif c in ("'", '"'):
                stack.append(c)
            elif command.startswith("$(", i):
                stack.append("$(")
                i += 1
            elif c == ")" and where == "$(":
                stack.pop()
            elif c == "`":
                stack.pop() if where == "`" else stack.append("`")
        i += 1
    return None


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


IMAGE_FORMATS = ("png", "pdf", "svg", "jpg", "jpeg")  # --plot's formats where matplotlib is absent


def check_outputs(settings: Settings, plan: Plan, report: str | None, plot_file: str | None,
                  workdir_option: str = "option --workdir") -> None:
    """Refuse, before any round, an output (-o, --report, --plot, the work folder) that is one of
    the inputs (POOL, --eval, the settings' files, the config file) or another output; a work
    folder inside a folder pool (read again every round: its files would join the pool), or whose
    plan.json or STRATEGY/ folders would replace an input."""
    inputs = [("the pool", plan.pool), ("the eval pool", plan.eval_pool), *inputs_of(settings)]
    written: list[tuple[str, object]] = []
    for option, what, dest in (("option --output", "the curves CSV given by option --output",
                                plan.output),
                               ("option --report", "the report given by option --report", report),
                               ("option --plot", "the plot given by option --plot", plot_file)):
        check_not_input(dest, option, [*inputs, *written])
        written.append((what, dest))
    workdir = str(plan.workdir)
    check_not_input(workdir, workdir_option, [*inputs, *written])
    runs = [plan.workdir / PLAN_FILE, *(plan.workdir / s for s in plan.strategies)]
    for what, path in [*inputs, *written]:
        if not isinstance(path, (str, os.PathLike)) or str(path) == "-" or is_url(str(path)):
            continue
        if what in ("the pool", "the eval pool") and os.path.isdir(path) and \
                is_under(plan.workdir, path):
            raise ConfigError(f"{workdir_option} {workdir} is inside {what} {path}, a folder read "
                              f"again every round (its files would join it); give a --workdir "
                              f"outside it")
        if any(is_under(path, run) for run in runs):
            raise ConfigError(f"{workdir_option} {workdir} would write {path}, which is {what}; "
                              f"give another --workdir")


def plot_format(dest: str) -> str:
    """The image format --plot `dest` is written in: its suffix (one matplotlib writes, or one of
    IMAGE_FORMATS where matplotlib is not installed), PNG for a name without one; else a
    ConfigError (before any round)."""
    if dest == "-":
        raise ConfigError("option --plot - : the plot needs a file name, not stdout")
    suffix = Path(dest).suffix.lower().lstrip(".")
    if not suffix:
        return "png"
    formats = plot_formats()
    if suffix not in formats:
        raise ConfigError(f"option --plot {dest}: '.{suffix}' is not an image format the plot "
                          f"can be written in; give a name ending in "
                          f"{', '.join('.' + f for f in formats)}")
    return suffix


def plot_formats() -> tuple[str, ...]:
    """The file formats matplotlib writes (without drawing anything), else IMAGE_FORMATS."""
    import importlib.util
    try:
        if importlib.util.find_spec("matplotlib") is None:
            return IMAGE_FORMATS
        from matplotlib.backend_bases import FigureCanvasBase
        return tuple(sorted(FigureCanvasBase.get_supported_filetypes()))
    except Exception:  # a broken matplotlib: plot() will say it cannot draw
        return IMAGE_FORMATS


def pool_labels(settings: Settings, spec: str, what: str,
                why: str = "simulate reveals the labels of the selected examples, so it needs a "
                           "labeled pool") -> tuple[list[str], list, list | None]:
    """(ids, each one's label as the training command reads it, each one's file or None) of a
    labeled pool; a pool without labels, or a row without one, is a PoolError naming it (and
    `why` labels are needed)."""
    names = read_class_names(settings.class_names, settings.where("class_names")) \
        if settings.class_names else None
    opts = PoolOptions(settings.labels_from_folders, settings.transform,
                       text_column=settings.text_column, tokenizer=lambda: None,
                       class_names=names, image_column=settings.image_column,
                       id_column=settings.id_column, label_column=settings.label_column,
                       split=settings.split, fps=settings.fps, every=settings.every)
    pool = open_pool(spec, opts)
    if not pool.has_labels and getattr(pool, "given_boxes", None):
        raise PoolError(f"{what} {spec} holds boxes (a `boxes` column), and simulate reveals, "
                        f"trains on and evaluates class labels only: detection pools are not "
                        f"simulated (score, select --cost boxes and review run on them)")
    if not pool.has_labels:
        folders = " (pass --labels-from-folders for class subfolders)" \
            if is_folder(spec) and not settings.labels_from_folders else ""
        raise PoolError(f"{what} {spec} has no labels{folders}; {why}")
    labels = getattr(pool, "labels", None)
    labels = [int(v) for v in (labels.tolist() if hasattr(labels, "tolist") else labels)] \
        if labels is not None else [int(pool[i].label) for i in range(len(pool))]
    missing = next((i for i, v in zip(pool.ids, labels) if v < 0), None)
    if missing is not None:
        raise PoolError(f"{what} {spec}: the example '{missing}' has no label; {why}")
    paths = getattr(pool, "paths", None)
    shown = [class_name(v, pool.classes) for v in labels]
    return list(pool.ids), shown, [str(Path(p).resolve()) for p in paths] if paths else None


def reads_target(strategy: str) -> bool:
    """Does a --strategies entry (NAME or NAME+MODE) take --target's gradient (align)?"""
    found = STRATEGIES.get(strategy.partition("+")[0])
    return found is not None and found.reads_target


def check_target(base: Settings, plan: Plan) -> None:
    """--target with align among the strategies, align with --target, and the target labeled in
    every row, before any training (its labels against the model's classes: each round's
    pre-flight)."""
    aligned = any(reads_target(s) for s in plan.strategies)
    if base.target is None:
        if aligned:
            raise ConfigError("--strategies align needs --target POOL, a labeled pool whose mean "
                              "loss gradient the examples are aligned with")
        return
    if not aligned:
        raise ConfigError(f"{base.where('target')} is read by the align strategy alone; add align "
                          f"to --strategies, or leave it out")
    pool_labels(base, base.target, "the target", "align takes the target's mean loss gradient at "
                                                 "its labels, so it needs every row labeled")


class HiddenLabels(SubPool):
    """The pool as each round's selection scores it: every example, its label hidden (-1), so that
    no strategy reads the label of an example not yet selected (gradnorm: at the predicted class;
    align: how far a label can move the target's loss); the labeled ones are excluded from the
    batch."""

    def __init__(self, pool: Pool):
        super().__init__(pool, list(range(len(pool))))
        self.has_labels = False

    def __getitem__(self, i: int):
        return self.base[i]._replace(label=-1)


def simulate(base: Settings, plan: Plan, say=lambda line: None, warn=None) -> list[dict]:
    """Every (strategy, seed, round) -> one curve row; the rows are also written to plan.output
    after every round, so a failure keeps the finished rounds. `warn`: a damaged round of the work
    folder, rerun (default: `say`)."""
    warn = warn or say
    ids, labels, paths = pool_labels(base, plan.pool, "the pool")
    if plan.init + plan.rounds * plan.budget > len(ids):
        raise ConfigError(f"--init {plan.init} + --rounds {plan.rounds} x --budget {plan.budget} "
                          f"needs more labels than the pool {plan.pool} has ({len(ids)} examples)")
    pool_labels(base, plan.eval_pool, "the eval pool")  # labeled, before any training
    check_target(base, plan)
    make_folder(plan.workdir, f"the work folder {plan.workdir}")
    same_plan(plan)
    kept, total = kept_rounds(plan, ids), len(plan.seeds) * len(plan.strategies) * (plan.rounds + 1)
    if kept:
        say(f"resuming from the work folder {plan.workdir}: {kept} of the {total} rounds are "
            f"finished there and kept, not rerun")
    rows: list[dict] = []
    ran = 0  # rounds finished by this run
    strategy, seed, r = plan.strategies[0], plan.seeds[0], 0
    try:
        with _sigterm_stops():
            for seed in plan.seeds:
                for strategy in plan.strategies:
                    labeled = first_labeled(plan, ids, seed)  # the same start for every strategy
                    preds, kappas = None, []  # the previous round's predictions on the stop set
                    for r in range(plan.rounds + 1):
                        done = _round(base, plan, ids, labels, paths, strategy, seed, r, labeled,
                                      say, warn)
                        ran += done.pop("_ran")
                        now = stop_set(plan, strategy, seed, r)
                        agreed = stopping.agreement(preds, now) \
                            if preds is not None and now is not None and r else None
                        kappa = agreed["kappa"] if agreed else None
                        kappas.append(stopping.counted(agreed) if agreed else None)
                        preds = now
                        rows.append({"strategy": strategy, "seed": seed, "round": r,
                                     "labels": done["labels"], "accuracy": done["accuracy"],
                                     "score_s": done["score_s"], "kappa": kappa,
                                     "stop": int(r > 0 and stopping.verdicts(kappas[1:])[-1])})
                        if plan.output:
                            write_curves(rows, plan.output)
                        labeled = labeled + done["picked"]
    except KeyboardInterrupt as err:  # Ctrl-C (or SIGTERM, stopped): say what is kept
        code = getattr(err, "exit_code", 130)
        name = signal.Signals(code - 128).name if 128 < code < 128 + signal.NSIG else "a signal"
        n = kept + ran
        raise Stopped(f"stopped by {name} in round {r} (strategy {strategy}, seed {seed}); "
                      f"{n} finished round{'' if n == 1 else 's'} of {total} "
                      f"{'is' if n == 1 else 'are'} kept in the work folder {plan.workdir}: run "
                      f"the same command again to go on from there", code) from None
    return rows


class Stopped(KeyboardInterrupt):
    """simulate stopped by a signal; the message says what the work folder keeps. (A
    KeyboardInterrupt, which the CLI prints and turns into exit 128 + the signal's number.)"""

    def __init__(self, message: str, exit_code: int):
        super().__init__(message)
        self.exit_code = exit_code


@contextlib.contextmanager
def _sigterm_stops():
    """SIGTERM stops the run as Ctrl-C does (a KeyboardInterrupt, exit 143), so that it is said
    what the work folder keeps; in the main thread only, where signal handlers can be set."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum, frame):
        raise Stopped("", 128 + signum)

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def first_labeled(plan: Plan, ids: list[str], seed: int) -> list[str]:
    """The seed's `init` random ids, in pool order: every strategy's round 0."""
    start = np.random.default_rng(seed).choice(len(ids), plan.init, replace=False)
    return [ids[i] for i in sorted(start.tolist())]


def kept_rounds(plan: Plan, ids: list[str]) -> int:
    """How many rounds of the plan the work folder holds finished (each reached through the
    finished rounds before it), which a run reuses; damaged ones are warned about when reached."""
    n = 0
    for seed in plan.seeds:
        for strategy in plan.strategies:
            labeled = first_labeled(plan, ids, seed)
            for r in range(plan.rounds + 1):
                done = finished(plan.workdir / strategy / f"seed{seed}" / f"round{r}", labeled,
                                ids, plan.budget)
                if done is None:
                    break
                n += 1
                labeled = labeled + done["picked"]
    return n


def _round(base: Settings, plan: Plan, ids, labels, paths, strategy: str, seed: int, r: int,
           labeled: list[str], say, warn) -> dict:
    """The round's record: the work folder's, where it finished, else the round run now
    (`_ran`: 1 when it was run)."""
    where = plan.workdir / strategy / f"seed{seed}" / f"round{r}"
    done = finished(where, labeled, ids, plan.budget, warn)
    if done is not None:
        return {**done, "_ran": 0}
    model = train(plan, where, labeled, ids, labels, paths, strategy, seed, r)
    acc, preds = accuracy(base, plan.eval_pool, model)
    replaceable(where / STOP_SET)
    with atomic_open(where / STOP_SET, "w") as f:
        json.dump(preds, f)
    began = time.perf_counter()
    picked = choose(base, plan, model, strategy, seed, labeled) \
        if r < plan.rounds else []
    done = {"labels": len(labeled), "accuracy": acc, "picked": picked,
            "score_s": time.perf_counter() - began if r < plan.rounds else None}
    replaceable(where / DONE)
    with atomic_open(where / DONE, "w") as f:  # last: the round's mark
        json.dump(done, f)
    model.unlink()  # labeled.csv and train.log stay; checkpoints can be large
    say(f"{strategy} seed {seed} round {r}: {len(labeled)} labels, "
        f"accuracy {100 * acc:.1f}%")
    return {**done, "_ran": 1}


DONE = "done.json"  # a finished round: its accuracy, the ids it picked, its scoring time
PLAN_FILE = "plan.json"  # the settings the work folder's rounds were run with
PLAN_CAP = 16 << 20  # bytes of plan.json read: the settings and the training command


def same_plan(plan: Plan) -> None:
    """Record the plan in the work folder, or refuse one whose finished rounds ran otherwise (a
    folder with no finished round takes the new plan). A plan.json that cannot be read, beside
    finished rounds, is refused too: the settings those rounds ran with are unknown."""
    mine = {k: getattr(plan, k) for k in SAME}
    mine["settings"] = {k: str(v) for k, v in sorted(plan.settings.items())
                        if v is not None and k != "quiet"}
    path = plan.workdir / PLAN_FILE
    if path.is_file() and any(plan.workdir.glob(f"*/seed*/round*/{DONE}")):
        try:
            theirs = json.loads(read_capped(path, PLAN_CAP))
            if not isinstance(theirs, dict):
                raise ValueError(f"it holds a JSON {type(theirs).__name__}, not the settings")
        except (OSError, ValueError) as err:
            raise ConfigError(f"the work folder's {path} cannot be read ({first_line(err)}), so "
                              f"the settings its finished rounds ran with are unknown; give "
                              f"another --workdir, or remove the folder {plan.workdir} to start "
                              f"over") from None
        differs = next((k for k in SAME if theirs.get(k) != mine[k]), None)
        if differs:
            raise ConfigError(f"the work folder {plan.workdir} holds rounds run with other "
                              f"settings ({differs}: {theirs.get(differs)!r}, now "
                              f"{mine[differs]!r}); give another --workdir or the same settings")
        return
    replaceable(path)
    with atomic_open(path, "w") as f:
        json.dump(mine, f)


def finished(where: Path, labeled: list[str], ids: list[str] | None = None, budget: int = 0,
             warn=lambda line: None) -> dict | None:
    """The round's record when it finished with these labeled ids (its labeled.csv), else None.
    A done.json or labeled.csv that cannot be read or does not hold what alcli writes there (a
    damaged work folder: truncated, another file linked in, a picked id that `ids`, the pool's,
    lacks) is an unfinished round too, with a warning naming the file: it is rerun."""
    done, listing = where / DONE, where / "labeled.csv"
    if not done.is_file() or not listing.is_file():
        return None
    try:
        if not same_ids(listing, labeled):
            return None
    except (OSError, ValueError, csv.Error) as err:  # UnicodeDecodeError is a ValueError
        warn(f"the work folder's {listing} cannot be read ({first_line(err)}); its round is rerun")
        return None
    longest = max((len(i) for i in ids), default=0) if ids is not None else 0
    try:  # done.json as written: mostly the picked ids, JSON-escaped (12 bytes a character at most)
        record = json.loads(read_capped(done, 4096 + budget * (12 * longest + 4)
                                        if ids is not None else PLAN_CAP))
        problem = record_problem(record, labeled, ids)
    except (OSError, ValueError) as err:
        problem = f"cannot be read ({first_line(err)})"
    if problem:
        warn(f"the work folder's {done} {problem}; its round is rerun")
        return None
    return record


def same_ids(listing: Path, labeled: list[str]) -> bool:
    """Does labeled.csv list exactly these ids, in this order? (Read up to the first that differs;
    a file without an id column is a ValueError.)"""
    with open(listing, newline="") as f:
        rows = csv.DictReader(f)
        if "id" not in (rows.fieldnames or ()):
            raise ValueError("it has no id column")
        n = 0
        for n, row in enumerate(rows, 1):
            if n > len(labeled) or row["id"] != str(labeled[n - 1]):
                return False
        return n == len(labeled)


def record_problem(record, labeled: list[str], ids: list[str] | None) -> str | None:
    """What makes `record` (a done.json as read) other than what simulate writes for a round with
    `labeled`, or None."""
    def number(v):
        return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    if not isinstance(record, dict):
        return f"holds a JSON {type(record).__name__}, not a round's record"
    if record.get("labels") != len(labeled) or isinstance(record.get("labels"), bool):
        return f"does not record the round's {len(labeled)} labels"
    if not number(record.get("accuracy")) or not 0 <= record["accuracy"] <= 1:
        return "holds no accuracy between 0 and 1"
    if not (record.get("score_s") is None or number(record["score_s"]) and record["score_s"] >= 0):
        return "holds no scoring time"
    picked = record.get("picked")
    if not isinstance(picked, list) or not all(isinstance(i, str) for i in picked):
        return "holds no list of picked ids"
    if ids is not None:
        known, taken = set(map(str, ids)), set(map(str, labeled))
        stray = next((i for i in picked if i not in known or i in taken), None)
        if stray is not None:
            why = "is already labeled" if stray in taken else "is not in the pool"
            return f"picked the id '{stray[:80]}', which {why}"
        if len(set(picked)) != len(picked):
            return "picked an id twice"
    return None


def read_capped(path: Path, cap: int) -> str:
    """The text of `path`, a file alcli wrote; one larger than `cap` bytes is a ValueError (not
    read whole: a damaged folder may link in any file)."""
    with open(path, "rb") as f:
        data = f.read(cap + 1)
    if len(data) > cap:
        raise ValueError(f"it is larger than {cap} bytes")
    return data.decode()


def replaceable(path: Path) -> None:
    """Remove the work folder's `path` where it is a link or not a regular file, before alcli
    writes it: written through, a link (a damaged folder) would replace the file it names."""
    if path.is_symlink() or (path.exists() and not path.is_file()):
        if path.is_dir() and not path.is_symlink():
            raise RunError(f"the work folder holds a folder {path} where alcli writes a file; "
                           f"remove it or give another --workdir")
        path.unlink()


def train(plan: Plan, where: Path, labeled: list[str], ids: list[str], labels: list,
          paths: list | None, strategy: str, seed: int, r: int) -> Path:
    """labeled.csv written, the training command run -> the checkpoint it wrote."""
    where.mkdir(parents=True, exist_ok=True)
    index = {i: n for n, i in enumerate(ids)}
    listing, model, log = where / "labeled.csv", where / "model.pt", where / "train.log"
    for path in (listing, log):
        replaceable(path)
    with open(listing, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["id", "label"] + (["path"] if paths else []))
        for i in labeled:
            w.writerow([i, labels[index[i]]] + ([paths[index[i]]] if paths else []))
    model.unlink(missing_ok=True)
    values = {"labeled": listing, "model": model, "pool": plan.pool, "round": r, "seed": seed, "strategy": strategy,
              "workdir": plan.workdir}
    # one pass, each value one shell word whatever it holds ($, ;, spaces, a placeholder's name)
    command = PLACEHOLDER.sub(lambda m: shlex.quote(str(values[m.group(1)])), plan.train)
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


def accuracy(base: Settings, eval_pool: str, model: Path) -> tuple[float, dict[str, str]]:
    """The share of the eval pool the checkpoint predicts right (pred against label), and its
    predictions (id -> pred): the stop set of the stopping rule."""
    settings = dataclasses.replace(base, pool=eval_pool, model=str(model), strategy="margin",
                                   target=None, sources=dict(base.sources))
    scored = run_score(settings, embeddings=False).rows
    rows = [r for r in scored if r.get("label") is not None]
    acc = sum(str(r["pred"]) == str(r["label"]) for r in rows) / len(rows)
    return acc, stopping.predictions(scored)


STOP_SET = "eval_preds.json"  # a round's predictions on the eval pool: {id: pred}


def stop_set(plan: Plan, strategy: str, seed: int, r: int) -> dict[str, str] | None:
    """The round's eval-pool predictions as its work folder keeps them; None where it holds none
    (a round finished by an older alcli) or not a mapping of text to text."""
    path = plan.workdir / strategy / f"seed{seed}" / f"round{r}" / STOP_SET
    try:  # (a damaged folder may link in any file: a regular one, and not read whole)
        preds = json.loads(read_capped(path, PLAN_CAP)) if path.is_file() else None
    except (OSError, ValueError):
        return None
    ok = isinstance(preds, dict) and all(isinstance(v, str) for v in preds.values())
    return preds if ok else None


def choose(base: Settings, plan: Plan, model: Path, strategy: str, seed: int,
           labeled: list[str]) -> list[str]:
    """The next batch's ids: `select` on the pool with this round's checkpoint, the labeled ids
    excluded (plain NAME: the top scores; NAME+MODE: that diverse mode)."""
    name, _, mode = strategy.partition("+")
    settings = dataclasses.replace(base, pool=plan.pool, model=str(model), strategy=name,
                                   budget=plan.budget, seed=seed, diverse=bool(mode),
                                   diverse_mode=mode or "badge", sampling="top", typical=False,
                                   target=base.target if reads_target(name) else None,
                                   sources=dict(base.sources))
    try:
        return [str(r["id"]) for r in run_select(settings, exclude_ids=labeled,
                                                 narrow=HiddenLabels).rows]
    except AlcliError as err:
        raise type(err)(f"round selection with {strategy} (seed {seed}): {err}") from None


def write_curves(rows: list[dict], dest: str) -> None:
    with atomic_open(dest, "w", newline="") as f:
        w = csv.DictWriter(f, COLUMNS, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({**r, "accuracy": f"{r['accuracy']:.6f}",
                        "kappa": "" if r.get("kappa") is None else f"{r['kappa']:.6f}"})


def aulc(rows: list[dict]) -> dict[str, dict[int, float]]:
    """strategy -> seed -> the AULC: the mean accuracy over the evaluated rounds, in points (as
    benchmarks/learning_curves.py's AUC)."""
    per: dict[str, dict[int, list[float]]] = {}
    for r in rows:
        per.setdefault(r["strategy"], {}).setdefault(int(r["seed"]), []).append(100 * r["accuracy"])
    return {s: {seed: sum(v) / len(v) for seed, v in seeds.items()} for s, seeds in per.items()}


def t_p(t: float, df: int) -> float:
    """Two-sided p of Student's t with integer df, exactly, without scipy (Abramowitz & Stegun
    26.7.3-4: with c = cos(atan(t / sqrt(df))), P(|T| < t) is a finite series in c^2)."""
    theta = math.atan(abs(t) / math.sqrt(df))
    c2, term, series = math.cos(theta) ** 2, 1.0, 1.0
    if df % 2:  # odd: (2/pi) (theta + sin cos (1 + 2/3 c^2 + 2*4/(3*5) c^4 + ...))
        for k in range(1, (df - 1) // 2):
            term *= c2 * (2 * k) / (2 * k + 1)
            series += term
        inside = 2 / math.pi * (theta + (math.sin(theta) * math.cos(theta) * series
                                         if df > 1 else 0.0))
    else:  # even: sin (1 + 1/2 c^2 + 1*3/(2*4) c^4 + ...)
        for k in range(1, df // 2):
            term *= c2 * (2 * k - 1) / (2 * k)
            series += term
        inside = math.sin(theta) * series
    return min(1.0, max(0.0, 1.0 - inside))


def paired(mine: dict[int, float], other: dict[int, float]) -> dict | None:
    """Over the seeds both ran: mean of mine - other, the paired t-test's two-sided p, wins and
    losses; None with fewer than 2 common seeds."""
    seeds = sorted(set(mine) & set(other))
    if len(seeds) < 2:
        return None
    d = [mine[s] - other[s] for s in seeds]
    mean, sd = float(np.mean(d)), float(np.std(d, ddof=1))
    p = (1.0 if mean == 0 else 0.0) if sd == 0 else t_p(mean / (sd / math.sqrt(len(d))), len(d) - 1)
    return {"diff": mean, "p": p, "wins": sum(v > 0 for v in d), "losses": sum(v < 0 for v in d)}


REPORT = ("strategy", "seeds", "aulc", "sd", "vs_random", "vs_random_p", "vs_random_wins",
          "vs_random_losses", "vs_default", "vs_default_p", "vs_default_wins",
          "vs_default_losses", "score_s_per_round", "aulc_per_score_s")


def summarize(rows: list[dict], default: str) -> list[dict]:
    """Per strategy, best AULC first: mean and sample sd over seeds, paired differences against
    random and `default` (where they ran), mean scoring seconds per selection, AULC per second."""
    curves = aulc(rows)
    out = []
    for strategy, seeds in curves.items():
        values = list(seeds.values())
        times = [r["score_s"] for r in rows if r["strategy"] == strategy
                 and r.get("score_s") is not None]
        row = {"strategy": strategy, "seeds": len(values), "aulc": float(np.mean(values)),
               "sd": float(np.std(values, ddof=1)) if len(values) > 1 else None,
               "score_s_per_round": float(np.mean(times)) if times else None}
        row["aulc_per_score_s"] = row["aulc"] / row["score_s_per_round"] \
            if row["score_s_per_round"] else None
        for name, other in (("vs_random", "random"), ("vs_default", default)):
            test = paired(seeds, curves[other]) if other in curves and other != strategy else None
            for key, value in (test or {}).items():
                row[name if key == "diff" else f"{name}_{key}"] = value
        out.append(row)
    return sorted(out, key=lambda r: -r["aulc"])


def shown(value, digits: int = 2) -> str:
    if value is None:
        return ""
    return f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def write_report(summary: list[dict], dest: str, default: str) -> None:
    """`dest` as CSV (a .csv name: REPORT's columns, full precision) or a markdown table."""
    with atomic_open(dest, "w", newline="") as f:
        if dest.lower().endswith(".csv"):
            w = csv.DictWriter(f, REPORT, extrasaction="ignore")
            w.writeheader()
            w.writerows({k: ("" if r.get(k) is None else r[k]) for k in REPORT} for r in summary)
            return
        f.write(f"| strategy | AULC (mean) | sd | vs random (p, wins/losses) | vs {default} "
                f"(p, wins/losses) | scoring s per round | AULC per scoring s |\n"
                f"|---|---|---|---|---|---|---|\n")
        for r in summary:
            f.write(f"| {r['strategy']} | {shown(r['aulc'])} | {shown(r.get('sd'))} | "
                    f"{versus(r, 'vs_random')} | {versus(r, 'vs_default')} | "
                    f"{shown(r['score_s_per_round'], 3)} | {shown(r['aulc_per_score_s'], 1)} |\n")
        f.write("\nAULC: mean accuracy over the rounds, in points; sd: sample standard deviation "
                "over seeds; p: two-sided paired t-test over the seeds both ran.\n")


def versus(row: dict, name: str) -> str:
    if name not in row:
        return ""
    return (f"{row[name]:+.2f} (p {row[name + '_p']:.3g}, "
            f"{row[name + '_wins']}/{row[name + '_losses']})")


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
        at = [[100 * r["accuracy"] for r in mine if r["labels"] == x] for x in xs]
        ys = np.array([np.mean(v) for v in at])
        sds = np.array([np.std(v, ddof=1) if len(v) > 1 else 0.0 for v in at])
        line, = ax.plot(xs, ys, marker="o", label=strategy)
        ax.fill_between(xs, ys - sds, ys + sds, color=line.get_color(), alpha=0.2)  # mean ± sd
    ax.set_xlabel("labeled examples")
    ax.set_ylabel("accuracy on the eval pool (%)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(dest, dpi=100, format=plot_format(dest))  # a name without a suffix: PNG
    plt.close(fig)
    return True
