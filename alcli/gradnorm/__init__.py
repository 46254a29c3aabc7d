"""Exact per-example gradient norms for a batch (see DESIGN.md, "The engine contract")."""
from .api import METHODS, auto_choice, cross_entropy, explain, grad_norms_per_target, model_dtype, per_example_grad_norms
from .errors import UnsupportedModel

__all__ = ["METHODS", "UnsupportedModel", "auto_choice", "cross_entropy", "explain", "grad_norms_per_target", "model_dtype",
           "per_example_grad_norms"]
