"""The scoring loop: pool -> DataLoader batches -> model -> strategy -> rows.

`score_batch` is the unit everything else builds on (resume, shards and micro-batching wrap it):
one collated batch in, one row per example out, nothing else touched.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Iterator

import torch
from torch import nn
from torch.utils.data import DataLoader

from .config import Settings
from .embeddings import EmbeddingRecorder, record
from .errors import ConfigError, PoolError, RunError
from .gradnorm import UnsupportedModel
from .pool import Batch, Pool, collate
from .utilities import STRATEGIES, StrategyInputs, loss_at_targets


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


def model_dtype(model: nn.Module) -> torch.dtype | None:
    for p in model.parameters():
        if p.is_floating_point():
            return p.dtype
    return None


def check_layers(model: nn.Module, layers: list[str] | None) -> None:
    """Fail before any work when a --layers pattern selects nothing."""
    if layers is None:
        return
    from .gradnorm.params import select_params
    try:
        select_params(model, layers)
    except ValueError as err:
        raise ConfigError(str(err)) from None


def make_loader(pool: Pool, batch_size: int, workers: int, device: torch.device) -> DataLoader:
    """Batches in pool order; workers read and decode ahead; pinned memory on CUDA."""
    return DataLoader(pool, batch_size=batch_size, shuffle=False, num_workers=workers,
                      collate_fn=collate, pin_memory=device.type == "cuda",
                      persistent_workers=False)


def to_model(inputs: torch.Tensor, model: nn.Module, device: torch.device) -> torch.Tensor:
    """Inputs on the device, floating inputs in the model's dtype (tensor pools may be float64)."""
    inputs = inputs.to(device, non_blocking=True)
    dtype = model_dtype(model)
    if inputs.is_floating_point() and dtype is not None and inputs.dtype != dtype:
        inputs = inputs.to(dtype)
    return inputs


def forward(model: nn.Module, inputs: torch.Tensor, pool_name: str) -> torch.Tensor:
    try:
        with torch.no_grad():
            out = model(inputs)
    except Exception as err:  # noqa: BLE001 - shape errors etc. from user models
        text = str(err).strip().splitlines()
        raise RunError(f"the model cannot run on examples of shape {list(inputs.shape[1:])} from "
                       f"{pool_name} ({text[0] if text else type(err).__name__})") from None
    if not isinstance(out, torch.Tensor) or out.dim() != 2:
        got = list(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        raise RunError(f"the model must return class scores of shape [batch, classes], got {got}")
    return out.detach()


def score_batch(model: nn.Module, batch: Batch, settings: Settings, device: torch.device,
                has_labels: bool, pool_name: str = "the pool", *,
                embeddings: EmbeddingRecorder | None = None) -> list[dict]:
    """One collated batch -> one row per example: id, score, pred, confidence, [label], loss, extras."""
    if batch.errors:  # strict for now: the first unreadable example stops the run
        raise PoolError(batch.errors[0][1])
    if not batch.ids:
        return []
    inputs = to_model(batch.inputs, model, device)
    labels = batch.labels.to(device)
    with record(embeddings, model, batch.ids):             # BADGE factors, when asked for
        logits = forward(model, inputs, pool_name)         # [B, C]
    classes = logits.shape[1]
    bad = (labels >= classes).nonzero().flatten()
    if len(bad):
        i = int(bad[0])
        raise RunError(f"example {batch.ids[i]} of {pool_name} has label {int(labels[i])}, but the "
                       f"model has {classes} classes (0..{classes - 1})")
    s = StrategyInputs(model=model, inputs=inputs, labels=labels, logits=logits, ids=batch.ids,
                       layers=settings.layers, method=settings.method,
                       top_classes=settings.top_classes, seed=settings.seed)
    try:
        cols = STRATEGIES[settings.strategy].fn(s)
    except UnsupportedModel as err:
        raise RunError(f"--method {settings.method}: {err}") from None
    probs = s.probs
    conf, pred = probs.max(dim=1)
    common = {"score": cols.pop("score"), "pred": pred, "confidence": conf}
    if has_labels:
        common["label"] = labels
    common["loss"] = loss_at_targets(s)
    values = {k: v.detach().cpu().tolist() for k, v in {**common, **cols}.items()}
    rows = []
    for i, id_ in enumerate(batch.ids):
        row = {"id": id_}
        for key, column in values.items():
            row[key] = column[i]
        if has_labels and row["label"] < 0:
            row["label"] = None
        rows.append(row)
    return rows


def iter_rows(model: nn.Module, pool: Pool, settings: Settings, device: torch.device, *,
              embeddings: EmbeddingRecorder | None = None) -> Iterator[list[dict]]:
    """Rows batch by batch, streaming the pool through a DataLoader."""
    loader = make_loader(pool, settings.batch_size, settings.workers, device)
    for batch in loader:
        yield score_batch(model, batch, settings, device, pool.has_labels, pool.name,
                          embeddings=embeddings)


@dataclass
class RunStats:
    count: int = 0
    seconds: float = 0.0
    device: str = "cpu"
    strategy: str = "egl"
    method: str | None = None        # engine method used (gradient strategies only)
    method_reason: str | None = None
    notes: list[str] = field(default_factory=list)  # e.g. probability mass left out by --top-classes

    @property
    def per_second(self) -> float:
        return self.count / self.seconds if self.seconds > 0 else float("inf")


def run(model: nn.Module, pool: Pool, settings: Settings, device: torch.device,
        on_batch: Callable[[int], None] | None = None, *,
        embeddings: EmbeddingRecorder | None = None) -> tuple[list[dict], RunStats]:
    """Score the whole pool -> (rows in pool order, stats). The model must already be on `device`.
    With `embeddings`, each example's BADGE factors are recorded into it as well."""
    stats = RunStats(device=str(device), strategy=settings.strategy)
    start = time.perf_counter()
    rows: list[dict] = []
    for batch_rows in iter_rows(model, pool, settings, device, embeddings=embeddings):
        rows.extend(batch_rows)
        if on_batch:
            on_batch(len(batch_rows))
    stats.seconds = time.perf_counter() - start
    stats.count = len(rows)
    if STRATEGIES[settings.strategy].gradients:
        stats.method, stats.method_reason = engine_method(model, settings)
    left = [r["mass_left"] for r in rows if "mass_left" in r]
    if left:
        stats.notes.append(f"--top-classes {settings.top_classes} leaves out probability mass "
                           f"{sum(left) / len(left):.3g} on average, {max(left):.3g} at most")
    nans = sum(1 for r in rows if r["score"] != r["score"])
    if nans:
        stats.notes.append(f"{nans} examples have a NaN score (ranked last)")
    return rows, stats


def engine_method(model: nn.Module, settings: Settings) -> tuple[str, str]:
    """Which engine method served the gradient strategy, and why."""
    if settings.method != "auto":
        return settings.method, "asked for with --method"
    from .gradnorm import auto_choice
    choice = auto_choice(model, settings.layers)
    return choice if choice else ("auto", "not decided yet")
