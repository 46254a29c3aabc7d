"""`alcli simulate`: learning curves on the user's own labeled pool and training command."""
from __future__ import annotations

import io
import sys
from typing import Annotated, Optional

import typer

from ..errors import AlcliError
from ..files.config import load_settings
from . import shared
from .options import (
    Aggregate, Arch, ArchKwargs, BatchSize, BoxThreshold, MaxNewTokens, Temperature, CenterCrop, ClassNames, Compile, Config,
    Decode, Device, EglSamples, Ema, Grayscale, IdColumn, ImageColumn, LabelColumn,
    LabelsFromFolders, Layers, MaxLength, Method, Normalize, Precision, Quiet, Resize, Split, Target, Task,
    Every, Fps,
    TextColumnOpt, TopClasses, Trust, TrustRemoteCode, Workers)

EPILOG = """The training command's contract:

\b
  {labeled}  a CSV it reads: id,label (and path, for image files): the
             examples labeled so far; only selected examples' labels are
             ever written there
  {model}    the checkpoint it must write; alcli loads it as --model
             (with --arch)
  {pool}     the pool as given (POOL), for a pool whose labeled.csv
             holds only id,label (a tensor file)
  {round} {seed} {strategy} {workdir}: for its logs or seeds
  any other {name} is refused
It runs in a shell, in the current folder, each placeholder replaced by
its value quoted as one word (do not quote placeholders yourself: a
quoted one is refused); a non-zero exit stops the simulation. Each
round's labeled.csv and train.log stay in --workdir; checkpoints are
removed once used.
Run again with the same --workdir and settings, a finished round is
not rerun (it says how many it keeps): more seeds or strategies extend
it, a crash or Ctrl-C resumes, and processes run by seed with one work
folder merge into one table when the command is run once more with
all the seeds.

Examples:

\b
alcli simulate pool/ --labels-from-folders --eval test/ --arch mynet:Net \\
    --train "python train.py --labeled {labeled} --out {model}" \\
    --init 20 -n 20 --rounds 5 --strategies margin,egl+badge,random \\
    --seeds 3 -o curves.csv --plot curves.png
"""


# simulate's own options: the plan of the rounds (the rest are settings, as score reads them)
PLAN = ("pool", "train", "eval_pool", "strategies", "seeds", "init", "budget", "rounds", "output",
        "plot_file", "report", "workdir", "config")


