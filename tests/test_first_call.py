"""The first call's probes (issue 53): how many forwards they take, and that taking fewer still
refuses every model the probes exist to catch (gradnorm/layout.py)."""
from __future__ import annotations

import copy
import warnings

import pytest
import torch
from torch import nn

from alcli.gradnorm import UnsupportedModel, per_example_grad_norms
from alcli.gradnorm.layout import MERGED, _runs, _same, _same_each, call_layouts

from gradnorm_zoo import one_thread  # noqa: F401  (autouse fixture)


class Counted(nn.Module):
    """Linear -> tanh -> Linear, counting its forwards and the rows each one saw."""

    def __init__(self):
        super().__init__()
        self.lin, self.head = nn.Linear(3, 4), nn.Linear(4, 2)
        self.rows: list[int] = []

    def forward(self, x):
        self.rows.append(x.shape[0])
        return self.head(torch.tanh(self.lin(x)))


@pytest.mark.parametrize("batch, probes", [(1, [1, 2]), (2, [1, 2]), (3, [1, 3, 3]),
                                           (5, [1, 3, 3]), (6, [1, 6]), (8, [1, 6]), (9, [1, 9])])
def test_the_first_call_probes_in_as_few_forwards_as_the_batch_allows(batch, probes):
    """The one-example forward, then the probe's examples in every order laid end to end in
    forwards of at most the batch's rows: three orders of three in one forward from B = 9;
    below, the rotation and the swap (6 rows from B = 6, one order a forward below), and the
    examples as they are are the pass's own rows, which saves a forward. Nothing but the pass
    runs on the next call. No probe runs more rows than the batch: a device with room for B rows
    and no more (the out-of-memory split's micro-batches) must get through a first call."""
    torch.manual_seed(0)
    model = Counted().double()
    x, y = torch.randn(batch, 3, dtype=torch.float64), torch.arange(batch) % 2
    expected = _loop_norms(model, x, y)
    model.rows.clear()
    first = per_example_grad_norms(model, x, y, method="ghost")
    # a batch of one runs as two copies (api.ONE_EXAMPLE_BUG), probed as a pair
    assert model.rows == [*probes, max(batch, 2)]
    model.rows.clear()
    again = per_example_grad_norms(model, x, y, method="ghost")
    assert model.rows == [max(batch, 2)]
    for norms in (first, again):
        torch.testing.assert_close(norms, expected, rtol=1e-12, atol=0)


@pytest.mark.parametrize("low", ["autocast", "bf16 model", "tf32-like matmuls"])
def test_low_precision_runs_the_examples_as_they_are_as_a_probe(low):
    """Where another batch size changes an example's rows by more than rounding (half precision,
    autocast, reduced-precision float32 matmuls), the pass's rows cannot stand for a probe's: the
    examples as they are stay a probe forward of their own, and the pass's norms are the loop's."""
    torch.manual_seed(0)
    model = Counted().bfloat16() if low == "bf16 model" else Counted()
    x, y = torch.randn(8, 3, dtype=next(model.parameters()).dtype), torch.arange(8) % 2
    precision = torch.get_float32_matmul_precision()
    try:
        if low == "tf32-like matmuls":
            torch.set_float32_matmul_precision("high")
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=low == "autocast"):
            norms = per_example_grad_norms(model, x, y, method="ghost")
            # a pair: a layout of its own, found in the pass's own call_layouts (the plan is kept)
            per_example_grad_norms(model, x[:2], y[:2], method="ghost")
    finally:
        torch.set_float32_matmul_precision(precision)
    assert model.rows == [1, 6, 3, 8, 1, 2, 2, 2]
    expected = _loop_norms(copy.deepcopy(model).double(), x.double(), y)  # bf16 keeps 8 bits
    torch.testing.assert_close(norms.double(), expected, rtol=3e-2, atol=0)


def test_runs_keep_every_order_once_within_the_batch():
    orders = [(2, 0, 1), (1, 0, 2), (0, 1, 2)]
    for batch in range(3, 12):
        runs = _runs(orders, 3, batch)
        assert [o for run in runs for o in run] == orders
        assert all(3 * len(run) <= batch for run in runs)
    assert _runs([(1, 0), (0, 1)], 2, 2) == [[(1, 0)], [(0, 1)]]
    assert _runs([(1, 0), (0, 1)], 2, 4) == [[(1, 0), (0, 1)]]


class Moves(nn.Module):
    """A Linear that sees the batch reversed or rolled by one (and puts it back)."""

    def __init__(self, how: str):
        super().__init__()
        self.how = how
        self.lin, self.head = nn.Linear(3, 3), nn.Linear(3, 2)

    def forward(self, x):
        if self.how == "flip":
            return self.head(torch.tanh(self.lin(x.flip(0))).flip(0))
        return self.head(torch.tanh(self.lin(x.roll(1, 0))).roll(-1, 0))


def _refused_and_auto_is_the_loop(model, x, y):
    """ghost refuses the model (its rows do not follow their examples); `auto` moves on to a
    method that gives the float64 loop's norms."""
    with pytest.raises(UnsupportedModel, match="merges the batch"):
        per_example_grad_norms(model, x, y, method="ghost")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        auto = per_example_grad_norms(model, x, y, method="auto")
    torch.testing.assert_close(auto, _loop_norms(model, x, y), rtol=1e-12, atol=0)


@pytest.mark.parametrize("how", ["flip", "roll"])
@pytest.mark.parametrize("batch", [3, 4, 5, 6, 8, 9])
def test_a_model_moving_its_examples_is_refused_whatever_the_runs(how, batch):
    """At B = 3 to 5 the two reorderings take two forwards, from 6 on one, and the examples as
    they are are the pass's own rows: either way the rows that do not follow their examples are
    found, and `auto` gives the float64 loop's norms."""
    torch.manual_seed(0)
    model = Moves(how).double().eval()
    x, y = torch.randn(batch, 3, dtype=torch.float64), torch.arange(batch) % 2
    _refused_and_auto_is_the_loop(model, x, y)


