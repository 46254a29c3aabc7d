"""`alcli stop`: the stabilizing-predictions rule over the rounds' tables, for a script's loop:
exit 0 when it says stop, 3 when it says go on (1 stays bad input)."""
from __future__ import annotations

import json
import sys
from typing import Annotated, List

import typer

from ..errors import ConfigError
from ..files.table import read_table
from ..selection import stopping
from .options import StopKappa, StopWindow

EPILOG = """Examples:

\b
alcli stop round1.csv round2.csv round3.csv round4.csv
if alcli stop rounds/*.csv --json > stop.json; then echo "stop labeling"; fi
"""

GO_ON = 3  # the exit code when the rule says go on


def stop(
    tables: Annotated[List[str], typer.Argument(
        help="The rounds' ranked tables from 'alcli score', oldest first (their pred column).",
        show_default=False, metavar="SCORES")],
    kappa: StopKappa = None, window: StopWindow = None,
    json_out: Annotated[bool, typer.Option(
        "--json", help="Print the rounds and the verdict as one JSON object.")] = False,
):
    """Say whether to stop labeling: Cohen's kappa of each two consecutive rounds' predictions
    over the ids both tables scored (Bloodgood & Vijay-Shanker's stop set), and stop once the
    mean of the last --window kappas reaches --kappa.

    Exits 0 when the rule says stop, 3 when it says go on, 1 on bad input.
    """
    threshold, window = check_rule(kappa, window)
    preds = [stopping.predictions(read_table(t)) for t in tables]
    result = stopping.rounds(preds, threshold, window)
    for older, newer, record in zip(tables, tables[1:], result["rounds"][1:]):
        if record["kappa"] is None:
            raise ConfigError(f"the tables {older} and {newer} share no id with a prediction, so "
                              f"their rounds cannot be compared; give the same pool's tables")
    result["tables"] = list(tables)
    if json_out:
        sys.stdout.write(json.dumps(result) + "\n")
    else:
        sys.stdout.write(text(result, tables))
    raise typer.Exit(0 if result["stop"] else GO_ON)


def check_rule(kappa: float | None, window: int | None) -> tuple[float, int]:
    threshold = stopping.THRESHOLD if kappa is None else kappa
    window = stopping.WINDOW if window is None else window
    if not 0 < threshold <= 1:
        raise ConfigError(f"--kappa {threshold}: give a kappa above 0 and at most 1")
    if window < 1:
        raise ConfigError(f"--window {window}: give at least 1 round")
    return threshold, window


def text(result: dict, tables: list[str]) -> str:
    """One line per round (its table, the ids compared, predictions changed, kappa, the mean of
    the last kappas), then the verdict."""
    lines = ["round\tcompared\tchanged\tkappa\tmean_kappa\tstop\ttable"]
    for record, table in zip(result["rounds"], tables):
        def cell(key, digits=4):
            v = record.get(key)
            return "-" if v is None else f"{v:.{digits}f}" if isinstance(v, float) else str(v)
        lines.append("\t".join([str(record["round"]), cell("common"), cell("changed"),
                                cell("kappa"), cell("mean_kappa"),
                                "yes" if record["stop"] else "no", table]))
    lines.append(stopping.verdict(result))
    return "\n".join(lines) + "\n"
