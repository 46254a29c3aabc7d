"""Tiny Hugging Face models built from configs with random weights (no downloads), a word-level
tokenizer from a vocabulary file written here, and the float64 per-example loop they are checked
against. Used by tests/test_hf_engine.py and tests/test_hf_cli.py."""
from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F

WORDS = ["the", "cat", "dog", "sat", "on", "a", "mat", "ran", "fast", "slow", "big", "small", "red",
         "blue", "bird", "flew", "away", "and", "then", "stopped"]
VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + WORDS
CLASSES = 3


def bert(vocab_size: int = 100):
    from transformers import BertConfig, BertForSequenceClassification
    return BertForSequenceClassification(BertConfig(
        vocab_size=vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=37, max_position_embeddings=64, num_labels=CLASSES))


def distilbert(vocab_size: int = 100):
    from transformers import DistilBertConfig, DistilBertForSequenceClassification
    return DistilBertForSequenceClassification(DistilBertConfig(
        vocab_size=vocab_size, dim=32, n_layers=2, n_heads=2, hidden_dim=37,
        max_position_embeddings=64, num_labels=CLASSES))


def gpt2(vocab_size: int = 100):
    from transformers import GPT2Config, GPT2ForSequenceClassification
    return GPT2ForSequenceClassification(GPT2Config(
        vocab_size=vocab_size, n_embd=32, n_layer=2, n_head=2, n_positions=64, num_labels=CLASSES,
        pad_token_id=0, bos_token_id=1, eos_token_id=1))


def vit():
    from transformers import ViTConfig, ViTForImageClassification
    return ViTForImageClassification(ViTConfig(
        image_size=16, patch_size=4, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=37, num_labels=CLASSES))


def tokenizer(directory: Path, token_types: bool = True):
    """A BERT word-piece tokenizer over VOCAB, from a vocab.txt written into `directory`.
    Without `token_types` it returns input_ids and attention_mask only, as GPT-2's and
    DistilBERT's own tokenizers do."""
    from transformers import BertTokenizerFast
    directory.mkdir(parents=True, exist_ok=True)
    vocab = str(directory / "vocab.txt")
    (directory / "vocab.txt").write_text("\n".join(VOCAB) + "\n")
    names = ["input_ids", "token_type_ids", "attention_mask"] if token_types else ["input_ids", "attention_mask"]
    # transformers 4 reads `vocab_file`, 5 reads `vocab`
    return BertTokenizerFast(vocab_file=vocab, vocab=vocab, model_max_length=64, model_input_names=names)


def loop_norms(model, inputs, targets) -> torch.Tensor:
    """Every example alone through a float64 copy of `model`: ||d CE(logits_i, t_i) / d params||.
    `inputs` is a tensor (positional) or a dict of tensors (keyword arguments). The example runs
    as a batch of two copies with the loss halved (the same gradient in eval mode): at batch 1,
    PyTorch's BatchNorm2d backward misreads some channels_last gradients (xcit's patch
    interaction; tests/test_gradnorm_oracle.py has the reproducer)."""
    import copy
    m = copy.deepcopy(model).double().eval()
    params = [p for p in m.parameters() if p.requires_grad]
    n = len(targets)
    out = torch.empty(n, dtype=torch.float64)
    for i in range(n):
        m.train().eval()  # empties timm's eval-mode attention-bias caches (LeViT), filled by the last example's graph
        if isinstance(inputs, dict):
            output = m(**{k: v[[i, i]] for k, v in inputs.items()})
        else:
            x = inputs[[i, i]]
            output = m(x.double() if x.is_floating_point() else x)
        logits = output.logits if hasattr(output, "logits") else output
        loss = F.cross_entropy(logits, targets[[i, i]])  # the mean of two equal losses
        grads = torch.autograd.grad(loss, params, allow_unused=True)
        out[i] = torch.sqrt(sum(g.double().square().sum() for g in grads if g is not None))
    return out
