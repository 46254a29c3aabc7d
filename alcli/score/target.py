"""The target set of `--strategy align`: ḡ = (1/N) Σ_j ∇L_j, the mean loss gradient of the target
pool's N labeled rows over the parameters the strategy selects (--layers; an adapter's own), each
batch's gradient accumulated in float64. Computed once per run, before the pool is scored."""
from __future__ import annotations

import dataclasses

import torch
from torch import nn

from .. import tasks
from ..errors import ConfigError, PoolError
from ..files.config import Settings
from ..gradnorm.model_io import call_model, logits_of
from ..gradnorm.params import selection_for
from ..tasks import TASKS
from .align import TargetGradient
from .runner import _given, make_loader, to_model
from .strategies import STRATEGIES, StrategyInputs


def target_for(settings: Settings, model: nn.Module, device: torch.device, open_pool) -> TargetGradient | None:
    """ḡ of `settings.target` for align (None for other strategies); `open_pool(settings)` opens a
    pool as the run opens its own (the same transforms, tokenizer and class names)."""
    if not STRATEGIES[settings.strategy].reads_target:
        if settings.target is not None:
            raise ConfigError(f"{settings.where('target')} is read by --strategy align alone; "
                              f"add -s align, or leave it out")
        return None
    if settings.target is None:
        raise ConfigError("--strategy align needs --target POOL, a labeled pool whose mean loss "
                          "gradient the examples are aligned with")
    # the target opened as the pool; its messages name where the target came from, not the pool
    sources = {**settings.sources, "pool": settings.sources.get("target", "")}
    pool = open_pool(dataclasses.replace(settings, pool=settings.target, sources=sources))
    selection = selection_for(model, settings.layers)
    total = [torch.zeros_like(p, dtype=torch.float64) for p in selection.params]
    rows, spec = 0, None
    for batch in make_loader(pool, settings.batch_size, 0, device):
        if batch.errors:
            raise PoolError(f"target {settings.target}: {batch.errors[0][1]}")
        inputs = to_model(batch.inputs, model, device, pool.to_float)
        if spec is None:  # the run's task (found by its pre-flight), asked once
            spec = _task(settings, model, inputs, pool)
        words = spec.words(batch, pool, inputs)
        with torch.enable_grad():
            logits = logits_of(call_model(model, inputs))
            targets, known = _labels(spec, pool, batch, inputs, logits, words)
            if not bool(known.all()):
                missing = batch.ids[int((~known).nonzero()[0])]
                raise ConfigError(f"target {settings.target}: the row '{missing}' has no label; "
                                  f"the target's gradient is taken at its labels")
            losses = spec.loss(logits, targets)  # [B]
            finite = torch.isfinite(losses.detach())
            if not bool(finite.all()):  # one NaN row would make every pool score NaN, rc 0
                bad = batch.ids[int((~finite).nonzero()[0])]
                raise ConfigError(f"target {settings.target}: the row '{bad}' has a loss that "
                                  f"is not finite (NaN or infinite input, or no labeled "
                                  f"position); mend or drop it")
            grads = torch.autograd.grad(losses.sum(), selection.params, allow_unused=True)
        for acc, g in zip(total, grads):
            if g is not None:
                acc += g.double()
        rows += len(batch.ids)
    if rows == 0:
        raise ConfigError(f"target {settings.target} holds no rows")
    norm = float(torch.sqrt(sum((acc * acc).sum() for acc in total))) / rows
    # kept in the parameters' dtype (float32 at least): both routes take ḡ in it, and a float64
    # copy of a large model's ḡ would be align's largest cost in memory (GPT-2 small: 0.7 GB)
    vectors = {n: (total.pop(0) / rows).to(_kept_dtype(p)) for n, p in zip(selection.names, selection.params)}
    if norm == 0:
        raise ConfigError(f"target {settings.target}: its mean loss gradient is zero over the "
                          f"selected parameters, so no direction to align with")
    return TargetGradient(vectors, norm, rows, str(settings.target))


def _kept_dtype(p: torch.Tensor) -> torch.dtype:
    return p.dtype if p.dtype in (torch.float32, torch.float64) else torch.float32


def _task(settings: Settings, model: nn.Module, inputs, pool):
    """The task whose loss the target's gradient is of; one sentence for a detector, and for a
    target with a row no answer (a causal LM's prompt alone)."""
    def plain_logits():
        with torch.no_grad():
            return logits_of(call_model(model, inputs))
    task = tasks.resolve(settings.task, model, plain_logits)
    spec = TASKS[task]
    if spec.rows is not None:
        raise ConfigError(f"--strategy align needs a task whose loss alcli computes per batch; "
                          f"{task} scores its own batches")
    unanswered = spec.unanswered(pool, "align")
    if unanswered:
        raise ConfigError(f"target {settings.target}: {unanswered}")
    return spec


def _labels(spec, pool, batch, inputs, logits, words) -> tuple[torch.Tensor, torch.Tensor]:
    """The target rows' given labels in the loss's layout, and which rows have one (a causal LM's
    are its rows' answers, checked by `unanswered` for the whole pool)."""
    if not spec.given_labels and not spec.reads_prompts:  # class indices, -1 unknown
        labels = batch.labels.to(logits.device)
        return labels.clamp(min=0), labels >= 0
    if spec.reads_prompts:
        s = StrategyInputs(model=None, inputs=inputs, labels=batch.labels, logits=logits.detach(),
                           ids=batch.ids, task=spec.name, words=None if words is None else words[0])
        return spec.targets(s), torch.ones(len(batch.ids), dtype=torch.bool, device=logits.device)
    given = _given(spec.name, pool, batch.ids, words)
    if given is None:
        return logits.new_zeros(0), torch.zeros(len(batch.ids), dtype=torch.bool)
    targets, known = given(logits.detach())
    return targets, known.to(logits.device)
