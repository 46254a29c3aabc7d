"""The `alcli` command line. Each command parses, calls alcli.api, and prints; no logic here.

Data goes to stdout, everything for people to stderr (alcli.terminal). Conventions: bad input or an
environment fault exits 1 with `alcli: error: <one sentence>`; a usage error exits 2 with one such
line; Ctrl-C 130, SIGTERM 143, a closed stdout (`| head`) 141 without a word.
"""
from __future__ import annotations

import errno
import io
import os
import re
import sys
import warnings
from typing import Annotated, List, Optional

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text
from typer.core import TyperCommand, TyperGroup

from .version import __version__
from .errors import AlcliError
from .files.config import DEFAULT_CONFIG, Settings, flag, load_settings
from .terminal import Reporter, warning_origin

from typer import Abort

try:  # recent Typer carries its own copy of click
    from typer._click.exceptions import ClickException, UsageError
except ImportError:  # pragma: no cover - older Typer on click
    from click.exceptions import ClickException, UsageError


class _ClosedPipe(Exception):
    """stdout's reader went away; carried past Typer, which would turn it into exit 1."""


class _Stopped(Exception):
    """Ctrl-C or SIGTERM, with the message saying where the finished rows are; carried past
    Typer, which would turn any KeyboardInterrupt into a silent exit 130."""

    def __init__(self, message: str, exit_code: int):
        super().__init__(message)
        self.exit_code = exit_code


class _Alcli(TyperGroup):
    """Errors the way ripgrep or jq print them: one `alcli: error: ...` line, no panel, no
    traceback; exit 2 for usage, 1 for bad input or the environment, 141 for a closed pipe."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except OSError as err:
            if err.errno == errno.EPIPE:
                raise _ClosedPipe() from None
            raise
        except KeyboardInterrupt as err:
            raise _Stopped(str(err), getattr(err, "exit_code", 130)) from None

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        try:
            code = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except UsageError as err:
            command = err.ctx.command_path if err.ctx else "alcli"
            message = _one_line(err.format_message()).rstrip(".")
            sys.stderr.write(f"alcli: error: {message[:1].lower()}{message[1:]}; "
                             f"try '{command} --help'\n")
            code = 2
        except ClickException as err:
            sys.stderr.write(f"alcli: error: {_one_line(err.format_message())}\n")
            code = err.exit_code
        except AlcliError as err:
            sys.stderr.write(f"alcli: error: {_printable(str(err))}\n")
            code = 1
        except _Stopped as err:
            if str(err) and _rank0():
                sys.stderr.write(f"alcli: {_printable(str(err))}\n")
            code = err.exit_code
        except (Abort, KeyboardInterrupt):
            code = 130
        except OSError as err:
            sys.stderr.write(f"alcli: error: {_printable(_os_error(err))}\n")
            code = 1
        except _ClosedPipe:  # the reader of stdout went away (`| head`): quiet, like grep and jq
            _silence_stdout()
            code = 141
        sys.exit(code if isinstance(code, int) else 0)


def _one_line(text: str) -> str:
    return _printable(" ".join(text.split()))


MESSAGE_LIMIT = 1000  # characters of one error sentence; user data quoted in it is cut to fit


def _printable(text: str) -> str:
    """One line however the user data quoted in it looks: line breaks, other control characters
    and lone surrogates (undecodable file-name bytes) escaped as in Python literals, and the
    sentence cut at MESSAGE_LIMIT characters."""
    shown = "".join(c if c.isprintable() or c == " " else ascii(c)[1:-1] for c in text)
    return shown if len(shown) <= MESSAGE_LIMIT else shown[:MESSAGE_LIMIT - 3] + "..."


def _os_error(err: OSError) -> str:
    """`cannot write /sys/x.csv.partial: Permission denied`-style, from any OSError."""
    what = err.strerror or type(err).__name__
    name = err.filename if err.filename is not None else None
    if name is None:
        return f"{what.rstrip('.')} (an operating system error)"
    other = f" -> {err.filename2}" if err.filename2 else ""
    return f"{name}{other}: {what}"


def _silence_stdout() -> None:
    """Point stdout at /dev/null so Python's final flush does not complain about the pipe."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError, io.UnsupportedOperation):
        pass


class _Command(TyperCommand):
    """Arguments listed by name only (POOL, PART...), without Typer's `<list[str]>` type tag."""

    def format_help(self, ctx, formatter) -> None:
        super().format_help(ctx, formatter)
        formatter.buffer[:] = [part.replace("\xa0", " ").replace("\u2011", "-")
                               for part in formatter.buffer]

    def collect_usage_pieces(self, ctx) -> list[str]:
        """`PART...` for a required argument, as man pages write it (Typer writes `{PART}...`)."""
        return [p[1:].replace("}", "", 1) if p.startswith("{") else p
                for p in super().collect_usage_pieces(ctx)]

    def format_options(self, ctx, formatter) -> None:
        args, opts = [], []
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx)
            if record is None:
                continue
            name, text = record
            # never wrapped after "[default:" nor inside least-confidence (restored in format_help)
            text = re.sub(r"(?<=\w)-(?=\w)", "\u2011", text.replace("[default: ", "[default:\xa0"))
            if param.param_type_name == "argument":
                args.append((name.split(" <", 1)[0], text))
            else:
                opts.append((name, text))
        for title, rows in (("Arguments", args), ("Options", opts)):
            if rows:
                with formatter.section(title):
                    formatter.write_dl(rows)


