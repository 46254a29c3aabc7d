"""Multilabel: any number of C labels per example. logits [B, C], targets [B, C] float 0/1, binary
cross-entropy summed over the C labels; each label a Bernoulli [1 - p, p] (N = C positions, K = 2).
Labels as given: `[0, 3]`, `["cat", "dog"]`, `"cat|dog"` (indices or class names). Its rows show the
labels predicted (p > 1/2) joined by |.
"""
from __future__ import annotations

import json

import torch
import torch.nn.functional as F

from .shared import labels as given
from ..files.classnames import class_name
from .common import (Task, all_positions, egl_sampled, exact_dtype, given_or_predicted, hf_problem, named_set,
                     per_position, position_loss, predicted, refuse_single_labels, set_columns)
from .shared.labelstudio import chosen, named_class, names_control, predicted_labels


def multilabel_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """logits [B, C], targets [B, C] in {0, 1} -> BCE summed over labels [B]:
    softplus(z) - y z = -y log σ(z) - (1 - y) log(1 - σ(z))."""
    return (F.softplus(logits) - targets.to(logits.dtype) * logits).sum(1)


def _bernoulli(logits: torch.Tensor) -> torch.Tensor:
    """[B, C] -> [B, C, 2]: each label's [1 - p, p]."""
    p = torch.sigmoid(logits.to(exact_dtype(logits)))
    return torch.stack([1.0 - p, p], dim=-1)


def _predicted_set(spec: Task, logits: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """[B, C] bool: the labels predicted (p > 1/2)."""
    return spec.dists(logits).argmax(-1).bool() & valid


def _label_set(value, where: str, classes: int, names) -> torch.Tensor:
    y = torch.zeros(classes, dtype=torch.float64)
    for v in given.label_items(value):
        y[given.label_class(v, where, classes, names)] = 1.0
    return y


def label_shown(value, names) -> str:
    """The `label` cell: the labels by name where named (given as indices or names), joined by |;
    `[]` for an example labeled with none of them (an empty cell: not labeled)."""
    items = [v.strip() if isinstance(v, str) else v for v in given.label_items(value)]
    index = [int(v) if isinstance(v, str) and v.lstrip("-").isdigit() else v for v in items]
    return "|".join(str(class_name(v, names)) for v in index) or "[]"


def _read(value, where, i, logits, pool, words) -> torch.Tensor:
    return _label_set(value, where, logits.shape[1], pool.classes)


def badge(logits: torch.Tensor, h: torch.Tensor, valid) -> tuple[torch.Tensor, torch.Tensor]:
    """σ(z) - [σ(z) > 1/2] and h: exact for BCE."""
    probs = _bernoulli(logits.detach())                            # [B, C, 2]
    onehot = torch.zeros_like(probs).scatter_(-1, probs.argmax(-1, keepdim=True), 1.0)
    return (probs - onehot)[..., 1], h.detach()                    # σ(z) - ŷ per label, [B, C]


def review_units(s) -> list[str]:
    """Each label of a labeled example, one unit: [[j, y_j, [1 - p_j, p_j], j] for j < C] (JSON)."""
    targets, known = s.given_targets()
    p = torch.sigmoid(s.logits.to(exact_dtype(s.logits))).tolist()  # [B, C]
    return [json.dumps([[j, int(y), [1.0 - pj, pj], j] for j, (y, pj) in enumerate(zip(ys, ps))]
                       if k else []) for ys, ps, k in zip(targets.tolist(), p, known.tolist())]


def review_pred(units, suggested, names) -> dict:
    """The labels suggested present, by name, joined by | (empty: none, as score's pred)."""
    return {"pred": "|".join(str(class_name(u[0], names)) for u, k in zip(units, suggested) if k == 1)}


def prelabels(row, n, tag, names, ref) -> list[dict]:
    """Every label the model predicts (p > 1/2; the row's pred, joined by |)."""
    chosen = [name for name in (named_class(p, names) for p in predicted_labels(row, names))
              if name is not None]
    return [tag.region(f"alcli-{n}", "choices", {"choices": chosen})] if chosen else []


TASK = Task(
    name="multilabel", shape="[batch, labels]", fits=lambda z: z.dim() == 2,
    names_model=lambda model: hf_problem(model) == "multi_label_classification",
    loss=multilabel_loss, dists=_bernoulli,
    label_targets=lambda labels, valid, z: labels.to(exact_dtype(z)),
    valid=all_positions(lambda z: z.shape[-1] if z.dim() > 1 else 1), classes=lambda z: z.shape[1],
    targets=given_or_predicted, egl=egl_sampled, uncertainty=per_position, table_loss=position_loss,
    columns=set_columns(_predicted_set), pred_values=named_set,
    label_shown=label_shown, review_units=review_units, review_pred=review_pred,
    read_labels=given.reader(lambda z: torch.zeros(z.shape[0], z.shape[1], dtype=torch.float64), _read),
    check_labels=refuse_single_labels("multilabel"),
    badge=badge, probe=lambda z, inputs: (TASK.loss, predicted(TASK, z, TASK.valid(z, inputs))),
    prelabels=prelabels,
    unnamed=lambda row, names: any(named_class(v, names) is None for v in predicted_labels(row, names)),
    control=names_control("multilabel", "Choices", "Choice", ' choice="multiple"'),
    from_annotation=lambda regions, names: {"label": "|".join(chosen(regions, "choices"))},
    joins_labels=True,  # its labels are written and read as a|b|c
    default_strategy="egl",  # no learning curves yet: the incumbent (tests/test_defaults.py)
)
