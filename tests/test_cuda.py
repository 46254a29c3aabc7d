"""On a real CUDA device (skipped without one; benchmarks/gpu.py runs them first): every method
against the float64 loop on zoo models, auto's choice per zoo model, classes in one backward,
no host sync in the engine after the first batch, compile=True (CUDA graphs), bf16 autocast, and
the runner's one sync, the detectors batched against their loop."""
from __future__ import annotations

import json

import pytest
import torch

import alcli
from alcli.gradnorm import auto_choice, grad_norms_per_target, per_example_grad_norms
from alcli.gradnorm.ghost import _k_mode

from gradnorm_zoo import AUTO_CHOICE, DECLINES, build, model_names, oracle_norms

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
CUDA = torch.device("cuda")
ZOO = [n for n in model_names() if n not in ("lstm",)] + ["lstm"]


@pytest.mark.parametrize("method", ["ghost", "replicate", "vmap", "auto"])
@pytest.mark.parametrize("case", ZOO)
def test_methods_on_cuda_match_the_loop(case, method):
    if method in DECLINES.get(case, ()):
        pytest.skip(f"{method} declines {case}")
    model, inputs, targets = build(case)
    expected = oracle_norms(model, inputs, targets)
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    model = model.to(CUDA)
    norms = per_example_grad_norms(model, inputs.to(CUDA), targets.to(CUDA), method=method)
    assert norms.device.type == "cuda"
    torch.testing.assert_close(norms.double().cpu(), expected, rtol=1e-3, atol=1e-6 * float(expected.max()))
    if method == "auto":
        assert auto_choice(model)[0] == AUTO_CHOICE.get(case, "ghost")


@pytest.mark.parametrize("case", ["resnet18", "transformer", "bn_res_cnn", "mobilenet_v3_small"])
def test_classes_in_one_backward_on_cuda(case):
    model, inputs, targets = build(case)
    sets = [targets, (targets + 1) % 3, torch.zeros_like(targets)]
    expected = torch.stack([oracle_norms(model, inputs, t) for t in sets])
    model = model.to(CUDA)
    norms, _ = grad_norms_per_target(model, inputs.to(CUDA), [t.to(CUDA) for t in sets], method="ghost")
    torch.testing.assert_close(norms.double().cpu(), expected, rtol=1e-3, atol=1e-6 * float(expected.max()))
    assert _k_mode[model] == "batched"


@pytest.mark.parametrize("case", ["resnet18", "transformer"])
def test_no_host_sync_after_the_first_batch(case):
    model, inputs, targets = build(case)
    model, x, t = model.to(CUDA), inputs.to(CUDA), targets.to(CUDA)
    per_example_grad_norms(model, x, t)  # the first batch may probe
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        per_example_grad_norms(model, x, t)
        grad_norms_per_target(model, x, lambda logits: list(logits.argsort(1, descending=True).T))
    finally:
        torch.cuda.set_sync_debug_mode("default")


@pytest.mark.parametrize("case", ["simple", "bn_res_cnn", "transformer", "linear_twice"])
def test_compiled_on_cuda_matches_the_loop(case):
    """compile=True on CUDA: inductor's kernels replayed as CUDA graphs, one target set and three;
    the output of a replay is not overwritten by the next."""
    model, inputs, targets = build(case)
    sets = [targets, (targets + 1) % 3, torch.zeros_like(targets)]
    expected = torch.stack([oracle_norms(model, inputs, t) for t in sets])
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    model, x = model.to(CUDA), inputs.to(CUDA)
    tol = dict(rtol=1e-3, atol=1e-6 * float(expected.max()))
    first = per_example_grad_norms(model, x, targets.to(CUDA), compile=True)
    for _ in range(3):  # CUDA graphs are recorded after warm-up calls
        again = per_example_grad_norms(model, x, targets.to(CUDA), compile=True)
    torch.testing.assert_close(first.double().cpu(), expected[0], **tol)
    torch.testing.assert_close(again.double().cpu(), expected[0], **tol)
    norms, _ = grad_norms_per_target(model, x, [t.to(CUDA) for t in sets], compile=True)
    torch.testing.assert_close(norms.double().cpu(), expected, **tol)


def test_bf16_autocast_on_cuda():
    model, inputs, targets = build("resnet18")
    expected = oracle_norms(model, inputs, targets)
    model = model.to(CUDA)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        norms = per_example_grad_norms(model, inputs.to(CUDA), targets.to(CUDA), method="ghost")
    torch.testing.assert_close(norms.double().cpu(), expected, rtol=3e-2, atol=0.0)


def test_score_pool_on_cuda_matches_the_cpu():
    model, inputs, _ = build("bn_res_cnn")
    pool = torch.randn(40, *inputs.shape[1:], generator=torch.Generator().manual_seed(0))
    cpu = {r["id"]: r["score"] for r in alcli.score_pool(pool, model, batch_size=16, device="cpu")}
    gpu = {r["id"]: r["score"] for r in alcli.score_pool(pool, model, batch_size=16, device="cuda")}
    for i in cpu:
        assert gpu[i] == pytest.approx(cpu[i], rel=1e-2)


def _detector_case(name: str):
    """(the model in float64, its images, the task's rows, the test module's Settings) of the
    small detectors the CPU tests build: test_detection's, test_instances', test_keypoints'."""
    import test_detection
    import test_instances
    import test_keypoints
    from alcli.tasks import detection, instances, keypoints
    if name in test_detection.DETECTORS:
        return test_detection.build(name), test_detection.images(), detection.rows, test_detection.Settings
    where, task = {"maskrcnn": (test_instances, instances), "keypointrcnn": (test_keypoints, keypoints)}[name]
    return where.build(), where.images(), task.rows, where.Settings


@pytest.mark.parametrize("name", ["fasterrcnn_mobilenet_v3_large_320_fpn", "ssdlite320_mobilenet_v3_large",
                                  "maskrcnn", "keypointrcnn"])
def test_detectors_batched_on_cuda_match_their_loop_on_cuda(name):
    """A detector's gradnorm and egl batched through the engine on CUDA against its per-image loop
    on CUDA, in float64, two images of one size in one batch (R-CNN's sampling draws from CUDA's
    generator, so the numbers are not the CPU's)."""
    model, imgs, rows, settings = _detector_case(name)
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    model = model.to(CUDA)
    imgs = [img.to(CUDA) for img in imgs + [imgs[0].flip(-1)]]
    ids = ["wide", "square", "wide, flipped"]
    for strategy in ("gradnorm", "egl"):
        batched, loop = (rows(model, imgs, ids, settings(strategy, method=m), None) for m in ("ghost", "loop"))
        assert any(json.loads(r.get("boxes", "[]")) for r in batched), "the random model predicts boxes"
        assert [r["score"] for r in batched] == pytest.approx([r["score"] for r in loop], rel=1e-6)
