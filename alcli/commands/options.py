"""The options the commands share, declared once so that no command misses one or words it
differently. Every option also has a config key: its name with _ for -.

Each option names the --help heading it is listed under (Typer's rich_help_panel); a command lists
its headings in the order its signature first uses them, and `under` moves a shared option to
another heading (select shows the scoring options it passes through under one of their own).
"""
from __future__ import annotations

import copy
from typing import Annotated, List, Optional, get_args

import typer

# --help headings
INPUT = "Input"
IMAGES = "Image transforms"
MODEL = "Model"
STRATEGY = "Scoring"
OUTPUT = "Output"
PERFORMANCE = "Performance"
LONG_RUNS = "Long runs"
MESSAGES = "Messages"
SELECTION = "Choosing the batch"
LABELING = "Labeling tools"


def under(panel: str, option):
    """The same option (an Annotated[type, typer.Option(...)]) listed under another heading."""
    kind, info = get_args(option)
    info = copy.copy(info)
    info.rich_help_panel = panel
    return Annotated[kind, info]


# Help texts end in "[default: X]" where a default is worth saying; metavars name what is expected.
Config = Annotated[Optional[str], typer.Option(
    "--config", "-c", metavar="FILE", help="YAML config file; flags override it; its relative "
    "paths are relative to its folder. Without --config and --model, ./configs/default.yaml is "
    "used when present (the demo).", rich_help_panel=INPUT)]
Model = Annotated[Optional[str], typer.Option(
    "--model", "-m", metavar="FILE", help="Checkpoint: a state_dict or .safetensors (needs --arch), "
    "a Lightning/DDP/timm-style dict, a TorchScript archive, a pickled model (see "
    "--trust-checkpoint), or a Hugging Face save_pretrained directory.", rich_help_panel=MODEL)]
Arch = Annotated[Optional[str], typer.Option(
    metavar="SPEC", help="torchvision:NAME, timm:NAME or package.module:callable; constructor "
    "arguments from --arch-kwargs.", rich_help_panel=MODEL)]
ArchKwargs = Annotated[Optional[str], typer.Option(
    "--arch-kwargs", metavar="JSON", help='Constructor arguments for --arch, e.g. '
    '\'{"num_classes": 10}\'.', rich_help_panel=MODEL)]
Ema = Annotated[bool, typer.Option(
    "--ema", help="Use the EMA weights of a training checkpoint (timm's state_dict_ema).",
    rich_help_panel=MODEL)]
TextColumnOpt = Annotated[Optional[str], typer.Option(
    "--text-column", metavar="NAME", help="Text pools (.csv/.jsonl): the column holding the "
    "text. [default: text]", rich_help_panel=INPUT)]
ImageColumn = Annotated[Optional[str], typer.Option(
    "--image-column", metavar="NAME", help="Table pools (.parquet, datasets folders): the column "
    "holding encoded images or their paths. [default: image]", rich_help_panel=INPUT)]
IdColumn = Annotated[Optional[str], typer.Option(
    "--id-column", metavar="NAME", help="Table pools: the column holding the ids. [default: the "
    "row number]", rich_help_panel=INPUT)]
LabelColumn = Annotated[Optional[str], typer.Option(
    "--label-column", metavar="NAME", help="Table pools: the column holding the labels. "
    "[default: label, where there is one]", rich_help_panel=INPUT)]
Split = Annotated[Optional[str], typer.Option(
    "--split", metavar="NAME", help="A Hugging Face DatasetDict pool: the split to score.",
    rich_help_panel=INPUT)]
Fps = Annotated[Optional[float], typer.Option(
    "--fps", metavar="N", help="Video pools (.mp4/.mkv/.webm): score N frames per second, N "
    "may be a fraction (the first frame at or after each 1/N s). [default: every frame]",
    rich_help_panel=INPUT)]
Every = Annotated[Optional[int], typer.Option(
    "--every", metavar="N", help="Video pools: score every N-th frame. [default: 1]",
    rich_help_panel=INPUT)]
