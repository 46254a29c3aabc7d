"""Load a model from a checkpoint file.

Accepted: a plain state_dict; a dict nesting one under `state_dict`/`model`/... with a common key
prefix (`model.` from Lightning, `module.` from DDP, `_orig_mod.` from torch.compile); and, only
when trusted (`trust`, the --trust-checkpoint flag), a TorchScript archive, whose own code runs
with the model, and a whole pickled model (`torch.save(model)`), because unpickling runs code from
the file. Everything else is loaded with `weights_only=True`, after the zip archive's CRCs are
checked. Also: `.safetensors` weights (read with the safetensors package, never unpickled), timm
training checkpoints (`state_dict`, or `state_dict_ema` with `ema`), and Hugging Face
`save_pretrained` directories (files/hf.py).

An --arch `module:callable` is imported without trust only when the module comes from the
environment (site-packages, PYTHONPATH) or is alcli's own; a module that is a file or package in
the working directory or in the config's folder is code that came with the files (_local_code).
"""
from __future__ import annotations

import argparse
import difflib
import importlib
import importlib.util
import inspect
import os
import sys
import warnings
import zipfile
from pathlib import Path

import torch
from torch import nn

from ..errors import CheckpointError, first_line, torchvision_mismatch
from .config import shown

NESTING_KEYS = ("state_dict", "model_state_dict", "model", "module", "net", "weights")
SHOW = 4  # how many offending keys an error lists


EMA_KEYS = ("state_dict_ema", "model_ema", "ema_state_dict", "ema")  # timm writes the first


def load_model(path: str | Path, *, arch: str | None = None, arch_kwargs: dict | None = None,
               trust: bool = False, ema: bool = False, trust_remote_code: bool = False,
               config_dir: str | Path | None = None) -> nn.Module:
    """The model in `path`, built from `arch` when the file holds weights only; in eval mode.
    `ema`: the exponential moving average of the weights a training checkpoint also holds.
    `trust`: run code that comes with the files (pickles, TorchScript, an --arch module in the
    working directory or `config_dir`); `trust_remote_code`: a Hugging Face directory's own code."""
    path = Path(path)
    if path.is_dir():
        from . import hf
        if not hf.is_model_dir(path):
            raise CheckpointError(f"model directory {path} holds no config.json; a directory must "
                                  f"be a Hugging Face save_pretrained directory")
        if arch is not None or ema:
            raise CheckpointError(f"model directory {path} is a Hugging Face model, which its "
                                  f"config.json describes; leave out {'--arch' if arch else '--ema'}")
        return hf.load_model(path, trust_remote_code)
    if not path.is_file():
        raise CheckpointError(f"model file {path} does not exist")
    build = lambda: build_arch(arch, arch_kwargs or {}, trust=trust, config_dir=config_dir)  # noqa: E731
    if path.suffix.lower() == ".safetensors":
        return _from_safetensors(path, arch, build, ema)
    archive = _archive_kind(_checked_zip_names(path))
    if archive == "torchscript":
        if not trust:
            raise CheckpointError(f"model file {path} is a TorchScript archive, whose own code runs "
                                  f"with the model; pass --trust-checkpoint if you trust where it "
                                  f"came from")
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
    model = build()
    model.load_state_dict(fit_state_dict(model, state, path, arch))
    return model.eval()


def _from_safetensors(path: Path, arch: str | None, build, ema: bool) -> nn.Module:
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
    model = build()
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


def _checked_zip_names(path: Path) -> list[str] | None:
    """The members of a zip archive (torch.save, TorchScript and torch.export all write one), after
    checking every member against its CRC, which torch.load does not (a flipped byte in the weights
    would load silently); None for a file that is no zip archive."""
    if not zipfile.is_zipfile(path):
        return None
    try:
        with zipfile.ZipFile(path) as zf:
            bad = zf.testzip()  # reads every member once
            names = zf.namelist()
    except Exception as err:  # noqa: BLE001 - a damaged archive raises many types
        raise CheckpointError(f"model file {path} is a damaged zip archive ({_described(err)})") from None
    if bad is not None:
        raise CheckpointError(f"model file {path} is damaged: its member {bad} fails its CRC check")
    return names


