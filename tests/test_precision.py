"""--precision: the model's forward under autocast, the engine's rules in float32 or better.
On the CPU (bf16 and fp16 autocast both run there), against the float64 per-example loop."""
from __future__ import annotations

import pytest
import torch

import alcli
from alcli.errors import ConfigError
from alcli.files.config import load_settings
from alcli.gradnorm import grad_norms_per_target, per_example_grad_norms

from gradnorm_zoo import one_thread  # noqa: F401  (autouse fixture)
from gradnorm_zoo import build, oracle_norms

LOW = {"bf16": torch.bfloat16, "fp16": torch.float16}
# relative error of half-precision activations through these small models: bf16 keeps 8 bits
TOL = {"bf16": 2e-2, "fp16": 3e-3}


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
@pytest.mark.parametrize("case", ["simple", "bn_res_cnn", "resnet18", "transformer", "mlp"])
def test_autocast_norms_match_the_float64_loop(case, precision):
    model, inputs, targets = build(case)
    expected = oracle_norms(model, inputs, targets)
    other = (targets + 1) % 3
    with torch.autocast("cpu", dtype=LOW[precision]):
        norms = per_example_grad_norms(model, inputs, targets, method="ghost")
        both, logits = grad_norms_per_target(model, inputs, [targets, other], method="ghost")
    assert logits.dtype == LOW[precision]  # the forward did run in half precision
    assert norms.dtype == torch.float32 and torch.isfinite(norms).all()
    torch.testing.assert_close(norms.double(), expected, rtol=TOL[precision], atol=0.0)
    torch.testing.assert_close(both[0].double(), expected, rtol=TOL[precision], atol=0.0)
    torch.testing.assert_close(both[1].double(), oracle_norms(model, inputs, other), rtol=TOL[precision], atol=0.0)


def test_fp16_rules_do_not_overflow():
    """Squares of fp16 gradients above 256 overflow fp16 (max 65504): the rules must not square there."""
    model, inputs, targets = build("mlp")
    inputs = inputs * 1000.0  # activations in the thousands: their squares pass 65504
    expected = oracle_norms(model, inputs, targets)
    assert float(inputs.square().sum(1).min()) > 65504  # ||a||^2 of the first Linear: inf in fp16
    with torch.autocast("cpu", dtype=torch.float16):
        norms = per_example_grad_norms(model, inputs, targets, method="ghost")
    assert torch.isfinite(norms).all()  # squared in fp16 they would be inf
    # near: the forward itself ran in fp16 with activations in the thousands (11-bit mantissa)
    torch.testing.assert_close(norms.double(), expected, rtol=0.15, atol=0.0)


def test_precision_setting():
    assert load_settings(None, {}).precision == "fp32"
    assert load_settings(None, {"precision": "bf16"}).precision == "bf16"
    with pytest.raises(ConfigError, match="precision"):
        load_settings(None, {"precision": "fp8"})


@pytest.mark.parametrize("strategy", ["egl", "gradnorm", "entropy"])
def test_score_pool_in_bf16_ranks_like_fp32(strategy):
    model, inputs, _ = build("bn_res_cnn")
    pool = torch.randn(32, *inputs.shape[1:], generator=torch.Generator().manual_seed(3))
    fp32 = alcli.score_pool(pool, model, strategy=strategy, batch_size=16, device="cpu")
    bf16 = alcli.score_pool(pool, model, strategy=strategy, batch_size=16, device="cpu", precision="bf16")
    a = {r["id"]: r["score"] for r in fp32}
    b = {r["id"]: r["score"] for r in bf16}
    ids = sorted(a)
    ra = torch.tensor([a[i] for i in ids]).argsort().argsort().double()
    rb = torch.tensor([b[i] for i in ids]).argsort().argsort().double()
    assert float(torch.corrcoef(torch.stack([ra, rb]))[0, 1]) > 0.9  # Spearman
