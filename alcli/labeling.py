"""`alcli push` and `alcli pull`: a selected batch into a running Label Studio project as tasks
with the model's pre-labels, and the project's annotations back into a labels file.

push: select (as `alcli select` does, from a table) -> Label Studio tasks (selection.pick) ->
the project's tasks by `data.alcli_id`: new ids imported, known ones get their data and their
prediction of this model_version updated (never a second task for one id).
pull: the project's tasks -> each task's latest submitted annotation, read by the task
(`Task.from_annotation`) -> a CSV `id,<the task's columns>` (masks as PNG files beside it), and
the tasks annotators skipped -> a CSV `id,reason`.
"""
from __future__ import annotations

import csv
import hashlib
import json
import os
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from PIL import Image

from .api import run_select
from .errors import ConfigError
from .files.atomic import atomic_open
from .files.config import Settings
from .files.labelstudio_api import LabelStudioError, Server
from .selection.export import (IMAGE_ROOT_HINT, ImageRootError, _inside, labeling_config,
                               unreachable_image)
from .selection.coco_yolo import to_coco
from .selection.pick import labelstudio_tasks
from .tasks import TASKS

@dataclass
class Pushed:
    project: str
    created: int = 0   # tasks imported
    updated: int = 0   # tasks already there, their predictions replaced
    notes: list[str] = field(default_factory=list)


@dataclass
class Pulled:
    project: str
    labeled: int = 0
    skipped: int = 0
    task: str = ""


# --- the labeling config: what alcli's pre-labels need of a project's ------------------------------

def _control(config: str, from_name: str) -> ET.Element | None:
    """The control tag named `from_name` in a labeling config (None: there is none)."""
    try:
        root = ET.fromstring(config)
    except ET.ParseError:
        return None
    return next((e for e in root.iter() if e.get("name") == from_name and e.get("toName")), None)


def _shape(tag: ET.Element | None) -> tuple | None:
    """What makes a control tag fit a task: its kind and, for Choices, single or multiple."""
    return None if tag is None else (tag.tag, (tag.get("choice") or "single") if tag.tag == "Choices" else None)


def _wanted(task: str, field_: str, from_name: str, to_name: str | None) -> ET.Element:
    """The control tag of `task`'s labeling config (the names do not matter here)."""
    return _control(labeling_config(task, ["a"], field_, from_name, to_name), from_name)


def _check_config(project: dict, task: str, field_: str, settings: Settings, shown: str) -> None:
    from_name = settings.from_name or "label"
    want = _wanted(task, field_, from_name, settings.to_name)
    have = _control(project.get("label_config") or "", from_name)
    if _shape(have) == _shape(want) and have.get("toName") == want.get("toName"):
        return
    found = "none" if have is None else f"<{have.tag} toName=\"{have.get('toName')}\">"
    raise LabelStudioError(f"the labeling config of the project '{project.get('title')}' on {shown} "
                           f"does not fit {task} pre-labels: they need <{want.tag} name=\"{from_name}\" "
                           f"toName=\"{want.get('toName')}\"> and its control '{from_name}' is {found}; "
                           f"pass --setup to set alcli's config, or --from-name/--to-name")


def task_of_config(config: str, from_name: str) -> str | None:
    """The task whose labeling config has a control tag like the one named `from_name`."""
    have = _shape(_control(config, from_name))
    for name, spec in TASKS.items():
        if spec.control is None or spec.from_annotation is None:
            continue
        for field_ in ("image", "text"):
            if have is not None and _shape(_wanted(name, field_, from_name, None)) == have:
                return name
    return None


# --- push ------------------------------------------------------------------------------------------

def push(server: Server, settings: Settings, scores: str, project: str, setup: bool) -> Pushed:
    """The batch `select` would write from `scores` (every row without --budget) into `project`."""
    picked = run_select(settings, scores=scores)
    field_ = "image" if picked.texts is None else "text"
    tasks = labelstudio_tasks(picked.rows, settings, picked.meta, picked.texts,
                              picked.class_names, picked.task)
    bare = unreachable_image(tasks)
    if bare is not None:
        raise ConfigError(f"the image '{bare}' is no address the server can open; {IMAGE_ROOT_HINT}")
    found = server.find_project(project)
    config = None
    if setup:
        try:
            config = labeling_config(picked.task, picked.class_names, field_,
                                     settings.from_name or "label", settings.to_name)
        except ValueError as err:
            raise ConfigError(f"--setup: {str(err).rstrip('.')}; pass --class-names FILE, one "
                              f"name per line") from None
    if found is None and config is None:
        raise LabelStudioError(f"Label Studio at {server.shown} has no project '{project}'; create "
                               f"it there, or pass --setup to create it with alcli's labeling config")
    if found is None:
        found = server.create_project(project, config)
    elif config is not None and found.get("label_config") != config:
        found = server.set_config(found["id"], config)
    _check_config(found, picked.task, field_, settings, server.shown)
    done = Pushed(str(found.get("title")), notes=list(picked.notes))
    known = {str(t["data"].get("alcli_id")): t for t in server.tasks(found["id"])
             if "alcli_id" in t.get("data", {})}
    new = [t for t in tasks if t["data"]["alcli_id"] not in known]
    if new:
        server.import_tasks(found["id"], new)
        done.created = len(new)
    for task in tasks:
        there = known.get(task["data"]["alcli_id"])
        if there is None:
            continue
        server.update_task(there["id"], {**there["data"], **task["data"]})
        sent = task["predictions"][0]
        same = next((p for p in there.get("predictions", [])
                     if p.get("model_version") == sent["model_version"]), None)
        if same is None:
            server.add_prediction(there["id"], sent)
        else:
            server.update_prediction(same["id"], {"result": sent["result"], "score": sent["score"]})
        done.updated += 1
    return done


