"""Strategies: model outputs (+ per-example gradient norms) -> one score per example.

Every strategy has the same signature, `fn(s: StrategyInputs) -> dict[str, Tensor]`, returning
"score" [B] (higher = more worth labeling) and any extra columns [B] it has (a list of B
strings for a text column: causal-lm egl's completions). The runner adds the
columns every strategy shares (pred, confidence, label, loss) from the same logits. What a
strategy means for a task (its loss, targets, per-position utilities and their aggregation) the
task object says (`s.spec`, alcli.tasks); the strategies here ask it.
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn

from ..errors import RunError
from ..gradnorm import UnsupportedModel
from ..tasks import TASKS, DEFAULT_EGL_SAMPLES, Task
from ..tasks.classification import DEFAULT_TOP_CLASSES  # noqa: F401 - the runner's note on --top-classes
from ..tasks.common import exact_dtype, grad_norms, seeded_uniform, undefined_as_nan
from . import align as align_route
from .align import TargetGradient, along, output_tangent, unlabeled_spread

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
    task: str = "classification"      # its name in alcli.tasks.TASKS
    egl_samples: int | str = DEFAULT_EGL_SAMPLES  # egl's label sets per example, or "pseudo"
    temperature: float = 1.0          # causal-lm egl: completions sampled at this temperature,
    max_new_tokens: int = 32          # of at most this many tokens
    aggregate: str = "mean"           # per-position utilities -> one per example
    # other tasks' given labels: logits -> (targets in the loss's layout, known [B] bool)
    # (Task.read_labels); None: the pool has none
    given: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]] | None = None
    words: torch.Tensor | None = None  # token classification: each token's word [B, T], -1 special
    decode: Callable[[list[int]], str] | None = None  # a text pool's tokenizer: token ids -> text
    target: TargetGradient | None = None  # align: the target set's mean gradient (score/target.py)
    _given_targets: tuple | None = None

    @property
    def probs(self) -> torch.Tensor:  # [B, C] float64 (float32 on MPS)
        return torch.softmax(self.logits.to(exact_dtype(self.logits)), dim=1)

    @property
    def spec(self) -> Task:
        return TASKS[self.task]

    @property
    def valid(self) -> torch.Tensor:  # [B, N] bool: the positions that count (Task.valid)
        return self.spec.valid(self.logits, self.inputs, self.words)

    @property
    def targets(self) -> torch.Tensor:
        """The given label where known, else the predicted class -> [B] long. Other tasks: their
        given labels (`given`) where known, else the predicted labels; regression needs a target
        value for every example (the prediction as its own target has zero gradient)."""
        return self.spec.targets(self)

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
    at_targets: bool = False  # scores each example at its own targets where the task has them
                              # (Task.unanswered is asked: a causal LM's prompt alone is refused)
    given_rows: bool = False  # reads a task's given labels that the rows carry (Task.review_given)
    reads_target: bool = False  # takes --target's mean gradient (score/target.py)


STRATEGIES: dict[str, Strategy] = {}


def strategy(name: str, *, gradients: bool = False, at_targets: bool = False,
             given_rows: bool = False, reads_target: bool = False):
    """Register `fn` under `name`; its docstring's first line is its help."""
    def register(fn):
        STRATEGIES[name] = Strategy(name, fn, gradients, (fn.__doc__ or "").strip().splitlines()[0],
                                    at_targets, given_rows, reads_target)
        return fn
    return register


@strategy("egl", gradients=True)
def egl(s: StrategyInputs) -> Columns:
    """Expected gradient length: sum over classes c of p(c|x) * ||grad loss(x, c)||."""
    return s.spec.egl(s)


def _needs_labels(s: StrategyInputs, name: str) -> None:
    if s.spec.needs_targets and s.given is None:
        raise RunError(f"--strategy {name} on a {s.task} task needs target values (a number, or "
                       f"a list, in the pool's label column; the prediction as its own target "
                       f"gives 0); give them, or use --strategy egl, exact for regression")


@strategy("gradnorm", gradients=True, at_targets=True)
def gradnorm(s: StrategyInputs) -> Columns:
    """Gradient norm at the example's label where known, else at the predicted class."""
    _needs_labels(s, "gradnorm")  # NaN where the targets count at no position (common.no_positions)
    norms = grad_norms(s, lambda s: [s.targets])[0]  # first: its forward sets s.logits
    return {"score": undefined_as_nan(s.spec, s.targets, norms)}


