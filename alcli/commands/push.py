"""`alcli push`: a selected batch into a Label Studio project, as tasks with the model's pre-labels."""
from __future__ import annotations

import sys
from typing import Annotated, Optional

import typer

from ..files.labelstudio_api import connect
from . import shared
from .options import (LABELING, SELECTION, ClassNames, Config, Exclude, FromName, ImageRoot,
                      LogFormat, Project, Quiet, Task, Token, ToName, Url, Verbose, under)

EPILOG = """The examples find the server and its token in LABEL_STUDIO_URL and
LABEL_STUDIO_API_KEY.

Examples:

\b
alcli push scores.csv -n 100 -p cats --setup --class-names names.txt \\
    --image-root 'http://localhost:8080/data/local-files/?d=pool'
alcli select scores.csv -n 100 --diverse -o batch.csv
alcli push batch.csv -p cats
alcli pull -p cats -o labels.csv
alcli push scores2.csv -n 100 -p cats --exclude labels.csv
"""


def push(
    scores: Annotated[str, typer.Argument(
        help="A ranked table from 'alcli score', or a batch 'alcli select' wrote (csv, jsonl), "
             "or - for stdin.", show_default=False, metavar="SCORES")],
    project: Project, url: Url = None, token: Token = None,
    setup: Annotated[bool, typer.Option(
        "--setup", help="Create the project when it is missing, and give it the labeling config "
        "the pre-labels fit (class names from the table or --class-names); with an --image-root "
        "under the server's /data/local-files/?d=FOLDER, also the project's Local Files storage "
        "for FOLDER, where the server allows it.",
        rich_help_panel="Label Studio server")] = False,
    budget: Annotated[Optional[int], typer.Option(
        "--budget", "-n", metavar="N", help="Push the N best rows (those select -n N --no-diverse "
        "picks). [default: every row]", rich_help_panel=SELECTION)] = None,
    exclude: Exclude = None, config: under(SELECTION, Config) = None,
    class_names: under(LABELING, ClassNames) = None, task: under(LABELING, Task) = None,
    image_root: ImageRoot = None, from_name: FromName = None, to_name: ToName = None,
    quiet: Quiet = False, verbose: Verbose = False, log_format: LogFormat = None,
):
    """Send a batch to a Label Studio project: one task per row, with the model's prediction as its
    pre-label (model_version: the checkpoint, score: alcli's, for sorting in the Data Manager).

    Tasks are known by their alcli id: a row pushed again updates its task's data and its
    prediction of the same model_version, and never adds a second task. Without --class-names
    the names are the table's (meta.json), else the project's labeling config's. The first task's
    image is fetched after the push: one that does not open is a warning saying what to configure.
    """
    flags = {"budget": budget, "exclude": exclude, "class_names": class_names, "task": task,
             "image_root": image_root, "from_name": from_name, "to_name": to_name,
             "quiet": quiet, "verbose": verbose, "log_format": log_format,
             "diverse": False, "format": "labelstudio"}
    settings = shared.settings_from(config, flags)
    r = shared.reporter(settings)
    settings.budget = settings.budget or sys.maxsize  # every row
    server = connect(url, token)
    from .. import labeling  # imports torch (about 2 s), which --help need not wait for
    done = labeling.push(server, settings, scores, project, setup)
    for note in done.notes:
        r.warn(note)
    r.info(f"pushed {done.created + done.updated + done.unchanged} tasks to the project "
           f"'{done.project}' on {server.shown}: {done.created} new, {done.updated} updated, "
           f"{done.unchanged} unchanged")
