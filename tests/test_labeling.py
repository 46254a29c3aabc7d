"""alcli push / alcli pull without a server: an unreachable one is one sentence (the real server's
refused token, rounds and codec checks: tests/integration/test_labelstudio_live.py); Label Studio's
brush run-length code against a stream written out by hand; annotations read back per task
against the arithmetic done here; torchvision's background never offered as a label."""
from __future__ import annotations

import json
import socket
import xml.etree.ElementTree as ET

import numpy as np
import pytest
from typer.testing import CliRunner

from cli_errors import assert_one_error
from alcli.cli import app
from alcli.selection.export import labeling_config
from alcli.tasks import TASKS
from alcli.tasks.shared.labelstudio import mask_to_rle, rle_to_mask

TOKEN = "s3cr3t-t0ken-never-shown"


def run(tmp_path, monkeypatch, *args, env=None):
    monkeypatch.chdir(tmp_path)
    return CliRunner().invoke(app, [str(a) for a in args],
                              env={"LABEL_STUDIO_URL": None, "LABEL_STUDIO_API_KEY": None, **(env or {})})


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed when the socket is: nothing listens there


@pytest.mark.parametrize("command", [
    ["push", "t.csv", "-p", "cats", "--image-root", "http://images.example/"],
    ["pull", "-p", "cats", "-o", "labels.csv"]])
def test_an_unreachable_server_is_one_sentence_without_the_token(tmp_path, monkeypatch, command):
    (tmp_path / "t.csv").write_text("id,score,pred\na.png,1.0,cat\n")
    url = f"http://127.0.0.1:{closed_port()}"
    result = run(tmp_path, monkeypatch, *command, "--url", url, env={"LABEL_STUDIO_API_KEY": TOKEN})
    assert_one_error(result, f"cannot reach Label Studio at {url} (Connection refused)", command[0])
    assert TOKEN not in result.stderr and not (tmp_path / "labels.csv").exists()
    # the token given as a flag is not shown either
    result = run(tmp_path, monkeypatch, *command, "--url", url, "--token", TOKEN)
    assert_one_error(result, "cannot reach Label Studio", command[0])
    assert TOKEN not in result.stderr


@pytest.mark.parametrize("env, culprit", [
    ({"LABEL_STUDIO_URL": "http://localhost:1", "LABEL_STUDIO_API_KEY": TOKEN, "OUT": "-"},
     "pull writes a labels file with its masks and skipped tasks beside it; name it with -o FILE"),
    ({}, "no Label Studio server given; pass --url URL or set LABEL_STUDIO_URL"),
    ({"LABEL_STUDIO_URL": "http://localhost:1"}, "no Label Studio access token given"),
    ({"LABEL_STUDIO_URL": "ftp://x", "LABEL_STUDIO_API_KEY": TOKEN}, "--url ftp://x is not an http(s)"),
])
def test_a_missing_server_or_token_is_one_sentence(tmp_path, monkeypatch, env, culprit):
    out = env.pop("OUT", "l.csv")
    assert_one_error(run(tmp_path, monkeypatch, "pull", "-p", "x", "-o", out, env=env), culprit, env)


def test_bare_ids_are_refused_before_the_server_is_asked(tmp_path, monkeypatch):
    (tmp_path / "t.csv").write_text("id,score,pred\nimgs/a.png,1.0,cat\n")
    result = run(tmp_path, monkeypatch, "push", "t.csv", "-p", "cats", "--url",
                 f"http://127.0.0.1:{closed_port()}", "--token", TOKEN)
    assert_one_error(result, "the image 'imgs/a.png' is no address the server can open; pass "
                             "--image-root URL", "bare id")


# --- brush masks ----------------------------------------------------------------------------------

