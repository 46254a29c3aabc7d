"""--task causal-lm end to end: `alcli score POOL.jsonl -m DIR` on tiny GPT-2, Llama (RMSNorm,
rotary, grouped-query attention, SwiGLU, tied embeddings), Qwen2 and Mistral models and a LoRA
adapter, against a float64 loop in which every row is tokenized alone (no padding) and its loss
is the mean next-token cross-entropy over its response's tokens (those ending after the
prompt's end: beginning there or later, or straddling it, as GPT-2's " word" after a prompt's
trailing space; docs/tasks.md)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from cli_errors import assert_one_error
from conftest import parse_csv, score_in

pytest.importorskip("transformers")
import hf_models  # noqa: E402

TEMPLATE = ("{% for m in messages %}{{ m['role'] }} : {{ m['content'] }} {% endfor %}"
            "{% if add_generation_prompt %}assistant : {% endif %}")
ROWS = [
    {"id": "p1", "prompt": "the cat sat on", "response": " the mat"},
    {"id": "t1", "text": "a dog ran fast and then stopped"},
    {"id": "p2", "prompt": "big red bird", "response": " flew away and then stopped on a small blue mat"},
    {"id": "c1", "messages": [{"role": "user", "content": "the dog ran"},
                              {"role": "assistant", "content": "fast and then stopped"}]},
    {"id": "p3", "prompt": "small", "response": " bird"},
    {"id": "q1", "prompt": "the red dog"},   # no answer: gradnorm and loss refuse the pool
]
ANSWERED = ROWS[:5]  # every row with an answer, as gradnorm and loss need


def lm(family: str, vocab: int):
    import transformers as tf
    common = dict(vocab_size=vocab, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, pad_token_id=0)
    if family == "gpt2":
        return tf.GPT2LMHeadModel(tf.GPT2Config(vocab_size=vocab, n_embd=32, n_layer=2, n_head=2,
                                                n_positions=64, pad_token_id=0, bos_token_id=2, eos_token_id=3))
    if family == "llama":
        return tf.LlamaForCausalLM(tf.LlamaConfig(tie_word_embeddings=True, **common))
    if family == "qwen2":
        return tf.Qwen2ForCausalLM(tf.Qwen2Config(tie_word_embeddings=False, **common))
    return tf.MistralForCausalLM(tf.MistralConfig(sliding_window=None, **common))


MODELS = {"gpt2-right": ("gpt2", "right"), "gpt2-left": ("gpt2", "left"), "llama-left": ("llama", "left"),
          "qwen2-right": ("qwen2", "right"), "mistral-left": ("mistral", "left"),
          "gpt2-plain-left": ("gpt2", "left")}  # a tokenizer adding no special token, as GPT-2's


def plain_tokenizer(directory: Path):
    """A word-level tokenizer over VOCAB that adds no special token (no [CLS] first, as GPT-2's)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    core = Tokenizer(models.WordLevel({w: i for i, w in enumerate(hf_models.VOCAB)}, unk_token="[UNK]"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=core, pad_token="[PAD]", unk_token="[UNK]",
                                   model_max_length=64, model_input_names=["input_ids", "attention_mask"])


