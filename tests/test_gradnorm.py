"""The engine's numbers against an independent float64 per-example loop (tests/gradnorm_zoo.py).

Every method is run on every zoo case in float64 (must match the oracle to 1e-6 relative) and in
float32 (1e-3). `replicate`, `vmap` and `ghost` decline exactly the cases gradnorm_zoo.DECLINES
lists, with UnsupportedModel naming the module at fault (recorded as a warning); every other
method must serve, and `auto` and `loop` always serve.
"""
from __future__ import annotations

import copy
import warnings
import weakref

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from alcli.gradnorm import UnsupportedModel, grad_norms_per_target, per_example_grad_norms

from gradnorm_zoo import one_thread  # noqa: F401  (autouse fixture)
from gradnorm_zoo import (CASE_BY_ID, CASES, DECLINES, VOCAB, ManualRNN, PackedTokens, as_dtype, build, default_loss,
                          oracle_norms, packed_inputs)

METHODS = ["loop", "auto", "ghost", "vmap", "replicate"]
TOL = {torch.float64: 1e-6, torch.float32: 1e-3}


class Declined(UserWarning):
    """A method declined a model with UnsupportedModel (allowed for ghost/vmap/replicate)."""


_ORACLE: dict = {}


def oracle_for(case_id: str, targets_key: str = "default", loss_key: str = "ce"):
    """Cached float64 oracle for a zoo case (the slow part of the suite)."""
    key = (case_id, targets_key, loss_key)
    if key not in _ORACLE:
        case = CASE_BY_ID[case_id]
        model, inputs, targets = build(case.model)
        if targets_key != "default":
            targets = TARGET_SETS[targets_key](targets)
        _ORACLE[key] = oracle_norms(model, inputs, targets, case.select, LOSSES[loss_key])
    return _ORACLE[key]


def names_a_module(message: str, model: nn.Module) -> bool:
    """The message names a submodule (path or type), the root module, or the loss function."""
    names = {n for n, _ in model.named_modules() if n} | {type(m).__name__ for m in model.modules()}
    return any(n in message for n in names | {"root module", "loss"})


# declines for what this file adds to a zoo case (its loss, its batch), beside gradnorm_zoo.DECLINES
MORE_DECLINES = {
    "brier": frozenset({"vmap"}),  # F.one_hot reads the class count from the data: vmap cannot
    "manual_rnn, longest example not first": frozenset({"ghost", "vmap", "replicate"}),
}


def call(method, model, inputs, targets, zoo: str, **kw):
    """Run the engine; None when the method declines a model that DECLINES[zoo] says it declines
    (zoo: a case id, or several keys of DECLINES / MORE_DECLINES joined by '+')."""
    try:
        return per_example_grad_norms(model, inputs, targets, method=method, **kw)
    except UnsupportedModel as err:
        declined(method, model, err, zoo)
        return None


def declined(method, model, err, zoo: str):
    allowed = set().union(*(DECLINES.get(k, MORE_DECLINES.get(k, ())) for k in zoo.split("+")))
    if method not in allowed:
        raise AssertionError(f"{method} must serve zoo case {zoo!r} but declined it: {err}") from err
    assert names_a_module(str(err), model), \
        f"{method}: UnsupportedModel must name the module at fault, got: {err}"
    warnings.warn(Declined(f"{method} declined {type(model).__name__}: {err}"))


def assert_matches(actual, expected, rtol, what=""):
    assert actual.shape == expected.shape, f"{what}: shape {tuple(actual.shape)} != {tuple(expected.shape)}"
    assert actual.is_floating_point()
    assert torch.isfinite(actual).all(), f"{what}: non-finite norms {actual}"
    torch.testing.assert_close(actual.double(), expected, rtol=rtol,
                               atol=rtol * 1e-3 * float(expected.abs().max()),
                               msg=lambda m: f"{what}\n{m}\nactual   {actual.tolist()}\n"
                                             f"expected {expected.tolist()}")


