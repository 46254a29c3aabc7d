"""What people see on stderr: messages, warnings, progress and the end-of-run summary.

On a terminal: a rich progress bar and a small table. Elsewhere (a log file, a pipe, a cluster
job): plain lines, a progress line every `progress_every` seconds, no box drawing. With
`--log-format json` every progress line, warning, note and the summary is one JSON object per line
(`{"event": "progress" | "warning" | "note" | "summary", ...}`); errors stay `alcli: error: ...`.
"""
from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from typing import Callable, Iterator

from rich.console import Console
from rich.progress import (BarColumn, MofNCompleteColumn, Progress, ProgressColumn, TextColumn,
                           TimeElapsedColumn, TimeRemainingColumn)
from rich.table import Table
from rich.text import Text

from .files.redact import redacted

SUMMARY_COLUMNS = ("rank", "id", "score", "pred", "confidence", "label")


def stderr_is_terminal() -> bool:
    return sys.stderr.isatty()


class Reporter:
    """Everything a command prints on stderr, in one style: `alcli: ...` lines, or JSON lines."""

    def __init__(self, log_format: str = "text", *, quiet: bool = False, verbose: bool = False,
                 progress_every: float = 30.0, enabled: bool = True):
        self.json = log_format == "json"
        self.quiet, self.verbose = quiet, verbose
        self.every = progress_every
        self.enabled = enabled   # False on torchrun ranks other than 0
        self.terminal = stderr_is_terminal() and not self.json

    # --- one-line messages -----------------------------------------------------------------------

    def _emit(self, event: str, message: str, prefix: str, origin: str | None = None) -> None:
        if not self.enabled:
            return
        message = redacted(message)  # a library's warning may quote a URL with its credentials
        if self.json:
            line = json.dumps({"event": event, "message": message,
                               **({"origin": origin} if origin else {})})
        else:  # a warning from elsewhere names its origin instead of alcli
            line = f"warning ({origin}): {message}" if origin else f"alcli: {prefix}{message}"
        sys.stderr.write(line + "\n")
        sys.stderr.flush()

    def say(self, message: str) -> None:
        """What happened to the user's files (resumed, discarded): printed with --quiet too."""
        self._emit("note", message, "")

    def info(self, message: str) -> None:
        """A note for people (not with --quiet)."""
        if not self.quiet:
            self._emit("note", message, "")

    def warn(self, message: str, origin: str | None = None) -> None:
        """A warning: printed with --quiet too. `origin` (see warning_origin) for one that is not
        alcli's: `warning (torch/serialization.py:1234): ...` instead of `alcli: warning: ...`."""
        self._emit("warning", message, "warning: ", origin)

    def detail(self, message: str) -> None:
        """-v/--verbose only."""
        if self.verbose:
            self._emit("note", message, "")

    # --- progress ----------------------------------------------------------------------------------

    @contextlib.contextmanager
    def progress(self, what: str = "scoring") -> Iterator[tuple[Callable, Callable]]:
        """(on_start(total, done=0), on_batch(k)) callbacks: a bar on a terminal, started at once
        (so model loading is not a blank screen), else a line every `progress_every` seconds."""
        if self.quiet or not self.enabled:
            yield None, None
            return
        if self.terminal:
            with _bar(what) as callbacks:
                yield callbacks
            return
        lines = _Lines(self, what)
        yield lines.start, lines.advance

    # --- the summary ---------------------------------------------------------------------------------

    def summary(self, facts: dict, top: list[dict], notes=()) -> None:
        """Counts, time, speed, device, method and the top rows; a table on a terminal, plain
        `key: value` lines elsewhere, one JSON object with --log-format json."""
        if self.quiet or not self.enabled:
            return
        if self.json:
            sys.stderr.write(redacted(json.dumps({"event": "summary", **facts, "top": top[:5],
                                                  "notes": list(notes)}, default=str)) + "\n")
            sys.stderr.flush()
            return
        shown = {k: redacted(v) for k, v in _readable(facts).items() if v is not None}
        columns = [c for c in SUMMARY_COLUMNS if any(c in r for r in top[:5])]
        cells = [[_short(r.get(c)) for c in columns] for r in top[:5]]
        if self.terminal:
            console = Console(stderr=True, highlight=False, soft_wrap=True)
            grid = Table.grid(padding=(0, 2))
            for key, value in shown.items():  # Text: ids and paths are not rich markup
                grid.add_row(key, Text(value))
            console.print(grid)
            if cells:
                table = Table(title="top 5", title_justify="left")
                for c in columns:
                    table.add_column(c, overflow="fold")
                for row in cells:
                    table.add_row(*map(Text, row))
                console.print(table)
        else:
            width = max(map(len, shown)) if shown else 0
            out = [f"{k:<{width}}  {v}" for k, v in shown.items()]
            if cells:
                widths = [max(len(c), *(len(r[i]) for r in cells)) for i, c in enumerate(columns)]
                out.append("top 5:")
                out.append("  " + "  ".join(c.ljust(w) for c, w in zip(columns, widths)).rstrip())
                out += ["  " + "  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip() for r in cells]
            sys.stderr.write("\n".join(out) + "\n")
        for note in notes:
            self.info(note)


PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))


