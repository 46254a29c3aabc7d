"""Write a file so that readers see the old one or the complete new one, never a half."""
from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import IO, Iterator


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
