"""Interrupted runs, for the kill and resume tests: an `alcli score` process, and a wait until its
partial file holds some finished rows."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path


def start_score(cwd: Path, *args) -> subprocess.Popen:
    """`python -m alcli score ARGS` in `cwd`, one thread, warnings off, pipes for its output."""
    return subprocess.Popen([sys.executable, "-m", "alcli", "score", *map(str, args)], cwd=cwd,
                            env={**os.environ, "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1"},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def data_lines(path: Path) -> int:
    """The rows of a partial (or any CSV) file, its header left out; 0 before it exists."""
    try:
        return max(0, path.read_bytes().count(b"\n") - 1)
    except FileNotFoundError:
        return 0


def wait_for_rows(proc: subprocess.Popen, partial: Path, rows: int, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while data_lines(partial) < rows:
        assert proc.poll() is None, f"the run ended before it could be stopped: {proc.communicate()}"
        assert time.monotonic() < deadline, "no rows reached the partial file"
        time.sleep(0.005)


def kill_when_saved(proc: subprocess.Popen, partial: Path, rows: int, timeout: float = 120.0) -> int:
    """SIGKILL the run once `rows` rows are in its partial file -> the rows it had saved."""
    wait_for_rows(proc, partial, rows, timeout)
    proc.kill()
    proc.communicate(timeout=60)
    return data_lines(partial)
