"""`--strategy align --target TARGET`: each example's exact gradient alignment with a target set
(LESS's selection, exact, with no projection). ḡ is the mean loss gradient of TARGET's labeled
rows over the selected parameters (target.py, accumulated in float64, once per run). Two routes
give g_i·ḡ:

- ghost (labeled rows, `ROUTE`): the engine's one backward, the norm's own, also gives each
  layer's per-example gradient, dense or as its factors, and g_i·ḡ = Σ_layers <G_i, V> with
  V ḡ's slice (a linear layer's Σ_t g_itᵀ V a_it: outer.dot); no forward-mode pass.
- jvp (rows without a label; labeled rows where the ghost method cannot serve the model or
  another --method is asked for): one forward-mode pass of the model along ḡ gives every
  example's output tangent ż_i = J_i ḡ, and g_i·ḡ = ∂L_i/∂z_i · ż_i, the loss's derivative along
  it, for any label y at the cost of the loss alone. An unlabeled row needs g_i(y)·ḡ for every
  label y (or egl's S label sets): one forward-mode pass, where the ghost route would take a
  backward per label.

Per example:

  labeled:   cos(g_i, ḡ) = g_i·ḡ / (‖g_i‖ ‖ḡ‖)              ‖g_i‖: the engine's exact norm
  unlabeled: sqrt(E_y~p[(g_i(y)·ḡ)²]) / ‖ḡ‖                   how far a label on this example can
             move the target's loss, either way (E_y[g_i(y)] = 0 for cross-entropy, so the mean
             alignment says nothing); classification: every class, exactly; multilabel,
             segmentation, token classification: egl's S label sets, drawn as egl draws them.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch
from torch.func import functional_call, jvp
from torch.nn.attention import SDPBackend, sdpa_kernel

from ..errors import RunError
from ..gradnorm import grad_dots_per_target
from ..gradnorm.model_io import logits_of, model_args
from ..gradnorm.params import selection_for
from ..tasks.common import engine_targets

ROUTE = "ghost"  # labeled rows' g_i·ḡ: "ghost" (beside the norm, in its backward) or "jvp"; the
# benchmark (benchmarks/align.py) flips it to measure both


@dataclass
class TargetGradient:
    """ḡ over the selected parameters, by their names in model.named_parameters(): summed in
    float64, kept in each parameter's dtype (float32 at least); its norm from the float64 sum."""
    vectors: dict[str, torch.Tensor]
    norm: float
    rows: int      # the target rows it averages
    source: str    # the target pool, for messages


def ghost_dots(s) -> tuple[torch.Tensor, torch.Tensor]:
    """‖g_i‖ and g_i·ḡ [B] (float64) at each example's targets (`s.targets`), from the engine's
    ghost backward; its forward sets `s.logits`. UnsupportedModel where ghost cannot serve."""
    norms, dots, _ = grad_dots_per_target(s.model, s.inputs, engine_targets(s, lambda s: [s.targets]),
                                          s.target.vectors, params=s.layers, loss_fn=s.spec.loss)
    return norms[0].double(), dots[0].double()


def output_tangent(model, inputs, layers, target: TargetGradient) -> tuple[torch.Tensor, torch.Tensor]:
    """The logits z [B, ...] and their derivative along ḡ, ż = J ḡ [B, ...], in one forward-mode
    pass (parameters outside the selection held fixed)."""
    selection = selection_for(model, layers)
    primals = {n: p.detach() for n, p in zip(selection.names, selection.params)}
    tangents = {n: target.vectors[n].to(p.dtype) for n, p in primals.items()}
    args, kwargs = model_args(inputs)

    def logits(params):
        return logits_of(functional_call(model, params, args, kwargs))

    # forward-mode only, so no graph is kept; attention on its math kernel, the one with forward AD
    # (the fused flash and memory-efficient kernels have none)
    with torch.no_grad(), sdpa_kernel([SDPBackend.MATH]):
        z, zdot = _jvp(logits, primals, tangents)
    return z, zdot


def along(loss, z: torch.Tensor, zdot: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """g_i·ḡ for each example at `targets`: the derivative of its loss along ż -> [B] float64."""
    z64, zdot64 = z.double(), zdot.double()
    with torch.no_grad():
        _, d = _jvp(lambda logits: loss(logits, targets), z64, zdot64)
    return d


def _jvp(fn, primal, tangent):
    """torch.func.jvp of one argument; its first call's note that it scripts a decomposition with
    the deprecated torch.jit.script (torch's own code) is not the user's to act on."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*torch.jit.script.* is deprecated",
                                category=FutureWarning)
        return jvp(fn, (primal,), (tangent,))


def unlabeled_spread(s, z: torch.Tensor, zdot: torch.Tensor) -> torch.Tensor:
    """sqrt(E_y~p[(g(y)·ḡ)²]) per example -> [B] float64 (classification: over every class)."""
    spec = s.spec
    probs = spec.dists(z.double())                                        # [B, N, K]
    if probs.shape[1] == 1:  # one categorical label per example (classification): every one of the K
        labels = torch.arange(probs.shape[2], device=z.device).view(-1, 1, 1).expand(-1, z.shape[0], 1)
        sets = spec.label_targets(labels, s.valid, z).unbind(0)            # K x targets
        dots = torch.stack([along(spec.loss, z, zdot, t) for t in sets], dim=1)  # [B, K]
        return (probs[:, 0] * dots ** 2).sum(1).sqrt()
    if spec.egl.__name__ != "egl_sampled" or s.egl_samples == "pseudo":
        raise RunError(f"--strategy align on {spec.name} rows without a label is not defined "
                       f"here; give the rows their labels (the cosine at the given label)")
    from ..tasks.common import sampled
    sets = sampled(spec, z, s.valid, s.ids, s.egl_samples, s.seed)       # S x [B, ...]
    squares = torch.stack([along(spec.loss, z, zdot, t) ** 2 for t in sets])  # [S, B]
    return squares.mean(0).sqrt()
