"""The `alcli` command line: the app, its error conventions and its help layout. Each command lives
in alcli/commands/ (one module each; the options they share in commands/options.py), parses,
calls alcli.api, and prints; no logic here.

Data goes to stdout, everything for people to stderr (alcli.terminal). Conventions: bad input or an
environment fault exits 1 with `alcli: error: <one sentence>`; a usage error exits 2 with one such
line; Ctrl-C 130, SIGTERM 143, a closed stdout (`| head`) 141 without a word.
"""
from __future__ import annotations

import errno
import io
import os
import re
import sys
from typing import Annotated

import typer
from typer import Abort
from typer.core import TyperCommand, TyperGroup

from .commands import (duplicates, inspect, merge, pull, push, report, review, score, select,
                       simulate, stop)
from .commands.shared import rank0
from .errors import AlcliError, torchvision_mismatch
from .version import __version__

try:  # recent Typer carries its own copy of click
    from typer._click.exceptions import ClickException, UsageError
except ImportError:  # pragma: no cover - older Typer on click
    from click.exceptions import ClickException, UsageError


class _ClosedPipe(Exception):
    """stdout's reader went away; carried past Typer, which would turn it into exit 1."""


class _Stopped(Exception):
    """Ctrl-C or SIGTERM, with the message saying where the finished rows are; carried past
    Typer, which would turn any KeyboardInterrupt into a silent exit 130."""

    def __init__(self, message: str, exit_code: int):
        super().__init__(message)
        self.exit_code = exit_code


class _Alcli(TyperGroup):
    """Errors the way ripgrep or jq print them: one `alcli: error: ...` line, no panel, no
    traceback; exit 2 for usage, 1 for bad input or the environment, 141 for a closed pipe."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except OSError as err:
            if err.errno == errno.EPIPE:
                raise _ClosedPipe() from None
            raise
        except KeyboardInterrupt as err:
            raise _Stopped(str(err), getattr(err, "exit_code", 130)) from None

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        try:
            code = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except UsageError as err:
            command = err.ctx.command_path if err.ctx else "alcli"
            message = _one_line(err.format_message()).rstrip(".")
            sys.stderr.write(f"alcli: error: {message[:1].lower()}{message[1:]}; "
                             f"try '{command} --help'\n")
            code = 2
        except ClickException as err:
            sys.stderr.write(f"alcli: error: {_one_line(err.format_message())}\n")
            code = err.exit_code
        except AlcliError as err:
            sys.stderr.write(f"alcli: error: {_printable(str(err))}\n")
            code = 1
        except _Stopped as err:
            if str(err) and rank0():
                sys.stderr.write(f"alcli: {_printable(str(err))}\n")
            code = err.exit_code
        except (Abort, KeyboardInterrupt):
            code = 130
        except OSError as err:
            sys.stderr.write(f"alcli: error: {_printable(_os_error(err))}\n")
            code = 1
        except _ClosedPipe:  # the reader of stdout went away (`| head`): quiet, like grep and jq
            _silence_stdout()
            code = 141
        except Exception as err:  # noqa: BLE001 - a torchvision built for another torch, in one sentence
            mismatch = torchvision_mismatch(err)
            if mismatch is None:
                raise
            sys.stderr.write(f"alcli: error: {_printable(mismatch)}\n")
            code = 1
        sys.exit(code if isinstance(code, int) else 0)


def _one_line(text: str) -> str:
    return _printable(" ".join(text.split()))


MESSAGE_LIMIT = 1000  # characters of one error sentence; user data quoted in it is cut to fit


def _printable(text: str) -> str:
    """One line however the user data quoted in it looks: line breaks, other control characters
    and lone surrogates (undecodable file-name bytes) escaped as in Python literals, and the
    sentence cut at MESSAGE_LIMIT characters."""
    shown = "".join(c if c.isprintable() or c == " " else ascii(c)[1:-1] for c in text)
    return shown if len(shown) <= MESSAGE_LIMIT else shown[:MESSAGE_LIMIT - 3] + "..."


def _os_error(err: OSError) -> str:
    """`cannot write /sys/x.csv.partial: Permission denied`-style, from any OSError."""
    what = err.strerror or type(err).__name__
    name = err.filename if err.filename is not None else None
    if name is None:
        return f"{what.rstrip('.')} (an operating system error)"
    other = f" -> {err.filename2}" if err.filename2 else ""
    return f"{name}{other}: {what}"


def _silence_stdout() -> None:
    """Point stdout at /dev/null so Python's final flush does not complain about the pipe."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError, io.UnsupportedOperation):
        pass