def warning_origin(category: type, filename: str, lineno: int) -> str | None:
    """None for a Python warning of alcli's own (raised in its code, or of a category it defines);
    else where it comes from: the file relative to the import path it was found on, so the
    package comes first (`torch/serialization.py:1234`), else the file's name."""
    if getattr(category, "__module__", "").split(".")[0] == "alcli":
        return None
    path = os.path.abspath(filename) if filename else ""
    if path.startswith(PACKAGE_DIR + os.sep):
        return None
    roots = [os.path.abspath(p).rstrip(os.sep) + os.sep for p in sys.path if isinstance(p, str)]
    under = [root for root in roots if path.startswith(root)]
    name = path[len(max(under, key=len)):] if under else os.path.basename(filename or "") or "?"
    return f"{name}:{lineno}" if lineno else name


def _readable(facts: dict) -> dict:
    examples = f"{facts['examples']}" + (f" ({facts['resumed']} from the partial file)"
                                         if facts.get("resumed") else "")
    if facts.get("excluded"):
        examples += f", {facts['excluded']} excluded by --exclude (not scored)"
    method = facts.get("method")
    reason = facts.get("method_reason") or ""
    if method and reason.startswith(f"{method}: "):
        reason = reason[len(method) + 2:]
    return {"examples": examples, "time": f"{facts['seconds']:.2f} s",
            "speed": rate_text(facts["per_second"], "examples"), "device": facts.get("device"),
            "strategy": facts.get("strategy"),
            "method": (f"{method} ({reason})" if reason else method) if method else
            "no gradients needed"}


def rate_text(per_second: float, unit: str) -> str:
    """`12.5 examples/s`, or below one a second `3.2 s/example` (`0.0 examples/s` says nothing)."""
    if 0 < per_second < 1:
        return f"{1 / per_second:,.1f} s/{unit.rstrip('s')}"
    return f"{per_second:,.1f} {unit}/s"


def _short(value) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return "" if value is None else str(value)


@contextlib.contextmanager
def _bar(what: str):
    class Speed(ProgressColumn):
        def render(self, task):
            return Text(rate_text(task.speed, "ex") if task.speed else "")

    console = Console(stderr=True, highlight=False, soft_wrap=True)
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), Speed(),
                  TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn(),
                  console=console, transient=True) as bar:
        task = bar.add_task("loading the model and the pool", total=None)

        def start(total: int, done: int = 0) -> None:
            bar.reset(task, total=total, completed=done, description=what)

        yield start, (lambda k: bar.advance(task, k))


class _Lines:
    """Progress for a log file: `alcli: scoring 1,200/5,000 (24%), 310 ex/s, eta 12s` every `every`
    seconds (checked after each batch), so a run that stops early prints only its error."""

    def __init__(self, reporter: Reporter, what: str):
        self.r, self.what = reporter, what
        self.total = self.done = self.first = 0
        self.t0 = self.last = 0.0

    def start(self, total: int, done: int = 0) -> None:
        self.total, self.done, self.first = total, done, done
        self.t0 = self.last = time.monotonic()

    def advance(self, k: int) -> None:
        self.done += k
        now = time.monotonic()
        if now - self.last >= self.r.every:
            self.last = now
            self._line(now - self.t0)

    def _line(self, elapsed: float) -> None:
        rate = (self.done - self.first) / elapsed if elapsed > 0 else None
        eta = (self.total - self.done) / rate if rate else None
        if self.r.json:
            sys.stderr.write(json.dumps({
                "event": "progress", "what": self.what, "done": self.done, "total": self.total,
                "per_second": round(rate, 2) if rate else None,
                "eta_seconds": round(eta, 1) if eta is not None else None}) + "\n")
        else:
            pct = f" ({100 * self.done / self.total:.0f}%)" if self.total else ""
            speed = f", {rate_text(rate, 'ex')}" if rate else ""
            left = f", eta {_duration(eta)}" if eta is not None else ""
            sys.stderr.write(f"alcli: {self.what} {self.done:,}/{self.total:,}{pct}{speed}{left}\n")
        sys.stderr.flush()


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
