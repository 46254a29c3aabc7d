"""Strategies: model outputs (+ per-example gradient norms) -> one score per example.

Every strategy has the same signature, `fn(s: StrategyInputs) -> dict[str, Tensor]`, returning
"score" [B] (higher = more worth labeling) and any extra columns [B] it has. The runner adds the
columns every strategy shares (pred, confidence, label, loss) from the same logits. Every task
(`s.task`, alcli.score.tasks) but classification has its loss, targets and per-position utilities
in tasks.py; the strategies here say how they combine.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import RunError
from ..gradnorm import grad_norms_per_target
from . import tasks
from .tasks import exact_dtype

Columns = dict[str, torch.Tensor]


@dataclass
class StrategyInputs:
    """One batch as a strategy sees it. `logits` come from a plain no-grad forward in eval mode,
    or, for gradient strategies, from the engine's forward (None until the engine has run)."""

    model: nn.Module
    inputs: torch.Tensor       # [B, ...] on the model's device
    labels: torch.Tensor       # [B] long, -1 = unknown
    logits: torch.Tensor | None  # [B, C] detached
    ids: list[str]
    layers: list[str] | None = None  # module patterns for gradient strategies (None = all)
    method: str = "auto"             # engine method
    compile: bool = False            # the engine's --compile
    top_classes: int | None = None   # egl: the K most probable classes (0: all; None: at most 10)
    seed: int = 0
    check_logits: Callable[[torch.Tensor], None] | None = None  # validates the engine's logits
    task: str = "classification"      # alcli.score.tasks.TASKS
    egl_samples: int | str = tasks.DEFAULT_EGL_SAMPLES  # egl's label sets per example, or "pseudo"
    aggregate: str = "mean"           # per-position utilities -> one per example
    # other tasks' given labels: logits -> (targets in the loss's layout, known [B] bool)
    # (alcli.score.labels.targets); None: the pool has none
    given: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]] | None = None
    words: torch.Tensor | None = None  # token classification: each token's word [B, T], -1 special
    _given_targets: tuple | None = None

    @property
    def probs(self) -> torch.Tensor:  # [B, C] float64 (float32 on MPS)
        return torch.softmax(self.logits.to(exact_dtype(self.logits)), dim=1)

    @property
    def valid(self) -> torch.Tensor:  # [B, N] bool: the positions that count (tasks.valid_positions)
        return tasks.valid_positions(self.task, self.logits, self.inputs, self.words)

    @property
    def targets(self) -> torch.Tensor:
        """The given label where known, else the predicted class -> [B] long. Other tasks: their
        given labels (`given`) where known, else the predicted labels; regression needs a target
        value for every example (the prediction as its own target has zero gradient)."""
        if self.task != "classification":
            given, known = self.given_targets() or (None, None)
            if self.task == "regression":
                if known is None or not bool(known.all()):
                    missing = self.ids[0] if known is None else self.ids[int((~known).nonzero()[0])]
                    raise RunError(f"example {missing} has no target value; a regression task's "
                                   f"gradnorm and loss need one for every example (the pool's "
                                   f"label column)")
                return given
            pred = tasks.predicted(self.task, self.logits, self.valid)
            if known is None:
                return pred
            return torch.where(known.view(-1, *[1] * (pred.dim() - 1)), given.to(pred.dtype), pred)
        pred = self.logits.argmax(dim=1)
        return torch.where(self.labels >= 0, self.labels.to(pred.device), pred)


    def given_targets(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(targets, known) from `given`, read once per batch; None without given labels."""
        if self.given is not None and self._given_targets is None:
            self._given_targets = self.given(self.logits)
        return self._given_targets


@dataclass(frozen=True)
class Strategy:
    name: str
    fn: Callable[[StrategyInputs], Columns]
    gradients: bool  # does it call the gradient engine?
    help: str


STRATEGIES: dict[str, Strategy] = {}


def strategy(name: str, *, gradients: bool = False):
    """Register `fn` under `name`; its docstring's first line is its help."""
    def register(fn):
        STRATEGIES[name] = Strategy(name, fn, gradients, (fn.__doc__ or "").strip().splitlines()[0])
        return fn
    return register


def _grad_norms(s: StrategyInputs, choose: Callable[[StrategyInputs], list[torch.Tensor]],
                loss_fn=None) -> torch.Tensor:
    """[K, B] float64 norms of each example's loss gradient at each target set `choose(s)` picks
    (the task's loss unless `loss_fn` is given).

    One forward: when `s.logits` is not known yet, the engine's forward provides it before the
    targets are chosen."""
    def target_sets(logits: torch.Tensor) -> list[torch.Tensor]:
        if s.logits is None:
            if s.check_logits is not None:
                s.check_logits(logits)
            s.logits = logits
        return choose(s)

    norms, _ = grad_norms_per_target(s.model, s.inputs, target_sets, params=s.layers, method=s.method,
                                     loss_fn=loss_fn or tasks.TASKS[s.task].loss, compile=s.compile)
    return norms.detach().to(s.logits.device, exact_dtype(s.logits))


DEFAULT_TOP_CLASSES = 10  # egl over more classes than this sums the 10 most probable by default


def top_classes(setting: int | None, classes: int) -> int:
    """How many classes egl sums over: `setting` (0 = all, exact), by default all up to 10 classes
    and the 10 most probable beyond (the `mass_left` column says what that leaves out)."""
    if setting == 0:
        return classes
    return min(setting or DEFAULT_TOP_CLASSES, classes)


def _most_probable(s: StrategyInputs) -> list[torch.Tensor]:
    """The K most probable classes of each example, most probable first -> K tensors [B]."""
    probs = s.probs
    k = top_classes(s.top_classes, probs.shape[1])
    order = probs.argsort(dim=1, descending=True, stable=True)[:, :k]  # [B, K]
    return [order[:, j] for j in range(k)]


@strategy("egl", gradients=True)
def egl(s: StrategyInputs) -> Columns:
    """Expected gradient length: sum over classes c of p(c|x) * ||grad loss(x, c)||."""
    if s.task == "regression":
        return _egl_regression(s)
    if s.task != "classification":
        return _egl_sampled(s)
    norms = _grad_norms(s, _most_probable)                    # [K, B]
    order = torch.stack(_most_probable(s), dim=1)             # [B, K], the targets the engine used
    probs = s.probs                                           # [B, C]
    k = order.shape[1]
    weights = probs.gather(1, order)                          # [B, K]
    cols = {"score": (weights * norms.T).sum(dim=1)}
    if k < probs.shape[1]:
        cols["mass_left"] = (1.0 - weights.sum(dim=1)).clamp_min(0.0)
    return cols


def _egl_sampled(s: StrategyInputs) -> Columns:
    """Multilabel, segmentation, token classification: E_y ||grad loss(x, y)|| over the model's
    own joint predictive distribution (independent per label / position) is intractable; its
    Monte-Carlo estimate from S label sets drawn per example (seeded by id), all S through one
    backward, with `egl_se`, the estimate's standard error (sample std / sqrt S). `pseudo`: the
    norm at the predicted labels."""
    if s.egl_samples == "pseudo":
        norms = _grad_norms(s, lambda s: [s.targets])[0]
        return {"score": tasks.undefined_as_nan(s.task, s.targets, norms)}
    norms = _grad_norms(s, lambda s: tasks.sampled(s.task, s.logits, s.valid, s.ids,
                                                     s.egl_samples, s.seed))  # [S, B]
    cols = {"score": norms.mean(0)}
    if norms.shape[0] > 1:
        cols["egl_se"] = norms.std(0) / norms.shape[0] ** 0.5
    return cols


def _egl_regression(s: StrategyInputs) -> Columns:
    """Regression, y ~ N(f(x), σ² I), loss ||f - y||²: its gradient is 2 Jᵀ(f - y), so
    E ||grad||² = 4 σ² ||J||²_F exactly, J [D, P] the outputs' Jacobian. The score is its root
    2 σ ||J||_F with σ = 1 (σ scales every score alike): D target sets, output d's gradient each,
    through one backward; no sampling."""
    def outputs(s: StrategyInputs) -> list[torch.Tensor]:
        b = s.logits.shape[0]
        d = s.logits.reshape(b, -1).shape[1]
        return [torch.full((b,), j, dtype=torch.long, device=s.logits.device) for j in range(d)]

    norms = _grad_norms(s, outputs, loss_fn=tasks.output_component)  # [D, B]
    return {"score": 2.0 * norms.square().sum(0).sqrt()}


def _needs_labels(s: StrategyInputs, name: str) -> None:
    if s.task == "regression" and s.given is None:
        raise RunError(f"--strategy {name} on a regression task needs target values (a number, or "
                       f"a list, in the pool's label column; the prediction as its own target "
                       f"gives 0); give them, or use --strategy egl, exact for regression")


@strategy("gradnorm", gradients=True)
def gradnorm(s: StrategyInputs) -> Columns:
    """Gradient norm at the example's label where known, else at the predicted class."""
    _needs_labels(s, "gradnorm")  # NaN where the targets count at no position (tasks.no_positions)
    norms = _grad_norms(s, lambda s: [s.targets])[0]
    return {"score": tasks.undefined_as_nan(s.task, s.targets, norms)}


def loss_at_targets(s: StrategyInputs) -> torch.Tensor:
    """The task's per-example loss at the given label where known, else at the predicted
    labels -> [B] float64 (classification: cross-entropy); NaN where undefined."""
    z = s.logits.to(exact_dtype(s.logits))
    if s.task != "classification":  # NaN where the targets count at no position
        t = s.targets
        return tasks.undefined_as_nan(s.task, t, tasks.TASKS[s.task].loss(z, t))
    return F.cross_entropy(z, s.targets, reduction="none")


@strategy("loss")
def loss(s: StrategyInputs) -> Columns:
    """Cross-entropy loss at the label where known, else at the predicted class."""
    _needs_labels(s, "loss")
    return {"score": loss_at_targets(s)}


@strategy("entropy")
def entropy(s: StrategyInputs) -> Columns:
    """Entropy of the predicted distribution."""
    if s.task != "classification":  # per position (binary per label), aggregated
        return {"score": tasks.utility(s.task, "entropy", s.logits, s.valid, s.aggregate)}
    p = s.probs
    return {"score": -torch.special.xlogy(p, p).sum(dim=1)}


@strategy("margin")
def margin(s: StrategyInputs) -> Columns:
    """1 - (p(best) - p(second best)): the smallest margin ranks first."""
    if s.task != "classification":
        score = tasks.utility(s.task, "margin", s.logits, s.valid, s.aggregate)
        return {"score": score, "margin": 1.0 - score}
    p = s.probs
    top = p.topk(min(2, p.shape[1]), dim=1).values
    gap = top[:, 0] - top[:, 1] if top.shape[1] > 1 else top[:, 0]
    return {"score": 1.0 - gap, "margin": gap}


@strategy("least-confidence")
def least_confidence(s: StrategyInputs) -> Columns:
    """1 - p(predicted class)."""
    if s.task != "classification":
        return {"score": tasks.utility(s.task, "least-confidence", s.logits, s.valid, s.aggregate)}
    return {"score": 1.0 - s.probs.max(dim=1).values}


def seeded_uniform(seed: int, id_: str) -> float:
    """A number in [0, 1) fixed by (seed, id): independent of batch size, order and sharding."""
    digest = hashlib.blake2b(f"{seed}\0{id_}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2.0 ** 64


@strategy("random")
def random(s: StrategyInputs) -> Columns:
    """A seeded random number per example (a baseline)."""
    return {"score": torch.tensor([seeded_uniform(s.seed, i) for i in s.ids], dtype=exact_dtype(s.logits),
                                  device=s.logits.device)}


@strategy("uncertain-boxes")
def uncertain_boxes(s: StrategyInputs) -> Columns:
    """Detection: how many predicted boxes score below --box-threshold."""
    raise RunError(f"--strategy uncertain-boxes counts a detector's boxes, and this is a {s.task} "
                   f"model; use it with --task detection")