@pytest.fixture(scope="module")
def ws(tmp_path_factory):
    root = tmp_path_factory.mktemp("lm_ws")
    torch.manual_seed(0)
    for name, (family, side) in MODELS.items():
        lm(family, len(hf_models.VOCAB)).save_pretrained(root / name)
        tok = plain_tokenizer(root / name) if "plain" in name else hf_models.tokenizer(root / name, token_types=False)
        tok.chat_template = TEMPLATE
        tok.save_pretrained(root / name)
        config = json.loads((root / name / "tokenizer_config.json").read_text())
        config["padding_side"] = side  # what transformers reads back (the attribute is not saved)
        (root / name / "tokenizer_config.json").write_text(json.dumps(config))
    (root / "pool.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    return root


def sequence(row: dict) -> tuple[str, str | None]:
    """(the whole text, its prompt) as the template and the fields give them, written out here."""
    if "messages" in row:
        user, answer = row["messages"]
        prompt = f"user : {user['content']} assistant : "
        return prompt + f"{answer['content']} ", prompt
    if "text" in row:
        return row["text"], ""
    return row["prompt"] + row.get("response", ""), row["prompt"] if "response" in row else None


def answer_tokens(tok, row: dict) -> tuple[dict, list[int]]:
    """The row's encoding alone, and its answer's tokens: those that end after its prompt's end
    (begin at or after it, or straddle it: the answer's characters are in them; docs/tasks.md),
    special tokens and the first token left out."""
    text, prompt = sequence(row)
    enc = tok(text, return_offsets_mapping=True, return_special_tokens_mask=True)
    return enc, [t for t, ((start, end), special) in enumerate(zip(enc["offset_mapping"], enc["special_tokens_mask"]))
                 if prompt is not None and t > 0 and (start >= len(prompt) or end > len(prompt)) and not special]


def answered(ws, name: str) -> tuple[str, list[dict]]:
    """A pool of the rows of ANSWERED with answer tokens under the model's tokenizer (the
    qwen2 directory's loads as Qwen2Tokenizer, which folds p3's short response into one token
    with its prompt), and those rows."""
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(ws / name)
    rows = [r for r in ANSWERED if answer_tokens(tok, r)[1]]
    assert len(rows) >= 4, name
    (ws / f"answered-{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return f"answered-{name}.jsonl", rows


def oracle(model, tok, rows, only=None) -> tuple[list[float], list[float]]:
    """(loss, gradient norm) per row in float64, each row alone: the loss over its answer's
    tokens (`answer_tokens`, special tokens left out); norm over `only`
    (a name filter) or every parameter that requires grad."""
    m = model.double().eval()
    params = [p.requires_grad_() for n, p in m.named_parameters() if (only(n) if only else p.requires_grad)]
    losses, norms = [], []
    for row in rows:
        enc, scored = answer_tokens(tok, row)
        ids = torch.tensor([enc["input_ids"]])                                 # [1, T]
        assert scored, row["id"]  # gradnorm and loss refuse a row without them
        logits = m(input_ids=ids).logits[0]                                    # [T, V]
        loss = F.cross_entropy(logits[[t - 1 for t in scored]], ids[0, scored])  # position t-1 predicts t
        grads = torch.autograd.grad(loss, params, allow_unused=True)
        losses.append(loss.item())
        norms.append(torch.sqrt(sum(g.square().sum() for g in grads if g is not None)).item())
    return losses, norms


def by_id(text: str) -> dict:
    return {r["id"]: r for r in parse_csv(text)}


def assert_close(got: dict, want: list[float], column: str, rows: list[dict], rel=1e-6):
    assert len(want) == len(rows) == len(got)
    for row, w in zip(rows, want):
        value = float(got[row["id"]][column])
        assert abs(value - w) <= rel * abs(w), (row["id"], column, value, w)


@pytest.mark.parametrize("name", list(MODELS))
def test_gradnorm_and_loss_match_the_float64_loop_on_every_family(ws, name):
    from transformers import AutoModelForCausalLM, AutoTokenizer
    pool, pool_rows = answered(ws, name)
    result = score_in(ws, pool, "-m", name, "--task", "causal-lm", "-s", "gradnorm", "-b", "4",
                      "--no-embeddings")
    rows = by_id(result.stdout)
    loss_rows = by_id(score_in(ws, pool, "-m", name, "-s", "loss", "-b", "6", "--no-embeddings").stdout)
    tok = AutoTokenizer.from_pretrained(ws / name)
    losses, norms = oracle(AutoModelForCausalLM.from_pretrained(ws / name), tok, pool_rows)
    assert_close(rows, norms, "score", rows=pool_rows)
    assert_close(loss_rows, losses, "score", rows=pool_rows)
    assert_close(loss_rows, [float(torch.tensor(x).exp()) for x in losses], "perplexity", rows=pool_rows)


def test_every_layer_has_its_rule_and_auto_is_ghost(ws):
    """RMSNorm, rotary attention (q/k/v/o Linears), SwiGLU and the tied embedding: a layer rule
    each, none the generic fallback, and auto settles on ghost."""
    from transformers import AutoModelForCausalLM
    from alcli.gradnorm import explain, per_example_grad_norms
    from alcli.tasks.causal_lm import lm_loss
    model = AutoModelForCausalLM.from_pretrained(ws / "llama-left").eval()
    ids = torch.randint(5, 25, (3, 6))
    per_example_grad_norms(model, {"input_ids": ids}, F.pad(ids[:, 1:], (0, 1), value=-100), loss_fn=lm_loss)
    seen = explain(model, loss_fn=lm_loss)
    assert seen["auto"][0] == "ghost"
    rules = {name: rule for name, _, rule, _ in seen["rules"]}
    assert rules["model.norm"] == "norm" and rules["model.layers.0.input_layernorm"] == "norm"
    assert "generic" not in rules.values()


@pytest.mark.parametrize("name", ["gpt2-right", "llama-left"])
@pytest.mark.parametrize("method", ["auto", "ghost"])
def test_a_float64_model_is_exact_under_the_batched_methods(ws, name, method):
    """A float64 model's norms through the engine with lm_loss (rows padded together on the
    right) against the float64 loop (each row alone) to 1e-12: lm_cotangent's 1/n in float32
    was off by up to 6e-8 (issue 53)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from alcli.gradnorm import grad_norms_per_target
    from alcli.tasks.causal_lm import lm_loss
    tok = AutoTokenizer.from_pretrained(ws / name)
    _, rows = answered(ws, name)
    model = AutoModelForCausalLM.from_pretrained(ws / name).double().eval()
    encoded = [answer_tokens(tok, r) for r in rows]
    width = max(len(enc["input_ids"]) for enc, _ in encoded)
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    mask = torch.zeros(len(rows), width, dtype=torch.long)
    targets = torch.full((len(rows), width), -100)
    for i, (enc, scored) in enumerate(encoded):
        n = len(enc["input_ids"])
        ids[i, :n], mask[i, :n] = torch.tensor(enc["input_ids"]), 1
        for t in scored:  # position t - 1 predicts token t
            targets[i, t - 1] = enc["input_ids"][t]
    norms, _ = grad_norms_per_target(model, {"input_ids": ids, "attention_mask": mask}, [targets],
                                     method=method, loss_fn=lm_loss)
    assert norms.dtype == torch.float64
    _, want = oracle(model, tok, rows)
    for row, got, w in zip(rows, norms[0].tolist(), want):
        assert abs(got - w) <= 1e-12 * abs(w), (row["id"], got, w)


ADAPTED = {"llama-left": ["q_proj", "v_proj"], "gpt2-left": ["c_attn", "c_fc"],
           "qwen2-right": ["k_proj", "down_proj"]}  # GPT-2's targets are Conv1D (fan_in_fan_out)


def make_adapter(ws, base: str) -> Path:
    """A LoRA adapter (r = 4, lora_B drawn at random, not zero) on `base`, saved with its base
    named relative to the adapter directory."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM
    torch.manual_seed(1)
    peft_model = get_peft_model(AutoModelForCausalLM.from_pretrained(ws / base),
                                LoraConfig(r=4, lora_alpha=8, target_modules=ADAPTED[base],
                                           fan_in_fan_out=base.startswith("gpt2")))
    with torch.no_grad():  # lora_B starts at zero: make the adapter do something
        for n, p in peft_model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.1)
    folder = ws / f"lora-{base}"
    peft_model.save_pretrained(folder)
    config = json.loads((folder / "adapter_config.json").read_text())
    config["base_model_name_or_path"] = f"../{base}"  # relative to the adapter directory
    (folder / "adapter_config.json").write_text(json.dumps(config))
    return folder


@pytest.mark.parametrize("base", list(ADAPTED))
def test_a_lora_adapter_is_scored_over_its_own_parameters_by_default(ws, base):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # peft on fan_in_fan_out
        adapter = make_adapter(ws, base)
    pool, pool_rows = answered(ws, base)
    rows = by_id(score_in(ws, pool, "-m", adapter.name, "-s", "gradnorm", "-b", "4", "--no-embeddings").stdout)
    tok = AutoTokenizer.from_pretrained(ws / base)
    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(ws / base), str(adapter))
    _, norms = oracle(model, tok, pool_rows, only=lambda n: "lora_" in n)
    assert_close(rows, norms, "score", rows=pool_rows)
    if base != "llama-left":
        return
    # --layers chooses otherwise: the frozen base's last RMSNorm and (tied) output layer
    rows = by_id(score_in(ws, pool, "-m", adapter.name, "-s", "gradnorm", "-b", "4", "--no-embeddings",
                          "--layers", "base_model.model.model.norm", "--layers", "base_model.model.lm_head").stdout)
    _, norms = oracle(model, tok, pool_rows, only=lambda n: n.endswith(("model.model.norm.weight", "embed_tokens.weight")))
    assert_close(rows, norms, "score", rows=pool_rows)


