"""`alcli score`: rank every example of a pool by how much it would move the model."""
from __future__ import annotations

import sys
from typing import Annotated, List, Optional

import typer

from ..errors import AlcliError
from . import shared
from .options import (
    Aggregate, Arch, ArchKwargs, BatchSize, BoxThreshold, MaxNewTokens, Temperature, CenterCrop, CheckpointEvery, ClassNames,
    Compile, Config, Decode, Device, EglSamples, Ema, Grayscale, IdColumn, ImageColumn,
    LabelColumn, LabelsFromFolders, Layers, LogFormat, MaxLength, Method, Model, Normalize, Null,
    Output, Precision, ProgressEvery, Quiet, Resize, Restart, Resume, ScoreExclude, Seed, Shard,
    Every, Fps, Split, Strategy, Strict, Target, TableFormat, Task, TextColumnOpt, TextWidth,
    TopClasses, Trust,
    TrustRemoteCode, Verbose, Workers, WriteEmbeddings)

# Examples: one command per line, each under 78 columns, so that no terminal wraps them; \b keeps
# click from re-flowing a block.
EPILOG = """Examples:

\b
alcli score                      # the demo (configs/default.yaml)
alcli score imgs/ -m w.pt --arch torchvision:resnet18 -c cfg.yaml -o s.csv
alcli score a.png b.png c.png -c cfg.yaml
find imgs -name '*.png' -print0 | alcli score - -0 -c cfg.yaml
alcli score imgs/ -c cfg.yaml -o s.csv --resume   # after Ctrl-C, a crash
alcli score imgs/ -c cfg.yaml --shard 2/4 -o part2.csv
alcli score imgs/ -c cfg.yaml -o s.csv 2>log --progress-every 60
torchrun --nproc-per-node 8 -m alcli score imgs/ -c cfg.yaml -o s.csv
"""


def score(
    pool: Annotated[Optional[List[str]], typer.Argument(
        help="An image folder, image files, a .csv/.jsonl manifest (path, id, label), text (.txt, "
             "or .csv/.jsonl with a text column), a .pt/.npy/.npz tensor file, a video "
             "(.mp4/.mkv/.webm) or a folder of them, or - for image paths on stdin. [default: the "
             "config's pool]", show_default=False,
        metavar="POOL")] = None,
    # the signature's order is --help's: Input, Model, Scoring, Image transforms, Output, ...
    config: Config = None, labels_from_folders: LabelsFromFolders = False,
    class_names: ClassNames = None, exclude: ScoreExclude = None, null: Null = False,
    text_column: TextColumnOpt = None, image_column: ImageColumn = None,
    id_column: IdColumn = None, label_column: LabelColumn = None, split: Split = None,
    fps: Fps = None, every: Every = None,
    max_length: MaxLength = None,
    model: Model = None, arch: Arch = None, arch_kwargs: ArchKwargs = None, ema: Ema = False,
    trust_checkpoint: Trust = False, trust_remote_code: TrustRemoteCode = False,
    task: Task = None,
    strategy: Strategy = None, target: Target = None, top_classes: TopClasses = None, egl_samples: EglSamples = None,
    aggregate: Aggregate = None, box_threshold: BoxThreshold = None, temperature: Temperature = None,
    max_new_tokens: MaxNewTokens = None, layers: Layers = None,
    seed: Seed = None,
    resize: Resize = None, center_crop: CenterCrop = None, grayscale: Grayscale = None,
    normalize: Normalize = None,
    output: Output = None, format: TableFormat = None, embeddings: WriteEmbeddings = None,
    text_width: TextWidth = None,
    batch_size: BatchSize = None, device: Device = None, workers: Workers = None,
    precision: Precision = None, decode: Decode = None, method: Method = None,
    compile: Compile = False,
    checkpoint_every: CheckpointEvery = None, resume: Resume = False, restart: Restart = False,
    strict: Strict = False, shard: Shard = None,
    quiet: Quiet = False, verbose: Verbose = False, log_format: LogFormat = None,
    progress_every: ProgressEvery = None,
):
    """Score every example of POOL and write the ranked table (rank, id, score, pred,
    confidence, ...).

    The table goes to --output, or to stdout when that is not a terminal (else to scores.csv).
    Finished rows are kept in OUTPUT.partial until the table is written (see --resume);
    unreadable examples are skipped and listed in OUTPUT.errors.csv; OUTPUT.meta.json describes
    the table. Under torchrun each process scores its shard and rank 0 writes the one table.
    """
    flags = dict(locals())
    files = flags.pop("pool") or []
    flags["pool"] = files[0] if len(files) == 1 else (files or None)
    settings = shared.settings_from(flags.pop("config"), flags)
    rank0 = shared.rank0()
    r = shared.reporter(settings, enabled=rank0)
    dest = settings.output or ("scores.csv" if sys.stdout.isatty() else "-")
    try:
        with r.progress() as (on_start, on_batch):
            result, emb_file = shared.api().score_to_table(settings, dest, on_start=on_start,
                                                           on_batch=on_batch, say=r.say)
    except AlcliError:
        if not rank0:
            raise typer.Exit(1) from None
        raise
    if result is None:  # a torchrun rank other than 0: rank 0 wrote the table
        return
    done = result.finished
    errors_file = next((f for f in result.files if f.endswith(".errors.csv")), None)
    for note in result.warnings:
        r.warn(note)
    shared.warn_skipped(r, len(done.errors), done.nans, errors_file, done.errors)
    s = result.stats
    r.summary({"examples": done.count, "resumed": result.resumed, "excluded": result.excluded,
               "seconds": s.seconds,
               "per_second": s.per_second, "device": s.device, "strategy": s.strategy,
               "method": s.method, "method_reason": s.method_reason, "skipped": len(done.errors),
               "nan_scores": done.nans, "output": dest, "embeddings_file": emb_file},
              done.top, s.notes)
    if dest != "-":
        left_out = f" ({result.excluded} examples left out by --exclude)" if result.excluded else ""
        r.info(f"wrote {done.count} rows to {dest}{left_out}")
    if emb_file:
        r.info(f"wrote their embeddings to {emb_file}")
