"""Load a model from a checkpoint file.

Accepted: a plain state_dict; a dict nesting one under `state_dict`/`model`/... with a common key
prefix (`model.` from Lightning, `module.` from DDP, `_orig_mod.` from torch.compile); a TorchScript
archive; and a whole pickled model (`torch.save(model)`), only when trusted, because
unpickling runs code from the file. Everything else is loaded with `weights_only=True`.
Also: `.safetensors` weights (read with the safetensors package, never unpickled), timm training
checkpoints (`state_dict`, or `state_dict_ema` with `ema`), and Hugging Face `save_pretrained`
directories (files/hf.py).
"""
from __future__ import annotations

import argparse
import importlib
import os
import sys
import warnings
import zipfile
from pathlib import Path

import torch
from torch import nn

from ..errors import CheckpointError, first_line

NESTING_KEYS = ("state_dict", "model_state_dict", "model", "module", "net", "weights")
SHOW = 4  # how many offending keys an error lists


EMA_KEYS = ("state_dict_ema", "model_ema", "ema_state_dict", "ema")  # timm writes the first


def load_model(path: str | Path, *, arch: str | None = None, arch_kwargs: dict | None = None,
               trust: bool = False, ema: bool = False) -> nn.Module:
    """The model in `path`, built from `arch` when the file holds weights only; in eval mode.
    `ema`: the exponential moving average of the weights a training checkpoint also holds."""
    path = Path(path)
    if path.is_dir():
        from . import hf
        if not hf.is_model_dir(path):
            raise CheckpointError(f"model directory {path} holds no config.json; a directory must "
                                  f"be a Hugging Face save_pretrained directory")
        if arch is not None or ema:
            raise CheckpointError(f"model directory {path} is a Hugging Face model, which its "
                                  f"config.json describes; leave out {'--arch' if arch else '--ema'}")
        return hf.load_model(path)
    if not path.is_file():
        raise CheckpointError(f"model file {path} does not exist")
    if path.suffix.lower() == ".safetensors":
        return _from_safetensors(path, arch, arch_kwargs or {}, ema)
    archive = _archive_kind(path)
    if archive == "torchscript":
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # "torch.jit is deprecated"
            return torch.jit.load(str(path), map_location="cpu").eval()
    if archive == "export":
        raise CheckpointError(f"model file {path} is a torch.export archive, whose graph cannot "
                              f"be switched to eval mode or differentiated per example; save the "
                              f"model's state_dict and pass --arch instead")
    obj = _torch_load(path, trust)
    module = _find_module(obj)
    if module is not None:
        if ema:
            raise CheckpointError(f"--ema: model file {path} holds a whole model, not training "
                                  f"weights with an EMA copy")
        return module.eval()
    state = _ema_state_dict(obj, path) if ema else find_state_dict(obj)
    if state is None:
        keys = ", ".join(map(str, list(obj)[:SHOW])) if isinstance(obj, dict) else type(obj).__name__
        raise CheckpointError(f"model file {path} holds no state_dict or model (found: {keys})")
    if arch is None:
        raise CheckpointError(f"model file {path} holds weights only; give the architecture with "
                              f"--arch (torchvision:NAME or package.module:callable)")
    model = build_arch(arch, arch_kwargs or {})
    model.load_state_dict(fit_state_dict(model, state, path, arch))
    return model.eval()


def _from_safetensors(path: Path, arch: str | None, arch_kwargs: dict, ema: bool) -> nn.Module:
    try:
        from safetensors.torch import load_file  # optional: only .safetensors files need it
    except ImportError:
        raise CheckpointError(f"model file {path} is a .safetensors file, which needs the "
                              f"safetensors package; pip install 'alcli[hf]'") from None
    if ema:
        raise CheckpointError(f"--ema: model file {path} is a .safetensors file, which holds one "
                              f"set of weights")
    try:
        state = load_file(str(path), device="cpu")
    except Exception as err:  # noqa: BLE001 - a truncated or foreign file
        raise CheckpointError(f"model file {path} is not a readable .safetensors file "
                              f"({_described(err)})") from None
    if arch is None:
        raise CheckpointError(f"model file {path} holds weights only; give the architecture with "
                              f"--arch (torchvision:NAME, timm:NAME or package.module:callable)")
    model = build_arch(arch, arch_kwargs)
    model.load_state_dict(fit_state_dict(model, state, path, arch))
    return model.eval()


