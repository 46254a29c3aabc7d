"""`select -f coco` and `-f yolo`: a detection (or keypoint) batch's predictions as the files other
labeling tools (CVAT, Ultralytics, ...) import, images named by their ids (paths relative to the
pool's folder).

COCO: one JSON document {images, annotations, categories}; an image's `id` is its place in the
batch (1, 2, ...), a box is [x, y, width, height] in pixels (x, y: top-left corner), its category
the model's class index (torchvision's background, class 0, is no category), keypoints as
[x, y, 2 (visible)] * K with the category's `keypoints` names.
YOLO: a folder a trainer reads as it is (Ultralytics, YOLOv5): images/ID, a link to each image
(a copy where links cannot be made); labels/ID.txt per image, where Ultralytics' img2label_paths
looks for it (the last /images/ of the image's path replaced by /labels/, its suffix by .txt, so a
batch holding a.png and a.jpg is refused; one line per box: `class x_center y_center width
height`, fractions of the image, then `x y 2` per keypoint); images.txt (`./images/ID` per image,
in batch order: a line starting ./ is relative to the list's folder); data.yaml (train and val:
images.txt, relative to data.yaml's folder; the class names, kpt_shape). YOLO classes count from
0: a torchvision detector's class c is c - 1. Ids become file names only through files/names.py;
a box with no area left after clipping to the image is left out of both.
"""
from __future__ import annotations

import json
import os
import shutil
import uuid
from typing import Mapping, Sequence

from ..files.atomic import atomic_open
from ..files.names import apart, file_names, id_path, stem_file
from ..tasks import TASKS
from ..tasks.shared.labelstudio import offered, row_size

VISIBLE = 2  # COCO's and YOLO's keypoint visibility flag: labeled and visible
POINTS = "keypoints"  # COCO's field of an annotation's and a category's keypoints


def _first_class(names: Sequence[str] | None) -> int:
    """1 when names[0] is torchvision's background (not a class of the files), else 0."""
    return 1 if names and offered(names) != list(dict.fromkeys(names)) else 0


def _instances(rows: Sequence[Mapping], task: str):
    """Per row: (n, row, width, height, its instances clipped to the image)."""
    spec = TASKS[task]
    if spec.instances is None:
        raise ValueError(f"COCO and YOLO files hold boxes, and {task} rows have none (detection and "
                         f"keypoint rows do)")
    for n, row in enumerate(rows, 1):
        w, h = row_size(row, n, "width"), row_size(row, n, "height")
        found = []
        for (x0, y0, x1, y1), c, score, points in spec.instances(row, n):
            x0, x1 = (min(max(v, 0.0), w) for v in (x0, x1))
            y0, y1 = (min(max(v, 0.0), h) for v in (y0, y1))
            if x1 <= x0 or y1 <= y0:  # wholly outside the image (or no area to begin with)
                continue
            found.append(((x0, y0, x1, y1), c, score, points))
        yield n, row, w, h, found


