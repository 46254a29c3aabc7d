"""Only regular files are read as data: opening a FIFO named like an image blocks until a writer
comes (forever, in a pool), and a device can be endless."""
from __future__ import annotations

import os
import stat

KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"),
         (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
         (stat.S_ISSOCK, "a socket"))


def check_regular(path: str | os.PathLike) -> None:
    """Raise OSError unless `path` (links followed) is a regular file; the message says what it is."""
    mode = os.stat(path).st_mode
    if not stat.S_ISREG(mode):
        kind = next((name for test, name in KINDS if test(mode)), "a special file")
        raise OSError(f"not a regular file but {kind}")
