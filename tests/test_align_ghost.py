"""Issue 54's ghost route to align's inner products: g_i·V from the engine's backward, beside the
norm (outer.dot, ghost_norms' `direction`, gradnorm.grad_dots_per_target), against per-example
gradients formed here one example at a time in float64; and align's two routes (ghost, jvp)
against each other."""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import gradnorm_zoo as zoo
from gradnorm_zoo import one_thread  # noqa: F401  (autouse fixture)
from alcli.gradnorm import grad_dots_per_target
from alcli.gradnorm.outer import Outer, dot
from alcli.gradnorm.params import selection_for
from alcli.score import align as align_route
from alcli.score.strategies import STRATEGIES, StrategyInputs
from test_align import as_target, mlp, oracle_target

F64 = torch.float64


# ------------------------------------------------------------------------- outer.dot, term by term
def test_dot_of_dense_factored_and_indexed_terms_against_their_dense_gradients():
    g = torch.Generator().manual_seed(0)
    batch, steps, rows, cols = 3, 5, 7, 4
    v = torch.randn(rows, cols, generator=g, dtype=F64)
    dense = torch.randn(batch, rows, cols, generator=g, dtype=F64)
    factored = Outer(torch.randn(batch, steps, rows, generator=g, dtype=F64),
                     torch.randn(batch, steps, cols, generator=g, dtype=F64), rows)
    idx = torch.randint(0, rows, (batch, steps), generator=g)
    idx[0, :2] = idx[0, 2]  # a row picked three times
    indexed = Outer(idx, torch.randn(batch, steps, cols, generator=g, dtype=F64), rows)

    def formed(term):  # example i's gradient, summed here position by position: [B, R, C]
        out = torch.zeros(batch, rows, cols, dtype=F64)
        for i in range(batch):
            for t in range(steps):
                r = F.one_hot(term.rows[i, t], rows).to(F64) if term.rows.dim() == 2 else term.rows[i, t]
                out[i] += torch.outer(r, term.cols[i, t])
        return out

    want = {"dense": dense, "factored": formed(factored), "indexed": formed(indexed)}
    for name, term in [("dense", dense), ("factored", factored), ("indexed", indexed)]:
        expected = (want[name] * v).sum((1, 2))
        torch.testing.assert_close(dot([term], v, F64), expected, rtol=1e-13, atol=1e-13, msg=name)
    # a parameter's terms (its dense sum, then factors) add before the dot
    torch.testing.assert_close(dot([dense, factored, indexed], v, F64),
                               (sum(want.values()) * v).sum((1, 2)), rtol=1e-13, atol=1e-13)
    # a float32 term takes V in float32 and adds up in float64
    got = dot([factored._replace(rows=factored.rows.float(), cols=factored.cols.float())], v, F64)
    assert got.dtype == F64
    torch.testing.assert_close(got, (want["factored"] * v).sum((1, 2)), rtol=1e-5, atol=1e-5)


# --------------------------------------------------------- the engine, over the zoo's ghost cases
GHOST_CASES = [c for c in zoo.CASES if "ghost" not in zoo.DECLINES.get(c.model, ())
               and c.model not in ("resnet18", "mobilenet")]


def oracle_grads(model, inputs, targets, select) -> tuple[list, list[torch.Tensor]]:
    """The oracle's parameters (by `select`, one per tensor) and each example's flattened loss
    gradient over them [B, P], one example at a time."""
    chosen: dict[int, nn.Parameter] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        if (p.requires_grad if select is None else select(name)) and id(p) not in chosen:
            chosen[id(p)] = p
    params = list(chosen.values())
    rows = []
    for i in range(inputs.shape[0]):
        loss = zoo.default_loss(model(inputs[i:i + 1]), targets[i:i + 1]).sum()
        grads = torch.autograd.grad(loss, params, allow_unused=True)
        rows.append(torch.cat([(gr if gr is not None else torch.zeros_like(p)).reshape(-1)
                               for gr, p in zip(grads, params)]))
    return params, torch.stack(rows)


