"""`--help` a person can read: options under headings, select's own options first (on the first
screen), the scoring options it passes through under a heading of their own, and every option
declared once for all the commands that take it."""
from __future__ import annotations

import re
import typing

import typer.main
from typer.testing import CliRunner

from alcli.cli import app
from alcli.commands import options
from alcli.commands.score import score
from alcli.commands.select import SCORING_FIRST, SCORING_FLAGS

runner = CliRunner()
SCREEN = 40  # lines of a terminal's first screen
OPTION = re.compile(r"^  (?:-\w, )?(--[\w-]+)")


def help_text(*args: str) -> list[str]:
    result = runner.invoke(app, [*args, "--help"], env={"COLUMNS": "80"}, prog_name="alcli")
    assert result.exit_code == 0, result.output
    return result.output.split("\n")


def headings(lines: list[str]) -> list[str]:
    return [line[:-1] for line in lines if re.fullmatch(r"[A-Z][^:]*(?:: [^:]+)?[^ ]:", line)
            and not line.startswith(("Usage", "Examples"))]


def params(command: str) -> dict:
    group = typer.main.get_command(app)
    return {p.name: p for p in group.commands[command].params}


def test_select_shows_its_own_options_on_the_first_screen_before_the_scoring_ones():
    lines = help_text("select")
    first = "\n".join(lines[:SCREEN])
    for own in ("--budget", "--format", "--output", "--per-class", "--exclude", "--diverse"):
        assert re.search(rf"^  (-\w, )?{own}\b", first, re.M), own
    at = lines.index(f"{SCORING_FIRST}:")
    listed = {m.group(1): i for i, line in enumerate(lines) if (m := OPTION.match(line))}
    scoring = {"--" + name.replace("_", "-") for name in SCORING_FLAGS} | {"--pool", "--model"}
    scoring |= {"--no-grayscale"} & set(listed)
    assert all(listed[o] > at for o in scoring if o in listed), "a scoring option above its heading"
    own = [o for o in listed if o not in scoring and o != "--help"]
    assert own and all(listed[o] < at for o in own), "an own option under the scoring heading"
    assert headings(lines) == ["Arguments", "Choosing the batch", "Labeling tools", "Messages",
                               SCORING_FIRST]


def test_select_warns_about_exactly_the_options_under_the_scoring_heading():
    """SCORING_FLAGS (the options that have no effect on a table read from a file) and the
    heading --help lists them under name the same options, --pool and --model aside."""
    panel = {name for name, p in params("select").items()
             if getattr(p, "rich_help_panel", None) == SCORING_FIRST}
    assert panel - {"pool", "model"} == set(SCORING_FLAGS)


def test_score_lists_its_options_under_headings():
    lines = help_text("score")
    assert headings(lines) == ["Arguments", "Input", "Model", "Scoring", "Image transforms",
                               "Output", "Performance", "Long runs", "Messages"]
    assert all(getattr(p, "rich_help_panel", None) for name, p in params("score").items()
               if name not in ("pool", "help"))


# options whose meaning is the command's own: what -o, -f and -0 write, what --exclude leaves out
# (before scoring, or of the batch), what -n counts and what --pool is for
PER_COMMAND = {"help", "output", "format", "null", "exclude", "budget", "pool"}


def test_an_option_two_commands_take_is_the_same_option():
    """One declaration (alcli/commands/options.py): same flags and help in every command."""
    commands = ("score", "select", "merge", "simulate", "inspect", "push", "pull", "duplicates")
    seen: dict[str, tuple] = {}
    for command in commands:
        for name, p in params(command).items():
            if p.param_type_name != "option" or name in PER_COMMAND:
                continue
            same = (tuple(p.opts), tuple(p.secondary_opts), p.help)
            assert seen.setdefault(name, same) == same, f"{command} --{name} differs"
    assert len(seen) > 40


def test_every_command_that_scores_a_pool_takes_every_scoring_option():
    """options.SCORING declares how a pool is read and scored; score takes each, and so do the
    other commands that score a pool with the user's model (select --pool, simulate's rounds)."""
    hints = typing.get_type_hints(score, include_extras=True)
    names = {name for name, hint in hints.items() if any(hint is o for o in options.SCORING)}
    assert len(names) == len(options.SCORING) and {"normalize", "resize", "workers"} <= names
    for command in ("select", "simulate"):
        missing = sorted(n.replace("_", "-") for n in names - set(params(command)))
        assert not missing, f"{command} lacks --{', --'.join(missing)}"
