"""Exact per-example gradient norms for a batch (see docs/engine.md; the contract is in its first
section). Code outside the engine imports only what this module exports."""
from .api import (
                  METHODS,
                  EngineFallback,
                  auto_choice,
                  cross_entropy,
                  explain,
                  grad_dots_per_target,
                  grad_norms_per_target,
                  model_dtype,
                  per_example_grad_norms,
)
from .errors import UnsupportedModel
from .model_io import batch_slice, call_model, logits_of, map_batch
from .params import select_params
from .plan import rule_names

__all__ = ["METHODS", "EngineFallback", "UnsupportedModel", "auto_choice", "batch_slice", "call_model",
           "cross_entropy", "explain", "grad_dots_per_target",
           "grad_norms_per_target", "logits_of", "map_batch", "model_dtype",
           "per_example_grad_norms", "rule_names", "select_params"]
