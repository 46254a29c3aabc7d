"""Write a file so that readers see the old one or the complete new one, never a half."""
from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path
from typing import IO, Iterator

from ..errors import RunError


@contextlib.contextmanager
def atomic_open(dest: str | Path, mode: str = "w", **open_args) -> Iterator[IO]:
    """`dest.NAME.PID.tmp` in the same folder, synced and renamed over `dest` on success,
    removed on failure. Raises OSError as open() would."""
    path = Path(dest)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, mode, **open_args) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


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
