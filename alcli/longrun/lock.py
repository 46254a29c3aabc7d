"""OUTPUT.lock: one run at a time writes an output (and its partial file).

The lock is an flock on the open file, so the kernel releases it when its process ends in any way
(kill -9 included); the file holds the holder's PID for the message. A file left by a killed run
is taken over by the next one.
"""
from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path
from typing import Iterator

from ..errors import RunError


def lock_path(partial: Path) -> Path:
    """OUTPUT.partial -> OUTPUT.lock (stdout runs: ./.alcli/stdout-HASH.lock)."""
    return partial.with_name(partial.name.removesuffix(".partial") + ".lock")


@contextlib.contextmanager
def output_lock(path: Path, output: str) -> Iterator[None]:
    """Hold the lock `path` for the run writing `output`, or refuse in one sentence."""
    fd = _acquire(path, output)
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)  # while still held: the next run makes a fresh one
        os.close(fd)


@contextlib.contextmanager
def waiting_lock(path: Path, why: str) -> Iterator[None]:
    """Hold the flock `path`, waiting while another process holds it (`why`: what it keeps from
    happening twice at once, for the message when the file cannot be made). The file stays."""
    fd = _open(path, why)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _open(path: Path, why: str) -> int:
    try:
        return os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    except OSError as err:
        raise RunError(f"cannot create the lock file {path}, which keeps {why} "
                       f"({err.strerror or err})") from None


def _acquire(path: Path, output: str) -> int:
    while True:
        fd = _open(path, f"two runs from writing {output} at once")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(fd)
            os.close(fd)
            raise RunError(f"another alcli run{holder} is writing {output} (it holds {path}); "
                           f"wait for it to finish, or stop it and run again with --resume"
                           ) from None
        if _same_file(fd, path):  # not a file its last holder removed meanwhile
            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()}\n".encode())
            return fd
        os.close(fd)


def _holder(fd: int) -> str:
    try:
        pid = os.pread(fd, 32, 0).decode().strip()
    except (OSError, UnicodeDecodeError):
        return ""
    return f" (process {pid})" if pid.isdigit() else ""


def _same_file(fd: int, path: Path) -> bool:
    try:
        return os.path.samestat(os.fstat(fd), os.stat(path, follow_symlinks=False))
    except OSError:
        return False
