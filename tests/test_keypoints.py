"""Keypoint detection (alcli.tasks.keypoints): torchvision's Keypoint R-CNN, its per-image loss and
gradient norm against an independent float64 per-image loop of the model's own training loss, its
Label Studio keypointlabels, and `alcli score` / `alcli select` on a folder of images."""
from __future__ import annotations

import copy
import csv
import json
import math
import xml.etree.ElementTree as ET

import numpy as np
import pytest
import torch
from PIL import Image

torchvision = pytest.importorskip("torchvision")

from alcli import tasks  # noqa: E402
from alcli.selection.export import labeling_config, to_labelstudio, unnamed  # noqa: E402
from alcli.tasks import detection, keypoints  # noqa: E402
from test_detection import rpn_labels_in_model_dtype  # noqa: E402
from shell import invoke_in  # noqa: E402

K = 3  # keypoints per instance
# few anchors, proposals and instances, so that a test is quick: the same loss otherwise
SMALL = {"num_classes": 2, "num_keypoints": K, "min_size": 64, "max_size": 96,
         "rpn_pre_nms_top_n_train": 50, "rpn_post_nms_top_n_train": 50, "rpn_pre_nms_top_n_test": 50,
         "rpn_post_nms_top_n_test": 50, "rpn_batch_size_per_image": 32, "box_batch_size_per_image": 8,
         "box_detections_per_img": 3}
THRESHOLD = 0.5
IDS = ["wide", "square"]
NAMES = ["nose", "left eye", "right eye"]


def build(dtype=torch.float64) -> torch.nn.Module:
    """keypointrcnn_resnet50_fpn without weights, its keypoint head narrowed (two 3x3 convolutions
    of 16 channels instead of eight of 512: the float64 loop would take minutes)."""
    from torchvision.models.detection.keypoint_rcnn import KeypointRCNNHeads, KeypointRCNNPredictor
    torch.manual_seed(0)
    model = torchvision.models.get_model("keypointrcnn_resnet50_fpn", weights=None, weights_backbone=None,
                                         **SMALL)
    model.roi_heads.keypoint_head = KeypointRCNNHeads(256, (16, 16))
    model.roi_heads.keypoint_predictor = KeypointRCNNPredictor(16, K)
    return model.to(dtype).eval()


def images(dtype=torch.float64) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return [torch.rand(3, 60, 80, generator=g, dtype=dtype), torch.rand(3, 50, 50, generator=g, dtype=dtype)]


class Settings:
    def __init__(self, strategy, **kw):
        self.strategy, self.box_threshold, self.aggregate = strategy, THRESHOLD, "mean"
        self.seed, self.egl_samples, self.method = 0, 2, "auto"
        self.__dict__.update(kw)


# --- the oracle: torchvision's own training loss, one image at a time, in float64 -------------------

def oracle(model, image, boxes, labels, points, seed, dtype=torch.float64) -> tuple[float, float]:
    """(||∇θ ℓ(x, T)||, ℓ(x, T)): the model in training mode but its BatchNorm in inference mode,
    the image alone, R-CNN's sampling seeded as alcli documents, keypoints visible."""
    m = copy.deepcopy(model).to(dtype).train()
    rpn_labels_in_model_dtype(m)
    for module in m.modules():
        if isinstance(module, torch.nn.BatchNorm2d):
            module.eval()
    torch.manual_seed(seed)
    pts = torch.tensor(points, dtype=torch.float32).reshape(-1, K, 2)
    target = {"boxes": torch.tensor(boxes, dtype=dtype).reshape(-1, 4),
              "labels": torch.tensor(labels, dtype=torch.int64),
              "keypoints": torch.cat([pts, torch.ones(len(pts), K, 1)], -1)}
    loss = sum(m([image.to(dtype)], [target]).values())
    grads = torch.autograd.grad(loss, [p for p in m.parameters() if p.requires_grad], allow_unused=True)
    return math.sqrt(sum(float(g.double().square().sum()) for g in grads if g is not None)), float(loss.detach())


def predictions(model, image) -> dict:
    with torch.no_grad():
        return copy.deepcopy(model).double().eval()([image.double()])[0]


def pseudo(row) -> tuple[list, list, list]:
    """The pseudo-labels a row shows: boxes, classes, each instance's keypoints' x, y."""
    boxes, points = json.loads(row["boxes"]), json.loads(row["keypoints"])
    return [b[:4] for b in boxes], [b[4] for b in boxes], [[p[:2] for p in inst] for inst in points]


@pytest.fixture(scope="module")
def model():
    return build()


