"""`alcli review`: rank a labeled pool's labels by how likely each is wrong, and flag the likely errors."""
from __future__ import annotations

import sys
from typing import Annotated, List, Optional

import typer

from ..errors import ConfigError
from . import shared
from .options import (
    OUTPUT, STRATEGY, Arch, ArchKwargs, BatchSize, CenterCrop, ClassNames, Compile, Config, Decode,
    Device, Ema, Grayscale, IdColumn, ImageColumn, LabelColumn, LabelsFromFolders, Layers, LogFormat,
    MaxLength, Method, Model, Normalize, Output, Precision, ProgressEvery, Quiet, Resize, Seed,
    Split, Task, TextColumnOpt, TextWidth, Trust, TrustRemoteCode, Verbose, Workers)

RANKINGS = ("self-confidence", "margin", "loss", "gradnorm")  # alcli.review.RANKINGS (torch-free here)

EPILOG = """Examples:

\b
alcli review labels.csv -m w.pt --arch torchvision:resnet18 -o review.csv
alcli review imgs/ --labels-from-folders -c cfg.yaml -o review.csv
alcli review imgs/ --labels-from-folders -c cfg.yaml --rank gradnorm -o r.csv
alcli select review.csv -n 50 -f labelstudio -o to_verify.json
"""


def review(
    pool: Annotated[Optional[List[str]], typer.Argument(
        help="A labeled pool: a .csv/.jsonl manifest with a label column (pull's labels.csv), "
             "class folders (--labels-from-folders), a Parquet table with a label column, a "
             "tensor file with labels. [default: the config's pool]", show_default=False,
        metavar="POOL")] = None,
    config: Config = None, labels_from_folders: LabelsFromFolders = False,
    class_names: ClassNames = None, text_column: TextColumnOpt = None,
    image_column: ImageColumn = None, id_column: IdColumn = None, label_column: LabelColumn = None,
    split: Split = None, max_length: MaxLength = None,
    model: Model = None, arch: Arch = None, arch_kwargs: ArchKwargs = None, ema: Ema = False,
    trust_checkpoint: Trust = False, trust_remote_code: TrustRemoteCode = False, task: Task = None,
    rank: Annotated[Optional[str], typer.Option(
        "--rank", metavar="NAME", help="What orders the table, most likely wrong first: "
        "self-confidence (p of the given label), margin (cleanlab's normalized margin), loss or "
        "gradnorm (at the given label). [default: self-confidence]", rich_help_panel=STRATEGY)] = None,
    layers: Layers = None, seed: Seed = None,
    resize: Resize = None, center_crop: CenterCrop = None, grayscale: Grayscale = None,
    normalize: Normalize = None,
    output: Output = None,
    format: Annotated[Optional[str], typer.Option(
        "--format", "-f", metavar="FORMAT", help="csv (the default) or jsonl.",
        rich_help_panel=OUTPUT)] = None,
    text_width: TextWidth = None,
    batch_size: BatchSize = None, device: Device = None, workers: Workers = None,
    precision: Precision = None, decode: Decode = None, method: Method = None,
    compile: Compile = False,
    quiet: Quiet = False, verbose: Verbose = False, log_format: LogFormat = None,
    progress_every: ProgressEvery = None,
):
    """Rank the labels of a labeled POOL most likely wrong first, with a model not trained on
    them, and flag the likely errors (confident learning's per-class thresholds).

    Each row: rank, id, score, flagged, label (as given), pred (the model's suggestion),
    confidence (its probability), self_confidence, margin, loss and gradnorm (at the given
    label). The table goes to --output, or to stdout when that is not a terminal (else
    review.csv), with OUTPUT.meta.json; `alcli select OUTPUT -f labelstudio` makes review tasks
    (the given label as the annotation to verify, the suggestion as the prediction).
    """
    flags = dict(locals())
    ranking = flags.pop("rank") or RANKINGS[0]
    if ranking not in RANKINGS:
        raise ConfigError(f"--rank {ranking} is not one of {', '.join(RANKINGS)}")
    if flags["format"] not in (None, "csv", "jsonl"):
        raise ConfigError(f"--format {flags['format']}: review writes csv or jsonl")
    files = flags.pop("pool") or []
    flags["pool"] = files[0] if len(files) == 1 else (files or None)
    settings = shared.settings_from(flags.pop("config"), flags)
    r = shared.reporter(settings)
    dest = settings.output or ("review.csv" if sys.stdout.isatty() else "-")
    with r.progress() as (on_start, on_batch):
        reviewed, run = shared.api().review_to_table(settings, dest, ranking, on_start=on_start,
                                                     on_batch=on_batch)
    if reviewed.unlabeled:
        r.warn(f"left out {reviewed.unlabeled} example{'s' if reviewed.unlabeled > 1 else ''} "
               f"without a label")
    s = run.stats
    r.summary({"examples": len(reviewed.rows), "flagged": reviewed.flagged, "ranking": ranking,
               "unlabeled": reviewed.unlabeled, "seconds": s.seconds, "per_second": s.per_second,
               "device": s.device,
               "method": s.method, "output": dest}, reviewed.rows[:5], s.notes)
    if dest != "-":
        r.info(f"wrote {len(reviewed.rows)} rows to {dest} ({reviewed.flagged} flagged)")
