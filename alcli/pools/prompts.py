"""Language-model pools (--task causal-lm): .jsonl or Parquet rows holding `text`, or `prompt` and
`response`, or chat `messages` ([{role, content}], rendered with the tokenizer's own chat
template), with an optional `id` (default: the line or row number).

Each row becomes one text, the whole sequence the model reads, and the character where its scored
part begins (`scored_from`): 0 for `text` (every token is predicted), the prompt's length for
`prompt` + `response` and for messages ending with the assistant's (the response's tokens only);
None for a prompt without an answer (`prompt` alone, messages not ending with the assistant's).
"""
from __future__ import annotations

import json
import warnings
from pathlib import Path

from ..errors import PoolError, first_line
from ..files.jsonl import json_objects
from ..files import remote
from .common import Item, Pool, PoolKind, PoolOptions, Text, check_unique_ids

FIELDS = ("text", "prompt", "messages")
SUFFIXES = (".jsonl", ".parquet")


def _wants_prompts(spec, opts: PoolOptions) -> bool:
    """A causal LM's pool (Task.reads_prompts), unless at a URL."""
    return opts.prompts and isinstance(spec, str) and not remote.is_url(spec)


KIND = PoolKind("prompts", _wants_prompts, lambda spec, opts, stdin: from_prompt_file(spec, opts),
                options=("prompts", "tokenizer"))


class PromptPool(Pool):
    kind = "text"

    def __init__(self, name: str, ids: list[str], texts: list[str], scored_from: list[int | None],
                 tokenize):
        self.name, self.ids, self.texts, self.scored_from = name, ids, texts, scored_from
        self.labels = [-1] * len(ids)
        self.has_labels = False
        self.tokenize = tokenize
        self.start_of = dict(zip(ids, scored_from))  # id -> scored_from

    def __getitem__(self, i: int) -> Item:
        return Item(self.ids[i], Text(self.texts[i], self.tokenize), -1, None)


def from_prompt_file(spec: str, opts: PoolOptions) -> PromptPool:
    """The rows of a .jsonl or .parquet file as a PromptPool (read whole: prompts are small)."""
    path = Path(spec)
    if path.suffix.lower() not in SUFFIXES:
        raise PoolError(f"pool {spec}: --task causal-lm reads .jsonl or .parquet rows with text, "
                        f"prompt and response, or messages")
    if opts.tokenizer is None:
        raise PoolError(f"pool {spec} needs a tokenizer: pass --model a Hugging Face model "
                        f"directory that holds one")
    tokenize = opts.tokenizer()
    rows = list(_rows(path))
    if not rows:
        raise PoolError(f"pool {spec} holds no rows")
    ids, texts, starts = [], [], []
    for where, n, row in rows:
        text, start = _sequence(row, where, tokenize.tokenizer)
        id_ = row.get("id")
        ids.append(str(id_) if id_ not in (None, "") else str(n))
        texts.append(text)
        starts.append(start)
    check_unique_ids(spec, ids)
    _say_truncated(spec, ids, texts, tokenize)
    return PromptPool(spec, ids, texts, starts, tokenize)


def _rows(path: Path):
    """(where, row number, row dict) of a .jsonl (numbered from 1) or .parquet (from 0) file."""
    if path.suffix.lower() == ".jsonl":
        try:
            with open(path, encoding="utf-8") as f:
                for n, obj in json_objects(f, lambda n: f"pool {path} line {n}", PoolError):
                    if not isinstance(obj, dict):
                        raise PoolError(f"pool {path} line {n} must be a JSON object with text, "
                                        f"prompt and response, or messages")
                    yield f"pool {path} line {n}", n, obj
        except (OSError, UnicodeDecodeError) as err:
            raise PoolError(f"pool {path} cannot be read ({first_line(err)})") from None
        return
    try:
        import pyarrow.parquet as pq
        table = pq.read_table(path)
    except ImportError:
        raise PoolError("Parquet pools need the pyarrow package; pip install 'alcli[tables]'") from None
    except Exception as err:  # noqa: BLE001 - pyarrow raises many types for a bad file
        raise PoolError(f"pool {path} cannot be read as Parquet ({first_line(err)})") from None
    for n, row in enumerate(table.to_pylist()):
        yield f"pool {path} row {n}", n, row


def _sequence(row: dict, where: str, tokenizer) -> tuple[str, int | None]:
    """A row -> (the text the model reads, the character its scored part starts at, or None
    for a prompt without an answer)."""
    if "messages" in row and row["messages"] is not None:
        return _chat(row["messages"], where, tokenizer)
    if row.get("prompt") is not None:
        prompt, response = _string(row, "prompt", where), row.get("response")
        if response is None:
            return prompt, None
        return prompt + _string(row, "response", where), len(prompt)
    if row.get("text") is not None:
        return _string(row, "text", where), 0
    raise PoolError(f"{where} has none of the fields a causal-lm pool row needs: text, or prompt "
                    f"(and response), or messages")


def _string(row: dict, key: str, where: str) -> str:
    value = row[key]
    if not isinstance(value, str):
        raise PoolError(f"{where}: '{key}' must be a string, not {type(value).__name__}")
    return value


def _chat(messages, where: str, tokenizer) -> tuple[str, int | None]:
    """Chat messages rendered with the tokenizer's template; the last one, the assistant's, is
    the scored response (None: the conversation awaits one)."""
    if not isinstance(messages, list) or not messages or not all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
            for m in messages):
        raise PoolError(f"{where}: 'messages' must be a non-empty list of objects with a string "
                        f"role and content")
    if not getattr(tokenizer, "chat_template", None):
        raise PoolError(f"{where} holds chat messages, but the model's tokenizer has no chat "
                        f"template to render them (set chat_template in its tokenizer_config.json, "
                        f"or give prompt and response instead)")
    messages = [{"role": m["role"], "content": m["content"]} for m in messages]
    try:
        if messages[-1]["role"] != "assistant":
            return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True), None
        full = tokenizer.apply_chat_template(messages, tokenize=False)
        prompt = tokenizer.apply_chat_template(messages[:-1], tokenize=False, add_generation_prompt=True)
    except Exception as err:  # noqa: BLE001 - a template's own errors (jinja) come in many types
        raise PoolError(f"{where}: the tokenizer's chat template cannot render its messages "
                        f"({first_line(err)})") from None
    if not full.startswith(prompt):
        raise PoolError(f"{where}: the chat template renders the conversation without its prompt "
                        f"as a prefix, so the response's tokens cannot be told apart")
    return full, len(prompt)


def _say_truncated(spec: str, ids: list[str], texts: list[str], tokenize) -> None:
    """One warning for the sequences longer than the model's limit (they are cut at it)."""
    limit = tokenize.max_length
    if limit is None:
        return
    lengths = [len(x) for x in tokenize.tokenizer(texts, add_special_tokens=True)["input_ids"]]
    over = [i for i, n in zip(ids, lengths) if n > limit]
    if over:
        warnings.warn(f"{len(over)} sequence(s) of pool {spec} are longer than the model's limit of "
                      f"{limit} tokens and are cut at it (the first: id {json.dumps(over[0])}, "
                      f"{max(lengths)} tokens the longest); their tokens past it count in no score")
