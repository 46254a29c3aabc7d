"""Opacus' grad-sample tests (opacus/tests/grad_samples/*.py, shipped in its package) with our
check in place of theirs.

Their test methods draw layer configurations with hypothesis and hand each to `run_test(x,
module, batch_first)`. A subclass of each test class records those instead of running them; we
then run every engine method, in float32 and float64, against a float64 per-example loop written
here. The loss is defined for any output shape: example i's loss is sum(output_i * R_i) with R a
fixed random tensor. Every method must give the oracle's numbers or refuse with UnsupportedModel
(`loop` and `auto` must always serve); any other error fails.
"""
from __future__ import annotations

import copy
import importlib
import os
from collections import Counter

import pytest
import torch
from torch import nn
from torch.nn.utils.rnn import PackedSequence, pack_padded_sequence, pad_packed_sequence

from alcli.gradnorm import UnsupportedModel, per_example_grad_norms

pytest.importorskip("opacus", reason="opacus is not installed (add it to the test extra)")
hypothesis = pytest.importorskip("hypothesis")

pytestmark = pytest.mark.opacus

FULL = os.environ.get("ALCLI_OPACUS_FULL") == "1"
METHODS = ["loop", "auto", "ghost", "vmap", "replicate"]
TOL = {torch.float64: 1e-6, torch.float32: 1e-3}

# Hypothesis draws: the quick run takes Opacus' own count (100 per test, ~20 s here), always the
# same ones; ALCLI_OPACUS_FULL=1 draws 1000 fresh ones per test.
EXAMPLES = 1000 if FULL else 100

# family -> (opacus test module, test class, test method)
FAMILIES = {
    "linear": ("linear_test", "Linear_test", "test_input_bias"),
    "conv1d": ("conv1d_test", "Conv1d_test", "test_conv1d"),
    "conv2d": ("conv2d_test", "Conv2d_test", "test_conv2d"),
    "conv3d": ("conv3d_test", "Conv3d_test", "test_conv3d"),
    "embedding": ("embedding_test", "Embedding_test", "test_input_across_dims"),
    "group_norm": ("group_norm_test", "GroupNorm_test", "test_3d_input_groups"),
    "layer_norm": ("layer_norm_test", "LayerNorm_test", "test_input_norm"),
    "rms_norm": ("rms_norm_test", "RMSNorm_test", "test_input_norm"),
    "instance_norm1d": ("instance_norm1d_test", "InstanceNorm1d_test", "test_3d_input"),
    "instance_norm2d": ("instance_norm2d_test", "InstanceNorm2d_test", "test_4d_input"),
    "instance_norm3d": ("instance_norm3d_test", "InstanceNorm3d_test", "test_5d_input"),
    "sequence_bias": ("sequence_bias_test", "SequenceBias_test", "test_batch_second"),
    "dp_multihead_attention": ("dp_multihead_attention_test", "MultiHeadAttention_test",
                               "test_multihead_attention"),
    "dp_rnn": ("dp_rnn_test", "RNN_test", "test_rnn"),
}
# not adapted: embedding_bag_test feeds (flat indices, offsets), which has no batch dim


def configurations(family: str) -> list:
    """The (x, module, batch_first) that Opacus' test hands to run_test, as hypothesis draws them."""
    module_name, class_name, method = FAMILIES[family]
    test_class = getattr(importlib.import_module(f"opacus.tests.grad_samples.{module_name}"), class_name)
    drawn = []

    class Recorder(test_class):
        def run_test(self, x, module, batch_first=True, **kwargs):
            drawn.append((x, copy.deepcopy(module), batch_first))

    # @given reads its settings from this attribute when the test runs; theirs set only a deadline
    test = getattr(test_class, method)
    theirs = test._hypothesis_internal_use_settings
    test._hypothesis_internal_use_settings = hypothesis.settings(
        theirs, max_examples=EXAMPLES, derandomize=not FULL, database=None, deadline=None,
        suppress_health_check=list(hypothesis.HealthCheck))
    try:
        torch.manual_seed(0)
        getattr(Recorder(method), method)()
    finally:
        test._hypothesis_internal_use_settings = theirs
    return drawn