# --- pull ------------------------------------------------------------------------------------------

def pull(server: Server, project: str, output: str, skipped_file: str | None,
         names: list[str] | None, from_name: str, task: str | None) -> Pulled:
    """The project's annotations into `output` (masks under OUTPUT_masks/), skipped tasks into
    `skipped_file`."""
    found = server.find_project(project)
    if found is None:
        raise LabelStudioError(f"Label Studio at {server.shown} has no project '{project}'")
    config = found.get("label_config") or ""
    task = task or task_of_config(config, from_name)
    if task is None or TASKS[task].from_annotation is None:
        tag = _control(config, from_name)
        raise LabelStudioError(
            f"the labeling config of the project '{found.get('title')}' has "
            + (f"no control tag named '{from_name}'" if tag is None else
               f"a <{tag.tag}> control '{from_name}' whose annotations alcli does not read")
            + " (pass --from-name NAME)")
    if names is None:  # the config's labels, in its order
        tag = _control(config, from_name)
        names = [e.get("value") for e in tag if e.get("value") is not None] if tag is not None else None
    rows, skipped = [], []
    masks = Path(output).with_name(Path(output).stem + "_masks")
    for t in sorted(server.tasks(found["id"]), key=lambda t: t["id"]):
        data = t.get("data", {})
        id_ = str(data.get("alcli_id", data.get("image", data.get("text", t["id"]))))
        given = [a for a in t.get("annotations", []) if not a.get("was_cancelled")]
        if not given:
            if t.get("annotations"):
                skipped.append({"id": id_, "reason": "skipped"})
            continue
        latest = max(given, key=lambda a: (a.get("updated_at") or "", a["id"]))
        regions = [r for r in latest.get("result", []) if r.get("from_name") == from_name]
        try:
            cells = TASKS[task].from_annotation(regions, names)
        except (KeyError, TypeError, ValueError) as err:
            raise LabelStudioError(f"the annotation {latest['id']} of task {t['id']} (id '{id_}') "
                                   f"cannot be read as {task} labels ({str(err).rstrip('.')})") from None
        for key, value in cells.items():
            if isinstance(value, np.ndarray):
                cells[key] = _save_mask(value, masks, id_, Path(output).parent)
        rows.append({"id": id_, **cells})
    _write_csv(rows, output, ["id", *dict.fromkeys(k for r in rows for k in r if k != "id")])
    if TASKS[task].instances is not None and all("boxes" in r for r in rows):
        _write_coco(rows, names, task, Path(output).with_name(Path(output).stem + ".coco.json"))
    if skipped_file:
        _write_csv(skipped, skipped_file, ["id", "reason"])
    return Pulled(str(found.get("title")), len(rows), len(skipped), task)


def _save_mask(mask: np.ndarray, folder: Path, id_: str, base: Path) -> str:
    """A mask as `folder/ID.png` (the id's own folders kept; an id that cannot be a path under
    the folder by a hash of it), its path relative to the labels file's folder."""
    try:
        name = _inside(id_, id_.replace("\\", "/"), os.path) if id_ else ""
    except ImageRootError:
        name = ""
    name = name or hashlib.sha1(id_.encode()).hexdigest()[:16]
    path = folder / (os.path.splitext(name)[0] + ".png")
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_open(path, "wb") as fh:
        Image.fromarray(mask).save(fh, format="PNG")
    return os.path.relpath(path, base)


def _write_coco(rows: list[dict], names, task: str, dest: Path) -> None:
    """The pulled boxes also as a COCO document (images, annotations with bbox [x, y, w, h] in
    pixels, categories without background); an image annotated with no box (no size known) is
    left out of it."""
    boxed = [{**r, "boxes": json.dumps([[*b, 1.0] for b in json.loads(r["boxes"])])}
             for r in rows if r.get("width") is not None]  # 1.0: instances' score
    doc = to_coco(boxed, names, task)
    doc["info"] = {"description": "alcli pull: a Label Studio project's boxes"}
    for ann in doc["annotations"]:
        ann.pop("score", None)
    try:
        with atomic_open(dest, "w", encoding="utf-8") as fh:
            json.dump(doc, fh, ensure_ascii=False)
    except OSError as err:
        raise ConfigError(f"cannot write {dest} ({err.strerror or err})") from None


def _write_csv(rows: list[dict], dest: str, columns: list[str]) -> None:
    try:
        with atomic_open(dest, "w", newline="", encoding="utf-8") as fh:
            w = csv.DictWriter(fh, columns, lineterminator="\n")
            w.writeheader()
            w.writerows(rows)
    except OSError as err:
        raise ConfigError(f"cannot write {dest} ({err.strerror or err})") from None
