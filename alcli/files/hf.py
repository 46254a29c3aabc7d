"""Hugging Face model directories (`save_pretrained`): the model, its tokenizer, its image settings.

A directory with a config.json is loaded with AutoModelForSequenceClassification,
AutoModelForImageClassification, AutoModelForTokenClassification or AutoModelForCausalLM, whichever
the config names, offline: nothing is downloaded. A PEFT adapter directory (adapter_config.json)
is loaded on its base model (`base_model_name_or_path`, a local directory) with its adapter
parameters trainable and the base's frozen, so the engine's default selection is the adapter's.
Text pools are tokenized with the directory's tokenizer when a batch is collated; image pools use
the directory's image processor settings (size, crop, mean/std) unless the config sets a transform.
A directory's own Python code (`auto_map` in its config) runs only with --trust-remote-code:
transformers is always told `trust_remote_code`, so it never asks on stdin.
"""
from __future__ import annotations

import inspect
import json
import math
import os
import warnings
from pathlib import Path

from torch import nn

from ..errors import CheckpointError, ConfigError, PoolError, first_line
from .config import MAX_SIDE, Transform

INSTALL = "pip install 'alcli[hf]'"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "vocab.json",
                   "spiece.model", "sentencepiece.bpe.model")


def is_model_dir(path: Path) -> bool:
    return path.is_dir() and ((path / "config.json").is_file() or is_adapter_dir(path))


def is_adapter_dir(path: Path) -> bool:
    return path.is_dir() and (path / "adapter_config.json").is_file()


def transformers():
    """The transformers package, imported only when a Hugging Face directory is used: it is an
    optional dependency (the `hf` extra) and its import takes seconds."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never reach the Hub: everything is in DIR
    try:
        import transformers as tf
    except ImportError:
        raise CheckpointError(f"Hugging Face model directories need the transformers package; "
                              f"{INSTALL}") from None
    tf.logging.set_verbosity_error()  # its notes on unused weights etc. are not for our users
    tf.logging.disable_progress_bar()  # nor its bars ("Loading weights") on our stderr
    return tf


def refuse_remote_code(path: Path, trust_remote_code: bool, names=("config.json",)) -> None:
    """A directory whose config names its own Python code (`auto_map`), which transformers would
    import, is refused unless trusted; transformers, told trust_remote_code=False, would refuse
    too, but not in one sentence naming the flag."""
    if trust_remote_code:
        return
    for name in names:
        try:
            cfg = json.loads((path / name).read_text())
        except (OSError, ValueError):
            continue  # absent or malformed: transformers says what is wrong with it
        if isinstance(cfg, dict) and "auto_map" in cfg:
            raise CheckpointError(f"model directory {path} holds its own Python code ({name} has "
                                  f"auto_map), which loading it would run; pass --trust-remote-code "
                                  f"if you trust where it came from")


def load_model(path: Path, trust_remote_code: bool = False) -> nn.Module:
    """The classification (token classification, object detection, causal LM) model saved in
    `path`, in eval mode; an adapter directory on its base."""
    if is_adapter_dir(path) and not (path / "config.json").is_file():
        return load_adapter(path, trust_remote_code)
    refuse_remote_code(path, trust_remote_code)
    tf = transformers()
    try:
        config = tf.AutoConfig.from_pretrained(path, local_files_only=True,
                                               trust_remote_code=trust_remote_code)
    except Exception as err:  # noqa: BLE001 - a malformed config.json raises many types
        raise CheckpointError(f"model directory {path} has no readable config.json "
                              f"({first_line(err)})") from None
    auto = (tf.AutoModelForObjectDetection if _names(config, "ForObjectDetection")
            else tf.AutoModelForImageClassification if _is_image_model(tf, config)
            else tf.AutoModelForTokenClassification if _is_token_model(config)
            else tf.AutoModelForCausalLM if is_causal_lm_config(config)
            else tf.AutoModelForSequenceClassification)
    try:
        model = auto.from_pretrained(path, local_files_only=True, trust_remote_code=trust_remote_code)
    except Exception as err:  # noqa: BLE001
        raise CheckpointError(f"model directory {path} cannot be loaded as a "
                              f"{auto.__name__[len('AutoModelFor'):]} model ({first_line(err)})") from None
    return model.eval()


def base_dir(path: Path) -> Path:
    """The base model directory an adapter directory names (adapter_config.json's
    `base_model_name_or_path`, relative to the adapter directory when not absolute)."""
    where = path / "adapter_config.json"
    try:
        base = json.loads(where.read_text()).get("base_model_name_or_path")
    except (OSError, ValueError, AttributeError) as err:
        raise CheckpointError(f"{where} is not a readable JSON object ({first_line(err)})") from None
    if not isinstance(base, str) or not base:
        raise CheckpointError(f"{where} names no base model (base_model_name_or_path)")
    found = Path(base) if Path(base).is_absolute() else path / base
    if not (found / "config.json").is_file():
        found = Path(base)
    if not (found / "config.json").is_file():
        raise CheckpointError(f"the adapter in {path} is for the base model {base}, which is not a "
                              f"model directory here (nothing is downloaded); point "
                              f"base_model_name_or_path in {where} at a local directory")
    return found


def load_adapter(path: Path, trust_remote_code: bool = False) -> nn.Module:
    """A PEFT adapter directory on its base model: the adapter's parameters trainable (what
    fine-tuning would move), the base's frozen; in eval mode."""
    base = load_model(base_dir(path), trust_remote_code)
    try:
        from peft import PeftModel
    except ImportError:
        raise CheckpointError(f"adapter directory {path} needs the peft package; pip install 'alcli[lm]'") from None
    try:
        with warnings.catch_warnings():  # peft reads transformers' deprecated is_gradient_checkpointing
            warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*")
            model = PeftModel.from_pretrained(base, str(path), is_trainable=True)
    except Exception as err:  # noqa: BLE001 - peft raises many types for a bad adapter
        raise CheckpointError(f"adapter directory {path} cannot be loaded on its base model "
                              f"({first_line(err)})") from None
    return model.eval()