class MovesWhenFull(Moves):
    """Reverses its batch only at 8 examples or more: probes of fewer rows never see it."""

    def forward(self, x):
        return super().forward(x) if x.shape[0] >= 8 else self.head(torch.tanh(self.lin(x)))


def test_a_model_moving_only_the_full_batch_is_refused():
    """The examples as they are come from the pass itself, so a reordering that only a batch of
    B rows takes (the probes run 6) is still found (before, probes of 6 and 3 rows let the pass
    give other examples' norms)."""
    torch.manual_seed(0)
    model = MovesWhenFull("flip").double()
    x, y = torch.randn(8, 3, dtype=torch.float64), torch.arange(8) % 2
    _refused_and_auto_is_the_loop(model, x, y)


class FailsOnce(Moves):
    """Reverses its batch, and fails its first forward of `rows` rows (the pass)."""

    def __init__(self, rows: int):
        super().__init__("flip")
        self.fail_at = rows

    def forward(self, x):
        if x.shape[0] == self.fail_at:
            self.fail_at = None
            raise torch.OutOfMemoryError("no room")
        return super().forward(x)


@pytest.mark.parametrize("second", ["same", "other"])
def test_a_pass_that_fails_leaves_the_check_to_the_next_call(second):
    """The check waits for a pass that returns: after the first pass failed, the next call (the
    same batch, or another one, as the out-of-memory split's micro-batches) still finds the
    reordering and is refused."""
    torch.manual_seed(0)
    model = FailsOnce(rows=8).double()
    x, y = torch.randn(8, 3, dtype=torch.float64), torch.arange(8) % 2
    with pytest.raises(torch.OutOfMemoryError):
        per_example_grad_norms(model, x, y, method="ghost")
    if second == "other":
        x, y = torch.randn(4, 3, dtype=torch.float64), torch.arange(4) % 2
    with pytest.raises(UnsupportedModel, match="merges the batch"):
        per_example_grad_norms(model, x, y, method="ghost")


@pytest.mark.parametrize("how", ["flip", "keep"])
def test_layouts_asked_for_without_a_pass_are_checked_in_a_probe(how):
    """call_layouts(deferred=True) leaves the examples as they are to the caller's pass; a
    caller without one (replicate, another batch) gets them run as a probe of their own, so the
    layouts it sees are checked: the reversed Linear's dims MERGED, a plain one's kept."""
    torch.manual_seed(0)
    model = Moves("flip").double() if how == "flip" else Counted().double()
    x = torch.randn(8, 3, dtype=torch.float64)
    modules = {"lin": model.lin, "head": model.head}
    call_layouts(model, x, modules, deferred=True)
    assert call_layouts(model, x, modules)["lin"][0].in_dims == ([MERGED] if how == "flip" else [0])


class MaskRows(nn.Module):
    def forward(self, x):
        return x[x[:, 0] > -10].sum(0, keepdim=True).expand(x.shape[0], -1)


def test_a_data_dependent_forward_is_refused_naming_its_module():
    """The watched one-example forward knows only the hooked modules; a finding runs it again
    under a stack of every module, which names where."""
    model = nn.Sequential(nn.Linear(3, 3), MaskRows(), nn.Linear(3, 2)).double()
    x = torch.randn(4, 3, dtype=torch.float64)
    with pytest.raises(UnsupportedModel, match=r"^module '1' \(MaskRows\) has data-dependent shapes \(index\)"):
        per_example_grad_norms(model, x, torch.tensor([0, 1, 1, 0]), method="ghost")


def test_same_each_agrees_with_same_pair_by_pair():
    """The reordering check compares all fingerprints at once: pair by pair it must say what
    _same says, for equal, nearly equal (inside and outside the tolerance), NaN, inf and
    permuted pairs, at scales from 1e-8 to 1e8."""
    g = torch.Generator().manual_seed(0)
    pairs = []
    for i in range(240):
        n = int(torch.randint(1, 20, (1,), generator=g))
        a = torch.randn(n, dtype=torch.float64, generator=g) * 10.0 ** float(torch.randint(-8, 9, (1,), generator=g))
        kind = i % 6
        b = a.clone()
        if kind in (1, 2):  # 1e-7 and 1e-3 relative noise: inside and outside rtol 1e-4
            b = a * (1 + (1e-7 if kind == 1 else 1e-3) * torch.randn(n, dtype=torch.float64, generator=g))
        elif kind == 3:
            a[0] = float("nan")
            b = a.clone()
        elif kind == 4:
            a[0] = float("inf")
            b = a.clone()
            b[-1] += 1
        elif kind == 5:
            b = a[torch.randperm(n, generator=g)]
        pairs.append((a, b))
    expected = [_same(a, b) for a, b in pairs]
    assert 0 < sum(expected) < len(expected)
    assert list(_same_each(pairs)) == expected
    assert list(_same_each(pairs[:1] * 5)) == expected[:1] * 5  # all equal to the bit


def _loop_norms(model, x, y) -> torch.Tensor:
    """The float64 oracle: each example's own loss, its own backward."""
    norms = []
    for i in range(x.shape[0]):
        model.zero_grad(set_to_none=True)
        loss = nn.functional.cross_entropy(model(x[i:i + 1]), y[i:i + 1], reduction="sum")
        grads = torch.autograd.grad(loss, list(model.parameters()))
        norms.append(torch.sqrt(sum(g.double().square().sum() for g in grads)))
    return torch.stack(norms)
