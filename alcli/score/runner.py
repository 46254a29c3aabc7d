"""The scoring loop: pool -> DataLoader batches -> model -> strategy -> rows.

`score_batch` is the unit everything else builds on (resume, shards and micro-batching wrap it):
one collated batch in, one row per example out, nothing else touched.
"""
from __future__ import annotations

import contextlib
import json
import math
import os
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator

import torch
from torch import nn
from torch.utils.data import DataLoader

from ..files.config import Settings
from .embeddings import EmbeddingRecorder, record
from ..errors import PoolError, RunError, first_line
from ..gradnorm import UnsupportedModel, auto_choice, batch_slice, call_model, logits_of, map_batch, model_dtype
from ..files.classnames import class_name
from ..pools.common import Batch, Pool, collate, collate_sized, decoded
from ..files.table import clip_text
from .. import tasks
from ..tasks import TASKS
from ..tasks.shared import labels as task_labels
from ..tasks.common import engine_loss, no_positions
from .strategies import DEFAULT_TOP_CLASSES, STRATEGIES, StrategyInputs


def default_workers(device: torch.device) -> int:
    """Loading in the main process on the CPU (workers would compete with the compute threads);
    on CUDA one worker per CPU core, at most 8, so decoding keeps up with the device."""
    return min(os.cpu_count() or 1, 8) if device.type == "cuda" else 0


def make_loader(pool: Pool, batch_size: int, workers: int | None, device: torch.device,
                batches: Iterable[list[int]] | None = None) -> DataLoader:
    """Batches in pool order; workers read and decode ahead; pinned memory on CUDA.
    `batches` (lists of pool indices) replaces the plain consecutive batches (resume uses it)."""
    workers = default_workers(device) if workers is None else workers
    collate_fn = collate_sized if pool.keeps_sizes else collate
    if batches is not None:
        return DataLoader(pool, batch_sampler=batches, num_workers=workers, collate_fn=collate_fn,
                          pin_memory=device.type == "cuda", persistent_workers=False)
    return DataLoader(pool, batch_size=batch_size, shuffle=False, num_workers=workers,
                      collate_fn=collate_fn, pin_memory=device.type == "cuda",
                      persistent_workers=False)


def to_model(inputs: torch.Tensor | dict, model: nn.Module, device: torch.device,
             to_float: Callable[[torch.Tensor], torch.Tensor] | None = None) -> torch.Tensor | dict:
    """Inputs on the device (a non-blocking copy from pinned memory on CUDA), made model inputs
    there by the pool's `to_float` (images: uint8 -> normalized float), floating inputs in the
    model's dtype (tensor pools may be float64); channels-last images for CUDA convolutions.
    A dict (tokenized text: input_ids, attention_mask) goes tensor by tensor."""
    if isinstance(inputs, list) and inputs and inputs[0].dim() == 3:  # detection: images of their sizes
        return [to_model(x, model, device, to_float) for x in inputs]
    if isinstance(inputs, list):  # --decode gpu: JPEG files' bytes, decoded on the device
        inputs = to_float(inputs, device)
    elif not isinstance(inputs, torch.Tensor):
        return map_batch(inputs, lambda t: to_model(t, model, device))
    else:
        inputs = inputs.to(device, non_blocking=True)
        if to_float is not None:
            inputs = to_float(inputs)
    if device.type == "cuda" and inputs.dim() == 4:
        inputs = inputs.contiguous(memory_format=torch.channels_last)
    dtype = model_dtype(model)
    if inputs.is_floating_point() and dtype is not None and inputs.dtype != dtype:
        inputs = inputs.to(dtype)
    return inputs


LOW_PRECISION = {"bf16": torch.bfloat16, "fp16": torch.float16}


def autocast(precision: str, device: torch.device):
    """The model's forwards (the runner's and the engine's) under autocast for bf16/fp16; the
    engine's rules square and sum in float32 or better whatever the forward ran in."""
    if precision == "fp32" or device.type not in ("cuda", "cpu", "mps"):
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=LOW_PRECISION[precision])


