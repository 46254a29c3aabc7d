"""Labels of the tasks other than classification, read from a pool's `task_labels` (each row's
label as given, alcli.pools) once the task and the model's output are known, into targets in
the task's loss layout; each task's module reads its own (`Task.read_labels`), with the helpers
here:

| task | label as given | target of one example |
|---|---|---|
| multilabel | `[0, 3]`, `["cat", "dog"]`, `"cat|dog"` (indices or class names) | [C] 0/1 |
| regression | `2.5`, `[2.5, -1]`, `"2.5|-1"` | [D] float |
| token-classification | one label per word of the text (split on whitespace): a list, or `a|b|c` | [T] long |
| segmentation | a mask image (column `mask`, or `label`): class index per pixel, 255 = ignore (65535 past 255 classes) | [H, W] long |

Token labels are aligned to the tokens through the tokenizer's character offsets: a word's label
goes to its first sub-token; its other sub-tokens, special tokens ([CLS], [SEP]) and padding are
IGNORE. A label of null (None) ignores its word. Any bad label is one sentence naming its row.
"""
from __future__ import annotations

from typing import Callable

import torch

from ...errors import PoolError
from ...pools.common import Pool


def base(pool: Pool) -> Pool:
    return getattr(pool, "base", pool)  # a shard reads its pool's labels


def has(pool: Pool) -> bool:
    return bool(getattr(base(pool), "task_labels", None))


def shown(pool: Pool, id_: str, show: Callable | None = None):
    """The `label` column: `show(label, class names)` (Task.label_shown), else a list joined by |,
    a number, a mask file's path; None if unlabeled."""
    entry = (getattr(base(pool), "task_labels", None) or {}).get(id_)
    if entry is None:
        return None
    value = entry[1]
    if show is not None:
        return show(value, pool.classes)
    return "|".join("" if v is None else str(v) for v in value) if isinstance(value, list) else value


def reader(layout: Callable, read: Callable) -> Callable:
    """A task's `read_labels`: (targets in its loss layout [B, ...] on the logits' device, known [B]
    bool) for the batch `ids`: `layout(logits)` the targets of a batch without labels, `read(value,
    where, i, logits, pool, words)` example i's from its label as given. `words`: each token's
    word [B, T] (-1 special or padding) and each text's word count, for token labels."""
    def read_labels(pool: Pool, ids: list[str], logits: torch.Tensor,
                    words: tuple[torch.Tensor, list[int]] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        given = getattr(base(pool), "task_labels", None) or {}
        b = logits.shape[0]
        out = layout(logits)
        known = torch.zeros(b, dtype=torch.bool)
        for i, id_ in enumerate(ids):
            if id_ not in given:
                continue
            where, value = given[id_]
            out[i] = read(value, where, i, logits, pool, words)
            known[i] = True
        device = logits.device
        return out.to(device), known.to(device)
    return read_labels


def label_text(value) -> str:
    """A label as a message quotes it: a string in quotes, anything else as it is."""
    return repr(value) if isinstance(value, str) else str(value)


def label_class(value, where: str, classes: int, names: list[str] | None) -> int:
    """One class index (or name) of a label list -> its index, within the model's classes."""
    if isinstance(value, str) and not value.strip().lstrip("-").isdigit():
        if not names or value.strip() not in names:
            raise PoolError(f"{where}: label {value!r} is not a class index, nor one of the "
                            f"{len(names or [])} class names known (--class-names)")
        return names.index(value.strip())
    if isinstance(value, (bool, float)) or not isinstance(value, (int, str)):
        raise PoolError(f"{where}: label {label_text(value)} is not a class index (an integer)")
    c = int(value)
    if not 0 <= c < classes:
        raise PoolError(f"{where}: label {c} is out of range: the model has {classes} classes "
                        f"(0..{classes - 1})")
    return c


def label_items(value) -> list:
    """A label list as given: a JSON list, `a|b`, or one label."""
    if isinstance(value, list):
        return value
    if isinstance(value, str):  # `[]`: the empty list, as the multilabel `label` column shows it
        return [v for v in value.split("|") if v.strip()] if value.strip() not in ("", "[]") else []
    return [value]
