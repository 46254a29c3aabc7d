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
import math
import os
import posixpath
import shutil
import tempfile
import urllib.parse
import xml.etree.ElementTree as ET
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from PIL import Image

from .api import run_select
from .errors import ConfigError
from .files.atomic import atomic_open, writes_stream
from .files.names import id_file
from .longrun.lock import waiting_lock
from .files.config import Settings
from .files.http import origin as http_origin
from .files.labelstudio_api import LabelStudioError, Server
from .files.redact import redacted
from .selection.export import IMAGE_ROOT_HINT, labeling_config, unreachable_image
from .selection.coco_yolo import to_coco
from .selection.pick import _unnamed, labelstudio_tasks
from .tasks import TASKS

@dataclass
class Pushed:
    project: str
    created: int = 0   # tasks imported
    updated: int = 0   # tasks already there, their data or prediction replaced
    unchanged: int = 0  # tasks already there as this push would make them
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


def names_of_config(config: str, task: str, field_: str, settings: Settings,
                    outputs) -> tuple[list[str] | None, str | None]:
    """The class names, index by index, that a project's labeling config lists in its control
    tag `--from-name` (its labels in order), where they are the names alcli's config for `task`
    would list: as they are, or after torchvision's background (class 0, which a box or mask
    config does not offer) when the model outputs one class more (the table's meta.json says how
    many). (None, a warning) where the labels could be either; (None, None) where there are none."""
    from_name = settings.from_name or "label"
    tag = _control(config, from_name)
    labels = [str(e.get("value")) for e in tag if e.get("value") is not None] if tag is not None else []
    if not labels or TASKS.get(task) is None or not TASKS[task].names_classes:
        return None, None
    outputs = outputs if isinstance(outputs, int) and not isinstance(outputs, bool) else None
    fits = []
    for names in (labels, ["background", *labels]):
        if outputs is not None and len(names) != outputs:
            continue
        try:
            made = _control(labeling_config(task, names, field_, from_name, settings.to_name),
                            from_name)
        except ValueError:
            continue
        if made is not None and [e.get("value") for e in made if e.get("value") is not None] == labels:
            fits.append(names)
    if len(fits) == 1:
        return fits[0], None
    if len(fits) > 1:
        return None, (f"the project's labeling config lists {len(labels)} labels, which could be "
                      f"the model's classes from 0 or after a background class 0, so the tasks go "
                      f"without pre-labels; pass {settings.option('class_names', 'FILE')}, one "
                      f"name per class the model outputs")
    return None, None


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
    if picked.class_names is None and not settings.class_names and found is not None:
        # neither --class-names nor the table's meta.json names the classes: the project's
        # labeling config does (its control tag's labels, in order), as --setup wrote it
        names, note = names_of_config(found.get("label_config") or "", picked.task, field_,
                                      settings, picked.meta.get("classes"))
        if note:
            picked.notes.append(note)
        if names is not None:
            stale = _unnamed(picked.rows, None, picked.task, settings)
            picked.notes = [n for n in picked.notes if n not in stale]
            picked.notes += _unnamed(picked.rows, names, picked.task, settings)
            picked.class_names = names
            tasks = labelstudio_tasks(picked.rows, settings, picked.meta, picked.texts,
                                      picked.class_names, picked.task)
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
    refused = _local_files_storage(server, found["id"], settings.image_root) if setup else None
    with push_lock(server.url, found["id"]):  # pushes from this machine list and import in turn
        known = _by_alcli_id(server.tasks(found["id"]))
        new = [t for t in tasks if t["data"]["alcli_id"] not in known]
        if new:
            server.import_tasks(found["id"], new)
            done.created = len(new)
            _drop_duplicates(server, found["id"], {t["data"]["alcli_id"] for t in new})
    for task in tasks:
        there = known.get(task["data"]["alcli_id"])
        if there is None:
            continue
        data = {**there["data"], **task["data"]}
        sent = task["predictions"][0]
        same = next((p for p in there.get("predictions") or []
                     if p.get("model_version") == sent["model_version"]), None)
        fresh = same is not None and (same.get("result"), same.get("score")) == \
            (sent["result"], sent["score"])
        if data == there["data"] and fresh:
            done.unchanged += 1  # as pushed before: no call
            continue
        if data != there["data"]:
            server.update_task(there["id"], data)
        if same is None:
            server.add_prediction(there["id"], sent)
        elif not fresh:
            server.update_prediction(same["id"], {"result": sent["result"], "score": sent["score"]})
        done.updated += 1
    done.notes += _image_opens(server, tasks, refused)
    return done


