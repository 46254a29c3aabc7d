"""Regression: D numbers per example. outputs [B, D] ([B]: D = 1), targets [B, D] float, squared
error summed over the D outputs. Labels as given: `2.5`, `[2.5, -1]`, `"2.5|-1"`. No distribution,
so no cheap utilities; egl is exact (below); gradnorm and loss need a target value for every
example. Its rows show the outputs (joined by |) and no confidence.
"""
from __future__ import annotations

import json
import math
from xml.sax.saxutils import quoteattr

import torch

from ..errors import PoolError, RunError
from .common import (Task, all_positions, exact_dtype, grad_norms, hf_problem, position_loss,
                     refuse_single_labels, utility)
from .shared.labels import label_items, label_text, reader
from .shared.labelstudio import plain_value


def regression_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """outputs [B, D] (or [B]), targets the same -> squared error summed over outputs [B]."""
    b = logits.shape[0]
    return (logits.reshape(b, -1) - targets.reshape(b, -1).to(logits.dtype)).square().sum(1)


def output_component(logits: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
    """Output d_i of example i -> [B]: its gradient is row d of the outputs' Jacobian (regression egl)."""
    return logits.reshape(logits.shape[0], -1).gather(1, d.unsqueeze(1)).squeeze(1)


def targets(s) -> torch.Tensor:
    """The given target values; every example needs one (the prediction as its own target has zero
    gradient)."""
    given, known = s.given_targets() or (None, None)
    if known is None or not bool(known.all()):
        missing = s.ids[0] if known is None else s.ids[int((~known).nonzero()[0])]
        raise RunError(f"example {missing} has no target value; a regression task's "
                       f"gradnorm and loss need one for every example (the pool's "
                       f"label column)")
    return given


def egl(s) -> dict:
    """Regression, y ~ N(f(x), σ² I), loss ||f - y||²: its gradient is 2 Jᵀ(f - y), so
    E ||grad||² = 4 σ² ||J||²_F exactly, J [D, P] the outputs' Jacobian. The score is its root
    2 σ ||J||_F with σ = 1 (σ scales every score alike): D target sets, output d's gradient each,
    through one backward; no sampling."""
    def outputs(s) -> list[torch.Tensor]:
        b = s.logits.shape[0]
        d = s.logits.reshape(b, -1).shape[1]
        return [torch.full((b,), j, dtype=torch.long, device=s.logits.device) for j in range(d)]

    norms = grad_norms(s, outputs, loss_fn=s.spec.egl_loss)  # [D, B]
    return {"score": 2.0 * norms.square().sum(0).sqrt()}


def uncertainty(s, name: str) -> dict:
    return {"score": utility(TASK, name, s.logits, s.valid, s.aggregate)}  # a RunError: no distribution


def columns(s, score: torch.Tensor):
    """The outputs [B, D] (as the extra), and the loss only where every example has a target."""
    nothing = torch.zeros_like(score)
    known = s.given_targets()[1] if s.given is not None else None
    loss = position_loss(s) if known is not None and bool(known.all()) else None
    return nothing, nothing, loss, [s.logits.reshape(s.logits.shape[0], -1)]


def pred_values(preds, extras, names) -> list:
    """The output, or the outputs joined by |."""
    rows = extras[0].tolist()
    return [r[0] if len(r) == 1 else "|".join(f"{v:.6g}" for v in r) for r in rows]


def review_units(s) -> list[str]:
    """Each output d of an example with targets, one unit: [d, its target, [its output], d] (JSON)."""
    given, known = s.given_targets()
    outputs = s.logits.reshape(s.logits.shape[0], -1).to(exact_dtype(s.logits)).tolist()
    return [json.dumps([[d, y, [f], d] for d, (y, f) in enumerate(zip(ys, fs))] if k else [])
            for ys, fs, k in zip(given.tolist(), outputs, known.tolist())]


FLAG_TAIL = math.erfc(3 / math.sqrt(2))  # 0.0027: a residual beyond 3 spreads


def review_own(rows: list[list], names) -> list[dict]:
    """Residuals r = target - output, per output d scaled by the model's own spread on the pool,
    the robust s_d = 1.4826 median_i |r_id| (the standard deviation for normal residuals about 0):
    z = max_d |r_d| / s_d per row. self_confidence (and margin) = the normal two-sided tail
    erfc(z / sqrt 2), 1 at z = 0; flagged beyond 3 spreads (tail < 0.0027); pred the output."""
    r = torch.tensor([[u[1] - u[2][0] for u in units] for units in rows], dtype=torch.float64)
    spread = 1.4826 * torch.quantile(r.abs(), 0.5, dim=0)           # [D]
    spread = torch.where(spread > 0, spread, r.abs().mean(0)).clamp_min(1e-300)
    z = (r.abs() / spread).max(1).values.tolist()                   # [N]
    out = []
    for units, zi in zip(rows, z):
        tail = math.erfc(zi / math.sqrt(2))
        outputs = [u[2][0] for u in units]
        out.append({"flagged": tail < FLAG_TAIL,
                    "pred": outputs[0] if len(outputs) == 1 else "|".join(f"{v:.6g}" for v in outputs),
                    "confidence": None, "self_confidence": tail, "margin": tail, "residual_z": zi})
    return out


def _values(value, where: str, outputs: int) -> torch.Tensor:
    items = label_items(value)
    try:
        if any(isinstance(v, bool) for v in items):
            raise ValueError
        numbers = [float(v) for v in items]
    except (TypeError, ValueError):
        raise PoolError(f"{where}: label {label_text(value)} is not a number or a list of numbers "
                        f"(a regression target)") from None
    if len(numbers) != outputs or not all(math.isfinite(v) for v in numbers):
        raise PoolError(f"{where}: label {label_text(value)} has {len(numbers)} finite values, but the "
                        f"model has {outputs} outputs" if len(numbers) != outputs else
                        f"{where}: label {label_text(value)} is not finite")
    return torch.tensor(numbers, dtype=torch.float64)


def _read(value, where, i, logits, pool, words) -> torch.Tensor:
    return _values(value, where, logits.reshape(logits.shape[0], -1).shape[1])


def badge(logits: torch.Tensor, h: torch.Tensor, valid) -> tuple[torch.Tensor, torch.Tensor]:
    """The prediction as target has zero gradient: a = 1, so the distances are those of the
    features h."""
    b = h.detach()
    return torch.ones(b.shape[0], 1, dtype=b.dtype, device=b.device), b


def prelabels(row, n, tag, names, ref) -> list[dict]:
    """With one output: the predicted value in a `<Number>` tag (several: none)."""
    value = plain_value(row.get("pred"))  # a table read back holds it as text ("-1.5")
    try:
        number = float(value) if not isinstance(value, bool) else math.nan
    except (TypeError, ValueError):  # several outputs ("0.5|2"), or none
        return []
    return [tag.region(f"alcli-{n}", "number", {"number": number})] if math.isfinite(number) else []


def control(names, from_name: str, to_name: str) -> str:
    return f"  <Number name={quoteattr(from_name)} toName={quoteattr(to_name)}/>"


def _named_regression(model) -> bool:
    """config.problem_type regression, or a one-label sequence classifier (as HF treats it)."""
    problem = hf_problem(model)
    return problem == "regression" or (
        problem is None and type(model).__name__.endswith("ForSequenceClassification")
        and getattr(getattr(model, "config", None), "num_labels", 0) == 1)


TASK = Task(
    name="regression", shape="[batch, outputs] or [batch]", fits=lambda z: z.dim() in (1, 2),
    names_model=_named_regression,
    loss=regression_loss, egl_loss=output_component, valid=all_positions(lambda z: 1), classes=lambda z: None,
    targets=targets, needs_targets=True, egl=egl, uncertainty=uncertainty, table_loss=position_loss,
    columns=columns, pred_values=pred_values, has_confidence=False,
    read_labels=reader(lambda z: torch.zeros(z.shape[0], z.reshape(z.shape[0], -1).shape[1],
                                             dtype=torch.float64), _read),
    check_labels=refuse_single_labels("regression"),
    badge=badge,
    probe=lambda z, inputs: (output_component, torch.zeros(z.shape[0], dtype=torch.long)),  # the loss egl differentiates: each output itself
    prelabels=prelabels, control=control, review_units=review_units, review_own=review_own,
    from_annotation=lambda regions, names: {"label": next(
        (r["value"]["number"] for r in regions if "number" in r.get("value", {})), None)},
    default_strategy="egl",  # the rule in docs/benchmarks.md: structured-curves-defaults.json
)