# --- the utilities ---------------------------------------------------------------------------------

def test_gradnorm_and_loss_at_the_predicted_instances_are_the_float64_loop(model):
    imgs = images()
    rows = keypoints.rows(model, imgs, IDS, Settings("gradnorm"), None)
    for row, img in zip(rows, imgs):
        boxes, labels, points = pseudo(row)
        assert boxes, "the random model predicts instances above the threshold"
        found = predictions(model, img)
        keep = found["scores"] >= THRESHOLD
        assert torch.tensor(points).flatten().tolist() == pytest.approx(found["keypoints"][keep][..., :2].flatten().tolist())
        norm, loss = oracle(model, img, boxes, labels, points, detection.image_seed(0, row["id"]))
        assert row["score"] == pytest.approx(norm, rel=1e-9)
        assert row["loss"] == pytest.approx(loss, rel=1e-12)
        assert (row["width"], row["height"]) == (img.shape[2], img.shape[1])
    assert detection.method(model, "auto")[1].startswith("batched")
    loss_rows = keypoints.rows(model, imgs, IDS, Settings("loss"), None)
    assert [r["score"] for r in loss_rows] == pytest.approx([r["loss"] for r in rows], rel=1e-12)


def test_egl_and_gradnorm_batched_through_the_engine_equal_the_loop(model):
    """egl's S keypoint-carrying label sets in one forward (--method ghost; auto loops them, as
    Faster R-CNN's) and gradnorm against the per-image loop: two images of one size in one batch,
    the box scores lowered (about 0.5 to 0.7) so that the sets differ and, at gradnorm's threshold
    0.6, one of the two has no instance."""
    doubtful = copy.deepcopy(model)
    doubtful.roi_heads.box_predictor.cls_score.bias.data[1] -= 3.0  # scores 0.5 to 0.7 instead of 0.97
    imgs = [images()[0], images()[0].flip(-1)]
    ids = [IDS[0], "wide, flipped"]
    found = detection.predict(doubtful, imgs)
    assert [int((f["scores"] >= 0.6).sum()) for f in found] == [3, 0]
    scores = {}
    for strategy, kw in (("egl", {"egl_samples": 2}), ("gradnorm", {"box_threshold": 0.6})):
        batched, loop = (keypoints.rows(doubtful, imgs, ids, Settings(strategy, method=m, **kw), None)
                         for m in ("ghost", "loop"))
        assert [r["score"] for r in batched] == pytest.approx([r["score"] for r in loop], rel=1e-9)
        scores[strategy] = [r["score"] for r in batched]
    assert all(abs(e - g) > 1e-6 * g for e, g in zip(scores["egl"], scores["gradnorm"]))


def test_an_image_without_instances_has_a_finite_score(model):
    row = keypoints.rows(model, images()[:1], IDS[:1], Settings("gradnorm", box_threshold=1.1), None)[0]
    assert json.loads(row["keypoints"]) == [] and row["pred"] == "" and row["confidence"] is None
    assert row["score"] == pytest.approx(oracle(model, images()[0], [], [], [], detection.image_seed(0, IDS[0]))[0],
                                         rel=1e-9)


def test_the_task_is_read_from_the_model_and_other_tasks_are_refused(model):
    assert tasks.from_model(model) == "keypoints"
    with pytest.raises(Exception, match="keypoint detector .* --task detection cannot score"):
        tasks.check_model("detection", model)
    plain = torchvision.models.get_model("fasterrcnn_mobilenet_v3_large_320_fpn", weights=None,
                                         weights_backbone=None, num_classes=3)
    with pytest.raises(Exception, match="--task keypoints needs a keypoint detector"):
        tasks.check_model("keypoints", plain)


# --- Label Studio ------------------------------------------------------------------------------------

def test_keypointlabels_one_region_per_keypoint_in_percent(model):
    rows = keypoints.rows(model, images(), IDS, Settings("gradnorm"), None)
    out = to_labelstudio(rows, None, "m", class_names=NAMES, task="keypoints", from_name="kp")
    for row, task in zip(rows, out):
        w, h = row["width"], row["height"]
        result = task["predictions"][0]["result"]
        want = [(j, k, p) for j, inst in enumerate(json.loads(row["keypoints"])) for k, p in enumerate(inst)]
        assert len(result) == len(want) > 0
        for region, (j, k, (x, y, s)) in zip(result, want):
            assert region["type"] == "keypointlabels" and region["from_name"] == "kp"
            assert region["value"]["keypointlabels"] == [NAMES[k]]
            assert region["value"]["x"] == pytest.approx(100 * min(max(x, 0), w) / w)
            assert region["value"]["y"] == pytest.approx(100 * min(max(y, 0), h) / h)
            assert (region["original_width"], region["original_height"]) == (w, h)
            assert region["score"] == pytest.approx(1 / (1 + math.exp(-s)), rel=1e-12)  # sigmoid
    bare = to_labelstudio(rows, None, "m", task="keypoints")
    assert all(t["predictions"][0]["result"] == [] for t in bare)
    assert unnamed(rows, None, "keypoints") == 2 and unnamed(rows, NAMES, "keypoints") == 0


