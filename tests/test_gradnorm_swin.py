"""torchvision swin's ShiftedWindowAttention and ShiftedWindowAttentionV2 under ghost
(`alcli/gradnorm/rules/swin.py`): tiny SwinTransformers (v1, and v2 built as swin_v2_t builds it)
in float64, eval mode, against an independent per-example loop (each example alone,
autograd.grad over the selected parameters), rtol 1e-6. The input size leaves partial windows
(padding) and keeps the shift in the first stage; the second stage pads and shifts along H only
(the window covers its whole width)."""
from __future__ import annotations

import fnmatch


import pytest
import torch
import torch.nn.functional as F
from gradnorm_zoo import one_thread  # noqa: F401  (autouse fixture)
from torch import nn

from alcli.gradnorm import auto_choice, grad_norms_per_target, per_example_grad_norms
from alcli.gradnorm.ghost import _k_mode
from alcli.gradnorm.params import select_params
from alcli.gradnorm.plan import describe, rule_names

swin = pytest.importorskip("torchvision.models.swin_transformer")

WINDOW = [3, 4]   # not square: the relative position index has distinct row and column strides
SIZE = (40, 28)   # tokens 10x7 -> padded 12x8 (stage 1), 5x4 -> padded 6x4 (stage 2)
BATCH = 4