def is_causal_lm_config(config) -> bool:
    """A causal language model (GPT-2's LMHeadModel, Llama's ForCausalLM), as the config's
    architectures name it."""
    return _names(config, "ForCausalLM") or _names(config, "LMHeadModel")


def _names(config, kind: str) -> bool:
    """Does the config's `architectures` name a model of this kind (a class name ending)?"""
    return any(n.endswith(kind) for n in getattr(config, "architectures", None) or [])


def _is_token_model(config) -> bool:
    """A token classifier (NER, tagging), as the config's architectures name it."""
    return _names(config, "ForTokenClassification")


def _is_image_model(tf, config) -> bool:
    names = config.architectures or []
    if any(n.endswith("ForImageClassification") for n in names):
        return True
    if any(n.endswith("ForSequenceClassification") for n in names):
        return False
    from transformers.models.auto.modeling_auto import MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES
    return config.model_type in MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES


def model_dir(model: nn.Module, path: str | None) -> Path | None:
    """The Hugging Face directory a model came from: the --model directory, else the one a
    `from_pretrained` model remembers (the Python API given the model object)."""
    for candidate in (path, getattr(model, "name_or_path", None)):
        if candidate and is_model_dir(Path(candidate)):
            found = Path(candidate)
            if is_adapter_dir(found) and not any((found / n).is_file() for n in TOKENIZER_FILES):
                return base_dir(found)  # an adapter without a tokenizer of its own: its base's
            return found
    return None


