"""Token classification: a class per token. logits [B, T, C], targets [B, T] long (IGNORE at
special tokens and padding), the mean cross-entropy over an example's valid tokens. Labels as
given: one label per whitespace word of the text (a list, or `a|b|c`), aligned to the tokens
through a fast tokenizer's character offsets: a word's label goes to its first sub-token; its
other sub-tokens, special tokens ([CLS], [SEP]) and padding are IGNORE; a label of null ignores
its word. Its rows show the classes predicted at any token, and each word's prediction
(`pred_words`, JSON), which Label Studio gets as `labels` spans.
"""
from __future__ import annotations

import json
import re

import numpy as np
import torch
import torch.nn.functional as F

from ..errors import PoolError, RunError
from ..files.table import MORE
from ..files.classnames import class_name
from .common import (IGNORE, Task, categorical, egl_sampled, exact_dtype, given_or_predicted,
                     labels_to_dense, mean_ce, named_set, per_position, position_badge, position_loss,
                     predicted, refuse_single_labels, set_columns)
from .shared.labels import label_class, label_text, reader
from .shared.labelstudio import (entities, entity_labels, json_list, loose_list, named_class,
                                 names_control)


def token_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """logits [B, T, C], targets [B, T] (IGNORE at padding) -> mean CE over valid tokens [B]."""
    return mean_ce(logits, targets, -1)


def valid_tokens(logits: torch.Tensor, inputs, words: torch.Tensor | None = None) -> torch.Tensor:
    """[B, T] bool: each word's first sub-token (`words` [B, T], a word's tokens consecutive, -1 for
    special tokens such as [CLS], [SEP] and padding), where its given label goes too; without
    `words` (tensor pools), the attention mask's tokens, else all."""
    b = logits.shape[0]
    if words is not None:
        before = F.pad(words[:, :-1], (1, 0), value=-1)   # [B, T]: the previous token's word
        return ((words >= 0) & (words != before)).to(logits.device).reshape(b, -1)
    if isinstance(inputs, dict) and isinstance(inputs.get("attention_mask"), torch.Tensor):
        return inputs["attention_mask"].to(logits.device).bool().reshape(b, -1)
    n = logits.shape[1] if logits.dim() > 1 else 1
    return torch.ones(b, n, dtype=torch.bool, device=logits.device)


def words(batch, pool, inputs) -> tuple[torch.Tensor, list[int]] | None:
    """On a text pool: each token's word [B, T] (-1: special token or padding) and each text's word
    count (`word_of_tokens`); None otherwise."""
    tokenize = getattr(getattr(pool, "base", pool), "tokenize", None)
    if batch.texts is None or not hasattr(tokenize, "tokenizer") \
            or not isinstance(inputs, dict) or "input_ids" not in inputs:
        return None
    found = word_of_tokens(tokenize.tokenizer, batch.texts, inputs["input_ids"].shape[1],
                           tokenize.max_length)
    return None if found is None else (found[0].to(inputs["input_ids"].device), found[1])


def _token_targets(value, where: str, words: torch.Tensor, text_words: int, classes: int, names
                   ) -> torch.Tensor:
    """Word labels (a list, or `a|b|c` in a CSV) -> [T]: each word's label at its first token,
    IGNORE elsewhere."""
    value = [v or None for v in value.split("|")] if isinstance(value, str) else value
    if not isinstance(value, list):
        raise PoolError(f"{where}: token labels must be a list with one label per word, not "
                        f"{label_text(value)}")
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
            out[t] = label_class(value[w], where, classes, names)
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


def _read(value, where, i, logits, pool, words) -> torch.Tensor:
    if words is None:
        raise RunError(f"{where}: token labels need a text pool tokenized by a fast "
                       f"(Rust) Hugging Face tokenizer, which gives each token's word")
    return _token_targets(value, where, words[0][i], words[1][i], logits.shape[-1], pool.classes)