def forward(model: nn.Module, inputs: torch.Tensor | dict, pool_name: str) -> torch.Tensor:
    try:
        with torch.no_grad():
            out = call_model(model, inputs)
    except torch.cuda.OutOfMemoryError:
        raise  # the micro-batcher splits the batch and retries
    except Exception as err:  # noqa: BLE001 - shape errors etc. from user models
        raise _cannot_run(inputs, pool_name, err) from None
    return _checked_logits(out).detach()


def score_batch(model: nn.Module, batch: Batch, settings: Settings, device: torch.device,
                pool: Pool, *, embeddings: EmbeddingRecorder | None = None,
                files_dir: str | None = None) -> list[dict]:
    """One collated batch of `pool` -> one row per example: id, score, pred (its class name and
    pred_index when the pool's classes are named), confidence, [label], loss, extras, and the
    example's file as `path` for image pools, its text as `text` for text pools. The rows come home in one
    copy from the device. With `files_dir`, a task's per-row files (segmentation: pred_mask) go there."""
    if batch.errors:  # iter_rows hands the readable part only; called directly, bad items are fatal
        raise PoolError(batch.errors[0][1])
    if not batch.ids:
        return []
    pool_name, has_labels = pool.name, pool.has_labels
    inputs = to_model(batch.inputs, model, device, pool.to_float)
    labels = batch.labels.to(device, non_blocking=True)
    strategy = STRATEGIES[settings.strategy]

    def plain_logits():  # auto with a model that does not name its task: its output's shape tells
        with autocast(settings.precision, device):
            return forward(model, inputs, pool_name)

    task = tasks.resolve(settings.task, model, plain_logits)  # found by the pre-flight forward already
    spec = TASKS[task]
    if spec.rows is not None:  # a task scoring its own batches (detectors)
        if embeddings is not None and embeddings.skipped is None:
            embeddings.skipped = spec.no_badge
        return _own_rows(spec, model, batch, settings, device, pool, inputs)
    words = spec.words(batch, pool, inputs)  # (token -> word [B, T], word counts) or None
    word_ids = None if words is None else words[0]
    logits = None  # gradient strategies take the logits from the engine's own forward
    if not strategy.gradients or embeddings is not None:
        with record(embeddings, model, batch.ids, task, inputs, word_ids), autocast(settings.precision, device):
            logits = forward(model, inputs, pool_name)     # [B, C] (other tasks: tasks.py)
    if logits is not None:
        _check_output(task, logits, batch.labels, batch.ids, pool)
    s = StrategyInputs(model=model, inputs=inputs, labels=labels, logits=logits, ids=batch.ids,
                       layers=settings.layers, method=settings.method, compile=settings.compile,
                       top_classes=settings.top_classes, seed=settings.seed,
                       check_logits=lambda out: _check_output(task, _checked_logits(out), batch.labels,
                                                              batch.ids, pool),
                       task=task, egl_samples=settings.egl_samples, aggregate=settings.aggregate,
                       temperature=settings.temperature, max_new_tokens=settings.max_new_tokens,
                       words=word_ids, given=_given(task, pool, batch.ids, words), decode=_decoder(pool),
                       target=getattr(pool, "align_target", None))
    try:
        with autocast(settings.precision, device):
            cols = strategy.fn(s)
    except UnsupportedModel as err:
        raise RunError(f"--method {settings.method}: {err}") from None
    except (torch.cuda.OutOfMemoryError, RunError, PoolError):
        raise  # out of memory (the engine lets it through): the micro-batcher retries
    except Exception as err:  # noqa: BLE001 - shape errors etc. from user models, in the engine's forward
        raise _cannot_run(inputs, pool_name, err) from None
    score = cols.pop("score")
    texts = {key: cols.pop(key) for key in list(cols) if isinstance(cols[key], list)}  # B strings each
    pred, conf, loss, pred_sets = spec.columns(s, score)  # pred_sets: the extras pred is made of
    finite = torch.isfinite(score)
    if loss is not None:  # a loss undefined (over no position) leaves the other scores as they are
        undefined = no_positions(spec, s.targets).to(score.device)
        finite &= torch.isfinite(loss.to(score.device)) | undefined
    score = torch.where(finite, score, torch.full_like(score, math.nan))  # ranked last, counted
    columns = {"score": score, "pred": pred, "confidence": conf,
               **({"loss": loss} if loss is not None else {}), **spec.extra_columns(s, loss), **cols}
    pending = embeddings.pending() if embeddings else []
    per_word = [s.logits.argmax(-1), word_ids] if words is not None and spec.word_preds else []  # [B, T] each
    lists, extras = _home(list(columns.values()), pending + pred_sets + per_word)
    if embeddings is not None:
        embeddings.keep(extras[:len(pending)])
    values = dict(zip(columns, lists))
    names = pool.classes
    values["pred"] = spec.pred_values(values["pred"], extras[len(pending):], names)
    labels_home = batch.labels.tolist() if has_labels else None
    word_preds = _word_preds(*extras[-2:], words[1], names) if per_word else None
    rows = []
    for i, id_ in enumerate(batch.ids):
        pred = values["pred"][i]
        row = {"id": id_, "score": values["score"][i],
               "pred": class_name(pred, names) if spec.class_pred else pred,
               "confidence": values["confidence"][i] if spec.has_confidence else None}
        if names and spec.class_pred:
            row["pred_index"] = pred
        if has_labels and spec.given_labels:
            row["label"] = task_labels.shown(pool, id_, spec.label_shown)
        elif has_labels:
            row["label"] = class_name(labels_home[i], names) if labels_home[i] >= 0 else None
        for key in list(columns)[3:]:
            row[key] = values[key][i]
        for key, strings in texts.items():
            row[key] = strings[i]
        if word_preds is not None:
            row["pred_words"] = word_preds[i]
        if batch.paths is not None:
            row["path"] = batch.paths[i]
        if batch.texts is not None:
            row["text"] = clip_text(batch.texts[i], settings.text_width)
        rows.append(row)
    if spec.row_files is not None and files_dir and batch.paths is not None:
        spec.row_files(s.logits, rows, batch.paths, files_dir)  # per batch: no pool-sized memory
    return rows


