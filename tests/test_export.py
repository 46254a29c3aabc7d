"""Label Studio tasks against the documented import shape; JSONL; a real contact sheet PNG."""
import json
import math

import numpy as np
import pytest
from PIL import Image

from alcli.selection.export import (PAD, contact_sheet, image_ref, model_version_from, sheet_layout,
                                    to_labelstudio, write_json)


def assert_labelstudio_import(doc):
    """Label Studio's basic JSON import format with pre-annotations (labelstud.io/guide/tasks,
    /guide/predictions): a JSON array of tasks; each task has a `data` object holding the key the
    labeling config's object tag reads (`$image` -> data.image, a URL or path string); the top-level
    `id` is reserved; `predictions` is a list of objects with a `result` list, an optional numeric
    `score` and an optional `model_version` string."""
    assert isinstance(doc, list) and doc
    for task in doc:
        assert isinstance(task, dict)
        assert set(task) <= {"data", "predictions", "annotations", "meta"}
        assert "id" not in task
        assert isinstance(task["data"], dict) and isinstance(task["data"]["image"], str)
        assert task["data"]["image"]
        assert isinstance(task["predictions"], list)
        for pred in task["predictions"]:
            assert set(pred) <= {"result", "score", "model_version"}
            assert isinstance(pred["result"], list)
            assert isinstance(pred["score"], float) and math.isfinite(pred["score"])
            assert isinstance(pred["model_version"], str) and pred["model_version"]


ROWS = [{"rank": 1, "id": "pool/cat 1.png", "score": 0.93, "pred": 3},
        {"rank": 2, "id": "pool/dog#2.jpg", "score": 0.5},
        {"rank": 3, "id": "https://cdn.example.com/x.png", "score": 0.25, "pred": np.int64(1)}]


def test_labelstudio_tasks_shape_and_values(tmp_path):
    tasks = to_labelstudio(ROWS, "https://files.example.com/data", model_version_from("runs/best.pt"))
    out = tmp_path / "tasks.json"
    write_json(tasks, str(out))
    doc = json.loads(out.read_text())
    assert_labelstudio_import(doc)
    assert [t["data"]["image"] for t in doc] == [
        "https://files.example.com/data/pool/cat%201.png",
        "https://files.example.com/data/pool/dog%232.jpg",
        "https://cdn.example.com/x.png"]
    assert [t["predictions"][0]["score"] for t in doc] == [0.93, 0.5, 0.25]
    assert {t["predictions"][0]["model_version"] for t in doc} == {"best.pt"}
    assert [t["data"]["alcli_rank"] for t in doc] == [1, 2, 3]
    assert [t["data"].get("alcli_pred") for t in doc] == [3, None, 1]
    assert doc[0]["data"]["alcli_id"] == "pool/cat 1.png"


def test_image_ref_roots():
    assert image_ref("a/b.png", None) == "a/b.png"
    assert image_ref("a/b.png", "/mnt/pool") == "/mnt/pool/a/b.png"
    assert image_ref("sub/b.png", "http://h/files/") == "http://h/files/sub/b.png"
    with pytest.raises(ValueError, match="absolute path"):  # it cannot be under the root
        image_ref("/abs/b.png", "http://h/files/")
    assert image_ref("a b.png", "http://localhost:8080/data/local-files/?d=") == \
        "http://localhost:8080/data/local-files/?d=a%20b.png"
    assert image_ref("x.png", "s3://bucket/pool") == "s3://bucket/pool/x.png"


def test_labelstudio_rejects_nan():
    with pytest.raises(ValueError, match="id 'n'.*not finite"):
        to_labelstudio([{"id": "n", "score": float("nan")}], None, "m")


def _make_images(root):
    """One image per Pillow mode family, each a solid color; returns (id, expected RGB) pairs."""
    made = []

    def add(name, img, rgb):
        img.save(root / name)
        made.append((name, rgb))

    add("rgb.png", Image.new("RGB", (40, 30), (200, 10, 10)), (200, 10, 10))
    add("grey.png", Image.new("L", (28, 28), 90), (90, 90, 90))
    add("rgba.png", Image.new("RGBA", (50, 50), (0, 0, 255, 255)), (0, 0, 255))
    pal = Image.new("P", (20, 20), 1)
    pal.putpalette([0, 0, 0, 10, 200, 30] + [0] * 762)
    add("palette.png", pal, (10, 200, 30))
    wide = np.full((16, 16), 40000, dtype=np.uint16)
    wide[0, 0] = 0  # min-max stretch: 40000 of [0, 40000] -> 255
    add("deep16.png", Image.fromarray(wide), (255, 255, 255))
    add("cmyk.jpg", Image.new("CMYK", (300, 200), (0, 0, 0, 0)), (255, 255, 255))
    add("bits.png", Image.new("1", (10, 10), 1), (255, 255, 255))
    add("big.jpg", Image.new("RGB", (900, 600), (30, 120, 60)), (30, 120, 60))
    return made


def test_contact_sheet_is_a_png_with_one_tile_per_image(tmp_path):
    made = _make_images(tmp_path)
    rows = [{"id": name, "score": 1.0 - i / 10, "rank": i + 1} for i, (name, _) in enumerate(made)]
    rows.append({"id": "missing.png", "score": 0.01, "rank": len(rows) + 1})
    out = tmp_path / "sheet.png"
    tile = 64
    failed = contact_sheet(rows, str(tmp_path), str(out), tile=tile, columns=4)
    assert failed == ["missing.png"]

    cols, nrows, cell_w, cell_h = sheet_layout(len(rows), tile, 4)
    assert (cols, nrows) == (4, 3)
    with Image.open(out) as sheet:
        assert sheet.format == "PNG"
        assert sheet.size == (cols * cell_w, nrows * cell_h)
        sheet = sheet.convert("RGB")
        for i, (_, rgb) in enumerate(made):  # the tile's centre shows image i's color
            x = (i % cols) * cell_w + PAD + tile // 2
            y = (i // cols) * cell_h + PAD + tile // 2
            got = sheet.getpixel((x, y))
            assert max(abs(g - e) for g, e in zip(got, rgb)) <= 3, (i, got, rgb)
        # the caption area under each used cell has dark text pixels; unused cells are blank
        for i in range(cols * nrows):
            x0, y0 = (i % cols) * cell_w, (i // cols) * cell_h
            caption = np.asarray(sheet.crop((x0, y0 + PAD + tile, x0 + cell_w, y0 + cell_h)))
            assert (caption.min() < 100) == (i < len(rows)), i


def test_contact_sheet_single_image_size(tmp_path):
    Image.new("RGB", (5, 5), (1, 2, 3)).save(tmp_path / "one.png")
    out = tmp_path / "one_sheet.png"
    assert contact_sheet([{"id": "one.png", "score": 0.5}], str(tmp_path), str(out), tile=32) == []
    cols, nrows, cell_w, cell_h = sheet_layout(1, 32)
    with Image.open(out) as sheet:
        assert sheet.size == (cell_w, cell_h) and (cols, nrows) == (1, 1)
        assert cell_w == 32 + 2 * PAD