def test_bad_input_is_one_sentence(ws, tmp_path):
    (tmp_path / "nofields.jsonl").write_text(json.dumps({"id": "x", "answer": "the cat"}) + "\n")
    (tmp_path / "chat.jsonl").write_text(json.dumps(ROWS[3]) + "\n")
    cases = [
        (["nofields.jsonl", "-m", ws / "gpt2-right"], "line 1 has none of the fields"),
    ]
    for args, words in cases:
        result = score_in(tmp_path, *args, "--task", "causal-lm", ok=False)
        assert_one_error(result, words, str(args))
    # a tokenizer without a chat template
    import shutil
    shutil.copytree(ws / "gpt2-right", tmp_path / "plain")
    cfg = json.loads((tmp_path / "plain" / "tokenizer_config.json").read_text())
    cfg.pop("chat_template", None)
    (tmp_path / "plain" / "tokenizer_config.json").write_text(json.dumps(cfg))
    (tmp_path / "plain" / "chat_template.jinja").unlink(missing_ok=True)
    assert_one_error(score_in(tmp_path, "chat.jsonl", "-m", "plain", ok=False), "no chat template", "chat")
    # a model that is not a causal LM
    hf_models.bert(len(hf_models.VOCAB)).save_pretrained(tmp_path / "bert")
    hf_models.tokenizer(tmp_path / "bert").save_pretrained(tmp_path / "bert")
    assert_one_error(score_in(tmp_path, "chat.jsonl", "-m", "bert", "--task", "causal-lm", ok=False),
                     "needs a causal language model", "bert")