MaxLength = Annotated[Optional[int], typer.Option(
    "--max-length", metavar="N", help="Text pools: truncate texts at N tokens. [default: the "
    "model's limit]", rich_help_panel=INPUT)]
TextWidth = Annotated[Optional[int], typer.Option(
    "--text-width", metavar="N", help="Text pools: the table's text column holds the first N "
    "characters of each text; 0 = the whole text. [default: 200]", rich_help_panel=OUTPUT)]
ClassNames = Annotated[Optional[str], typer.Option(
    "--class-names", metavar="FILE", help="The class names, one per line (or a JSON list), in "
    "the model's class order: pred shows them, manifests may give labels by name. [default: "
    "a Hugging Face model's id2label, or the class folders]", rich_help_panel=INPUT)]
Trust = Annotated[bool, typer.Option(
    "--trust-checkpoint", help="Run code that comes with the files: a pickled model or TorchScript "
    "archive, an --arch module in the working directory or the config's folder. A flag only, "
    "never a config key.", rich_help_panel=MODEL)]
TrustRemoteCode = Annotated[bool, typer.Option(
    "--trust-remote-code", help="Run a Hugging Face directory's own Python code (auto_map in its "
    "config.json). A flag only, never a config key.", rich_help_panel=MODEL)]
LabelsFromFolders = Annotated[bool, typer.Option(
    "--labels-from-folders", help="Class subfolders of an image folder are the labels (sorted, "
                                  "like torchvision's ImageFolder).", rich_help_panel=INPUT)]
Strategy = Annotated[Optional[str], typer.Option(
    "--strategy", "-s", metavar="NAME", help="One of egl, gradnorm, align (with --target), "
    "loss, entropy, margin, least-confidence, random; uncertain-boxes (detection); review (gradnorm "
    "with the probabilities alcli review reads). [default: the task's own, which alcli inspect shows: "
    "egl but where docs/benchmarks.md's rule picked another]",
    rich_help_panel=STRATEGY)]
Target = Annotated[Optional[str], typer.Option(
    metavar="POOL", help="align: a labeled pool (any kind POOL is) whose mean loss gradient each "
    "example's is aligned with.", show_default=False, rich_help_panel=STRATEGY)]
TopClasses = Annotated[Optional[int], typer.Option(
    metavar="K", help="egl: sum over the K most probable classes; 0 = all classes, exact. "
    "[default: 10 for models with more than 10 classes, else all]", rich_help_panel=STRATEGY)]
Task = Annotated[Optional[str], typer.Option(
    metavar="TASK", help="What one example's output is: auto (read from the model), "
    "classification, multilabel, segmentation, token-classification, regression, causal-lm, "
    "detection, keypoints or instance-segmentation. "
    "[default: auto]", rich_help_panel=MODEL)]
EglSamples = Annotated[Optional[str], typer.Option(
    metavar="S|pseudo", help="egl on multilabel, segmentation and token classification: S label "
    "sets drawn from the model's predictions per example (seeded), or pseudo (the predicted "
    "labels). [default: 8]", rich_help_panel=STRATEGY)]
Aggregate = Annotated[Optional[str], typer.Option(
    metavar="mean|max|top:Q", help="How per-position (per-label) entropy, margin and "
    "least-confidence make one score per example; top:Q = the mean of the top fraction Q. "
    "[default: mean]", rich_help_panel=STRATEGY)]
Temperature = Annotated[Optional[float], typer.Option(
    metavar="T", help="causal-lm egl: the temperature completions are sampled at (seeded). "
    "[default: 1.0]", rich_help_panel=STRATEGY)]
MaxNewTokens = Annotated[Optional[int], typer.Option(
    metavar="N", help="causal-lm egl: tokens per sampled completion, at most (it stops at the "
    "end-of-text token). [default: 32]", rich_help_panel=STRATEGY)]
BoxThreshold = Annotated[Optional[float], typer.Option(
    metavar="P", help="Detection: predicted boxes scoring at least P are the pseudo-labels of "
    "gradnorm and loss, and the table's boxes. [default: 0.5]", rich_help_panel=STRATEGY)]
