"""Hostile inputs to --task causal-lm through the CLI (docs: shared/hostile-inputs-3.md):
--max-length past the model's positions (R3-20) and transformers' deprecation notes when a LoRA
adapter is loaded (R3-22). Tiny GPT-2 and Llama models with random weights, no downloads."""
from __future__ import annotations

import json
import warnings

import pytest

from cli_errors import assert_one_error
from conftest import parse_csv, score_in

pytest.importorskip("transformers")
import hf_models  # noqa: E402

POSITIONS = 64  # every model's position embeddings
ROWS = [{"id": "long", "prompt": "the cat", "response": " " + " ".join(["sat"] * 200)},
        {"id": "short", "prompt": "the dog", "response": " ran fast"}]


def gpt2():
    import transformers as tf
    return tf.GPT2LMHeadModel(tf.GPT2Config(vocab_size=len(hf_models.VOCAB), n_embd=32, n_layer=2, n_head=2,
                                            n_positions=POSITIONS, pad_token_id=0, bos_token_id=2, eos_token_id=3))


def llama(rope: dict):
    import transformers as tf
    return tf.LlamaForCausalLM(tf.LlamaConfig(
        vocab_size=len(hf_models.VOCAB), hidden_size=32, intermediate_size=48, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=POSITIONS, pad_token_id=0,
        rope_scaling=rope))


def save(root, name: str, model, model_max_length: int | None = None) -> None:
    model.save_pretrained(root / name)
    hf_models.tokenizer(root / name, token_types=False).save_pretrained(root / name)
    if model_max_length is not None:  # a tokenizer that claims more than the model has (GPT-2's 1024)
        path = root / name / "tokenizer_config.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), "model_max_length": model_max_length}))


@pytest.fixture(scope="module")
def ws(tmp_path_factory):
    import torch
    root = tmp_path_factory.mktemp("lm_hostile")
    torch.manual_seed(0)
    save(root, "gpt2", gpt2())
    save(root, "gpt2-wide", gpt2(), model_max_length=1024)
    save(root, "llama-yarn", llama({"rope_type": "yarn", "factor": 4.0}))        # 4 x 64 = 256 positions
    save(root, "llama-dynamic", llama({"rope_type": "dynamic", "factor": 2.0}))  # any length
    (root / "pool.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    (root / "short.jsonl").write_text(json.dumps(ROWS[1]) + "\n")
    return root


def test_max_length_past_the_models_positions_is_refused_naming_both(ws):
    """R3-20: refused before scoring, in one sentence naming --max-length and the limit (was:
    'the model cannot run on examples with input_ids [...] (index out of range in self)')."""
    result = score_in(ws, "pool.jsonl", "-m", "gpt2", "-s", "loss", "--max-length", "100000000000", ok=False)
    assert_one_error(result, "--max-length 100000000000 is more than the 64 positions", "gpt2")
    assert "n_positions" in result.stderr
    # a rotary scaling stretches the limit: YaRN's factor 4 times the original 64
    result = score_in(ws, "pool.jsonl", "-m", "llama-yarn", "-s", "loss", "--max-length", "300", ok=False)
    assert_one_error(result, "--max-length 300 is more than the 256 positions", "llama-yarn")
    # within the limit: scored, the long row cut at it
    rows = parse_csv(score_in(ws, "pool.jsonl", "-m", "gpt2", "-s", "loss", "--max-length", "64").stdout)
    assert {r["id"] for r in rows} == {"long", "short"}


@pytest.mark.parametrize("model", ["llama-yarn", "llama-dynamic"])
def test_a_rotary_model_reaching_past_its_position_embeddings_is_not_refused(ws, model):
    """R3-20's other side: a model that runs past max_position_embeddings (a rotary scaling,
    dynamic: at any length) is not refused. Passes before the fix too: it guards against refusing
    too much."""
    result = score_in(ws, "pool.jsonl", "-m", model, "-s", "loss", "--max-length", "200")
    assert {r["id"] for r in parse_csv(result.stdout)} == {"long", "short"}


def test_without_max_length_texts_are_cut_at_the_models_positions(ws):
    """A tokenizer claiming more tokens (model_max_length 1024) than the model has positions (64):
    texts are cut at the model's 64, not crashing at the tokenizer's 1024."""
    result = score_in(ws, "pool.jsonl", "-m", "gpt2-wide", "-s", "loss")
    assert "longer than the model's limit of 64 tokens" in result.stderr, result.stderr
    assert {r["id"] for r in parse_csv(result.stdout)} == {"long", "short"}


def test_a_lora_adapter_is_scored_without_transformers_deprecation_notes(ws):
    """R3-22: peft reading transformers' deprecated is_gradient_checkpointing printed
    `warning (transformers/modeling_utils.py:...): is_gradient_checkpointing is deprecated`."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # peft on fan_in_fan_out, while the test builds the adapter
        adapter = get_peft_model(AutoModelForCausalLM.from_pretrained(ws / "gpt2"),
                                 LoraConfig(r=4, lora_alpha=8, target_modules=["c_attn"], fan_in_fan_out=True))
    adapter.save_pretrained(ws / "lora")
    config = json.loads((ws / "lora" / "adapter_config.json").read_text())
    (ws / "lora" / "adapter_config.json").write_text(json.dumps({**config, "base_model_name_or_path": "../gpt2"}))
    with warnings.catch_warnings():
        warnings.simplefilter("always")  # shown even where an earlier test raised it already
        result = score_in(ws, "short.jsonl", "-m", "lora", "-s", "loss", "--no-embeddings")
    assert "is_gradient_checkpointing" not in result.stderr, result.stderr
    assert "warning (transformers" not in result.stderr, result.stderr
    assert [r["id"] for r in parse_csv(result.stdout)] == ["short"]
