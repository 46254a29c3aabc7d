"""OUTPUT.partial: how finished work survives a crash (the final files are in finish.py).

While a run writes OUTPUT, OUTPUT.partial holds a header line, then one JSON object per line: a
scored example (`{"id": ..., "score": ..., ...}`) or an unreadable one (`{"id": ..., "error": ...}`),
appended batch by batch. `--resume` reads it back and skips its ids; when the table is written
it is removed.

Rows wait in memory for at most `checkpoint_every` (a number of examples, or a duration: 30 s by
default; and never more than FLUSH_BYTES of lines), then go to the file in one write and an fsync;
the buffer is written out too when the run stops on SIGINT/SIGTERM or an error. A kill -9 loses at
most the rows of that interval and of the batch in progress.
"""
from __future__ import annotations

import contextlib
import json
import os
import signal
import time
import uuid
from pathlib import Path
from typing import Iterator

from ..errors import AlcliError, ConfigError, RunError
from ..files.atomic import STREAM_FOLDER, check_writable
from ..files.config import duration_seconds

FORMAT = "alcli-partial"
VERSION = 1
FLUSH_BYTES = 32 << 20  # lines buffered at most, whatever the interval (rows carry embeddings)


# --- writing ------------------------------------------------------------------------------------

class PartialFile:
    """Append-only log of finished examples; `done` holds the ids already in it (on resume).
    `run_id` names the run (kept in the header, so a resumed run keeps it): the table's meta and
    embeddings files record it, so that files of different runs are never taken for one."""

    def __init__(self, path: str | Path, run: dict, *, checkpoint_every: int | str, resume: bool,
                 restart: bool = False, pool_ids: list[str] | None = None, say=None):
        self.path = Path(path)
        self.every_rows, self.every_seconds = (
            (checkpoint_every, None) if isinstance(checkpoint_every, int)
            else (None, duration_seconds(checkpoint_every)))
        self._flushed_at = time.monotonic()
        self._bytes = 0
        self.done: set[str] = set()
        self.resumed = 0
        self.written = 0          # lines this run appended (0: it may remove the file it made)
        self.created = False
        self._buffer: list[str] = []
        self._pending = 0
        self.first_error: str | None = None  # the first unreadable example's message
        if self.path.exists() and restart:
            header, done, _ = _scan(self.path)  # only an alcli partial file is ever deleted
            self.path.unlink()
            if say:
                say(f"discarded {self.path} ({len(done)} finished rows of an earlier run)")
        if self.path.exists():
            header, self.done, end = _scan(self.path)
            if not resume:
                raise ConfigError(f"{self.path} holds {len(self.done)} finished rows of an earlier "
                                  f"run that did not complete; run the same command with --resume "
                                  f"to continue it, or with --restart to discard them")
            _check_same_run(self.path, header.get("run", {}), run, self.done, pool_ids)
            self.run_id = str(header.get("run_id") or new_run_id())
            if end < self.path.stat().st_size:  # a line cut short by the crash
                os.truncate(self.path, end)
            self.resumed = len(self.done)
        else:
            self.run_id = new_run_id()
            header_line = json.dumps({"format": FORMAT, "version": VERSION, "run": run,
                                      "run_id": self.run_id})
            try:
                fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            except OSError as err:
                raise RunError(f"cannot create the partial file {self.path}, where finished rows "
                               f"are kept ({err.strerror or err})") from None
            self.created = True
            try:
                _write_all(fd, (header_line + "\n").encode())
                os.fsync(fd)
            finally:
                os.close(fd)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)

    def discard_if_empty(self) -> bool:
        """Remove the file when this run made it and nothing was scored: a run that stopped
        before its first row leaves nothing behind to resume."""
        if self.created and self.written == 0 and not self._buffer:
            self.path.unlink(missing_ok=True)
            return True
        return False

    def add(self, rows: list[dict], errors: list[tuple[str, str]]) -> None:
        """Queue one batch's rows and unreadable examples; write them out every `checkpoint_every`."""
        lines = [json.dumps(row) + "\n" for row in rows]
        lines += [json.dumps({"id": id_, "error": message}) + "\n" for id_, message in errors]
        self._buffer += lines
        self._bytes += sum(map(len, lines))
        if errors and self.first_error is None:
            self.first_error = errors[0][1]
        self._pending += len(rows) + len(errors)
        if self._due():
            self.flush()

    def _due(self) -> bool:
        if self._bytes >= FLUSH_BYTES:
            return True
        if self.every_rows is not None:
            return self._pending >= self.every_rows
        return time.monotonic() - self._flushed_at >= self.every_seconds

    def flush(self) -> None:
        """Write the queued lines in one write and fsync them: they survive any crash now.
        SIGINT/SIGTERM wait until the lines are written (their handler raises)."""
        with _signals_held():
            if self._buffer:
                _write_all(self._fd, "".join(self._buffer).encode())
                self.written += len(self._buffer)
                self._buffer.clear()
            os.fsync(self._fd)
            self._pending = self._bytes = 0
            self._flushed_at = time.monotonic()

    def close(self) -> None:
        if self._fd is not None:
            try:
                self.flush()
            finally:
                os.close(self._fd)
                self._fd = None