class _Command(TyperCommand):
    """Arguments listed by name only (POOL, PART...), without Typer's `<list[str]>` type tag."""

    def format_help(self, ctx, formatter) -> None:
        super().format_help(ctx, formatter)
        formatter.buffer[:] = [part.replace("\xa0", " ").replace("\u2011", "-")
                               for part in formatter.buffer]

    def collect_usage_pieces(self, ctx) -> list[str]:
        """`PART...` for a required argument, as man pages write it (Typer writes `{PART}...`)."""
        return [p[1:].replace("}", "", 1) if p.startswith("{") else p
                for p in super().collect_usage_pieces(ctx)]

    def format_options(self, ctx, formatter) -> None:
        """Arguments, then the options under their headings (rich_help_panel; "Options" for those
        without one), the headings in the order the command's signature meets them."""
        sections: dict[str, list[tuple[str, str]]] = {}
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx)
            if record is None:
                continue
            name, text = record
            # never wrapped after "[default:" nor inside least-confidence (restored in format_help)
            text = re.sub(r"(?<=\w)-(?=\w)", "\u2011", text.replace("[default: ", "[default:\xa0"))
            if param.param_type_name == "argument":
                sections.setdefault("Arguments", []).append((name.split(" <", 1)[0], text))
            else:  # -h/--help closes the last heading
                title = (getattr(param, "rich_help_panel", None)
                         or (list(sections)[-1] if param.name == "help" and sections else "Options"))
                sections.setdefault(title, []).append((name, text))
        if "Arguments" in sections:
            sections = {"Arguments": sections.pop("Arguments"), **sections}
        for title, rows in sections.items():
            with formatter.section(title):
                formatter.write_dl(rows)


app = typer.Typer(
    name="alcli", cls=_Alcli, add_completion=True, pretty_exceptions_enable=False,
    rich_markup_mode=None, no_args_is_help=True,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
    help="Rank an unlabeled pool for labeling by how much each example would move your model.",
)


def _version(value: bool) -> None:
    if value:
        sys.stdout.write(f"alcli {__version__}\n")
        raise typer.Exit(0)


@app.callback()
def _root(version: Annotated[bool, typer.Option(
        "--version", "-V", callback=_version, is_eager=True,
        help="Print the version and exit.")] = False) -> None:
    """Rank an unlabeled pool for labeling by how much each example would move your model.

    Run 'alcli COMMAND -h' for a command's options; 'alcli score' alone scores the shipped demo.
    """



# `alcli -h` lists the commands in this order
app.command(cls=_Command, epilog=score.EPILOG)(score.score)
app.command(cls=_Command, epilog=merge.EPILOG)(merge.merge)
app.command(cls=_Command, epilog=select.EPILOG)(select.select)
app.command(cls=_Command, epilog=duplicates.EPILOG)(duplicates.duplicates)
app.command(cls=_Command, epilog=push.EPILOG)(push.push)
app.command(cls=_Command, epilog=pull.EPILOG)(pull.pull)
app.command(cls=_Command, epilog=review.EPILOG)(review.review)
app.command(cls=_Command, epilog=simulate.EPILOG)(simulate.simulate)
app.command(cls=_Command, epilog=inspect.EPILOG)(inspect.inspect)
app.command(cls=_Command, epilog=stop.EPILOG)(stop.stop)
app.command(cls=_Command, epilog=report.EPILOG)(report.report)


def main() -> None:
    app(prog_name="alcli")


if __name__ == "__main__":
    main()
