"""Typed settings: defaults < YAML config < command-line flags (or Python keyword arguments).

Every option has one key, the flag's long name with `_` for `-` (`--batch-size` -> `batch_size`).
Unknown keys and wrong types are errors that name the key and where it came from. Relative paths
in a config file are relative to the config file's folder (as a manifest's paths are relative to
the manifest); on the command line and in Python, to the working directory.
"""
from __future__ import annotations

import dataclasses
import difflib
import json
import math
import os
import re
import reprlib
import sys
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Callable

import yaml

from ..errors import ConfigError
from .remote import is_url

DEFAULT_CONFIG = Path("configs") / "default.yaml"  # used by the CLI when neither --config nor --model
FORMATS = ("csv", "jsonl", "paths", "ids", "labelstudio", "coco", "yolo")  # the last three: `select` only
LOG_FORMATS = ("text", "json")
# keys holding a file or folder: in a config file, relative to the config file's folder
PATH_KEYS = ("model", "pool", "output", "scores", "embeddings_file", "exclude", "image_dir",
             "contact_sheet", "class_names", "labelstudio_config", "target")
PER_CLASS_MODES = ("proportional", "equal")
DIVERSE_MODES = ("badge", "cluster-margin")  # select --diverse-mode (alcli.selection.choose)
SAMPLINGS = ("top", "power", "softmax")  # alcli.selection.sampling.SAMPLINGS; a test keeps them equal
# the names the strategy registry (alcli.score.strategies) and the engine (alcli.gradnorm.METHODS)
# define, listed here so that reading a config does not import torch; a test keeps them equal
STRATEGY_NAMES = ("egl", "gradnorm", "align", "loss", "entropy", "margin", "least-confidence",
                  "random", "uncertain-boxes", "review")
METHOD_NAMES = ("auto", "ghost", "replicate", "vmap", "loop")
PRECISIONS = ("fp32", "bf16", "fp16")
# the labeling tasks (alcli.tasks.TASKS, plus auto: read from the model); config is read before
# any model, and cannot import the task modules (they read pools: a cycle); a test keeps them equal
TASK_NAMES = ("auto", "classification", "multilabel", "segmentation", "token-classification",
              "regression", "causal-lm", "keypoints", "instance-segmentation", "detection")
DECODERS = ("cpu", "gpu")  # where image files are decoded: the loader's workers, or the device
DEVICE_RE = re.compile(r"^(auto|cpu|mps|cuda(:\d+)?)$")
MAX_SIDE = 4096  # pixels per side an image may be resized or cropped to (a model directory's
                 # image settings too): 100000 x 100000 would take tens of GB per image
# trust is given on the command line (or in Python) only: a config file is as untrusted as the
# checkpoint it names, so it cannot allow that checkpoint's code to run
TRUST_KEYS = ("trust_checkpoint", "trust_remote_code")
MAX_VALUES = 100_000  # values in a config with its YAML aliases expanded (an alias bomb has billions)


@dataclass
class Transform:
    """Image preprocessing, applied to image pools only (tensor pools are model inputs as they are)."""

    resize: int | list[int] | None = None       # shorter side to N, or [height, width]
    center_crop: int | list[int] | None = None  # N -> NxN, or [height, width]
    grayscale: bool = False                     # drop colour first (then match the model's channels)
    normalize: dict | None = None               # {mean: [...], std: [...]} per channel


