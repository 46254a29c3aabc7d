"""An output never overwrites one of the command's inputs (nor another of its outputs)."""
from __future__ import annotations

import os

from ..errors import ConfigError
from .atomic import writes_stream


def check_not_input(output: str | None, option: str, inputs: list[tuple[str, object]]) -> None:
    """Refuse when the file `output` (given by `option`) is one of `inputs`: (what, path or list
    of paths) pairs such as ("the pool", settings.pool). Streams ('-', devices, FIFOs) are never
    replaced, so they are not compared."""
    if output is None or writes_stream(output):
        return
    for what, paths in inputs:
        for path in paths if isinstance(paths, (list, tuple)) else [paths]:
            if isinstance(path, (str, os.PathLike)) and str(path) != "-" and _same(output, path):
                raise ConfigError(f"{option} {output} is also {what} ({path}); choose another "
                                  f"output file, or that input would be replaced")


def _same(a, b) -> bool:
    """The same file: by inode when both exist, else by the path with links resolved."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.realpath(a) == os.path.realpath(b)