def test_a_brush_mask_is_the_stream_written_by_hand():
    """A 1 x 3 mask, pixels (on, on, off): RGBA bytes 255 x 8 then 0 x 4. Header: 32 bits of
    N = 12, 5 bits of word size - 1 = 7, four 4-bit run-length sizes - 1 (2, 3, 7, 15); then a
    repeated run: 1, size index 3 (16 bits), length - 1, the byte."""
    bits = (f"{12:032b}" + f"{7:05b}" + "0010" + "0011" + "0111" + "1111"
            + "1" + "11" + f"{7:016b}" + f"{255:08b}" + "1" + "11" + f"{3:016b}" + f"{0:08b}")
    bits += "0" * (-len(bits) % 8)
    by_hand = [int(bits[i:i + 8], 2) for i in range(0, len(bits), 8)]
    mask = np.array([[True, True, False]])
    assert mask_to_rle(mask) == by_hand
    assert np.array_equal(rle_to_mask(by_hand, 1, 3), mask)
    # a list run (first bit 0): 3 words given one by one, with a 3-bit length field (index 0)
    bits = (f"{12:032b}" + f"{7:05b}" + "0010" + "0011" + "0111" + "1111"
            + "0" + "00" + f"{3:03b}" + f"{0:08b}" * 3 + f"{9:08b}"
            + "1" + "11" + f"{7:016b}" + f"{0:08b}")
    bits += "0" * (-len(bits) % 8)
    stream = [int(bits[i:i + 8], 2) for i in range(0, len(bits), 8)]
    assert np.array_equal(rle_to_mask(stream, 1, 3), np.array([[True, False, False]]))
    with pytest.raises(ValueError, match="not those of a 4x1 image"):
        rle_to_mask(by_hand, 1, 4)


def test_large_masks_survive_the_round_trip():
    rng = np.random.default_rng(0)
    mask = rng.random((90, 130)) < 0.3
    mask[:, :100] = True  # runs longer than 2^16 bytes need more than one record
    assert np.array_equal(rle_to_mask(mask_to_rle(mask), 90, 130), mask)


# --- annotations read back ------------------------------------------------------------------------

NAMES = ["background", "cat", "dog"]


def test_rectangles_come_back_as_pixel_boxes_with_class_indices():
    region = {"from_name": "label", "original_width": 200, "original_height": 80,
              "value": {"x": 10.0, "y": 25.0, "width": 30.0, "height": 50.0,
                        "rectanglelabels": ["dog"]}}
    cells = TASKS["detection"].from_annotation([region], NAMES)
    assert json.loads(cells["boxes"]) == [[20.0, 20.0, 80.0, 60.0, 2]]
    assert (cells["width"], cells["height"]) == (200, 80)
    # without class names a box keeps its label's name
    assert json.loads(TASKS["detection"].from_annotation([region], None)["boxes"])[0][4] == "dog"


def test_brushes_come_back_as_a_mask_of_class_indices():
    """Unpainted pixels are torchvision's background (class 0); a later region paints over."""
    cat = np.zeros((4, 5), bool)
    cat[1:3, 1:4] = True
    dog = np.zeros((4, 5), bool)
    dog[2, :] = True
    regions = [{"original_width": 5, "original_height": 4, "value": {"rle": mask_to_rle(m),
                "brushlabels": [name]}} for m, name in ((cat, "cat"), (dog, "dog"))]
    mask = TASKS["segmentation"].from_annotation(regions, NAMES)["mask"]
    want = np.zeros((4, 5), np.uint8)
    want[1:3, 1:4] = 1
    want[2, :] = 2
    assert mask.dtype == np.uint8 and np.array_equal(mask, want)
    # class 0 a class like the others: unpainted pixels are 255 (ignored in training)
    mask = TASKS["segmentation"].from_annotation(regions, ["sky", "cat", "dog"])["mask"]
    assert mask[0, 0] == 255 and mask[2, 0] == 2