@strategy("align", gradients=True, at_targets=True, reads_target=True)  # a causal LM's rows: each at its own answer
def align(s: StrategyInputs) -> Columns:
    """Alignment with the --target set's mean gradient: the cosine at the example's label, else how far a label can move it."""
    if s.target is None:
        raise RunError("--strategy align needs --target TARGET, a labeled pool whose mean loss "
                       "gradient the examples are aligned with")
    dots = None
    if _ghost_route(s):  # ‖g_i‖ and g_i·ḡ from one backward; its forward sets s.logits
        try:
            norms, dots = align_route.ghost_dots(s)
        except UnsupportedModel:
            _jvp_only[s.model] = True
    if dots is None or not bool(_labeled(s).all()):  # ż = J ḡ by one forward-mode pass
        z, zdot = output_tangent(s.model, s.inputs, s.layers, s.target)
        if s.logits is None:
            if s.check_logits is not None:
                s.check_logits(z)
            s.logits = z.detach()
    device = s.logits.device
    known = _labeled(s).to(device)
    score = torch.full((len(s.ids),), float("nan"), dtype=torch.float64, device=device)
    if known.any():  # cos(g_i, ḡ) at the given label
        if dots is None:
            dots = along(s.spec.loss, z, zdot, s.targets)
            norms = grad_norms(s, lambda s: [s.targets])[0].to(device, torch.float64)
        score = torch.where(known, dots.to(device) / (norms.to(device) * s.target.norm), score)
    if not known.all():  # sqrt(E_y[(g_i(y)·ḡ)²]) / ‖ḡ‖
        score = torch.where(known, score, unlabeled_spread(s, z, zdot) / s.target.norm)
    return {"score": score.to(exact_dtype(s.logits))}


# models the ghost method cannot serve: align's labeled rows take the jvp route
_jvp_only: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _ghost_route(s: StrategyInputs) -> bool:
    """Do the batch's labeled rows (if it may have any) take the ghost route?"""
    if align_route.ROUTE != "ghost" or s.method not in ("auto", "ghost") or s.model in _jvp_only:
        return False
    if s.spec.reads_prompts:
        return True
    if s.spec.given_labels:  # which rows have one is read with the logits
        return s.given is not None
    return bool((s.labels >= 0).any())


def _labeled(s: StrategyInputs) -> torch.Tensor:
    """[B] bool: the rows scored at a label of their own (a causal LM's: its answer, each)."""
    if s.spec.reads_prompts:
        return torch.ones(len(s.ids), dtype=torch.bool)
    if not s.spec.given_labels:  # class indices in the batch's labels, -1 unknown
        return s.labels >= 0
    given = s.given_targets()
    return given[1] if given is not None else torch.zeros(len(s.ids), dtype=torch.bool)


def loss_at_targets(s: StrategyInputs) -> torch.Tensor:
    """The task's per-example loss at the given label where known, else at the predicted
    labels -> [B] float64 (classification: cross-entropy)."""
    return s.spec.table_loss(s)


@strategy("loss", at_targets=True)
def loss(s: StrategyInputs) -> Columns:
    """Cross-entropy loss at the label where known, else at the predicted class."""
    _needs_labels(s, "loss")
    return {"score": loss_at_targets(s)}


@strategy("entropy")
def entropy(s: StrategyInputs) -> Columns:
    """Entropy of the predicted distribution."""
    return s.spec.uncertainty(s, "entropy")


@strategy("margin")
def margin(s: StrategyInputs) -> Columns:
    """1 - (p(best) - p(second best)): the smallest margin ranks first."""
    return s.spec.uncertainty(s, "margin")


@strategy("least-confidence")
def least_confidence(s: StrategyInputs) -> Columns:
    """1 - p(predicted class)."""
    return s.spec.uncertainty(s, "least-confidence")


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


@strategy("review", gradients=True, at_targets=True, given_rows=True)
def review(s: StrategyInputs) -> Columns:
    """gradnorm, with the probabilities of each labeled decision (alcli review's run: a `units` column)."""
    if s.spec.review_units is None:
        reviewed = ", ".join(t.name for t in TASKS.values() if t.review_units is not None)
        raise RunError(f"alcli review reviews the labels of {reviewed} models, and this is a "
                       f"{s.task} model")
    return {**gradnorm(s), "units": s.spec.review_units(s)}