def _archive_kind(names: list[str] | None) -> str | None:
    """'torchscript' or 'export' for those zip archives, else None (a torch.save file)."""
    if names is None:
        return None
    if any(n.endswith("/constants.pkl") for n in names) and any("/code/" in n for n in names):
        return "torchscript"
    if any(n.endswith("/models/model.json") for n in names):
        return "export"
    return None


def _torch_load(path: Path, trust: bool):
    why = _not_torch_save(path)  # first: torch's weights-only unpickler calls any bytes a pickle
    if why is not None:
        raise CheckpointError(f"model file {path} is not a PyTorch checkpoint ({why})")
    try:
        # timm's training checkpoints hold their argparse Namespace: plain data, safe to rebuild
        with torch.serialization.safe_globals([argparse.Namespace]), warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Detected pickle protocol")  # pickle.dump files
            return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # noqa: BLE001 - torch raises many types for a bad file
        refused = "Weights only load failed" in str(err)
        if refused and not trust:
            raise CheckpointError(
                f"model file {path} holds a pickled Python object, and unpickling it runs code from "
                f"the file; pass --trust-checkpoint if you trust where it came from") from None
        if not refused:
            raise CheckpointError(f"model file {path} is not a PyTorch checkpoint "
                                  f"({_described(err)})") from None
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
    if head.startswith(b"PK") or (head[:1] == b"\x80" and len(head) > 1 and 2 <= head[1] <= 5):
        return None  # a zip archive, or a pickle of protocol 2 to 5 (its first opcode, PROTO)
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


def build_arch(spec: str, kwargs: dict, *, trust: bool = False,
               config_dir: str | Path | None = None) -> nn.Module:
    """`torchvision:NAME` (built with weights=None, no download), `timm:NAME` (pretrained=False)
    or `package.module:callable` (a module in the working directory or `config_dir` only with
    `trust`)."""
    source, sep, name = spec.partition(":")
    if not sep or not source or not name:
        raise CheckpointError(f"arch '{spec}' must be torchvision:NAME, timm:NAME or "
                              f"package.module:callable")
    if source == "torchvision":
        try:
            import torchvision  # only for torchvision: archs; its import takes about 2 s
        except Exception as err:  # noqa: BLE001 - a torchvision built for another torch
            mismatch = torchvision_mismatch(err)
            if mismatch is None:
                raise
            raise CheckpointError(mismatch) from None
        if name not in torchvision.models.list_models():
            raise CheckpointError(f"arch '{spec}': torchvision has no model named '{name}'")
        # segmentation and detection models would fetch ImageNet backbone weights unless told not to
        no_download = {"weights": None}
        if name in torchvision.models.list_models(torchvision.models.segmentation) + \
                torchvision.models.list_models(torchvision.models.detection):
            no_download["weights_backbone"] = None
        factory = lambda **kw: torchvision.models.get_model(name, **{**no_download, **kw})  # noqa: E731
        builder = torchvision.models.get_model_builder(name)
    elif source == "timm":
        factory, builder = _timm_factory(spec, name), None  # timm's create_model takes many of its own
    else:
        factory = builder = _import_callable(spec, source, name, trust, config_dir)
    try:
        model = factory(**kwargs)
    except Exception as err:  # noqa: BLE001 - user code can raise anything
        raise CheckpointError(f"arch '{spec}' could not be built with arch_kwargs {shown(kwargs)} "
                              f"({_described(err)})") from None
    if not isinstance(model, nn.Module):
        raise CheckpointError(f"arch '{spec}' returned a {type(model).__name__}, not a torch.nn.Module")
    taken = arch_keywords(builder) if builder is not None and kwargs else None
    unknown = [k for k in kwargs if taken is not None and k not in taken]
    if unknown:
        hints = [f"{k} (did you mean {close[0]}?)" if close else k for k in unknown
                 for close in [difflib.get_close_matches(k, sorted(taken), n=1, cutoff=0.6)]]
        warnings.warn(f"arch '{spec}' takes no argument {', '.join(hints)}; "
                      f"{type(model).__name__} was built without {'it' if len(unknown) == 1 else 'them'} "
                      f"(arch_kwargs {shown(kwargs)})", stacklevel=2)
    return model


