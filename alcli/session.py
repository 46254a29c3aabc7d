"""What every command that runs the model needs first: the model loaded, on its device in eval
mode, and the pool opened and checked (see docs/architecture.md)."""
from __future__ import annotations

import contextlib
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import torch
from torch import nn

from .errors import CheckpointError, ConfigError, PoolError
from .files import hf, remote
from .files.checkpoint import load_model
from .files.classnames import id2label_names, read_class_names
from .files.config import Settings, Transform
from . import pools
from .pools import open_pool
from .pools.common import Pool, PoolOptions, names_source
from .pools.tensors import tensor_pool
from .gradnorm import select_params
from . import tasks
from .score import preflight
from .score.target import target_for


@dataclass
class Session:
    model: nn.Module      # on `device`, in eval mode
    device: torch.device
    pool: Pool            # opened and pre-flight checked


@contextlib.contextmanager
def opened(settings: Settings, model: nn.Module | None = None, pool=None, stdin=None,
           device_spec: str | None = None,
           narrow: Callable[[Pool], Pool] | None = None) -> Iterator[Session]:
    """The session for `settings` (`model` and `pool` may be given as objects instead); the
    model's training flags are restored on exit. `narrow` (score --exclude) takes examples out of
    the pool before the pre-flight checks read any."""
    if pool is None:
        check_pool_exists(settings)  # before the model: a mistyped pool is the first thing to say
    net = model_for(settings, model)
    device = resolve_device(device_spec or settings.device)
    if device.type == "cuda":  # TF32 matmuls under fp32; cuDNN picks kernels for the batch's fixed shapes
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = torch.backends.cudnn.benchmark = True
    modes = [(m, m.training) for m in net.modules()]
    try:
        net.to(device).eval()
        check_layers(net, settings.layers)
        the_pool = pool_for(settings, net, pool, stdin)
        if narrow is not None:
            the_pool = narrow(the_pool)
        the_pool.outputs = preflight.check(net, the_pool, settings, device)
        the_pool.align_target = target_for(settings, net, device, lambda s: checked_pool(s, net, device))
        yield Session(net, device, the_pool)
    finally:
        for m, mode in modes:
            m.training = mode


def checked_pool(settings: Settings, model: nn.Module, device: torch.device) -> Pool:
    """The pool `settings` name, opened and pre-flight checked as the run's own (align's target:
    a label outside the model's classes, inputs the model cannot read, a prompt without an
    answer, each one sentence naming it)."""
    the_pool = pool_for(settings, model)
    the_pool.outputs = preflight.check(model, the_pool, settings, device)
    return the_pool


def model_for(settings: Settings, model: nn.Module | None = None) -> nn.Module:
    """`model` when given as a module, else the checkpoint `settings.model` loaded."""
    if isinstance(model, nn.Module):
        return model
    if settings.model is None:
        raise ConfigError(f"no model given; pass {settings.option('model', 'PATH')} (or set model: "
                          f"in a config)")
    remote.sweep_stale_copies()  # remote checkpoints' copies that killed runs left behind
    path = settings.model
    if remote.is_url(path):  # copied once; longrun.job hashes the same copy
        path = remote.local_copy(path, CheckpointError)
    elif not Path(path).exists():
        raise CheckpointError(f"model file {settings.model}{from_config(settings, 'model')} does "
                              f"not exist")
    config_dir = Path(settings.config_file).parent if settings.config_file else None
    return load_model(path, arch=settings.arch, arch_kwargs=settings.arch_kwargs,
                      trust=settings.trust_checkpoint, ema=settings.ema,
                      trust_remote_code=settings.trust_remote_code, config_dir=config_dir)