def simulate(
    pool: Annotated[str, typer.Argument(
        metavar="POOL", help="A labeled pool: class subfolders (--labels-from-folders), a "
        ".csv/.jsonl manifest or a table with a label column, or a tensor file with y.")],
    train: Annotated[str, typer.Option(
        "--train", metavar="COMMAND", help="The training command, with {labeled} and {model} in "
        "it (see below).")],
    eval_pool: Annotated[str, typer.Option(
        "--eval", metavar="POOL", help="The labeled pool each round's checkpoint is evaluated on "
        "(accuracy of its predictions).")],
    strategies: Annotated[str, typer.Option(
        "--strategies", metavar="LIST", help="Comma-separated: a --strategy NAME (the top scores) "
        "or NAME+badge / NAME+cluster-margin (that diverse batch). [default: margin,egl,random]",
        show_default=False)]
    = "margin,egl,random",
    seeds: Annotated[str, typer.Option(
        metavar="SEEDS", show_default=False, help="A count N (seeds 0..N-1), a range A-B or "
        "a list A,B,C; a seed's first random examples are the same for every strategy. "
        "[default: 3]")] = "3",
    init: Annotated[int, typer.Option(
        metavar="N", show_default=False, min=1, help="Random labeled examples before the first "
        "round. [default: 20]")] = 20,
    budget: Annotated[int, typer.Option("--budget", "-n", metavar="N", show_default=False, min=1,
                                        help="Examples selected per round. [default: 20]")] = 20,
    rounds: Annotated[int, typer.Option(
        metavar="N", show_default=False, min=0, help="Selections; N + 1 checkpoints are trained "
        "and evaluated. [default: 5]")] = 5,
    output: Annotated[Optional[str], typer.Option(
        "--output", "-o", metavar="FILE", help="The curves CSV (strategy, seed, round, labels, "
        "accuracy), rewritten after every round. [default: stdout, at the end]")] = None,
    plot_file: Annotated[Optional[str], typer.Option(
        "--plot", metavar="PNG", help="Also draw the mean curves, a band of one sd over seeds "
        "(needs matplotlib; the format from the name: .png, .pdf, .svg, ...).")] = None,
    report: Annotated[Optional[str], typer.Option(
        "--report", metavar="FILE", help="The summary as a table: CSV for a .csv name, else "
        "markdown.")] = None,
    workdir: Annotated[Optional[str], typer.Option(
        metavar="DIR", help="Each round's labeled.csv, checkpoint and train.log. [default: "
        "OUTPUT.runs, or .alcli/simulate]")] = None,
    # the scoring options (options.SCORING), passed through to every round's scoring
    config: Config = None, labels_from_folders: LabelsFromFolders = False,
    class_names: ClassNames = None, text_column: TextColumnOpt = None,
    image_column: ImageColumn = None, id_column: IdColumn = None, label_column: LabelColumn = None,
    split: Split = None, max_length: MaxLength = None, fps: Fps = None, every: Every = None,
    arch: Arch = None, arch_kwargs: ArchKwargs = None, ema: Ema = False,
    trust_checkpoint: Trust = False, trust_remote_code: TrustRemoteCode = False, task: Task = None,
    target: Target = None, top_classes: TopClasses = None, egl_samples: EglSamples = None, aggregate: Aggregate = None,
    box_threshold: BoxThreshold = None, temperature: Temperature = None,
    max_new_tokens: MaxNewTokens = None, layers: Layers = None,
    resize: Resize = None, center_crop: CenterCrop = None, grayscale: Grayscale = None,
    normalize: Normalize = None,
    batch_size: BatchSize = None, device: Device = None, workers: Workers = None,
    precision: Precision = None, decode: Decode = None, method: Method = None,
    compile: Compile = False, quiet: Quiet = False,
):
    """Learning curves on your own labeled pool: hide its labels, train with your command on
    a random start, then select, reveal and retrain round by round, per strategy and seed; print
    the mean AULC (mean accuracy over the rounds) per strategy."""
    flags = {k: v for k, v in locals().items() if k not in PLAN}
    import csv
    from pathlib import Path

    from ..files.atomic import make_folder
    from ..files.config import Settings
    from ..simulate import (PLACEHOLDER, Plan, check_outputs, check_strategies, check_train,
                            parse_seeds, plot, plot_format, simulate as run_simulation, summarize,
                            versus, write_report)
    # no ./configs/default.yaml here: the demo's model settings are not the user's
    given = shared.given_flags(flags)
    settings = load_settings(config, given)
    r = shared.reporter(settings)
    if "model" not in (m.group(1) for m in PLACEHOLDER.finditer(train)):  # ${model}: the shell's
        raise AlcliError("option --train must name {model}, the checkpoint the command writes "
                         "(and read {labeled}, the labeled examples)")
    check_train(train)
    if plot_file:
        plot_format(plot_file)  # a name matplotlib cannot write: refused before the first round
    plan = Plan(pool, eval_pool, train, check_strategies(strategies), parse_seeds(seeds), init,
                budget, rounds,
                Path(workdir or (f"{output}.runs" if output and output != "-"
                                 else ".alcli/simulate")),
                output if output != "-" else None, settings=given)
    # no output replaces an input or another output, nor writes into a folder pool
    check_outputs(settings, plan, report, plot_file,
                  "option --workdir" if workdir else "the default work folder (--workdir)")
    for option, dest in (("--output", plan.output), ("--report", report), ("--plot", plot_file)):
        if dest and dest != "-":
            make_folder(Path(dest).parent, f"option {option} {dest}")
    rows = run_simulation(settings, plan, say=r.info, warn=r.warn)
    if not plan.output:
        out = io.StringIO()
        w = csv.DictWriter(out, ("strategy", "seed", "round", "labels", "accuracy"),
                           extrasaction="ignore")
        w.writeheader()
        w.writerows({**row, "accuracy": f"{row['accuracy']:.6f}"} for row in rows)
        sys.stdout.write(out.getvalue())
    default = f"{Settings.strategy}+{Settings.diverse_mode}"  # select's default batch
    summary = summarize(rows, default)
    for row in summary:
        sd = f" (sd {row['sd']:.2f})" if row["sd"] is not None else ""
        cost = (f"; scoring {row['score_s_per_round']:.3f} s per round, "
                f"{row['aulc_per_score_s']:.1f} AULC per scoring s"
                if row["score_s_per_round"] else "")
        pairs = "".join(f"; vs {name}: {versus(row, key)}" for key, name in
                        (("vs_random", "random"), ("vs_default", default)) if key in row)
        r.info(f"{row['strategy']}: AULC {row['aulc']:.2f}{sd} points over {row['seeds']} "
               f"seeds{pairs}{cost}")
    r.info(f"AULC: mean accuracy over the {rounds + 1} rounds; sd: sample sd over seeds; vs: "
           f"mean paired difference (p of the paired t-test, wins/losses over seeds)")
    if report:
        write_report(summary, report, default)
    if plot_file and not plot(rows, plot_file):
        r.warn(f"--plot {plot_file}: matplotlib is not installed; no picture drawn")
