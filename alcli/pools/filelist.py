"""Image files named one by one: several POOL arguments, one image file as the pool, or the paths
on stdin (`-`; NUL-separated with --null). Each path as given is its id."""
from __future__ import annotations

import sys
from pathlib import Path

from ..errors import ConfigError, PoolError
from .common import IMAGE_EXTS, Pool, PoolKind, PoolOptions, image_pool


def _is_stdin(spec, opts: PoolOptions) -> bool:
    return isinstance(spec, str) and spec == "-"


def _is_list(spec, opts: PoolOptions) -> bool:
    return isinstance(spec, list)


def _is_image_file(spec, opts: PoolOptions) -> bool:
    return isinstance(spec, str) and Path(spec).suffix.lower() in IMAGE_EXTS


STDIN = PoolKind("paths on stdin", _is_stdin, lambda spec, opts, stdin: from_stdin(spec, opts, stdin),
                 options=("null",))
FILE_LIST = PoolKind("image files", _is_list, lambda spec, opts, stdin: _named_files(spec, opts))
IMAGE_FILE = PoolKind("one image file", _is_image_file,
                      lambda spec, opts, stdin: from_files([spec], opts))


def from_stdin(spec: str, opts: PoolOptions, stream=None) -> Pool:
    """Image paths, one per line (or NUL-separated with opts.null); each path as given is its id:
    only the line's end (newline, or CR LF) is removed, so names may hold spaces or a bare CR."""
    stream = stream if stream is not None else sys.stdin
    text = _read_untranslated(stream)
    if opts.null:
        entries = text.split("\0")
    elif "\0" in text:
        raise PoolError("the paths on stdin are separated by NUL characters (find -print0?); "
                        "pass -0/--null to read them so")
    else:
        entries = [line.removesuffix("\r") for line in text.split("\n")]
    return from_files([e for e in entries if e], opts, "from stdin")


def _read_untranslated(stream) -> str:
    """A text stream's content with its line ends as sent (sys.stdin turns a bare CR into a newline)."""
    buffer = getattr(stream, "buffer", None)
    if buffer is None:
        return stream.read()
    return buffer.read().decode(stream.encoding or "utf-8", stream.errors or "strict")


def from_files(paths: list[str], opts: PoolOptions, name: str | None = None) -> Pool:
    """Image files named one by one (the command line, stdin); each path as given is its id."""
    return image_pool(name or (paths[0] if len(paths) == 1 else f"of {len(paths)} image files"),
                       [(p, Path(p), -1) for p in paths], opts)

def _named_files(paths: list[str], opts: PoolOptions) -> Pool:
    """Several POOL arguments: each must be an image file (one folder, manifest or tensor file
    is a pool on its own)."""
    if opts.labels_from_folders:
        raise ConfigError("--labels-from-folders needs one directory pool with class subfolders")
    for p in paths:
        if p == "-" or Path(p).suffix.lower() not in IMAGE_EXTS or Path(p).is_dir():
            raise PoolError(f"pool {p}: several POOL arguments must all be image files "
                            f"({', '.join(IMAGE_EXTS)}); a folder, manifest, tensor file or - "
                            f"is a pool on its own")
        if not Path(p).exists():
            raise PoolError(f"pool file {p} does not exist")
    return from_files(paths, opts)