LOCAL_FILES = "/data/local-files/"  # where Label Studio serves the files of its Local Files storages


def _local_folder(url: str | None, server: str) -> str | None:
    """FOLDER of an image root `SERVER/data/local-files/?d=FOLDER` on this server, else None."""
    if not url:
        return None
    parts = urllib.parse.urlsplit(url)
    if parts.path != LOCAL_FILES or http_origin(url) != http_origin(server):
        return None
    folder = (urllib.parse.parse_qs(parts.query).get("d") or [""])[0]
    folder = posixpath.normpath(folder.strip("/")) if folder.strip("/") else ""
    return folder if folder and not folder.startswith("..") else None


def _local_files_storage(server: Server, project: int, image_root: str | None) -> str | None:
    """--setup with an image root under the server's /data/local-files/?d=FOLDER: the project's
    Local Files storage for FOLDER (under the server's LOCAL_FILES_DOCUMENT_ROOT), made unless
    there is one. None when there is one now (or the root is elsewhere), else the server's words."""
    folder = _local_folder(image_root, server.url)
    if folder is None:
        return None
    for storage in server.local_storages(project):
        if str(storage.get("path") or "").rstrip("/").endswith("/" + folder):
            return None
    root, said = server.document_root(project)
    if root is None:
        return f"a Local Files storage: {said[:200] or 'it named no LOCAL_FILES_DOCUMENT_ROOT'}"
    path = posixpath.join(root, folder)
    why = server.add_local_storage(project, path, f"alcli: {folder}"[:100])
    return None if why is None else f"a Local Files storage for {path}: {why.split('. ')[0][:200]}"


def _image_opens(server: Server, tasks: list[dict], refused: str | None) -> list[str]:
    """A warning, in one sentence, when the first task's image does not open (as the server
    answers it, or its own host): what to configure so that annotators see the images."""
    url = next((t["data"].get("image") for t in tasks if isinstance(t["data"].get("image"), str)), None)
    if url is None or urllib.parse.urlsplit(url).scheme not in ("http", "https"):
        return []
    why = server.opens(url)
    if why is None:
        return []
    said = f"; Label Studio refused {refused.rstrip('.')}" if refused else ""
    if urllib.parse.urlsplit(url).path == LOCAL_FILES:
        fix = ("Label Studio serves local files only where the server runs with "
               "LOCAL_FILES_SERVING_ENABLED=true and LOCAL_FILES_DOCUMENT_ROOT set to a folder above "
               "the images and the project has a Local Files storage for their folder (push --setup "
               "makes one where the server allows it), else pass an --image-root the server and the "
               "annotators' browsers can reach")
    else:
        fix = ("pass an --image-root the server and the annotators' browsers can reach (an object "
               "store's URL prefix, or the server's /data/local-files/?d=FOLDER with a Local Files "
               "storage)")
    shown = redacted(url)  # a URL's query is shown nowhere (a presigned URL's signature)
    if urllib.parse.urlsplit(url).path == LOCAL_FILES:  # there it is a path, no secret
        shown += " for the file " + \
            (urllib.parse.parse_qs(urllib.parse.urlsplit(url).query).get("d") or [""])[0]
    return [f"the image of the first task ({shown}) does not open ({why}{said}): "
            f"annotators will not see the images; {fix}"]


def _by_alcli_id(tasks) -> dict[str, dict]:
    return {str(t["data"]["alcli_id"]): t for t in tasks if "alcli_id" in (t.get("data") or {})}