app = typer.Typer(
    name="alcli", cls=_Alcli, add_completion=True, pretty_exceptions_enable=False,
    rich_markup_mode=None, no_args_is_help=True,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
    help="Rank an unlabeled pool for labeling by how much each example would move your model.",
)


def _version(value: bool) -> None:
    if value:
        sys.stdout.write(f"alcli {__version__}\n")
        raise typer.Exit(0)


@app.callback()
def _root(version: Annotated[bool, typer.Option(
        "--version", "-V", callback=_version, is_eager=True,
        help="Print the version and exit.")] = False) -> None:
    """Rank an unlabeled pool for labeling by how much each example would move your model.

    Run 'alcli COMMAND -h' for a command's options; 'alcli score' alone scores the shipped demo.
    """


# --- options shared by the commands (every one also has a config key: its name with _ for -) ---
# Help texts end in "[default: X]" where a default is worth saying; metavars name what is expected.
Config = Annotated[Optional[str], typer.Option(
    "--config", "-c", metavar="FILE", help="YAML config file; flags override it; its relative "
    "paths are relative to its folder. Without --config and --model, ./configs/default.yaml is "
    "used when present (the demo).")]
Model = Annotated[Optional[str], typer.Option(
    "--model", "-m", metavar="FILE", help="Checkpoint: a state_dict or .safetensors (needs --arch), "
    "a Lightning/DDP/timm-style dict, a TorchScript archive, a pickled model (see "
    "--trust-checkpoint), or a Hugging Face save_pretrained directory.")]
Arch = Annotated[Optional[str], typer.Option(
    metavar="SPEC", help="torchvision:NAME, timm:NAME or package.module:callable; constructor "
    "arguments from --arch-kwargs.")]
ArchKwargs = Annotated[Optional[str], typer.Option(
    "--arch-kwargs", metavar="JSON", help='Constructor arguments for --arch, e.g. '
    '\'{"num_classes": 10}\'.')]
Ema = Annotated[bool, typer.Option(
    "--ema", help="Use the EMA weights of a training checkpoint (timm's state_dict_ema).")]
TextColumnOpt = Annotated[Optional[str], typer.Option(
    "--text-column", metavar="NAME", help="Text pools (.csv/.jsonl): the column holding the "
    "text. [default: text]")]
ImageColumn = Annotated[Optional[str], typer.Option(
    "--image-column", metavar="NAME", help="Table pools (.parquet, datasets folders): the column "
    "holding encoded images or their paths. [default: image]")]
IdColumn = Annotated[Optional[str], typer.Option(
    "--id-column", metavar="NAME", help="Table pools: the column holding the ids. [default: the "
    "row number]")]
LabelColumn = Annotated[Optional[str], typer.Option(
    "--label-column", metavar="NAME", help="Table pools: the column holding the labels. "
    "[default: label, where there is one]")]
Split = Annotated[Optional[str], typer.Option(
    "--split", metavar="NAME", help="A Hugging Face DatasetDict pool: the split to score.")]
MaxLength = Annotated[Optional[int], typer.Option(
    "--max-length", metavar="N", help="Text pools: truncate texts at N tokens. [default: the "
    "model's limit]")]
TextWidth = Annotated[Optional[int], typer.Option(
    "--text-width", metavar="N", help="Text pools: the table's text column holds the first N "
    "characters of each text; 0 = the whole text. [default: 200]")]
ClassNames = Annotated[Optional[str], typer.Option(
    "--class-names", metavar="FILE", help="The class names, one per line (or a JSON list), in "
    "the model's class order: pred shows them, manifests may give labels by name. [default: "
    "a Hugging Face model's id2label, or the class folders]")]
Trust = Annotated[bool, typer.Option(
    "--trust-checkpoint", help="Run code that comes with the files: a pickled model or TorchScript "
    "archive, an --arch module in the working directory or the config's folder. A flag only, "
    "never a config key.")]
TrustRemoteCode = Annotated[bool, typer.Option(
    "--trust-remote-code", help="Run a Hugging Face directory's own Python code (auto_map in its "
    "config.json). A flag only, never a config key.")]
LabelsFromFolders = Annotated[bool, typer.Option(
    "--labels-from-folders", help="Class subfolders of an image folder are the labels (sorted, "
                                  "like torchvision's ImageFolder).")]
Strategy = Annotated[Optional[str], typer.Option(
    "--strategy", "-s", metavar="NAME", help="One of egl, gradnorm, loss, entropy, "
    "margin, least-confidence, random; uncertain-boxes (detection). [default: egl]")]
TopClasses = Annotated[Optional[int], typer.Option(
    metavar="K", help="egl: sum over the K most probable classes; 0 = all classes, exact. "
    "[default: 10 for models with more than 10 classes, else all]")]
Task = Annotated[Optional[str], typer.Option(
    metavar="TASK", help="What one example's output is: auto (read from the model), "
    "classification, multilabel, segmentation, token-classification, regression or detection. "
    "[default: auto]")]
EglSamples = Annotated[Optional[str], typer.Option(
    metavar="S|pseudo", help="egl on multilabel, segmentation and token classification: S label "
    "sets drawn from the model's predictions per example (seeded), or pseudo (the predicted "
    "labels). [default: 8]")]
