"""Checks made before any scoring starts, so a long run cannot fail hours in on bad input.

Each failure is one sentence naming the pool, the example or the setting at fault: an empty pool,
an id used twice, a label outside the model's classes, a row gradnorm and loss cannot score
(a prompt without an answer), and a model whose number of outputs differs
from the class count that the pool (class folders) or the config (`arch_kwargs.num_classes`) gives.
The model's output size is learned from one forward pass on the first readable example, which
also tells the task when --task is auto (alcli.tasks) and must fit the task given.
"""
from __future__ import annotations

import torch
from torch import nn

from ..files.classnames import check_names, multilabel_names
from ..files.config import Settings
from ..errors import ConfigError, PoolError, RunError, first_line
from ..pools.common import Pool, check_unique_ids, collate, collate_sized, decoded
from .. import tasks
from .runner import forward, to_model
from .strategies import STRATEGIES

PROBE_TRIES = 64  # readable examples looked for before the model's output size is left unknown


def check(model: nn.Module, pool: Pool, settings: Settings, device: torch.device) -> int | None:
    """Run every check; the number of classes the model outputs (None if no example is readable)."""
    check_pool(pool)
    classes = model_classes(model, pool, device, settings.task)
    if classes is not None:
        check_classes(pool, settings, classes)
    check_class_names(pool, tasks.known(settings.task, model))
    named = tasks.named(settings.task, model)  # a detector's task is known by its class, untold
    task = tasks.known(settings.task, model) or (named.name if named else None)
    use_task_default(settings, task)
    check_answers(pool, settings, task)
    return classes


DEFAULT_STRATEGY, DEFAULT_AGGREGATE = Settings().strategy, Settings().aggregate


def use_task_default(settings: Settings, task: str | None) -> None:
    """No --strategy given (no option, config key or argument, and still the settings' default:
    a command that runs a strategy of its own, review's or simulate's, sets another): the task's
    own default (Task.default_strategy, chosen by the rule in docs/benchmarks.md), and its
    --aggregate (Task.default_aggregate) unless one is given."""
    untold = "strategy" not in settings.sources and settings.strategy == DEFAULT_STRATEGY
    if task is not None and untold:
        settings.strategy = tasks.TASKS[task].default_strategy
        if "aggregate" not in settings.sources and settings.aggregate == DEFAULT_AGGREGATE:
            settings.aggregate = tasks.TASKS[task].default_aggregate


def check_answers(pool: Pool, settings: Settings, task: str | None) -> None:
    """gradnorm and loss score each example at its own targets: a row without any (a causal-lm
    prompt without an answer, Task.unanswered) is refused before the run, not ranked last."""
    if task is None or not STRATEGIES[settings.strategy].at_targets:
        return
    problem = tasks.TASKS[task].unanswered(pool, settings.strategy)
    if problem:
        raise PoolError(problem)


def check_class_names(pool: Pool, task: str | None) -> None:
    """The class names (a names file, id2label, a ClassLabel, class folders) hold no control
    character, and, for a multilabel model, no '|' (which joins a row's labels)."""
    if not pool.classes:
        return
    source = pool.classes_from or f"pool {pool.name}'s class folders"
    check_names([str(n) for n in pool.classes], source)
    if task is not None and tasks.TASKS[task].joins_labels:
        multilabel_names([str(n) for n in pool.classes], source)


def check_pool(pool: Pool) -> None:
    if len(pool) == 0:
        raise PoolError(f"pool {pool.name} holds no examples")
    check_unique_ids(pool.name, pool.ids)


def model_classes(model: nn.Module, pool: Pool, device: torch.device, task: str = "auto") -> int | None:
    """The model's number of classes (labels), from a forward pass on the first readable example,
    after the task is found and checked against its output (None for regression)."""
    spec = tasks.named(task, model)
    if spec is not None and spec.sized_images:  # a detector: its own class count
        return _detector_classes(spec, model, pool, device)
    for i in range(min(len(pool), PROBE_TRIES)):
        batch = decoded(collate([pool[i]]), pool, device)  # --decode gpu: decoded there
        if not batch.errors:
            try:
                logits = forward(model, to_model(batch.inputs, model, device, pool.to_float),
                                 pool.name)
            except torch.cuda.OutOfMemoryError:
                raise RunError("CUDA ran out of memory on a single example; use a smaller model "
                               "input, --layers, or another --device") from None
            task = tasks.resolve(task, model, lambda: logits)
            tasks.check(task, logits)
            return tasks.classes(task, logits)
    return None


def _detector_classes(spec, model: nn.Module, pool: Pool, device: torch.device) -> int | None:
    """A detector's class count, after one forward on the first readable image shows it runs."""
    tasks.check_model(spec.name, model)
    for i in range(min(len(pool), PROBE_TRIES)):
        batch = collate_sized([pool[i]])
        if not batch.errors:
            images = to_model(batch.inputs, model, device, pool.to_float)
            try:
                spec.predict(model, images)
            except Exception as err:  # noqa: BLE001 - shape errors etc. from the model
                raise RunError(f"the detector cannot run on image {batch.ids[0]} of {pool.name} "
                               f"({first_line(err)})") from None
            break
    return spec.model_classes(model)


def _labels(pool: Pool) -> list[int] | None:
    base = getattr(pool, "base", pool)  # a shard's labels are those of its pool
    if hasattr(base, "labels"):
        labels = list(base.labels)
    elif isinstance(getattr(base, "y", None), torch.Tensor):
        labels = base.y.tolist()
    else:
        return None
    if base is not pool:
        labels = [labels[i] for i in pool.indices]
    return labels


def check_classes(pool: Pool, settings: Settings, classes: int) -> None:
    wanted = settings.arch_kwargs.get("num_classes")
    if isinstance(wanted, int) and wanted != classes:
        raise ConfigError(f"{settings.where('arch_kwargs')} sets num_classes {wanted}, but the "
                          f"model outputs {classes} classes")
    if pool.classes is not None and len(pool.classes) != classes and pool.classes_from:
        raise ConfigError(f"{pool.classes_from} names {len(pool.classes)} classes "
                          f"({_names(pool.classes)}) but the model outputs {classes} classes")
    if pool.classes is not None and len(pool.classes) != classes:
        raise RunError(f"pool {pool.name} has {len(pool.classes)} class folders "
                       f"({_names(pool.classes)}) but the model outputs {classes} classes")
    labels = _labels(pool) if pool.has_labels else None
    if labels:
        top = max(range(len(labels)), key=labels.__getitem__)
        if labels[top] >= classes:
            raise RunError(f"example {pool.ids[top]} of {pool.name} has label {labels[top]}, but "
                           f"the model has {classes} classes (0..{classes - 1})")


def _names(names: list[str]) -> str:
    return ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
