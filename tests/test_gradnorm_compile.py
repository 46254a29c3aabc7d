"""`compile=True` (`--compile`): the ghost method's rules and their sum as one torch.compile'd
graph (inductor, on this CPU), checked against the float64 loop like every method. Each case
compiles for seconds, so the cases are one per rule family, in float32."""
from __future__ import annotations

import warnings

import pytest
import torch
import torch._dynamo.utils

from alcli.gradnorm import UnsupportedModel, grad_norms_per_target, per_example_grad_norms

from gradnorm_zoo import one_thread  # noqa: F401  (autouse fixture)
from gradnorm_zoo import CASE_BY_ID, build, oracle_norms
from standin import DeviceWatch, standin, to_standin
from test_gradnorm import assert_matches, names_a_module

# conv, a Linear called twice (per-example gradients summed before the norm), Linear over tokens with
# LayerNorm, Embedding and MultiheadAttention, BatchNorm with a residual, a tied weight, the
# LSTM (whose rule torch.compile leaves out of the graph)
CASES = ["simple", "linear_twice", "transformer", "bn_res_cnn", "tied", "lstm"]
TOL = 1e-4  # float32


def graphs() -> int:
    return torch._dynamo.utils.counters["stats"]["unique_graphs"]


def params_of(case_id):
    case = CASE_BY_ID[case_id]
    return list(case.params) if case.params else None


@pytest.mark.parametrize("case_id", CASES)
def test_compiled_norms_match_the_loop(case_id):
    case = CASE_BY_ID[case_id]
    model, inputs, targets = build(case.model)
    expected = oracle_norms(model, inputs, targets, case.select)
    torch._dynamo.reset()  # no graph from an earlier test: this call must compile one
    before = graphs()
    norms = per_example_grad_norms(model, inputs, targets, method="ghost", compile=True,
                                   params=params_of(case_id))
    assert graphs() > before, "compile=True compiled nothing"
    assert_matches(norms, expected, TOL, f"{case_id} / compiled")
    before = graphs()
    again = per_example_grad_norms(model, inputs, targets, method="ghost", compile=True,
                                   params=params_of(case_id))
    assert graphs() == before, "a steady call compiled another graph"
    assert_matches(again, expected, TOL, f"{case_id} / compiled, second call")


@pytest.mark.parametrize("case_id", ["simple", "lstm"])
def test_compiled_target_sets_match_the_loop(case_id):
    """K target sets: their gradients come back batched from one backward and the rules run
    vmapped over K inside the graph (the LSTM's backward cannot be batched: one per set)."""
    case = CASE_BY_ID[case_id]
    model, inputs, targets = build(case.model)
    sets = [targets, (targets + 1) % 4, torch.zeros_like(targets)]
    expected = torch.stack([oracle_norms(model, inputs, t, case.select) for t in sets])
    norms, logits = grad_norms_per_target(model, inputs, sets, method="ghost", compile=True)
    assert norms.shape == (3, inputs.shape[0]) and not logits.requires_grad
    for k in range(3):
        assert_matches(norms[k], expected[k], TOL, f"{case_id} / compiled / target set {k}")


def test_compiled_target_sets_in_chunks_and_one_at_a_time(monkeypatch):
    """Off CUDA a backward takes as many of the K as keep K x the largest tap small
    (ghost.VMAP_ELEMENTS): here two, then one."""
    from alcli.gradnorm import ghost
    model, inputs, targets = build("simple")
    sets = [targets, (targets + 1) % 4, torch.zeros_like(targets)]
    expected = torch.stack([oracle_norms(model, inputs, t) for t in sets])
    with torch.no_grad():
        largest = max(m(inputs).numel() for m in (model.conv1,))  # conv1's output: the largest tap
    for per_backward in (2, 1):
        monkeypatch.setattr(ghost, "VMAP_ELEMENTS", per_backward * largest)
        norms, _ = grad_norms_per_target(model, inputs, sets, method="ghost", compile=True)
        for k in range(3):
            assert_matches(norms[k], expected[k], TOL, f"{per_backward} per backward / target set {k}")


