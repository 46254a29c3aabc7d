"""Placeholder until implemented."""
from .errors import UnsupportedModel


def vmap_norms(model, inputs, target_sets, selection, loss_fn):
    raise UnsupportedModel("method 'vmap' is not implemented yet")