Aggregate = Annotated[Optional[str], typer.Option(
    metavar="mean|max|top:Q", help="How per-position (per-label) entropy, margin and "
    "least-confidence make one score per example; top:Q = the mean of the top fraction Q. "
    "[default: mean]")]
BoxThreshold = Annotated[Optional[float], typer.Option(
    metavar="P", help="Detection: predicted boxes scoring at least P are the pseudo-labels of "
    "gradnorm and loss, and the table's boxes. [default: 0.5]")]
Decode = Annotated[Optional[str], typer.Option(
    metavar="cpu|gpu", help="Where JPEG images are decoded: by PIL in the loader (cpu), or as "
    "file bytes decoded, resized and cropped on the device (gpu: nvJPEG on CUDA). [default: cpu]")]
Precision = Annotated[Optional[str], typer.Option(
    metavar="fp32|bf16|fp16", help="The model's forward under autocast; norms add up in float32 "
    "or better. [default: fp32]")]
Layers = Annotated[Optional[List[str]], typer.Option(
    metavar="PATTERN", help="Restrict gradient strategies to these modules (repeatable; e.g. fc, "
    "'layer4.*'; 'alcli inspect' lists the names).")]
Method = Annotated[Optional[str], typer.Option(
    metavar="NAME", help="Engine method: auto, ghost, replicate, vmap or loop. [default: auto]")]
Compile = Annotated[bool, typer.Option(
    "--compile", help="Run the ghost method's layer rules as one torch.compile'd graph (CUDA graphs "
    "on CUDA), compiled once per model and input shape: seconds on the first batch, then faster "
    "for small models (README, 'Compiled rules').")]
BatchSize = Annotated[Optional[int], typer.Option(
    "--batch-size", "-b", metavar="N", help="Examples per batch. [default: 64]")]
Device = Annotated[Optional[str], typer.Option(
    metavar="DEVICE", help="auto (CUDA when there is one), cpu, cuda, cuda:N or mps. "
    "[default: auto]")]
Workers = Annotated[Optional[int], typer.Option(
    "--workers", "-j", metavar="N", help="Data-loading worker processes. [default: 0 on the CPU, "
    "the CPU count (at most 8) on CUDA]")]
Seed = Annotated[Optional[int], typer.Option(
    metavar="N", help="Seed for the random strategy and for select --diverse. [default: 0]")]
Output = Annotated[Optional[str], typer.Option(
    "--output", "-o", metavar="FILE", help="Output file, or - for stdout. [default: stdout, or "
    "scores.csv when stdout is a terminal]")]
SelectOutput = Annotated[Optional[str], typer.Option(
    "--output", "-o", metavar="FILE", help="Output file, or - for stdout. [default: stdout]")]
TableFormat = Annotated[Optional[str], typer.Option(
    "--format", "-f", metavar="FORMAT", help="csv (the default), jsonl, paths (one image file per "
    "line) or ids (one id per line); with -0, paths and ids end in NUL.")]
SelectFormat = Annotated[Optional[str], typer.Option(
    "--format", "-f", metavar="FORMAT", help="csv (the default), jsonl, paths (one image file per "
    "line), ids (one id per line), or labelstudio (Label Studio tasks JSON); with -0, paths and "
    "ids end in NUL.")]
Quiet = Annotated[bool, typer.Option("--quiet", "-q", help="No progress and no summary on "
                                     "stderr; warnings and errors still.")]
Verbose = Annotated[bool, typer.Option("--verbose", "-v", help="Also say where each setting "
                                       "came from (default, config key or flag).")]
LogFormat = Annotated[Optional[str], typer.Option(
    "--log-format", metavar="text|json", help="Progress lines, warnings and the summary on stderr "
    "as text (the default), or as one JSON object per line.")]
ProgressEvery = Annotated[Optional[float], typer.Option(
    "--progress-every", metavar="SECONDS", help="Where stderr is not a terminal (a log file), one "
    "progress line every SECONDS (default 30).")]
# selection (select only, except --embeddings which score writes and select reads)
WriteEmbeddings = Annotated[Optional[bool], typer.Option(
    "--embeddings/--no-embeddings", show_default=False,
    help="Write each example's BADGE embedding (the gradient at the last layer, factored) beside "
         "the table, as OUTPUT.emb.npz, for select's diverse batches. [default: when the whole "
         "pool goes to a file]")]
ReadEmbeddings = Annotated[Optional[str], typer.Option(
    "--embeddings", metavar="FILE", help="The embeddings --diverse reads. [default: "
    "SCORES.emb.npz]")]
Diverse = Annotated[Optional[bool], typer.Option(
    "--diverse/--no-diverse", show_default=False,
    help="BADGE: k-means++ on gradient embeddings among the best scores, so the batch holds no "
         "near-duplicates. [default: when the table's embeddings are at hand (score writes them "
         "beside a table file), or with --pool]")]
DiverseCandidates = Annotated[Optional[str], typer.Option(
    "--diverse-candidates", metavar="M", help="--diverse picks among the M best-scoring examples "
    "(per class with --per-class), or 'all' for classic BADGE. [default: 10 x budget]")]