# ----------------------------------------------------------------------------------- exactness
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["f64", "f32"])
@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("case_id", [c.id for c in CASES])
def test_matches_oracle(case_id, method, dtype):
    case = CASE_BY_ID[case_id]
    model, inputs, targets = build(case.model)
    model = model.to(dtype)
    inputs = as_dtype(inputs, dtype)
    norms = call(method, model, inputs, targets, case_id, params=list(case.params) if case.params else None)
    if norms is None:
        return
    assert_matches(norms, oracle_for(case_id), TOL[dtype], f"{case_id} / {method} / {dtype}")


def test_oracle_is_the_seeds_loop():
    """Sanity check of the oracle itself against the seed's method 1 (zero_grad + backward)."""
    model, inputs, targets = build("simple")
    model = model.double()
    x = inputs.double()
    expected = []
    for i in range(x.shape[0]):
        model.zero_grad()
        F.cross_entropy(model(x[i:i + 1]), targets[i:i + 1]).backward()
        expected.append(model.conv2.weight.grad.norm())
    model.zero_grad(set_to_none=True)
    torch.testing.assert_close(oracle_for("simple[conv2]"), torch.stack(expected), rtol=1e-12, atol=0)


# ---------------------------------------------------------------------------- parameter selection
SELECTIONS = [
    # (model, params given to the engine, the oracle's own reading of it)
    ("simple", ["conv2"], lambda n: n.startswith("conv2.")),
    ("simple", ["conv1", "fc"], lambda n: n.split(".")[0] in ("conv1", "fc")),
    ("simple", "fc", lambda n: n.startswith("fc.")),
    ("simple", ["conv2.weight"], lambda n: n == "conv2.weight"),
    ("bn_res_cnn", ["conv*"], lambda n: n.startswith("conv")),
    ("bn_res_cnn", ["bn1", "bn3"], lambda n: n.startswith(("bn1.", "bn3."))),
    ("transformer", ["encoder.layers.1.self_attn", "head"],
     lambda n: n.startswith(("encoder.layers.1.self_attn.", "head."))),
    ("mlp", ["net.2"], lambda n: n.startswith("net.2.")),
]


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("sel", range(len(SELECTIONS)),
                         ids=[f"{m}{p}" for m, p, _ in SELECTIONS])
def test_params_selection(sel, method):
    name, params, select = SELECTIONS[sel]
    key = ("selection", sel)
    model, inputs, targets = build(name)
    if key not in _ORACLE:
        _ORACLE[key] = oracle_norms(model, inputs, targets, select)
    model, inputs = model.double(), as_dtype(inputs, torch.float64)
    norms = call(method, model, inputs, targets, name, params=params)
    if norms is not None:
        assert_matches(norms, _ORACLE[key], 1e-6, f"{name} params={params} / {method}")


@pytest.mark.parametrize("method", METHODS)
def test_frozen_params_are_not_selected_by_default(method):
    model, inputs, targets = build("bn_res_cnn")
    model.conv1.weight.requires_grad_(False)
    model.bn2.requires_grad_(False)
    key = ("frozen",)
    if key not in _ORACLE:
        _ORACLE[key] = oracle_norms(model, inputs, targets,
                                    lambda n: n != "conv1.weight" and not n.startswith("bn2."))
    norms = call(method, model.double(), inputs.double(), targets, "bn_res_cnn")
    if norms is not None:
        assert_matches(norms, _ORACLE[key], 1e-6, method)


# ------------------------------------------------------------------------------------- loss
def smooth_ce(logits, targets):
    return 0.5 * F.cross_entropy(logits, targets, reduction="none", label_smoothing=0.2)


def brier(logits, targets):
    onehot = F.one_hot(targets, logits.shape[1]).to(logits.dtype)
    return (logits.softmax(1) - onehot).pow(2).sum(1) + 0.01 * logits.pow(2).mean(1)


LOSSES = {"ce": None, "smooth_ce": smooth_ce, "brier": brier}


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("loss_key", ["smooth_ce", "brier"])
@pytest.mark.parametrize("case_id", ["simple", "simple[conv2]", "transformer", "tied"])
def test_custom_loss(case_id, loss_key, method):
    case = CASE_BY_ID[case_id]
    model, inputs, targets = build(case.model)
    expected = oracle_for(case_id, loss_key=loss_key)
    norms = call(method, model.double(), as_dtype(inputs, torch.float64), targets, f"{case_id}+{loss_key}",
                 params=list(case.params) if case.params else None, loss_fn=LOSSES[loss_key])
    if norms is not None:
        assert_matches(norms, expected, 1e-6, f"{case_id} / {loss_key} / {method}")


