"""The `alcli` command line. Each command parses, calls alcli.api, and prints; no logic here.

Data goes to stdout, everything for people to stderr. Bad input exits 1 with one sentence.
"""
from __future__ import annotations

import contextlib
import sys
from typing import Annotated, List, Optional

import typer
from rich.console import Console
from rich.progress import (BarColumn, MofNCompleteColumn, Progress, ProgressColumn, TextColumn,
                           TimeElapsedColumn, TimeRemainingColumn)
from rich.table import Table
from rich.text import Text

from .errors import AlcliError
from .files.config import DEFAULT_CONFIG, Settings, load_settings
from .files.table import columns_of, format_value

app = typer.Typer(
    name="alcli", add_completion=False, pretty_exceptions_enable=False,
    rich_markup_mode="rich",
    help="Rank an unlabeled pool for labeling by how much each example would move your model.",
)

# --- options shared by the commands (every one also has a config key: its name with _ for -) ---
Config = Annotated[Optional[str], typer.Option(
    "--config", "-c", help="YAML config file; flags override it. Without --config and --model, "
                           "./configs/default.yaml is used when present (the demo).")]
Model = Annotated[Optional[str], typer.Option(
    "--model", "-m", help="Checkpoint: a state_dict (needs --arch), a Lightning/DDP-style dict, "
                          "a TorchScript archive, or a pickled model (see --trust-checkpoint).")]
Arch = Annotated[Optional[str], typer.Option(
    help="torchvision:NAME or package.module:callable; constructor arguments from the config "
         "key arch_kwargs.")]
Trust = Annotated[bool, typer.Option(
    "--trust-checkpoint", help="Allow a pickled model (unpickling runs code from the file).")]
LabelsFromFolders = Annotated[bool, typer.Option(
    "--labels-from-folders", help="Class subfolders of an image folder are the labels (sorted, "
                                  "like torchvision's ImageFolder).")]
Strategy = Annotated[Optional[str], typer.Option(
    "--strategy", "-s", help="egl (default), gradnorm, loss, entropy, margin, least-confidence, random.")]
TopClasses = Annotated[Optional[int], typer.Option(
    help="egl: sum over the K most probable classes; 0 = all classes, exact \\[default: 10].")]
Precision = Annotated[Optional[str], typer.Option(
    help="fp32, bf16 or fp16: the model's forward under autocast; norms add up in float32 or better \\[default: fp32].")]
Layers = Annotated[Optional[List[str]], typer.Option(
    help="Restrict gradient strategies to these modules (repeatable; e.g. fc, 'layer4.*').")]
Method = Annotated[Optional[str], typer.Option(
    help="Engine method: auto (default), ghost, replicate, vmap, loop.")]
BatchSize = Annotated[Optional[int], typer.Option("--batch-size", "-b", help="Examples per batch \\[default: 64].")]
Device = Annotated[Optional[str], typer.Option(help="auto (prefers CUDA), cpu, cuda, cuda:N, mps.")]
Workers = Annotated[Optional[int], typer.Option("--workers", "-j", help="Data-loading worker processes \\[default: 0 on the CPU, "
                                            "the CPU count (at most 8) on CUDA].")]
Seed = Annotated[Optional[int], typer.Option(
    help="Seed for the random strategy and for select --diverse \\[default: 0].")]
Output = Annotated[Optional[str], typer.Option(
    "--output", "-o", help="Output file, or - for stdout.")]
Format = Annotated[Optional[str], typer.Option(
    "--format", "-f", help="csv (default), jsonl, paths (one file per line), ids (one id per "
                           "line); select also "
                           "labelstudio (Label Studio tasks JSON).")]
Quiet = Annotated[bool, typer.Option("--quiet", "-q", help="No summary on stderr.")]
# selection (select only, except --embeddings which score writes and select reads)
WriteEmbeddings = Annotated[bool, typer.Option(
    "--embeddings", help="Also write each example's BADGE embedding (last-layer gradient, "
                         "factored) beside the table, as OUTPUT.emb.npz, for select --diverse.")]
ReadEmbeddings = Annotated[Optional[str], typer.Option(
    "--embeddings", metavar="FILE", help="Embeddings for --diverse \\[default: SCORES.emb.npz].")]