def test_the_labeling_config_lists_the_keypoint_names():
    root = ET.fromstring(labeling_config("keypoints", NAMES, "image", "kp", "img"))
    control = root.find("KeyPointLabels")
    assert control.get("name") == "kp" and control.get("toName") == "img"
    assert [c.get("value") for c in control] == NAMES
    assert root.find("Image").get("name") == "img"


# --- the command line ----------------------------------------------------------------------------

CLI_ARCH = "test_keypoints:narrowed"  # this file, on the tests' sys.path (not the working directory)
CLI_KWARGS = {**SMALL, "box_batch_size_per_image": 4, "box_detections_per_img": 1}


def narrowed(**kwargs) -> torch.nn.Module:
    """keypointrcnn_resnet50_fpn built as `--arch torchvision:` builds it, its keypoint head
    narrowed as build()'s (the full head's eight 512-channel convolutions took 30 s a run)."""
    from torchvision.models.detection.keypoint_rcnn import KeypointRCNNHeads, KeypointRCNNPredictor
    model = torchvision.models.get_model("keypointrcnn_resnet50_fpn", weights=None, weights_backbone=None,
                                         **kwargs)
    model.roi_heads.keypoint_head = KeypointRCNNHeads(256, (16, 16))
    model.roi_heads.keypoint_predictor = KeypointRCNNPredictor(16, K)
    return model


def alcli(*args, cwd):
    return invoke_in(cwd, *args)  # in this process: three interpreter starts cost more than the test


def test_score_and_select_a_folder_with_a_state_dict_and_arch(tmp_path):
    """--arch module:callable builds the model from a state_dict as detection's checkpoints do;
    --task auto finds keypoints; rows against the loop in float32; select hands Label Studio the
    keypoints."""
    rng = np.random.default_rng(0)
    (tmp_path / "imgs").mkdir()
    Image.fromarray((rng.random((60, 80, 3)) * 255).astype(np.uint8)).save(tmp_path / "imgs" / "a.png")
    torch.manual_seed(0)
    model = narrowed(**CLI_KWARGS).eval()
    torch.save(model.state_dict(), tmp_path / "kp.pt")
    (tmp_path / "names.txt").write_text("\n".join(NAMES) + "\n")
    common = ["--model", "kp.pt", "--arch", CLI_ARCH, "--arch-kwargs", json.dumps(CLI_KWARGS),
              "--trust-checkpoint"]  # a builder function runs only when trusted
    done = alcli("score", "imgs", *common, "--strategy", "gradnorm", "--box-threshold", "0",
                 "-o", "scores.csv", cwd=tmp_path)
    assert done.exit_code == 0, done.stderr
    assert json.load(open(tmp_path / "scores.csv.meta.json"))["task"] == "keypoints"
    rows = list(csv.DictReader(open(tmp_path / "scores.csv")))
    for row in rows:
        x = torch.from_numpy(np.array(Image.open(tmp_path / "imgs" / row["id"]))).permute(2, 0, 1).float() / 255
        boxes, labels, points = pseudo(row)
        assert boxes, "threshold 0 keeps every proper instance"
        want = oracle(model, x, boxes, labels, points, detection.image_seed(0, row["id"]), torch.float32)[0]
        # a float32 model (its gradients' squares summed in float64); the float64 tests above hold
        # the loss to 1e-9
        assert float(row["score"]) == pytest.approx(want, rel=1e-5)
    done = alcli("select", "scores.csv", "--budget", "1", "--no-diverse", "-f", "labelstudio",
                 "--class-names", "names.txt", "-o", "tasks.json", cwd=tmp_path)
    assert done.exit_code == 0, done.stderr
    result = json.load(open(tmp_path / "tasks.json"))[0]["predictions"][0]["result"]
    assert result and {r["type"] for r in result} == {"keypointlabels"}
    done = alcli("score", "imgs", *common, "--task", "detection", cwd=tmp_path)
    assert done.exit_code == 1 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "--task keypoints" in done.stderr and "Traceback" not in done.stderr
