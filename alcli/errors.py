"""Errors for bad input or a failed run: the CLI prints the message as one sentence and exits 1.
Messages and quoted library errors come without a URL's credentials (files/redact.py)."""
from .files.redact import redacted


class AlcliError(Exception):
    """Base of every error whose message is meant for the user as it stands (no traceback)."""

    def __str__(self) -> str:
        return redacted(super().__str__())


class ConfigError(AlcliError):
    """A config key or command-line option has a bad value."""


class CheckpointError(AlcliError):
    """The model file cannot be loaded or does not fit the architecture."""


class PoolError(AlcliError):
    """The pool cannot be read: missing file, bad manifest row, unreadable image, ..."""


class TableError(AlcliError):
    """A ranked table cannot be read or written."""


class RunError(AlcliError):
    """The model cannot be run on the pool (wrong input shape, labels out of range, ...)."""


def first_line(err: BaseException) -> str:
    """The first line of an exception's message (its OS reason where it has one), for quoting
    inside one sentence; the exception's type name when the message is empty."""
    text = redacted(getattr(err, "strerror", None) or str(err)).strip().splitlines()
    return text[0][:200] if text else type(err).__name__
