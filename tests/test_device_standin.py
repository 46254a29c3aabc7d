"""Device-correct and sync-free after the first batch, on a stand-in device (tests/standin.py):
every method, for gradnorm and for EGL, on zoo models; and `alcli.score_pool`, whose runner may
copy each batch's rows home once."""
from __future__ import annotations

import pytest
import torch

import alcli
from alcli.files import config
from alcli.gradnorm import UnsupportedModel, grad_norms_per_target

from gradnorm_zoo import one_thread  # noqa: F401  (autouse fixture)
from gradnorm_zoo import DECLINES, build
from standin import DeviceWatch, standin, to_standin

ZOO = ["simple", "mlp", "bn_res_cnn", "resnet18", "mobilenet_v3_small", "transformer",
       "transformer_seq_first", "lstm", "tied", "embedding_padding_idx", "conv2d_variants",
       "groupnorm", "mha_batch_first", "linear_twice", "bare_param", "tied_long"]


def egl_targets(logits):
    """The three most probable classes, most probable first, as the egl strategy asks: a loop
    over target sets with a first, a middle and a last step (all ten classes of resnet18 and
    mobilenet, each op under the watch, took 60-80 s of CPU a case for no other code)."""
    return list(logits.argsort(1, descending=True).T)[:3]


@pytest.mark.parametrize("targets", ["gradnorm", "egl"])
@pytest.mark.parametrize("method", ["ghost", "replicate", "vmap", "auto"])
@pytest.mark.parametrize("case", ZOO)
def test_engine_on_the_standin_device(case, method, targets):
    if method in DECLINES.get(case, ()):
        pytest.skip(f"{method} declines {case}")
    model, inputs, labels = build(case)
    chosen = (lambda logits: [labels]) if targets == "gradnorm" else egl_targets
    first, _ = grad_norms_per_target(model, inputs, chosen, method=method)  # the first batch probes
    to_standin(model)
    x, labels = standin(inputs), standin(labels)
    with DeviceWatch() as watch:
        norms, logits = grad_norms_per_target(model, x, chosen, method=method)
    assert norms.device == logits.device == torch.device("meta") and norms.shape == first.shape
    assert watch.ops > 0


@pytest.fixture
def meta_allowed(monkeypatch):
    """`device="meta"` as a setting (the test's own seam: nothing else in alcli changes)."""
    monkeypatch.setattr(config, "DEVICE_RE", __import__("re").compile(r"^(auto|cpu|meta|mps|cuda(:\d+)?)$"))


@pytest.mark.parametrize("strategy", ["egl", "gradnorm", "entropy"])
@pytest.mark.parametrize("case", ["bn_res_cnn", "transformer", "mlp"])
def test_score_pool_on_the_standin_device(case, strategy, meta_allowed):
    model, inputs, _ = build(case)
    pool = inputs.repeat(3, *[1] * (inputs.dim() - 1))  # 3 batches
    batch = inputs.shape[0]
    first = alcli.score_pool(pool[:batch], model, strategy=strategy, batch_size=batch, device="cpu")
    with DeviceWatch(allow_copies_home=True) as watch:
        rows = alcli.score_pool(pool, model, strategy=strategy, batch_size=batch, device="meta")
    assert len(rows) == len(pool) and len(first) == batch
    # the runner's one copy per batch (rows home), and no other
    assert watch.copies_home == len(pool) // batch, f"{watch.copies_home} copies home for {len(pool) // batch} batches"


def test_the_watch_fails_on_a_cpu_accumulator_and_on_item():
    """The watch itself: it must catch what issue 9 found (a CPU accumulator, a host read)."""
    x = torch.empty(4, device="meta")
    with pytest.raises(AssertionError, match="mixes devices"):
        with DeviceWatch():
            torch.zeros(4, dtype=torch.float64).add_(x)
    with pytest.raises(Exception):
        with DeviceWatch():
            x.sum().item()
    with pytest.raises(AssertionError, match="copies from the device"):
        with DeviceWatch():
            x.cpu()
