"""The architectures labeling teams train today, as tiny configs with random weights: `auto`
settles on ghost for every one, with no fallback, and its norms match the float64 per-example
loop (tests/hf_models.loop_norms, written independently of alcli)."""
from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

from alcli.gradnorm import EngineFallback, auto_choice, per_example_grad_norms
from alcli.gradnorm.params import select_params
from alcli.gradnorm.plan import describe

import hf_models

TOL = dict(rtol=1e-6, atol=1e-9)


class LSTMClassifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(30, 8, padding_idx=0)
        self.lstm = nn.LSTM(8, 12, num_layers=2, batch_first=True, bidirectional=True)
        self.fc = nn.Linear(24, 3)

    def forward(self, tokens):
        out, _ = self.lstm(self.emb(tokens))
        return self.fc(out[:, -1])


def _tokens(g, batch=4, length=7):
    mask = torch.ones(batch, length, dtype=torch.long)
    mask[1, 5:] = 0
    mask[2, 3:] = 0
    return torch.randint(2, 30, (batch, length), generator=g) * mask, mask


def _text(factory):
    def build(g):
        pytest.importorskip("transformers")
        ids, mask = _tokens(g)
        return factory(vocab_size=30), {"input_ids": ids, "attention_mask": mask}
    return build


def _swin(g):
    from torchvision.models.swin_transformer import SwinTransformer
    # 8x8 patches in windows of 3: padded to 9x9; the second block of each stage is shifted
    model = SwinTransformer(patch_size=[2, 2], embed_dim=8, depths=[2, 2], num_heads=[1, 2],
                            window_size=[3, 3], num_classes=3)
    return model, torch.randn(4, 3, 16, 16, generator=g)


def _swin_v2(g):
    from torchvision.models.swin_transformer import PatchMergingV2, SwinTransformer, SwinTransformerBlockV2
    model = SwinTransformer(patch_size=[2, 2], embed_dim=8, depths=[2, 2], num_heads=[1, 2],
                            window_size=[3, 3], num_classes=3, block=SwinTransformerBlockV2,
                            downsample_layer=PatchMergingV2)
    return model, torch.randn(4, 3, 16, 16, generator=g)


def _maxvit(g):
    from torchvision.models.maxvit import MaxVit
    model = MaxVit(input_size=(16, 16), stem_channels=8, partition_size=2, block_channels=[8, 16],
                   block_layers=[1, 1], head_dim=4, stochastic_depth_prob=0.0, num_classes=3)
    return model, torch.randn(4, 3, 16, 16, generator=g)


def _timm(name, size, **kwargs):
    def build(g):
        timm = pytest.importorskip("timm")
        model = timm.create_model(name, pretrained=False, num_classes=3, img_size=size, **kwargs)
        return model, torch.randn(4, 3, size, size, generator=g)
    return build


def _vit(g):
    pytest.importorskip("transformers")
    return hf_models.vit(), torch.randn(4, 3, 16, 16, generator=g)


ARCHITECTURES = {
    "bert": _text(hf_models.bert),
    "distilbert": _text(hf_models.distilbert),
    "gpt2": _text(hf_models.gpt2),
    "vit": _vit,
    "swin": _swin,
    "swin_v2": _swin_v2,
    "maxvit": _maxvit,
    # windows with the batch as their outer factor, [B*nW, N, C]
    "timm_swin": _timm("swin_tiny_patch4_window7_224", 56, embed_dim=16, depths=(1, 1), num_heads=(1, 2)),
    "timm_maxvit": _timm("test_maxvit", 64),
    "timm_coatnet": _timm("test_coatnet", 64),
    # BatchNorm1d on the tokens flattened with the batch, [B*N, C]; attention biases cached in eval
    "timm_levit": _timm("levit_128s", 64),
    # a position encoding computed from the image size alone, repeated for the batch
    "timm_xcit": _timm("xcit_nano_12_p16_224", 32, depth=2),
    "lstm": lambda g: (LSTMClassifier(), _tokens(g)[0]),
}


@pytest.mark.parametrize("name", list(ARCHITECTURES))
def test_auto_serves_every_architecture_with_ghost_and_matches_the_float64_loop(name):
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    model, inputs = ARCHITECTURES[name](g)
    model = model.double().eval()
    if isinstance(inputs, torch.Tensor) and inputs.is_floating_point():
        inputs = inputs.double()
    targets = torch.tensor([0, 2, 1, 2])
    expected = hf_models.loop_norms(model, inputs, targets)
    with warnings.catch_warnings():
        warnings.simplefilter("error", EngineFallback)  # a fallback fails the test
        got = per_example_grad_norms(model, inputs, targets)
    torch.testing.assert_close(got, expected, **TOL)
    assert auto_choice(model)[0] == "ghost"
    rules = {rule for _, _, rule, _ in describe(model, select_params(model, None))}
    assert rules <= {"linear", "conv", "embedding", "norm", "attention", "generic", "rnn", "swin"}


def test_inspect_with_a_pool_shows_the_rules_the_run_settled_on():
    """Swin's attention uses its children's weights in its own forward: its rule claims them.
    In the zoo's AncestorUses no rule claims them, so the attention's generic rule covers them."""
    import gradnorm_zoo

    from alcli.api import settings_for
    from alcli.inspection import inspect_model

    g = torch.Generator().manual_seed(1)
    model, x = _swin(g)
    rules = {row.name: row.rule for row in inspect_model(settings_for(), model=model.eval(), pool=(x,)).modules}
    assert rules["features.1.0.attn"] == "swin" and rules["features.1.0.attn.qkv"] == "via features.1.0.attn"
    model, tokens, _ = gradnorm_zoo.build("ancestor_uses")
    info = inspect_model(settings_for(), model=model, pool=(tokens,))
    rules = {row.name: row.rule for row in info.modules}
    assert info.method == "ghost"
    assert rules["block.0"] == "generic" and rules["block.0.qkv"] == "via block.0" and rules["fc"] == "linear"
