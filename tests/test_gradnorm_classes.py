"""EGL's K target sets through ONE backward (ghost vmaps the backward over K output cotangents):
every zoo case ghost serves, K = 4 target sets, against the float64 per-example loop run once per
target set, in float64 (1e-6) and float32 (1e-3)."""
from __future__ import annotations

import pytest
import torch

from alcli.gradnorm import grad_norms_per_target
from alcli.gradnorm.ghost import _k_mode

from gradnorm_zoo import one_thread  # noqa: F401  (autouse fixture)
from gradnorm_zoo import CASE_BY_ID, CASES, DECLINES, as_dtype, build, oracle_norms

# (case, dtype) whose backward torch.func cannot vmap over the K cotangents: one backward per
# target set. None since nn.LSTM has a rule of its own (rules/rnn.py); that fallback is pinned
# in test_gradnorm_rnn.py, on an LSTM subclass the generic rule serves.
PER_TARGET: frozenset = frozenset()
SERVED = [c.id for c in CASES if "ghost" not in DECLINES.get(c.model, ())]
_ORACLE: dict = {}


def target_sets(model, inputs, targets):
    with torch.no_grad():
        classes = model(inputs).shape[1]
    return [targets, (targets + 1) % classes, torch.zeros_like(targets), torch.full_like(targets, classes - 1)]


def oracle(case_id):
    if case_id not in _ORACLE:
        case = CASE_BY_ID[case_id]
        model, inputs, targets = build(case.model)
        _ORACLE[case_id] = torch.stack([oracle_norms(model, inputs, t, case.select)
                                        for t in target_sets(model, inputs, targets)])
    return _ORACLE[case_id]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["f64", "f32"])
@pytest.mark.parametrize("case_id", SERVED)
def test_classes_in_one_backward(case_id, dtype):
    case = CASE_BY_ID[case_id]
    model, inputs, targets = build(case.model)
    model, inputs = model.to(dtype), as_dtype(inputs, dtype)
    sets = target_sets(model, inputs, targets)
    norms, _ = grad_norms_per_target(model, inputs, sets, method="ghost",
                                     params=list(case.params) if case.params else None)
    expected = oracle(case_id)
    rtol = 1e-6 if dtype == torch.float64 else 1e-3
    torch.testing.assert_close(norms.double(), expected, rtol=rtol, atol=rtol * 1e-3 * float(expected.abs().max()))
    assert _k_mode[model] == ("per target" if (case_id, dtype) in PER_TARGET else "batched"), \
        f"{case_id}: the K target sets went through {_k_mode[model]!r}"


@pytest.mark.parametrize("per_backward", [1, 3])
@pytest.mark.parametrize("case_id", ["simple", "resnet18", "mha_seq_first"])
def test_large_target_sets_go_through_in_chunks(case_id, per_backward, monkeypatch):
    """Off CUDA, one vmapped backward takes at most VMAP_ELEMENTS / (the largest tapped output's
    elements) of the K = 4 target sets: in chunks of 3 (3 + 1) or one per backward, the loop's
    numbers, in ceil(K / chunk) backwards."""
    from alcli.gradnorm import ghost
    case = CASE_BY_ID[case_id]
    model, inputs, targets = build(case.model)
    model, inputs = model.double(), as_dtype(inputs, torch.float64)
    sets = target_sets(model, inputs, targets)
    largest, backwards = [], []
    real_chunk, real_backward = ghost._vmap_chunk, ghost._backward

    def chunk(k, elements, device):  # elements: the largest tapped output's
        largest.append(elements)
        return real_chunk(k, elements, device)

    monkeypatch.setattr(ghost, "_vmap_chunk", chunk)
    monkeypatch.setattr(ghost, "_backward", lambda *a, **kw: backwards.append(1) or real_backward(*a, **kw))
    grad_norms_per_target(model, inputs, sets, method="ghost")
    assert len(backwards) == 1  # all four in one vmapped backward
    backwards.clear()
    monkeypatch.setattr(ghost, "VMAP_ELEMENTS", per_backward * largest[-1])  # the taps' (the first call's first: the probe's)
    norms, _ = grad_norms_per_target(model, inputs, sets, method="ghost")
    assert len(backwards) == -(-len(sets) // per_backward)
    expected = oracle(case_id)
    torch.testing.assert_close(norms, expected, rtol=1e-6, atol=1e-9 * float(expected.abs().max()))


def test_egl_dispatches_at_most_1_5x_gradnorm():
    """Exact EGL over 10 classes launches at most 1.5x the kernels gradnorm does (issue 9's target,
    issue 53's regression): aten ops per batch counted as a GPU would launch them, views free."""
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    from gradnorm import ops_table
    for row in ops_table():
        assert row["egl_x_gradnorm"] <= 1.5, row
