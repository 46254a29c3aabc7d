"""The engine borrows a model and gives it back exactly; autograd does no work it was not asked for."""
from __future__ import annotations

import pytest
import torch
from torch import nn

import warnings
import weakref

from alcli.gradnorm import EngineFallback, UnsupportedModel, auto_choice, per_example_grad_norms

from gradnorm_zoo import one_thread  # noqa: F401  (autouse fixture)
from gradnorm_zoo import AUTO_CHOICE, CASES, DECLINES, as_dtype, build, oracle_norms

METHODS = ["loop", "auto", "ghost", "vmap", "replicate"]


def snapshot(model: nn.Module):
    return {
        "modules": [(n, m, type(m), m.training, len(m._forward_hooks), len(m._forward_pre_hooks),
                     len(m._backward_hooks), len(getattr(m, "_backward_pre_hooks", {})),
                     m.__dict__.get("forward"))
                    for n, m in model.named_modules(remove_duplicate=False)],
        "params": [(n, p, p.detach().clone(), p.requires_grad, p.grad,
                    None if p.grad is None else p.grad.clone(), p.dtype,
                    len(p._backward_hooks or {}))
                   for n, p in model.named_parameters(remove_duplicate=False)],
        "buffers": [(n, b, b.clone()) for n, b in model.named_buffers(remove_duplicate=False)],
        "state_keys": list(model.state_dict().keys()),
    }


def assert_unchanged(before, after):
    assert [m[:2] for m in before["modules"]] == [m[:2] for m in after["modules"]], "modules replaced"
    for b, a in zip(before["modules"], after["modules"]):
        assert a[2] is b[2], f"module {b[0]!r} changed type"
        assert a[3] == b[3], f"module {b[0]!r}: training flag {b[3]} -> {a[3]}"
        assert a[4:8] == b[4:8], f"module {b[0]!r}: hooks left behind {b[4:8]} -> {a[4:8]}"
        assert a[8] is b[8], f"module {b[0]!r}: its forward replaced"
    assert len(before["params"]) == len(after["params"])
    for b, a in zip(before["params"], after["params"]):
        name = b[0]
        assert a[0] == name and a[1] is b[1], f"parameter {name!r} replaced"
        assert torch.equal(a[2], b[2]), f"parameter {name!r} values changed"
        assert a[3] == b[3], f"parameter {name!r}: requires_grad {b[3]} -> {a[3]}"
        if b[4] is None:
            assert a[4] is None, f"parameter {name!r}: .grad was None, now filled"
        else:
            assert a[4] is b[4], f"parameter {name!r}: .grad tensor replaced"
            assert torch.equal(a[4], b[5]), f"parameter {name!r}: .grad values changed"
        assert a[6] == b[6], f"parameter {name!r}: dtype changed"
        assert a[7] == b[7], f"parameter {name!r}: tensor hooks left behind"
    assert [(n, x) for n, x, _ in before["buffers"]] == [(n, x) for n, x, _ in after["buffers"]]
    for (name, _, b), (_, x, _) in zip(before["buffers"], after["buffers"]):
        assert torch.equal(x, b), f"buffer {name!r} changed"
    assert before["state_keys"] == after["state_keys"]


def _borrowable_model():
    """bn_res_cnn left in train mode (one submodule in eval), a frozen parameter, .grad partly filled."""
    model, inputs, targets = build("bn_res_cnn")
    model = model.double()
    model.train()
    model.bn2.eval()  # mixed flags must come back mixed
    model.conv2.weight.requires_grad_(False)  # frozen
    gen = torch.Generator().manual_seed(3)
    model.conv1.weight.grad = torch.randn(model.conv1.weight.shape, generator=gen, dtype=torch.float64)
    model.fc.bias.grad = torch.randn(model.fc.bias.shape, generator=gen, dtype=torch.float64)
    return model, inputs.double(), targets


