"""`alcli select`: the batch to label, from a ranked table (or from a pool scored first)."""
from __future__ import annotations

import sys
from typing import Annotated, Optional

import typer

from ..errors import AlcliError
from ..files.config import flag
from . import shared
from .options import (
    LABELING, SELECTION, Aggregate, Arch, ArchKwargs, BatchSize, BoxThreshold, MaxNewTokens, Temperature, CenterCrop,
    ClassNames, Compile, Config, ContactSheet, Decode, Dedup, DedupThreshold, Device, Diverse, DiverseCandidates,
    DiverseClusters, DiverseMode, EglSamples, Ema, Exclude, FromName, Grayscale, IdColumn,
    ImageColumn, ImageDir, Cost, BudgetCost, ImageRoot, LabelColumn, LabelsFromFolders, LabelStudioConfig, Layers,
    LogFormat, MaxLength, Method, Model, Normalize, Null, Pairwise, PerClass, Precision, ProgressEvery,
    Quiet, ReadEmbeddings, Resize, Sampling, SamplingBeta, Seed, Target, SelectFormat, SelectOutput,
    Every, Fps, Split, Strategy, Task, TextColumnOpt, TextWidth, ToName, TopClasses, Trust,
    TrustRemoteCode,
    Typical, Verbose, Workers, under)

# --help lists select's own options first, then these, which matter only when it scores first
SCORING_FIRST = "Scoring first (with --pool or --model; as in 'alcli score')"


def scoring(option):
    return under(SCORING_FIRST, option)


EPILOG = """Examples:

\b
alcli score data/demo/pool | alcli select -n 10 -f paths
alcli select scores.csv -n 100 -o batch.csv
alcli select -n 20 --pool data/demo/pool -c configs/default.yaml

Diverse (BADGE), balanced over classes, minus what is labeled, as a picture:

\b
alcli score --embeddings -o scores.csv
alcli select scores.csv -n 40 --diverse --per-class equal \\
    --exclude labeled.csv --contact-sheet batch.png -o batch.csv
"""