def test_default_loss_is_per_example_cross_entropy():
    model, inputs, targets = build("mlp")
    model = model.double()
    x = inputs.double()
    a = per_example_grad_norms(model, x, targets, method="auto")
    b = per_example_grad_norms(model, x, targets, method="auto", loss_fn=default_loss)
    torch.testing.assert_close(a, b, rtol=1e-12, atol=0)


# ------------------------------------------------------------------------------ several targets
TARGET_SETS = {
    "plus1": lambda t: (t + 1) % 4,
    "zeros": lambda t: torch.zeros_like(t),
    "three": lambda t: torch.full_like(t, 3),
}


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("case_id", ["simple", "simple[conv2]", "transformer", "tied", "bn_res_cnn"])
def test_grad_norms_per_target(case_id, method):
    case = CASE_BY_ID[case_id]
    model, inputs, targets = build(case.model)
    model, x = model.double(), as_dtype(inputs, torch.float64)
    sets = [targets] + [TARGET_SETS[k](targets) for k in TARGET_SETS]
    expected = torch.stack([oracle_for(case_id)] + [oracle_for(case_id, k) for k in TARGET_SETS])
    with torch.no_grad():
        expected_logits = copy.deepcopy(model).eval()(x)
    try:
        norms, logits = grad_norms_per_target(model, x, sets, method=method,
                                              params=list(case.params) if case.params else None)
    except UnsupportedModel as err:
        declined(method, model, err, case_id)
        return
    assert norms.shape == (len(sets), x.shape[0])
    for k in range(len(sets)):
        assert_matches(norms[k], expected[k], 1e-6, f"{case_id} / {method} / target set {k}")
    assert not logits.requires_grad
    torch.testing.assert_close(logits, expected_logits, rtol=1e-9, atol=1e-12)