def arch_keywords(builder) -> set[str] | None:
    """The keyword arguments an --arch callable takes, where that can be known: its own named
    parameters and, where it passes **kwargs on (torchvision's builders do, to the model class),
    those of the class it is annotated to return and of its bases' __init__, up to the first that
    takes no **kwargs; torchvision's detectors hand the rest to their GeneralizedRCNNTransform,
    which ignores what it does not know. None where the chain ends open (nn.Module's own *args)."""
    names, more = _parameters(builder)
    if not more:
        return names
    cls = builder if isinstance(builder, type) else _returned_class(builder)
    if cls is None or not issubclass(cls, nn.Module):
        return None
    detector = cls.__module__.startswith("torchvision.models.detection")
    if detector:
        from torchvision.models.detection.transform import GeneralizedRCNNTransform
        names |= _parameters(GeneralizedRCNNTransform.__init__)[0] | {"_skip_resize"}
    for klass in cls.__mro__:
        if klass in (nn.Module, object):
            return names if detector else None
        if "__init__" not in vars(klass):
            continue
        found, more = _parameters(klass.__init__)
        names |= found
        if not more:
            return names
    return None


def _parameters(fn) -> tuple[set[str], bool]:
    """(the named parameters of `fn`, whether it also takes **kwargs); unknown: (set(), True)."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return set(), True
    named = {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)} - {"self"}
    return named, any(p.kind is p.VAR_KEYWORD for p in params)


def _returned_class(fn) -> type | None:
    try:
        annotation = inspect.signature(fn, eval_str=True).return_annotation
    except Exception:  # noqa: BLE001 - an annotation that cannot be evaluated
        return None
    return annotation if isinstance(annotation, type) else None


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


def _local_code(module_name: str, config_dir: str | Path | None) -> Path | None:
    """The file or package in the working directory or the config's folder that importing
    `module_name` would run (as it would with the working directory first on sys.path, as trusted
    imports have it); None when the module comes from elsewhere: site-packages, a PYTHONPATH
    folder, alcli itself. Found without importing anything: only the top-level module is looked
    up, and its location's folder compared (a site-packages inside the working directory, such as
    ./.venv, is not the working directory)."""
    top = module_name.partition(".")[0]
    if top == __name__.partition(".")[0]:
        return None  # alcli's own modules (alcli.demo): the code already running
    folders = {Path.cwd().resolve()} | ({Path(config_dir).resolve()} if config_dir else set())
    for place in _locations(_spec_with_cwd(top)):
        if place.resolve().parent in folders:
            return place
    return None


def _spec_with_cwd(top: str):
    """The spec `import top` would use with the working directory first on sys.path; None if none."""
    if top in sys.modules:
        return getattr(sys.modules[top], "__spec__", None)
    cwd = os.getcwd()
    added = cwd not in sys.path
    if added:
        sys.path.insert(0, cwd)
    try:
        return importlib.util.find_spec(top)
    except (ImportError, ValueError):
        return None
    finally:
        if added:
            sys.path.remove(cwd)


def _locations(spec) -> list[Path]:
    """A module's file, or a package's folders (several for a namespace package)."""
    if spec is None:
        return []
    if spec.submodule_search_locations:
        return [Path(p) for p in spec.submodule_search_locations]
    return [Path(spec.origin)] if spec.has_location and spec.origin else []


def _import_callable(spec: str, module_name: str, attr: str, trust: bool,
                     config_dir: str | Path | None):
    local = _local_code(module_name, config_dir)
    if local is not None and not trust:
        where = "the working directory" if local.resolve().parent == Path.cwd().resolve() else \
            "the config's folder"
        raise CheckpointError(f"arch '{spec}' names code in {where} ({local}), not an installed "
                              f"package, and importing it runs that code; pass --trust-checkpoint "
                              f"if you trust it")
    if trust:
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
    if not trust and not (isinstance(obj, type) and issubclass(obj, nn.Module)):
        # any installed function would do otherwise: `subprocess:getoutput` with arch_kwargs {cmd: ...}
        raise CheckpointError(f"arch '{spec}' is a {type(obj).__name__}, not a torch.nn.Module "
                              f"class, and calling it runs whatever it does with arch_kwargs; "
                              f"pass --trust-checkpoint if you trust it")
    return obj