def _drop_duplicates(server: Server, project: int, ids: set[str]) -> None:
    """After an import: where a push elsewhere imported one of `ids` at the same time, the task
    with the lowest id stays and the others, unannotated, are deleted (every push that sees the
    pair deletes the same one)."""
    seen: dict[str, list[dict]] = {}
    for t in server.tasks(project):
        id_ = (t.get("data") or {}).get("alcli_id")
        if id_ is not None and str(id_) in ids:
            seen.setdefault(str(id_), []).append(t)
    for copies in seen.values():
        for t in sorted(copies, key=lambda t: (str(type(t["id"])), t["id"]))[1:]:
            if not t.get("annotations"):
                server.delete_task(t["id"])


def push_lock(url: str, project):
    """A lock per server and project in the temporary folder, waited for: two pushes on one
    machine never both find an id missing and import it."""
    key = hashlib.sha256(f"{url}\n{project}".encode()).hexdigest()[:16]
    return waiting_lock(Path(tempfile.gettempdir()) / f"alcli-push-{os.getuid()}-{key}.lock",
                        "two pushes from importing one task twice")


# --- pull ------------------------------------------------------------------------------------------

def pull(server: Server, project: str, output: str, skipped_file: str | None,
         names: list[str] | None, from_name: str, task: str | None,
         names_file: str | None = None) -> Pulled:
    """The project's annotations into `output` (masks under OUTPUT_masks/, boxes also in
    OUTPUT.coco.json), skipped tasks into `skipped_file`: every file staged, then moved in place
    together, so a failure leaves the previous pull's files as they were."""
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
    files = pulled_files(output, skipped_file)
    with staging(files) as staged:
        latest_of: dict[str, tuple] = {}  # id -> (its annotation's order key, row)
        skipped: dict[str, dict] = {}
        for t in server.tasks(found["id"]):
            data = t.get("data") or {}
            id_ = str(data.get("alcli_id", data.get("image", data.get("text", t["id"]))))
            given = [a for a in t.get("annotations") or [] if not a.get("was_cancelled")]
            if not given:
                if t.get("annotations"):
                    skipped.setdefault(id_, {"id": id_, "reason": "skipped"})
                continue
            latest = max(given, key=_annotation_order)
            order = _annotation_order(latest)
            if id_ in latest_of and latest_of[id_][0] >= order:
                continue  # a second task of this id (two pushes at once) annotated earlier
            regions = [r for r in latest.get("result") or [] if r.get("from_name") == from_name]
            where = f"the annotation {latest.get('id')} of task {t['id']} (id '{id_}')"
            try:
                cells = TASKS[task].from_annotation(regions, names)
            except (KeyError, TypeError, ValueError, AttributeError, IndexError) as err:
                raise LabelStudioError(f"{where} cannot be read as {task} labels "
                                       f"({str(err).rstrip('.') or type(err).__name__})") from None
            if not regions and _no_label(cells):
                # nothing drawn or chosen: no answer (a list of boxes, keypoints or spans says
                # "none found" with [] and stays a label)
                skipped.setdefault(id_, {"id": id_, "reason": "empty"})
                continue
            _check_boxes(cells, where, names_file)
            for key, value in cells.items():
                if isinstance(value, np.ndarray):
                    cells[key] = _save_mask(value, staged["masks"], files["masks"], id_,
                                            Path(output).parent)
            task_key = (0, t["id"], "") if isinstance(t["id"], int) else (1, 0, str(t["id"]))
            latest_of[id_] = (order, task_key, {"id": id_, **cells})
        rows = [row for _, _, row in sorted(latest_of.values(), key=lambda kept: kept[1])]
        skipped_rows = [row for id_, row in skipped.items() if id_ not in latest_of]
        _write_csv(rows, staged["labels"], ["id", *dict.fromkeys(k for r in rows for k in r if k != "id")])
        if TASKS[task].instances is not None and all("boxes" in r for r in rows):
            _write_coco(rows, names, task, staged["coco"])
        _write_csv(skipped_rows, staged["skipped"], ["id", "reason"])
    return Pulled(str(found.get("title")), len(rows), len(skipped_rows), task)