def _own_rows(spec, model: nn.Module, batch: Batch, settings: Settings, device: torch.device,
              pool: Pool, images: list[torch.Tensor]) -> list[dict]:
    """The rows of a task scoring its own batches (a detector's: alcli.tasks.detection), with
    each image's path."""
    given = {}  # alcli review's run: the given labels of a task that reads its own (detection)
    if spec.review_given is not None and STRATEGIES[settings.strategy].given_rows:
        given = {"given": spec.review_given(pool, batch.ids, pool.classes)}
    with autocast(settings.precision, device):
        rows = spec.rows(model, images, batch.ids, settings, pool.classes, **given)
    for row, path in zip(rows, batch.paths or []):
        row["path"] = path
    return rows


def _decoder(pool: Pool):
    """A text pool's token ids -> text (special tokens left out); None off a text pool."""
    tokenize = getattr(getattr(pool, "base", pool), "tokenize", None)
    tok = getattr(tokenize, "tokenizer", None)
    return None if tok is None else (lambda ids: tok.decode(ids, skip_special_tokens=True))


def _given(task: str, pool: Pool, ids: list[str], words):
    """Another task's given labels, read when the logits are known; None without any."""
    spec = TASKS[task]
    if not spec.given_labels or not task_labels.has(pool):
        return None
    return lambda logits: spec.read_labels(pool, ids, logits, words)


def _word_preds(labels: torch.Tensor, word_ids: torch.Tensor, counts: list[int], names) -> list[str]:
    """Token classification on a text: each whitespace word's predicted label, the one at its
    first token (where its given label goes too), by name where the classes are named -> one JSON
    list per example, null for a word past the model's tokens (truncated)."""
    out = []
    for tokens, words, count in zip(labels.tolist(), word_ids.tolist(), counts):
        first: dict[int, int] = {}
        for label, w in zip(tokens, words):
            if w >= 0:
                first.setdefault(w, label)
        out.append(json.dumps([class_name(first[w], names) if w in first else None
                               for w in range(count)], ensure_ascii=False))
    return out