class ConvPaths(nn.Module):
    """Every way the conv rule forms a weight gradient. The weight backward (the batch folded into
    the groups) where an example's positions outnumber C_out/groups: a stem, a depthwise one with
    stride, a grouped one on each example's channel halves stacked as rows [B*2, C/2, H, W]
    (an example's gradient sums its rows), a 'same' depthwise one; the patches elsewhere: rows, a
    conv called twice (per-example gradients), a grouped one (Gram form), a 1x1 (materialised)."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        self.dw = nn.Conv2d(8, 8, 5, stride=2, padding=2, groups=8)
        self.rows = nn.Conv2d(4, 8, 3, padding=2, dilation=2, groups=2, padding_mode="circular")
        self.same = nn.Conv2d(16, 16, 3, padding="same", groups=16, bias=False)
        self.rows_small = nn.Conv2d(8, 8, 3, padding=1)
        self.twice = nn.Conv2d(16, 16, 3, padding=1)
        self.small = nn.Conv2d(16, 32, 3, padding=1, groups=2)
        self.point = nn.Conv2d(32, 32, 1, groups=32)
        self.fc = nn.Linear(32, 4)

    def forward(self, x):  # [B, 3, 8, 8]
        b = x.shape[0]
        h = torch.tanh(self.dw(torch.tanh(self.stem(x))))                              # [B, 8, 4, 4]
        h = torch.tanh(self.rows(h.reshape(-1, 4, 4, 4))).reshape(b, 16, 4, 4)
        h = F.avg_pool2d(torch.tanh(self.same(h)), 2)                                  # [B, 16, 2, 2]
        h = torch.tanh(self.rows_small(h.reshape(-1, 8, 2, 2))).reshape(b, 16, 2, 2)
        h = torch.tanh(self.twice(torch.tanh(self.twice(h))))
        h = torch.tanh(self.point(torch.tanh(self.small(h))))                          # [B, 32, 2, 2]
        return self.fc(h.mean((2, 3)))


CONV_PATHS = ["stem", "dw", "rows", "same", "rows_small", "twice", "small", "point"]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["f64", "f32"])
def test_conv_rule_paths_for_several_target_sets(dtype):
    """Ghost's convolutions against the float64 loop, each layer alone (deep layers' gradients
    would hide a shallow one's error in the model's norm) and all together, for three target
    sets at once (one vmapped backward, the rule inside vmap) and for one."""
    torch.manual_seed(3)
    model = ConvPaths().eval().to(dtype)
    x = torch.randn(5, 3, 8, 8, dtype=dtype)
    sets = [torch.tensor([0, 1, 2, 3, 0]), torch.tensor([3, 3, 1, 0, 2]), torch.zeros(5, dtype=torch.long)]
    for name in [*CONV_PATHS, None]:
        select = None if name is None else lambda n, name=name: n.startswith(name + ".")
        expected = torch.stack([oracle_norms(model, x, t, select) for t in sets])
        norms, _ = grad_norms_per_target(model, x, sets, method="ghost", params=name and [name])
        for k in range(len(sets)):
            assert_matches(norms[k], expected[k], TOL[dtype], f"{name or 'all'}, target set {k}")
        one = per_example_grad_norms(model, x, sets[1], method="ghost", params=name and [name])
        assert_matches(one, expected[1], TOL[dtype], f"{name or 'all'}, one target set")


class ExpLinear(nn.Linear):
    """A Linear subclass whose own forward ends in exp, which keeps its result for the backward."""

    def forward(self, x):
        return torch.exp(0.1 * super().forward(x))


class InPlaceAfterTaps(nn.Module):
    """Outputs tapped in place (Conv2d, BatchNorm2d, Linear: their backwards never read them)
    then modified in place by the model (ReLU); a subclass's output that its backward reads
    (ExpLinear), which must keep its tap out of place."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 6, 3, padding=1)
        self.bn = nn.BatchNorm2d(6)
        self.exp = ExpLinear(6, 6)
        self.fc = nn.Linear(6, 4)

    def forward(self, x):  # [B, 3, 6, 6]
        h = self.bn(self.conv(x)).relu_()
        return self.fc(self.exp(h.mean((2, 3))))


def test_taps_in_place_only_where_the_backward_never_reads_the_output():
    torch.manual_seed(4)
    model = InPlaceAfterTaps().eval().double()
    with torch.no_grad():
        model.bn.running_mean.uniform_(-0.5, 0.5)
        model.bn.running_var.uniform_(0.5, 2.0)
    x, y = torch.randn(5, 3, 6, 6, dtype=torch.float64), torch.tensor([0, 1, 2, 3, 0])
    torch.testing.assert_close(per_example_grad_norms(model, x, y, method="ghost"), oracle_norms(model, x, y),
                               rtol=1e-10, atol=0)


class InputChangedAfterUse(nn.Module):
    """`lin` runs on h, then h is changed in place: the input the rule would read is no longer
    the one the layer saw (the backward to the taps never reaches lin's own saved input, so
    autograd would not notice)."""

    def __init__(self):
        super().__init__()
        self.lin, self.head = nn.Linear(4, 4), nn.Linear(4, 3)

    def forward(self, x):
        h = x * 1.0
        y = self.lin(h)
        h.mul_(3.0)
        return self.head(y + h)


def test_an_input_changed_in_place_after_its_layer_ran_is_refused_not_misread():
    model = InputChangedAfterUse().double()
    x, y = torch.randn(5, 4, dtype=torch.float64), torch.tensor([0, 1, 2, 0, 1])
    for _ in range(2):  # the first call and a steady one
        with pytest.raises(UnsupportedModel, match="modified in place after the module ran"):
            per_example_grad_norms(model, x, y, method="ghost")


# --------------------------------------------------------------------------------- batch edges
@pytest.mark.parametrize("method", METHODS)
def test_batch_of_one(method):
    model, inputs, targets = build("bn_res_cnn")
    expected = oracle_for("bn_res_cnn")[:1]
    norms = call(method, model.double(), inputs[:1].double(), targets[:1], "bn_res_cnn")
    if norms is not None:
        assert_matches(norms, expected, 1e-6, method)