DiverseMode = Annotated[Optional[str], typer.Option(
    "--diverse-mode", metavar="badge|cluster-margin", help="How --diverse spreads the batch. "
    "badge: k-means++ on the gradient embeddings, O(candidates x budget) distance rows; "
    "cluster-margin (Citovsky et al. 2021): k-means of the candidates' penultimate features, "
    "then one row per cluster, smallest clusters first, for batches of any size. Implies "
    "--diverse. [default: badge]")]
DiverseClusters = Annotated[Optional[int], typer.Option(
    "--diverse-clusters", metavar="M", help="--diverse-mode cluster-margin: the number of "
    "clusters of the candidates. [default: the budget]")]
Sampling = Annotated[Optional[str], typer.Option(
    "--sampling", metavar="top|power|softmax", help="top: the best scores; power or softmax: a "
    "batch drawn from the scores, P ∝ score^β or exp(β score), seeded (Kirsch et al. 2023), for "
    "large batches at any pool size; not with --diverse. [default: top]")]
Typical = Annotated[bool, typer.Option(
    "--typical", help="Cold start (TypiClust): cluster the rows' embeddings into labeled + budget "
    "clusters and pick the most typical row of each of the largest clusters no --exclude'd "
    "(labeled) row is in; ignores the scores. For the first rounds: below about 6 labels per class "
    "it beat egl and margin on digits (README, cold start).")]
SamplingBeta = Annotated[Optional[float], typer.Option(
    "--sampling-beta", metavar="B", help="β of --sampling power/softmax: larger is closer to "
    "top. [default: 1]")]
PerClass = Annotated[Optional[str], typer.Option(
    "--per-class", metavar="MODE", help="proportional or equal: spread the budget over the "
    "predicted classes in proportion to their counts, or equally.")]
Exclude = Annotated[Optional[List[str]], typer.Option(
    "--exclude", metavar="FILE", help="Never select the ids in FILE (.csv id column, .jsonl/"
                                      ".json ids, Label Studio's JSON, JSON-MIN, CSV and TSV "
                                      "exports, else one per line; repeatable).")]
FromName = Annotated[Optional[str], typer.Option(
    "--from-name", metavar="NAME", help="-f labelstudio: the name of the Choices tag the "
    "predicted class pre-selects. [default: label]")]
ToName = Annotated[Optional[str], typer.Option(
    "--to-name", metavar="NAME", help="-f labelstudio: the name of the Image or Text tag it "
    "labels. [default: image, or text for text pools]")]
LabelStudioConfig = Annotated[Optional[str], typer.Option(
    "--labelstudio-config", metavar="XML", help="Also write the Label Studio labeling config "
    "the tasks' pre-labels fit (class names from the model or --class-names).")]
ScoreExclude = Annotated[Optional[List[str]], typer.Option(
    "--exclude", metavar="FILE", help="Skip the examples FILE names (labeled ones) before scoring: "
    "no row, not read (the files select --exclude reads; repeatable).")]
# image transforms (image pools): each flag sets one key of the config's `transform`
Resize = Annotated[Optional[str], typer.Option(
    "--resize", metavar="N|HxW", help="Resize images: the shorter side to N, or to H x W.")]
CenterCrop = Annotated[Optional[str], typer.Option(
    "--center-crop", metavar="N|HxW", help="Then crop the center N x N, or H x W.")]
Grayscale = Annotated[Optional[bool], typer.Option(
    "--grayscale/--no-grayscale", show_default=False, help="Drop the colour first (then match "
    "the model's input channels).")]
Normalize = Annotated[Optional[str], typer.Option(
    "--normalize", metavar="MEAN/STD", help="Normalise pixels (0..1): imagenet, none, or "
    "per-channel numbers, e.g. 0.5,0.5,0.5/0.25,0.25,0.25.")]
ImageRoot = Annotated[Optional[str], typer.Option(
    "--image-root", metavar="URL", help="-f labelstudio: prefix ids with this URL or path in "
                                        "data.image.")]
ImageDir = Annotated[Optional[str], typer.Option(
    "--image-dir", metavar="DIR", help="--contact-sheet: the folder the image ids are relative to. "
    "[default: the config's pool]")]
ContactSheet = Annotated[Optional[str], typer.Option(
    "--contact-sheet", metavar="PNG", help="Also draw the selected images (or texts) in one PNG "
                                           "grid with rank, id, score and predicted class under "
                                           "each.")]

# long runs (score only)
CheckpointEvery = Annotated[Optional[str], typer.Option(
    "--checkpoint-every", metavar="N|TIME", help="Save finished rows to OUTPUT.partial at least "
    "every N examples or every TIME (30s, 5m, 1h), and on Ctrl-C/SIGTERM; a kill -9 loses at "
    "most that much. [default: 30s]")]
Resume = Annotated[bool, typer.Option(
    "--resume", help="Continue the unfinished run whose rows are in OUTPUT.partial (same "
    "settings; for stdout, the partial file is under ./.alcli/).")]
Restart = Annotated[bool, typer.Option(
    "--restart", help="Delete the partial file of an earlier unfinished run and start over.")]
Strict = Annotated[bool, typer.Option(
    "--strict", help="Stop at the first unreadable example instead of skipping it (skipped ones "
                     "are listed in OUTPUT.errors.csv).")]
