"""Causal language models (GPT-2, Llama, Qwen2, Mistral; a PEFT adapter on one): the next token
at every position. logits [B, T, V]; position t predicts token t + 1, so the targets [B, T] are
the input ids moved left by one, IGNORE where the next token is not scored (the prompt, padding,
special tokens, the last position). The loss is the mean cross-entropy over an example's scored
tokens: the response's (prompt + response, or chat messages ending with the assistant's), or
every token of a `text` (pools/prompts.py reads the pool; `scored_tokens` finds its tokens).
Its rows show the loss and the perplexity exp(loss).
"""
from __future__ import annotations

import json
import warnings
from xml.sax.saxutils import quoteattr

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ..gradnorm import call_model, grad_norms_per_target, logits_of
from .common import (IGNORE, UTILITIES, Task, aggregate, categorical, confidence, exact_dtype,
                     labels_to_dense, mean_ce, position_loss, seeded_generator)

NOT_SCORED = -1  # `words` of a token that is no target: prompt, padding, special tokens
PAIR = 2  # completions kept in a row: the two answers of a pairwise-preference task


def is_causal_lm(model: nn.Module) -> bool:
    """GPT-2's *LMHeadModel, every *ForCausalLM, and a PEFT model on one."""
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    return type(inner).__name__.endswith(("ForCausalLM", "LMHeadModel"))


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """logits [B, T, V], targets [B, T] (IGNORE where not scored) -> mean CE over scored tokens [B]."""
    return mean_ce(logits, targets, -1)