def test_a_rule_vmap_cannot_batch_falls_back_to_one_backward_per_target_set():
    """The generic rule on an nn.LSTM subclass (float64: no vmap rule for the fused kernel)."""
    from alcli.gradnorm.ghost import _k_mode
    from test_gradnorm_rnn import CLASSES, D_IN, HIDDEN, OwnForwardLSTM, case, check, oracle
    model, x, targets = case("lstm", layers=1, bidirectional=False)
    model.rnn = OwnForwardLSTM(D_IN, HIDDEN, num_layers=1, batch_first=True).double()
    sets = [targets, (targets + 1) % CLASSES]
    norms, _ = grad_norms_per_target(model, x, sets, method="ghost", compile=True)
    check(norms, torch.stack([oracle(model, x, t, lambda n: True) for t in sets]))
    assert _k_mode[model] == "per target"


def test_a_new_batch_size_and_a_new_model_are_compiled_anew():
    model, inputs, targets = build("mlp")
    per_example_grad_norms(model, inputs, targets, compile=True)
    for x, y in ((inputs[:3], targets[:3]), (inputs, targets)):
        assert_matches(per_example_grad_norms(model, x, y, compile=True),
                       oracle_norms(model, x, y), TOL, f"batch of {len(x)}")
    other, _, _ = build("mlp")  # another model of the same shapes: its own weights are used
    with torch.no_grad():
        for p in other.parameters():
            p.mul_(1.5)
    assert_matches(per_example_grad_norms(other, inputs, targets, compile=True),
                   oracle_norms(other, inputs, targets), TOL, "a second model")


def test_a_rule_declining_inside_the_graph_is_named_and_auto_moves_on():
    """attention_in_windows: the attention rule refuses the call while the graph is traced."""
    model, inputs, targets = build("attention_in_windows")
    with pytest.raises(UnsupportedModel) as err:
        per_example_grad_norms(model, inputs, targets, method="ghost", compile=True)
    assert names_a_module(str(err.value), model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        norms = per_example_grad_norms(model, inputs, targets, method="auto", compile=True)
    assert_matches(norms, oracle_norms(model, inputs, targets), TOL, "auto, after ghost declined")


def test_compiled_on_the_standin_device():
    """On the stand-in device, under its dispatch mode, torch.compile steps aside and the same
    path runs op by op: the batched gradients, the rules vmapped over K, their sum. None of it
    syncs with the host or mixes devices."""
    model, inputs, _ = build("simple")

    def top3(logits):
        return list(logits.argsort(1, descending=True).T)[:3]
    first, _ = grad_norms_per_target(model, inputs, top3, method="ghost", compile=True)
    to_standin(model)
    with DeviceWatch() as watch:
        norms, logits = grad_norms_per_target(model, standin(inputs), top3, method="ghost", compile=True)
    assert norms.device == logits.device == torch.device("meta") and norms.shape == first.shape
    assert watch.ops > 0


def test_score_with_compile_ranks_like_without(in_ws):
    """`alcli score --compile` on the workspace's TinyNet pool: the same table, scores within
    float32 rounding; the flag is recorded in the table's meta file like every setting."""
    from typer.testing import CliRunner

    from alcli.cli import app
    from conftest import parse_csv

    def table(*flags):
        result = CliRunner().invoke(app, ["score", "manifest.csv", "-m", "model.pt", "-c", "config.yaml",
                                          "-s", "egl", "-q", "-o", "-", *flags])
        assert result.exit_code == 0, result.stderr + result.stdout
        return {r["id"]: float(r["score"]) for r in parse_csv(result.stdout)}
    plain, compiled = table(), table("--compile")
    assert compiled.keys() == plain.keys() and len(plain) > 5
    for key, value in plain.items():
        assert compiled[key] == pytest.approx(value, rel=1e-4, abs=1e-7), key