def _ema_state_dict(obj, path: Path) -> dict:
    """The EMA weights of a training checkpoint (timm's `state_dict_ema`)."""
    if isinstance(obj, dict):
        for key in EMA_KEYS:
            if _is_state_dict(obj.get(key)):
                return obj[key]
    keys = ", ".join(map(str, list(obj)[:SHOW])) if isinstance(obj, dict) else type(obj).__name__
    raise CheckpointError(f"--ema: model file {path} holds no EMA weights ({' or '.join(EMA_KEYS[:2])}; "
                          f"found: {keys})")


def _archive_kind(path: Path) -> str | None:
    """'torchscript' or 'export' for those zip archives, else None (a torch.save file)."""
    if not zipfile.is_zipfile(path):
        return None
    with zipfile.ZipFile(path) as zf:
        names = zf.namelist()
    if any(n.endswith("/constants.pkl") for n in names) and any("/code/" in n for n in names):
        return "torchscript"
    if any(n.endswith("/models/model.json") for n in names):
        return "export"
    return None


def _torch_load(path: Path, trust: bool):
    try:
        # timm's training checkpoints hold their argparse Namespace: plain data, safe to rebuild
        with torch.serialization.safe_globals([argparse.Namespace]):
            return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # noqa: BLE001 - torch raises many types for a bad file
        refused = "Weights only load failed" in str(err)
        if refused and not trust:
            raise CheckpointError(
                f"model file {path} holds a pickled Python object, and unpickling it runs code from "
                f"the file; pass --trust-checkpoint if you trust where it came from") from None
        if not refused:
            raise CheckpointError(f"model file {path} is not a PyTorch checkpoint "
                                  f"({_not_torch_save(path) or _described(err)})") from None
    _cwd_importable()  # the pickled model's classes, like --arch, import from the working directory
    try:
        return torch.load(path, map_location="cpu", weights_only=False)
    except Exception as err:  # noqa: BLE001 - e.g. the pickled class cannot be imported
        raise CheckpointError(f"model file {path} could not be unpickled ({_described(err)})") from None


def _not_torch_save(path: Path) -> str | None:
    """Why the file cannot be a torch.save file (a zip archive, or an old-style pickle), in words;
    None when it starts like one."""
    with open(path, "rb") as f:
        head = f.read(64)
    if head.startswith(b"PK") or head.startswith(b"\x80"):
        return None
    if not head:
        return "the file is empty"
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError:
        return "it is neither a zip archive nor a pickle, as torch.save writes"
    first = text.splitlines()[0][:40] if text.strip() else ""
    return f"it is a text file, starting {first!r}; torch.save writes a zip archive"


def _described(err: BaseException) -> str:
    return f"{type(err).__name__}: {first_line(err)}" if str(err).strip() else type(err).__name__


def _find_module(obj) -> nn.Module | None:
    if isinstance(obj, nn.Module):
        return obj
    if isinstance(obj, dict):
        for key in NESTING_KEYS:
            if isinstance(obj.get(key), nn.Module):
                return obj[key]
    return None


def _is_state_dict(obj) -> bool:
    return (isinstance(obj, dict) and bool(obj)
            and all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in obj.items()))


def find_state_dict(obj) -> dict | None:
    """The tensor mapping in a checkpoint: the object itself, or nested under a usual key."""
    if _is_state_dict(obj):
        return obj
    if isinstance(obj, dict):
        for key in NESTING_KEYS:
            inner = obj.get(key)
            if _is_state_dict(inner):
                return inner
            if isinstance(inner, dict) and find_state_dict(inner) is not None:
                return find_state_dict(inner)
    return None