class Tokenize:
    """texts -> {input_ids, attention_mask, ...} [B, T]: padded to the batch's longest rounded up
    to a multiple of 8 (within `max_length`), truncated at `max_length`, holding only what the
    model's forward takes (DistilBERT takes no token_type_ids). The rounding bounds how many
    different T the engine meets: each new one costs its layout probe, several forwards."""

    PAD_MULTIPLE = 8

    def __init__(self, tokenizer, max_length: int | None, accepted: set[str] | None,
                 positions: bool = False):
        self.tokenizer, self.max_length, self.accepted = tokenizer, max_length, accepted
        self.positions = positions  # the model takes position_ids: given where padding is on the left

    def __call__(self, texts: list[str]) -> dict:
        enc = self.tokenizer(texts, padding="longest", truncation=self.max_length is not None,
                             max_length=self.max_length, return_tensors="pt")
        enc = {k: v for k, v in enc.items() if self.accepted is None or k in self.accepted}
        if self.positions and self.tokenizer.padding_side == "left" and "attention_mask" in enc:
            # each text's own positions 0, 1, ... from its first real token (GPT-2 would count
            # the left padding, moving every position)
            enc["position_ids"] = (enc["attention_mask"].cumsum(1) - 1).clamp_min(0)
        return self._round_up(enc)

    def _round_up(self, enc: dict) -> dict:
        """More padding (pad id, attention mask 0) up to the next multiple of PAD_MULTIPLE."""
        if "input_ids" not in enc:
            return enc
        steps = enc["input_ids"].shape[1]
        target = -(-steps // self.PAD_MULTIPLE) * self.PAD_MULTIPLE
        if self.max_length is not None:
            target = min(target, self.max_length)
        if target == steps or self.tokenizer.padding_side != "right":
            return enc
        fill = {"input_ids": self.tokenizer.pad_token_id, "attention_mask": 0}
        return {k: nn.functional.pad(v, (0, target - steps), value=fill.get(k, 0))
                if v.dim() == 2 and v.shape[1] == steps else v for k, v in enc.items()}


def tokenizer_for(directory: Path, model: nn.Module, max_length: int | None,
                  trust_remote_code: bool = False) -> Tokenize:
    """The tokenizer saved in `directory`, for `model`."""
    if not any((directory / name).is_file() for name in TOKENIZER_FILES):
        raise PoolError(f"text pools need a tokenizer, and model directory {directory} holds none "
                        f"(save it there with tokenizer.save_pretrained)")
    refuse_remote_code(directory, trust_remote_code, ("config.json", "tokenizer_config.json"))
    tf = transformers()
    try:
        tok = tf.AutoTokenizer.from_pretrained(directory, local_files_only=True,
                                               trust_remote_code=trust_remote_code)
    except Exception as err:  # noqa: BLE001
        raise PoolError(f"the tokenizer in {directory} cannot be loaded ({first_line(err)})") from None
    config = getattr(model, "config", None)
    pad = getattr(config, "pad_token_id", None)
    if tok.pad_token_id is None and pad is None and tok.eos_token_id is not None \
            and is_causal_lm_config(config):
        pad = tok.eos_token_id  # a causal LM's usual padding (masked out, counted in no loss)
    if tok.pad_token_id is None:
        if pad is None:
            raise PoolError(f"the tokenizer in {directory} has no padding token and the model's "
                            f"config sets no pad_token_id, so texts of different lengths cannot "
                            f"share a batch")
        tok.pad_token_id = pad
    limit = position_limit(config)
    if max_length is not None and limit is not None and max_length > limit[0]:
        raise ConfigError(f"--max-length {max_length} is more than the {limit[0]} positions the "
                          f"model has ({limit[1]} in its config); give at most {limit[0]}, or leave "
                          f"--max-length out to use that limit")
    return Tokenize(tok, max_length or _longest(tok, limit), _forward_args(model),
                    _takes_positions(model))


def _longest(tok, limit: tuple[int, str] | None) -> int | None:
    """The tokenizer's model_max_length (at most the model's position limit), else that limit;
    None if neither."""
    if tok.model_max_length and tok.model_max_length < 1e9:  # unset: a huge placeholder
        return int(min(tok.model_max_length, limit[0])) if limit is not None else int(tok.model_max_length)
    return limit[0] if limit is not None else None


def position_limit(config) -> tuple[int, str] | None:
    """(the most tokens the model takes, the config key naming it): its position embeddings'
    count (max_position_embeddings, GPT-2's n_positions), stretched by a rotary scaling that
    reaches further (linear, YaRN: `factor` times the original); None where the config names
    none, or a dynamic rotary scaling runs at any length."""
    aliases = getattr(config, "attribute_map", None) or {}
    for key in ("max_position_embeddings", "n_positions"):
        value = getattr(config, key, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            name = aliases.get(key, key)
            break
    else:
        return None
    rope = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None)
    ropes = [] if not isinstance(rope, dict) else (
        [rope] if not any(isinstance(v, dict) for v in rope.values())
        else [v for v in rope.values() if isinstance(v, dict)])  # one per layer type (Gemma 3)
    for r in ropes:
        kind = r.get("rope_type", r.get("type"))
        factor = r.get("factor")
        if kind in (None, "default") or not isinstance(factor, (int, float)) or factor <= 1:
            continue
        if "dynamic" in str(kind):
            return None
        original = r.get("original_max_position_embeddings") or getattr(
            config, "original_max_position_embeddings", None) or value
        if isinstance(original, (int, float)) and original * factor > value:
            value, name = int(original * factor), f"{name} with rope {kind} factor {factor:g}"
    return value, name


def _takes_positions(model: nn.Module) -> bool:
    """Does the model (a PEFT model: its base) take position_ids?"""
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    return "position_ids" in inspect.signature(inner.forward).parameters


def _forward_args(model: nn.Module) -> set[str] | None:
    params = inspect.signature(model.forward).parameters.values()
    if any(p.kind == p.VAR_KEYWORD for p in params):
        return None
    return {p.name for p in params}


def image_transform(directory: Path) -> Transform | None:
    """The directory's image processor settings as a transform (None without one): resize to
    `size` (height x width, or the shortest edge), center crop to `crop_size`, mean/std. A value
    of the wrong type, or a size over MAX_SIDE pixels, is an error naming the file and key."""
    path = directory / "preprocessor_config.json"
    if not path.is_file():
        return None
    try:
        cfg = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise CheckpointError(f"{path} is not valid JSON ({first_line(err)})") from None
    if not isinstance(cfg, dict):
        raise CheckpointError(f"{path} must hold a JSON object of image settings, not "
                              f"{_shown(cfg)}")
    t = Transform()
    size = cfg.get("size")
    if cfg.get("do_resize", True) and size is not None:
        t.resize = _size(path, "size", size)
    if cfg.get("do_center_crop") and cfg.get("crop_size") is not None:
        t.center_crop = _size(path, "crop_size", cfg["crop_size"])
    factor = cfg.get("rescale_factor", 1 / 255)
    if cfg.get("do_rescale", True) and not math.isclose(_number(path, "rescale_factor", factor), 1 / 255):
        raise CheckpointError(f"{path}: rescale_factor {factor} is not 1/255, which "
                              f"alcli's image pools assume; set transform in the config instead")
    mean, std = cfg.get("image_mean"), cfg.get("image_std")
    if cfg.get("do_normalize", True) and mean is not None and std is not None:
        mean, std = _numbers(path, "image_mean", mean), _numbers(path, "image_std", std)
        if len(mean) != len(std) or min(std) <= 0:
            raise CheckpointError(f"{path}: image_mean and image_std must have as many values, "
                                  f"and image_std positive ones")
        t.normalize = {"mean": mean, "std": std}
    return t


def _shown(value) -> str:
    text = json.dumps(value)
    return text if len(text) <= 100 else text[:100] + "..."


def _size(path: Path, key: str, size) -> int | list[int]:
    """An int, {height, width} or {shortest_edge}: positive integers up to MAX_SIDE pixels."""
    if isinstance(size, dict) and "height" in size and "width" in size:
        sides = [size["height"], size["width"]]
    elif isinstance(size, dict) and "shortest_edge" in size:
        sides = [size["shortest_edge"]]
    elif isinstance(size, dict):
        raise CheckpointError(f"{path}: {key} {_shown(size)} is neither height/width nor "
                              f"shortest_edge")
    else:
        sides = [size]
    if not all(isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in sides):
        raise CheckpointError(f"{path}: {key} must be a positive integer or hold positive integers "
                              f"(pixels), got {_shown(size)}")
    if max(sides) > MAX_SIDE:
        raise CheckpointError(f"{path}: {key} {_shown(size)} is over alcli's maximum of {MAX_SIDE} "
                              f"pixels per side")
    return sides if len(sides) == 2 else sides[0]


def _number(path: Path, key: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise CheckpointError(f"{path}: {key} must be a number, got {_shown(value)}")
    return float(value)


def _numbers(path: Path, key: str, value) -> list[float]:
    """A number or a non-empty list of numbers (one per channel)."""
    values = value if isinstance(value, list) and value else [value]
    try:
        return [_number(path, key, v) for v in values]
    except CheckpointError:
        raise CheckpointError(f"{path}: {key} must be a number or a list of numbers, got "
                              f"{_shown(value)}") from None
