"""What models take and give, as Hugging Face and timm models do.

Inputs are a tensor, a dict of tensors (passed as keyword arguments: `input_ids`,
`attention_mask`, `pixel_values`) or a tuple of tensors (passed as positional arguments), every
tensor batched in dim 0. Outputs are the logits tensor or something holding it: an object with
`.logits` (a Hugging Face `ModelOutput`), a dict with "logits", or a tuple whose first element
is the logits (torchvision's segmentation models: a dict whose "out" holds them). Every method calls the model, slices the batch and reads its size through here.
"""
from __future__ import annotations

from typing import Callable, Union

import torch

Inputs = Union[torch.Tensor, dict, tuple]


def model_args(inputs: Inputs) -> tuple[tuple, dict]:
    """(args, kwargs) the model is called with."""
    if isinstance(inputs, torch.Tensor):
        return (inputs,), {}
    if isinstance(inputs, dict):
        return (), dict(inputs)
    if isinstance(inputs, (tuple, list)):
        return tuple(inputs), {}
    raise TypeError(f"model inputs must be a tensor, or a dict or tuple of tensors, not "
                    f"{type(inputs).__name__}")


def call_model(model, inputs: Inputs):
    """The model's raw output on `inputs` (see model_args)."""
    args, kwargs = model_args(inputs)
    return model(*args, **kwargs)


def logits_of(output) -> torch.Tensor:
    """The logits in a model's output: the tensor itself, `.logits`, `["logits"]` (`["out"]`, as
    torchvision's segmentation models return them), or the first element of a tuple; a TypeError
    naming what was found otherwise."""
    if isinstance(output, torch.Tensor):
        return output
    if isinstance(output, dict):  # a dict, or a ModelOutput (which is one)
        for key in ("logits", "out"):
            if isinstance(output.get(key), torch.Tensor):
                return output[key]
    if isinstance(getattr(output, "logits", None), torch.Tensor):
        return output.logits
    if isinstance(output, (tuple, list)) and output and isinstance(output[0], torch.Tensor):
        return output[0]
    raise TypeError(f"the model returned a {type(output).__name__}; it must return the logits, or "
                    f"an object, dict or tuple holding them (.logits, ['logits'], ['out'], first element)")


def forward_logits(model, inputs: Inputs) -> torch.Tensor:
    return logits_of(call_model(model, inputs))


def tensors(inputs: Inputs) -> list[torch.Tensor]:
    """The tensors in `inputs`, in order."""
    if isinstance(inputs, torch.Tensor):
        return [inputs]
    values = inputs.values() if isinstance(inputs, dict) else inputs
    return [v for v in values if isinstance(v, torch.Tensor)]


def batch_size(inputs: Inputs) -> int:
    found = tensors(inputs)
    if not found or any(t.dim() == 0 for t in found):
        raise TypeError("model inputs must hold tensors batched in dim 0")
    return found[0].shape[0]


def map_batch(inputs: Inputs, fn: Callable[[torch.Tensor], torch.Tensor]) -> Inputs:
    """`inputs` with `fn` applied to every tensor (other values as they are)."""
    if isinstance(inputs, torch.Tensor):
        return fn(inputs)
    if isinstance(inputs, dict):
        return {k: fn(v) if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}
    return type(inputs)(fn(v) if isinstance(v, torch.Tensor) else v for v in inputs)


def batch_slice(inputs: Inputs, start: int, stop: int) -> Inputs:
    return map_batch(inputs, lambda t: t[start:stop])


def repeat_first(inputs: Inputs, n: int) -> Inputs:
    """The first example, n times."""
    return map_batch(inputs, lambda t: t[:1].repeat(n, *[1] * (t.dim() - 1)))


def first_n(inputs: Inputs, n: int) -> Inputs:
    """The first n examples, the first one repeated where there are fewer."""
    def take(t):
        return t[:n] if t.shape[0] >= n else torch.cat([t, t[:1].expand(n - t.shape[0], *t.shape[1:])])
    return map_batch(inputs, take)


def zeros_like_one(inputs: Inputs) -> Inputs:
    """One example of zeros shaped like those in `inputs`."""
    return map_batch(inputs, lambda t: torch.zeros((1, *t.shape[1:]), dtype=t.dtype, device=t.device))


def example_key(inputs: Inputs) -> tuple:
    """What identifies the shape of an example: per tensor (name,) per-example shape and dtype."""
    if isinstance(inputs, torch.Tensor):
        return (tuple(inputs.shape[1:]), inputs.dtype)
    items = inputs.items() if isinstance(inputs, dict) else enumerate(inputs)
    return tuple((k, tuple(v.shape[1:]), v.dtype) for k, v in items if isinstance(v, torch.Tensor))


def float_dtype(inputs: Inputs) -> torch.dtype | None:
    """The dtype of the first floating-point tensor in `inputs`, if any."""
    for t in tensors(inputs):
        if t.is_floating_point():
            return t.dtype
    return None
