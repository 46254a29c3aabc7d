"""`alcli review` of a detection pool (alcli.tasks.detection: given_boxes, review_rows, match,
review_own): the matching on a case computed by hand, the command's table against an independent
matching of the detector's own predictions (torchvision's box_iou, every pair) and the gradient
norm at the given boxes against the per-image loop, the ranking, the Label Studio hand-off, and
bad input in one sentence."""
from __future__ import annotations

import csv
import json

import numpy as np
import pytest
import torch
from PIL import Image

from alcli.tasks import detection
from test_detection import CLI_ARCH, CLI_KWARGS, oracle_norm
from test_review import read, run
from cli_errors import assert_one_error

torchvision = pytest.importorskip("torchvision")

THRESHOLD = 0.3  # the random detector's dog boxes score about 0.5: drawn; its cat boxes not
ARGS = ["--arch", CLI_ARCH, "--arch-kwargs", json.dumps(CLI_KWARGS), "--class-names", "names.txt",
        "--box-threshold", str(THRESHOLD), "-q"]


def test_matching_by_hand():
    """IoU >= 0.5 and the same class match, greedy by score; the rest by IoU alone disagree on
    the class; the score as documented (docs/review.md#detection)."""
    assert detection.iou([0, 0, 10, 10], [5, 0, 15, 10]) == pytest.approx(50 / 150)
    assert detection.iou([0, 0, 10, 10], [0, 0, 10, 5]) == pytest.approx(50 / 100)
    given = [[0, 0, 10, 10, 1],      # A: P1 covers half of it (IoU 0.5, its class): matched
             [20, 20, 30, 30, 1],    # B: P2 on it exactly, another class: mismatched
             [40, 40, 50, 50, 2],    # C: P3 of its class at IoU 0.4: spurious (P4, 0.9, below 0.5)
             [80, 80, 90, 90, 1]]    # D: P6 (0.95) and P7 (0.55) both fit: P6 takes it
    preds = [[0, 0, 10, 5, 1, 0.9], [20, 20, 30, 30, 2, 0.8], [40, 40, 50, 44, 2, 0.7],
             [40, 40, 50, 49, 2, 0.3], [60, 60, 70, 70, 1, 0.6], [80, 80, 90, 89, 1, 0.55],
             [80, 80, 90, 90, 1, 0.95]]
    m = detection.match(given, preds, 0.5)
    assert m["spurious"] == [given[2]]
    assert sorted(map(tuple, m["missed"])) == sorted(map(tuple, [preds[2], preds[4], preds[5]]))
    assert m["mismatched"] == [[given[1], preds[1]]]
    # missed 0.7 + 0.6 + 0.55, mismatched 0.8, spurious C: 1 - 0.3 (P4: its class, IoU 0.9)
    assert m["score"] == pytest.approx(0.7 + 0.6 + 0.55 + 0.8 + (1 - 0.3))
    [row] = detection.review_own([[[given, preds, 0.5, 100, 100]]], ["bg", "cat", "dog"])
    assert (row["spurious"], row["missed"], row["mismatched"], row["flagged"]) == (1, 3, 1, True)
    assert row["label"] == "cat|dog" and row["pred"] == "cat|dog"
    assert json.loads(row["spurious_boxes"]) == [given[2]]
    [clean] = detection.review_own([[[given[:1], preds[:1], 0.5, 100, 100]]], None)
    assert (clean["flagged"], clean["score"]) == (False, 0.0)


# --- the command, with a random Faster R-CNN --------------------------------------------------------

def oracle_match(given: list, preds: list, threshold: float) -> dict:
    """The documented matching, written again over torchvision's IoU matrix."""
    drawn = [p for p in preds if p[5] >= threshold]
    g = torch.tensor([b[:4] for b in given], dtype=torch.float64).reshape(-1, 4)
    d = torch.tensor([b[:4] for b in drawn], dtype=torch.float64).reshape(-1, 4)
    overlap = torchvision.ops.box_iou(g, d)  # [G, D]

    def pairs(gs, ds, same):
        taken, out = set(), []
        for j in sorted(ds, key=lambda j: -drawn[j][5]):
            fits = [i for i in gs if i not in taken and overlap[i, j] >= 0.5
                    and (not same or given[i][4] == drawn[j][4])]
            if fits:
                i = max(fits, key=lambda i: (float(overlap[i, j]), -i))
                taken.add(i)
                out.append((i, j))
        return out

    same = pairs(range(len(given)), range(len(drawn)), True)
    gs = [i for i in range(len(given)) if i not in {i for i, _ in same}]
    ds = [j for j in range(len(drawn)) if j not in {j for _, j in same}]
    cross = pairs(gs, ds, False)
    spurious = [i for i in gs if i not in {i for i, _ in cross}]
    missed = [j for j in ds if j not in {j for _, j in cross}]
    score = sum(drawn[j][5] for j in missed) + sum(drawn[j][5] for _, j in cross)
    for i in spurious:
        seen = [p[5] for p in preds if p[4] == given[i][4] and
                float(torchvision.ops.box_iou(g[i:i + 1], torch.tensor([p[:4]], dtype=torch.float64))) >= 0.5]
        score += 1 - max(seen, default=0.0)
    return {"spurious": len(spurious), "missed": len(missed), "mismatched": len(cross), "score": score}


