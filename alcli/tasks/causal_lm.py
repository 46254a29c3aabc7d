"""Causal language models (GPT-2, Llama, Qwen2, Mistral; a PEFT adapter on one): the next token
at every position. logits [B, T, V]; position t predicts token t + 1, so the targets [B, T] are
the input ids moved left by one, IGNORE where the next token is not scored (the prompt, padding,
special tokens, the last position). The loss is the mean cross-entropy over an example's scored
tokens: the response's (prompt + response, or chat messages ending with the assistant's), or
every token of a `text` (files/prompts.py reads the pool; `scored_tokens` finds its tokens).
Its rows show the loss and the perplexity exp(loss).
"""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ..errors import RunError
from .common import (IGNORE, UTILITIES, Task, _categorical, _labels_to_dense, _mean_ce, aggregate,
                     confidence, position_badge, position_loss)

NOT_SCORED = -1  # `words` of a token that is no target: prompt, padding, special tokens


def is_causal_lm(model: nn.Module) -> bool:
    """GPT-2's *LMHeadModel, every *ForCausalLM, and a PEFT model on one."""
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    return type(inner).__name__.endswith(("ForCausalLM", "LMHeadModel"))


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """logits [B, T, V], targets [B, T] (IGNORE where not scored) -> mean CE over scored tokens [B]."""
    return _mean_ce(logits, targets, -1)


def scored_tokens(batch, pool, inputs) -> tuple[torch.Tensor, list[int]] | None:
    """[B, T]: 0 at a token the loss predicts (a response's, or any of a text's), NOT_SCORED at
    prompt, padding and special tokens; and each example's count of them. From the pool's
    `start_of` (the character each example's scored part begins at, None: a prompt without an
    answer) and the tokens' character offsets, tokenized as the pool's Tokenize does (a fast
    tokenizer; else the prompt's own token count marks the boundary). None off a prompt pool."""
    base = getattr(pool, "base", pool)
    start_of, tokenize = getattr(base, "start_of", None), getattr(base, "tokenize", None)
    if start_of is None or batch.texts is None or not isinstance(inputs, dict) or "input_ids" not in inputs:
        return None
    steps = inputs["input_ids"].shape[1]
    starts = [start_of[i] for i in batch.ids]
    tok = tokenize.tokenizer
    cut = {"truncation": tokenize.max_length is not None, "max_length": tokenize.max_length}
    enc = tok(batch.texts, padding="longest", return_special_tokens_mask=True,
              return_offsets_mapping=bool(getattr(tok, "is_fast", False)), return_tensors="np", **cut)
    real = (enc["attention_mask"] == 1) & (enc["special_tokens_mask"] == 0)     # [B, T']
    if "offset_mapping" in enc:
        begins = enc["offset_mapping"][..., 0]                                  # [B, T'] characters
        after = np.stack([b >= (s if s is not None else np.inf) for b, s in zip(begins, starts)])
    else:  # the prompt's own tokens come first; the rest of the real tokens are the response's
        prompts = [len(tok(t[:s], **cut)["input_ids"]) if s is not None else None
                   for t, s in zip(batch.texts, starts)]
        index = np.cumsum(enc["attention_mask"], 1) - 1                         # position among real tokens
        after = np.stack([index[i] >= (p if p is not None else np.inf) for i, p in enumerate(prompts)])
    marks = np.full((len(starts), steps), NOT_SCORED, dtype=np.int64)
    width = min(steps, real.shape[1])
    marks[:, :width] = np.where((real & after)[:, :width], 0, NOT_SCORED)
    words = torch.from_numpy(marks).to(inputs["input_ids"].device)
    return words, (words >= 0).sum(1).tolist()