Decode = Annotated[Optional[str], typer.Option(
    metavar="cpu|gpu", help="Where JPEG images are decoded: by PIL in the loader (cpu), or as "
    "file bytes decoded, resized and cropped on the device (gpu: nvJPEG on CUDA). [default: cpu]",
    rich_help_panel=PERFORMANCE)]
Precision = Annotated[Optional[str], typer.Option(
    metavar="fp32|bf16|fp16", help="The model's forward under autocast; norms add up in float32 "
    "or better. [default: fp32]", rich_help_panel=PERFORMANCE)]
Layers = Annotated[Optional[List[str]], typer.Option(
    metavar="PATTERN", help="Restrict gradient strategies to these modules (repeatable; e.g. fc, "
    "'layer4.*'; 'alcli inspect' lists the names).", rich_help_panel=STRATEGY)]
Method = Annotated[Optional[str], typer.Option(
    metavar="NAME", help="Engine method: auto, ghost, replicate, vmap or loop. [default: auto]",
    rich_help_panel=PERFORMANCE)]
Compile = Annotated[bool, typer.Option(
    "--compile", help="Run the ghost method's layer rules as one torch.compile'd graph (CUDA graphs "
    "on CUDA), compiled once per model and input shape: seconds on the first batch, then faster "
    "for small models (docs/scores.md, 'Compiled rules').", rich_help_panel=PERFORMANCE)]
BatchSize = Annotated[Optional[int], typer.Option(
    "--batch-size", "-b", metavar="N", help="Examples per batch. [default: 64]",
    rich_help_panel=PERFORMANCE)]
Device = Annotated[Optional[str], typer.Option(
    metavar="DEVICE", help="auto (CUDA when there is one), cpu, cuda, cuda:N or mps. "
    "[default: auto]", rich_help_panel=PERFORMANCE)]
Workers = Annotated[Optional[int], typer.Option(
    "--workers", "-j", metavar="N", help="Data-loading worker processes. [default: 0 on the CPU, "
    "the CPU count (at most 8) on CUDA]", rich_help_panel=PERFORMANCE)]
Seed = Annotated[Optional[int], typer.Option(
    metavar="N", help="Seed for the random strategy and for select --diverse. [default: 0]",
    rich_help_panel=STRATEGY)]
Output = Annotated[Optional[str], typer.Option(
    "--output", "-o", metavar="FILE", help="Output file, or - for stdout. [default: stdout, or "
    "scores.csv when stdout is a terminal]", rich_help_panel=OUTPUT)]
SelectOutput = Annotated[Optional[str], typer.Option(
    "--output", "-o", metavar="FILE", help="Output file, or - for stdout. [default: stdout]",
    rich_help_panel=OUTPUT)]
TableFormat = Annotated[Optional[str], typer.Option(
    "--format", "-f", metavar="FORMAT", help="csv (the default), jsonl, paths (one image file per "
    "line) or ids (one id per line); with -0, paths and ids end in NUL.", rich_help_panel=OUTPUT)]
SelectFormat = Annotated[Optional[str], typer.Option(
    "--format", "-f", metavar="FORMAT", help="csv (the default), jsonl, paths (one image file per "
    "line), ids (one id per line), labelstudio (Label Studio tasks JSON), or, for detection and "
    "keypoints, coco (a COCO JSON) or yolo (a folder: -o DIR); with -0, paths and ids end in NUL.",
    rich_help_panel=OUTPUT)]
Quiet = Annotated[bool, typer.Option("--quiet", "-q", help="No progress and no summary on "
                                     "stderr; warnings and errors still.",
    rich_help_panel=MESSAGES)]
Verbose = Annotated[bool, typer.Option("--verbose", "-v", help="Also say where each setting "
                                       "came from (default, config key or flag).",
    rich_help_panel=MESSAGES)]
LogFormat = Annotated[Optional[str], typer.Option(
    "--log-format", metavar="text|json", help="Progress lines, warnings and the summary on stderr "
    "as text (the default), or as one JSON object per line.", rich_help_panel=MESSAGES)]
ProgressEvery = Annotated[Optional[float], typer.Option(
    "--progress-every", metavar="SECONDS", help="Where stderr is not a terminal (a log file), one "
    "progress line every SECONDS (default 30).", rich_help_panel=MESSAGES)]