Shard = Annotated[Optional[str], typer.Option(
    "--shard", metavar="K/N", help="Score shard K of N (K = 0..N-1; chosen by a hash of the id); "
                                   "combine the parts with 'alcli merge'.")]
Null = Annotated[bool, typer.Option(
    "--null", "-0", help="NUL-separated records, as find -print0 writes and xargs -0 reads: image "
    "paths read from stdin (POOL -), and the output of -f paths and -f ids.")]
NullOutput = Annotated[bool, typer.Option(
    "--null", "-0", help="-f paths and -f ids: end each record with NUL instead of a newline, "
    "for xargs -0.")]

# Examples: one command per line, each under 78 columns, so that no terminal wraps them; \b keeps
# click from re-flowing a block.
SCORE_EPILOG = """Examples:

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

MERGE_EPILOG = """Examples:

\b
alcli merge part0.csv part1.csv part2.csv -o scores.csv
alcli merge parts/part*.csv | alcli select -n 100 -f paths
"""

SELECT_EPILOG = """Examples:

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

SIMULATE_EPILOG = """The training command's contract:

\b
  {labeled}  a CSV it reads: id,label (and path, for image files): the
             examples labeled so far; only selected examples' labels are
             ever written there
  {model}    the checkpoint it must write; alcli loads it as --model
             (with --arch)
  {round} {seed} {strategy} {workdir}: for its logs or seeds
It runs in a shell, in the current folder, each placeholder replaced by
its value quoted as one word (do not quote placeholders yourself); a
non-zero exit stops the simulation. Each round's labeled.csv and
train.log stay in --workdir; checkpoints are removed once used.

Examples:

\b
alcli simulate pool/ --labels-from-folders --eval test/ --arch mynet:Net \\
    --train "python train.py --labeled {labeled} --out {model}" \\
    --init 20 -n 20 --rounds 5 --strategies margin,egl+badge,random \\
    --seeds 3 -o curves.csv --plot curves.png
"""

INSPECT_EPILOG = """Examples:

\b
alcli inspect                      # the demo model
alcli inspect -m ckpt.pt --arch torchvision:resnet18 --layers 'layer4.*'
"""


def _settings(config: str | None, flags: dict) -> Settings:
    """Defaults < config (./configs/default.yaml when no --config and no --model) < flags."""
    # a switch left off is "not given", except for those whose default is decided later
    given = {k: (None if (v is False and k not in ("diverse", "embeddings", "grayscale"))
                 or v == [] else v)
             for k, v in flags.items()}
    if config is None and given.get("model") is None and DEFAULT_CONFIG.is_file():
        config = str(DEFAULT_CONFIG)
    settings = load_settings(config, given)
    return settings


def _reporter(settings: Settings, enabled: bool = True) -> Reporter:
    r = Reporter(settings.log_format, quiet=settings.quiet, verbose=settings.verbose,
                 progress_every=settings.progress_every, enabled=enabled)
    for key, where in sorted(settings.sources.items()):
        r.detail(f"{key} = {getattr(settings, key)!r} ({where})")
    _warnings_to(r)
    return r


# what `auto` costs when it cannot use ghost, relative to ghost (benchmarks/gradnorm.py, CPU)
FALLBACK_COST = {"vmap": "typically 3 to 50 times ghost's time", "replicate": "several times "
                 "ghost's time", "loop": "about one forward and backward per example, often 20 "
                 "times ghost's time or more"}


def _warnings_to(r: Reporter) -> None:
    """Python warnings go to stderr as one line, not as Python's two-line warnings: alcli's own
    (the engine's `auto` settling on a slower method) as `alcli: warning: ...`, the others (torch,
    a third-party package, user code) naming their origin: `warning (torch/x.py:12): ...`."""
    def show(message, category, filename, lineno, file=None, line=None):
        cost = FALLBACK_COST.get(getattr(message, "method", None))  # an EngineFallback
        r.warn(f"{message} (expected cost: {cost})" if cost else str(message),
               warning_origin(category, filename, lineno))
    warnings.showwarning = show


def _warn_skipped(r: Reporter, skipped: int, nans: int, errors_file: str | None, errors=()) -> None:
    """Warnings that a long run must not hide (printed with --quiet too)."""
    if skipped:
        where = (f"they are listed in {errors_file}" if errors_file else
                 "; ".join(f"{id_}: {message}" for id_, message in list(errors)[:3])
                 + (" ..." if skipped > 3 else ""))
        r.warn(f"skipped {skipped} unreadable example{'s' if skipped > 1 else ''} ({where})")
    if nans:
        r.warn(f"{nans} example{'s have' if nans > 1 else ' has'} a NaN score (a non-finite loss "
               f"or gradient norm, or a loss over no position: a mask ignoring every pixel, a "
               f"text without a labeled word), ranked last")


def _api():
    """alcli.api, imported when a command runs: it imports torch (about 2 s), which --help and
    usage errors need not wait for."""
    from . import api
    return api


def _rank0() -> bool:
    """False on the torchrun processes other than rank 0, which print nothing. Read from the
    environment here, not through longrun.distributed.from_env, which would import torch (2 s)
    before every error message."""
    return os.environ.get("RANK", "0").strip() in ("", "0") or os.environ.get("WORLD_SIZE") == "1"


def _shown_list(pool) -> str:
    return " ".join(pool) if isinstance(pool, list) else str(pool)


