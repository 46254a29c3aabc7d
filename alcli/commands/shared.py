"""What every command does around its call into alcli.api: settings from defaults, config and
flags; a Reporter for stderr; warnings, skipped rows; torchrun's rank; an empty stdin."""
from __future__ import annotations

import os
import sys
import warnings

from ..files.config import DEFAULT_CONFIG, Settings, load_settings
from ..terminal import Reporter, warning_origin


def given_flags(flags: dict) -> dict:
    """The flags given: a switch left off is "not given", except for those whose default is
    decided later."""
    return {k: (None if (v is False and k not in ("diverse", "embeddings", "grayscale", "dedup"))
                or v == [] else v)
            for k, v in flags.items()}


def settings_from(config: str | None, flags: dict) -> Settings:
    """Defaults < config (./configs/default.yaml when no --config and no --model) < flags."""
    given = given_flags(flags)
    if config is None and given.get("model") is None and DEFAULT_CONFIG.is_file():
        config = str(DEFAULT_CONFIG)
    settings = load_settings(config, given)
    return settings


def reporter(settings: Settings, enabled: bool = True) -> Reporter:
    r = Reporter(settings.log_format, quiet=settings.quiet, verbose=settings.verbose,
                 progress_every=settings.progress_every, enabled=enabled)
    for key, where in sorted(settings.sources.items()):
        r.detail(f"{key} = {getattr(settings, key)!r} ({where})")
    _warnings_to(r)
    return r


# what `auto` costs when it cannot use ghost, relative to ghost (benchmarks/gradnorm.py, CPU)
FALLBACK_COST = {"vmap": "typically 3 to 50 times ghost's time", "replicate": "several times "
                 "ghost's time", "loop": "about one forward and backward per example, often 20 "
                 "times ghost's time or more"}


def _warnings_to(r: Reporter) -> None:
    """Python warnings go to stderr as one line, not as Python's two-line warnings: alcli's own
    (the engine's `auto` settling on a slower method) as `alcli: warning: ...`, the others (torch,
    a third-party package, user code) naming their origin: `warning (torch/x.py:12): ...`."""
    def show(message, category, filename, lineno, file=None, line=None):
        cost = FALLBACK_COST.get(getattr(message, "method", None))  # an EngineFallback
        r.warn(f"{message} (expected cost: {cost})" if cost else str(message),
               warning_origin(category, filename, lineno))
    warnings.showwarning = show


def warn_skipped(r: Reporter, skipped: int, nans: int, errors_file: str | None, errors=()) -> None:
    """Warnings that a long run must not hide (printed with --quiet too)."""
    if skipped:
        where = (f"they are listed in {errors_file}" if errors_file else
                 "; ".join(f"{id_}: {message}" for id_, message in list(errors)[:3])
                 + (" ..." if skipped > 3 else ""))
        r.warn(f"skipped {skipped} unreadable example{'s' if skipped > 1 else ''} ({where})")
    if nans:
        r.warn(f"{nans} example{'s have' if nans > 1 else ' has'} a NaN score (a non-finite loss "
               f"or gradient norm, or a loss over no position: a mask ignoring every pixel, a "
               f"text without a labeled word), ranked last")


def api():
    """alcli.api, imported when a command runs: it imports torch (about 2 s), which --help and
    usage errors need not wait for."""
    from .. import api
    return api


def rank0() -> bool:
    """False on the torchrun processes other than rank 0, which print nothing. Read from the
    environment here, not through longrun.distributed.from_env, which would import torch (2 s)
    before every error message."""
    return os.environ.get("RANK", "0").strip() in ("", "0") or os.environ.get("WORLD_SIZE") == "1"


def shown_list(pool) -> str:
    return " ".join(pool) if isinstance(pool, list) else str(pool)


def stdin_is_empty() -> bool:
    """stdin is not a terminal and holds nothing (`</dev/null`, cron, Slurm), without consuming it."""
    buf = getattr(sys.stdin, "buffer", None)
    if buf is None or sys.stdin.isatty():
        return False
    if hasattr(buf, "peek"):
        return buf.peek(1) == b""
    if buf.seekable():
        at = buf.tell()
        empty = buf.read(1) == b""
        buf.seek(at)
        return empty
    return False



class no_progress:
    def __enter__(self):
        return None, None

    def __exit__(self, *exc):
        return False

