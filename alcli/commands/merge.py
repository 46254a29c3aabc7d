"""`alcli merge`: the shard tables of one pool made into its one ranked table."""
from __future__ import annotations

import sys
from typing import Annotated, List

import typer

from ..errors import AlcliError
from . import shared
from .options import LogFormat, NullOutput, Output, Quiet, TableFormat

EPILOG = """Examples:

\b
alcli merge part0.csv part1.csv part2.csv -o scores.csv
alcli merge parts/part*.csv | alcli select -n 100 -f paths
"""


def merge(
    parts: Annotated[List[str], typer.Argument(
        help="Shard tables written by 'alcli score --shard K/N -o PART' (each with its "
             "PART.meta.json beside it).", show_default=False, metavar="PART")],
    output: Output = None, format: TableFormat = None, null: NullOutput = False,
    quiet: Quiet = False, log_format: LogFormat = None,
):
    """Combine the shard tables of one pool into its ranked table, as one process would have
    written it. Refuses parts that overlap, miss a shard, or were scored differently.

    The table goes to --output, or to stdout when that is not a terminal (else to scores.csv).
    """
    settings = shared.settings_from(None, {"output": output, "format": format, "null": null,
                                           "quiet": quiet, "log_format": log_format,
                                           "model": "(merge reads no config)"})
    r = shared.reporter(settings)
    if settings.format not in ("csv", "jsonl", "paths", "ids"):
        raise AlcliError(f"--format {settings.format}: merge writes csv, jsonl, paths or ids")
    dest = settings.output or ("scores.csv" if sys.stdout.isatty() else "-")
    result = shared.api().merge(parts, dest, settings.format, settings.null)
    errors_file = next((f for f in result.files if f.endswith(".errors.csv")), None)
    shared.warn_skipped(r, len(result.finished.errors), result.finished.nans, errors_file,
                        result.finished.errors)
    for note in result.notes:
        r.warn(note)
    if dest != "-":
        r.info(f"wrote {result.finished.count} rows from {result.parts} parts to {dest}")
        if result.embeddings_file:
            r.info(f"joined their embeddings into {result.embeddings_file}")