def _home(columns: list[torch.Tensor], extras: list[torch.Tensor] = ()
          ) -> tuple[list[list[float]], list[torch.Tensor]]:
    """[B] columns on the device -> Python lists, and `extras` (the batch's BADGE factors) -> host
    tensors of their dtype, all in one copy (into pinned memory on CUDA). float64 holds every
    score, class index and float32 factor exactly (MPS, which has no float64: float32)."""
    dtype = torch.float32 if columns[0].device.type == "mps" else torch.float64
    parts = [torch.stack([c.detach().to(dtype) for c in columns])] + [e.to(dtype) for e in extras]
    flat = torch.cat([p.flatten() for p in parts])  # [K*B + sum of extras' sizes] on the device
    if flat.device.type == "cuda":
        host = torch.empty(flat.shape, dtype=dtype, pin_memory=True)
        host.copy_(flat, non_blocking=True)
        torch.cuda.current_stream(flat.device).synchronize()  # the batch's one sync
    else:
        host = flat.cpu()
    pieces = host.split([p.numel() for p in parts])
    return (pieces[0].view(parts[0].shape).tolist(),
            [piece.view(e.shape).to(e.dtype) for piece, e in zip(pieces[1:], extras)])


def _cannot_run(inputs: torch.Tensor | dict, pool_name: str, err: Exception) -> RunError:
    if isinstance(inputs, torch.Tensor):
        shape = f"of shape {list(inputs.shape[1:])}"
    else:  # tokenized text
        shape = "with " + ", ".join(f"{k} {list(v.shape[1:])}" for k, v in inputs.items()
                                    if isinstance(v, torch.Tensor))
    return RunError(f"the model cannot run on examples {shape} from {pool_name} ({first_line(err)})")


def _checked_logits(out) -> torch.Tensor:
    """The model's logits, from the tensor it returns or what holds them (a Hugging Face
    output's .logits, a dict's "logits" or "out", a tuple's first element); their shape is
    checked against the task by `_check_output`."""
    try:
        return logits_of(out)
    except TypeError as err:
        raise RunError(str(err)) from None


def _check_output(task: str, logits: torch.Tensor, labels: torch.Tensor, ids: list[str], pool: Pool):
    """The output fits the task, and the pool's labels are ones it can use (Task.check_labels:
    classification labels within its classes, and neither do other tasks get single-class
    labels nor classification labels lists, numbers or masks)."""
    tasks.check(task, logits)
    TASKS[task].check_labels(logits, labels, ids, pool)


def _part(batch: Batch, start: int, size: int) -> Batch:
    stop = start + size
    inputs = batch.inputs[start:stop] if isinstance(batch.inputs, list) else \
        batch_slice(batch.inputs, start, stop)
    return Batch(batch.ids[start:stop], inputs, batch.labels[start:stop], [],
                 paths=None if batch.paths is None else batch.paths[start:stop],
                 texts=None if batch.texts is None else batch.texts[start:stop])


class MicroBatches:
    """Score a batch in pieces no larger than the size that last fit in memory.

    On a CUDA out-of-memory error the piece is halved and retried (down to one example); the size
    that fit is kept for the rest of the run and reported once through `say`. The first batch
    also pays for the engine's first-call probes (layout, checks), so a limit found there is put
    to the test once: the second batch tries the full size again, and falls back to the limit
    only if that fails. The engine is per-example, so the rows are those of an unsplit run (up
    to float32 rounding, which depends on how many examples share a matrix product).
    """

    def __init__(self, say: Callable[[str], None] | None = None):
        self.limit: int | None = None
        self.say = say
        self.batches = 0
        self.first_limit: int | None = None  # the first batch's limit, while the full size is retried
        self.said = False

    def __call__(self, batch: Batch, score: Callable[[Batch], list[dict]]) -> list[dict]:
        if self.batches == 1 and self.limit is not None:
            self.first_limit, self.limit = self.limit, None
        rows = self._split(batch, score)
        self.batches += 1
        self.first_limit = None
        return rows

    def _split(self, batch: Batch, score: Callable[[Batch], list[dict]]) -> list[dict]:
        n, start, rows = len(batch.ids), 0, []
        while start < n:
            size = n - start if self.limit is None else min(self.limit, n - start)
            try:
                rows.extend(score(batch if size == n else _part(batch, start, size)))
            except torch.cuda.OutOfMemoryError:
                if self.first_limit is not None:  # the full size failed again: the first limit holds
                    self.limit, self.first_limit = self.first_limit, None
                    continue
                if size == 1:
                    raise RunError("CUDA ran out of memory on a single example; use a smaller "
                                   "model input, --layers, or another --device") from None
                if not self.said and self.say:
                    self.said = True
                    self.say(f"CUDA out of memory at batch size {size}; scoring in micro-batches "
                             f"of at most {size // 2} from now on")
                self.limit = size // 2
                if torch.cuda.is_initialized():
                    torch.cuda.empty_cache()
                continue
            start += size
        return rows