@pytest.mark.parametrize("method", METHODS)
def test_repeated_calls_and_new_batch_sizes(method):
    """A second call on the same model (another batch size) is exact too: no stale state."""
    model, inputs, targets = build("transformer")
    model, expected = model.double(), oracle_for("transformer")
    for sl in (slice(0, 4), slice(1, 3), slice(0, 4)):
        norms = call(method, model, inputs[sl], targets[sl], "transformer")
        if norms is None:
            return
        assert_matches(norms, expected[sl], 1e-6, f"{method} batch {sl}")


@pytest.mark.parametrize("method", METHODS)
def test_later_batch_that_a_method_cannot_serve(method):
    """A method that served one batch may have to decline the next (here the first batch's
    example 0 is its longest sequence, the second's is not); `auto` must still answer."""
    torch.manual_seed(0)
    model = ManualRNN().double().eval()
    targets = torch.tensor([0, 1, 2])
    for tokens, zoo in ((torch.tensor([[1, 2, 3, 0], [3, 1, 0, 0], [1, 2, 0, 0]]), "manual_rnn"),
                        (torch.tensor([[1, 2, 3, 0], [3, 1, 3, 4], [1, 2, 5, 0]]),
                         "manual_rnn, longest example not first")):
        expected = oracle_norms(model, tokens, targets)
        norms = call(method, model, tokens, targets, zoo)
        if norms is not None:
            assert_matches(norms, expected, 1e-6, f"{method} on {tokens.tolist()}")


@pytest.mark.parametrize("method", METHODS)
def test_packed_tokens_after_a_batch_that_hides_the_packing(method):
    """One token per example packs to [B, d], which looks batch-first; a later batch of the same
    shape with counts [2, 1, 0, 1] packs to [4, d] too, but its rows are not its examples."""
    torch.manual_seed(0)
    model = PackedTokens().double().eval()
    targets = torch.tensor([0, 1, 2, 1])
    gen = torch.Generator().manual_seed(1)
    for counts in ([1, 1, 1, 1], [2, 1, 0, 1]):
        tokens = packed_inputs(counts, gen)
        norms = call(method, model, tokens, targets, "packed_tokens")
        if norms is None:
            return
        assert_matches(norms, oracle_norms(model, tokens, targets), 1e-6, f"{method} counts {counts}")


@pytest.mark.parametrize("method", METHODS)
def test_called_under_no_grad(method):
    """Scoring code often runs under torch.no_grad(); the engine needs gradients and must turn
    them on for itself rather than fail."""
    model, inputs, targets = build("bn_res_cnn")
    with torch.no_grad():
        norms = call(method, model.double(), inputs.double(), targets, "bn_res_cnn")
    if norms is not None:
        assert_matches(norms, oracle_for("bn_res_cnn"), 1e-6, method)


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("case_id", ["simple", "transformer", "mlp", "lstm"])
def test_empty_batch(case_id, method):
    """B = 0: no example, no norm; every method answers shape [0] (and [K, 0] for K target sets)."""
    model, inputs, targets = build(CASE_BY_ID[case_id].model)
    norms = per_example_grad_norms(model, inputs[:0], targets[:0], method=method)
    assert norms.shape == (0,) and norms.dtype == torch.float32
    norms, logits = grad_norms_per_target(model, inputs[:0], [targets[:0], targets[:0]], method=method)
    assert norms.shape == (2, 0) and logits.shape[0] == 0


class EmbedSum(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, 6, padding_idx=None)
        self.head = nn.Linear(6, 4)

    def forward(self, tokens):  # [B, T], T may be 0
        return self.head(torch.tanh(self.emb(tokens).sum(1)))


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("params", [["emb"], None], ids=["emb", "all"])
def test_examples_without_tokens(method, params):
    """Examples of no tokens ([B, 0]): the embedding gets no gradient, the head still does."""
    torch.manual_seed(0)
    model = EmbedSum().double().eval()
    tokens = torch.zeros(3, 0, dtype=torch.long)
    targets = torch.tensor([0, 1, 3])
    select = None if params is None else (lambda n: n.startswith("emb."))
    expected = oracle_norms(model, tokens, targets, select)
    norms = call(method, model, tokens, targets, "embed_sum", params=params)
    if norms is not None:
        assert_matches(norms, expected, 1e-6, f"{method} params={params}")
    if params == ["emb"]:
        assert norms is None or torch.equal(norms, torch.zeros(3, dtype=torch.float64))