class BatchFirst(nn.Module):
    """The Opacus layer fed batch-first inputs ([B, ...], padded for packed sequences), its output
    brought back batch-first and flattened per example -> [B, F]."""

    def __init__(self, layer, batch_first: bool, packed: bool | None, steps: int):
        super().__init__()
        self.layer, self.batch_first, self.packed, self.steps = layer, batch_first, packed, steps

    def forward(self, x):
        if self.packed is not None:  # padding rows are exact zeros; random data never is
            lengths = (x != 0).any(-1).sum(1)
            x = pack_padded_sequence(x, lengths.cpu(), batch_first=True, enforce_sorted=self.packed)
        elif not self.batch_first:
            x = x.transpose(0, 1)
        out = self.layer(x)
        if isinstance(out, PackedSequence):
            out = pad_packed_sequence(out, batch_first=True, total_length=self.steps)[0]
        elif not self.batch_first:
            out = out.transpose(0, 1)
        return out.reshape(out.shape[0], -1)


def adapt(x, module, batch_first):
    """-> (model taking batch-first inputs, batch-first inputs)."""
    if isinstance(x, PackedSequence):
        sorted_ = x.sorted_indices is None
        padded, _ = pad_packed_sequence(x, batch_first=True)
        return BatchFirst(module, batch_first, sorted_, padded.shape[1]).eval(), padded
    if not batch_first:
        x = x.transpose(0, 1)
    return BatchFirst(module, batch_first, None, 0).eval(), x.contiguous()


def weights_loss(weights):
    """Example i's loss: sum(output_i * weights[i]); the targets are the example indices."""
    def loss_fn(logits, index):
        return (logits * weights[index].to(logits.dtype)).sum(1)
    return loss_fn


def oracle(model, x, weights) -> torch.Tensor:
    """Float64, one example at a time, every parameter once -> [B]."""
    m = copy.deepcopy(model).double()
    params = list({id(p): p for p in m.parameters() if p.requires_grad}.values())
    x = x.double() if x.is_floating_point() else x
    norms = torch.zeros(x.shape[0], dtype=torch.float64)
    for i in range(x.shape[0]):
        loss = (m(x[i:i + 1])[0] * weights[i]).sum()
        grads = torch.autograd.grad(loss, params, allow_unused=True)
        norms[i] = sum((g.double().square().sum() for g in grads if g is not None),
                       torch.zeros((), dtype=torch.float64)).sqrt()
    return norms


def close(actual, expected, rtol) -> bool:
    if actual.shape != expected.shape or not torch.isfinite(actual).all():
        return False
    scale = float(expected.abs().max()) if expected.numel() else 0.0
    return bool(torch.allclose(actual.double(), expected, rtol=rtol, atol=rtol * 1e-3 * scale + 1e-12))


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


COUNTS: dict = {}


@pytest.mark.parametrize("family", list(FAMILIES))
def test_opacus_configurations(family):
    counts = {m: Counter() for m in METHODS}
    wrong = []
    for x, module, batch_first in configurations(family):
        model, inputs = adapt(x, module, batch_first)
        with torch.no_grad():
            width = model(inputs).shape[1] if inputs.shape[0] else 0
        gen = torch.Generator().manual_seed(inputs.shape[0] * 1000 + width)
        weights = torch.randn(inputs.shape[0], width, generator=gen, dtype=torch.float64)
        expected = oracle(model, inputs, weights)
        index = torch.arange(inputs.shape[0])
        for dtype in (torch.float64, torch.float32):
            typed = copy.deepcopy(model).to(dtype)
            typed_inputs = inputs.to(dtype) if inputs.is_floating_point() else inputs
            for method in METHODS:
                counts[method]["run"] += 1
                try:
                    norms = per_example_grad_norms(typed, typed_inputs, index, method=method,
                                                   loss_fn=weights_loss(weights))
                except UnsupportedModel as err:
                    counts[method]["refused"] += 1
                    if method in ("loop", "auto"):
                        wrong.append(f"{method} refused {family} {tuple(inputs.shape)}: {err}")
                    continue
                if close(norms, expected, TOL[dtype]):
                    counts[method]["exact"] += 1
                else:
                    counts[method]["wrong"] += 1
                    wrong.append(f"{method} {dtype} {family} {module} x{tuple(inputs.shape)} "
                                 f"batch_first={batch_first}: {norms.tolist()} != {expected.tolist()}")
    COUNTS[family] = counts
    print(f"\n{family:24s}" + "  ".join(
        f"{m}: {c['run']} run {c['exact']} exact {c['refused']} refused {c['wrong']} wrong"
        for m, c in counts.items()))
    assert not wrong, "\n".join(wrong[:20])
