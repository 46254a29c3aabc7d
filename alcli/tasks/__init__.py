"""The labeling tasks (--task): one module each, each defining one `Task` (alcli.tasks.common) that
holds everything task-specific, and this registry naming them. Code outside this folder asks the
task object (`TASKS[name]`), never compares a task's name (tests/test_task_names.py).

| task | output | per-example loss | module |
|---|---|---|---|
| classification | [B, C] | cross-entropy | classification.py |
| multilabel | [B, C] | binary cross-entropy summed over the C labels | multilabel.py |
| segmentation | [B, C, H, W] | mean cross-entropy over its valid pixels | segmentation.py |
| token-classification | [B, T, C] | mean cross-entropy over its valid tokens | token_classification.py |
| regression | [B, D] ([B]: D = 1) | squared error summed over the D outputs | regression.py |
| keypoints | boxes, labels, scores, keypoints per image | the detector's own training loss | keypoints.py |
| instance-segmentation | boxes, labels, scores, masks per image | the detector's own training loss | instances.py |
| detection | boxes, labels, scores per image | the detector's own training loss | detection.py |
| causal-lm | [B, T, V] | mean cross-entropy over its scored (response) tokens | causal_lm.py |
"""
from __future__ import annotations

import weakref
from typing import Callable

import torch
from torch import nn

from ..errors import RunError
from . import (causal_lm, classification, common, detection, instances, keypoints, multilabel,
               regression, segmentation, token_classification)
from .common import DEFAULT_EGL_SAMPLES, IGNORE, Task, aggregate, exact_dtype, uniforms  # noqa: F401

# the registry; under --task auto the first whose `names_model` holds is the model's task
TASKS: dict[str, Task] = {t.name: t for t in (
    classification.TASK, multilabel.TASK, segmentation.TASK, token_classification.TASK,
    regression.TASK, causal_lm.TASK, keypoints.TASK, instances.TASK,  # before detection: these are detectors too
    detection.TASK,
)}
DEFAULT = classification.TASK  # rows that say nothing else


# --- which task a model does --------------------------------------------------------------------

_found: "weakref.WeakKeyDictionary[nn.Module, str]" = weakref.WeakKeyDictionary()


def from_model(model: nn.Module) -> str | None:
    """The task a model's class or config names (each task's `names_model`: Hugging Face
    `*ForTokenClassification` and `config.problem_type`, torchvision's segmentation and detection
    models); None when it does not say."""
    return next((t.name for t in TASKS.values() if t.names_model(model)), None)


def from_logits(logits: torch.Tensor) -> str | None:
    """[B, C] -> classification, [B, C, H, W] -> segmentation, [B, T, C] -> token classification."""
    return next((t.name for t in TASKS.values() if t.from_rank == logits.dim()), None)


def resolve(setting: str, model: nn.Module, logits: Callable[[], torch.Tensor]) -> str:
    """The task: `setting` unless it is auto; then what the model says, else what its output's
    shape says (`logits()` runs a forward, once per model); a RunError naming --task otherwise."""
    if setting != "auto":
        return setting
    if model in _found:
        return _found[model]
    task = from_model(model)
    if task is None:
        out = logits()
        task = from_logits(out)
        if task is None:
            raise RunError(f"cannot tell the task of a model whose output has shape {list(out.shape)}; "
                           f"pass --task ({', '.join(TASKS)})")
    _found[model] = task
    return task


def known(setting: str, model: nn.Module) -> str | None:
    """The task `resolve` settled on for this model (None before it ran, for auto)."""
    return setting if setting != "auto" else _found.get(model)


def named(setting: str, model: nn.Module) -> Task | None:
    """The task --task names, else the one the model's class or config names (None: not known
    without a forward)."""
    name = setting if setting != "auto" else from_model(model)
    return TASKS.get(name) if name is not None else None


def check(task: str, logits: torch.Tensor) -> None:
    """A RunError naming --task when the model's output does not fit the task; one with no
    pixel (token) to score, an undefined score for every example, is a RunError too."""
    spec = TASKS[task]
    if not spec.fits(logits):
        raise RunError(f"the model returns outputs of shape {list(logits.shape)}, but --task {task} "
                       f"needs {spec.shape}; pass the --task its output fits")
    sentence = spec.no_position(logits)
    if sentence:
        raise RunError(sentence)


def check_model(task: str, model: nn.Module) -> None:
    """A RunError when a task that needs one kind of model (a detector) is given another, or such a
    model another task."""
    spec = TASKS.get(task)
    sentence = spec.needs_model(model) if spec is not None else None
    if sentence:
        raise RunError(sentence)
    owner = next((t for t in TASKS.values() if t.model_kind and t.needs_model(model) is None), None)
    if owner is not None and task not in ("auto", owner.name):
        raise RunError(f"the model is {owner.model_kind} ({type(model).__name__}), which --task "
                       f"{task} cannot score; use --task {owner.name} (or auto)")


def classes(task: str, logits: torch.Tensor) -> int | None:
    """How many classes (labels) the output scores; None for regression."""
    return TASKS[task].classes(logits)


def from_rows(rows: list[dict]) -> str:
    """The task a table's rows show by their columns (`boxes`: detection, `pred_words`: token
    classification), else classification."""
    found = next((t for t in TASKS.values() if rows and all(t.shown_by_rows(r) for r in rows)), DEFAULT)
    return found.name


# --- the name-taking forms of common's functions, for callers holding a task's name -------------

def valid_positions(task: str, logits: torch.Tensor, inputs, words: torch.Tensor | None = None
                    ) -> torch.Tensor:
    """[B, N] bool: the positions that count (token classification: the tokens of a word; every
    other task: all)."""
    return TASKS[task].valid(logits, inputs, words)


def predicted(task: str, logits: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    return common.predicted(TASKS[task], logits, valid)


def sampled(task: str, logits: torch.Tensor, valid: torch.Tensor, ids: list, samples: int,
            seed: int) -> list[torch.Tensor]:
    return common.sampled(TASKS[task], logits, valid, ids, samples, seed)