def iter_rows(model: nn.Module, pool: Pool, settings: Settings, device: torch.device, *,
              embeddings: EmbeddingRecorder | None = None,
              on_errors: Callable[[list[tuple[str, str]]], None] | None = None,
              batches: Iterable[list[int]] | None = None,
              micro: MicroBatches | None = None,
              files_dir: str | None = None) -> Iterator[list[dict]]:
    """Rows batch by batch, streaming the pool through a DataLoader.

    Unreadable examples go to `on_errors` as (id, message) and the rest of the batch is scored;
    without `on_errors` the first one stops the run. Examples of mismatched shapes always do."""
    loader = make_loader(pool, settings.batch_size, settings.workers, device, batches)
    micro = micro or MicroBatches()
    for batch in loader:
        batch = decoded(batch, pool, device)  # --decode gpu: a file it cannot decode is an error
        if batch.mismatch:
            raise PoolError(batch.mismatch)
        if batch.errors:
            if on_errors is None:
                raise PoolError(batch.errors[0][1])
            on_errors(batch.errors)
            batch = batch._replace(errors=[])
        yield micro(batch, lambda b: score_batch(model, b, settings, device, pool,
                                                 embeddings=embeddings, files_dir=files_dir))


@dataclass
class RunStats:
    count: int = 0
    seconds: float = 0.0
    device: str = "cpu"
    strategy: str = "egl"
    method: str | None = None        # engine method used (gradient strategies only)
    method_reason: str | None = None
    notes: list[str] = field(default_factory=list)  # e.g. probability mass left out by --top-classes
    task: str | None = None          # the task scored (--task, or what auto found)
    nans: int = 0                    # rows whose score is NaN (a non-finite loss or norm)
    skipped: int = 0                 # unreadable examples, left out of the rows
    micro_batch: int | None = None   # the micro-batch size that fit after a CUDA out-of-memory

    @property
    def per_second(self) -> float:
        return self.count / self.seconds if self.seconds > 0 else float("inf")


Sink = Callable[[list[dict], list[tuple[str, str]]], None]  # (a batch's rows, its unreadable examples)


def run(model: nn.Module, pool: Pool, settings: Settings, device: torch.device, sink: Sink,
        on_batch: Callable[[int], None] | None = None, *,
        embeddings: EmbeddingRecorder | None = None,
        batches: Iterable[list[int]] | None = None,
        say: Callable[[str], None] | None = None,
        files_dir: str | None = None) -> RunStats:
    """Score the whole pool, batch by batch in pool order, into `sink(rows, errors)`. The model
    must already be on `device`.

    With `embeddings`, each example's BADGE factors are recorded into it as well. Unreadable
    examples are skipped (and go to the sink) unless `settings.strict`. `batches` (lists of pool
    positions) replaces the consecutive batches. `say` gets warnings meant for people as they
    happen. `files_dir`: where a task's per-row files go (OUTPUT.masks)."""
    stats = RunStats(device=str(device), strategy=settings.strategy)
    start = time.perf_counter()
    errors: list[tuple[str, str]] = []
    micro = MicroBatches(say)
    mass_left: list[float] = []  # [sum, max]
    timed = device.type == "cpu" and STRATEGIES[settings.strategy].gradients
    own = tasks.named(settings.task, model)
    if timed and batches is None and own is not None and own.rows is not None:
        batches = first_alone(len(pool), settings.batch_size)
    scored, eta = 0, Estimate(len(pool), settings.strategy)
    for batch_rows in iter_rows(model, pool, settings, device, embeddings=embeddings,
                                on_errors=None if settings.strict else errors.extend,
                                batches=batches, micro=micro, files_dir=files_dir):
        done = len(batch_rows) + len(errors)
        scored += done
        if timed and say:
            note = eta.after(time.perf_counter() - start, scored)
            if note:
                say(note)
        stats.count += len(batch_rows)
        stats.skipped += len(errors)
        stats.nans += sum(1 for r in batch_rows if r["score"] != r["score"])
        left = [r["mass_left"] for r in batch_rows if "mass_left" in r]
        if left:
            mass_left = [sum(left) + (mass_left[0] if mass_left else 0.0),
                         max(left + mass_left[1:])]
        sink(batch_rows, errors)
        errors.clear()
        if on_batch:
            on_batch(done)
    stats.seconds = time.perf_counter() - start
    stats.micro_batch = micro.limit
    stats.task = tasks.known(settings.task, model) or tasks.from_model(model)  # known without a forward
    spec = TASKS.get(stats.task) if stats.task is not None else None
    if spec is not None and settings.strategy in spec.gradient_utilities:
        stats.method, stats.method_reason = spec.method(model, settings.method)
    elif STRATEGIES[settings.strategy].gradients:
        stats.method, stats.method_reason = engine_method(model, settings, engine_loss(spec, settings.strategy))
    if mass_left:
        k = settings.top_classes or DEFAULT_TOP_CLASSES
        stats.notes.append(f"--top-classes {k} leaves out probability mass "
                           f"{mass_left[0] / stats.count:.3g} on average, {mass_left[1]:.3g} at most")
    return stats


