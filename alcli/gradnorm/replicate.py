"""Placeholder until implemented."""
from .errors import UnsupportedModel


def replicate_norms(model, inputs, target_sets, selection, loss_fn):
    raise UnsupportedModel("method 'replicate' is not implemented yet")