def lm_cotangent(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """d(sum_i lm_loss_i)/d logits = (softmax - onehot(target)) / n_i at each scored position,
    0 elsewhere: [B, T, V], built in place in one [B, T, V] tensor (torch.func.grad of the loss
    would hold several)."""
    valid = targets != IGNORE                                                  # [B, T]
    out = logits.softmax(-1)
    # 1/n_i or 0, divided in the logits' own dtype (a float64 model's is exact, not fl32(1/n))
    scale = valid.to(out.dtype) / valid.sum(1, keepdim=True).clamp_min(1).to(out.dtype)  # [B, T]
    out.scatter_add_(-1, targets.clamp_min(0).unsqueeze(-1), -torch.ones_like(targets, dtype=out.dtype).unsqueeze(-1))
    return out.mul_(scale.unsqueeze(-1))


lm_loss.cotangent = lm_cotangent  # the engine's closed form of lm_loss's gradient


def scored_tokens(batch, pool, inputs) -> tuple[torch.Tensor, list[int]] | None:
    """[B, T]: 0 at a token the loss predicts (a response's, or any of a text's), NOT_SCORED at
    prompt, padding and special tokens; and each example's count of them. From the pool's
    `start_of` (the character each example's scored part begins at, None: a prompt without an
    answer). None off a prompt pool."""
    base = getattr(pool, "base", pool)
    start_of, tokenize = getattr(base, "start_of", None), getattr(base, "tokenize", None)
    if start_of is None or batch.texts is None or not isinstance(inputs, dict) or "input_ids" not in inputs:
        return None
    steps = inputs["input_ids"].shape[1]
    scored, _ = token_marks(batch.texts, [start_of[i] for i in batch.ids], tokenize)
    marks = np.full((len(batch.ids), steps), NOT_SCORED, dtype=np.int64)
    width = min(steps, scored.shape[1])
    marks[:, :width] = np.where(scored[:, :width], 0, NOT_SCORED)
    words = torch.from_numpy(marks).to(inputs["input_ids"].device)
    return words, (words >= 0).sum(1).tolist()


def token_marks(texts: list[str], starts: list[int | None], tokenize) -> tuple[np.ndarray, np.ndarray]:
    """(scored, real), each [B, T'] bool: the tokens that end after each text's `start` character
    (None: none): those that begin at or after it, and one that straddles it (GPT-2's " word"
    begins at a prompt's trailing space, and carries the answer's characters), special tokens
    left out; and the real tokens. Tokenized as the pool's Tokenize does (a fast tokenizer's
    character offsets; else the answer begins at the first token where the whole text's tokens
    and the prompt's own part ways)."""
    tok = tokenize.tokenizer
    cut = {"truncation": tokenize.max_length is not None, "max_length": tokenize.max_length}
    enc = tok(texts, padding="longest", return_special_tokens_mask=True,
              return_offsets_mapping=bool(getattr(tok, "is_fast", False)), return_tensors="np", **cut)
    real = (enc["attention_mask"] == 1) & (enc["special_tokens_mask"] == 0)     # [B, T']
    if "offset_mapping" in enc:
        begins, ends = enc["offset_mapping"][..., 0], enc["offset_mapping"][..., 1]  # [B, T'] characters
        after = np.stack([(b >= (s if s is not None else np.inf)) | (e > (s if s is not None else np.inf))
                          for b, e, s in zip(begins, ends, starts)])
    else:  # the tokens the whole text shares with its prompt alone are the prompt's; the rest, the response's
        prompts = [_shared(tok(t, **cut)["input_ids"], tok(t[:s], **cut)["input_ids"]) if s is not None else None
                   for t, s in zip(texts, starts)]
        index = np.cumsum(enc["attention_mask"], 1) - 1                         # position among real tokens
        after = np.stack([index[i] >= (p if p is not None else np.inf) for i, p in enumerate(prompts)])
    return real & after, enc["attention_mask"] == 1


def _shared(whole: list[int], prompt: list[int]) -> int:
    """How many tokens `whole` begins with that `prompt` has too: a prompt's trailing space,
    which the whole text's first answer token holds, or its end-of-text token, ends the run."""
    n = 0
    while n < min(len(whole), len(prompt)) and whole[n] == prompt[n]:
        n += 1
    return n


def unanswered(pool, strategy: str) -> str | None:
    """A sentence naming the first row of a prompt pool with no answer token to predict (a
    prompt alone, an empty response, one cut off at the length limit), which `strategy`
    (gradnorm, loss: the loss at the row's own answer) cannot score; None when every row has one.
    Counted as `next_scored` counts targets: a scored token after a real one."""
    base = getattr(pool, "base", pool)
    start_of, tokenize = getattr(base, "start_of", None), getattr(base, "tokenize", None)
    if start_of is None or tokenize is None:
        return None
    text_of = dict(zip(base.ids, base.texts))
    ids, missing = list(pool.ids), []
    for lo in range(0, len(ids), 256):
        chunk = ids[lo:lo + 256]
        scored, real = token_marks([text_of[i] for i in chunk], [start_of[i] for i in chunk], tokenize)
        targets = (scored[:, 1:] & real[:, :-1]).sum(1)                          # [chunk]
        missing += [i for i, n in zip(chunk, targets.tolist()) if n == 0]
    if not missing:
        return None
    first, start = missing[0], start_of[missing[0]]
    limit = tokenize.max_length
    cut = limit is not None and len(tokenize.tokenizer(text_of[first])["input_ids"]) > limit
    why = ("is a prompt without an answer" if start is None else
           "has a text too short to predict any token of" if start == 0 else
           "has an empty response" if not text_of[first][start:].strip() else
           f"has its response cut off at the model's limit of {limit} tokens" if cut else
           "has a response without a token of its own (the tokenizer joins it to the prompt's last)")
    more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
    return (f"row {first}{more} of pool {pool.name} {why}, and --strategy {strategy} needs an "
            f"answer to score (the loss at the row's own response); give each row a response, "
            f"or use --strategy egl, which samples answers from the model for every row")


def next_scored(logits: torch.Tensor, inputs, words: torch.Tensor | None = None) -> torch.Tensor:
    """[B, T] bool: the positions whose next token is scored (`words`); without them (a tensor
    pool of input ids), those whose next token is not padding. Known before the logits are
    (`logits` may be None): the answers are the inputs' own tokens."""
    ids = input_ids(inputs)
    b, t = ids.shape[:2]
    mask = inputs.get("attention_mask") if isinstance(inputs, dict) else None
    real = torch.ones(b, t, dtype=torch.bool, device=ids.device) if mask is None else mask.bool()
    nxt = (words[:, 1:] >= 0) if words is not None else real[:, 1:]
    nxt = nxt & real[:, :-1]  # a padding position predicts nothing (left padding, no BOS)
    return F.pad(nxt.to(ids.device), (0, 1), value=False)


def input_ids(inputs) -> torch.Tensor:
    return inputs["input_ids"] if isinstance(inputs, dict) else inputs


def next_tokens(inputs, valid: torch.Tensor) -> torch.Tensor:
    """[B, T]: the token after each position where it is scored, IGNORE elsewhere."""
    ids = input_ids(inputs).to(valid.device)
    moved = F.pad(ids[:, 1:], (0, 1), value=IGNORE)
    return torch.where(valid, moved, torch.full_like(moved, IGNORE))


def answers(s) -> torch.Tensor:
    """The given answers' tokens as targets [B, T] (a pool with a row without one is refused
    before gradnorm or loss scores it: `unanswered`; a tensor pool's has none: NaN)."""
    return next_tokens(s.inputs, s.valid)


def scored_or_last(valid: torch.Tensor, inputs) -> torch.Tensor:
    """[B, T] bool: `valid`, or for an example with no scored position (a prompt without an
    answer) its last real token, whose next token is what it would say first."""
    ids = input_ids(inputs)
    mask = inputs.get("attention_mask") if isinstance(inputs, dict) else None
    mask = torch.ones_like(ids) if mask is None else mask
    last = (torch.arange(ids.shape[1], device=ids.device) * mask).argmax(1)      # [B] last real token
    at_last = F.one_hot(last, ids.shape[1]).bool().to(valid.device)
    return torch.where(valid.any(1, keepdim=True), valid, at_last)


def uncertainty(s, name: str) -> dict:
    """entropy, margin or least-confidence of the next token, aggregated (--aggregate) over the
    answer's positions; for a prompt without an answer, at its last token (what it would say
    first)."""
    score = aggregate(UTILITIES[name](_dists(s.logits)), scored_or_last(s.valid, s.inputs), s.aggregate)
    return {"score": score, "margin": 1.0 - score} if name == "margin" else {"score": score}


def columns(s, score: torch.Tensor):
    """No pred; the mean probability of the predicted next token over the scored positions (a
    prompt without an answer: the top probability after its last token, what it would say
    first); the loss at the answers (NaN without one)."""
    return (torch.zeros_like(score), confidence(TASK, s.logits, scored_or_last(s.valid, s.inputs)),
            position_loss(s), [])


def perplexity(s, loss: torch.Tensor | None) -> dict:
    return {} if loss is None else {"perplexity": loss.exp()}


def prompt_of(s, i: int) -> torch.Tensor:
    """Example i's prompt [P]: its real tokens before its answer's first (all of them, as the
    tokenizer encodes the prompt, without an answer; at least the first token)."""
    ids = input_ids(s.inputs)[i]
    mask = s.inputs.get("attention_mask") if isinstance(s.inputs, dict) else None
    real = torch.ones_like(ids, dtype=torch.bool) if mask is None else mask[i].bool()
    if s.words is not None and bool((s.words[i] >= 0).any()):
        first = int((s.words[i] >= 0).nonzero()[0])
        real = real & (torch.arange(ids.shape[0], device=ids.device) < max(first, 1))
    return ids[real]


def sample(model, prompt: torch.Tensor, samples: int, temperature: float, steps: int, stop: set,
           generator: torch.Generator | None) -> tuple[list[torch.Tensor], torch.Tensor]:
    """`samples` completions of `prompt` [P], token by token with the model's cache: drawn from
    softmax(logits / temperature) with `generator`, or the most likely token without one; each
    stops after an end-of-text token (`stop`). -> (completions, each [<= steps] long; the mean
    entropy of the distributions its tokens were drawn from [S])."""
    x = prompt.unsqueeze(0).repeat(samples, 1)                        # [S, P]
    out, past = [], None
    done = torch.zeros(samples, dtype=torch.bool)
    entropy_sum, counted = torch.zeros(samples, dtype=torch.float64), torch.zeros(samples)
    with torch.no_grad():
        for _ in range(steps):
            with warnings.catch_warnings():  # transformers 5 renames past_key_values (cache)
                warnings.filterwarnings("ignore", message=".*past_key_values.*")
                o = model(input_ids=x, past_key_values=past, use_cache=True)
            past = getattr(o, "past_key_values", None)
            logp = (o.logits[:, -1].double() / temperature).log_softmax(-1).cpu()   # [S, V]
            live = ~done
            entropy_sum += torch.where(live, -(logp.exp() * logp).sum(-1), 0.0)
            counted += live
            token = (torch.multinomial(logp.exp(), 1, generator=generator)[:, 0] if generator is not None
                     else logp.argmax(-1))
            out.append(torch.where(live, token, -1))
            if stop:
                done |= torch.isin(token, torch.tensor(sorted(stop), dtype=token.dtype))
            if bool(done.all()):
                break
            x = token.unsqueeze(1).to(prompt.device)
            if past is None:  # a model without a cache: read the whole sequence again
                made = torch.stack(out, 1).clamp_min(0).to(prompt.device)
                x = torch.cat([prompt.unsqueeze(0).repeat(samples, 1), made], 1)
    tokens = torch.stack(out, 1)                                       # [S, steps'], -1 after the end
    return [t[t >= 0].to(prompt.device) for t in tokens], entropy_sum / counted.clamp_min(1)


def sequences(prompts: list[torch.Tensor], completions: list[list[torch.Tensor]], pad: int
              ) -> tuple[dict, torch.Tensor]:
    """Every prompt + each of its completions as one right-padded batch [B*S, L] and its
    targets: each completion token at the position before it, IGNORE elsewhere."""
    rows = [(p, c) for p, cs in zip(prompts, completions) for c in cs]
    length = max(len(p) + len(c) for p, c in rows)
    ids = torch.full((len(rows), length), pad, dtype=torch.long, device=prompts[0].device)
    mask = torch.zeros_like(ids)
    targets = torch.full_like(ids, IGNORE)
    for r, (p, c) in enumerate(rows):
        n = len(p) + len(c)
        ids[r, :n] = torch.cat([p, c])
        mask[r, :n] = 1
        targets[r, len(p) - 1:n - 1] = c
    return {"input_ids": ids, "attention_mask": mask}, targets


def egl_completions(s) -> dict:
    """E_y ||grad loss(x, y)|| over completions y the model itself would write after the prompt:
    S of them sampled per example (seeded by --seed and the id; --temperature, --max-new-tokens),
    their norms through one engine pass, the mean as the score with its standard error
    (`egl_se`), and `completion_entropy`, the mean entropy of the distributions their tokens were
    drawn from (a cheap utility of the same samples). `--egl-samples pseudo`: the one most likely
    completion (greedy). On a text pool also, as text, the `prompt` the model continued and
    its first two `completions` (a JSON list): the pair `select --pairwise` hands to Label Studio."""
    greedy = s.egl_samples == "pseudo"
    count = 1 if greedy else int(s.egl_samples)
    config = getattr(s.model, "config", None)
    eos = getattr(config, "eos_token_id", None)
    stop = set(eos if isinstance(eos, list) else [] if eos is None else [eos])
    prompts, completions, entropies = [], [], []
    for i, id_ in enumerate(s.ids):
        prompt = prompt_of(s, i)
        made, entropy = sample(s.model, prompt, count, s.temperature, s.max_new_tokens, stop,
                               None if greedy else seeded_generator(s.seed, id_))
        prompts.append(prompt)
        completions.append(made)
        entropies.append(entropy.mean())
    pad = getattr(config, "pad_token_id", None)
    inputs, targets = sequences(prompts, completions, pad if isinstance(pad, int) else 0)
    norms, _ = grad_norms_per_target(s.model, inputs, [targets], params=s.layers, method=s.method,
                                     loss_fn=lm_loss, compile=s.compile)
    if s.logits is None:  # the rows' loss and confidence: the model on the batch as given
        with torch.no_grad():
            s.logits = logits_of(call_model(s.model, s.inputs)).detach()
    dtype = exact_dtype(s.logits)
    norms = norms[0].to(s.logits.device, dtype).view(len(s.ids), count)          # [B, S]
    cols = {"score": norms.mean(1),
            "completion_entropy": torch.stack(entropies).to(s.logits.device, dtype)}
    if count > 1:
        cols["egl_se"] = norms.std(1) / count ** 0.5
    if s.decode is not None:
        cols["prompt"] = [s.decode(p.tolist()) for p in prompts]
        cols["completions"] = [json.dumps([s.decode(c.tolist()) for c in made[:PAIR]], ensure_ascii=False)
                               for made in completions]
    return cols


def badge(logits: torch.Tensor, h: torch.Tensor, valid: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """BADGE factors the size of the hidden state, not of the vocabulary: b [B, D] the output
    layer's input averaged over the scored positions, a [B, 1] the norm of p - onehot(argmax)
    averaged over them (that mean itself, [B, V], is ~200 KB a row for GPT-2). a * b keeps the
    length of the rank-one gradient embedding, ||a_V (x) b|| = ||a_V|| ||b||, and drops only its
    direction in the vocabulary."""
    rows = valid.nonzero()[:, 0]                                  # [n] the example of each position
    p = logits.detach()[valid].softmax(-1)                        # [n, V]: only the counted positions
    p[torch.arange(len(p)), p.argmax(-1)] -= 1.0                  # p - onehot(argmax)
    count = valid.sum(1, keepdim=True).clamp_min(1)               # [B, 1]
    a = torch.zeros(valid.shape[0], p.shape[1], dtype=p.dtype, device=p.device).index_add_(0, rows, p)
    h = h.detach()                                                # [B, T, D]
    b = torch.zeros(valid.shape[0], h.shape[-1], dtype=h.dtype, device=h.device).index_add_(0, rows, h[valid])
    return (a / count).norm(dim=1, keepdim=True), b / count.to(b.dtype)


def badge_over(logits: torch.Tensor, inputs, words=None) -> torch.Tensor:
    """The positions BADGE averages over: the scored ones, else the prompt's last token."""
    return scored_or_last(next_scored(logits, inputs, words), inputs)


def not_a_causal_lm(model: nn.Module) -> str | None:
    if is_causal_lm(model):
        return None
    return (f"--task causal-lm needs a causal language model (a *ForCausalLM or *LMHeadModel "
            f"directory, or an adapter on one), and the model is a {type(model).__name__}")


def text_area(names, from_name: str, to_name: str) -> str:
    """Label Studio's text-generation control: the annotator writes the answer to the text."""
    return (f"  <TextArea name={quoteattr(from_name)} toName={quoteattr(to_name)} rows=\"6\" "
            f"editable=\"true\" maxSubmissions=\"1\" placeholder=\"the answer\"/>")


def pair(row) -> tuple[str, str, str]:
    """A row's prompt and the first two completions the model sampled for it (egl's `prompt`
    and `completions` columns; a `text` row's prompt is empty, a table cell of nothing); a
    ValueError naming the row when it has not two."""
    answers = row.get("completions")
    try:
        answers = json.loads(answers) if isinstance(answers, str) else answers
    except json.JSONDecodeError:
        answers = None
    if not isinstance(answers, list) or len(answers) < PAIR or not all(isinstance(a, str) for a in answers[:PAIR]):
        raise ValueError(f"the row '{row.get('id')}' has no two completions the model sampled "
                         f"(its completions column)")
    return str(row.get("prompt") or ""), answers[0], answers[1]


def _dists(z: torch.Tensor) -> torch.Tensor:
    return categorical(z, -1)


TASK = Task(
    name="causal-lm", shape="[batch, tokens, vocabulary]", fits=lambda z: z.dim() == 3,
    names_model=is_causal_lm,
    loss=lm_loss, dists=_dists, label_targets=labels_to_dense, valid=next_scored,
    classes=lambda z: z.shape[-1], targets=answers, egl=egl_completions, uncertainty=uncertainty,
    table_loss=position_loss, columns=columns, extra_columns=perplexity,
    pred_values=lambda preds, extras, names: ["" for _ in preds],
    given_labels=False, check_labels=lambda *args: None, words=scored_tokens,
    badge=badge, badge_over=badge_over, unanswered=unanswered,
    probe=lambda z, inputs: (lm_loss, next_tokens(inputs, next_scored(z, inputs))),
    loss_over_positions=True, model_kind="a causal language model", needs_model=not_a_causal_lm,
    reads_prompts=True, control=text_area, pairs=pair, names_classes=False,
    default_strategy="egl",  # no learning curves yet: the incumbent (tests/test_defaults.py)
)