def _spans(row, n, tag, names, text) -> list[dict]:
    """Each entity as a `labels` span of character offsets into the text
    (code points, as Label Studio stores them), from the per-word predictions (`pred_words`)."""
    words = [m.span() for m in re.finditer(r"\S+", text)]
    if text.endswith(MORE) and words:  # a text cut short: its last word is cut too
        words.pop()
    tags = [named_class(t, names) for t in json_list(row, n, "pred_words")]
    if len(words) > len(tags):
        raise ValueError(f"row {n} (id '{row.get('id')}') predicts {len(tags)} words, but its "
                         f"text has {len(words)}; it is not the text that was scored")
    out = []
    for k, (label, first, last) in enumerate(entities(tags[:len(words)])):
        start, end = words[first][0], words[last][1]
        out.append(tag.region(f"alcli-{n}-{k}", "labels", {
            "start": start, "end": end, "text": text[start:end], "labels": [label]}))
    return out


def review_units(s) -> list[str]:
    """Each labeled word of a labeled text, one unit: [0, its label, p [C] at its first token, the
    word's index] (JSON; tensor pools: the token's index); an unlabeled text, []."""
    targets, known = s.given_targets()                                   # [B, T], IGNORE elsewhere
    p = torch.softmax(s.logits.to(exact_dtype(s.logits)), -1).tolist()  # [B, T, C]
    where = s.words.tolist() if s.words is not None else [list(range(len(r))) for r in targets.tolist()]
    return [json.dumps([[0, y, p[i][t], where[i][t]] for t, y in enumerate(row) if y != IGNORE]
                       if known[i] else []) for i, row in enumerate(targets.tolist())]


def review_pred(units, suggested, names) -> dict:
    """pred: the classes suggested at any labeled word (as score's pred); pred_words and
    label_words: each word's suggested and given label (null: not labeled), JSON lists that
    Label Studio's spans are made of."""
    count = max(u[3] for u in units) + 1
    words, given = [None] * count, [None] * count
    for u, k in zip(units, suggested):
        words[u[3]], given[u[3]] = class_name(k, names), class_name(u[1], names)
    present = sorted(set(suggested))
    return {"pred": "|".join(str(class_name(k, names)) for k in present),
            "pred_words": json.dumps(words), "label_words": json.dumps(given)}


def _dists(z: torch.Tensor) -> torch.Tensor:
    return categorical(z, -1)


TASK = Task(
    name="token-classification", shape="[batch, tokens, classes]", fits=lambda z: z.dim() == 3,
    names_model=lambda model: type(model).__name__.endswith("ForTokenClassification"), from_rank=3,
    loss=token_loss, dists=_dists, label_targets=labels_to_dense,
    valid=valid_tokens, classes=lambda z: z.shape[-1],
    targets=given_or_predicted, egl=egl_sampled, uncertainty=per_position, table_loss=position_loss,
    columns=set_columns(), pred_values=named_set,
    read_labels=reader(lambda z: torch.full(z.shape[:2], IGNORE, dtype=torch.long), _read),
    check_labels=refuse_single_labels("token-classification"), words=words, word_preds=True,
    review_units=review_units, review_pred=review_pred,
    badge=position_badge(_dists, tokens=True),
    probe=lambda z, inputs: (TASK.loss, predicted(TASK, z, TASK.valid(z, inputs))),
    prelabels=_spans,
    unnamed=lambda row, names: any(named_class(t, names) is None
                                   for t in loose_list(row.get("pred_words")) if t is not None),
    shown_by_rows=lambda row: "pred_words" in row,
    control=names_control("token-classification", "Labels", labels=entity_labels),
    from_annotation=lambda regions, names: {"label": json.dumps(
        [[r["value"]["start"], r["value"]["end"], label] for r in regions
         for label in r["value"].get("labels", [])], ensure_ascii=False)},
    loss_over_positions=True,
    no_position=lambda z: None if z.shape[1] else (
        f"the model returns token-classification outputs of shape {list(z.shape)}, with no token "
        f"to score"),
    # the rule in docs/benchmarks.md over the constructed pytokens curves
    # (structured-curves-defaults.json): egl+div lost to entropy (p 0.008), the best cheap utility
    default_strategy="entropy",
)
