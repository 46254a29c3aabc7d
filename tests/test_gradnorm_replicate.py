"""`--method replicate`'s batched copies (alcli/gradnorm/replicate_layers.py) against the
independent float64 per-example loop of tests/gradnorm_zoo.py: Linear as one batched matmul,
Conv1d/2d/3d as one grouped convolution, LayerNorm / GroupNorm / BatchNorm (eval) as a broadcast
affine, each with stride, padding (modes), dilation, groups, partial selections and bias=False.
A model built only of these layers must run without vmap at all. No timings are asserted here
(benchmarks/replicate_vs_loop.py times replicate against loop).
"""
from __future__ import annotations

import pytest
import torch
from torch import nn

import alcli.gradnorm.replicate as replicate_module
from alcli.gradnorm import per_example_grad_norms

from gradnorm_zoo import one_thread  # noqa: F401  (autouse fixture)
from gradnorm_zoo import oracle_norms

TOL = {torch.float64: 1e-6, torch.float32: 1e-3}


class Head(nn.Module):
    """body, then a mean over every dim but the batch's and the channels', then a Linear to 3 classes."""

    def __init__(self, body: nn.Module, channels: int, channel_dim: int = 1):
        super().__init__()
        self.body, self.channel_dim = body, channel_dim
        self.head = nn.Linear(channels, 3)

    def forward(self, x):
        h = self.body(x).movedim(self.channel_dim, -1)
        return self.head(h.reshape(h.shape[0], -1, h.shape[-1]).mean(1))


def _conv(n, *args, **kw):
    return {1: nn.Conv1d, 2: nn.Conv2d, 3: nn.Conv3d}[n](*args, **kw)


CASES = {
    "linear_2d": (lambda: nn.Sequential(nn.Linear(6, 5), nn.Tanh(), nn.Linear(5, 3)), (6,)),
    "linear_no_bias": (lambda: nn.Sequential(nn.Linear(6, 5, bias=False), nn.Tanh(), nn.Linear(5, 3)), (6,)),
    "linear_tokens": (lambda: Head(nn.Sequential(nn.Linear(4, 6), nn.GELU(), nn.Linear(6, 5)), 5, -1), (7, 4)),
    "linear_4d": (lambda: Head(nn.Linear(4, 5), 5, -1), (2, 3, 4)),
    "layer_norm": (lambda: Head(nn.Sequential(nn.Linear(4, 6), nn.LayerNorm(6), nn.Linear(6, 5)), 5, -1), (7, 4)),
    "layer_norm_2d_shape": (lambda: Head(nn.Sequential(nn.LayerNorm((3, 4)), nn.Linear(4, 5)), 5, -1), (3, 4)),
    **{f"conv{n}d": (lambda n=n: Head(nn.Sequential(_conv(n, 2, 4, 3, padding=1), nn.ReLU(),
                                                     _conv(n, 4, 6, 3, stride=2, dilation=1)), 6), (2,) + (7,) * n)
       for n in (1, 2, 3)},
    "conv2d_stride_dilation_groups": (lambda: Head(nn.Sequential(
        nn.Conv2d(4, 6, (3, 2), stride=(2, 1), padding=(1, 2), dilation=(1, 2), groups=2), nn.Tanh(),
        nn.Conv2d(6, 6, 3, groups=6, bias=False)), 6), (4, 9, 8)),
    **{f"conv2d_{mode}": (lambda mode=mode: Head(nn.Sequential(
        nn.Conv2d(2, 4, 3, padding=2, padding_mode=mode), nn.Tanh(), nn.Conv2d(4, 4, 3, padding="same",
                                                                             padding_mode=mode)), 4), (2, 6, 7))
       for mode in ("zeros", "reflect", "replicate", "circular")},
    "conv1d_same_dilated": (lambda: Head(nn.Conv1d(3, 4, 4, padding="same", dilation=2), 4), (3, 11)),
    "group_norm": (lambda: Head(nn.Sequential(nn.Conv2d(2, 6, 3), nn.GroupNorm(3, 6), nn.ReLU()), 6), (2, 6, 6)),
    "batch_norm_2d_eval": (lambda: Head(nn.Sequential(nn.Conv2d(2, 6, 3), nn.BatchNorm2d(6), nn.ReLU()), 6), (2, 6, 6)),
    "batch_norm_1d_eval": (lambda: nn.Sequential(nn.Linear(5, 6), nn.BatchNorm1d(6), nn.ReLU(), nn.Linear(6, 3)), (5,)),
    "batch_norm_1d_seq_eval": (lambda: Head(nn.Sequential(nn.Conv1d(2, 6, 3), nn.BatchNorm1d(6)), 6), (2, 8)),
}
SELECTIONS = {"all": None, "weights": lambda n: n.endswith("weight"), "biases": lambda n: n.endswith("bias")}


