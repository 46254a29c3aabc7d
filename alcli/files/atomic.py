"""Write a file so that readers see the old one or the complete new one, never a half.

Only regular files are replaced that way. An output that exists and is no regular file (a device
such as /dev/null, a FIFO, a socket, or a link to one) is written into as a stream, as a shell's
`>` would, and never replaced; /dev/stdout, /dev/fd/N and /proc/self/fd/N are the open descriptor
itself (like `-o -`); a link to a regular file is followed (the link stays).
"""
from __future__ import annotations

import contextlib
import os
import re
import stat
import tempfile
from pathlib import Path
from typing import IO, Iterator

from ..errors import RunError


def special_file(path: str | Path) -> bool:
    """`path` names an open descriptor, or exists (links followed) and is neither a regular file
    nor a folder."""
    if descriptor(path) is not None:
        return True
    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError):
        return False
    return not (stat.S_ISREG(mode) or stat.S_ISDIR(mode))


_FD_FOLDER = re.compile(r"/proc/(self|thread-self)(/task/\d+)?/fd")


def descriptor(path: str | Path) -> int | None:
    """N when `path` is this process's descriptor N: /dev/stdout, /dev/fd/N, /proc/self/fd/N, or
    a link to one (those name whatever fd N is open on, a terminal, pipe or file)."""
    try:
        name = os.path.abspath(path)
        for _ in range(40):  # the links, one hop at a time
            folder = os.path.realpath(os.path.dirname(name))
            if _FD_FOLDER.fullmatch(folder.replace(f"/proc/{os.getpid()}", "/proc/self", 1)):
                base = os.path.basename(name)
                return int(base) if base.isdigit() else None
            if not os.path.islink(name):
                return None
            name = os.path.join(os.path.dirname(name), os.readlink(name))
    except (OSError, ValueError):
        pass
    return None


STREAM_FOLDER = Path(".alcli")  # where runs writing a table to a stream keep their partial file
                                # and the table's embeddings (found there by `select`)


def writes_stream(dest) -> bool:
    """The output is a stream (stdout, '-', or a special file): nothing is written beside it."""
    return dest is None or str(dest) == "-" or special_file(dest)


@contextlib.contextmanager
def atomic_open(dest: str | Path, mode: str = "w", **open_args) -> Iterator[IO]:
    """`dest.NAME.PID.tmp` in the same folder, synced and renamed over `dest` on success,
    removed on failure (also on SIGINT/SIGTERM, whose handlers raise). A special file is opened
    and written as it is. Raises OSError as open() would."""
    if special_file(dest):
        fd = descriptor(dest)
        with (open(dest, mode, **open_args) if fd is None else
              os.fdopen(os.dup(fd), mode, **open_args)) as f:
            yield f
        return
    path = Path(os.path.realpath(dest)) if os.path.islink(dest) else Path(dest)
    remove_stale_temps(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, mode, **open_args) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def remove_stale_temps(path: Path) -> None:
    """Remove `.NAME.PID.tmp` files beside `path` whose process is gone (killed while writing)."""
    prefix, suffix = f".{path.name}.", ".tmp"
    try:
        names = [e.name for e in os.scandir(path.parent or ".")
                 if e.name.startswith(prefix) and e.name.endswith(suffix)]
    except OSError:
        return
    for name in names:
        pid = name[len(prefix):-len(suffix)]
        if pid.isdigit() and int(pid) != os.getpid() and not _alive(int(pid)):
            with contextlib.suppress(OSError):
                os.unlink(path.parent / name)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True  # another user's process (or not a PID at all: left alone)
    return True


def check_writable(folder: str | Path, what: str) -> None:
    """Fail before any work when no file can be created in `folder` (read-only, no permission,
    a full or immutable file system): by creating one, as the real write would (a permission-bit
    test is wrong for root and for read-only mounts)."""
    try:
        with tempfile.TemporaryFile(dir=folder, prefix=".alcli-check-"):
            pass
    except OSError as err:
        raise RunError(f"{what}: cannot write in the folder {folder} ({err.strerror or err})") from None


def make_folder(folder: str | Path, what: str) -> None:
    """Create `folder` and the folders above it where missing (as `mkdir -p`), so that `-o
    new/dir/t.csv` works; one sentence naming `what` when it cannot be created."""
    try:
        Path(folder).mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise RunError(f"{what}: cannot create the folder {folder} "
                       f"({err.strerror or err})") from None