@dataclass
class Settings:
    model: str | None = None
    arch: str | None = None
    arch_kwargs: dict = field(default_factory=dict)
    trust_checkpoint: bool = False        # run code that comes with the files: pickles, TorchScript,
                                          # an --arch module in the working directory (flag only)
    trust_remote_code: bool = False       # run a Hugging Face directory's own Python code (flag only)
    ema: bool = False                     # a training checkpoint's EMA weights (timm's state_dict_ema)
    pool: str | list[str] | None = None   # a path, '-' (stdin), or several image files
    null: bool = False                    # paths on stdin are NUL-separated (find -print0)
    text_column: str = "text"             # text pools (.csv/.jsonl): the column holding the text
    image_column: str | None = None       # table pools: the image column (default: image)
    id_column: str | None = None          # table pools: the id column (default: the row number)
    label_column: str | None = None       # table pools: the label column (default: label, if there)
    split: str | None = None              # Hugging Face DatasetDict pools: the split to score
    fps: float | None = None              # video pools: frames sampled per second
    every: int | None = None              # video pools: every N-th frame (default: every frame)
    max_length: int | None = None         # text pools: tokens kept per text (default: the model's limit)
    labels_from_folders: bool = False
    class_names: str | None = None        # a file naming the classes (one a line, or a JSON list)
    text_width: int = 200                 # text pools: characters of each text in the table; 0 = all
    transform: Transform = field(default_factory=Transform)
    task: str = "auto"               # what one example's output is (alcli.tasks); auto: read from the model
    strategy: str = "egl"
    target: str | None = None        # align: a labeled pool whose mean loss gradient rows align with
    top_classes: int | None = None   # egl: K most probable classes; 0 = all (exact); None = 10 at most
    egl_samples: int | str = 8       # egl on multilabel/segmentation/token tasks: S sampled label
                                     # sets, or "pseudo" (the predicted labels, one set)
    aggregate: str = "mean"          # per-position utilities -> one per example: mean | max | top:Q
    temperature: float = 1.0         # causal-lm egl: completions sampled at this temperature
    max_new_tokens: int = 32         # causal-lm egl: tokens per sampled completion, at most
    box_threshold: float = 0.5       # detection: predicted boxes at least this confident are the
                                     # pseudo-labels and the table's boxes
    layers: list[str] | None = None
    method: str = "auto"
    compile: bool = False  # the ghost method's rules as one torch.compile'd graph per input shape
    decode: str = "cpu"  # cpu: PIL in the DataLoader's workers; gpu: JPEG bytes decoded on the device
    precision: str = "fp32"  # fp32 | bf16 | fp16: autocast for the model's forward (the engine's rules stay float32)
    batch_size: int = 64
    device: str = "auto"
    workers: int | None = None  # None: 0 on the CPU, the CPU count (at most 8) on CUDA
    seed: int = 0
    output: str | None = None
    format: str = "csv"
    scores: str | None = None   # `select`: the ranked table to read
    budget: int | None = None   # `select`: how many to pick
    cost: str | None = None     # `select`: each row's labeling cost, a column or a measure (selection/cost.py)
    budget_cost: float | None = None  # `select`: the batch's total cost at most
    embeddings: bool | None = None        # `score`: also record each example's BADGE factors
                                          # (None: when the table goes to a file, in one process)
    embeddings_file: str | None = None    # where score writes them / select reads them
                                          # (default: TABLE.emb.npz beside the table)
    diverse: bool | None = None           # `select`: BADGE k-means++ among the best scores
                                          # (None: when the table's embeddings are at hand)
    diverse_candidates: int | str | None = None  # `select --diverse`: shortlist size or "all"
                                                 # (default 10 x budget)
    diverse_mode: str = "badge"           # `select`: badge | cluster-margin (cluster_margin.py)
    diverse_clusters: int | None = None   # `select --diverse-mode cluster-margin`: clusters
                                          # (default: the budget)
    per_class: str | None = None          # `select`: proportional | equal quotas per predicted class
    sampling: str = "top"                 # `select`: top | power | softmax (alcli.selection.sampling)
    dedup: bool = True                    # `select`: pass over near-duplicates (selection/duplicates.py)
    dedup_threshold: float = 0.998        # ... the cosine at or above which rows are (measured:
                                          # benchmarks/duplicates.py)
    typical: bool = False                 # `select`: TypiClust cold start (alcli.selection.typical)
    sampling_beta: float = 1.0            # `select`: β of power / softmax sampling
    exclude: list[str] | None = None      # `select`: files of ids never to select
    image_root: str | None = None         # `select -f labelstudio`: URL/path prefix for data.image
    image_dir: str | None = None          # `select --contact-sheet`: folder the image ids are under
    from_name: str | None = None          # `select -f labelstudio`: the Choices tag of the prediction
    to_name: str | None = None            # ... and the object tag it labels (default: image or text)
    contact_sheet: str | None = None      # `select`: PNG grid of the selected images
    labelstudio_config: str | None = None  # `select`: the Label Studio labeling config (XML) written
    pairwise: bool = False                # `select -f labelstudio`: a prompt and two completions a task
    # long runs (`score`): OUTPUT.partial flushed every N examples, resume it, shards, bad examples
    checkpoint_every: int | str = "30s"   # OUTPUT.partial saved every N examples or a duration
    resume: bool = False
    restart: bool = False                 # discard OUTPUT.partial of an earlier run first
    strict: bool = False                  # an unreadable example stops the run instead of being skipped
    shard: str | None = None              # "K/N": score shard K (0-based) of N, by a hash of the id
    quiet: bool = False
    verbose: bool = False
    progress_every: float = 30.0          # seconds between progress lines when stderr is no terminal
    log_format: str = "text"              # text | json: progress lines, warnings and the summary
    # where each non-default value came from, for error messages: key -> "--flag" or "key 'x' in F"
    sources: dict = field(default_factory=dict, repr=False, compare=False)
    # not a setting: True when the Python API made these settings, whose messages then name
    # keyword arguments (`model=`), not flags (`--model`)
    from_api = False
    config_file = None  # not a setting either: the YAML file read, if any (an input)

    def where(self, key: str) -> str:
        """Where the setting came from: "key 'k' in FILE", "option --flag" or "argument k="."""
        return self.sources.get(key, f"argument {key}=" if self.from_api else f"option {flag(key)}")

    def option(self, key: str, value: str) -> str:
        """How to give the setting: `--flag VALUE` on the command line, `key=VALUE` in the API."""
        return f"{key}={value}" if self.from_api else f"{flag(key)} {value}"


