"""Labels of the tasks other than classification, read from a pool's `task_labels` (each row's
label as given, alcli.files.pool) once the task and the model's output are known, into targets in
the task's loss layout (alcli.score.tasks):

| task | label as given | target of one example |
|---|---|---|
| multilabel | `[0, 3]`, `["cat", "dog"]`, `"cat|dog"` (indices or class names) | [C] 0/1 |
| regression | `2.5`, `[2.5, -1]`, `"2.5|-1"` | [D] float |
| token-classification | one label per word of the text (split on whitespace): a list, or `a|b|c` | [T] long |
| segmentation | a mask image (column `mask`, or `label`): class index per pixel, 255 = ignore | [H, W] long |

Token labels are aligned to the tokens through the tokenizer's character offsets: a word's label
goes to its first sub-token; its other sub-tokens, special tokens ([CLS], [SEP]) and padding are
IGNORE. A label of null (None) ignores its word. Any bad label is one sentence naming its row.
"""
from __future__ import annotations

import math
import re

import numpy as np
import torch
from PIL import Image

from ..errors import PoolError, RunError, first_line
from ..files.pool import Pool, _crop_box, _resized
from .tasks import IGNORE

MASK_IGNORE = 255  # a mask pixel of this value counts in no loss


def base(pool: Pool) -> Pool:
    return getattr(pool, "base", pool)  # a shard reads its pool's labels


def has(pool: Pool) -> bool:
    return bool(getattr(base(pool), "task_labels", None))


def shown(pool: Pool, id_: str):
    """The `label` column: a list joined by |, a number, a mask file's path; None if unlabeled."""
    entry = (getattr(base(pool), "task_labels", None) or {}).get(id_)
    if entry is None:
        return None
    value = entry[1]
    return "|".join("" if v is None else str(v) for v in value) if isinstance(value, list) else value


def refuse_for_classification(pool: Pool) -> None:
    """A pool holding other tasks' labels (lists, masks) scored as classification: one sentence."""
    where, value = next(iter(getattr(base(pool), "task_labels", None).values()))
    raise PoolError(f"{where}: label {_text(value)} is not a class index (an integer); label "
                    f"lists, numbers and masks need --task multilabel, regression, "
                    f"token-classification or segmentation")