def test_examples_without_tokens_for_several_target_sets():
    """EGL's target sets on empty taps: the chunking of the vmapped backward sees outputs of no
    elements and still gives zeros for the embedding."""
    model = EmbedSum().double().eval()
    tokens = torch.zeros(3, 0, dtype=torch.long)
    sets = [torch.tensor([0, 1, 3]), torch.tensor([2, 2, 0])]
    norms, _ = grad_norms_per_target(model, tokens, sets, params=["emb"], method="ghost")
    assert torch.equal(norms, torch.zeros(2, 3, dtype=torch.float64))


class FlipInside(nn.Module):
    """A Linear that sees the batch reversed (and puts it back): its rows are other examples'."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)
        self.head = nn.Linear(3, 2)

    def forward(self, x):
        return self.head(torch.tanh(self.lin(x.flip(0))).flip(0))


def test_a_model_reordering_its_examples_inside_is_refused_by_ghost():
    """Found at batch 5 even after a pair came first: a pair's one reordering commutes with
    itself (so a pair cannot show it), and a pair's layout is not reused for larger batches."""
    torch.manual_seed(0)
    model = FlipInside().double().eval()
    x, y = torch.randn(5, 3, dtype=torch.float64), torch.tensor([0, 1, 1, 0, 1])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        per_example_grad_norms(model, x[:2], y[:2], method="ghost")
    _refused_by_ghost_and_auto_equals_the_loop(model, x, y)


def test_a_model_sorting_its_examples_is_refused_even_when_the_first_batch_is_already_sorted():
    """The zoo's SortedByLength: on a first batch of equal lengths the sort changes nothing and
    every reordering check passes, so the sort itself must refuse it (a later batch of mixed
    lengths would reuse the layout, with other examples' rows)."""
    from gradnorm_zoo import SortedByLength
    torch.manual_seed(0)
    model = SortedByLength().double().eval()
    full = torch.randint(1, VOCAB, (4, 6))
    with pytest.raises(UnsupportedModel, match="orders the examples by their values"):
        per_example_grad_norms(model, full, torch.tensor([0, 1, 2, 1]), method="ghost")


@pytest.mark.parametrize("nan", [False, True], ids=["numbers", "nan"])
def test_a_reordering_model_is_refused_when_the_batch_starts_with_copies(nan):
    """The reordering probes take three distinct examples of the batch: on copies of one example
    (a pool with duplicates) a reversal would move nothing, and the flip would pass unseen.
    Copies holding a NaN are copies too (NaN != NaN must not make them look distinct)."""
    torch.manual_seed(0)
    model = FlipInside().double().eval()
    if nan:
        model = nn.Sequential(NanToNum(), model)
    x = torch.randn(6, 3, dtype=torch.float64)
    if nan:
        x[0, 0] = float("nan")
    x[1:4] = x[0]  # examples 0-3 are one example; 4 and 5 differ
    y = torch.tensor([0, 1, 1, 0, 1, 0])
    _refused_by_ghost_and_auto_equals_the_loop(model, x, y)


class NanToNum(nn.Module):
    def forward(self, x):
        return torch.nan_to_num(x)


class RowsInOrder(nn.Module):
    """Refuses a batch whose first two rows are not in decreasing order of their first value."""

    def forward(self, x):
        if x.shape[0] > 1 and x[0, 0] < x[1, 0]:
            raise ValueError("rows out of order")
        return x


def test_a_module_failing_on_the_examples_in_another_order_is_named():
    """The probes run without a module stack; when one fails, a rerun under it names the module."""
    model = nn.Sequential(RowsInOrder(), nn.Linear(3, 2)).double().eval()
    x = torch.randn(5, 3, dtype=torch.float64)
    x = x[x[:, 0].argsort(descending=True)]
    with pytest.raises(UnsupportedModel, match=r"^module '0' \(RowsInOrder\) fails on part of the batch "
                                               r"or the batch in another order.*\(rows out of order\)"):
        per_example_grad_norms(model, x, torch.tensor([0, 1, 1, 0, 1]), method="ghost")