KEYS = tuple(f.name for f in fields(Settings) if f.name != "sources")
FLAGS = {"embeddings_file": "--embeddings"}  # keys whose flag is not --key-with-dashes


def flag(key: str) -> str:
    """The command-line flag of a setting."""
    return FLAGS.get(key, f"--{key.replace('_', '-')}")


# --- value checks: each takes the raw value and returns the typed one or raises ValueError(what) ---

def _str(v):
    if isinstance(v, (str, Path)):
        return str(v)
    raise ValueError("must be a string")


def _opt_str(v):
    return None if v is None else _str(v)


def _pool(v):
    if isinstance(v, (list, tuple)):
        if not v or not all(isinstance(p, (str, Path)) and str(p) for p in v):
            raise ValueError("must be a path or a list of image files")
        return [str(p) for p in v] if len(v) > 1 else str(v[0])
    return _opt_str(v)


def _bool(v):
    if isinstance(v, bool):
        return v
    raise ValueError("must be true or false")


def _int(minimum: int, maximum: int = sys.maxsize) -> Callable[[Any], int]:
    def check(v):
        if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
            raise ValueError(f"must be an integer >= {minimum}")
        if v > maximum:
            raise ValueError(f"must be an integer <= {maximum}")
        return v
    return check


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity), else the machine's count."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def _workers(v):
    """Data-loading processes: more than the CPUs cannot load faster, and 100000 forks until the
    system refuses."""
    v = _int(0)(v)
    if v > usable_cpus():
        raise ValueError(f"must be at most the {usable_cpus()} CPUs this process may use")
    return v


def _seconds(v):
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v < float("inf"):
        raise ValueError("must be a number of seconds >= 0")
    return float(v)


def _opt(check):
    return lambda v: None if v is None else check(v)


def _choice(names):
    def check(v):
        if v not in names:
            raise ValueError(f"must be one of {', '.join(names)}")
        return v
    return check