def next_scored(logits: torch.Tensor, inputs, words: torch.Tensor | None = None) -> torch.Tensor:
    """[B, T] bool: the positions whose next token is scored (`words`); without them (a tensor
    pool of input ids), those whose next token is not padding. Known before the logits are
    (`logits` may be None): the answers are the inputs' own tokens."""
    ids = input_ids(inputs)
    b, t = ids.shape[:2]
    if words is not None:
        nxt = words[:, 1:] >= 0
    elif isinstance(inputs, dict) and isinstance(inputs.get("attention_mask"), torch.Tensor):
        nxt = inputs["attention_mask"][:, 1:].bool()
    else:
        nxt = torch.ones(b, t - 1, dtype=torch.bool, device=ids.device)
    return F.pad(nxt.to(ids.device), (0, 1), value=False)


def input_ids(inputs) -> torch.Tensor:
    return inputs["input_ids"] if isinstance(inputs, dict) else inputs


def next_tokens(inputs, valid: torch.Tensor) -> torch.Tensor:
    """[B, T]: the token after each position where it is scored, IGNORE elsewhere."""
    ids = input_ids(inputs).to(valid.device)
    moved = F.pad(ids[:, 1:], (0, 1), value=IGNORE)
    return torch.where(valid, moved, torch.full_like(moved, IGNORE))


def answers(s) -> torch.Tensor:
    """The given answers' tokens as targets [B, T] (an example without one has none: its loss
    and gradnorm are NaN, ranked last)."""
    return next_tokens(s.inputs, s.valid)


def uncertainty(s, name: str) -> dict:
    """entropy, margin or least-confidence of the next token, aggregated (--aggregate) over the
    answer's positions; for a prompt without an answer, at its last token (what it would say
    first)."""
    valid = s.valid
    ids = input_ids(s.inputs)
    mask = s.inputs.get("attention_mask") if isinstance(s.inputs, dict) else None
    mask = torch.ones_like(ids) if mask is None else mask
    last = (torch.arange(ids.shape[1], device=ids.device) * mask).argmax(1)      # [B] last real token
    at_last = F.one_hot(last, ids.shape[1]).bool().to(valid.device)
    valid = torch.where(valid.any(1, keepdim=True), valid, at_last)
    score = aggregate(UTILITIES[name](_dists(s.logits)), valid, s.aggregate)
    return {"score": score, "margin": 1.0 - score} if name == "margin" else {"score": score}


def columns(s, score: torch.Tensor):
    """No pred; the mean probability of the predicted next token over the scored positions; the
    loss at the answers (NaN without one)."""
    return torch.zeros_like(score), confidence(TASK, s.logits, s.valid), position_loss(s), []


def perplexity(s, loss: torch.Tensor | None) -> dict:
    return {} if loss is None else {"perplexity": loss.exp()}


def no_egl(s):
    raise RunError("--strategy egl on a causal-lm task needs completions sampled from the model, "
                   "which alcli does not do yet; use gradnorm or loss with answers, or entropy "
                   "for prompts alone")


def not_a_causal_lm(model: nn.Module) -> str | None:
    if is_causal_lm(model):
        return None
    return (f"--task causal-lm needs a causal language model (a *ForCausalLM or *LMHeadModel "
            f"directory, or an adapter on one), and the model is a {type(model).__name__}")


def _dists(z: torch.Tensor) -> torch.Tensor:
    return _categorical(z, -1)


TASK = Task(
    name="causal-lm", shape="[batch, tokens, vocabulary]", fits=lambda z: z.dim() == 3,
    names_model=is_causal_lm,
    loss=lm_loss, dists=_dists, label_targets=_labels_to_dense, valid=next_scored,
    classes=lambda z: z.shape[-1], targets=answers, egl=no_egl, uncertainty=uncertainty,
    table_loss=position_loss, columns=columns, extra_columns=perplexity,
    pred_values=lambda preds, extras, names: ["" for _ in preds],
    given_labels=False, check_labels=lambda *args: None, words=scored_tokens,
    badge=position_badge(_dists, tokens=True),
    probe=lambda z, inputs: (lm_loss, next_tokens(inputs, next_scored(z, inputs))),
    loss_over_positions=True, model_kind="a causal language model", needs_model=not_a_causal_lm,
    reads_prompts=True,
)