@contextlib.contextmanager
def _signals_held():
    mask = getattr(signal, "pthread_sigmask", None)
    if mask is None:
        yield
        return
    held = mask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    try:
        yield
    finally:
        mask(signal.SIG_SETMASK, held)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def stdout_folder(refusal: str) -> Path | None:
    """./.alcli, made if need be: where runs writing to stdout keep their partial file and their
    table's embeddings. None where it cannot be written; a link or a file by that name is refused
    (`refusal` says what to do)."""
    folder = STREAM_FOLDER
    if folder.is_symlink() or (folder.exists() and not folder.is_dir()):
        what = "a link" if folder.is_symlink() else "not a folder"
        raise ConfigError(f"./{folder} is {what}, where {refusal}")
    try:
        folder.mkdir(exist_ok=True)
        ignore = folder / ".gitignore"
        if not ignore.exists():
            ignore.write_text("# alcli's unfinished runs that write to stdout\n*\n")
        check_writable(folder, "partial file")
        return folder
    except (OSError, AlcliError):
        return None


def new_run_id() -> str:
    return uuid.uuid4().hex


def gather_target(partial: Path) -> Path:
    """Where rank 0 collects the other ranks' rows under torchrun."""
    return partial.with_name(partial.name + ".gathered")


def copy_lines(lines: list[str], path: str | Path) -> None:
    """Append raw partial-file lines (another process's rows) to `path`."""
    with open(path, "a") as f:
        f.writelines(lines)


def new_partial(path: str | Path, run: dict) -> None:
    """An empty partial file (header only) at `path`."""
    with open(path, "w") as f:
        f.write(json.dumps({"format": FORMAT, "version": VERSION, "run": run}) + "\n")


def data_lines(path: str | Path, chunk: int = 4096) -> Iterator[list[str]]:
    """The complete row/error lines of a partial file, `chunk` lines at a time (header skipped)."""
    with open(path) as f:
        f.readline()
        lines: list[str] = []
        for line in f:
            if not line.endswith("\n"):
                break
            lines.append(line)
            if len(lines) >= chunk:
                yield lines
                lines = []
        if lines:
            yield lines


# --- reading back -------------------------------------------------------------------------------

def _scan(path: Path) -> tuple[dict, set[str], int]:
    """(header, ids of the complete lines, byte offset after the last complete line)."""
    done: set[str] = set()
    with open(path, "rb") as f:
        first = f.readline()
        header = _header(path, first)
        end = len(first)
        for n, line in enumerate(f, 2):
            if not line.endswith(b"\n"):
                break  # cut short by the crash: dropped, that example is scored again
            done.add(read_record(path, n, line)["id"])
            end += len(line)
    return header, done, end


def _header(path: Path, line: bytes) -> dict:
    try:
        header = json.loads(line)
    except ValueError:
        header = None
    if not isinstance(header, dict) or header.get("format") != FORMAT or not line.endswith(b"\n"):
        raise RunError(f"{path} is not an alcli partial file; move it away to start over")
    if header.get("version") != VERSION:
        raise RunError(f"{path} was written by another version of alcli (format "
                       f"{header.get('version')}); delete it to start over")
    return header


def read_record(path: Path, n: int, line: bytes) -> dict:
    try:
        record = json.loads(line)
    except ValueError:
        record = None
    if not isinstance(record, dict) or not isinstance(record.get("id"), str):
        raise RunError(f"{path} line {n} is damaged; delete the file to start over")
    return record


def _check_same_run(path: Path, before: dict, now: dict, done: set[str],
                    pool_ids: list[str] | None) -> None:
    changes = [_change(key, before.get(key), now.get(key), done, pool_ids)
               for key in sorted(set(before) | set(now)) if before.get(key) != now.get(key)]
    if changes:
        raise ConfigError(f"{path} holds {len(done)} finished rows of a run with other settings "
                          f"({'; '.join(changes)}); run with --restart to discard them and start "
                          f"over, or resume with the earlier settings")


def _change(key: str, before, now, done: set[str], pool_ids: list[str] | None) -> str:
    """One difference between the partial file's run and this one, in words."""
    if key == "pool_fingerprint" and isinstance(before, str) and isinstance(now, str):
        was, is_ = before.split(":")[0], now.split(":")[0]
        text = (f"the pool had {was} examples, now {is_}" if was != is_ else
                f"the pool has {is_} examples as before, but other ones")
        if pool_ids is not None:
            gone = len(done - set(pool_ids))
            if gone:
                text += f"; {gone} of the finished examples are no longer in it"
        return text
    if key == "excluded":  # score --exclude: fingerprints of what was left out
        was, is_ = (v.split(":")[0] if isinstance(v, str) else "0" for v in (before, now))
        return (f"--exclude left out {was} examples, now {is_}" if was != is_ else
                f"--exclude left out {is_} examples as before, but other ones")
    if key == "model":
        return f"the model file changed (then {_show(before)}, now {_show(now)})"
    return f"{key} was {_show(before)}, now {_show(now)}"


def _show(value) -> str:
    return "(none)" if value is None else json.dumps(value)