Diverse = Annotated[bool, typer.Option(
    "--diverse", help="BADGE: k-means++ on gradient embeddings among the best scores, so the batch "
                      "holds no near-duplicates (needs `score --embeddings`, or --pool).")]
DiverseCandidates = Annotated[Optional[str], typer.Option(
    "--diverse-candidates", metavar="M", help="--diverse picks among the M best-scoring examples "
                                              "(per class with --per-class), or 'all' for classic "
                                              "BADGE \\[default: 10 x budget].")]
PerClass = Annotated[Optional[str], typer.Option(
    "--per-class", metavar="proportional|equal", help="Spread the budget over predicted classes, in "
                                                      "proportion to their counts or equally.")]
Exclude = Annotated[Optional[List[str]], typer.Option(
    "--exclude", metavar="FILE", help="Never select the ids in FILE (.csv id column, .jsonl/"
                                            ".json ids, else one per line; repeatable).")]
ImageRoot = Annotated[Optional[str], typer.Option(
    "--image-root", metavar="URL", help="-f labelstudio: prefix ids with this URL or path in "
                                        "data.image.")]
ImageDir = Annotated[Optional[str], typer.Option(
    "--image-dir", metavar="DIR", help="--contact-sheet: the folder the image ids are relative to "
                                       "\\[default: the config's pool].")]
ContactSheet = Annotated[Optional[str], typer.Option(
    "--contact-sheet", metavar="PNG", help="Also draw the selected images in one PNG grid with "
                                           "rank, id and score under each.")]

# long runs (score only)
CheckpointEvery = Annotated[Optional[int], typer.Option(
    "--checkpoint-every", metavar="N", help="Save finished rows to OUTPUT.partial at least every N "
                                            "examples (and on Ctrl-C/SIGTERM) \\[default: 2048].")]
Resume = Annotated[bool, typer.Option(
    "--resume", help="Continue the unfinished run whose rows are in OUTPUT.partial (same settings).")]
Strict = Annotated[bool, typer.Option(
    "--strict", help="Stop at the first unreadable example instead of skipping it (skipped ones "
                     "are listed in OUTPUT.errors.csv).")]
Shard = Annotated[Optional[str], typer.Option(
    "--shard", metavar="K/N", help="Score shard K of N (K = 0..N-1; chosen by a hash of the id); "
                                   "combine the parts with `alcli merge`.")]

SCORE_EPILOG = """[bold]Examples[/bold]

  [dim]# the shipped demo (configs/default.yaml):[/dim]

  alcli score

  [dim]# images, a torchvision model's weights, transforms in cfg.yaml:[/dim]

  alcli score imgs/ -m ckpt.pt --arch torchvision:resnet18 -c cfg.yaml -o s.csv

  [dim]# a pipeline: paths in, the 100 ids to label out:[/dim]

  ls imgs/*.png | alcli score - -c cfg.yaml | alcli select -n 100 -f paths

  [dim]# a long run: killed or stopped, continue where it was:[/dim]

  alcli score imgs/ -c cfg.yaml -o s.csv --resume

  [dim]# 4 array jobs, then one table; or all GPUs of a node with torchrun:[/dim]

  alcli score imgs/ -c cfg.yaml --shard 2/4 -o part2.csv

  alcli merge part0.csv part1.csv part2.csv part3.csv -o s.csv

  torchrun --nproc-per-node 8 -m alcli score imgs/ -c cfg.yaml -o s.csv
"""

MERGE_EPILOG = """[bold]Examples[/bold]

  alcli merge part0.csv part1.csv part2.csv -o scores.csv

  alcli merge parts/part*.csv | alcli select -n 100 -f paths
"""

SELECT_EPILOG = """[bold]Examples[/bold]

  alcli score data/demo/pool | alcli select -n 10 --format paths

  alcli select scores.csv -n 100 -o batch.csv

  alcli select -n 20 --pool data/demo/pool -m data/demo/model.pt \\
      --arch alcli.demo:DigitsCNN -c configs/default.yaml

  [dim]# diverse (BADGE), balanced over predicted classes, minus what is labeled, as a picture:[/dim]

  alcli score --embeddings -o scores.csv

  alcli select scores.csv -n 40 --diverse --per-class equal --exclude labeled.csv \\
      --contact-sheet batch.png -f labelstudio --image-root https://data.example.com/pool -o tasks.json
"""

