"""A real Label Studio round trip: `alcli select -f labelstudio --labelstudio-config` for each task,
a Label Studio server on localhost (its own SQLite data folder), a project per task made from that
config, the tasks imported through its HTTP API, the pre-labels read back as the tasks' predictions
(and checked against the config by Label Studio's own SDK), two annotations submitted, the project
exported as JSON, and the export given to `alcli select --exclude`: the next batch leaves out
exactly the labeled examples.

The server (tests/label_studio_server.py) is shared with test_labelstudio_live.py; without a Label Studio
installation both skip.
"""
from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from alcli.cli import app

pytestmark = pytest.mark.labelstudio

NAMES = ["cat", "dog", "bird"]
TAGS = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"]
TEXTS = ["Ann Lee met Bob in Oslo", "  Paris   is far  ", "Zoë and Émile Zola live in São Paulo",
         "nobody here", "Bob", "Oslo and Bergen", "Lee Lee", "in New York City"]
runner = CliRunner()


def log(msg: str) -> None:
    print(f"[labelstudio {time.strftime('%H:%M:%S')}] {msg}", flush=True)


# --- alcli's side --------------------------------------------------------------------------------

def cli(cwd: Path, *args) -> str:
    old = os.getcwd()
    os.chdir(cwd)
    try:
        result = runner.invoke(app, [str(a) for a in args])
    finally:
        os.chdir(old)
    assert result.exit_code == 0, result.stderr + result.stdout
    return result.stdout


def _rows(task: str) -> list[dict]:
    """Eight hand-written rows of a table `alcli score` would write for `task` (best first)."""
    rows = []
    for i in range(8):
        row = {"rank": i + 1, "id": f"{task}/{i:02d}.png", "score": round(1.0 - i / 10, 3)}
        if task == "classification":
            row["pred"] = NAMES[i % 3]
        elif task == "multilabel":
            row["pred"] = "|".join(NAMES[k] for k in range(3) if (i >> k) & 1)
        elif task == "regression":
            row["pred"] = 0.25 * i - 1
        elif task == "detection":  # the detection contract: boxes in pixels, the image's size
            w, h = 320 + 16 * i, 240
            boxes = [[4.0 * k + i, 8.0 * k, 100.0 + 20 * k + i, 90.0 + 10 * k, 1 + (i + k) % 3,
                      0.9 - 0.2 * k] for k in range(i % 3)]
            row.update(boxes=json.dumps(boxes), width=w, height=h)
        elif task == "token-classification":
            words = TEXTS[i].split()
            tags = [("B-PER" if w in ("Ann", "Bob", "Zoë", "Émile", "Lee") else
                     "I-PER" if w in ("Lee", "Zola") else
                     "B-LOC" if w in ("Oslo", "Paris", "São", "New", "Bergen") else
                     "I-LOC" if w in ("Paulo", "York", "City") else "O") for w in words]
            row["id"] = f"t{i:02d}"
            row.update(pred="|".join(sorted(set(tags))), text=TEXTS[i], pred_words=json.dumps(tags))
        rows.append(row)
    return rows


def _write_table(folder: Path, task: str) -> Path:
    rows = _rows(task)
    columns = list(dict.fromkeys(k for r in rows for k in r))
    import csv
    table = folder / f"{task}.csv"
    with open(table, "w", newline="") as f:
        w = csv.DictWriter(f, columns)
        w.writeheader()
        w.writerows(rows)
    names = TAGS if task == "token-classification" else None if task == "regression" else \
        (["background", *NAMES] if task == "detection" else NAMES)
    meta = {"task": task, "class_names": names}
    if task == "token-classification":
        meta["pool_kind"] = "text"
    (folder / f"{task}.csv.meta.json").write_text(json.dumps(meta))
    return table


def _validate(server, config: str, predictions: list[dict]) -> list[list[str]]:
    """Label Studio's own SDK checks each prediction against the labeling config."""
    if not server.python.is_file():
        return [[] for _ in predictions]
    script = ("import json, sys\nfrom label_studio_sdk.label_interface import LabelInterface\n"
              "doc = json.load(sys.stdin)\nli = LabelInterface(doc['config'])\n"
              "print(json.dumps([li.validate_prediction(p, return_errors=True) for p in doc['predictions']]))")
    done = subprocess.run([str(server.python), "-c", script], input=json.dumps(
        {"config": config, "predictions": predictions}), capture_output=True, text=True,
        env={**os.environ, "PYTHONPATH": ""}, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)


def _edited(result: list[dict], task: str) -> list[dict]:
    """An annotator's change to a pre-label: another class, or one region fewer."""
    if not result:
        return result
    first = json.loads(json.dumps(result[0]))
    value = first["value"]
    if task == "classification":
        value["choices"] = ["bird" if value["choices"] != ["bird"] else "cat"]
    elif task == "multilabel":
        value["choices"] = value["choices"][:1]
    elif task == "regression":
        value["number"] += 1.0
    return [first] if task in ("classification", "multilabel", "regression") else result[1:]


TASKS = ["classification", "multilabel", "token-classification", "detection", "regression",
         "segmentation"]