def test_sequences_past_the_limit_are_cut_and_said_once(ws):
    result = score_in(ws, "pool.jsonl", "-m", "gpt2-right", "-s", "entropy", "--max-length", "6",
                      "--no-embeddings")
    said = [line for line in result.stderr.splitlines() if "longer than the model's limit" in line]
    assert len(said) == 1 and "4 sequence(s)" in said[0], result.stderr
    assert len(parse_csv(result.stdout)) == len(ROWS)


def test_entropy_of_a_prompt_alone_is_that_of_its_next_token(ws):
    """A prompt without an answer: the entropy of the distribution after its last token; with
    one: the mean over the answer's positions. Oracle: each row alone in float64."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    rows = by_id(score_in(ws, "pool.jsonl", "-m", "gpt2-left", "-s", "entropy", "-b", "6",
                          "--no-embeddings").stdout)
    model = AutoModelForCausalLM.from_pretrained(ws / "gpt2-left").double().eval()
    tok = AutoTokenizer.from_pretrained(ws / "gpt2-left")
    for row in (ROWS[0], ROWS[5]):
        text, prompt = sequence(row)
        enc = tok(text, return_offsets_mapping=True, return_special_tokens_mask=True)
        with torch.no_grad():
            logp = model(input_ids=torch.tensor([enc["input_ids"]])).logits[0].log_softmax(-1)
        entropy = -(logp.exp() * logp).sum(-1)                                  # [T]
        if "response" in row:
            scored = [t for t, ((start, _), sp) in enumerate(zip(enc["offset_mapping"], enc["special_tokens_mask"]))
                      if t > 0 and start >= len(prompt) and not sp]
            want = entropy[[t - 1 for t in scored]].mean().item()
        else:
            want = entropy[-1].item()
        assert abs(float(rows[row["id"]]["score"]) - want) <= 1e-6 * want, row["id"]


def test_egl_over_the_models_own_completions(ws):
    """--egl-samples pseudo: the one greedy completion of each prompt (the part before its answer),
    decoded here alone in float64, and the norm of its loss's gradient, with the mean entropy of
    the distributions its tokens came from. Sampled (S = 3): seeded, so the same per row whatever
    the batch, and another seed gives other scores."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    args = ["pool.jsonl", "-m", "llama-left", "-s", "egl", "--max-new-tokens", "4", "--no-embeddings"]
    rows = by_id(score_in(ws, *args, "--egl-samples", "pseudo", "-b", "6").stdout)
    model = AutoModelForCausalLM.from_pretrained(ws / "llama-left").double().eval()
    tok = AutoTokenizer.from_pretrained(ws / "llama-left")
    params = [p for p in model.parameters()]
    for row in ROWS:
        text, prompt = sequence(row)
        enc = tok(text, return_offsets_mapping=True, return_special_tokens_mask=True)
        if prompt is None:  # no answer: the prompt as the tokenizer encodes it
            ids = list(enc["input_ids"])
        else:  # the tokens before the answer's first
            first = next(t for t, ((start, _), sp) in enumerate(zip(enc["offset_mapping"], enc["special_tokens_mask"]))
                         if t > 0 and start >= len(prompt) and not sp)
            ids = list(enc["input_ids"][:first])
        entropies = []
        for _ in range(4):
            with torch.no_grad():
                logp = model(input_ids=torch.tensor([ids])).logits[0, -1].log_softmax(-1)
            entropies.append(-(logp.exp() * logp).sum().item())
            ids.append(int(logp.argmax()))
            if ids[-1] == model.config.eos_token_id:
                break
        n = len(entropies)
        assert got_text(rows[row["id"]]) == (tok.decode(ids[:-n], skip_special_tokens=True),
                                              [tok.decode(ids[-n:], skip_special_tokens=True)]), row["id"]
        x = torch.tensor([ids])
        loss = F.cross_entropy(model(input_ids=x).logits[0, -n - 1:-1], x[0, -n:])
        norm = torch.sqrt(sum(g.square().sum() for g in torch.autograd.grad(loss, params))).item()
        got = rows[row["id"]]
        assert abs(float(got["score"]) - norm) <= 1e-6 * norm, row["id"]
        assert abs(float(got["completion_entropy"]) - sum(entropies) / n) <= 1e-6, row["id"]
    sampled = [by_id(score_in(ws, *args, "--egl-samples", "3", "-b", b, "--seed", seed).stdout)
               for b, seed in (("6", "0"), ("2", "0"), ("6", "1"))]
    for row in ROWS:
        assert abs(float(sampled[0][row["id"]]["score"]) - float(sampled[1][row["id"]]["score"])) <= 1e-5
    assert any(sampled[0][r["id"]]["score"] != sampled[2][r["id"]]["score"] for r in ROWS)
    assert all(float(r["egl_se"]) >= 0 for r in sampled[0].values())