def _refused_by_ghost_and_auto_equals_the_loop(model, x, y):
    with pytest.raises(UnsupportedModel, match="merges the batch"):
        per_example_grad_norms(model, x, y, method="ghost")
    expected = per_example_grad_norms(model, x, y, method="loop")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.testing.assert_close(per_example_grad_norms(model, x, y), expected, rtol=1e-10, atol=0)


class SavedForBackward(nn.Module):
    """x -> head(tanh(lin(x)) * w), w = cos(x) a tensor of its own: the product saves w for a
    backward and nothing else holds it, so during each forward `alive` notes whether the forward
    keeps a training graph."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)
        self.head = nn.Linear(3, 2)
        self.alive: list[bool] = []

    def forward(self, x):
        w = x.detach().cos()
        kept = weakref.ref(w)
        h = torch.tanh(self.lin(x)) * w
        del w
        self.alive.append(kept() is not None)
        return self.head(h)


def test_the_layout_probes_keep_no_graph_for_a_backward():
    """The first call's probes run the model with grad on but keep nothing a backward would need
    (at T = 2048 a language model's training graph is gigabytes); the ghost pass itself does."""
    torch.manual_seed(0)
    model = SavedForBackward().double().eval()
    x, y = torch.randn(5, 3, dtype=torch.float64), torch.tensor([0, 1, 1, 0, 1])
    per_example_grad_norms(model, x, y, method="ghost")
    assert len(model.alive) > 2  # the probes' forwards, then ghost's own
    assert model.alive == [False] * (len(model.alive) - 1) + [True]


class SlopeInside(nn.Module):
    """The forward differentiates: tanh's slope at the input, 1 - tanh(x)^2, scales the features."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)
        self.head = nn.Linear(3, 2)

    def forward(self, x):
        with torch.enable_grad():
            z = x.detach().requires_grad_()
            (slope,) = torch.autograd.grad(torch.tanh(z).sum(), z)  # [B, 3]
        return self.head(torch.tanh(self.lin(x)) * slope)


def test_a_forward_that_differentiates_is_probed_with_its_graph():
    """Its backward needs what the probes drop: the probe runs it again keeping the graph."""
    torch.manual_seed(0)
    model = SlopeInside().double().eval()
    x, y = torch.randn(5, 3, dtype=torch.float64), torch.tensor([0, 1, 1, 0, 1])
    expected = per_example_grad_norms(model, x, y, method="loop")
    torch.testing.assert_close(per_example_grad_norms(model, x, y, method="ghost"), expected, rtol=1e-10, atol=0)


class Attend(nn.Module):
    """Self-attention (F.scaled_dot_product_attention) into an output layer of `width` classes; notes
    which kernel each forward's attention ran (its output's grad_fn)."""

    def __init__(self, width: int):
        super().__init__()
        self.qkv = nn.Linear(4, 12)
        self.head = nn.Linear(4, width)
        self.kernels: list[str] = []

    def forward(self, x):  # [B, T, 4]
        q, k, v = self.qkv(x).unsqueeze(1).chunk(3, -1)  # [B, 1, T, 4] each
        o = F.scaled_dot_product_attention(q, k, v)
        self.kernels.append(type(o.grad_fn).__name__)
        return self.head(o.squeeze(1)).mean(1)


@pytest.mark.parametrize("width, fused", [(3, False), (2 ** 19, True)], ids=["small", "large"])
def test_first_call_attention_kernel_follows_whether_the_backward_is_vmapped(width, fused):
    """Before the first forward K is unknown: the math kernel (vmap batches its backward, but it
    keeps [B, H, T, T] per layer) only where two target sets' taps fit one vmapped backward;
    a language model's [B, T, V] taps do not, and its first call runs the fused kernel."""
    torch.manual_seed(0)
    model = Attend(width).eval()
    x = torch.randn(2, 5, 4)
    per_example_grad_norms(model, x, torch.tensor([0, 1]), method="ghost")
    assert ("Flash" in model.kernels[-1]) == fused, model.kernels