INSPECT_EPILOG = """[bold]Examples[/bold]

  alcli inspect                          [dim]# the demo model[/dim]

  alcli inspect -m ckpt.pt --arch torchvision:resnet18 --layers 'layer4.*' --pool imgs/
"""


def _fail(message: str) -> typer.Exit:
    sys.stderr.write(f"alcli: error: {message}\n")
    return typer.Exit(1)


def _settings(config: str | None, flags: dict) -> Settings:
    """Defaults < config (./configs/default.yaml when no --config and no --model) < flags."""
    given = {k: (None if v is False or v == [] else v) for k, v in flags.items()}
    if config is None and given.get("model") is None and DEFAULT_CONFIG.is_file():
        config = str(DEFAULT_CONFIG)
    return load_settings(config, given)


def _stderr_console():
    return Console(stderr=True, highlight=False, soft_wrap=True)


@contextlib.contextmanager
def _progress(enabled: bool):
    """(on_start, on_batch) callbacks driving a rich progress bar on stderr, or (None, None)."""
    if not enabled:
        yield None, None
        return
    class Speed(ProgressColumn):
        def render(self, task):
            return Text(f"{task.speed:,.0f} ex/s" if task.speed else "")

    with Progress(TextColumn("scoring"), BarColumn(), MofNCompleteColumn(), Speed(),
                  TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn(),
                  console=_stderr_console(), transient=True) as bar:
        task = bar.add_task("scoring", total=None)
        yield (lambda n: bar.update(task, total=n)), (lambda k: bar.advance(task, k))


def _summary(top: list[dict], s, examples: str | None = None) -> None:
    """A short table on stderr: count, time, speed, device, method, and the top 5 rows."""
    console = _stderr_console()
    method = f"{s.method} ({_reason(s.method, s.method_reason)})" if s.method else "no gradients needed"
    facts = Table.grid(padding=(0, 2))
    for key, value in (("examples", examples or f"{s.count}"), ("time", f"{s.seconds:.2f} s"),
                       ("speed", f"{s.per_second:,.1f} examples/s"), ("device", s.device),
                       ("strategy", s.strategy), ("method", method)):
        facts.add_row(key, value)
    console.print(facts)
    columns = [c for c in columns_of(top[:5]) if c in ("rank", "id", "score", "pred",
                                                       "confidence", "label")]
    table = Table(title="top 5", title_justify="left")
    for c in columns:
        table.add_column(c, overflow="fold")
    for row in top[:5]:
        table.add_row(*[_short(format_value(row.get(c))) for c in columns])
    console.print(table)
    for note in s.notes:
        console.print(f"note: {note}", markup=False)


def _reason(method: str, reason: str | None) -> str:
    reason = reason or ""
    return reason[len(method) + 2:] if reason.startswith(f"{method}: ") else reason


def _short(text: str) -> str:
    try:
        return f"{float(text):.4g}" if "." in text or "e" in text else text
    except ValueError:
        return text


def _say(message: str) -> None:
    sys.stderr.write(f"alcli: {message}\n")
    sys.stderr.flush()


def _warn(skipped: int, nans: int, errors_file: str | None, errors=()) -> None:
    """Warnings that a long run must not hide (printed with --quiet too)."""
    if skipped:
        where = (f"they are listed in {errors_file}" if errors_file else
                 "; ".join(f"{id_}: {message}" for id_, message in list(errors)[:3])
                 + (" ..." if skipped > 3 else ""))
        _say(f"warning: skipped {skipped} unreadable example{'s' if skipped > 1 else ''} "
             f"({where})")
    if nans:
        _say(f"warning: {nans} example{'s have' if nans > 1 else ' has'} a NaN score (a "
             f"non-finite loss or gradient norm), ranked last")


def _api():
    """alcli.api, imported when a command runs: it imports torch (about 2 s), which --help and
    usage errors need not wait for."""
    from . import api
    return api