def pool_for(settings: Settings, model: nn.Module, pool=None, stdin=None) -> Pool:
    """The pool object: given as data (a Pool, a tensor or array, or a tuple (x,), (x, y) or
    (x, y, ids)), or opened from `settings.pool`."""
    names, names_file = class_names_for(settings, model)
    if isinstance(pool, Pool):
        return named(pool, names, names_file)
    if pool is not None and not isinstance(pool, str):
        parts = pool if isinstance(pool, tuple) else (pool,)
        if not 1 <= len(parts) <= 3:
            raise PoolError(f"pool must be x, (x,), (x, y) or (x, y, ids): a tensor or array of "
                            f"inputs, optional integer labels and ids, not a tuple of {len(parts)}")
        return named(tensor_pool(*parts), names, names_file)
    if settings.pool is None:
        what = "pool=" if settings.from_api else "POOL:"
        raise ConfigError(f"no pool given; pass {what} a folder of images, a .csv/.jsonl manifest, "
                          f"a .pt/.npy/.npz tensor file, or - for image paths on stdin")
    task = settings.task if settings.task != "auto" else tasks.from_model(model) or "auto"
    tasks.check_model(task, model)  # before anything is said of the transform
    spec = tasks.TASKS.get(task)
    own_sizes = spec is not None and spec.sized_images  # a detector's images keep their sizes
    opts = PoolOptions(settings.labels_from_folders, settings.transform, model_channels(model),
                       settings.null, decode=settings.decode, class_names=names,
                       class_names_file=names_file, labels_as_given=spec is not None and spec.given_labels,
                       prompts=spec is not None and spec.reads_prompts)
    hf_options(opts, settings, model)
    if own_sizes:
        opts.transform = detector_transform(opts.transform, settings, spec.normalised_outside(model))
    check_pool_exists(settings)
    opened_pool = named(open_pool(settings.pool, opts, stdin), names, names_file)
    opened_pool.keeps_sizes = own_sizes
    if opened_pool.kind == "images" and opts.transform.normalize is None and not own_sizes:
        warn_unnormalised(settings, model)
    return opened_pool


def check_pool_exists(settings: Settings) -> None:
    """PoolError when the pool is a local path that does not exist (shards and URLs: each named in
    its own error)."""
    if pools.missing(settings.pool):
        raise PoolError(f"pool {settings.pool}{from_config(settings, 'pool')} does not exist")


def detector_transform(t: Transform, settings: Settings, normalised_outside: bool) -> Transform:
    """Detection: images at their own size (boxes are in the image's pixels); torchvision's
    detectors resize and normalise them themselves, a Hugging Face detector takes them normalised
    (its processor's or the config's mean and std). A configured resize or crop, or a normalize
    torchvision's would apply twice, is left out with a warning."""
    unused = [k for k in ("resize", "center_crop", "normalize")
              if getattr(t, k) is not None and not (k == "normalize" and normalised_outside)]
    if unused and "transform" in settings.sources:  # a processor's resize is left out unsaid
        warnings.warn(f"transform.{', transform.'.join(unused)} ({settings.where('transform')}) "
                      f"is not applied for detection: images keep their own size"
                      f"{'' if normalised_outside else ', and the detector normalises them itself'}")
    return Transform(grayscale=t.grayscale, normalize=t.normalize if normalised_outside else None)


def class_names_for(settings: Settings, model: nn.Module) -> tuple[list[str] | None, str | None]:
    """(the class names, the file they came from): the --class-names file, else the model's
    id2label (file None); (None, None) when neither names the classes."""
    if settings.class_names:
        names = read_class_names(settings.class_names, settings.where("class_names"))
        return names, settings.class_names
    return id2label_names(model), None


def named(pool: Pool, names: list[str] | None, names_file: str | None) -> Pool:
    """The pool with the class names, unless its own (class folders) name them already."""
    if names is not None and pool.classes is None:
        pool.classes, pool.classes_from = names, names_source(names_file)
    return pool


PRETRAINED_LIBRARIES = ("torchvision", "timm")  # their models are trained on normalised images


