"""What every command that runs the model needs first: the model loaded, on its device in eval
mode, and the pool opened and checked (see docs/architecture.md)."""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Iterator

import torch
from torch import nn

from .errors import ConfigError
from .files.checkpoint import load_model
from .files.config import Settings
from .files.pool import Pool, PoolOptions, open_pool, tensor_pool
from .gradnorm import select_params
from .score import preflight


@dataclass
class Session:
    model: nn.Module      # on `device`, in eval mode
    device: torch.device
    pool: Pool            # opened and pre-flight checked


@contextlib.contextmanager
def opened(settings: Settings, model: nn.Module | None = None, pool=None, stdin=None,
           device_spec: str | None = None) -> Iterator[Session]:
    """The session for `settings` (`model` and `pool` may be given as objects instead); the
    model's training flags are restored on exit."""
    net = model_for(settings, model)
    device = resolve_device(device_spec or settings.device)
    if device.type == "cuda":  # TF32 matmuls under fp32; cuDNN picks kernels for the batch's fixed shapes
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = torch.backends.cudnn.benchmark = True
    modes = [(m, m.training) for m in net.modules()]
    try:
        net.to(device).eval()
        check_layers(net, settings.layers)
        the_pool = pool_for(settings, net, pool, stdin)
        preflight.check(net, the_pool, settings, device)
        yield Session(net, device, the_pool)
    finally:
        for m, mode in modes:
            m.training = mode


def model_for(settings: Settings, model: nn.Module | None = None) -> nn.Module:
    """`model` when given as a module, else the checkpoint `settings.model` loaded."""
    if isinstance(model, nn.Module):
        return model
    if settings.model is None:
        raise ConfigError(f"no model given; pass {settings.option('model', 'PATH')} (or set model: "
                          f"in a config)")
    return load_model(settings.model, arch=settings.arch, arch_kwargs=settings.arch_kwargs,
                      trust=settings.trust_checkpoint)


def pool_for(settings: Settings, model: nn.Module, pool=None, stdin=None) -> Pool:
    """The pool object: given as data (a Pool, a tensor or array, or a tuple (x,), (x, y) or
    (x, y, ids)), or opened from `settings.pool`."""
    if isinstance(pool, Pool):
        return pool
    if isinstance(pool, tuple) and 1 <= len(pool) <= 3:
        return tensor_pool(*pool)
    if pool is not None and not isinstance(pool, str):
        return tensor_pool(pool)
    if settings.pool is None:
        what = "pool=" if settings.from_api else "POOL:"
        raise ConfigError(f"no pool given; pass {what} a folder of images, a .csv/.jsonl manifest, "
                          f"a .pt/.npy/.npz tensor file, or - for image paths on stdin")
    opts = PoolOptions(settings.labels_from_folders, settings.transform, model_channels(model))
    return open_pool(settings.pool, opts, stdin)


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
        raise ConfigError(str(err)) from None