def _call_then_check(method, model, before, *args, zoo="bn_res_cnn", **kw):
    """Call the engine; the model must come back unchanged even when the call raises. A method
    may decline only the zoo cases gradnorm_zoo.DECLINES says it declines."""
    try:
        norms = per_example_grad_norms(model, *args, method=method, **kw)
    except UnsupportedModel:
        assert_unchanged(before, snapshot(model))
        if method not in DECLINES.get(zoo, ()):
            raise
        return None
    except Exception:
        assert_unchanged(before, snapshot(model))
        raise
    assert_unchanged(before, snapshot(model))
    return norms


@pytest.mark.parametrize("params", [None, ["conv1", "bn3"], ["fc"]], ids=["all", "conv1+bn3", "fc"])
@pytest.mark.parametrize("method", METHODS)
def test_no_side_effects(method, params):
    model, x, targets = _borrowable_model()
    select = (lambda n: n != "conv2.weight") if params is None else \
        (lambda n: n.split(".")[0] in params)
    expected = oracle_norms(model, x, targets, select)  # deep copy, eval mode
    norms = _call_then_check(method, model, snapshot(model), x, targets, params=params)
    if norms is not None:  # computed in eval mode although the model was left in train mode
        torch.testing.assert_close(norms.double(), expected, rtol=1e-6, atol=1e-12)


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("name", ["tied", "bare_param", "transformer", "lstm", "mha_seq_first",
                                  "weight_norm"])
def test_no_side_effects_more_models(name, method):
    model, inputs, targets = build(name)
    model = model.double().train()
    first = next(model.parameters())
    first.grad = torch.ones_like(first)
    _call_then_check(method, model, snapshot(model), as_dtype(inputs, torch.float64), targets, zoo=name)


@pytest.mark.parametrize("method", METHODS)
def test_unselected_params_get_no_autograd_work(method):
    """The seed's case, params=["conv2"]: no .grad is filled and no hook on conv1/fc fires."""
    model, inputs, targets = build("simple")
    fired = []
    handles = [model.conv1.weight.register_hook(lambda g: fired.append("conv1.weight")),
               model.fc.weight.register_hook(lambda g: fired.append("fc.weight"))]
    conv1_out_needs_grad = []

    def watch_conv1(module, inp, out):
        conv1_out_needs_grad.append(bool(getattr(out, "requires_grad", False)))
        if out.requires_grad:
            out.register_hook(lambda g: fired.append("conv1 output"))

    handles.append(model.conv1.register_forward_hook(watch_conv1))
    try:
        norms = per_example_grad_norms(model, inputs, targets, params=["conv2"], method=method)
    except UnsupportedModel:
        if method not in DECLINES.get("simple", ()):
            raise
        norms = None
    finally:
        for h in handles:
            h.remove()
    assert fired == [], f"{method}: autograd reached {sorted(set(fired))}"
    for name, p in model.named_parameters():
        assert p.grad is None, f"{method}: {name}.grad was filled"
    if method in ("ghost", "auto"):  # the backward stops at conv2's output
        assert not any(conv1_out_needs_grad), f"{method}: conv1's output was made to require grad"
    if norms is not None:
        expected = oracle_norms(model, inputs, targets, lambda n: n.startswith("conv2."))
        torch.testing.assert_close(norms.double(), expected, rtol=1e-3, atol=1e-9)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_auto_says_which_and_why(case):
    """auto's choice per zoo case is pinned (gradnorm_zoo.AUTO_CHOICE, else ghost); settling on
    anything but ghost warns once, with the reason."""
    model, inputs, targets = build(case.model)
    params = list(case.params) if case.params else None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        per_example_grad_norms(model, inputs, targets, method="auto", params=params)
        per_example_grad_norms(model, inputs, targets, method="auto", params=params)
    choice = auto_choice(model, params)
    assert choice is not None
    method, reason = choice
    assert method == AUTO_CHOICE.get(case.model, "ghost"), reason
    assert isinstance(reason, str) and reason
    fallbacks = [w for w in caught if issubclass(w.category, EngineFallback)]
    if method == "ghost":
        assert not fallbacks
    else:
        assert len(fallbacks) == 1 and f"'{method}'" in str(fallbacks[0].message)
        assert "ghost: " in str(fallbacks[0].message)  # why ghost declined