def _device(v):
    if not isinstance(v, str) or not DEVICE_RE.match(v):
        raise ValueError("must be auto, cpu, cuda, cuda:N or mps")
    return v


def _candidates(v):
    """The diverse shortlist: a count, or "all" (classic BADGE over the whole pool)."""
    if v is None or v == "all":
        return v
    if isinstance(v, str) and v.isdigit():
        v = int(v)
    return _int(1)(v) if isinstance(v, int) else _choice(("all", "an integer >= 1"))(v)


DURATION = re.compile(r"(\d+(?:\.\d+)?)\s*(ms|s|sec|m|min|h)")
SECONDS = {"ms": 0.001, "s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600}


def _checkpoint(v):
    """A number of examples (2048, "2048") or a duration ("30s", "5m", "1h", "500ms")."""
    if isinstance(v, str) and v.strip().isdigit():
        v = int(v.strip())
    if isinstance(v, int) and not isinstance(v, bool) and v >= 1:
        return v
    if isinstance(v, str) and DURATION.fullmatch(v.strip()) and duration_seconds(v) > 0:
        return v.strip()
    raise ValueError("must be a number of examples (e.g. 2048) or a duration (e.g. 30s, 5m, 1h)")


def duration_seconds(text: str) -> float:
    """"30s" -> 30.0, "5m" -> 300.0 (a string `_checkpoint` accepted)."""
    number, unit = DURATION.fullmatch(text.strip()).groups()
    return float(number) * SECONDS[unit]


def _egl_samples(v):
    """S label sets drawn per example (an integer >= 1), or "pseudo"."""
    if isinstance(v, str) and v.strip().isdigit():
        v = int(v)
    if v == "pseudo":
        return v
    if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= 4096:
        raise ValueError("must be an integer from 1 to 4096, or pseudo")
    return v


def _aggregate(v):
    """How per-position (or per-label) utilities make one per example: mean, max, or top:Q, the
    mean of the top fraction Q (0 < Q <= 1) of the example's positions."""
    what = "must be mean, max or top:Q with 0 < Q <= 1 (e.g. top:0.1)"
    if v in ("mean", "max"):
        return v
    m = re.match(r"^top:(\d*\.?\d+)$", v.strip()) if isinstance(v, str) else None
    if not m or not 0 < float(m.group(1)) <= 1:
        raise ValueError(what)
    return f"top:{float(m.group(1)):g}"


def _number_in(low: float, high: float, *, low_allowed: bool, what: str):
    """A finite number (or its text) from `low` (itself only if `low_allowed`) to `high`."""
    def check(v):
        if isinstance(v, str):
            try:
                v = float(v)
            except ValueError:
                pass
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or \
                not (low <= v if low_allowed else low < v) or v > high:
            raise ValueError(f"must be a number {what}")
        return float(v)
    return check


_positive = _number_in(0, math.inf, low_allowed=False, what="above 0")
_probability = _number_in(0, 1, low_allowed=True, what="from 0 to 1")


def _mapping(v):
    if isinstance(v, str):  # --arch-kwargs '{"num_classes": 10}'
        try:
            v = json.loads(v)
        except json.JSONDecodeError as err:
            raise ValueError(f"must be a JSON mapping ({err.msg} at character {err.pos})") from None
    if not isinstance(v, dict) or not all(isinstance(k, str) for k in v):
        raise ValueError("must be a mapping of names to values")
    return dict(v)


def _layers(v):
    if v is None:
        return None
    if isinstance(v, str):
        v = [v]
    if not isinstance(v, (list, tuple)) or not v or not all(isinstance(p, str) and p for p in v):
        raise ValueError("must be a module-name pattern or a list of them")
    return list(v)


def _files(v):
    if v is None:
        return None
    if isinstance(v, (str, Path)):
        v = [v]
    if not isinstance(v, (list, tuple)) or not all(isinstance(f, (str, Path)) and str(f) for f in v):
        raise ValueError("must be a file path or a list of them")
    return [str(f) for f in v] or None


def _shard(v):
    if v is None:
        return None
    m = re.match(r"^(\d+)/(\d+)$", str(v).strip()) if isinstance(v, str) else None
    if not m or int(m.group(2)) < 1 or int(m.group(1)) >= int(m.group(2)):
        raise ValueError("must be K/N with 0 <= K < N (shards are numbered from 0)")
    return f"{int(m.group(1))}/{int(m.group(2))}"


def _size(v):
    if v is None:
        return None
    sides = v if isinstance(v, (list, tuple)) and len(v) == 2 else [v]
    if not all(isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in sides):
        raise ValueError("must be a positive integer or [height, width]")
    if max(sides) > MAX_SIDE:
        raise ValueError(f"must be at most {MAX_SIDE} pixels per side")
    return list(v) if isinstance(v, (list, tuple)) else v


def _numbers(v):
    if (isinstance(v, (list, tuple)) and v
            and all(isinstance(n, (int, float)) and not isinstance(n, bool) for n in v)):
        return [float(n) for n in v]
    raise ValueError("must be a list of numbers")


def _transform(v):
    if isinstance(v, Transform):
        return v
    if v is None:
        return Transform()
    if not isinstance(v, dict):
        raise ValueError("must be a mapping with keys resize, center_crop, grayscale, normalize")
    checks = {"resize": _size, "center_crop": _size, "grayscale": _bool, "normalize": _normalize}
    out = {}
    for key, value in v.items():
        if key not in checks:
            raise ValueError(f"has unknown key '{key}' (known: {', '.join(checks)})")
        try:
            out[key] = checks[key](value)
        except ValueError as err:
            raise _SubKeyError(key, value, str(err)) from None
    return Transform(**out)


class _SubKeyError(ValueError):
    """A nested key (`transform.resize`) has a bad value."""

    def __init__(self, key, value, what):
        super().__init__(what)
        self.key, self.value = key, value


def _normalize(v):
    if v is None:
        return None
    if not isinstance(v, dict) or set(v) != {"mean", "std"}:
        raise ValueError("must be a mapping with exactly mean and std")
    mean, std = _numbers(v["mean"]), _numbers(v["std"])
    if len(mean) != len(std):
        raise ValueError("must have as many mean values as std values")
    if any(s <= 0 for s in std):
        raise ValueError("must have positive std values")
    return {"mean": mean, "std": std}


IMAGENET = {"mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225]}  # --normalize imagenet


def _size_flag(v):
    """--resize / --center-crop: N or HxW."""
    m = re.match(r"^\s*(\d+)\s*(?:[xX]\s*(\d+)\s*)?$", v) if isinstance(v, str) else None
    if not m or int(m.group(1)) < 1 or (m.group(2) is not None and int(m.group(2)) < 1):
        raise ValueError("must be N or HxW, positive integers (e.g. 224 or 256x320)")
    return int(m.group(1)) if m.group(2) is None else [int(m.group(1)), int(m.group(2))]


def _normalize_flag(v):
    """--normalize: imagenet, none, or MEAN/STD with comma-separated numbers per channel."""
    what = ("must be imagenet, none, or MEAN/STD with one number per channel on each side (e.g. "
            "0.5,0.5,0.5/0.25,0.25,0.25)")
    name = v.strip().lower() if isinstance(v, str) else None
    if name in ("imagenet", "none"):
        return _normalize(IMAGENET) if name == "imagenet" else None
    halves = v.split("/") if isinstance(v, str) else []
    try:
        mean, std = ([float(x) for x in half.split(",")] for half in halves)
    except ValueError:
        raise ValueError(what) from None
    if not all(map(math.isfinite, mean + std)):
        raise ValueError(what)
    return _normalize({"mean": mean, "std": std})


# flags that each set one key of `transform`, over the config's transform
TRANSFORM_FLAGS: dict[str, Callable[[Any], Any]] = {
    "resize": _size_flag, "center_crop": _size_flag, "grayscale": _bool,
    "normalize": _normalize_flag}


def _apply_transform_flags(settings: Settings, values: dict) -> None:
    """--resize, --center-crop, --grayscale, --normalize: each replaces its key of the transform."""
    changes = {}
    for key, value in values.items():
        try:
            changes[key] = TRANSFORM_FLAGS[key](value)
        except ValueError as err:
            raise ConfigError(f"option {flag(key)} {err}, got {value!r}") from None
    settings.transform = dataclasses.replace(settings.transform, **changes)
    given = f"option{'s' if len(values) > 1 else ''} {', '.join(map(flag, values))}"
    before = settings.sources.get("transform")
    settings.sources["transform"] = f"{before} and {given}" if before else given


CHECKS: dict[str, Callable[[Any], Any]] = {
    "model": _opt_str, "arch": _opt_str, "arch_kwargs": _mapping, "trust_checkpoint": _bool,
    "trust_remote_code": _bool,
    "pool": _pool, "null": _bool, "labels_from_folders": _bool, "transform": _transform,
    "strategy": _choice(STRATEGY_NAMES), "target": _opt_str, "top_classes": _opt(_int(0)), "layers": _layers,
    "task": _choice(TASK_NAMES), "egl_samples": _egl_samples, "aggregate": _aggregate,
    "box_threshold": _probability, "temperature": _number_in(0, 100, low_allowed=False, what="above 0, at most 100"),
    "max_new_tokens": _int(1, 4096),
    "method": _choice(METHOD_NAMES), "compile": _bool, "precision": _choice(PRECISIONS), "decode": _choice(DECODERS), "batch_size": _int(1),
    "device": _device, "workers": _opt(_workers),
    "seed": _int(0), "output": _opt_str, "format": _choice(FORMATS), "scores": _opt_str,
    "budget": _opt(_int(1)), "quiet": _bool, "cost": _opt_str, "budget_cost": _opt(_positive),
    "embeddings": _opt(_bool), "embeddings_file": _opt_str, "diverse": _opt(_bool), "diverse_candidates": _candidates,
    "diverse_mode": _choice(DIVERSE_MODES), "diverse_clusters": _opt(_int(1)),
    "per_class": _opt(_choice(PER_CLASS_MODES)), "sampling": _choice(SAMPLINGS),
    "typical": _bool, "pairwise": _bool, "dedup": _bool,
    "dedup_threshold": _number_in(0, 1, low_allowed=False, what="above 0, at most 1"),    "sampling_beta": _positive, "exclude": _files, "image_root": _opt_str,
    "image_dir": _opt_str, "contact_sheet": _opt_str,
    "checkpoint_every": _checkpoint, "resume": _bool, "restart": _bool, "strict": _bool,
    "shard": _shard, "verbose": _bool, "progress_every": _seconds, "log_format": _choice(LOG_FORMATS),
    "ema": _bool, "text_column": _str, "max_length": _opt(_int(1)),
    "image_column": _opt_str, "id_column": _opt_str, "label_column": _opt_str, "split": _opt_str,
    "fps": _opt(_positive), "every": _opt(_int(1)),
    "class_names": _opt_str, "text_width": _int(0), "from_name": _opt_str, "to_name": _opt_str,
    "labelstudio_config": _opt_str,
}
assert set(CHECKS) == set(KEYS)


def read_yaml(path: str | Path) -> dict:
    """The mapping in a YAML config file; a missing file or bad YAML is a ConfigError."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist") from None
    except UnicodeDecodeError:
        raise ConfigError(f"config file {path} is not a text file (YAML)") from None
    except OSError as err:
        raise ConfigError(f"config file {path} cannot be read: {err.strerror}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        at = f" at line {mark.line + 1}" if mark else ""
        raise ConfigError(f"config file {path} is not valid YAML{at}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a mapping of keys to values")
    if _more_values_than(data, MAX_VALUES):
        raise ConfigError(f"config file {path} holds more than {MAX_VALUES} values once its YAML "
                          f"aliases are expanded; write the values out instead")
    return data


def _more_values_than(data, limit: int) -> bool:
    """Whether `data` holds more than `limit` values, each alias counted every time it is used
    (PyYAML shares an aliased object instead of copying it, so memory stays small until something
    walks or prints the whole); stops counting at the limit, also for a recursive alias."""
    stack, count = [data], 0
    while stack and count <= limit:
        value = stack.pop()
        count += 1
        if isinstance(value, dict):
            stack.extend(value.keys())
            stack.extend(value.values())
        elif isinstance(value, list):
            stack.extend(value)
    return count > limit


_SHORT = reprlib.Repr()
_SHORT.maxlevel, _SHORT.maxlist, _SHORT.maxdict, _SHORT.maxstring, _SHORT.maxother = 2, 4, 4, 40, 40


def shown(value, limit: int = 200) -> str:
    """A value from a config quoted inside one sentence: its repr, shortened to at most `limit`
    characters however large the value (a YAML alias bomb expands to millions)."""
    text = _SHORT.repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def _apply(settings: Settings, values: dict, source: Callable[[str], str]) -> None:
    for key, value in values.items():
        if key not in CHECKS:
            name = str(key) if len(str(key)) <= 60 else str(key)[:60] + "..."
            close = difflib.get_close_matches(name, KEYS, n=1)
            hint = f"did you mean '{close[0]}'?" if close else \
                "the settings are the long option names with _ for -, see 'alcli score --help'"
            raise ConfigError(f"{source(name)} is not a known setting; {hint}")
        try:
            setattr(settings, key, CHECKS[key](value))
        except _SubKeyError as err:
            raise ConfigError(f"{source(key + '.' + err.key)} {err}, got {shown(err.value)}") from None
        except ValueError as err:
            raise ConfigError(f"{source(key)} {err}, got {shown(value)}") from None
        settings.sources[key] = source(key)


def _relative_to(folder: Path, values: dict) -> dict:
    """The config's relative paths (PATH_KEYS) joined to the config file's folder; `-` (stdin or
    stdout) and absolute paths as they are. Values of the wrong type are left for the checks."""
    def join(v):
        if isinstance(v, str) and v and v != "-" and not Path(v).expanduser().is_absolute() \
                and not is_url(v):  # an object-store URL as it is
            return os.path.normpath(folder / v)  # configs/../data -> data
        return v
    out = dict(values)
    for key in PATH_KEYS:
        if key in out:
            v = out[key]
            out[key] = [join(f) for f in v] if isinstance(v, list) else join(v)
    return out


def _refuse_trust(values: dict, config) -> None:
    for key in TRUST_KEYS:
        if key in values:
            raise ConfigError(f"key '{key}' in {config}: trust is given on the command line only, "
                              f"never by a config file; pass {flag(key)} if you trust the files")


def load_settings(config: str | Path | None = None, overrides: dict | None = None, *,
                  flag_names: bool = True) -> Settings:
    """Defaults, then the YAML file `config`, then `overrides` (values of None are 'not given').

    `flag_names` words errors in `overrides` as command-line options (`option --batch-size`);
    the Python API passes False to name them as keyword arguments.
    """
    settings = Settings()
    if config is not None:
        settings.config_file = str(config)
        values = _relative_to(Path(config).parent, read_yaml(config))
        _refuse_trust(values, config)
        _apply(settings, values, lambda k: f"key '{k}' in {config}")
    given = {k: v for k, v in (overrides or {}).items() if v is not None}
    if flag_names:
        transform = {k: given.pop(k) for k in TRANSFORM_FLAGS if k in given}
        _apply(settings, given, lambda k: f"option {flag(k)}")
        if transform:
            _apply_transform_flags(settings, transform)
    else:
        settings.from_api = True
        _apply(settings, given, lambda k: f"argument {k}=")
    return settings