def _prefixes(keys) -> list[str]:
    """'' and every common dotted prefix up to three levels deep ('model.', 'model.module.')."""
    found = {""}
    for key in keys:
        parts = key.split(".")
        for depth in range(1, min(4, len(parts))):
            found.add(".".join(parts[:depth]) + ".")
    return sorted(found, key=len)


def fit_state_dict(model: nn.Module, state: dict, path: Path, arch: str) -> dict:
    """`state` with the prefix stripped that matches `model`'s keys; a clear error when none does."""
    expected = model.state_dict()
    best, best_hits = state, -1
    for prefix in _prefixes(state):
        sub = {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}
        hits = len(expected.keys() & sub.keys())
        if hits > best_hits:
            best, best_hits = sub, hits
    missing = [k for k in expected if k not in best]
    unexpected = [k for k in best if k not in expected]
    if missing or unexpected:
        parts = []
        if missing:
            parts.append("missing " + _some(missing))
        if unexpected:
            parts.append("unexpected " + _some(unexpected))
        raise CheckpointError(f"model file {path} does not fit arch '{arch}': {'; '.join(parts)}")
    wrong = [f"{k} is {list(v.shape)} in the file but {list(expected[k].shape)} in the model"
             for k, v in best.items() if v.shape != expected[k].shape]
    if wrong:
        more = f" (and {len(wrong) - 1} more)" if len(wrong) > 1 else ""
        raise CheckpointError(f"model file {path} does not fit arch '{arch}': {wrong[0]}{more}; "
                              f"check arch_kwargs (e.g. num_classes)")
    return best


def _some(keys: list[str]) -> str:
    shown = ", ".join(keys[:SHOW])
    return shown + (f" (and {len(keys) - SHOW} more)" if len(keys) > SHOW else "")


def build_arch(spec: str, kwargs: dict) -> nn.Module:
    """`torchvision:NAME` (built with weights=None, no download), `timm:NAME` (pretrained=False)
    or `package.module:callable`."""
    source, sep, name = spec.partition(":")
    if not sep or not source or not name:
        raise CheckpointError(f"arch '{spec}' must be torchvision:NAME, timm:NAME or "
                              f"package.module:callable")
    if source == "torchvision":
        import torchvision  # only for torchvision: archs; its import takes about 2 s
        if name not in torchvision.models.list_models():
            raise CheckpointError(f"arch '{spec}': torchvision has no model named '{name}'")
        factory = lambda **kw: torchvision.models.get_model(name, **{"weights": None, **kw})  # noqa: E731
    elif source == "timm":
        factory = _timm_factory(spec, name)
    else:
        factory = _import_callable(spec, source, name)
    try:
        model = factory(**kwargs)
    except Exception as err:  # noqa: BLE001 - user code can raise anything
        raise CheckpointError(f"arch '{spec}' could not be built with arch_kwargs {kwargs} "
                              f"({_described(err)})") from None
    if not isinstance(model, nn.Module):
        raise CheckpointError(f"arch '{spec}' returned a {type(model).__name__}, not a torch.nn.Module")
    return model


def _timm_factory(spec: str, name: str):
    try:
        import timm  # optional (the `vision` extra), and slow to import: only for timm: archs
    except ImportError:
        raise CheckpointError(f"arch '{spec}' needs the timm package; pip install 'alcli[vision]'") from None
    if not timm.is_model(name.split(".")[0]):  # NAME.TAG names pretrained weights
        raise CheckpointError(f"arch '{spec}': timm has no model named '{name}'")
    return lambda **kw: timm.create_model(name, **{"pretrained": False, **kw})


def _cwd_importable() -> None:
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)


def _import_callable(spec: str, module_name: str, attr: str):
    _cwd_importable()  # "a class or factory importable from the working directory"
    try:
        obj = importlib.import_module(module_name)
    except Exception as err:  # noqa: BLE001
        raise CheckpointError(f"arch '{spec}': cannot import module '{module_name}' "
                              f"({_described(err)})") from None
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise CheckpointError(f"arch '{spec}': module '{module_name}' has no attribute '{attr}'")
        obj = getattr(obj, part)
    if not callable(obj):
        raise CheckpointError(f"arch '{spec}' is not callable")
    return obj
