"""Errors the engine raises."""


class UnsupportedModel(ValueError):
    """A method cannot serve this model; the message names the module and the reason."""