@pytest.mark.parametrize("task", TASKS)
def test_round_trip(server, tmp_path, task):
    table = _write_table(tmp_path, task)
    round_trip(server, tmp_path, task, table, [r["id"] for r in _rows(task)])


def test_round_trip_of_a_real_detector(server, tmp_path):
    """`alcli score` with a torchvision detector, its boxes as pre-labels, the same round trip."""
    import numpy as np
    import torch
    import torchvision
    from PIL import Image
    rng = np.random.default_rng(0)
    (tmp_path / "imgs").mkdir()
    for i, (h, w) in enumerate([(60, 80), (50, 50), (70, 40), (64, 64), (48, 96), (60, 80)]):
        Image.fromarray((rng.random((h, w, 3)) * 255).astype(np.uint8)).save(tmp_path / "imgs" / f"{i}.png")
    kwargs = {"num_classes": 4, "min_size": 64, "max_size": 96}
    torch.manual_seed(0)
    model = torchvision.models.get_model("fasterrcnn_mobilenet_v3_large_320_fpn", weights=None,
                                         weights_backbone=None, **kwargs)
    torch.save(model.state_dict(), tmp_path / "det.pt")
    (tmp_path / "names.txt").write_text("background\n" + "\n".join(NAMES) + "\n")
    cli(tmp_path, "score", "imgs", "--model", "det.pt", "--arch",
        "torchvision:fasterrcnn_mobilenet_v3_large_320_fpn", "--arch-kwargs", json.dumps(kwargs),
        "--strategy", "gradnorm", "--box-threshold", "0.2", "--class-names", "names.txt",
        "-o", "scores.csv")
    import csv
    ranked = [r["id"] for r in csv.DictReader(open(tmp_path / "scores.csv"))]
    round_trip(server, tmp_path, "detection", tmp_path / "scores.csv", ranked)


def round_trip(server, tmp_path, task, table, ranked):
    """select -f labelstudio -> import -> predictions read back and valid -> two annotations ->
    export -> select --exclude gives the best four of the rest of `ranked` (the table's ids)."""
    t0 = time.monotonic()
    cli(tmp_path, "select", table, "-n", 4, "--no-diverse", "-f", "labelstudio", "-o", "tasks.json",
        "--labelstudio-config", "config.xml", "--image-root", "http://images.example/")
    tasks = json.loads((tmp_path / "tasks.json").read_text())
    config = (tmp_path / "config.xml").read_text()
    assert len(tasks) == 4

    project = server.call("POST", "/api/projects", {"title": f"alcli {task}", "label_config": config})
    imported = server.call("POST", f"/api/projects/{project['id']}/import", tasks)
    assert imported["task_count"] == 4 and imported["prediction_count"] == 4

    stored = server.call("GET", f"/api/tasks?project={project['id']}&fields=all&page_size=100")["tasks"]
    by_id = {t["data"]["alcli_id"]: t for t in stored}
    assert set(by_id) == {t["data"]["alcli_id"] for t in tasks}
    for sent in tasks:
        got = by_id[sent["data"]["alcli_id"]]
        assert len(got["predictions"]) == 1
        pred = got["predictions"][0]
        assert pred["result"] == sent["predictions"][0]["result"]
        assert pred["score"] == pytest.approx(sent["predictions"][0]["score"])
        assert pred["model_version"] == sent["predictions"][0]["model_version"]
        assert got["data"] == sent["data"]
    regions = sum(len(t["predictions"][0]["result"]) for t in tasks)
    if task != "segmentation":
        assert regions > 0
    errors = _validate(server, config, [{"result": by_id[t["data"]["alcli_id"]]["predictions"][0]["result"]}
                                        for t in tasks])
    assert errors == [[]] * 4

    # the first task's pre-labels accepted as they are, the third's changed; then export
    labeled = [tasks[0]["data"]["alcli_id"], tasks[2]["data"]["alcli_id"]]
    submitted = {}
    for n, alcli_id in enumerate(labeled):
        result = by_id[alcli_id]["predictions"][0]["result"]
        result = result if n == 0 else _edited(result, task)
        server.call("POST", f"/api/tasks/{by_id[alcli_id]['id']}/annotations", {"result": result})
        submitted[alcli_id] = result
    export = server.call("GET", f"/api/projects/{project['id']}/export?exportType=JSON")
    assert sorted(t["data"]["alcli_id"] for t in export) == sorted(labeled)
    for t in export:
        assert [a["result"] for a in t["annotations"]] == [submitted[t["data"]["alcli_id"]]]
    if task == "token-classification":
        for t in export:
            for region in t["annotations"][0]["result"]:
                v = region["value"]
                assert t["data"]["text"][v["start"]:v["end"]] == v["text"]
    (tmp_path / "export.json").write_text(json.dumps(export))

    # the next batch: the best four of what was not labeled
    following = cli(tmp_path, "select", table, "-n", 4, "--no-diverse", "-f", "ids",
                    "--exclude", "export.json").split()
    assert following == [i for i in ranked if i not in labeled][:4]
    log(f"{task}: {len(tasks)} tasks, {regions} pre-label regions imported and read back, "
        f"{len(labeled)} annotated, exported, next batch {following} "
        f"({time.monotonic() - t0:.1f} s)")