def got_text(row: dict) -> tuple[str, list[str]]:
    """A row's prompt (a text's: empty) and completions (a JSON list) as egl wrote them."""
    return row["prompt"], json.loads(row["completions"])


def test_select_hands_prompts_to_label_studio_as_text_generation_tasks(ws):
    from shell import invoke_in, ok
    ok(invoke_in(ws, "score", "pool.jsonl", "-m", "gpt2-right", "-s", "entropy", "-o", "lm.csv", "-q"))
    result = ok(invoke_in(ws, "select", "lm.csv", "-n", "3", "-f", "labelstudio", "--labelstudio-config",
                          "lm.xml", "-o", "lm.json", "-q"))
    tasks = json.loads((ws / "lm.json").read_text())
    texts = {sequence(r)[0] for r in ROWS}
    assert len(tasks) == 3 and all(t["data"]["text"] in texts for t in tasks), result.stderr
    config = (ws / "lm.xml").read_text()
    assert '<Text name="text" value="$text"/>' in config and '<TextArea name="label" toName="text"' in config


def test_a_parquet_pool_reads_as_its_jsonl_does(ws):
    pq = pytest.importorskip("pyarrow.parquet")
    import pyarrow as pa
    columns = {k: [r.get(k) for r in ROWS] for k in ("id", "text", "prompt", "response", "messages")}
    pq.write_table(pa.table(columns), ws / "pool.parquet")
    args = ["-m", "gpt2-left", "-s", "entropy", "--no-embeddings"]
    from_jsonl = by_id(score_in(ws, "pool.jsonl", *args).stdout)
    from_parquet = by_id(score_in(ws, "pool.parquet", *args).stdout)
    assert {k: v["score"] for k, v in from_parquet.items()} == {k: v["score"] for k, v in from_jsonl.items()}