# selection (select only, except --embeddings which score writes and select reads)
WriteEmbeddings = Annotated[Optional[bool], typer.Option(
    "--embeddings/--no-embeddings", show_default=False,
    help="Write each example's BADGE embedding (the gradient at the last layer, factored) beside "
         "the table, as OUTPUT.emb.npz, for select's diverse batches. [default: when the whole "
         "pool goes to a file]", rich_help_panel=OUTPUT)]
ReadEmbeddings = Annotated[Optional[str], typer.Option(
    "--embeddings", metavar="FILE", help="The embeddings --diverse and the near-duplicate "
    "check read. [default: SCORES.emb.npz]", rich_help_panel=SELECTION)]
Diverse = Annotated[Optional[bool], typer.Option(
    "--diverse/--no-diverse", show_default=False,
    help="BADGE: k-means++ on gradient embeddings among the best scores, so the batch holds no "
         "near-duplicates. [default: when the table's embeddings are at hand (score writes them "
         "beside a table file), or with --pool]", rich_help_panel=SELECTION)]
DiverseCandidates = Annotated[Optional[str], typer.Option(
    "--diverse-candidates", metavar="M", help="--diverse picks among the M best-scoring examples "
    "(per class with --per-class), or 'all' for classic BADGE. [default: 10 x budget]",
    rich_help_panel=SELECTION)]
DiverseMode = Annotated[Optional[str], typer.Option(
    "--diverse-mode", metavar="badge|cluster-margin", help="How --diverse spreads the batch. "
    "badge: k-means++ on the gradient embeddings, O(candidates x budget) distance rows; "
    "cluster-margin (Citovsky et al. 2021): k-means of the candidates' penultimate features, "
    "then one row per cluster, smallest clusters first, for batches of any size. Implies "
    "--diverse. [default: badge]", rich_help_panel=SELECTION)]
DiverseClusters = Annotated[Optional[int], typer.Option(
    "--diverse-clusters", metavar="M", help="--diverse-mode cluster-margin: the number of "
    "clusters of the candidates. [default: the budget]", rich_help_panel=SELECTION)]
Sampling = Annotated[Optional[str], typer.Option(
    "--sampling", metavar="top|power|softmax", help="top: the best scores; power or softmax: a "
    "batch drawn from the scores, P ∝ score^β or exp(β score), seeded (Kirsch et al. 2023), for "
    "large batches at any pool size; not with --diverse. [default: top]",
    rich_help_panel=SELECTION)]
Typical = Annotated[bool, typer.Option(
    "--typical", help="Cold start (TypiClust): cluster the rows' embeddings into labeled + budget "
    "clusters and pick the most typical row of each of the largest clusters no --exclude'd "
    "(labeled) row is in; ignores the scores. For the first rounds: below about 6 labels per class "
    "it beat egl and margin on digits (docs/selection.md, cold start).", rich_help_panel=SELECTION)]
SamplingBeta = Annotated[Optional[float], typer.Option(
    "--sampling-beta", metavar="B", help="β of --sampling power/softmax: larger is closer to "
    "top. [default: 1]", rich_help_panel=SELECTION)]
PerClass = Annotated[Optional[str], typer.Option(
    "--per-class", metavar="MODE", help="proportional or equal: spread the budget over the "
    "predicted classes in proportion to their counts, or equally.", rich_help_panel=SELECTION)]
Dedup = Annotated[Optional[bool], typer.Option(
    "--dedup/--no-dedup", show_default=False,
    help="Pass over near-duplicates: no two in one batch, none of a labeled or --exclude'd "
         "example (cosine of the embeddings >= --dedup-threshold, or the same text). [default: "
         "on, when the table's embeddings are at hand]", rich_help_panel=SELECTION)]
DedupThreshold = Annotated[Optional[float], typer.Option(
    "--dedup-threshold", metavar="T", help="Cosine of two rows' embeddings at or above which they "
    "are near-duplicates. [default: 0.998]", rich_help_panel=SELECTION)]