def to_coco(rows: Sequence[Mapping], names: Sequence[str] | None, task: str) -> dict:
    """The batch's predictions as a COCO document. Detection: `names` name the classes (by index);
    keypoints: they name the keypoints, and the categories are the class indices."""
    keypoints = TASKS[task].names_classes is False
    images, annotations, seen = [], [], set()
    file_name = file_names((row["id"] for row in rows), id_path)
    for n, row, w, h, found in _instances(rows, task):
        images.append({"id": n, "file_name": file_name[str(row["id"])], "width": w, "height": h})
        for (x0, y0, x1, y1), c, score, points in found:
            seen.add(c)
            ann = {"id": len(annotations) + 1, "image_id": n, "category_id": c,
                   "bbox": [x0, y0, x1 - x0, y1 - y0], "area": (x1 - x0) * (y1 - y0), "iscrowd": 0,
                   "score": score}
            if points is not None:
                ann[POINTS] = [v for x, y, _ in points for v in (x, y, VISIBLE)]
                ann["num_keypoints"] = len(points)
            annotations.append(ann)
    if keypoints:
        count = max((len(a[POINTS]) // 3 for a in annotations), default=len(names or ()))
        points = [str(names[k]) if names and k < len(names) else str(k) for k in range(count)]
        categories = [{"id": c, "name": f"class {c}", POINTS: points, "skeleton": []}
                      for c in sorted(seen)]
    else:
        start = _first_class(names)
        named = range(start, len(names)) if names else []
        categories = [{"id": c, "name": str(names[c]) if names and c < len(names) else str(c)}
                      for c in sorted(set(named) | seen)]
    return {"info": {"description": "alcli select -f coco: a batch's predictions"},
            "images": images, "annotations": annotations, "categories": categories}


def to_yolo(rows: Sequence[Mapping], names: Sequence[str] | None, task: str) -> dict[str, str]:
    """The batch's predictions as YOLO text files: {relative path: content}."""
    keypoints = TASKS[task].names_classes is False
    start = 0 if keypoints else _first_class(names)
    files, listed, classes, kpt = {}, [], set(), 0
    label_file = file_names((row["id"] for row in rows),
                            lambda i: label_path(IMAGES + stem_file(i, ".txt")))
    image = image_names(rows)
    apart(label_file, image)  # the label files and the images' links share the folder
    for n, row, w, h, found in _instances(rows, task):
        listed.append("./" + image[str(row["id"])])
        lines = []
        for (x0, y0, x1, y1), c, score, points in found:
            classes.add(c - start)
            fields = [c - start, (x0 + x1) / 2 / w, (y0 + y1) / 2 / h, (x1 - x0) / w, (y1 - y0) / h]
            for x, y, _ in points or ():
                fields += [min(max(x, 0.0), w) / w, min(max(y, 0.0), h) / h, VISIBLE]
            kpt = max(kpt, len(points or ()))
            lines.append(" ".join(str(v) if isinstance(v, int) else f"{v:.6f}" for v in fields))
        files[label_file[str(row["id"])]] = "".join(line + "\n" for line in lines)
    if keypoints or not names:
        class_names = {k: f"class {k + start}" for k in sorted(classes)}
    else:
        class_names = {k - start: str(names[k]) for k in range(start, len(names))}
    yaml = ["# alcli select -f yolo: a batch's predictions (labels/), its images (images/, listed in",
            "# images.txt); paths relative to this file's folder", "train: images.txt",
            "val: images.txt", "names:",
            *(f"  {k}: {json.dumps(v, ensure_ascii=False)}" for k, v in sorted(class_names.items()))]
    if keypoints:
        yaml.append(f"kpt_shape: [{kpt}, 3]")
    files["data.yaml"] = "\n".join(yaml) + "\n"
    files["images.txt"] = "".join(p + "\n" for p in listed)
    return files


IMAGES = "images/"  # the folder of the images' links; labels/ beside it


def image_names(rows: Sequence[Mapping]) -> dict[str, str]:
    """{id: images/ID}: where the YOLO folder holds each row's image (a link to it)."""
    return file_names((row["id"] for row in rows), lambda i: IMAGES + id_path(i))


def label_path(image: str) -> str:
    """Ultralytics' img2label_paths on a path relative to the YOLO folder: the last images/
    folder of the path becomes labels/ (the suffix is stem_file's)."""
    head, sep, tail = ("/" + image).rpartition("/images/")
    return (head + "/labels/" + tail)[1:] if sep else image


def image_links(rows: Sequence[Mapping], sources: Sequence[str]) -> dict[str, str]:
    """{images/ID: the image file's absolute path} for the rows whose image file exists
    (`sources`: each row's image file, as `select` finds it)."""
    image = image_names(rows)
    return {image[str(row["id"])]: os.path.abspath(src) for row, src in zip(rows, sources)
            if src and os.path.isfile(src)}


def write_yolo(files: Mapping[str, str], folder: str, links: Mapping[str, str] | None = None) -> None:
    """The YOLO files under `folder` (each written whole), and `links` ({images/ID: image file}):
    a symbolic link to each image, or a copy where the file system makes no links."""
    for rel, text in files.items():
        path = os.path.join(folder, *rel.split("/"))
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with atomic_open(path, "w", encoding="utf-8", newline="\n") as fh:
            fh.write(text)
    for rel, source in (links or {}).items():
        path = os.path.join(folder, *rel.split("/"))
        os.makedirs(os.path.dirname(path), exist_ok=True)
        _link(source, path)


def _link(source: str, path: str) -> None:
    """`path` made a link to `source` (replacing what was there, as one rename), else a copy."""
    temp = os.path.join(os.path.dirname(path), f".link-{uuid.uuid4().hex}")
    try:
        os.symlink(source, temp)
    except (OSError, NotImplementedError):  # Windows without the privilege, a FAT disk, ...
        shutil.copyfile(source, temp)
    try:
        os.replace(temp, path)
    except OSError:
        if os.path.lexists(temp):
            os.unlink(temp)
        raise
