"""An output never overwrites one of the command's inputs (nor another of its outputs).

The inputs are found, not listed: every file setting (config.PATH_KEYS, which a new file option
joins to be read relative to its config) that is not an output, the config file, and what a
command reads besides its settings (select's table). Each input covers the sidecars beside it
(INPUT.meta.json, ...), and a model folder every file under it.
"""
from __future__ import annotations

import os

from ..errors import ConfigError
from .atomic import writes_stream
from .config import PATH_KEYS, Settings
from .remote import is_url, shown
from .table import SIDECARS

OUTPUT_KEYS = ("output", "contact_sheet", "labelstudio_config")  # the settings that name outputs
WHOLE_FOLDERS = ("model",)  # a folder given here is read whole (a Hugging Face model directory)


class WholeFolder(str):
    """An input path that, when a folder, stands for every file under it."""


def inputs_of(settings: Settings, unread: tuple[str, ...] = ()) -> list[tuple[str, object]]:
    """(what, path) for every file `settings` name that a command reads: each file setting but
    the outputs (OUTPUT_KEYS, and `unread`: the command's other outputs, such as score's
    --embeddings, and settings it never reads), and the config file."""
    def path(key):
        value = getattr(settings, key)
        return WholeFolder(value) if key in WHOLE_FOLDERS and isinstance(value, str) else value
    return [(f"the {key.replace('_', ' ')} input given by {settings.where(key)}", path(key))
            for key in PATH_KEYS if key not in OUTPUT_KEYS + unread] + \
        [("the config file", settings.config_file)]


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
            clash = _clash(output, path)
            if clash:
                raise ConfigError(f"{option} {output} is {clash.format(what=what, path=path)}; "
                                  f"choose another output file, or that input would be replaced")
            for suffix in beside:
                if _same(f"{output}.{suffix}", path):
                    raise ConfigError(f"{option} {output} would remove {output}.{suffix}, which "
                                      f"is {what}; choose another output file")


def refuse_remote(output: str | None, option: str) -> None:
    """Outputs are local files: a table is written whole (temp + rename) and resumed in place."""
    if is_url(output):
        raise ConfigError(f"{option} {shown(output)} is an object-store URL; alcli writes its "
                          f"outputs to local files (copy the table up afterwards)")


def _clash(output, path) -> str | None:
    """How writing `output` would replace the input `path` (a template of what and path), or
    None."""
    if _same(output, path):
        return "also {what} ({path})"
    for suffix in SIDECARS:
        if _same(output, f"{path}.{suffix}"):
            return f"{{path}}.{suffix}, read with {{what}}"
    if os.path.isfile(output) and _inside_folder(output, path):
        return "inside {what} ({path}), a folder whose files are read"
    return None


def _inside_folder(output, folder) -> bool:
    """Is `output` under `folder`, a WholeFolder (each of whose files may be read)?"""
    if not isinstance(folder, WholeFolder) or is_url(folder) or not os.path.isdir(folder):
        return False
    return is_under(os.path.dirname(os.path.abspath(output)), folder)


def is_under(path, folder) -> bool:
    """Is `path` the folder `folder` or under it (links resolved; neither need exist)?"""
    path, folder = os.path.realpath(path), os.path.realpath(folder)
    return os.path.commonpath([path, folder]) == folder


def _same(a, b) -> bool:
    """The same file: by inode when both exist, else by the path with links resolved."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.realpath(a) == os.path.realpath(b)


def check_outputs(outputs: dict[str, object], inputs: list[tuple[str, object]]) -> None:
    """Refuse when one of `outputs` ({what: path}, a folder among them replaced whole) is one of
    `inputs`, holds one of them (a folder), or is another of the outputs."""
    given = [(what, path) for what, path in outputs.items() if path is not None]
    for k, (what, path) in enumerate(given):
        check_not_input(str(path), what, inputs + given[:k])
        for other, other_path in inputs + given[:k]:
            if _holds(path, other_path):
                raise ConfigError(f"{what} {path} is a folder written whole, and it holds {other} "
                                  f"({other_path}); choose another output file")


def _holds(folder, path) -> bool:
    """Is `path` (an existing file) under the existing folder `folder`?"""
    if not isinstance(path, (str, os.PathLike)) or is_url(path) or not os.path.isdir(folder):
        return False
    return is_under(path, folder)