@pytest.mark.parametrize("case", GHOST_CASES, ids=lambda c: c.id)
def test_engine_norms_and_dots_against_the_loop(case):
    """Two target sets (vmapped through one backward where the model allows), every rule's
    per-example gradient (dense, factored, a tied parameter's sum of uses) dotted with V."""
    model, inputs, targets = zoo.build(case.model)
    model = model.double()
    inputs = zoo.as_dtype(inputs, F64)
    params, per_example = [], []
    for t in (targets, (targets + 1) % 2):
        params, g = oracle_grads(model, inputs, t, case.select)
        per_example.append(g)
    gen = torch.Generator().manual_seed(1)
    v = {id(p): torch.randn(p.shape, generator=gen, dtype=F64) for p in params}
    flat_v = torch.cat([v[id(p)].reshape(-1) for p in params])
    selection = selection_for(model, list(case.params) if case.params else None)
    direction = {n: v[id(p)] for n, p in zip(selection.names, selection.params)}
    norms, dots, logits = grad_dots_per_target(model, inputs, [targets, (targets + 1) % 2], direction,
                                               params=list(case.params) if case.params else None,
                                               loss_fn=zoo.default_loss)
    want_norms = torch.stack([g.norm(dim=1) for g in per_example])
    want_dots = torch.stack([g @ flat_v for g in per_example])
    torch.testing.assert_close(norms, want_norms, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(dots, want_dots, rtol=1e-10, atol=1e-12)
    assert norms.dtype == dots.dtype == F64 and logits.shape[0] == inputs.shape[0]


def test_a_batch_of_one_and_an_empty_batch():
    model = mlp()
    x, y = torch.randn(3, 4, dtype=F64), torch.tensor([0, 2, 1])
    v = {n: torch.randn(p.shape, dtype=F64) for n, p in model.named_parameters()}
    norms, dots, _ = grad_dots_per_target(model, x, [y], v)
    one = grad_dots_per_target(model, x[:1], [y[:1]], v)
    torch.testing.assert_close(one[0], norms[:, :1], rtol=1e-13, atol=0)
    torch.testing.assert_close(one[1], dots[:, :1], rtol=1e-13, atol=0)
    empty = grad_dots_per_target(model, x[:0], [y[:0]], v)
    assert empty[0].shape == empty[1].shape == (1, 0)


# ---------------------------------------------------------------- align's two routes, side by side
def both_routes(monkeypatch, make_inputs) -> tuple[torch.Tensor, torch.Tensor]:
    got = []
    for route in ("ghost", "jvp"):
        monkeypatch.setattr(align_route, "ROUTE", route)
        got.append(STRATEGIES["align"].fn(make_inputs())["score"])
    return got[0], got[1]


@pytest.mark.parametrize("layers", [None, ["0"]])
def test_the_ghost_and_jvp_routes_agree_on_classification(monkeypatch, layers):
    model = mlp()
    g = torch.Generator().manual_seed(11)
    x, xt = torch.randn(8, 4, generator=g, dtype=F64), torch.randn(4, 4, generator=g, dtype=F64)
    y, yt = torch.tensor([0, 2, 1, 1, -1, 0, -1, 2]), torch.tensor([1, 0, 2, 2])
    names = selection_for(model, layers).names
    target = as_target(oracle_target(model, xt, yt, names), model, names)

    def inputs():
        return StrategyInputs(model=model, inputs=x, labels=y, logits=None, ids=[f"r{i}" for i in range(8)],
                              layers=layers, target=target)
    ghost, jvp = both_routes(monkeypatch, inputs)
    torch.testing.assert_close(ghost, jvp, rtol=1e-12, atol=1e-14)
    assert ghost[y >= 0].abs().max() <= 1


def test_engine_dots_on_a_tied_language_model():
    """GPT-2 (a tied input/output embedding, Conv1D's transposed weights, attention) in float64,
    its next-token loss, against the loop."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=30, n_embd=16, n_layer=2, n_head=2, n_positions=12)).double().eval()
    ids = torch.randint(0, 30, (3, 9))

    def lm_loss(logits, targets):  # [B, T, V], [B, T] -> [B]
        return F.cross_entropy(logits[:, :-1].transpose(1, 2), targets[:, 1:], reduction="none").mean(1)

    names = selection_for(model, None).names
    vectors = {n: torch.randn(p.shape, dtype=F64) for n, p in model.named_parameters()}
    norms, dots, _ = grad_dots_per_target(model, ids, [ids], vectors, loss_fn=lm_loss)
    params = list(model.parameters())
    flat_v = torch.cat([vectors[n].reshape(-1) for n, _ in model.named_parameters()])
    for i in range(3):
        loss = lm_loss(model(ids[i:i + 1]).logits, ids[i:i + 1]).sum()
        gi = torch.cat([gr.reshape(-1) for gr in torch.autograd.grad(loss, params)])
        assert abs(float(dots[0, i] - gi @ flat_v)) <= 1e-12 * float(gi.norm() * flat_v.norm())
        assert abs(float(norms[0, i] - gi.norm())) <= 1e-12 * float(gi.norm())
    assert len(names) == len(params)


@pytest.mark.parametrize("rows", [0, 3])
def test_the_convolutions_own_dot_against_formed_gradients(rows):
    """conv.conv_dot, <g_i, conv(x_i; V)>, against example i's weight and bias gradients formed
    by autograd, for a call whose examples hold k rows each ([B*k, C, ...], a mask head's)."""
    from alcli.gradnorm.rules.conv import conv_dot
    from alcli.gradnorm.rules.registry import RuleCall
    torch.manual_seed(0)
    conv = nn.Conv2d(4, 6, 3, stride=2, padding=1, groups=2).double()
    batch, k = 2, max(rows, 1)
    x = torch.randn(batch * k, 4, 7, 7, dtype=F64)
    g = torch.randn(batch, k, 6, 4, 4, dtype=F64)
    v = {"weight": torch.randn(conv.weight.shape, dtype=F64), "bias": torch.randn(6, dtype=F64)}
    call = RuleCall((x,), {}, g if rows else g[:, 0], {}, None)
    got = conv_dot(conv, call, v)
    for i in range(batch):
        out = conv(x[i * k:(i + 1) * k])
        gw, gb = torch.autograd.grad((out * g[i]).sum(), [conv.weight, conv.bias])
        assert abs(float(got["weight"][i] - (gw * v["weight"]).sum())) < 1e-12
        assert abs(float(got["bias"][i] - gb @ v["bias"])) < 1e-12