def test_gradnorm_and_loss_refuse_a_row_without_an_answer(ws, tmp_path):
    """A prompt alone, an empty response, a response cut off at --max-length: one sentence before
    any scoring, naming the row and pointing at egl; a pool mixing answered rows with them too;
    align's pool or target holding a prompt alone (a `text` row is its own answer: every token)."""
    (tmp_path / "empty.jsonl").write_text(json.dumps({"id": "e1", "prompt": "the cat", "response": ""}) + "\n"
                                          + json.dumps(ROWS[0]) + "\n")
    (tmp_path / "long.jsonl").write_text(json.dumps(ROWS[2]) + "\n")
    import shutil
    shutil.copy(ws / "pool.jsonl", tmp_path / "pool.jsonl")
    model = ws / "gpt2-right"
    # align: a pool's prompt alone has no answer to take the cosine at, a target's no gradient
    (tmp_path / "answered.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ANSWERED[:2]))
    cases = [(["pool.jsonl", "-s", "gradnorm"], "row q1 of pool pool.jsonl is a prompt without an answer"),
             (["pool.jsonl", "-s", "loss"], "--strategy loss needs an answer"),
             (["empty.jsonl", "-s", "gradnorm"], "row e1 of pool empty.jsonl has an empty response"),
             (["pool.jsonl", "-s", "align", "--target", "answered.jsonl"],
              "row q1 of pool pool.jsonl is a prompt without an answer, and --strategy align needs an answer"),
             (["answered.jsonl", "-s", "align", "--target", "pool.jsonl"],
              "row q1 of pool pool.jsonl is a prompt without an answer, and --strategy align needs an answer")]
    for args, words in cases:
        result = score_in(tmp_path, *args, "-m", model, "--no-embeddings", ok=False)
        assert_one_error(result, words, str(args))
        assert "--strategy egl" in result.stderr, result.stderr
    # cut off: the pool's warning that it is cut, then the error
    result = score_in(tmp_path, "long.jsonl", "-s", "gradnorm", "--max-length", "4", "-m", model, ok=False)
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == 1 and "Traceback" not in result.stderr and len(lines) == 2, result.stderr
    assert lines[1].startswith("alcli: error: row p2 of pool long.jsonl has its response cut off at the "
                               "model's limit of 4 tokens"), lines
    # two rows without an answer: the first named, the other counted
    (tmp_path / "two.jsonl").write_text(json.dumps(ROWS[5]) + "\n" + json.dumps({"id": "q2", "prompt": "a dog"}) + "\n")
    assert_one_error(score_in(tmp_path, "two.jsonl", "-m", model, "-s", "gradnorm", ok=False),
                     "row q1 (and 1 more) of pool", "two")
    # egl scores them: the answers are the model's own
    rows = by_id(score_in(tmp_path, "pool.jsonl", "-m", model, "-s", "egl", "--egl-samples", "pseudo",
                          "--max-new-tokens", "2", "--no-embeddings").stdout)
    assert all(float(r["score"]) > 0 for r in rows.values())


def test_embeddings_are_the_hidden_state_and_one_number_not_the_vocabulary(ws):
    """TABLE.emb.npz of a plain score: b [N, D] the output layer's input averaged over the
    positions whose next token is scored (a prompt alone: its last token), a [N, 1] the norm of
    the mean p - onehot(argmax) there; each row alone in float64 as the oracle. `select
    --diverse` runs on them."""
    import numpy as np
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from shell import invoke_in, ok
    ok(invoke_in(ws, "score", "pool.jsonl", "-m", "gpt2-left", "-s", "entropy", "-b", "4", "-o", "emb.csv", "-q"))
    with np.load(ws / "emb.csv.emb.npz") as z:
        ids, a, b = [str(i) for i in z["ids"]], z["a"], z["b"]
    model = AutoModelForCausalLM.from_pretrained(ws / "gpt2-left").double().eval()
    tok = AutoTokenizer.from_pretrained(ws / "gpt2-left")
    assert a.shape == (len(ROWS), 1) and b.shape == (len(ROWS), model.config.n_embd)
    seen = {}
    model.lm_head.register_forward_hook(lambda m, args, out: seen.update(h=args[0][0]))
    for row in ROWS:
        text, prompt = sequence(row)
        enc = tok(text, return_offsets_mapping=True, return_special_tokens_mask=True)
        with torch.no_grad():
            probs = model(input_ids=torch.tensor([enc["input_ids"]])).logits[0].softmax(-1)   # [T, V]
        scored = [t for t, ((start, _), sp) in enumerate(zip(enc["offset_mapping"], enc["special_tokens_mask"]))
                  if prompt is not None and t > 0 and start >= len(prompt) and not sp]
        at = [t - 1 for t in scored] or [len(enc["input_ids"]) - 1]
        residual = probs[at] - F.one_hot(probs[at].argmax(-1), probs.shape[-1])
        i = ids.index(row["id"])
        want_b = seen["h"][at].mean(0).numpy()
        assert np.allclose(b[i], want_b, rtol=1e-4, atol=1e-5), row["id"]
        assert abs(a[i, 0] - residual.mean(0).norm().item()) <= 1e-4 * residual.mean(0).norm().item(), row["id"]
    picked = ok(invoke_in(ws, "select", "emb.csv", "-n", "3", "--diverse", "-q"))
    assert len(parse_csv(picked.stdout)) == 3


def test_select_pairwise_hands_a_prompt_and_two_completions_to_label_studio(ws, tmp_path):
    """--pairwise: each task the row's prompt and its first two sampled completions (the table's
    prompt and completions columns); the config parses, its Pairwise compares the two answer
    Text tags, and every field it reads is in every task. Without completions: one sentence."""
    import xml.etree.ElementTree as ET
    from shell import invoke_in, ok
    ok(invoke_in(ws, "score", "pool.jsonl", "-m", "llama-left", "-s", "egl", "--egl-samples", "3",
                 "--max-new-tokens", "3", "--no-embeddings", "-o", "egl.csv", "-q"))
    table = by_id((ws / "egl.csv").read_text())
    ok(invoke_in(ws, "select", "egl.csv", "-n", "4", "-f", "labelstudio", "--pairwise",
                 "--labelstudio-config", "pw.xml", "-o", "pw.json", "-q"))
    tasks = json.loads((ws / "pw.json").read_text())
    root = ET.fromstring((ws / "pw.xml").read_text())
    texts = {t.get("name"): t.get("value") for t in root.iter("Text")}
    pairwise = root.find("Pairwise")
    assert root.tag == "View" and pairwise is not None and pairwise.get("name") == "label"
    assert set(pairwise.get("toName").split(",")) == {"answer1", "answer2"} <= set(texts)
    assert len(tasks) == 4
    for task in tasks:
        data = task["data"]
        assert all(v.startswith("$") and v[1:] in data for v in texts.values()), data
        prompt, completions = got_text(table[data["alcli_id"]])
        assert len(completions) == 2 and all(isinstance(c, str) for c in completions)
        assert (data["prompt"], data["answer1"], data["answer2"]) == (prompt, *completions)
        assert data["alcli_score"] == float(table[data["alcli_id"]]["score"])
    # no completions in the table (entropy; pseudo has one), another task's rows, no Label Studio output
    ok(invoke_in(ws, "score", "pool.jsonl", "-m", "llama-left", "-s", "egl", "--egl-samples", "pseudo",
                 "--max-new-tokens", "2", "--no-embeddings", "-o", "pseudo.csv", "-q"))
    ok(invoke_in(ws, "score", "pool.jsonl", "-m", "llama-left", "-s", "entropy", "--no-embeddings",
                 "-o", "entropy.csv", "-q"))
    (ws / "classes.csv").write_text("id,score,pred\na,1.0,0\n")
    cases = [(["entropy.csv", "-f", "labelstudio"], "has no two completions the model sampled"),
             (["pseudo.csv", "--labelstudio-config", "x.xml"], "has no two completions the model sampled"),
             (["classes.csv", "-f", "labelstudio"], "which classification rows do not have"),
             (["egl.csv"], "shapes Label Studio tasks")]
    for args, words in cases:
        result = invoke_in(ws, "select", *args, "-n", "2", "--pairwise", "-o", tmp_path / "out.json")
        assert_one_error(result, words, str(args))
        assert "--pairwise" in result.stderr and not (tmp_path / "out.json").exists(), args


def row_gradients(model, tok, rows, only=None) -> torch.Tensor:
    """[N, P] float64: each row's own loss gradient (as `oracle` takes it), flattened."""
    m = model.double().eval()
    params = [p.requires_grad_() for n, p in m.named_parameters() if (only(n) if only else p.requires_grad)]
    out = []
    for row in rows:
        enc, scored = answer_tokens(tok, row)
        ids = torch.tensor([enc["input_ids"]])
        logits = m(input_ids=ids).logits[0]
        loss = F.cross_entropy(logits[[t - 1 for t in scored]], ids[0, scored])
        grads = torch.autograd.grad(loss, params, allow_unused=True)
        out.append(torch.cat([(g if g is not None else torch.zeros_like(p)).reshape(-1)
                              for g, p in zip(grads, params)]))
    return torch.stack(out)


@pytest.mark.parametrize("name", ["gpt2-right", "lora"])
def test_align_is_the_cosine_with_the_targets_mean_gradient(ws, name):
    """Issue 54: --strategy align on prompt + response rows (a LoRA adapter over its own
    parameters), against each row's float64 gradient and the target rows' mean, formed here."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    base = "llama-left" if name == "lora" else name
    pool, pool_rows = answered(ws, base)
    model_dir, only = name, None
    if name == "lora":
        import warnings
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model_dir, only = make_adapter(ws, base).name, (lambda n: "lora_" in n)
    target_rows = pool_rows[::2]
    (ws / f"target-{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in target_rows))
    rows = by_id(score_in(ws, pool, "-m", model_dir, "-s", "align", "--target", f"target-{name}.jsonl",
                          "-b", "4", "--no-embeddings").stdout)
    tok = AutoTokenizer.from_pretrained(ws / base)
    model = AutoModelForCausalLM.from_pretrained(ws / base)
    if name == "lora":
        from peft import PeftModel
        model = PeftModel.from_pretrained(model, str(ws / model_dir))
    g = row_gradients(model, tok, pool_rows, only)
    gbar = row_gradients(model, tok, target_rows, only).mean(0)
    want = (g @ gbar / (g.norm(dim=1) * gbar.norm())).tolist()
    for row, w in zip(pool_rows, want):
        assert abs(float(rows[row["id"]]["score"]) - w) <= 1e-5, (row["id"], w)


def bpe_tokenizer(style: str):
    """A GPT-2-style byte-level BPE ("Ġthe": " the" begins at its space; no special token added)
    or a Llama-style metaspace one ("▁the", <s> first), trained here on VOCAB's words."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast
    text = [" ".join(hf_models.WORDS * 2)] * 3 + hf_models.WORDS
    if style == "gpt2":
        core = Tokenizer(models.BPE())
        core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        core.decoder = decoders.ByteLevel()
        core.post_processor = processors.ByteLevel(trim_offsets=False)  # GPT-2's own: offsets keep the space
        core.train_from_iterator(text, trainers.BpeTrainer(
            vocab_size=400, special_tokens=["<|endoftext|>"], show_progress=False,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
        return PreTrainedTokenizerFast(tokenizer_object=core, eos_token="<|endoftext|>", pad_token="<|endoftext|>",
                                       model_max_length=64, model_input_names=["input_ids", "attention_mask"])
    core = Tokenizer(models.BPE(unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    core.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="first")
    core.train_from_iterator(text, trainers.BpeTrainer(vocab_size=400, special_tokens=["<unk>", "<s>", "</s>"],
                                                       show_progress=False))
    core.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", core.token_to_id("<s>"))])
    return PreTrainedTokenizerFast(tokenizer_object=core, bos_token="<s>", eos_token="</s>", unk_token="<unk>",
                                   pad_token="<unk>", model_max_length=64,
                                   model_input_names=["input_ids", "attention_mask"])


class WithoutOffsets:
    """A tokenizer as a slow one answers: no character offsets."""
    is_fast = False

    def __init__(self, tok):
        self.tok = tok

    def __call__(self, *args, **kwargs):
        return self.tok(*args, **{**kwargs, "return_offsets_mapping": False})


BOUNDARY = [("the cat sat on ", "the mat"), ("the cat sat on", " the mat")]  # a trailing space, or none


@pytest.mark.parametrize("offsets", [True, False])
@pytest.mark.parametrize("style", ["gpt2", "llama"])
def test_a_token_straddling_the_prompts_end_is_the_answers(style, offsets):
    """" the" of " the mat" begins at a prompt's trailing space: it is the answer's first word,
    counted with or without that space, by offsets or (no offsets) by the prompt's own tokens."""
    from types import SimpleNamespace
    from alcli.tasks.causal_lm import token_marks
    tok = bpe_tokenizer(style)
    texts, starts = [p + r for p, r in BOUNDARY], [len(p) for p, _ in BOUNDARY]
    tokenize = SimpleNamespace(tokenizer=tok if offsets else WithoutOffsets(tok), max_length=None)
    scored, _ = token_marks(texts, starts, tokenize)
    ids = tok(texts, padding="longest")["input_ids"]
    space = "Ġ" if style == "gpt2" else "▁"
    for row, text in enumerate(texts):
        got = [tok.convert_ids_to_tokens(ids[row][t]) for t in range(len(ids[row])) if scored[row, t]]
        assert got == [space + "the", space + "mat"], (text, got)
        assert [tok.convert_ids_to_tokens(tok(text)["input_ids"][t])
                for t in answer_tokens(tok, {"prompt": text[:starts[row]], "response": text[starts[row]:]})[1]] == got


@pytest.mark.parametrize("style", ["gpt2", "llama"])
def test_a_prompt_ending_in_a_space_keeps_its_answers_first_word(tmp_path, style):
    """End to end: loss and gradnorm over prompts with and without a trailing space, against the
    float64 loop over the answer's tokens, the straddling one counted."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    tok = bpe_tokenizer(style)
    torch.manual_seed(0)
    lm(style, len(tok)).save_pretrained(tmp_path / "m")
    tok.save_pretrained(tmp_path / "m")
    rows = [{"id": f"r{i}", "prompt": p, "response": r} for i, (p, r) in enumerate(
        BOUNDARY + [("big red bird ", "flew away and then stopped"), ("small", " bird")])]
    (tmp_path / "pool.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    tok = AutoTokenizer.from_pretrained(tmp_path / "m")
    assert [len(answer_tokens(tok, r)[1]) for r in rows] == [2, 2, 5, 1]
    losses, norms = oracle(AutoModelForCausalLM.from_pretrained(tmp_path / "m"), tok, rows)
    for strategy, want in [("loss", losses), ("gradnorm", norms)]:
        got = by_id(score_in(tmp_path, "pool.jsonl", "-m", "m", "-s", strategy, "-b", "4", "--no-embeddings").stdout)
        assert_close(got, want, "score", rows=rows)