LONG_RUN_SECONDS = 180  # a CPU run estimated longer than this is announced after its first batch


def first_alone(n: int, size: int) -> list[list[int]]:
    """Pool positions in batches: the first example alone, then batches of `size`, so a task
    scoring its own batches (a detector: seconds per image on a CPU) is timed before the rest."""
    return [[0]] + [list(range(i, min(n, i + size))) for i in range(1, n, size)] if n else []


class Estimate:
    """The long-run note of a CPU run: announced after its first batch (a detector's first image
    alone), then said again, once, when the next batches run at a rate more than 25% off it (the
    first examples are often not typical: fewer boxes, warm caches). Rates after the first batch
    leave the first batch's time out."""
    CHECKS = 3  # batches after the first whose rate may revise the note

    def __init__(self, total: int, strategy: str):
        self.total, self.strategy = total, strategy
        self.first: tuple[float, int] | None = None  # (seconds, examples) of the first batch
        self.said: float | None = None  # the rate announced (s per example)
        self.checks = 0

    def after(self, seconds: float, done: int) -> str | None:
        """The note to say after `done` examples took `seconds` (from the run's start), or None."""
        if self.first is None:
            self.first = (seconds, done)
            note = estimate(seconds, done, self.total, self.strategy)
            self.said = seconds / done if note and done else None
            return note
        if self.checks >= self.CHECKS or done <= self.first[1]:
            return None
        self.checks += 1
        per = (seconds - self.first[0]) / (done - self.first[1])
        if self.said is not None and abs(per / self.said - 1) <= 0.25:
            return None
        note = estimate(per * done, done, self.total, self.strategy)
        if note is None:
            return None
        revised, self.said, self.checks = self.said is not None, per, self.CHECKS
        return "revised: " + note if revised else note


def estimate(seconds: float, done: int, total: int, strategy: str) -> str | None:
    """The one line announcing a long CPU run, from its first `done` examples' `seconds`; None
    for a run estimated under LONG_RUN_SECONDS."""
    if done <= 0 or total <= done:
        return None
    per = seconds / done
    left = per * (total - done)
    if left <= LONG_RUN_SECONDS:
        return None
    cut = ("`-s gradnorm` (one label set) or a smaller `--egl-samples` cut it" if strategy == "egl"
           else "`-s loss` or `-s entropy` need no gradients")
    return (f"on the CPU this run takes about {left / 60:,.0f} min more ({per:,.1f} s per example, "
            f"{total - done:,} examples left); {cut}")


def engine_method(model: nn.Module, settings: Settings, loss_fn: Callable | None) -> tuple[str, str]:
    """Which engine method served the gradient strategy, and why: `auto` settles per (model,
    layers, loss), so it is asked with the loss the task's strategy took gradients of."""
    if settings.method != "auto":
        return settings.method, "asked for with --method"
    choice = auto_choice(model, settings.layers, loss_fn)
    return choice if choice else ("auto", "not decided yet")
