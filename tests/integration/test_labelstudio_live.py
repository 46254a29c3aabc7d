"""`alcli push` and `alcli pull` against the real Label Studio server (tests/label_studio_server.py): three rounds of
score (--exclude what is labeled) -> push -> annotate over the API (one task's pre-labels
accepted, one changed, one skipped) -> pull, for classification, detection and segmentation; no
task is ever duplicated, the pulled labels equal what was submitted, and brush masks are checked
against Label Studio's own run-length codec (its SDK, in the server's environment).
"""
from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from typer.testing import CliRunner

from alcli.cli import app

pytestmark = pytest.mark.labelstudio
REPO = Path(__file__).resolve().parents[2]
NAMES = ["background", "cat", "dog", "bird"]  # torchvision's class 0 first
ROOT = "http://images.example/"
runner = CliRunner()


def log(msg: str) -> None:
    print(f"[labelstudio {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def run(cwd: Path, *args, code: int = 0, token: str | None = None):
    old = os.getcwd()
    os.chdir(cwd)
    try:
        result = runner.invoke(app, [str(a) for a in args], env={"LABEL_STUDIO_API_KEY": token})
    finally:
        os.chdir(old)
    assert result.exit_code == code, result.stderr + result.stdout
    return result


def tasks_of(server, title: str) -> list[dict]:
    project = next(p for p in server.call("GET", "/api/projects?page_size=100")["results"]
                   if p["title"] == title)
    return server.call("GET", f"/api/tasks?project={project['id']}&fields=all&page_size=100")["tasks"]


def read_csv(path: Path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def sdk(server, script: str, payload):
    """Run `script` in the server's Python (its SDK), `payload` on stdin as JSON -> its JSON out."""
    done = subprocess.run([str(server.python), "-c", "import json, sys\n" + script],
                          input=json.dumps(payload), capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": ""}, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)


# --- the three tasks: a pool scored each round, and an annotator's answer to each pre-label ------

def classification_round(tmp: Path, exclude: list[str]) -> list[str]:
    """`alcli score` of a 24-image slice of the demo pool with the demo model -> scores.csv."""
    if not (tmp / "pool").is_dir():
        for k, path in enumerate(sorted((REPO / "data/demo/pool").rglob("*.png"))[::16][:24]):
            (tmp / "pool" / path.parent.name).mkdir(parents=True, exist_ok=True)
            shutil.copy(path, tmp / "pool" / path.parent.name / path.name)
        (tmp / "names.txt").write_text("".join(f"digit {d}\n" for d in range(10)))
    run(tmp, "score", "pool", "--model", REPO / "data/demo/model.pt", "--arch", "alcli.demo:DigitsCNN",
        "--arch-kwargs", '{"num_classes": 10}', "--normalize", "0.3/0.4", "--strategy", "margin",
        "--class-names", "names.txt", "-o", "scores.csv", "-q",
        *[a for f in exclude for a in ("--exclude", f)])
    return ["scores.csv", "--class-names", "names.txt"]


def detection_round(tmp: Path, exclude: list[str]) -> list[str]:
    """`alcli score` of twelve random images with a small untrained torchvision detector."""
    if not (tmp / "imgs").is_dir():
        import torch
        import torchvision
        rng = np.random.default_rng(0)
        (tmp / "imgs").mkdir()
        for i in range(12):
            h, w = 48 + 4 * (i % 3), 64 + 8 * (i % 4)  # as changed() knows them
            Image.fromarray((rng.random((h, w, 3)) * 255).astype(np.uint8)).save(tmp / "imgs" / f"{i:02d}.png")
        torch.manual_seed(0)
        model = torchvision.models.get_model("fasterrcnn_mobilenet_v3_large_320_fpn", weights=None,
                                             weights_backbone=None, num_classes=4, min_size=64,
                                             max_size=96)
        torch.save(model.state_dict(), tmp / "det.pt")
        (tmp / "names.txt").write_text("\n".join(NAMES) + "\n")
    run(tmp, "score", "imgs", "--model", "det.pt", "--arch",
        "torchvision:fasterrcnn_mobilenet_v3_large_320_fpn", "--arch-kwargs",
        '{"num_classes": 4, "min_size": 64, "max_size": 96}', "--strategy", "entropy",
        "--box-threshold", "0.05", "--class-names", "names.txt", "-o", "scores.csv", "-q",
        *[a for f in exclude for a in ("--exclude", f)])
    return ["scores.csv"]


def segmentation_round(tmp: Path, exclude: list[str]) -> list[str]:
    """`alcli score` of twelve random images of different sizes with a tiny untrained U-Net, which
    writes each row's predicted mask at its image's size (scores.csv.masks/, pred_mask)."""
    if not (tmp / "seg").is_dir():
        import torch
        import task_models as tm
        rng = np.random.default_rng(0)
        (tmp / "seg").mkdir()
        for i, (h, w) in enumerate(SIZES):
            Image.fromarray((rng.random((h, w, 3)) * 255).astype(np.uint8)).save(tmp / "seg" / f"{i:02d}.png")
        torch.manual_seed(0)
        torch.save(tm.warm_bn(tm.TinyUNet(classes=len(NAMES))).state_dict(), tmp / "seg.pt")
        (tmp / "names.txt").write_text("\n".join(NAMES) + "\n")
    run(tmp, "score", "seg", "--model", "seg.pt", "--arch", "task_models:TinyUNet", "--trust-checkpoint",
        "--arch-kwargs", json.dumps({"classes": len(NAMES)}), "--resize", "32x32", "--task",
        "segmentation", "--strategy", "entropy", "--class-names", "names.txt", "-o", "scores.csv", "-q",
        *[a for f in exclude for a in ("--exclude", f)])
    return ["scores.csv", "--class-names", "names.txt"]


def pred_masks(tmp: Path) -> dict[str, np.ndarray]:
    """alcli id -> the predicted mask `score` wrote for it (every round's rows)."""
    return {p.name[:2] + ".png": np.array(Image.open(p)) for p in (tmp / "scores.csv.masks").glob("*.png")}


def changed(task: str, result: list[dict], k: int, masks: list) -> list[dict]:
    """An annotator's edit of a pre-label: another class, a box of its own, a mask of its own."""
    if task == "classification":
        new = json.loads(json.dumps(result[0]))
        new["value"]["choices"] = ["digit 7" if new["value"]["choices"] != ["digit 7"] else "digit 1"]
        return [new]
    if task == "detection":
        w, h = 64 + 8 * (k % 4), 48 + 4 * (k % 3)  # image k's size (detection_round)
        return [{"id": f"drawn{k}", "type": "rectanglelabels", "from_name": "label",
                 "to_name": "image", "original_width": w, "original_height": h, "image_rotation": 0,
                 "value": {"x": 12.5, "y": 25.0, "width": 50.0, "height": 37.5, "rotation": 0,
                           "rectanglelabels": ["dog"]}}]
    h, w = masks[k]["shape"]  # [H, W]
    return [{"id": f"painted{k}", "type": "brushlabels", "from_name": "label", "to_name": "image",
             "original_width": w, "original_height": h, "image_rotation": 0,
             "value": {"format": "rle", "rle": masks[k]["rle"], "brushlabels": ["bird"]}}]


def expected(task: str, result: list[dict], tmp: Path, alcli_id: str, masks_by_id: dict) -> dict:
    """The labels file's cells for a submitted result, computed here (not by alcli)."""
    if task == "classification":
        return {"label": result[0]["value"]["choices"][0]}
    if task == "detection":
        boxes = []
        for r in result:
            v, w, h = r["value"], r["original_width"], r["original_height"]
            boxes.append([v["x"] * w / 100, v["y"] * h / 100, (v["x"] + v["width"]) * w / 100,
                          (v["y"] + v["height"]) * h / 100, NAMES.index(v["rectanglelabels"][0])])
        return {"boxes": boxes}
    return {"mask": masks_by_id[alcli_id]}


ROUNDS = {"classification": classification_round, "detection": detection_round,
          "segmentation": segmentation_round}


SIZES = [(30 + i, 40 + 2 * i) for i in range(12)]  # the segmentation images' (height, width)


def painted_masks(server) -> list[dict]:
    """An annotator's brush for each segmentation image (its class: bird), encoded by Label
    Studio's SDK (not alcli): {shape, rle, mask}."""
    masks = []
    for k, shape in enumerate(SIZES):
        m = np.zeros(shape, np.uint8)
        m[1:8, 2 + k % 5:20] = 255
        masks.append(m)
    rles = sdk(server, "from label_studio_sdk.converter.brush import encode_rle\nimport numpy as np\n"
               "print(json.dumps([[int(b) for b in encode_rle(np.repeat(np.array(m, np.uint8)"
               ".reshape(-1), 4))] for m in json.load(sys.stdin)]))", [m.tolist() for m in masks])
    return [{"shape": m.shape, "rle": r, "mask": np.where(m > 0, NAMES.index("bird"), 0)}
            for m, r in zip(masks, rles)]


@pytest.mark.parametrize("task", list(ROUNDS))
def test_three_rounds_of_push_annotate_pull(server, tmp_path, task):
    t0 = time.monotonic()
    title = f"live {task}"
    push = ["-p", title, "--url", server.base, "--image-root", ROOT]
    masks = painted_masks(server) if task == "segmentation" else []
    exclude: list[str] = []
    submitted: dict[str, list] = {}   # alcli id -> the result submitted
    skipped: set[str] = set()
    masks_by_id: dict[str, np.ndarray] = {}
    pushed_ids: list[str] = []
    for round_ in range(3):
        source = ROUNDS[task](tmp_path, exclude)
        first = run(tmp_path, "push", *source, "-n", 3, *push, "--setup", token=server.token)
        assert "3 new, 0 updated" in first.stderr
        again = run(tmp_path, "push", *source, "-n", 3, *push, token=server.token)
        assert "0 new, 0 updated, 3 unchanged" in again.stderr  # as pushed: no call made
        stored = tasks_of(server, title)
        ids = [t["data"]["alcli_id"] for t in stored]
        assert len(ids) == len(set(ids)) == 3 * (round_ + 1)  # never a task twice
        assert all(len(t["predictions"]) == 1 for t in stored)
        fresh = sorted((t for t in stored if not t["annotations"]),
                       key=lambda t: -t["data"]["alcli_score"])
        assert len(fresh) == 3 and not {t["data"]["alcli_id"] for t in fresh} & set(pushed_ids)
        pushed_ids += [t["data"]["alcli_id"] for t in fresh]
        # one accepted as pre-labelled, one changed, one skipped
        for n, t in enumerate(fresh):
            alcli_id, result = t["data"]["alcli_id"], t["predictions"][0]["result"]
            if n == 2:
                server.call("POST", f"/api/tasks/{t['id']}/annotations",
                            {"result": [], "was_cancelled": True})
                skipped.add(alcli_id)
                continue
            k = int(alcli_id[-6:-4])  # the image's number
            answer = result if n == 0 else changed(task, result, k, masks)
            if task == "segmentation":
                masks_by_id[alcli_id] = masks[k]["mask"] if n == 1 else pred_masks(tmp_path)[alcli_id]
            server.call("POST", f"/api/tasks/{t['id']}/annotations", {"result": answer})
            submitted[alcli_id] = answer
        run(tmp_path, "pull", "-p", title, "-o", "labels.csv", "--url", server.base,
            *(["--class-names", "names.txt"] if task != "classification" else []), token=server.token)
        exclude = ["labels.csv", "labels.skipped.csv"]
        pulled = {r["id"]: r for r in read_csv(tmp_path / "labels.csv")}
        assert set(pulled) == set(submitted)
        assert {r["id"] for r in read_csv(tmp_path / "labels.skipped.csv")} == skipped
        for alcli_id, result in submitted.items():
            want, got = expected(task, result, tmp_path, alcli_id, masks_by_id), pulled[alcli_id]
            if task == "classification":
                assert got["label"] == want["label"]
            elif task == "detection":
                boxes = json.loads(got["boxes"])
                assert len(boxes) == len(want["boxes"])
                for a, b in zip(boxes, want["boxes"]):
                    assert a[4] == b[4] and a[:4] == pytest.approx(b[:4], abs=1e-6)
            else:
                assert np.array_equal(np.array(Image.open(tmp_path / got["mask"])), want["mask"])
        if task == "detection":  # the same boxes in labels.coco.json, as pycocotools reads them
            from pycocotools.coco import COCO
            coco = COCO(str(tmp_path / "labels.coco.json"))
            image_ids = {img["file_name"]: img["id"] for img in coco.dataset["images"]}
            for alcli_id, result in submitted.items():
                want = [(b[4], [b[0], b[1], b[2] - b[0], b[3] - b[1]])
                        for b in expected(task, result, tmp_path, alcli_id, masks_by_id)["boxes"]]
                got = [(a["category_id"], a["bbox"]) for a in
                       coco.loadAnns(coco.getAnnIds(imgIds=[image_ids[alcli_id]]))] if want else []
                assert len(got) == len(want)
                for (c, box), (wc, wbox) in zip(sorted(got), sorted(want)):
                    assert c == wc and box == pytest.approx(wbox, abs=1e-6)
    if task == "segmentation":  # alcli's brush pre-labels, read by Label Studio's own decoder
        regions = [(t["data"]["alcli_id"], r) for t in tasks_of(server, title)
                   for r in t["predictions"][0]["result"]]
        decoded = sdk(server, "from label_studio_sdk.converter.brush import decode_rle\n"
                      "print(json.dumps([(decode_rle(r['value']['rle']).reshape(r['original_height'], "
                      "r['original_width'], 4)[:, :, 3] > 0).tolist() for _, r in json.load(sys.stdin)]))",
                      regions)
        predicted = pred_masks(tmp_path)
        classes = [set(np.unique(predicted[i])) - {0} for i in {i for i, _ in regions}]
        assert len(regions) == sum(len(c) for c in classes) > 9  # a region per class painted
        for (alcli_id, r), painted in zip(regions, decoded):
            m = predicted[alcli_id]
            assert m.shape == SIZES[int(alcli_id[:2])]  # at the image's own size
            assert np.array_equal(np.array(painted), m == NAMES.index(r["value"]["brushlabels"][0]))
    log(f"{task}: 3 rounds, {len(pushed_ids)} tasks pushed, {len(submitted)} labels and "
        f"{len(skipped)} skipped pulled ({time.monotonic() - t0:.1f} s)")


def test_a_refused_token_a_missing_project_a_config_of_another_task_are_one_sentence(server, tmp_path):
    (tmp_path / "t.csv").write_text("id,score,pred\na.png,1.0,cat\n")
    result = run(tmp_path, "push", "t.csv", "-p", "any", "--url", server.base, "--image-root", ROOT,
                 code=1, token="not-the-token-0123456789")
    assert result.stderr.count("\n") == 1 and "refused the token (401)" in result.stderr
    assert "not-the-token" not in result.stderr + result.stdout
    # a project whose config is for another task: classification rows to a box project
    (tmp_path / "d.csv").write_text('id,score,boxes,width,height\na.png,1.0,"[[1, 2, 3, 4, 1, 0.5]]",8,8\n')
    (tmp_path / "n.txt").write_text("background\ncat\n")
    run(tmp_path, "push", "d.csv", "-p", "boxes only", "--setup", "--class-names", "n.txt", "--url",
        server.base, "--image-root", ROOT, token=server.token)
    result = run(tmp_path, "push", "t.csv", "-p", "boxes only", "--url", server.base, "--image-root", ROOT,
                 code=1, token=server.token)
    assert result.stderr.count("\n") == 1 and "does not fit classification pre-labels: they need " \
        "<Choices name=\"label\" toName=\"image\"> and its control 'label' is <RectangleLabels" in result.stderr
    # a personal access token (a JWT, Label Studio's default) works; one with a bad signature is refused
    pat = server.call("POST", "/api/token/", {})["token"]
    run(tmp_path, "pull", "-p", "boxes only", "-o", "l.csv", "--url", server.base, token=pat)
    assert [r["id"] for r in read_csv(tmp_path / "l.csv")] == []
    head, claims, signature = pat.split(".")
    forged = ".".join((head, claims, signature[::-1]))
    result = run(tmp_path, "pull", "-p", "boxes only", "-o", "l.csv", "--url", server.base, code=1,
                 token=forged)
    assert result.stderr.count("\n") == 1 and "refused the token (401)" in result.stderr
    assert signature not in result.stderr and claims not in result.stderr
    result = run(tmp_path, "pull", "-p", "nothing here", "-o", "l.csv", "--url", server.base, code=1,
                 token=server.token)
    assert result.stderr == (f"alcli: error: Label Studio at {server.base} has no project "
                             f"'nothing here'\n")


def test_three_pushes_at_once_add_one_task_per_id(server, tmp_path):
    """Issue 47 (R3-12): pushes of one batch running at the same time on one machine list and
    import in turn, so the project holds each id once, each with its prediction."""
    ids = [f"{d}/{k:03d}.png" for d in range(4) for k in range(100)]  # 400, as R3-12 pushed
    (tmp_path / "t.csv").write_text("id,score,pred\n" + "".join(
        f"{i},{1 - n / 1000},digit {n % 3}\n" for n, i in enumerate(ids)))
    (tmp_path / "names.txt").write_text("digit 0\ndigit 1\ndigit 2\n")
    base = ["t.csv", "-p", "race", "--class-names", "names.txt", "--url", server.base,
            "--image-root", ROOT]
    run(tmp_path, "push", *base, "-n", "1", "--setup", token=server.token)
    env = {**os.environ, "LABEL_STUDIO_API_KEY": server.token}
    pushes = [subprocess.Popen([sys.executable, "-m", "alcli", "push", *base], cwd=tmp_path, env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
              for _ in range(3)]
    for p in pushes:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
    tasks = server.call("GET", "/api/tasks?project=" + str(next(
        p["id"] for p in server.call("GET", "/api/projects?page_size=100")["results"]
        if p["title"] == "race")) + "&fields=all&page_size=1000")["tasks"]
    assert sorted(t["data"]["alcli_id"] for t in tasks) == sorted(ids)
    assert all(len(t["predictions"]) == 1 for t in tasks)
    # a push whose scores changed for 5 rows updates those 5 tasks' predictions alone
    text = (tmp_path / "t.csv").read_text().splitlines()
    text[1:6] = [line.replace(",1.0,", ",2.0,", 1) if ",1.0," in line else
                 line.replace(",0.", ",1.", 1) for line in text[1:6]]
    (tmp_path / "t.csv").write_text("\n".join(text) + "\n")
    again = run(tmp_path, "push", *base, token=server.token)
    assert "0 new, 5 updated, 395 unchanged" in again.stderr
    scores = {t["data"]["alcli_id"]: t["predictions"][0]["score"] for t in server.call(
        "GET", f"/api/tasks?project={tasks[0]['project']}&fields=all&page_size=1000")["tasks"]}
    assert [scores[i] for i in ids[:5]] == [2.0, 1.999, 1.998, 1.997, 1.996]


def test_images_a_server_does_not_serve_are_one_warning_saying_what_to_configure(server, tmp_path):
    """Issue 49 item 3: this server runs without LOCAL_FILES_SERVING_ENABLED, so --setup's Local
    Files storage is refused and the first task's image does not open: the push goes through with
    one warning naming what to configure (the docs' loop with local files served:
    test_labelstudio_docs_loop.py)."""
    (tmp_path / "t.csv").write_text("id,score,pred\n2/a.png,1.0,1\n")
    (tmp_path / "n.txt").write_text("zero\none\ntwo\n")
    (tmp_path / "pool" / "2").mkdir(parents=True)
    result = run(tmp_path, "push", "t.csv", "-p", "not served", "--setup", "--class-names", "n.txt",
                 "--url", server.base, "--image-root", f"{server.base}/data/local-files/?d=pool",
                 token=server.token)
    warning = [line for line in result.stderr.splitlines() if "does not open" in line]
    assert len(warning) == 1 and "1 new" in result.stderr, result.stderr
    assert "(it answered 403 Forbidden; Label Studio refused a Local Files storage" in warning[0]
    assert "LOCAL_FILES_SERVING_ENABLED=true and LOCAL_FILES_DOCUMENT_ROOT" in warning[0]
    assert server.token not in result.stderr
