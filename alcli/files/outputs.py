"""An output never overwrites one of the command's inputs (nor another of its outputs)."""
from __future__ import annotations

import os

from ..errors import ConfigError
from .atomic import writes_stream
from .remote import is_url, shown


def check_not_input(output: str | None, option: str, inputs: list[tuple[str, object]],
                    beside: tuple[str, ...] = ()) -> None:
    """Refuse when the file `output` (given by `option`) is one of `inputs`: (what, path or list
    of paths) pairs such as ("the pool", settings.pool), or when one of its sidecars (OUTPUT.SUFFIX
    for the suffixes `beside`, which writing it replaces or removes) is. Streams ('-', devices,
    FIFOs) are never replaced, so they are not compared."""
    if output is None or writes_stream(output):
        return
    refuse_remote(output, option)
    for what, paths in inputs:
        for path in paths if isinstance(paths, (list, tuple)) else [paths]:
            if not isinstance(path, (str, os.PathLike)) or str(path) == "-":
                continue
            if _same(output, path):
                raise ConfigError(f"{option} {output} is also {what} ({path}); choose another "
                                  f"output file, or that input would be replaced")
            for suffix in beside:
                if _same(f"{output}.{suffix}", path):
                    raise ConfigError(f"{option} {output} would remove {output}.{suffix}, which "
                                      f"is {what}; choose another output file")


def refuse_remote(output: str | None, option: str) -> None:
    """Outputs are local files: a table is written whole (temp + rename) and resumed in place."""
    if is_url(output):
        raise ConfigError(f"{option} {shown(output)} is an object-store URL; alcli writes its "
                          f"outputs to local files (copy the table up afterwards)")


def _same(a, b) -> bool:
    """The same file: by inode when both exist, else by the path with links resolved."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.realpath(a) == os.path.realpath(b)