@pytest.mark.parametrize("task, tag", [("detection", "RectangleLabels"), ("segmentation", "BrushLabels")])
def test_torchvision_background_is_never_offered(task, tag):
    for names in (NAMES, ["__background__", "cat", "dog"]):
        control = ET.fromstring(labeling_config(task, names)).find(tag)
        assert [e.get("value") for e in control] == ["cat", "dog"]
    control = ET.fromstring(labeling_config(task, ["sky", "cat"])).find(tag)
    assert [e.get("value") for e in control] == ["sky", "cat"]


def test_keypoints_come_back_in_pixels_by_their_index():
    regions = [{"original_width": 400, "original_height": 300,
                "value": {"x": 25.0, "y": 50.0, "width": 0.5, "keypointlabels": ["eye"]}},
               {"original_width": 400, "original_height": 300,
                "value": {"x": 100.0, "y": 0.0, "width": 0.5, "keypointlabels": ["nose"]}}]
    cells = TASKS["keypoints"].from_annotation(regions, ["nose", "eye"])
    assert json.loads(cells["keypoints"]) == [[100.0, 150.0, 1], [400.0, 0.0, 0]]
    assert (cells["width"], cells["height"]) == (400, 300)


def test_bare_ids_in_label_studio_tasks_are_warned_about(tmp_path, monkeypatch):
    """Without --image-root, data.image holds the ids, which a server cannot open: said once."""
    (tmp_path / "t.csv").write_text("id,score,pred\nimgs/a.png,1.0,cat\nhttp://h/b.png,0.5,cat\n")
    result = run(tmp_path, monkeypatch, "select", "t.csv", "-n", 2, "--no-diverse", "-f", "labelstudio")
    assert result.exit_code == 0
    assert ("data.image holds ids a Label Studio server cannot open (the first is 'imgs/a.png'); "
            "pass --image-root URL") in result.stderr
    result = run(tmp_path, monkeypatch, "select", "t.csv", "-n", 2, "--no-diverse", "-f", "labelstudio",
                 "--image-root", "http://images.example/")
    assert result.exit_code == 0 and "cannot open" not in result.stderr


def test_pulled_boxes_are_also_a_coco_file_pycocotools_reads_to_the_pixel(tmp_path):
    from pycocotools.coco import COCO
    from alcli.labeling import _write_coco

    def box(x, y, w, h, label, size):
        return {"from_name": "label", "original_width": size[0], "original_height": size[1],
                "value": {"x": x, "y": y, "width": w, "height": h, "rectanglelabels": [label]}}
    annotated = {"a/1.png": [box(10.0, 25.0, 30.0, 50.0, "dog", (200, 80)),
                             box(0.0, 0.0, 50.0, 12.5, "cat", (200, 80))],
                 "b.png": [box(25.0, 50.0, 25.0, 25.0, "cat", (40, 64))]}
    rows = [{"id": id_, **TASKS["detection"].from_annotation(regions, NAMES)}
            for id_, regions in annotated.items()]
    _write_coco(rows, NAMES, "detection", tmp_path / "labels.coco.json")
    coco = COCO(str(tmp_path / "labels.coco.json"))
    images = {img["file_name"]: img for img in coco.dataset["images"]}
    assert {k: (v["width"], v["height"]) for k, v in images.items()} == {"a/1.png": (200, 80), "b.png": (40, 64)}
    got = {name: sorted((a["category_id"], a["bbox"]) for a in coco.loadAnns(coco.getAnnIds(imgIds=[img["id"]])))
           for name, img in images.items()}
    # [x, y, w, h] in pixels: percent of the image times its size, computed here
    assert got == {"a/1.png": [(1, [0.0, 0.0, 100.0, 10.0]), (2, [20.0, 20.0, 60.0, 40.0])],
                   "b.png": [(1, [10.0, 32.0, 10.0, 16.0])]}
    assert {c["id"]: c["name"] for c in coco.loadCats(coco.getCatIds())} == \
        {i: n for i, n in enumerate(NAMES) if i}  # background is no category
