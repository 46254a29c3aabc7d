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


CPU_INDEX = "https://download.pytorch.org/whl/cpu"


def torchvision_mismatch(err: BaseException) -> str | None:
    """The one sentence for an error that says the installed torchvision was built for another
    torch (its compiled ops fail to load: `operator torchvision::nms does not exist`, an undefined
    symbol in torchvision/_C, "compiled with different CUDA major versions"); None for any other
    error. Recognised by its message naming a torchvision operator, or by being raised while
    torchvision itself was being imported."""
    if not isinstance(err, (RuntimeError, ImportError, OSError, AttributeError, TypeError)):
        return None
    if "torchvision::" not in str(err) and not _in_torchvision_import(err):
        return None
    return (f"the installed torchvision {_version('torchvision')} does not match the installed "
            f"torch {_version('torch')} ({first_line(err)}); reinstall both from one index, e.g. "
            f"pip install --force-reinstall torch torchvision --index-url {CPU_INDEX} (CPU "
            f"wheels), or both from PyPI: pip install --force-reinstall torch torchvision")


def _in_torchvision_import(err: BaseException) -> bool:
    """Was `err` raised while torchvision's own package code ran (its import: __init__, _meta_
    registrations, extension loading)?"""
    import os
    tb = err.__traceback__
    while tb is not None:
        parts = os.path.normcase(tb.tb_frame.f_code.co_filename).replace("\\", "/").split("/")
        if "torchvision" in parts[:-1] and tb.tb_frame.f_code.co_name == "<module>":
            return True
        tb = tb.tb_next
    return False


def _version(dist: str) -> str:
    """The installed version, without importing the package (torch's own, with its build tag such
    as +cpu, where it is imported already)."""
    import sys
    from importlib.metadata import PackageNotFoundError, version
    loaded = getattr(sys.modules.get(dist), "__version__", None)
    if isinstance(loaded, str):
        return loaded
    try:
        return version(dist)
    except PackageNotFoundError:
        return "(version unknown)"