@pytest.fixture(scope="module")
def dws(tmp_path_factory):
    """Five images of different sizes and a random detector that draws dogs only; given boxes:
    `own`, its own drawn boxes (nothing to flag); `none`, no box; `flip`, its boxes given as
    cats; `odd`, a box where it draws none and one of its own; `unlabeled`, no cell."""
    root = tmp_path_factory.mktemp("detreview")
    rng = np.random.default_rng(0)
    torch.manual_seed(0)
    model = torchvision.models.get_model(CLI_ARCH.split(":")[1], weights=None, weights_backbone=None,
                                         **CLI_KWARGS).eval()
    with torch.no_grad():  # class 1 (cat) scored far below the threshold: its boxes not drawn
        model.roi_heads.box_predictor.cls_score.bias[1] -= 3.0
    torch.save(model.state_dict(), root / "det.pt")
    (root / "names.txt").write_text("background\ncat\ndog\n")
    sizes = {"own": (60, 80), "none": (50, 50), "flip": (70, 40), "odd": (40, 64), "unlabeled": (30, 30)}
    images, preds = {}, {}
    for id_, (h, w) in sizes.items():
        Image.fromarray((rng.random((h, w, 3)) * 255).astype(np.uint8)).save(root / f"{id_}.png")
        images[id_] = torch.from_numpy(np.array(Image.open(root / f"{id_}.png"))).permute(2, 0, 1).float() / 255
        with torch.no_grad():
            found = model([images[id_]])[0]
        preds[id_] = [[*b, c, s] for b, c, s in zip(found["boxes"].tolist(), found["labels"].tolist(),
                                                   found["scores"].tolist())]
    mine = lambda id_: [p[:5] for p in preds[id_] if p[5] >= THRESHOLD]
    assert mine("own") and mine("flip") and mine("odd")
    given = {"own": mine("own"), "none": [],
             "flip": [[*p[:4], 1] for p in mine("flip")],
             "odd": [[1.0, 1.0, 3.0, 3.0, "cat"], mine("odd")[0]], "unlabeled": None}
    with open(root / "m.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["id", "path", "boxes"])
        for id_, boxes in given.items():
            w.writerow([id_, f"{id_}.png", "" if boxes is None else json.dumps(boxes)])
    res = run(root, "review", "m.csv", "-m", "det.pt", *ARGS, "-o", "r.csv")
    assert res.exit_code == 0, res.stderr
    given["odd"][0][4] = 1  # "cat", by name in the manifest
    return root, model, images, preds, given, read(root / "r.csv")


def test_the_table_against_an_independent_matching(dws):
    root, model, images, preds, given, table = dws
    assert sorted(table) == ["flip", "none", "odd", "own"]  # `unlabeled` left out
    for id_, row in table.items():
        want = oracle_match(given[id_], preds[id_], THRESHOLD)
        got = {k: int(row[k]) for k in ("spurious", "missed", "mismatched")}
        assert got == {k: want[k] for k in got}, id_
        assert float(row["score"]) == pytest.approx(want["score"], rel=1e-6, abs=1e-9), id_
        assert row["flagged"] == str(any(got.values())), id_
        assert [b[:5] for b in json.loads(row["label_boxes"])] == \
            [[*map(float, b[:4]), b[4]] for b in given[id_]], id_
        assert len(json.loads(row["boxes"])) == sum(p[5] >= THRESHOLD for p in preds[id_])
        counts = [len(json.loads(row[f"{k}_boxes"])) for k in ("spurious", "missed", "mismatched")]
        assert counts == list(got.values()), id_
    assert table["own"]["flagged"] == "False" and float(table["own"]["score"]) == 0.0
    assert int(table["none"]["missed"]) == len(json.loads(table["none"]["boxes"])) > 0
    assert int(table["flip"]["mismatched"]) == len(given["flip"]) > 0
    assert {p[4] for p in preds["own"] if p[5] >= THRESHOLD} == {2}
    assert int(table["odd"]["spurious"]) >= 1  # the tiny box nothing draws
    assert table["odd"]["label"] == "|".join(["background", "cat", "dog"][c] for c in
                                             sorted({1, given["odd"][1][4]}))
    meta = json.loads((root / "r.csv.meta.json").read_text())
    assert meta["task"] == "detection" and meta["unlabeled"] == 1


def test_ranked_by_the_image_score(dws):
    table = dws[-1]
    ranked = sorted(table.values(), key=lambda r: int(r["rank"]))
    scores = [float(r["score"]) for r in ranked]
    assert scores == sorted(scores, reverse=True) and ranked[-1]["id"] == "own"


def test_gradnorm_at_the_given_boxes_is_the_per_image_loop(dws):
    root, model, images, preds, given, table = dws
    for id_, row in table.items():
        boxes = given[id_]
        want = oracle_norm(model, images[id_], [b[:4] for b in boxes], [b[4] for b in boxes],
                           detection.image_seed(0, id_), torch.float32)
        assert float(row["gradnorm"]) == pytest.approx(want, rel=1e-4), id_


def test_hand_off_gives_the_given_boxes_to_verify_and_the_models_as_prediction(dws):
    root, model, images, preds, given, table = dws
    res = run(root, "select", "r.csv", "-n", "4", "-f", "labelstudio", "--class-names", "names.txt",
              "-q", "-o", "t.json")
    assert res.exit_code == 0, res.stderr
    names = ["background", "cat", "dog"]
    for task in json.loads((root / "t.json").read_text()):
        id_ = task["data"]["alcli_id"]
        w, h = (int(table[id_][k]) for k in ("width", "height"))
        drawn = [p for p in preds[id_] if p[5] >= THRESHOLD]
        predicted = task["predictions"][0]["result"]
        assert sorted(r["value"]["rectanglelabels"][0] for r in predicted) == \
            sorted(names[p[4]] for p in drawn)
        if not given[id_]:
            assert "annotations" not in task  # nothing given to verify
            continue
        verify = task["annotations"][0]["result"]
        assert [r["value"]["rectanglelabels"][0] for r in verify] == [names[b[4]] for b in given[id_]]
        for r, b in zip(verify, given[id_]):
            x0, y0 = max(b[0], 0.0), max(b[1], 0.0)
            assert (r["value"]["x"], r["value"]["y"]) == pytest.approx((100 * x0 / w, 100 * y0 / h))
            assert r["value"]["width"] == pytest.approx(100 * (min(b[2], w) - x0) / w)


def test_bad_input_is_one_sentence(dws, tmp_path):
    root = dws[0]
    Image.new("RGB", (20, 20)).save(tmp_path / "a.png")
    args = ["-m", root / "det.pt", *ARGS[:-1], "--class-names", root / "names.txt", "-q", "-o", "x.csv"]
    (tmp_path / "plain.csv").write_text("id,path,boxes\na,a.png,\n")
    assert_one_error(run(tmp_path, "review", "plain.csv", *args), "has no labels", "no boxes")
    (tmp_path / "nobox.csv").write_text("id,path\na,a.png\n")
    assert_one_error(run(tmp_path, "review", "nobox.csv", *args), "has no labels", "no boxes column")
    (tmp_path / "bad.csv").write_text('id,path,boxes\na,a.png,"[[5,5,2,9,1]]"\n')
    assert_one_error(run(tmp_path, "review", "bad.csv", *args), "manifest bad.csv line 2: box 1",
                     "a box that ends before it starts")
    (tmp_path / "wolf.csv").write_text('id,path,boxes\na,a.png,"[[1,1,9,9,""wolf""]]"\n')
    assert_one_error(run(tmp_path, "review", "wolf.csv", *args), "line 2: box 1", "a class not named")
    (tmp_path / "text.csv").write_text('id,path,boxes\na,a.png,cat\n')
    assert_one_error(run(tmp_path, "review", "text.csv", *args), "is not a JSON list", "not JSON")
    assert not (tmp_path / "x.csv").exists()
    # score still refuses the given boxes (it scores at the predicted ones), and points to review
    res = run(root, "score", "m.csv", "-m", "det.pt", *ARGS, "-s", "gradnorm", "-o", "s.csv")
    assert_one_error(res, "or check the boxes with alcli review", "score given boxes")


@pytest.mark.parametrize("task", ["instance-segmentation", "keypoints"])
def test_instance_and_keypoint_labels_are_refused_in_one_sentence(tmp_path, task):
    """A Mask R-CNN's or a keypoint R-CNN's pool is not reviewed (its loss at the given labels
    needs their masks or keypoints): one sentence, with a boxes column or without, nothing
    written."""
    import test_instances
    import test_keypoints
    arch, kwargs = (("maskrcnn_resnet50_fpn", test_instances.SMALL) if task == "instance-segmentation"
                    else ("keypointrcnn_resnet50_fpn", test_keypoints.SMALL))
    torch.manual_seed(0)
    model = torchvision.models.get_model(arch, weights=None, weights_backbone=None, **kwargs).eval()
    torch.save(model.state_dict(), tmp_path / "m.pt")
    Image.new("RGB", (40, 30)).save(tmp_path / "a.png")
    # (one manifest each, the model is slow to build: with a boxes column, and without)
    manifest = ('id,path,boxes\na,a.png,"[[1, 2, 10, 12, 1]]"\n' if task == "keypoints"
                else "id,path\na,a.png\n")
    (tmp_path / "m.csv").write_text(manifest)
    parts = "masks" if task == "instance-segmentation" else "keypoints"
    res = run(tmp_path, "review", "m.csv", "-m", "m.pt", "--arch", f"torchvision:{arch}",
              "--arch-kwargs", json.dumps(kwargs), "-q", "-o", "r.csv")
    assert_one_error(res, f"alcli review does not check {task} labels: its loss at the given "
                     f"labels needs their {parts}", manifest)
    assert not (tmp_path / "r.csv").exists()