def targets(task: str, pool: Pool, ids: list[str], logits: torch.Tensor,
            words: tuple[torch.Tensor, list[int]] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(targets in the task's loss layout [B, ...] on the logits' device, known [B] bool): the
    given labels of the batch `ids`, zeros where an example has none. `words`: each token's word
    [B, T] (-1 special or padding) and each text's word count (`word_of_tokens`), for token labels."""
    given = getattr(base(pool), "task_labels", None) or {}
    b = logits.shape[0]
    if task == "regression":
        out = torch.zeros(b, logits.reshape(b, -1).shape[1], dtype=torch.float64)
    elif task == "multilabel":
        out = torch.zeros(b, logits.shape[1], dtype=torch.float64)
    elif task == "segmentation":
        out = torch.full((b, *logits.shape[2:]), IGNORE, dtype=torch.long)
    else:
        out = torch.full(logits.shape[:2], IGNORE, dtype=torch.long)
    known = torch.zeros(b, dtype=torch.bool)
    for i, id_ in enumerate(ids):
        if id_ not in given:
            continue
        where, value = given[id_]
        if task == "regression":
            out[i] = _values(value, where, out.shape[1])
        elif task == "multilabel":
            out[i] = _label_set(value, where, logits.shape[1], pool.classes)
        elif task == "segmentation":
            out[i] = _mask(value, where, logits.shape[1], tuple(logits.shape[2:]), pool)
        else:
            if words is None:
                raise RunError(f"{where}: token labels need a text pool tokenized by a fast "
                               f"(Rust) Hugging Face tokenizer, which gives each token's word")
            out[i] = _token_targets(value, where, words[0][i], words[1][i], logits.shape[-1],
                                    pool.classes)
        known[i] = True
    device = logits.device
    return out.to(device), known.to(device)


def _text(value) -> str:
    return repr(value) if isinstance(value, str) else str(value)


def _class(value, where: str, classes: int, names: list[str] | None) -> int:
    """One class index (or name) of a label list -> its index, within the model's classes."""
    if isinstance(value, str) and not value.strip().lstrip("-").isdigit():
        if not names or value.strip() not in names:
            raise PoolError(f"{where}: label {value!r} is not a class index, nor one of the "
                            f"{len(names or [])} class names known (--class-names)")
        return names.index(value.strip())
    if isinstance(value, (bool, float)) or not isinstance(value, (int, str)):
        raise PoolError(f"{where}: label {_text(value)} is not a class index (an integer)")
    c = int(value)
    if not 0 <= c < classes:
        raise PoolError(f"{where}: label {c} is out of range: the model has {classes} classes "
                        f"(0..{classes - 1})")
    return c


def _items(value) -> list:
    """A label list as given: a JSON list, `a|b`, or one label."""
    if isinstance(value, list):
        return value
    if isinstance(value, str):
        return [v for v in value.split("|") if v.strip()] if value.strip() else []
    return [value]


def _label_set(value, where: str, classes: int, names) -> torch.Tensor:
    y = torch.zeros(classes, dtype=torch.float64)
    for v in _items(value):
        y[_class(v, where, classes, names)] = 1.0
    return y


def _values(value, where: str, outputs: int) -> torch.Tensor:
    items = _items(value)
    try:
        if any(isinstance(v, bool) for v in items):
            raise ValueError
        numbers = [float(v) for v in items]
    except (TypeError, ValueError):
        raise PoolError(f"{where}: label {_text(value)} is not a number or a list of numbers "
                        f"(a regression target)") from None
    if len(numbers) != outputs or not all(math.isfinite(v) for v in numbers):
        raise PoolError(f"{where}: label {_text(value)} has {len(numbers)} finite values, but the "
                        f"model has {outputs} outputs" if len(numbers) != outputs else
                        f"{where}: label {_text(value)} is not finite")
    return torch.tensor(numbers, dtype=torch.float64)


def _token_targets(value, where: str, words: torch.Tensor, text_words: int, classes: int, names
                   ) -> torch.Tensor:
    """Word labels (a list, or `a|b|c` in a CSV) -> [T]: each word's label at its first token,
    IGNORE elsewhere."""
    value = [v or None for v in value.split("|")] if isinstance(value, str) else value
    if not isinstance(value, list):
        raise PoolError(f"{where}: token labels must be a list with one label per word, not "
                        f"{_text(value)}")
    if len(value) != text_words:
        raise PoolError(f"{where}: {len(value)} token labels for a text of {text_words} words "
                        f"(split on whitespace); give one label per word")
    out = torch.full(words.shape, IGNORE, dtype=torch.long)
    seen = set()
    for t, w in enumerate(words.tolist()):
        if w < 0 or w in seen or w >= len(value):
            continue
        seen.add(w)
        if value[w] is not None and value[w] != IGNORE:
            out[t] = _class(value[w], where, classes, names)
    return out


def word_of_tokens(tokenizer, texts: list[str], steps: int, max_length: int | None
                   ) -> tuple[torch.Tensor, list[int]] | None:
    """[B, T] each token's whitespace word in its text (-1: special token or padding), and each
    text's number of words; None for a tokenizer without character offsets (not a fast one).
    Tokenized as the pool's Tokenize does, so the positions are the model's."""
    if not getattr(tokenizer, "is_fast", False):
        return None
    enc = tokenizer(texts, padding="longest", truncation=max_length is not None, max_length=max_length,
                    return_offsets_mapping=True, return_special_tokens_mask=True, return_tensors="np")
    offsets = enc["offset_mapping"][:, :steps]                          # [B, T', 2] characters
    real = (enc["special_tokens_mask"][:, :steps] == 0) & (enc["attention_mask"][:, :steps] == 1) \
        & (offsets[..., 1] > offsets[..., 0])
    out = np.full((len(texts), steps), -1, dtype=np.int64)
    counts = []
    for i, text in enumerate(texts):
        spans = np.array([m.span() for m in re.finditer(r"\S+", text)], dtype=np.int64).reshape(-1, 2)
        counts.append(len(spans))
        w = np.searchsorted(spans[:, 0], offsets[i, :, 0], side="right") - 1   # the word starting last before
        inside = (w >= 0) & (offsets[i, :, 0] < spans[w.clip(0), 1] if len(spans) else False)
        out[i, :offsets.shape[1]] = np.where(real[i] & inside, w, -1)
    out = torch.from_numpy(out)
    return out, counts


def _mask(path, where: str, classes: int, size: tuple[int, int], pool: Pool) -> torch.Tensor:
    """A mask image of class indices (255 = ignore), resized and cropped as the pool's images are
    (nearest neighbour; a crop past the edge is ignored), of the model's output size -> [H, W]."""
    transform = getattr(getattr(base(pool), "transform", None), "t", None)
    try:
        with Image.open(path) as img:
            if img.mode not in ("L", "P", "I", "I;16"):
                raise PoolError(f"{where}: mask {path} is a {img.mode} image, not one of class "
                                f"indices (a single-channel PNG, 255 = ignore)")
            img.load()
            if transform is not None and transform.resize is not None:
                img = img.resize(_resized(img.size, transform.resize), Image.NEAREST)
            if transform is not None and transform.center_crop is not None:
                img = _crop_ignoring(img, transform.center_crop)
            m = np.array(img).astype(np.int64)
    except PoolError:
        raise
    except Exception as err:  # noqa: BLE001 - any unreadable mask is a sentence naming it
        raise PoolError(f"{where}: mask {path} cannot be read ({first_line(err)})") from None
    if tuple(m.shape) != size:
        raise PoolError(f"{where}: mask {path} is {m.shape[1]}x{m.shape[0]} pixels but the model's "
                        f"output for its image is {size[1]}x{size[0]}")
    bad = (m != MASK_IGNORE) & ((m < 0) | (m >= classes))
    if bad.any():
        raise PoolError(f"{where}: mask {path} holds class {int(m[bad][0])}, but the model has "
                        f"{classes} classes (0..{classes - 1}; 255 = ignore)")
    return torch.from_numpy(np.where(m == MASK_IGNORE, IGNORE, m))


def _crop_ignoring(img, crop):
    box = _crop_box(img.size, crop)
    canvas = Image.new(img.mode, (box[2] - box[0], box[3] - box[1]), MASK_IGNORE)
    canvas.paste(img, (-box[0], -box[1]))
    return canvas


__all__ = ["has", "shown", "targets", "word_of_tokens", "refuse_for_classification", "MASK_IGNORE"]
