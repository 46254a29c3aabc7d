"""`select -f coco` and `-f yolo`: a detection (and keypoint) batch read back by a COCO reader
(pycocotools) and by parsing the YOLO text files here, boxes checked to the pixel against the rows'
own boxes clipped to the image (exact fractions)."""
from __future__ import annotations

import csv
import json
from fractions import Fraction
from pathlib import Path

import pytest
from pycocotools.coco import COCO

from cli_errors import assert_one_error
from shell import invoke_in, ok

NAMES = ["background", "cat", "dog"]
ROWS = [  # the ids as a folder pool gives them: paths under the pool's folder
    {"id": "imgs/a.jpg", "score": 0.9, "width": 640, "height": 480,
     "boxes": json.dumps([[10.5, 20.25, 110.0, 220.75, 1, 0.93], [-5.0, 400.0, 700.0, 500.0, 2, 0.41]])},
    {"id": "imgs/sub/b.png", "score": 0.5, "width": 33, "height": 17, "boxes": "[]"},
    {"id": "c.jpg", "score": 0.25, "width": 333, "height": 101, "boxes": json.dumps([[0, 0, 333, 101, 2, 1.0]])},
]


def write_table(path: Path, rows: list[dict], meta: dict) -> Path:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, list(dict.fromkeys(k for r in rows for k in r)))
        w.writeheader()
        w.writerows(rows)
    Path(f"{path}.meta.json").write_text(json.dumps(meta))
    return path


def clipped(row) -> list[tuple]:
    """The oracle: (x0, y0, x1, y1, class) of each box clipped to its image, as fractions."""
    w, h = Fraction(row["width"]), Fraction(row["height"])
    clip = lambda v, hi: min(max(Fraction(v), Fraction(0)), hi)  # noqa: E731
    return [(clip(x0, w), clip(y0, h), clip(x1, w), clip(y1, h), c)
            for x0, y0, x1, y1, c, _ in json.loads(row["boxes"])]


def test_coco_is_read_by_pycocotools_with_the_boxes_to_the_pixel(tmp_path):
    table = write_table(tmp_path / "det.csv", ROWS, {"task": "detection", "class_names": NAMES})
    ok(invoke_in(tmp_path, "select", table, "-n", 3, "--no-diverse", "-f", "coco", "-o", "batch.json"))
    coco = COCO(str(tmp_path / "batch.json"))
    assert [c["name"] for c in coco.loadCats(coco.getCatIds())] == ["cat", "dog"]  # no background
    for row in ROWS:
        [image] = [i for i in coco.dataset["images"] if i["file_name"] == row["id"]]
        assert (image["width"], image["height"]) == (row["width"], row["height"])
        anns = coco.loadAnns(coco.getAnnIds(imgIds=[image["id"]]))
        want = clipped(row)
        assert len(anns) == len(want)
        for ann, (x0, y0, x1, y1, c) in zip(anns, want):
            x, y, w, h = ann["bbox"]  # COCO: top-left corner, width, height
            assert [x, y, x + w, y + h] == pytest.approx([float(v) for v in (x0, y0, x1, y1)], abs=1e-9)
            assert ann["category_id"] == c and coco.loadCats(c)[0]["name"] == NAMES[c]
            assert ann["area"] == pytest.approx(float((x1 - x0) * (y1 - y0)))


def test_yolo_files_give_the_boxes_back_to_the_pixel(tmp_path):
    table = write_table(tmp_path / "det.csv", ROWS, {"task": "detection", "class_names": NAMES})
    ok(invoke_in(tmp_path, "select", table, "-n", 3, "--no-diverse", "-f", "yolo", "-o", "out"))
    out = tmp_path / "out"
    assert (out / "images.txt").read_text().split() == ["./images/" + r["id"] for r in ROWS]
    yaml = (out / "data.yaml").read_text()
    assert 'names:\n  0: "cat"\n  1: "dog"\n' in yaml
    for row in ROWS:
        lines = (out / "labels" / Path(row["id"]).with_suffix(".txt")).read_text().splitlines()
        want = clipped(row)
        assert len(lines) == len(want)
        for line, (x0, y0, x1, y1, c) in zip(lines, want):
            k, cx, cy, bw, bh = line.split()
            assert int(k) == c - 1  # YOLO counts classes from 0; torchvision's class c is c - 1
            W, H = row["width"], row["height"]
            got = [(float(cx) - float(bw) / 2) * W, (float(cy) - float(bh) / 2) * H,
                   (float(cx) + float(bw) / 2) * W, (float(cy) + float(bh) / 2) * H]
            assert got == pytest.approx([float(v) for v in (x0, y0, x1, y1)], abs=0.01)


def test_keypoints_go_with_their_instances(tmp_path):
    points = [[[20.0, 30.0, 0.9], [40.0, 35.0, 0.8], [700.0, -2.0, 0.1]]]
    rows = [{"id": "p.jpg", "score": 1.0, "width": 640, "height": 480,
             "boxes": json.dumps([[10.0, 20.0, 60.0, 90.0, 1, 0.95]]), "keypoints": json.dumps(points)}]
    table = write_table(tmp_path / "kp.csv", rows, {"task": "keypoints",
                                                     "class_names": ["nose", "eye", "ear"]})
    ok(invoke_in(tmp_path, "select", table, "-n", 1, "--no-diverse", "-f", "coco", "-o", "kp.json"))
    coco = COCO(str(tmp_path / "kp.json"))
    [ann] = coco.loadAnns(coco.getAnnIds())
    assert ann["keypoints"] == [20.0, 30.0, 2, 40.0, 35.0, 2, 700.0, -2.0, 2]
    assert coco.loadCats(ann["category_id"])[0]["keypoints"] == ["nose", "eye", "ear"]
    ok(invoke_in(tmp_path, "select", table, "-n", 1, "--no-diverse", "-f", "yolo", "-o", "y"))
    assert "kpt_shape: [3, 3]" in (tmp_path / "y" / "data.yaml").read_text()
    fields = (tmp_path / "y" / "labels" / "p.txt").read_text().split()
    assert len(fields) == 5 + 3 * 3 and int(fields[0]) == 1  # keypoint models keep their class
    assert [float(v) for v in fields[5:8]] == pytest.approx([20 / 640, 30 / 480, 2], abs=1e-6)
    assert [float(v) for v in fields[11:13]] == [1.0, 0.0]  # clipped to the image


def test_rows_without_boxes_and_yolo_on_stdout_are_one_sentence(tmp_path):
    table = write_table(tmp_path / "c.csv", [{"id": "x.png", "score": 1.0, "pred": "cat"}],
                        {"task": "classification", "class_names": NAMES})
    assert_one_error(invoke_in(tmp_path, "select", table, "-n", 1, "-f", "coco"),
                     "COCO and YOLO files hold boxes, and classification rows have none", "coco")
    table = write_table(tmp_path / "d.csv", ROWS, {"task": "detection", "class_names": NAMES})
    assert_one_error(invoke_in(tmp_path, "select", table, "-n", 1, "-f", "yolo"),
                     "--format yolo writes a folder of files; name it with --output DIR", "yolo")
    bad = [{**ROWS[0], "id": "/abs/a.jpg"}]
    table = write_table(tmp_path / "e.csv", bad, {"task": "detection", "class_names": NAMES})
    assert_one_error(invoke_in(tmp_path, "select", table, "-n", 1, "--no-diverse", "-f", "coco"),
                     "the id '/abs/a.jpg' is not a path relative to the pool's folder", "abs")