def select(
    scores: Annotated[Optional[str], typer.Argument(
        help="Ranked table (CSV or JSONL) from 'alcli score', or - for stdin. [default: stdin "
             "when something is piped in, else the config's pool scored first]",
        show_default=False, metavar="SCORES")] = None,
    budget: Annotated[Optional[int], typer.Option(
        "--budget", "-n", metavar="N", help="How many examples to select.",
        rich_help_panel=SELECTION)] = None,
    format: under(SELECTION, SelectFormat) = None, output: under(SELECTION, SelectOutput) = None,
    cost: Cost = None, budget_cost: BudgetCost = None,
    per_class: PerClass = None, exclude: Exclude = None, diverse: Diverse = None,
    diverse_mode: DiverseMode = None, diverse_candidates: DiverseCandidates = None,
    diverse_clusters: DiverseClusters = None, embeddings_file: ReadEmbeddings = None,
    sampling: Sampling = None, sampling_beta: SamplingBeta = None, typical: Typical = False,
    dedup: Dedup = None, dedup_threshold: DedupThreshold = None,
    seed: under(SELECTION, Seed) = None, null: under(SELECTION, Null) = False,
    config: under(SELECTION, Config) = None,
    class_names: under(LABELING, ClassNames) = None, image_root: ImageRoot = None,
    from_name: FromName = None, to_name: ToName = None,
    labelstudio_config: LabelStudioConfig = None, pairwise: Pairwise = False,
    contact_sheet: ContactSheet = None,
    image_dir: ImageDir = None,
    quiet: Quiet = False, verbose: Verbose = False, log_format: LogFormat = None,
    progress_every: ProgressEvery = None,
    pool: Annotated[Optional[str], typer.Option(
        metavar="POOL", help="Score this pool first instead of reading SCORES (same forms as "
        "'score POOL').", rich_help_panel=SCORING_FIRST)] = None,
    model: scoring(Model) = None, arch: scoring(Arch) = None,
    arch_kwargs: scoring(ArchKwargs) = None, ema: scoring(Ema) = False,
    trust_checkpoint: scoring(Trust) = False, trust_remote_code: scoring(TrustRemoteCode) = False,
    task: scoring(Task) = None, strategy: scoring(Strategy) = None, target: scoring(Target) = None,
    top_classes: scoring(TopClasses) = None, egl_samples: scoring(EglSamples) = None,
    aggregate: scoring(Aggregate) = None, box_threshold: scoring(BoxThreshold) = None,
    temperature: scoring(Temperature) = None, max_new_tokens: scoring(MaxNewTokens) = None,
    layers: scoring(Layers) = None, labels_from_folders: scoring(LabelsFromFolders) = False,
    text_column: scoring(TextColumnOpt) = None, image_column: scoring(ImageColumn) = None,
    id_column: scoring(IdColumn) = None, label_column: scoring(LabelColumn) = None,
    split: scoring(Split) = None, max_length: scoring(MaxLength) = None,
    fps: scoring(Fps) = None, every: scoring(Every) = None,
    text_width: scoring(TextWidth) = None, resize: scoring(Resize) = None,
    center_crop: scoring(CenterCrop) = None, grayscale: scoring(Grayscale) = None,
    normalize: scoring(Normalize) = None, batch_size: scoring(BatchSize) = None,
    device: scoring(Device) = None, workers: scoring(Workers) = None,
    precision: scoring(Precision) = None, decode: scoring(Decode) = None,
    method: scoring(Method) = None, compile: scoring(Compile) = False,
):
    """Write the BUDGET best examples of a ranked table: the batch to label.

    Reads SCORES, or stdin when something is piped in. With --pool or --model, or when nothing
    is piped in (a terminal, or an empty stdin such as </dev/null under cron), it scores the
    config's pool first, in one process. The batch goes to --output, else to stdout, best score
    first; its rank column is each example's place in the whole table.
    """
    flags = dict(locals())
    settings = shared.settings_from(flags.pop("config"), flags)
    r = shared.reporter(settings)
    if settings.budget is None and settings.budget_cost is None:
        raise AlcliError("no budget given; pass -n/--budget N (or set budget: in the config)")
    if settings.budget_cost is not None and not settings.cost:
        raise AlcliError(f"{flag('budget_cost')} {settings.budget_cost:g} needs --cost, the "
                         f"column or measure each row's cost is read from")
    source = scores or settings.scores
    if scores and pool:
        raise AlcliError(f"give a table to select from (SCORES {scores}) or a pool to score first "
                         f"(--pool {pool}), not both")
    # a pipeline never changes its input: a table comes from SCORES or stdin, and only a person
    # at a terminal (no table anywhere) gets the config's pool scored instead, told so
    from_terminal = source is None and not (pool or model) and sys.stdin.isatty()
    score_first = source is None and bool(pool or model or from_terminal)
    if source is None and not score_first and shared.stdin_is_empty():
        raise AlcliError("nothing on stdin, so no table to select from (did the command before "
                         "the pipe fail?); pipe a table in, name one (alcli select SCORES -n N), "
                         "or score first with --pool POOL")
    if from_terminal and settings.pool is None:
        raise AlcliError("no table to select from: name one (alcli select SCORES -n N), pipe one "
                         "in, or score first with --pool POOL")
    if from_terminal:
        r.warn(f"no table given: scoring the pool {shared.shown_list(settings.pool)} of "
               f"{settings.config_file or 'the settings'} first")
    # --task also names what a table's rows predict, for the Label Studio pre-labels
    unused = [key for key in SCORING_FLAGS if flags.get(key) not in (None, False)
              and not (key == "task" and (settings.format in ("labelstudio", "coco", "yolo")
                                          or settings.labelstudio_config))]
    if not score_first and unused:
        more = f" (and {len(unused) - 1} more scoring options)" if len(unused) > 1 else ""
        r.warn(f"{flag(unused[0])}{more} has no effect: the scores are read from "
               f"{source if source not in (None, '-') else 'stdin'}; pass --pool POOL to score first")
    with r.progress() if score_first else shared.no_progress() as (on_start, on_batch):
        api = shared.api()
        picked = api.run_select(settings, scores=None if score_first else (source or "-"),
                                on_start=on_start, on_batch=on_batch)
    api.write_batch(picked.rows, settings.output or "-", settings, picked.meta,
                    texts=picked.texts, class_names=picked.class_names, task=picked.task)
    if settings.budget is not None and len(picked.rows) < settings.budget:
        r.warn(f"the budget is {settings.budget} but only {picked.available} rows are left to "
               f"choose from; selected them all")
    for note in picked.notes:
        r.warn(note)
    if settings.output not in (None, "-"):
        r.info(f"wrote {len(picked.rows)} rows to {settings.output}")
    if settings.cost:
        r.info(f"the batch costs {sum(row['cost'] for row in picked.rows):g} ({settings.cost})"
               + (f" of --budget-cost {settings.budget_cost:g}" if settings.budget_cost else ""))
    if settings.contact_sheet:
        what = "texts" if picked.texts is not None else "images"
        r.info(f"wrote a contact sheet of {len(picked.rows)} {what} to {settings.contact_sheet}")
    if settings.labelstudio_config:
        r.info(f"wrote the Label Studio labeling config to {settings.labelstudio_config}")


# `select` options that only matter when it scores the pool itself
SCORING_FLAGS = ("arch", "arch_kwargs", "trust_checkpoint", "trust_remote_code", "ema",
                 "text_column", "image_column", "id_column", "label_column", "split", "fps", "every",
                 "max_length", "text_width", "labels_from_folders", "strategy", "target", "task",
                 "egl_samples", "aggregate", "temperature", "max_new_tokens", "box_threshold", "top_classes", "layers", "method",
                 "compile", "precision", "decode", "batch_size", "device", "workers", "resize",
                 "center_crop", "grayscale", "normalize")