class FailsWhenBatched(torch.nn.Module):
    """A forward with a bug that shows only for batches of more than one example."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 3)

    def forward(self, x):
        if x.shape[0] > 1:
            raise ValueError("a bug in a batched code path")
        return self.fc(x)


def test_auto_lets_errors_it_did_not_foresee_through():
    """auto moves on only for UnsupportedModel: an error no method foresaw is not hidden behind
    a slower method that happens to work (here loop, one example at a time)."""
    model = FailsWhenBatched()
    with pytest.raises(ValueError, match="batched code path"):
        per_example_grad_norms(model, torch.randn(3, 4), torch.tensor([0, 1, 2]), method="auto")


class ZeroGradInForward(nn.Module):
    """A forward that clears the gradients (a training step folded into the model): the engine
    must give back the .grad tensors the caller had."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(6, 4)

    def forward(self, x):
        self.zero_grad(set_to_none=True)
        return self.fc(x)


@pytest.mark.parametrize("method", METHODS)
def test_grad_fields_come_back_when_the_forward_clears_them(method):
    model = ZeroGradInForward().double()
    model.fc.weight.grad = torch.ones_like(model.fc.weight)
    x = torch.randn(5, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    _call_then_check(method, model, snapshot(model), x, torch.tensor([0, 1, 2, 3, 0]), zoo="")


@pytest.mark.parametrize("method", METHODS)
def test_a_layer_frozen_or_replaced_between_calls_is_seen(method):
    """What the engine builds once per model (the selection, plans, layouts) must follow the
    model: a parameter frozen after a call leaves the norms, a replaced layer or parameter enters."""
    model, x, targets = build("simple")
    model, x = model.double(), x.double()
    per_example_grad_norms(model, x, targets, method=method)
    model.conv1.weight.requires_grad_(False)
    torch.testing.assert_close(per_example_grad_norms(model, x, targets, method=method),
                               oracle_norms(model, x, targets), rtol=1e-6, atol=1e-12)
    model.fc = nn.Linear(model.fc.in_features, model.fc.out_features, bias=False).double()
    torch.testing.assert_close(per_example_grad_norms(model, x, targets, method=method),
                               oracle_norms(model, x, targets), rtol=1e-6, atol=1e-12)
    model.conv2.weight = nn.Parameter(2 * model.conv2.weight.detach())  # same module, new tensor
    torch.testing.assert_close(per_example_grad_norms(model, x, targets, method=method),
                               oracle_norms(model, x, targets), rtol=1e-6, atol=1e-12)


@pytest.mark.parametrize("method", METHODS)
def test_nothing_of_a_call_outlives_it_without_the_garbage_collector(method):
    """What a call captures (each hooked module's inputs, its taps, the backward passes) is freed
    by reference counting when the call returns: a reference cycle would hold a large model's
    activations until Python's cyclic collector happens to run."""
    import gc

    from alcli.gradnorm import ghost, grad_norms_per_target
    model, x, targets = build("simple")
    per_example_grad_norms(model, x, targets, method=method)  # the first call's probes and caches
    alive, created = weakref.WeakSet(), []

    def init(self, *args):
        original.__init__(self, *args)
        alive.add(self)
        created.append(1)

    original, ghost._Call = ghost._Call, type("_Call", (ghost._Call,), {"__init__": init})
    gc.collect()
    gc.disable()
    try:
        per_example_grad_norms(model, x, targets, method=method)
        grad_norms_per_target(model, x, [targets, (targets + 1) % 10], method=method)
        assert len(alive) == 0, f"{len(alive)} of {len(created)} module calls outlive the engine call"
    finally:
        gc.enable()
        ghost._Call = original
    assert created or method in ("loop", "vmap", "replicate")  # the ghost pass ran and was watched