def _stdin_is_empty() -> bool:
    """stdin is not a terminal and holds nothing (`</dev/null`, cron, Slurm), without consuming it."""
    buf = getattr(sys.stdin, "buffer", None)
    if buf is None or sys.stdin.isatty():
        return False
    if hasattr(buf, "peek"):
        return buf.peek(1) == b""
    if buf.seekable():
        at = buf.tell()
        empty = buf.read(1) == b""
        buf.seek(at)
        return empty
    return False


@app.command(cls=_Command, epilog=SCORE_EPILOG)
def score(
    pool: Annotated[Optional[List[str]], typer.Argument(
        help="An image folder, image files, a .csv/.jsonl manifest (path, id, label), text (.txt, "
             "or .csv/.jsonl with a text column), a .pt/.npy/.npz tensor file, or - for image "
             "paths on stdin. [default: the config's pool]", show_default=False,
        metavar="POOL")] = None,
    config: Config = None, model: Model = None, arch: Arch = None, trust_checkpoint: Trust = False,
    trust_remote_code: TrustRemoteCode = False,
    arch_kwargs: ArchKwargs = None, ema: Ema = False, text_column: TextColumnOpt = None,
    image_column: ImageColumn = None, id_column: IdColumn = None, label_column: LabelColumn = None,
    split: Split = None,
    max_length: MaxLength = None, text_width: TextWidth = None, class_names: ClassNames = None,
    labels_from_folders: LabelsFromFolders = False, resize: Resize = None,
    center_crop: CenterCrop = None, grayscale: Grayscale = None, normalize: Normalize = None,
    strategy: Strategy = None, task: Task = None, egl_samples: EglSamples = None,
    aggregate: Aggregate = None, box_threshold: BoxThreshold = None,
    top_classes: TopClasses = None, layers: Layers = None, method: Method = None,
    compile: Compile = False, precision: Precision = None, decode: Decode = None, batch_size: BatchSize = None,
    device: Device = None,
    workers: Workers = None, seed: Seed = None, output: Output = None, format: TableFormat = None,
    null: Null = False, exclude: ScoreExclude = None, embeddings: WriteEmbeddings = None,
    checkpoint_every: CheckpointEvery = None, resume: Resume = False, restart: Restart = False,
    strict: Strict = False, shard: Shard = None, quiet: Quiet = False, verbose: Verbose = False,
    log_format: LogFormat = None, progress_every: ProgressEvery = None,
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
    settings = _settings(flags.pop("config"), flags)
    rank0 = _rank0()
    r = _reporter(settings, enabled=rank0)
    dest = settings.output or ("scores.csv" if sys.stdout.isatty() else "-")
    try:
        with r.progress() as (on_start, on_batch):
            result, emb_file = _api().score_to_table(settings, dest, on_start=on_start,
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
    _warn_skipped(r, len(done.errors), done.nans, errors_file, done.errors)
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


@app.command(cls=_Command, epilog=MERGE_EPILOG)
def merge(
    parts: Annotated[List[str], typer.Argument(
        help="Shard tables written by 'alcli score --shard K/N -o PART' (each with its "
             "PART.meta.json beside it).", show_default=False, metavar="PART")],
    output: Output = None, format: TableFormat = None, null: NullOutput = False,
    quiet: Quiet = False, log_format: LogFormat = None,
):
    """Combine the shard tables of one pool into its ranked table, as one process would have
    written it. Refuses parts that overlap, miss a shard, or were scored differently.

    The table goes to --output, or to stdout when that is not a terminal (else to scores.csv).
    """
    settings = _settings(None, {"output": output, "format": format, "null": null, "quiet": quiet,
                                "log_format": log_format, "model": "(merge reads no config)"})
    r = _reporter(settings)
    if settings.format not in ("csv", "jsonl", "paths", "ids"):
        raise AlcliError(f"--format {settings.format}: merge writes csv, jsonl, paths or ids")
    dest = settings.output or ("scores.csv" if sys.stdout.isatty() else "-")
    result = _api().merge(parts, dest, settings.format, settings.null)
    errors_file = next((f for f in result.files if f.endswith(".errors.csv")), None)
    _warn_skipped(r, len(result.finished.errors), result.finished.nans, errors_file,
                  result.finished.errors)
    for note in result.notes:
        r.warn(note)
    if dest != "-":
        r.info(f"wrote {result.finished.count} rows from {result.parts} parts to {dest}")
        if result.embeddings_file:
            r.info(f"joined their embeddings into {result.embeddings_file}")


@app.command(cls=_Command, epilog=SELECT_EPILOG)
def select(
    scores: Annotated[Optional[str], typer.Argument(
        help="Ranked table (CSV or JSONL) from 'alcli score', or - for stdin. [default: stdin "
             "when something is piped in, else the config's pool scored first]",
        show_default=False, metavar="SCORES")] = None,
    budget: Annotated[Optional[int], typer.Option(
        "--budget", "-n", metavar="N", help="How many examples to select.")] = None,
    pool: Annotated[Optional[str], typer.Option(
        metavar="POOL", help="Score this pool first instead of reading SCORES (same forms as "
        "'score POOL').")] = None,
    config: Config = None, model: Model = None, arch: Arch = None, trust_checkpoint: Trust = False,
    trust_remote_code: TrustRemoteCode = False,
    arch_kwargs: ArchKwargs = None, ema: Ema = False, text_column: TextColumnOpt = None,
    image_column: ImageColumn = None, id_column: IdColumn = None, label_column: LabelColumn = None,
    split: Split = None,
    max_length: MaxLength = None, text_width: TextWidth = None, class_names: ClassNames = None,
    labels_from_folders: LabelsFromFolders = False, resize: Resize = None,
    center_crop: CenterCrop = None, grayscale: Grayscale = None, normalize: Normalize = None,
    strategy: Strategy = None, task: Task = None, egl_samples: EglSamples = None,
    aggregate: Aggregate = None, box_threshold: BoxThreshold = None,
    top_classes: TopClasses = None, layers: Layers = None, method: Method = None,
    compile: Compile = False, precision: Precision = None, decode: Decode = None, batch_size: BatchSize = None,
    device: Device = None,
    workers: Workers = None, seed: Seed = None, output: SelectOutput = None,
    format: SelectFormat = None, null: Null = False, diverse: Diverse = None,
    diverse_candidates: DiverseCandidates = None, diverse_mode: DiverseMode = None,
    diverse_clusters: DiverseClusters = None,
    embeddings_file: ReadEmbeddings = None, per_class: PerClass = None, exclude: Exclude = None,
    sampling: Sampling = None, sampling_beta: SamplingBeta = None, typical: Typical = False,
    image_root: ImageRoot = None, contact_sheet: ContactSheet = None, image_dir: ImageDir = None,
    from_name: FromName = None, to_name: ToName = None,
    labelstudio_config: LabelStudioConfig = None,
    quiet: Quiet = False, verbose: Verbose = False, log_format: LogFormat = None,
    progress_every: ProgressEvery = None,
):
    """Write the BUDGET best examples of a ranked table: the batch to label.

    Reads SCORES, or stdin when something is piped in. With --pool or --model, or when nothing
    is piped in (a terminal, or an empty stdin such as </dev/null under cron), it scores the
    config's pool first, in one process. The batch goes to --output, else to stdout, best score
    first; its rank column is each example's place in the whole table.
    """
    flags = dict(locals())
    settings = _settings(flags.pop("config"), flags)
    r = _reporter(settings)
    if settings.budget is None:
        raise AlcliError("no budget given; pass -n/--budget N (or set budget: in the config)")
    source = scores or settings.scores
    if scores and pool:
        raise AlcliError(f"give a table to select from (SCORES {scores}) or a pool to score first "
                         f"(--pool {pool}), not both")
    # a pipeline never changes its input: a table comes from SCORES or stdin, and only a person
    # at a terminal (no table anywhere) gets the config's pool scored instead, told so
    from_terminal = source is None and not (pool or model) and sys.stdin.isatty()
    score_first = source is None and bool(pool or model or from_terminal)
    if source is None and not score_first and _stdin_is_empty():
        raise AlcliError("nothing on stdin, so no table to select from (did the command before "
                         "the pipe fail?); pipe a table in, name one (alcli select SCORES -n N), "
                         "or score first with --pool POOL")
    if from_terminal and settings.pool is None:
        raise AlcliError("no table to select from: name one (alcli select SCORES -n N), pipe one "
                         "in, or score first with --pool POOL")
    if from_terminal:
        r.warn(f"no table given: scoring the pool {_shown_list(settings.pool)} of "
               f"{settings.config_file or 'the settings'} first")
    # --task also names what a table's rows predict, for the Label Studio pre-labels
    unused = [key for key in _SCORING_FLAGS if flags.get(key) not in (None, False)
              and not (key == "task" and (settings.format == "labelstudio"
                                          or settings.labelstudio_config))]
    if not score_first and unused:
        more = f" (and {len(unused) - 1} more scoring options)" if len(unused) > 1 else ""
        r.warn(f"{flag(unused[0])}{more} has no effect: the scores are read from "
               f"{source if source not in (None, '-') else 'stdin'}; pass --pool POOL to score first")
    with r.progress() if score_first else _no_progress() as (on_start, on_batch):
        api = _api()
        picked = api.run_select(settings, scores=None if score_first else (source or "-"),
                                on_start=on_start, on_batch=on_batch)
    api.write_batch(picked.rows, settings.output or "-", settings, picked.meta,
                    texts=picked.texts, class_names=picked.class_names, task=picked.task)
    if len(picked.rows) < settings.budget:
        r.warn(f"the budget is {settings.budget} but only {picked.available} rows are left to "
               f"choose from; selected them all")
    for note in picked.notes:
        r.warn(note)
    if settings.output not in (None, "-"):
        r.info(f"wrote {len(picked.rows)} rows to {settings.output}")
    if settings.contact_sheet:
        what = "texts" if picked.texts is not None else "images"
        r.info(f"wrote a contact sheet of {len(picked.rows)} {what} to {settings.contact_sheet}")
    if settings.labelstudio_config:
        r.info(f"wrote the Label Studio labeling config to {settings.labelstudio_config}")


# `select` options that only matter when it scores the pool itself
_SCORING_FLAGS = ("arch", "arch_kwargs", "trust_checkpoint", "trust_remote_code", "ema",
                  "text_column", "image_column", "id_column", "label_column", "split", "max_length", "text_width", "labels_from_folders", "strategy",
                  "task", "egl_samples", "aggregate", "box_threshold",
                  "top_classes", "layers", "method", "compile", "precision", "decode", "batch_size", "device",
                  "workers", "resize", "center_crop", "grayscale", "normalize")


class _no_progress:
    def __enter__(self):
        return None, None

    def __exit__(self, *exc):
        return False


@app.command(cls=_Command, epilog=SIMULATE_EPILOG)
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
    seeds: Annotated[int, typer.Option(
        metavar="N", show_default=False, min=1, help="Runs per strategy, seeds 0..N-1; a seed's "
        "first random examples are the same for every strategy. [default: 3]")] = 3,
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
        "--plot", metavar="PNG", help="Also draw the mean curves (needs matplotlib).")] = None,
    workdir: Annotated[Optional[str], typer.Option(
        metavar="DIR", help="Each round's labeled.csv, checkpoint and train.log. [default: "
        "OUTPUT.runs, or .alcli/simulate]")] = None,
    config: Config = None, arch: Arch = None, arch_kwargs: ArchKwargs = None,
    trust_checkpoint: Trust = False, labels_from_folders: LabelsFromFolders = False,
    text_column: TextColumnOpt = None, image_column: ImageColumn = None, id_column: IdColumn = None,
    label_column: LabelColumn = None, class_names: ClassNames = None,
    batch_size: BatchSize = None, device: Device = None, quiet: Quiet = False,
):
    """Learning curves on your own labeled pool: hide its labels, train with your command on
    a random start, then select, reveal and retrain round by round, per strategy and seed; print
    the mean AULC (mean accuracy over the rounds) per strategy."""
    import csv
    from pathlib import Path

    from .files.atomic import make_folder
    from .simulate import Plan, aulc, check_strategies, plot, simulate as run_simulation
    flags = {k: v for k, v in locals().items() if k in (
        "arch", "arch_kwargs", "trust_checkpoint", "labels_from_folders", "text_column",
        "image_column", "id_column", "label_column", "class_names", "batch_size", "device",
        "quiet")}
    # no ./configs/default.yaml here: the demo's model settings are not the user's
    settings = load_settings(config, {k: None if v is False else v for k, v in flags.items()})
    r = _reporter(settings)
    if "{model}" not in train:
        raise AlcliError("option --train must name {model}, the checkpoint the command writes "
                         "(and read {labeled}, the labeled examples)")
    if output and output != "-":
        make_folder(Path(output).parent, f"option --output {output}")
    plan = Plan(pool, eval_pool, train, check_strategies(strategies), seeds, init, budget, rounds,
                Path(workdir or (f"{output}.runs" if output and output != "-"
                                 else ".alcli/simulate")),
                output if output != "-" else None)
    rows = run_simulation(settings, plan, say=r.info)
    if not plan.output:
        out = io.StringIO()
        w = csv.DictWriter(out, ("strategy", "seed", "round", "labels", "accuracy"))
        w.writeheader()
        w.writerows({**row, "accuracy": f"{row['accuracy']:.6f}"} for row in rows)
        sys.stdout.write(out.getvalue())
    summary = sorted(aulc(rows).items(), key=lambda kv: -kv[1][0])
    for strategy, (mean, std) in summary:
        r.info(f"{strategy}: AULC {mean:.2f} ± {std:.2f} points (mean accuracy over the "
               f"{rounds + 1} rounds, over {seeds} seeds)")
    if plot_file and not plot(rows, plot_file):
        r.warn(f"--plot {plot_file}: matplotlib is not installed; no picture drawn")