def warn_unnormalised(settings: Settings, model: nn.Module) -> None:
    """A warning when a torchvision, timm or Hugging Face image model gets raw 0..1 pixels (no
    transform.normalize configured, and no image processor mean/std): its predictions would be
    off without a word."""
    library = type(model).__module__.split(".")[0]
    if isinstance(settings.arch, str) and settings.arch.split(":")[0] in PRETRAINED_LIBRARIES:
        name = settings.arch
    elif library in PRETRAINED_LIBRARIES:
        name = f"a {library} {type(model).__name__}"
    elif hf.model_dir(model, settings.model) is not None:
        name = f"the Hugging Face model {hf.model_dir(model, settings.model)}"
    else:
        return
    fix = ("set transform={'normalize': {'mean': [...], 'std': [...]}} (ImageNet's: mean [0.485, "
           "0.456, 0.406], std [0.229, 0.224, 0.225])" if settings.from_api else
           "pass --normalize imagenet (or MEAN/STD) or set transform.normalize in the config")
    warnings.warn(f"the model is {name}, usually trained on normalised images, but no "
                  f"transform.normalize is configured, so it gets pixels in 0..1; {fix}",
                  stacklevel=2)


def from_config(settings: Settings, key: str) -> str:
    """' (key 'model' in cfg.yaml)' when the value came from a config file, else ''."""
    where = settings.sources.get(key, "")
    return f" ({where})" if where.startswith("key ") else ""


def hf_options(opts: PoolOptions, settings: Settings, model: nn.Module) -> None:
    """For a Hugging Face model directory (the --model one, or the one a model object was loaded
    from): its tokenizer for text pools, and its image processor settings for image pools unless
    the config sets a transform."""
    opts.text_column = settings.text_column
    opts.image_column, opts.id_column = settings.image_column, settings.id_column
    opts.label_column, opts.split = settings.label_column, settings.split
    opts.fps, opts.every = settings.fps, settings.every
    directory = hf.model_dir(model, settings.model)
    if directory is None:
        return
    opts.tokenizer = lambda: hf.tokenizer_for(directory, model, settings.max_length,
                                              settings.trust_remote_code)
    if "transform" not in settings.sources:
        transform = hf.image_transform(directory)
        if transform is not None:
            opts.transform = transform


def resolve_device(spec: str) -> torch.device:
    """`auto` prefers CUDA, then MPS, then the CPU; an unavailable device is an error."""
    mps = getattr(torch.backends, "mps", None)
    mps_ok = bool(mps and mps.is_available())
    if spec == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "mps" if mps_ok else "cpu")
    device = torch.device(spec)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(f"--device {spec}: CUDA is not available on this machine")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ConfigError(f"--device {spec}: this machine has {torch.cuda.device_count()} CUDA devices")
    if device.type == "mps" and not mps_ok:
        raise ConfigError(f"--device {spec}: MPS is not available on this machine")
    return device


def model_channels(model: nn.Module) -> int | None:
    """Input channels of the model's first convolution (what images are converted to), if any."""
    conv_names = ("Conv1d", "Conv2d", "Conv3d")
    for module in model.modules():
        if (isinstance(module, nn.modules.conv._ConvNd)
                or getattr(module, "original_name", None) in conv_names):  # TorchScript modules
            channels = getattr(module, "in_channels", None)
            if isinstance(channels, int):
                return channels
    return None


def check_layers(model: nn.Module, layers: list[str] | None) -> None:
    """Fail before any work when a --layers pattern selects nothing."""
    if layers is None:
        return
    try:
        select_params(model, layers)
    except ValueError as err:
        names = [n for n, m in model.named_modules() if n and any(True for _ in m.parameters(False))]
        shown = ", ".join(names[:8]) + (f", ... ({len(names)} in all)" if len(names) > 8 else "")
        raise ConfigError(f"{err}; modules with parameters: {shown or '(none)'}; 'alcli inspect' "
                          f"lists them all with their rules") from None