@app.command(epilog=SCORE_EPILOG)
def score(
    pool: Annotated[Optional[str], typer.Argument(
        help="Image folder, .csv/.jsonl manifest (path, id, label), .pt/.npy/.npz tensors, "
             "or - for image paths on stdin.", show_default=False, metavar="POOL")] = None,
    config: Config = None, model: Model = None, arch: Arch = None, trust_checkpoint: Trust = False,
    labels_from_folders: LabelsFromFolders = False, strategy: Strategy = None,
    top_classes: TopClasses = None, layers: Layers = None, method: Method = None,
    precision: Precision = None, batch_size: BatchSize = None, device: Device = None, workers: Workers = None,
    seed: Seed = None, output: Output = None, format: Format = None, quiet: Quiet = False,
    embeddings: WriteEmbeddings = False, checkpoint_every: CheckpointEvery = None,
    resume: Resume = False, strict: Strict = False, shard: Shard = None,
):
    """Score every example of POOL and write the ranked table (rank,id,score,pred,confidence,...).

    The table goes to --output, or to stdout when that is not a terminal (else to scores.csv).
    Finished rows are kept in OUTPUT.partial until the table is written (see --resume);
    unreadable examples are skipped and listed in OUTPUT.errors.csv; OUTPUT.meta.json describes
    the table. Under torchrun each process scores its shard and rank 0 writes the one table.
    """
    flags = dict(locals())
    rank0 = True
    try:
        api = _api()
        rank0 = api.is_rank0()
        settings = _settings(flags.pop("config"), flags)
        dest = settings.output or ("scores.csv" if sys.stdout.isatty() else "-")
        with _progress(sys.stderr.isatty() and not settings.quiet and rank0) as (on_start, on_batch):
            result, emb_file = api.score_to_table(settings, dest, on_start=on_start,
                                                  on_batch=on_batch, say=_say if rank0 else None)
        if result is None:  # a torchrun rank other than 0: rank 0 wrote the table
            return
    except AlcliError as err:
        if not rank0:
            raise typer.Exit(1) from None
        raise _fail(str(err)) from None
    except KeyboardInterrupt as err:  # SIGINT/SIGTERM: the finished rows are saved
        code = getattr(err, "exit_code", 130)
        if rank0 and str(err):
            _say(str(err))
        raise typer.Exit(code) from None
    done = result.finished
    errors_file = next((f for f in result.files if f.endswith(".errors.csv")), None)
    _warn(len(done.errors), done.nans, errors_file, done.errors)
    if not settings.quiet:
        examples = f"{done.count}" + (f" ({result.resumed} from the partial file)"
                                      if result.resumed else "")
        _summary(done.top, result.stats, examples=examples)
        if dest != "-":
            _stderr_console().print(f"wrote {done.count} rows to {dest}", markup=False)
        if emb_file:
            _stderr_console().print(f"wrote their embeddings to {emb_file}", markup=False)


@app.command(epilog=MERGE_EPILOG)
def merge(
    parts: Annotated[List[str], typer.Argument(
        help="Shard tables written by `alcli score --shard K/N -o PART` (each with its "
             "PART.meta.json beside it).", show_default=False, metavar="PARTS...")],
    output: Output = None, format: Format = None, quiet: Quiet = False,
):
    """Combine the shard tables of one pool into its ranked table, as one process would have
    written it. Refuses parts that overlap, miss a shard, or were scored differently.

    The table goes to --output, or to stdout when that is not a terminal (else to scores.csv).
    """
    try:
        api = _api()
        fmt = format or "csv"
        if fmt not in ("csv", "jsonl", "paths", "ids"):
            raise _fail(f"--format {fmt}: merge writes csv, jsonl, paths or ids")
        dest = output or ("scores.csv" if sys.stdout.isatty() else "-")
        result = api.merge(parts, dest, fmt)
    except AlcliError as err:
        raise _fail(str(err)) from None
    errors_file = next((f for f in result.files if f.endswith(".errors.csv")), None)
    _warn(len(result.finished.errors), result.finished.nans, errors_file, result.finished.errors)
    if not quiet and dest != "-":
        _stderr_console().print(f"wrote {result.finished.count} rows from {result.parts} parts "
                                f"to {dest}", markup=False)