def _no_label(cells: dict) -> bool:
    """Do the cells an empty result reads as hold no label at all (no class, no number, no mask,
    no labels that apply), rather than a list of things found that is empty?"""
    return all(v is None or v == "" for k, v in cells.items() if k not in ("width", "height"))


def _annotation_order(annotation: dict) -> tuple:
    """Later annotations sort last: by updated_at, then id (the task id breaks no tie here)."""
    updated = annotation.get("updated_at")
    id_ = annotation.get("id")
    return (updated if isinstance(updated, str) else "",
            id_ if isinstance(id_, int) and not isinstance(id_, bool) else -1)


def _check_boxes(cells: dict, where: str, names_file: str | None) -> None:
    """Boxes with finite coordinates and, when class names were given, a class among them."""
    if "boxes" not in cells:
        return
    for box in json.loads(cells["boxes"]):
        if not all(isinstance(v, (int, float)) and math.isfinite(v) for v in box[:4]):
            raise LabelStudioError(f"{where} has a box whose coordinates are not numbers: {box[:4]}")
        if names_file and not isinstance(box[4], int):
            raise LabelStudioError(f"{where} has a box labeled '{box[4]}', which is not among the "
                                   f"class names of {names_file}; add it there, or pull without "
                                   f"--class-names to use the project's labels")


def pulled_files(output: str, skipped_file: str | None) -> dict[str, Path]:
    """The files one pull writes: the labels CSV, its masks folder, its COCO file, the skipped CSV."""
    out = Path(output)
    return {"labels": out, "masks": out.with_name(out.stem + "_masks"),
            "coco": out.with_name(out.stem + ".coco.json"),
            "skipped": Path(skipped_file) if skipped_file else out.with_name(out.stem + ".skipped.csv")}


@contextmanager
def staging(files: dict[str, Path]):
    """A folder beside the labels file where each of `files` is written first ({key: staged
    path}); on success each staged file is moved onto its place (a masks folder replaces the old
    one whole), and a file this pull did not make (an older COCO file) is removed. On failure
    the staged files are removed and the old ones stay."""
    folder = Path(tempfile.mkdtemp(prefix=f".{files['labels'].name}.", suffix=".pull",
                                   dir=files["labels"].parent or "."))
    staged = {key: folder / key for key in files}
    try:
        yield staged
        for key, dest in files.items():
            if staged[key].is_dir():
                _replace_folder(staged[key], dest)
            elif staged[key].exists():
                if writes_stream(dest):
                    with open(dest, "wb") as out:
                        out.write(staged[key].read_bytes())
                else:
                    os.replace(staged[key], os.path.realpath(dest))
            elif key == "coco" and dest.is_file():
                dest.unlink()
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _replace_folder(new: Path, dest: Path) -> None:
    old = dest.with_name(f".{dest.name}.{os.getpid()}.old")
    if dest.exists():
        os.replace(dest, old)
    os.replace(new, dest)
    shutil.rmtree(old, ignore_errors=True)


def _save_mask(mask: np.ndarray, staged: Path, folder: Path, id_: str, base: Path) -> str:
    """A mask as `staged/<files.names.id_file>` (a name no other id shares), and the path it will
    have under `folder`, relative to the labels file's folder."""
    name = id_file(id_, ".png")
    staged.mkdir(exist_ok=True)
    Image.fromarray(mask).save(staged / name, format="PNG")  # the staging folder is the atomicity
    return os.path.relpath(folder / name, base)


def _write_coco(rows: list[dict], names, task: str, dest: Path) -> None:
    """The pulled boxes also as a COCO document (images, annotations with bbox [x, y, w, h] in
    pixels, categories without background); an image annotated with no box (no size known) is
    left out of it."""
    boxed = [{**r, "boxes": json.dumps([[*b, 1.0] for b in json.loads(r["boxes"])])}
             for r in rows if r.get("width") is not None]  # 1.0: instances' score
    try:
        doc = to_coco(boxed, names, task)
    except (ValueError, TypeError) as err:
        raise LabelStudioError(f"cannot write the pulled boxes as COCO: {str(err).rstrip('.')}") from None
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
