"""Labeling tasks: what a model's output holds per example, the per-example loss the engine
differentiates, the targets it is taken at (labels, predictions, samples), and the per-position
utilities.

| task | logits | targets | loss of example i |
|---|---|---|---|
| classification | [B, C] | [B] long | cross-entropy |
| multilabel | [B, C] | [B, C] float 0/1 | binary cross-entropy summed over the C labels |
| segmentation | [B, C, H, W] | [B, H, W] long | mean cross-entropy over its valid pixels |
| token-classification | [B, T, C] | [B, T] long | mean cross-entropy over its words' first sub-tokens |
| regression | [B, D] ([B]: D = 1) | [B, D] float | squared error summed over the D outputs |

A position whose target is IGNORE (a padding token; an ignored pixel) counts nowhere. Token
classification on a text pool counts each word once, at its first sub-token, labeled or not (the
Hugging Face convention: a fine-tuned model's other sub-tokens are trained with -100): labels,
pseudo-labels, EGL's samples and the per-position utilities all sit there. Every task
but regression is a categorical distribution per position: `dists` gives probs [B, N, K] (multilabel:
N = C labels, K = 2 as [1 - p, p]; classification: N = 1) and `valid` [B, N]; the cheap utilities
are taken per position and aggregated over the valid ones (`aggregate`).
"""
from __future__ import annotations

import hashlib
import math
import weakref
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import RunError
from ..gradnorm.loss import cross_entropy

IGNORE = -100  # a position with this target counts in no loss (HF's and PyTorch's ignore_index)
DEFAULT_EGL_SAMPLES = 8


def exact_dtype(t: torch.Tensor) -> torch.dtype:
    """The dtype scores are computed in: float64, or float32 on MPS, which has no float64."""
    return torch.float32 if t.device.type == "mps" else torch.float64


# --- per-example losses (the engine's loss_fn: (logits, targets) -> [B]) -----------------------

def _mean_ce(logits: torch.Tensor, targets: torch.Tensor, class_dim: int) -> torch.Tensor:
    """Mean cross-entropy over each example's positions whose target is not IGNORE -> [B]
    (0 for an example with none). Written with gather, so torch.func can vmap it."""
    valid = targets != IGNORE
    logp = torch.log_softmax(logits, dim=class_dim)
    picked = logp.gather(class_dim, targets.clamp_min(0).unsqueeze(class_dim)).squeeze(class_dim)
    ce = -(picked * valid).flatten(1).sum(1)
    return ce / valid.flatten(1).sum(1).clamp_min(1)


def segmentation_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """logits [B, C, H, W], targets [B, H, W] -> mean cross-entropy over valid pixels [B]."""
    return _mean_ce(logits, targets, 1)


def token_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """logits [B, T, C], targets [B, T] (IGNORE at padding) -> mean CE over valid tokens [B]."""
    return _mean_ce(logits, targets, -1)


def multilabel_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """logits [B, C], targets [B, C] in {0, 1} -> BCE summed over labels [B]:
    softplus(z) - y z = -y log σ(z) - (1 - y) log(1 - σ(z))."""
    return (F.softplus(logits) - targets.to(logits.dtype) * logits).sum(1)


def regression_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """outputs [B, D] (or [B]), targets the same -> squared error summed over outputs [B]."""
    b = logits.shape[0]
    return (logits.reshape(b, -1) - targets.reshape(b, -1).to(logits.dtype)).square().sum(1)


