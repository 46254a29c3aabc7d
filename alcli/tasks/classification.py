"""Classification: one class per example. logits [B, C], targets [B] long (the label where known,
else the predicted class), cross-entropy per example. Its labels are class indices (class folders,
a manifest's `label`, a tensor pool's y); its rows show the predicted class (by name where named)
and its probability.

egl sums over the K most probable classes c of p(c|x) ||grad loss(x, c)|| (all up to 10 classes,
the 10 most probable beyond, `--top-classes`; `mass_left` says what that leaves out).
"""
from __future__ import annotations

import json

import torch
import torch.nn.functional as F

from ..errors import PoolError, RunError
from ..files.classnames import class_name
from ..gradnorm.loss import cross_entropy
from ..selection.diverse import badge_factors
from .shared import labels as given
from .common import Task, all_positions, categorical, exact_dtype, grad_norms, predicted
from .shared.labelstudio import chosen, names_control, predicted_name

DEFAULT_TOP_CLASSES = 10  # egl over more classes than this sums the 10 most probable by default


def top_classes(setting: int | None, classes: int) -> int:
    """How many classes egl sums over: `setting` (0 = all, exact), by default all up to 10 classes
    and the 10 most probable beyond (the `mass_left` column says what that leaves out)."""
    if setting == 0:
        return classes
    return min(setting or DEFAULT_TOP_CLASSES, classes)


def _most_probable(s) -> list[torch.Tensor]:
    """The K most probable classes of each example, most probable first -> K tensors [B]."""
    probs = s.probs
    k = top_classes(s.top_classes, probs.shape[1])
    order = probs.argsort(dim=1, descending=True, stable=True)[:, :k]  # [B, K]
    return [order[:, j] for j in range(k)]


def egl(s) -> dict:
    """Expected gradient length: sum over classes c of p(c|x) * ||grad loss(x, c)||."""
    norms = grad_norms(s, _most_probable)                     # [K, B]
    order = torch.stack(_most_probable(s), dim=1)             # [B, K], the targets the engine used
    probs = s.probs                                           # [B, C]
    k = order.shape[1]
    weights = probs.gather(1, order)                          # [B, K]
    cols = {"score": (weights * norms.T).sum(dim=1)}
    if k < probs.shape[1]:
        cols["mass_left"] = (1.0 - weights.sum(dim=1)).clamp_min(0.0)
    return cols


def targets(s) -> torch.Tensor:
    """The given label where known, else the predicted class -> [B] long."""
    pred = s.logits.argmax(dim=1)
    return torch.where(s.labels >= 0, s.labels.to(pred.device), pred)


def uncertainty(s, name: str) -> dict:
    """entropy, margin (1 - (p(best) - p(second best)), with the margin itself) or
    least-confidence (1 - p(predicted class)) of the predicted distribution."""
    p = s.probs
    if name == "entropy":
        return {"score": -torch.special.xlogy(p, p).sum(dim=1)}
    if name == "margin":
        top = p.topk(min(2, p.shape[1]), dim=1).values
        gap = top[:, 0] - top[:, 1] if top.shape[1] > 1 else top[:, 0]
        return {"score": 1.0 - gap, "margin": gap}
    return {"score": 1.0 - p.max(dim=1).values}


def table_loss(s) -> torch.Tensor:
    """Cross-entropy at the label where known, else at the predicted class -> [B] float64."""
    z = s.logits.to(exact_dtype(s.logits))
    return F.cross_entropy(z, s.targets, reduction="none")


def columns(s, score: torch.Tensor):
    """The most probable class and its probability, and the loss."""
    conf, pred = s.probs.max(dim=1)
    return pred, conf, table_loss(s), []


def review_units(s) -> list[str]:
    """Each labeled example, one unit: [[0, its label, p [C], 0]] (JSON); an unlabeled one, []."""
    probs, labels = s.probs.tolist(), s.labels.tolist()
    return [json.dumps([[0, y, p, 0]] if y >= 0 else []) for y, p in zip(labels, probs)]


def pred_values(preds: list[float], extras, names) -> list[int]:
    return [int(p) for p in preds]


def refuse_for_classification(pool) -> None:
    """A pool holding other tasks' labels (lists, masks) scored as classification: one sentence."""
    where, value = next(iter(getattr(given.base(pool), "task_labels", None).values()))
    raise PoolError(f"{where}: label {given.label_text(value)} is not a class index (an integer); label "
                    f"lists, numbers and masks need --task multilabel, regression, "
                    f"token-classification or segmentation")


def check_labels(logits: torch.Tensor, labels: torch.Tensor, ids: list[str], pool) -> None:
    """Labels (on the host, as the batch brought them) within the model's classes; no other task's
    labels (lists, numbers, masks)."""
    if given.has(pool):
        refuse_for_classification(pool)
    classes = logits.shape[1]
    for i, label in enumerate(labels.tolist()):
        if label >= classes:
            raise RunError(f"example {ids[i]} of {pool.name} has label {label}, but the "
                           f"model has {classes} classes (0..{classes - 1})")


def check_head_input(name: str, h, logits: torch.Tensor, ids: list) -> None:
    if not isinstance(h, torch.Tensor):
        raise RunError(f"--embeddings: the final layer '{name}' (nn.Linear with "
                       f"{logits.shape[1]} outputs) did not run in the model's forward")
    if h.dim() != 2 or h.shape[0] != len(ids):
        raise RunError(f"--embeddings: the final layer '{name}' gets inputs of shape "
                       f"{list(h.shape)}, not [batch, features]")


def badge(logits: torch.Tensor, h: torch.Tensor, valid) -> tuple[torch.Tensor, torch.Tensor]:
    """p - onehot(argmax) and h: the last layer's gradient at the predicted class is their outer
    product (exact)."""
    probs = torch.softmax(logits.detach().to(exact_dtype(logits)), dim=1)  # [B, C]
    return badge_factors(probs, h)


def prelabels(row, n, tag, names, ref) -> list[dict]:
    """The predicted class, one choice."""
    name = predicted_name(row, names)
    return [] if name is None else [tag.region(f"alcli-{n}", "choices", {"choices": [name]})]


def _dists(z: torch.Tensor) -> torch.Tensor:
    return categorical(z, 1).reshape(z.shape[0], 1, z.shape[1])


TASK = Task(
    name="classification", shape="[batch, classes]", fits=lambda z: z.dim() == 2, from_rank=2,
    loss=cross_entropy, dists=_dists, label_targets=lambda labels, valid, z: labels[..., 0],
    valid=all_positions(lambda z: 1), classes=lambda z: z.shape[1],
    targets=targets, egl=egl, uncertainty=uncertainty, table_loss=table_loss,
    columns=columns, pred_values=pred_values, class_pred=True, review_units=review_units,
    review_pred=lambda units, suggested, names: {"pred": class_name(suggested[0], names)},
    given_labels=False, check_labels=check_labels,
    check_head_input=check_head_input, badge=badge,
    probe=lambda z, inputs: (TASK.loss, predicted(TASK, z, TASK.valid(z, inputs))),
    prelabels=prelabels,
    unnamed=lambda row, names: row.get("pred") is not None and predicted_name(row, names) is None,
    unnamed_note="no predicted class",
    control=names_control("classification", "Choices", "Choice", ' choice="single"'),
    from_annotation=lambda regions, names: {"label": (chosen(regions, "choices") or [None])[0]},
    # the rule in docs/benchmarks.md over issue 39's curves (benchmarks/results/issue39/tables.json;
    # picks in structured-curves-defaults.json): gradnorm ties egl everywhere, cheaper
    default_strategy="gradnorm",
)
