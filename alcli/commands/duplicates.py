"""`alcli duplicates`: the groups of near-duplicates in a ranked table, for a person to look at."""
from __future__ import annotations

from typing import Annotated

import typer

from . import shared
from .options import (OUTPUT, DedupThreshold, Exclude, LogFormat, Quiet, ReadEmbeddings,
                      SelectOutput, under)

EPILOG = """Examples:

\b
alcli score data/demo/pool -o scores.csv
alcli duplicates scores.csv -o groups.csv
alcli duplicates scores.csv --exclude labeled.csv --dedup-threshold 0.9

Each group: its first member (the best-ranked row, or a labeled one), then the rows 'select'
passes over for it, with their cosine to the first member.
"""


def duplicates(
    scores: Annotated[str, typer.Argument(
        help="Ranked table (CSV or JSONL) from 'alcli score', with its embeddings file "
             "(SCORES.emb.npz) beside it.", show_default=False, metavar="SCORES")],
    output: under(OUTPUT, SelectOutput) = None,
    dedup_threshold: DedupThreshold = None, exclude: Exclude = None,
    embeddings_file: ReadEmbeddings = None,
    quiet: Quiet = False, log_format: LogFormat = None,
):
    """List the groups of near-duplicates in SCORES: each group's first member, then its
    duplicates (kind exact: the same text or input; near: cosine of the embeddings at or above
    the threshold), as CSV. Rows named by --exclude are labeled examples that groups may start
    from, as are the rows of an --exclude table with its own embeddings file.
    """
    settings = shared.settings_from(None, {
        "output": output, "dedup_threshold": dedup_threshold, "exclude": exclude,
        "embeddings_file": embeddings_file, "quiet": quiet, "log_format": log_format,
        "model": "(duplicates reads no config)"})
    r = shared.reporter(settings)
    found = shared.api().duplicates(settings, scores)
    if settings.output not in (None, "-"):
        r.info(f"wrote {found.groups} groups ({len(found.rows) - found.groups} rows passed over "
               f"for their first members) to {settings.output}")