@app.command(epilog=SELECT_EPILOG)
def select(
    scores: Annotated[Optional[str], typer.Argument(
        help="Ranked table (CSV or JSONL) from `alcli score`, or - for stdin (the default when "
             "piped).", show_default=False, metavar="SCORES")] = None,
    budget: Annotated[Optional[int], typer.Option("--budget", "-n", help="How many examples to select.")] = None,
    pool: Annotated[Optional[str], typer.Option(
        help="Score this pool first instead of reading SCORES (same forms as `score POOL`).")] = None,
    config: Config = None, model: Model = None, arch: Arch = None, trust_checkpoint: Trust = False,
    labels_from_folders: LabelsFromFolders = False, strategy: Strategy = None,
    top_classes: TopClasses = None, layers: Layers = None, method: Method = None,
    precision: Precision = None, batch_size: BatchSize = None, device: Device = None, workers: Workers = None,
    seed: Seed = None, output: Output = None, format: Format = None, quiet: Quiet = False,
    diverse: Diverse = False, diverse_candidates: DiverseCandidates = None,
    embeddings_file: ReadEmbeddings = None, per_class: PerClass = None, exclude: Exclude = None,
    image_root: ImageRoot = None, contact_sheet: ContactSheet = None, image_dir: ImageDir = None,
):
    """Write the BUDGET best examples of a ranked table: the batch to label.

    Reads SCORES, or stdin when piped; with --pool/--model (or nothing piped in) it scores the
    config's pool first, in one process. The batch goes to --output, else to stdout, best score
    first; its rank column is each example's place in the whole table.
    """
    flags = dict(locals())
    config_path = flags.pop("config")
    try:
        settings = _settings(config_path, flags)
        if settings.budget is None:
            raise _fail("no budget given; pass -n/--budget N (or set budget: in the config)")
        api = _api()
        source = scores or settings.scores
        score_first = source is None and (pool or model or sys.stdin.isatty())
        with _progress(bool(score_first) and sys.stderr.isatty() and not settings.quiet) as bar:
            picked = api.run_select(settings, scores=None if score_first else (source or "-"),
                                    on_start=bar[0], on_batch=bar[1])
        api.write_batch(picked.rows, settings.output or "-", settings, picked.meta)
    except AlcliError as err:
        raise _fail(str(err)) from None
    if settings.quiet:
        return
    console = _stderr_console()
    if len(picked.rows) < settings.budget:
        console.print(f"warning: the budget is {settings.budget} but only {picked.available} rows "
                      f"are left to choose from; selected them all", markup=False)
    for note in picked.notes:
        console.print(f"warning: {note}", markup=False)
    if settings.contact_sheet:
        console.print(f"wrote a contact sheet of {len(picked.rows)} images to "
                      f"{settings.contact_sheet}", markup=False)


@app.command(epilog=INSPECT_EPILOG)
def inspect(
    config: Config = None, model: Model = None, arch: Arch = None, trust_checkpoint: Trust = False,
    pool: Annotated[Optional[str], typer.Option(
        help="A pool to try the engine on, to see which method auto picks.")] = None,
    labels_from_folders: LabelsFromFolders = False, layers: Layers = None, method: Method = None,
):
    """Show the model's modules, parameter counts, which gradient rule serves each selected
    module, and which engine method auto will use."""
    flags = dict(locals())
    try:
        settings = _settings(flags.pop("config"), flags)
        info = _api().inspect_model(settings)
    except AlcliError as err:
        raise _fail(str(err)) from None
    table = Table(title=f"{info.model}: {info.total_params:,} parameters, "
                        f"{info.selected_params:,} selected", title_justify="left")
    for c in ("module", "type", "params", "selected", "rule"):
        table.add_column(c, justify="right" if c == "params" else "left")
    for m in info.modules:
        table.add_row(m.name, m.kind, f"{m.params:,}", "yes" if m.selected else "no",
                      m.rule if m.selected else "")
    console = Console(highlight=False, soft_wrap=True)
    console.print(table)
    console.print(f"input channels: {info.channels if info.channels else 'unknown (no convolution)'}",
                  markup=False)
    reason = _reason(info.method, info.reason)
    console.print(f"method: {info.method}" + (f" ({reason})" if reason else ""), markup=False)


def main() -> None:
    app(prog_name="alcli")


if __name__ == "__main__":
    main()