def output_component(logits: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
    """Output d_i of example i -> [B]: its gradient is row d of the outputs' Jacobian (regression egl)."""
    return logits.reshape(logits.shape[0], -1).gather(1, d.unsqueeze(1)).squeeze(1)


# --- distributions per position --------------------------------------------------------------

def _categorical(logits: torch.Tensor, class_dim: int) -> torch.Tensor:
    """[B, C, *positions] or [B, *positions, C] -> softmax probs [B, N, C] in the exact dtype."""
    z = logits.to(exact_dtype(logits)).movedim(class_dim, -1)
    return z.softmax(-1).reshape(z.shape[0], -1, z.shape[-1])


def _bernoulli(logits: torch.Tensor) -> torch.Tensor:
    """[B, C] -> [B, C, 2]: each label's [1 - p, p]."""
    p = torch.sigmoid(logits.to(exact_dtype(logits)))
    return torch.stack([1.0 - p, p], dim=-1)


def _labels_to_dense(labels: torch.Tensor, valid: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """Position labels [..., B, N] -> targets shaped like the logits without the class dim, IGNORE
    where not valid."""
    return torch.where(valid, labels, torch.full_like(labels, IGNORE))


@dataclass(frozen=True)
class Task:
    name: str
    shape: str                                    # its logits, for messages
    fits: Callable[[torch.Tensor], bool]          # do these logits fit the task?
    loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # the engine's loss_fn
    dists: Callable[[torch.Tensor], torch.Tensor] | None  # logits -> probs [B, N, K]
    # position labels [S, B, N] long (valid [B, N]) -> S target sets in the loss's layout [S, B, ...]
    targets: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor] | None


def _seg_targets(labels, valid, logits):
    h, w = logits.shape[2:]
    return _labels_to_dense(labels, valid, logits).reshape(*labels.shape[:-1], h, w)


TASKS: dict[str, Task] = {t.name: t for t in (
    Task("classification", "[batch, classes]", lambda z: z.dim() == 2, cross_entropy,
         lambda z: _categorical(z, 1).reshape(z.shape[0], 1, z.shape[1]),
         lambda labels, valid, z: labels[..., 0]),
    Task("multilabel", "[batch, labels]", lambda z: z.dim() == 2, multilabel_loss, _bernoulli,
         lambda labels, valid, z: labels.to(exact_dtype(z))),
    Task("segmentation", "[batch, classes, height, width]", lambda z: z.dim() == 4,
         segmentation_loss, lambda z: _categorical(z, 1), _seg_targets),
    Task("token-classification", "[batch, tokens, classes]", lambda z: z.dim() == 3, token_loss,
         lambda z: _categorical(z, -1), _labels_to_dense),
    Task("regression", "[batch, outputs] or [batch]", lambda z: z.dim() in (1, 2), regression_loss,
         None, None),
)}


def valid_positions(task: str, logits: torch.Tensor, inputs, words: torch.Tensor | None = None
                    ) -> torch.Tensor:
    """[B, N] bool: the positions that count. Token classification: each word's first sub-token
    (`words` [B, T], a word's tokens consecutive, -1 for special tokens such as [CLS], [SEP] and
    padding), where its given label goes too; without `words` (tensor pools), the attention
    mask's tokens; every other task: all."""
    b = logits.shape[0]
    if task == "token-classification" and words is not None:
        before = F.pad(words[:, :-1], (1, 0), value=-1)   # [B, T]: the previous token's word
        return ((words >= 0) & (words != before)).to(logits.device).reshape(b, -1)
    if task == "token-classification" and isinstance(inputs, dict) and \
            isinstance(inputs.get("attention_mask"), torch.Tensor):
        return inputs["attention_mask"].to(logits.device).bool().reshape(b, -1)
    n = {"classification": 1, "multilabel": logits.shape[-1] if logits.dim() > 1 else 1,
         "segmentation": math.prod(logits.shape[2:]),
         "token-classification": logits.shape[1] if logits.dim() > 1 else 1}.get(task, 1)
    return torch.ones(b, n, dtype=torch.bool, device=logits.device)


# --- which task a model does --------------------------------------------------------------------

_found: "weakref.WeakKeyDictionary[nn.Module, str]" = weakref.WeakKeyDictionary()


def from_model(model: nn.Module) -> str | None:
    """The task a model's class or config names: Hugging Face `*ForTokenClassification` and
    `config.problem_type` (a one-label sequence classifier is a regression, as HF treats it),
    torchvision's segmentation and detection models; None when it does not say."""
    kind, module = type(model).__name__, type(model).__module__
    if kind.endswith("ForTokenClassification"):
        return "token-classification"
    config = getattr(model, "config", None)
    problem = getattr(config, "problem_type", None)
    if problem == "multi_label_classification":
        return "multilabel"
    if problem == "regression":
        return "regression"
    if problem is None and kind.endswith("ForSequenceClassification") and getattr(config, "num_labels", 0) == 1:
        return "regression"
    if module.startswith("torchvision.models.segmentation"):
        return "segmentation"
    if module.startswith("torchvision.models.detection") or kind.endswith("ForObjectDetection"):
        return "detection"  # alcli.score.detection
    return None


def from_logits(logits: torch.Tensor) -> str | None:
    """[B, C] -> classification, [B, C, H, W] -> segmentation, [B, T, C] -> token classification."""
    return {2: "classification", 3: "token-classification", 4: "segmentation"}.get(logits.dim())


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


def classes(task: str, logits: torch.Tensor) -> int | None:
    """How many classes (labels) the output scores; None for regression."""
    return {"regression": None, "token-classification": logits.shape[-1]}.get(task, logits.shape[1])


def known(setting: str, model: nn.Module) -> str | None:
    """The task `resolve` settled on for this model (None before it ran, for auto)."""
    return setting if setting != "auto" else _found.get(model)


def check(task: str, logits: torch.Tensor) -> None:
    """A RunError naming --task when the model's output does not fit the task; one with no
    pixel (token) to score, an undefined score for every example, is a RunError too."""
    spec = TASKS[task]
    if not spec.fits(logits):
        raise RunError(f"the model returns outputs of shape {list(logits.shape)}, but --task {task} "
                       f"needs {spec.shape}; pass the --task its output fits")
    positions = {"segmentation": logits.shape[2:], "token-classification": logits.shape[1:2]}.get(task)
    if positions is not None and math.prod(positions) == 0:
        what, hint = ("pixel", "; its inputs are too small for it (see --resize)") \
            if task == "segmentation" else ("token", "")
        raise RunError(f"the model returns {task} outputs of shape {list(logits.shape)}, with no "
                       f"{what} to score{hint}")


# --- targets: labels, predictions, samples -----------------------------------------------------

def predicted(task: str, logits: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """The most probable label at every position (multilabel: p > 1/2), as one target set in the
    loss's layout: the pseudo-labels gradnorm and loss use where no label is given."""
    spec = TASKS[task]
    labels = spec.dists(logits).argmax(-1)  # [B, N]; a tie goes to the lower index (absent)
    return spec.targets(labels.unsqueeze(0), valid, logits)[0]


def no_positions(task: str, targets: torch.Tensor) -> torch.Tensor:
    """[B] bool: the examples whose targets count at no position (a mask that ignores every
    pixel, a text without a labeled word); their loss, a mean over no position, is undefined."""
    if task not in ("segmentation", "token-classification"):
        return torch.zeros(targets.shape[0], dtype=torch.bool, device=targets.device)
    return ~(targets != IGNORE).flatten(1).any(1)


def undefined_as_nan(task: str, targets: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """[B] values of the loss (or its gradient's norm) at `targets`, NaN where it is undefined
    (ranked last and counted, as other undefined scores)."""
    empty = no_positions(task, targets).to(values.device)
    return torch.where(empty, torch.full_like(values, math.nan), values)


def _generator(seed: int, id_) -> torch.Generator:
    digest = hashlib.blake2b(f"egl\0{seed}\0{id_}".encode(), digest_size=8).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest, "big") >> 1)


def uniforms(ids: list, positions: int, samples: int, seed: int, device) -> torch.Tensor:
    """[S, B, N] uniforms, fixed by (seed, id): drawn position-major, so an example's first
    positions get the same draws whatever the batch's padding, batch size, order or shard."""
    rows = [torch.rand(positions, samples, generator=_generator(seed, i), dtype=torch.float64)
            for i in ids]
    return torch.stack(rows, dim=1).permute(2, 1, 0).to(device)  # [N, B, S] -> [S, B, N]


def sampled(task: str, logits: torch.Tensor, valid: torch.Tensor, ids: list, samples: int,
            seed: int) -> list[torch.Tensor]:
    """S label sets drawn from the model's own predictive distribution, independently per
    position (categorical) or label (Bernoulli) -> S target sets in the loss's layout."""
    spec = TASKS[task]
    probs = spec.dists(logits)                                       # [B, N, K]
    u = uniforms(ids, probs.shape[1], samples, seed, probs.device)   # [S, B, N]
    cum = probs.cumsum(-1)[..., :-1]                                 # [B, N, K-1]
    labels = (u.unsqueeze(-1).to(cum.dtype) >= cum).sum(-1)          # inverse CDF -> [S, B, N]
    return list(spec.targets(labels, valid, logits).unbind(0))


# --- cheap utilities per position, aggregated per example --------------------------------------

def entropy(p: torch.Tensor) -> torch.Tensor:
    return -torch.special.xlogy(p, p).sum(-1)


def margin(p: torch.Tensor) -> torch.Tensor:
    """1 - (p(best) - p(second best)) per position: large where the two best are close."""
    top = p.topk(min(2, p.shape[-1]), dim=-1).values
    return 1.0 - (top[..., 0] - top[..., 1] if top.shape[-1] > 1 else top[..., 0])


def least_confidence(p: torch.Tensor) -> torch.Tensor:
    return 1.0 - p.max(-1).values


def aggregate(values: torch.Tensor, valid: torch.Tensor, how: str) -> torch.Tensor:
    """[B, N] per-position values -> [B] over each example's valid positions: their mean, their
    max, or (top:Q) the mean of the ceil(Q n) largest of its n; 0 for an example with none."""
    count = valid.sum(1)
    if how == "mean":
        return (values * valid).sum(1) / count.clamp_min(1)
    low = torch.finfo(values.dtype).min
    kept = torch.where(valid, values, torch.full_like(values, low))
    if how == "max":
        return torch.where(count > 0, kept.max(1).values, torch.zeros_like(kept[:, 0]))
    q = float(how.split(":")[1])
    k = torch.ceil(q * count.to(values.dtype)).clamp_min(1)           # [B]
    top = kept.sort(dim=1, descending=True).values                    # [B, N]
    ranks = torch.arange(values.shape[1], device=values.device)
    take = (ranks.unsqueeze(0) < k.unsqueeze(1)) & (top > low)
    return torch.where(take, top, torch.zeros_like(top)).sum(1) / k


UTILITIES = {"entropy": entropy, "margin": margin, "least-confidence": least_confidence}


def utility(task: str, name: str, logits: torch.Tensor, valid: torch.Tensor, how: str) -> torch.Tensor:
    """A cheap utility of `task`'s outputs per example [B], higher = more uncertain, aggregated
    over the valid positions. A RunError in one sentence for a task without it."""
    spec = TASKS[task]
    if spec.dists is None:
        raise RunError(f"--strategy {name} needs a predicted distribution, and a {task} model "
                       f"predicts values; use --strategy egl (exact for regression)")
    return aggregate(UTILITIES[name](spec.dists(logits)), valid, how)


# --- the table's pred and confidence ---------------------------------------------------------------

def predicted_set(task: str, logits: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """[B, C] bool: the labels predicted (multilabel: p > 1/2) or the classes predicted at any
    valid position (segmentation, token classification)."""
    probs = TASKS[task].dists(logits)
    labels = probs.argmax(-1)  # [B, N]
    if task == "multilabel":
        return labels.bool() & valid
    hits = torch.zeros(labels.shape[0], probs.shape[-1], dtype=probs.dtype, device=probs.device)
    return hits.scatter_add_(1, labels, valid.to(probs.dtype)) > 0


def confidence(task: str, logits: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """[B]: the mean over valid positions (labels) of the probability of what is predicted there."""
    return aggregate(TASKS[task].dists(logits).max(-1).values, valid, "mean")


# --- BADGE factors per task (alcli.score.embeddings) -------------------------------------------------

def head_types(task: str) -> tuple[type, ...]:
    """The module types a task's final layer may be: a 1x1 convolution heads segmentation models."""
    return (nn.Linear, nn.Conv2d) if task == "segmentation" else (nn.Linear,)


def head_outputs(module: nn.Module) -> int | None:
    return getattr(module, "out_features", getattr(module, "out_channels", None))


def badge_factors(task: str, logits: torch.Tensor, h: torch.Tensor, valid: torch.Tensor
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """(a [B, C], b [B, D]) with the last layer's gradient at the predicted labels ~ a ⊗ b.
    Classification: p - onehot(argmax) and h (exact). Multilabel: σ(z) - [σ(z) > 1/2] and h
    (exact for BCE). Segmentation and token classification: the mean over valid positions of
    p - onehot(argmax), and the head's input averaged over its positions (tokens: valid ones),
    a rank-one stand-in for the sum over positions. Regression (the prediction as target has zero
    gradient): a = 1, so the distances are those of the features h."""
    b = h.detach()
    if task in ("segmentation", "token-classification"):
        if task == "token-classification" and b.dim() == 3:       # [B, T, D], padding left out
            m = valid.to(b.dtype).unsqueeze(-1)
            b = (b * m).sum(1) / m.sum(1).clamp_min(1)
        elif b.dim() > 2:                                          # [B, D, *positions]
            b = b.flatten(2).mean(2)
    if task == "regression":
        return torch.ones(b.shape[0], 1, dtype=b.dtype, device=b.device), b
    probs = TASKS[task].dists(logits.detach())                     # [B, N, K]
    onehot = torch.zeros_like(probs).scatter_(-1, probs.argmax(-1, keepdim=True), 1.0)
    a = probs - onehot
    if task == "multilabel":
        a = a[..., 1]                                              # σ(z) - ŷ per label, [B, C]
    elif task == "classification":
        a = a[:, 0]
    else:
        m = valid.to(a.dtype).unsqueeze(-1)
        a = (a * m).sum(1) / m.sum(1).clamp_min(1)
    return a, b