def build(case: str, batch: int = 5, seed: int = 0):
    make, shape = CASES[case]
    torch.manual_seed(seed)
    model = make()
    for m in model.modules():  # running statistics and affine parameters that are not trivial
        if isinstance(m, nn.modules.batchnorm._BatchNorm):
            m.running_mean.uniform_(-0.5, 0.5)
            m.running_var.uniform_(0.5, 2.0)
        if isinstance(m, (nn.modules.batchnorm._BatchNorm, nn.GroupNorm, nn.LayerNorm)):
            nn.init.uniform_(m.weight, 0.5, 1.5)
            nn.init.uniform_(m.bias, -0.5, 0.5)
    model.eval()
    g = torch.Generator().manual_seed(seed + 1)
    return model, torch.randn(batch, *shape, generator=g), torch.randint(0, 3, (batch,), generator=g)


def params_for(model, select):
    names = [n for n, _ in model.named_parameters()]
    return None if select is None else [n for n in names if select(n)]


@pytest.fixture
def no_vmap(monkeypatch):
    """replicate must not fall back to vmap for these layers."""
    def refuse(*args, **kwargs):
        raise AssertionError("replicate fell back to vmap")
    monkeypatch.setattr(replicate_module, "vmap", refuse)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["f64", "f32"])
@pytest.mark.parametrize("selection", list(SELECTIONS))
@pytest.mark.parametrize("case", list(CASES))
def test_batched_copies_match_oracle(case, selection, dtype, no_vmap):
    model, x, y = build(case)
    select = SELECTIONS[selection]
    params = params_for(model, select)
    if params == []:
        pytest.skip("no parameter of that kind")
    expected = oracle_norms(model, x, y, select)
    model = model.to(dtype)
    got = per_example_grad_norms(model, x.to(dtype), y, params=params, method="replicate")
    torch.testing.assert_close(got.double(), expected, rtol=TOL[dtype], atol=1e-12)


def test_batch_of_one_and_repeated_calls(no_vmap):
    """A module called twice adds both calls' gradients in one copy; a batch of one example."""
    class Twice(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 4)
            self.out = nn.Linear(4, 3)

        def forward(self, x):
            return self.out(torch.tanh(self.lin(torch.tanh(self.lin(x)))))

    torch.manual_seed(0)
    model = Twice().double()
    x, y = torch.randn(6, 4, dtype=torch.float64), torch.tensor([0, 1, 2, 0, 1, 2])
    expected = oracle_norms(model, x, y)
    torch.testing.assert_close(per_example_grad_norms(model, x, y, method="replicate"), expected.to(x.dtype))
    torch.testing.assert_close(per_example_grad_norms(model, x[:1], y[:1], method="replicate"),
                               expected[:1].to(x.dtype))


def test_batchnorm_in_training_mode_still_served():
    """BatchNorm in training mode mixes the examples: it keeps the vmap path (as before)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 6), nn.BatchNorm1d(6), nn.ReLU(), nn.Linear(6, 3)).double().train()
    x, y = torch.randn(4, 5, dtype=torch.float64), torch.tensor([0, 1, 2, 0])
    a = per_example_grad_norms(model, x, y, method="replicate")
    b = per_example_grad_norms(model, x, y, method="loop")
    assert a.shape == b.shape == (4,)


if __name__ == "__main__":
    import runpy
    import sys
    from pathlib import Path

    sys.argv = [sys.argv[0], *sys.argv[1:]]
    runpy.run_path(str(Path(__file__).resolve().parents[1] / "benchmarks" / "replicate_vs_loop.py"),
                   run_name="__main__")