Exclude = Annotated[Optional[List[str]], typer.Option(
    "--exclude", metavar="FILE", help="Never select the ids in FILE (.csv id column, .jsonl/"
                                      ".json ids, Label Studio's JSON, JSON-MIN, CSV and TSV "
                                      "exports, else one per line; repeatable).",
    rich_help_panel=SELECTION)]
FromName = Annotated[Optional[str], typer.Option(
    "--from-name", metavar="NAME", help="-f labelstudio, push, pull: the name of the control tag "
    "(Choices, RectangleLabels, ...) the pre-labels fill. [default: label]",
    rich_help_panel=LABELING)]
ToName = Annotated[Optional[str], typer.Option(
    "--to-name", metavar="NAME", help="-f labelstudio, push: the name of the Image or Text tag "
    "it labels. [default: image, or text for text pools]", rich_help_panel=LABELING)]
LabelStudioConfig = Annotated[Optional[str], typer.Option(
    "--labelstudio-config", metavar="XML", help="Also write the Label Studio labeling config "
    "the tasks' pre-labels fit (class names from the model or --class-names).",
    rich_help_panel=LABELING)]
Pairwise = Annotated[bool, typer.Option(
    "--pairwise", help="-f labelstudio, --labelstudio-config: each task a prompt and two "
    "completions the model sampled, for Label Studio's pairwise-preference template (a table "
    "that 'score -s egl' wrote for a causal language model: its prompt and completions columns).",
    rich_help_panel=LABELING)]
ScoreExclude = Annotated[Optional[List[str]], typer.Option(
    "--exclude", metavar="FILE", help="Skip the examples FILE names (labeled ones) before scoring: "
    "no row, not read (the files select --exclude reads; repeatable).", rich_help_panel=INPUT)]
# image transforms (image pools): each flag sets one key of the config's `transform`
Resize = Annotated[Optional[str], typer.Option(
    "--resize", metavar="N|HxW", help="Resize images: the shorter side to N, or to H x W.",
    rich_help_panel=IMAGES)]
CenterCrop = Annotated[Optional[str], typer.Option(
    "--center-crop", metavar="N|HxW", help="Then crop the center N x N, or H x W.",
    rich_help_panel=IMAGES)]
Grayscale = Annotated[Optional[bool], typer.Option(
    "--grayscale/--no-grayscale", show_default=False, help="Drop the colour first (then match "
    "the model's input channels).", rich_help_panel=IMAGES)]
Normalize = Annotated[Optional[str], typer.Option(
    "--normalize", metavar="MEAN/STD", help="Normalise pixels (0..1): imagenet, none, or "
    "per-channel numbers, e.g. 0.5,0.5,0.5/0.25,0.25,0.25.", rich_help_panel=IMAGES)]
ImageRoot = Annotated[Optional[str], typer.Option(
    "--image-root", metavar="URL", help="-f labelstudio, push: prefix ids with this URL or path "
                                        "in data.image.", rich_help_panel=LABELING)]
# a running Label Studio server (alcli push, alcli pull)
SERVER = "Label Studio server"
Url = Annotated[Optional[str], typer.Option(
    "--url", metavar="URL", envvar="LABEL_STUDIO_URL", show_default=False, show_envvar=False,
    help="The server, "
    "e.g. http://localhost:8080. [default: $LABEL_STUDIO_URL]", rich_help_panel=SERVER)]
Token = Annotated[Optional[str], typer.Option(
    "--token", metavar="TOKEN", envvar="LABEL_STUDIO_API_KEY", show_default=False,
    show_envvar=False, help="An access token of the server (Account & Settings), never printed; "
    "the environment keeps it out of the process list. [default: $LABEL_STUDIO_API_KEY]",
    rich_help_panel=SERVER)]
Project = Annotated[str, typer.Option(
    "--project", "-p", metavar="TITLE|ID", show_default=False, help="The project, by its title "
    "or id.", rich_help_panel=SERVER)]
ImageDir = Annotated[Optional[str], typer.Option(
    "--image-dir", metavar="DIR", help="--contact-sheet: the folder the image ids are relative to. "
    "[default: the config's pool]", rich_help_panel=LABELING)]