def _randomize(model, seed):
    """Weights large enough that attention is far from uniform, and a non-zero bias table."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=p.dtype) * (0.3 if p.dim() > 1 else 0.2))
    return model


def tiny_swin(v2=False, seed=0):
    extra = {"block": swin.SwinTransformerBlockV2, "downsample_layer": swin.PatchMergingV2} if v2 else {}
    model = swin.SwinTransformer(patch_size=[4, 4], embed_dim=16, depths=[2, 2], num_heads=[2, 4],
                                 window_size=WINDOW, num_classes=3, **extra)
    return _randomize(model.double().eval(), seed)


def batch(seed=1):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(BATCH, 3, *SIZE, generator=g, dtype=torch.float64),
            torch.randint(0, 3, (BATCH,), generator=g))


def loop_norms(model, x, y, keep=lambda name: True):
    """The oracle: one example at a time, autograd.grad over the kept parameters, norm."""
    params = [p for name, p in model.named_parameters() if keep(name)]
    norms = []
    for i in range(len(x)):
        loss = F.cross_entropy(model(x[i:i + 1]), y[i:i + 1])
        grads = torch.autograd.grad(loss, params)
        norms.append(torch.sqrt(sum(g.square().sum() for g in grads)))
    return torch.stack(norms)


def attention_calls(model, x):
    """(input shape, padding, effective shift) of every attention call."""
    seen = []

    def hook(module, args, output):
        _, height, width, _ = args[0].shape
        wh, ww = module.window_size
        pad_h, pad_w = height + (wh - height % wh) % wh, width + (ww - width % ww) % ww
        shift = [0 if wh >= pad_h else module.shift_size[0], 0 if ww >= pad_w else module.shift_size[1]]
        seen.append(((height, width), (pad_h - height, pad_w - width), shift))

    handles = [m.register_forward_hook(hook) for m in model.modules()
               if isinstance(m, swin.ShiftedWindowAttention)]
    with torch.no_grad():
        model(x)
    for h in handles:
        h.remove()
    return seen


@pytest.mark.parametrize("v2", [False, True], ids=["v1", "v2"])
def test_the_shapes_pad_and_shift(v2):
    calls = attention_calls(tiny_swin(v2), batch()[0])
    assert calls == [((10, 7), (2, 1), [0, 0]), ((10, 7), (2, 1), [1, 2]),
                     ((5, 4), (1, 0), [0, 0]), ((5, 4), (1, 0), [1, 0])]


@pytest.mark.parametrize("v2", [False, True], ids=["v1", "v2"])
def test_the_capturing_forward_gives_the_modules_output_exactly(v2):
    from alcli.gradnorm.rules.swin import swin_forward, swin_v2_forward
    forward, n_taps = (swin_v2_forward, 4) if v2 else (swin_forward, 3)
    model, (x, _) = tiny_swin(v2), batch()
    outputs = []
    for m in model.modules():
        if isinstance(m, swin.ShiftedWindowAttention):
            m.register_forward_hook(lambda m, args, out: outputs.append((m, args[0], out)))
    with torch.no_grad():
        model(x)
        for m, inp, out in outputs:
            taps = []
            mine, (windows, o) = forward(m, (inp,), {}, lambda t, taps=taps: taps.append(t.shape) or t)
            assert torch.equal(mine, out)
            assert windows.shape[0] == o.shape[0] == BATCH and len(taps) == n_taps


def test_attention_is_served_by_the_swin_rule_and_auto_picks_ghost():
    model, (x, y) = tiny_swin(), batch()
    rules = {name: rule for name, kind, rule, _ in describe(model, select_params(model, None))
             if kind == "ShiftedWindowAttention"}
    assert len(rules) == 4 and set(rules.values()) == {"swin"}
    per_example_grad_norms(model, x, y)
    assert auto_choice(model)[0] == "ghost"


SELECTIONS = {
    "all": (None, lambda name: True),
    "attention": (["*.attn", "*.attn.*"], lambda name: fnmatch.fnmatchcase(name, "*.attn.*")),
    "tables": (["*relative_position_bias_table"], lambda name: name.endswith("relative_position_bias_table")),
    "shifted block": (["features.1.1.attn"], lambda name: name.startswith("features.1.1.attn.")),
}


@pytest.mark.parametrize("selection", SELECTIONS)
def test_ghost_matches_the_loop(selection):
    params, keep = SELECTIONS[selection]
    model, (x, y) = tiny_swin(), batch()
    norms = per_example_grad_norms(model, x, y, params=params, method="ghost")
    torch.testing.assert_close(norms, loop_norms(model, x, y, keep), rtol=1e-6, atol=0)


def test_several_target_sets_through_one_backward():
    model, (x, y) = tiny_swin(), batch()
    sets = [y, (y + 1) % 3, torch.zeros_like(y)]
    norms, _ = grad_norms_per_target(model, x, sets, method="ghost")
    expected = torch.stack([loop_norms(model, x, t) for t in sets])
    torch.testing.assert_close(norms, expected, rtol=1e-6, atol=0)
    assert _k_mode[model] == "batched"


class TwiceAttention(nn.Module):
    """One ShiftedWindowAttention (or V2) called twice: its parameters need per-example gradients."""

    def __init__(self, attention=swin.ShiftedWindowAttention):
        super().__init__()
        self.embed = nn.Conv2d(3, 8, 4, stride=4)
        self.attn = attention(8, WINDOW, [1, 2], num_heads=2)
        self.fc = nn.Linear(8, 3)

    def forward(self, x):
        h = self.embed(x).permute(0, 2, 3, 1)  # [B, H, W, C]
        h = h + self.attn(h)
        h = h + self.attn(torch.tanh(h))
        return self.fc(h.mean((1, 2)))


@pytest.mark.parametrize("v2", [False, True], ids=["v1", "v2"])
def test_an_attention_called_twice_adds_its_per_example_gradients(v2):
    attention = swin.ShiftedWindowAttentionV2 if v2 else swin.ShiftedWindowAttention
    model, (x, y) = _randomize(TwiceAttention(attention).double().eval(), 2), batch()
    norms, _ = grad_norms_per_target(model, x, [y, (y + 2) % 3], method="ghost", params=["attn"])
    expected = torch.stack([loop_norms(model, x, t, lambda n: n.startswith("attn."))
                            for t in (y, (y + 2) % 3)])
    torch.testing.assert_close(norms, expected, rtol=1e-6, atol=0)


V2_SELECTIONS = {
    "all": (None, lambda name: True),
    "attention": (["*.attn", "*.attn.*"], lambda name: fnmatch.fnmatchcase(name, "*.attn.*")),
    "cpb_mlp and logit_scale": (["*.cpb_mlp.*", "*.logit_scale"],
                                lambda name: ".cpb_mlp." in name or name.endswith(".logit_scale")),
    # the k part of qkv.bias never reaches the logits: its gradient is zero
    "qkv bias": (["*.attn.qkv.bias"], lambda name: name.endswith(".attn.qkv.bias")),
    "shifted block": (["features.1.1.attn"], lambda name: name.startswith("features.1.1.attn.")),
}


def test_swin_v2_attention_is_served_by_the_swin_rule_and_auto_picks_ghost():
    model, (x, y) = tiny_swin(v2=True), batch()
    rules = {name: rule for name, kind, rule, _ in describe(model, select_params(model, None))
             if kind.startswith("ShiftedWindowAttention")}
    assert len(rules) == 4 and set(rules.values()) == {"swin"}
    names = rule_names(model)
    assert {names[f"features.1.0.attn.{child}"] for child in ("qkv", "proj", "cpb_mlp", "cpb_mlp.0", "cpb_mlp.2")} \
        == {"via features.1.0.attn"}
    norms = per_example_grad_norms(model, x, y)
    assert auto_choice(model)[0] == "ghost"
    torch.testing.assert_close(norms, loop_norms(model, x, y), rtol=1e-6, atol=0)


@pytest.mark.parametrize("selection", V2_SELECTIONS)
def test_ghost_matches_the_loop_on_swin_v2(selection):
    params, keep = V2_SELECTIONS[selection]
    model, (x, y) = tiny_swin(v2=True), batch()
    norms = per_example_grad_norms(model, x, y, params=params, method="ghost")
    torch.testing.assert_close(norms, loop_norms(model, x, y, keep), rtol=1e-6, atol=0)


def test_swin_v2_several_target_sets_through_one_backward():
    model, (x, y) = tiny_swin(v2=True), batch()
    sets = [y, (y + 1) % 3, torch.zeros_like(y)]
    for params, keep in (V2_SELECTIONS["all"], V2_SELECTIONS["cpb_mlp and logit_scale"]):
        norms, _ = grad_norms_per_target(model, x, sets, method="ghost", params=params)
        expected = torch.stack([loop_norms(model, x, t, keep) for t in sets])
        torch.testing.assert_close(norms, expected, rtol=1e-6, atol=0)
        assert _k_mode[model] == "batched"


def test_swin_v2_logit_scale_at_its_clamp():
    """A head whose logit_scale is past log(100) gets no gradient through the clamp."""
    model, (x, y) = tiny_swin(v2=True), batch()
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, swin.ShiftedWindowAttentionV2):
                m.logit_scale[0] = 5.0
    params, keep = V2_SELECTIONS["cpb_mlp and logit_scale"]
    norms = per_example_grad_norms(model, x, y, params=params, method="ghost")
    torch.testing.assert_close(norms, loop_norms(model, x, y, keep), rtol=1e-6, atol=0)


@pytest.mark.parametrize("v2", [False, True], ids=["v1", "v2"])
@pytest.mark.parametrize("targets", ["gradnorm", "egl"])
def test_the_swin_rule_is_device_correct_and_sync_free(targets, v2):
    """After a first CPU batch, on the stand-in device (tests/standin.py): no op mixing devices,
    no host sync, for one target set and for every class (the K target sets vmapped)."""
    from standin import DeviceWatch, standin, to_standin
    model, (x, y) = tiny_swin(v2), batch()
    chosen = (lambda logits: [y]) if targets == "gradnorm" else (lambda logits: list(logits.argsort(1).T))
    first, _ = grad_norms_per_target(model, x, chosen, method="ghost")
    to_standin(model)
    y = standin(y)
    with DeviceWatch() as watch:
        norms, _ = grad_norms_per_target(model, standin(x), chosen, method="ghost")
    assert norms.device == torch.device("meta") and norms.shape == first.shape and watch.ops > 0
