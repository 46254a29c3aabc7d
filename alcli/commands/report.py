"""`alcli report`: one round of labeling as one self-contained HTML page (alcli/report.py)."""
from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated, List, Optional

import typer

from .. import report as round_page
from ..errors import ConfigError
from ..files.atomic import atomic_open
from ..files.outputs import check_outputs
from ..files.table import sidecar
from . import shared
from .options import LogFormat, Quiet, StopKappa, StopWindow
from .stop import check_rule

EPILOG = """Examples:

\b
alcli report scores.csv --batch batch.csv --image-dir data/demo/pool -o round.html
alcli report round3.csv --batch batch3.csv --previous round1.csv --previous round2.csv \\
    --labels labels.csv -o round3.html
"""

PAGE = "The page"


def report(
    scores: Annotated[str, typer.Argument(
        help="This round's ranked table from 'alcli score' (with its .meta.json and .emb.npz "
             "beside it where it has them).", show_default=False, metavar="SCORES")],
    output: Annotated[Optional[str], typer.Option(
        "--output", "-o", metavar="FILE", help="The HTML page to write. [default: SCORES with "
        ".html for its suffix; round.html for stdin]", rich_help_panel=PAGE)] = None,
    batch: Annotated[Optional[str], typer.Option(
        "--batch", metavar="FILE", help="The batch 'alcli select' wrote (CSV or JSONL): the "
        "gallery, its cut-off and class mix. [default: the table's best rows]",
        rich_help_panel=PAGE)] = None,
    previous: Annotated[Optional[List[str]], typer.Option(
        "--previous", metavar="FILE", help="An earlier round's table; repeat it, oldest first: "
        "predictions changed, kappa and the stopping rule across the rounds.",
        rich_help_panel=PAGE)] = None,
    labels: Annotated[Optional[str], typer.Option(
        "--labels", metavar="FILE", help="The labels so far (id,label, as 'alcli pull' writes "
        "them): the class mix and the embeddings map mark them.", rich_help_panel=PAGE)] = None,
    image_dir: Annotated[Optional[str], typer.Option(
        "--image-dir", metavar="DIR", help="The folder the image ids are relative to. "
        "[default: the table's path column, else the working folder]", rich_help_panel=PAGE)] = None,
    kappa: StopKappa = None, window: StopWindow = None,
    quiet: Quiet = False, log_format: LogFormat = None,
):
    """Write one round as a self-contained HTML page: the batch as a gallery (predicted boxes
    and keypoints drawn), the score distribution with the batch's cut-off, the class mix, a PCA
    map of the embeddings, and across rounds the predictions changed, Cohen's kappa, score
    quantiles and the stopping rule's verdict (as 'alcli stop'). Opens from disk: no network.
    """
    settings = shared.settings_from(None, {"quiet": quiet, "log_format": log_format,
                                           "model": "(report reads no config)"})
    r = shared.reporter(settings)
    threshold, window = check_rule(kappa, window)
    dest = output or ("round.html" if scores == "-" else str(Path(scores).with_suffix(".html")))
    if dest == "-":
        raise ConfigError("-o -: alcli report writes a file; give it a name (round.html)")
    inputs = [("SCORES", scores), ("its metadata", str(sidecar(scores, "meta.json"))),
              ("its embeddings", str(sidecar(scores, "emb.npz"))), ("--batch", batch),
              ("--labels", labels), *(("--previous", p) for p in previous or ())]
    check_outputs({"--output": dest}, inputs)
    began = time.perf_counter()
    rnd = round_page.read_round(scores, batch, previous or [], labels)
    check_outputs({"--output": dest}, [("a picture the page shows", p)
                                       for p in round_page.pictures(rnd, image_dir)])
    text, unreadable = round_page.page(rnd, image_dir, threshold, window)
    with atomic_open(dest, "w", encoding="utf-8") as f:
        f.write(text)
    if unreadable:
        r.warn(f"{len(unreadable)} pictures could not be read (the first: '{unreadable[0]}'); "
               f"give --image-dir, the folder their ids are relative to")
    r.info(f"wrote {dest} ({len(text.encode()) / 1e6:.2f} MB, "
           f"{time.perf_counter() - began:.1f} s)")