@app.command(cls=_Command, epilog=INSPECT_EPILOG)
def inspect(
    config: Config = None, model: Model = None, arch: Arch = None, trust_checkpoint: Trust = False,
    trust_remote_code: TrustRemoteCode = False, arch_kwargs: ArchKwargs = None, ema: Ema = False,
    pool: Annotated[Optional[str], typer.Option(
        metavar="POOL", help="A pool to try the engine on, to see which method auto picks.")] = None,
    labels_from_folders: LabelsFromFolders = False, layers: Layers = None, method: Method = None,
    task: Task = None,
):
    """Show the model's modules, parameter counts, which gradient rule serves each selected
    module, and which engine method auto will use."""
    flags = dict(locals())
    settings = _settings(flags.pop("config"), flags)
    info = _api().inspect_model(settings)
    table = Table(title=Text(f"{info.model}: {info.total_params:,} parameters, "
                             f"{info.selected_params:,} selected"), title_justify="left")
    for c in ("module", "type", "params", "selected", "rule"):
        table.add_column(c, justify="right" if c == "params" else "left")
    for m in info.modules:
        table.add_row(*map(Text, (m.name, m.kind, f"{m.params:,}", "yes" if m.selected else "no",
                                  m.rule if m.selected else "")))
    console = Console(highlight=False, soft_wrap=True)
    console.print(table)
    console.print(f"input channels: {info.channels if info.channels else 'unknown (no convolution)'}",
                  markup=False)
    reason = info.reason or ""
    if reason.startswith(f"{info.method}: "):
        reason = reason[len(info.method) + 2:]
    console.print(f"task: {info.task}", markup=False)
    console.print(f"method: {info.method}" + (f" ({reason})" if reason else ""), markup=False)


def main() -> None:
    app(prog_name="alcli")


if __name__ == "__main__":
    main()