ContactSheet = Annotated[Optional[str], typer.Option(
    "--contact-sheet", metavar="PNG", help="Also draw the selected images (or texts) in one PNG "
                                           "grid with rank, id, score and predicted class under "
                                           "each.", rich_help_panel=LABELING)]

# long runs (score only)
CheckpointEvery = Annotated[Optional[str], typer.Option(
    "--checkpoint-every", metavar="N|TIME", help="Save finished rows to OUTPUT.partial at least "
    "every N examples or every TIME (30s, 5m, 1h), and on Ctrl-C/SIGTERM; a kill -9 loses at "
    "most that much. [default: 30s]", rich_help_panel=LONG_RUNS)]
Resume = Annotated[bool, typer.Option(
    "--resume", help="Continue the unfinished run whose rows are in OUTPUT.partial (same "
    "settings; for stdout, the partial file is under ./.alcli/).", rich_help_panel=LONG_RUNS)]
Restart = Annotated[bool, typer.Option(
    "--restart", help="Delete the partial file of an earlier unfinished run and start over.",
    rich_help_panel=LONG_RUNS)]
Strict = Annotated[bool, typer.Option(
    "--strict", help="Stop at the first unreadable example instead of skipping it (skipped ones "
                     "are listed in OUTPUT.errors.csv).", rich_help_panel=LONG_RUNS)]
Shard = Annotated[Optional[str], typer.Option(
    "--shard", metavar="K/N", help="Score shard K of N (K = 0..N-1; chosen by a hash of the id); "
                                   "combine the parts with 'alcli merge'.",
    rich_help_panel=LONG_RUNS)]
Null = Annotated[bool, typer.Option(
    "--null", "-0", help="NUL-separated records, as find -print0 writes and xargs -0 reads: image "
    "paths read from stdin (POOL -), and the output of -f paths and -f ids.",
    rich_help_panel=INPUT)]
NullOutput = Annotated[bool, typer.Option(
    "--null", "-0", help="-f paths and -f ids: end each record with NUL instead of a newline, "
    "for xargs -0.", rich_help_panel=OUTPUT)]

# How a pool is read, what model reads it, how it is scored and on what: every command that scores
# a pool with the user's model passes these through (score; simulate's rounds, which choose the
# strategy, the checkpoint, the seed and the pool themselves). tests/test_help.py checks that a
# command taking one of score's scoring options takes them all, declared as here.
SCORING = (LabelsFromFolders, ClassNames, TextColumnOpt, ImageColumn, IdColumn, LabelColumn, Split,
           Fps, Every,
           MaxLength, Arch, ArchKwargs, Ema, Trust, TrustRemoteCode, Task, TopClasses, EglSamples,
           Aggregate, Temperature, MaxNewTokens, BoxThreshold, Layers, Resize, CenterCrop, Grayscale, Normalize, BatchSize,
           Device, Workers, Precision, Decode, Method, Compile)

# alcli stop and alcli report: the stabilizing-predictions rule (alcli/selection/stopping.py)
STOPPING = "When to stop"
StopKappa = Annotated[Optional[float], typer.Option(
    "--kappa", metavar="K", help="Stop once the mean Cohen's kappa of consecutive rounds' "
    "predictions reaches K (0 < K <= 1). [default: 0.99]", rich_help_panel=STOPPING)]
StopWindow = Annotated[Optional[int], typer.Option(
    "--window", metavar="N", help="Average the last N kappas. [default: 3]",
    rich_help_panel=STOPPING)]

# select: batches priced in labeling cost (alcli/selection/cost.py)
Cost = Annotated[Optional[str], typer.Option(
    "--cost", metavar="NAME", help="Each row's labeling cost: a table column of numbers, or "
    "boxes (a detector's predicted boxes) or words (token classification's words); the batch is "
    "chosen by score per cost.", rich_help_panel=SELECTION)]
BudgetCost = Annotated[Optional[float], typer.Option(
    "--budget-cost", metavar="TOTAL", help="The batch's total --cost at most (with -n: both "
    "limits).", rich_help_panel=SELECTION)]
