"""`alcli pull`: a Label Studio project's annotations into a labels file."""
from __future__ import annotations

from typing import Annotated, Optional

import typer

from ..errors import AlcliError
from ..files.classnames import read_class_names
from ..files.labelstudio_api import connect
from ..files.outputs import check_outputs
from . import shared
from .options import (LABELING, OUTPUT, ClassNames, FromName, LogFormat, Project, Quiet, Task,
                      Token, Url, under)

EPILOG = """The labels file: a CSV, one row per annotated task (its latest submitted annotation):
id, then what the task's labels are: label (a class name; names joined by |;
a number; [[start, end, type], ...] spans), boxes ([[x0, y0, x1, y1, class],
...] in pixels, class by its index in --class-names, else by name) or
keypoints ([[x, y, keypoint], ...]) with width and height, or mask (a PNG of
class indices under OUTPUT_masks/, OUTPUT's name without .csv); boxes also
as COCO JSON in OUTPUT.coco.json. The tasks
skipped by annotators go to OUTPUT.skipped.csv (id,reason: skipped), and so
do those submitted empty (reason: empty), except for detection and keypoints
(an empty result: no objects, []) and token classification (no entities).
Both files name examples by id, as --exclude reads them.

Examples:

\b
alcli pull -p cats -o labels.csv
alcli score pool/ -o scores.csv --exclude labels.csv \\
    --exclude labels.skipped.csv
"""


def pull(
    project: Project,
    output: Annotated[str, typer.Option(
        "--output", "-o", metavar="FILE", help="The labels file (CSV) to write.",
        show_default=False, rich_help_panel=OUTPUT)],
    url: Url = None, token: Token = None,
    skipped: Annotated[Optional[str], typer.Option(
        "--skipped", metavar="FILE", help="Where the skipped tasks go. [default: OUTPUT with "
        ".skipped.csv for its .csv]", rich_help_panel=OUTPUT)] = None,
    class_names: under(LABELING, ClassNames) = None, task: under(LABELING, Task) = None,
    from_name: FromName = None, quiet: Quiet = False, log_format: LogFormat = None,
):
    """Write a Label Studio project's annotations as labels (for --exclude and for training), and
    the tasks annotators skipped. The task is the one the project's labeling config is for
    (--task to say it)."""
    settings = shared.settings_from(None, {"quiet": quiet, "log_format": log_format,
                                           "task": task, "model": "(pull reads no config)"})
    r = shared.reporter(settings)
    if output == "-":
        raise AlcliError("pull writes a labels file with its masks and skipped tasks beside it; "
                         "name it with -o FILE")
    names = read_class_names(class_names, "option --class-names") if class_names else None
    server = connect(url, token)
    from .. import labeling  # imports torch (about 2 s), which --help need not wait for
    files = labeling.pulled_files(output, skipped)
    check_outputs({"option --output": files["labels"], "option --skipped": files["skipped"],
                   "the COCO file of option --output": files["coco"],
                   "the masks folder of option --output": files["masks"]},
                  [("the class names file given by option --class-names", class_names)])
    skipped = str(files["skipped"])
    done = labeling.pull(server, project, output, skipped, names, from_name or "label",
                         None if settings.task in (None, "auto") else settings.task, class_names)
    r.info(f"pulled {done.labeled} {done.task} labels from the project '{done.project}' on "
           f"{server.shown} to {output}; {done.skipped} skipped tasks to {skipped}")
