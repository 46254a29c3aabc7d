"""Instance segmentation (alcli.tasks.instances): torchvision's Mask R-CNN, its per-image loss and
gradient norm at the predicted instances with their masks against an independent float64
per-image loop of the model's own training loss (the masks decoded from the rows' run-length
codes), and `alcli score` on a folder of images."""
from __future__ import annotations

import copy
import csv
import json
import math

import numpy as np
import pytest
import torch
from PIL import Image

torchvision = pytest.importorskip("torchvision")

from alcli import tasks  # noqa: E402
from alcli.tasks import instances  # noqa: E402
from shell import completed_in  # noqa: E402
from test_detection import box_pool, rpn_labels_in_model_dtype  # noqa: E402

SMALL = {"num_classes": 2, "min_size": 64, "max_size": 96, "rpn_pre_nms_top_n_train": 50,
         "rpn_post_nms_top_n_train": 50, "rpn_pre_nms_top_n_test": 50, "rpn_post_nms_top_n_test": 50,
         "rpn_batch_size_per_image": 32, "box_batch_size_per_image": 8, "box_detections_per_img": 3}
THRESHOLD = 0.5
IDS = ["wide", "square"]


def build(dtype=torch.float64) -> torch.nn.Module:
    """maskrcnn_resnet50_fpn without weights, its mask head narrowed (one 3x3 convolution of 16
    channels instead of four of 256: the float64 loop would take long), its box pool 3 x 3
    (test_detection.box_pool)."""
    from torchvision.models.detection.mask_rcnn import MaskRCNNHeads, MaskRCNNPredictor
    torch.manual_seed(0)
    model = torchvision.models.get_model("maskrcnn_resnet50_fpn", weights=None, weights_backbone=None,
                                         box_roi_pool=box_pool(), **SMALL)
    model.roi_heads.mask_head = MaskRCNNHeads(256, (16,), 1)
    model.roi_heads.mask_predictor = MaskRCNNPredictor(16, 16, SMALL["num_classes"])
    return model.to(dtype).eval()


def images(dtype=torch.float64) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return [torch.rand(3, 60, 80, generator=g, dtype=dtype), torch.rand(3, 50, 50, generator=g, dtype=dtype)]


class Settings:
    def __init__(self, strategy, **kw):
        self.strategy, self.box_threshold, self.aggregate = strategy, THRESHOLD, "mean"
        self.seed, self.egl_samples, self.method = 0, 2, "auto"
        self.__dict__.update(kw)


def decoded(code: dict) -> np.ndarray:
    """COCO's uncompressed RLE -> the binary mask [H, W]: alternate runs of 0s and 1s, column by column."""
    h, w = code["size"]
    flat = np.repeat(np.arange(len(code["counts"])) % 2, code["counts"]).astype(np.uint8)
    assert flat.size == h * w
    return flat.reshape(w, h).T


def oracle(model, image, row, seed) -> tuple[float, float]:
    """(||∇θ ℓ(x, T)||, ℓ(x, T)) with T the row's boxes, classes and decoded masks: the model in
    training mode but its BatchNorm in inference mode, the image alone, its sampling seeded."""
    m = copy.deepcopy(model).double().train()
    rpn_labels_in_model_dtype(m)
    for module in m.modules():
        if isinstance(module, torch.nn.BatchNorm2d):
            module.eval()
    boxes = json.loads(row["boxes"])
    masks = [decoded(c) for c in json.loads(row["masks"])]
    h, w = image.shape[-2:]
    target = {"boxes": torch.tensor([b[:4] for b in boxes], dtype=torch.float64).reshape(-1, 4),
              "labels": torch.tensor([b[4] for b in boxes], dtype=torch.int64),
              "masks": torch.from_numpy(np.stack(masks)) if masks else torch.zeros(0, h, w, dtype=torch.uint8)}
    torch.manual_seed(seed)
    loss = sum(m([image.double()], [target]).values())
    grads = torch.autograd.grad(loss, [p for p in m.parameters() if p.requires_grad], allow_unused=True)
    return math.sqrt(sum(float(g.double().square().sum()) for g in grads if g is not None)), float(loss.detach())


@pytest.fixture(scope="module")
def model():
    return build()


def test_run_lengths_are_coco_s_column_major_runs_starting_with_zeros():
    mask = torch.tensor([[1, 1, 0], [0, 1, 1]], dtype=torch.bool)   # column-major: 1 0 1 1 0 1
    assert instances.run_lengths(mask) == {"size": [2, 3], "counts": [0, 1, 1, 2, 1, 1]}
    assert instances.run_lengths(~mask) == {"size": [2, 3], "counts": [1, 1, 2, 1, 1]}
    assert instances.run_lengths(torch.zeros(2, 2, dtype=torch.bool))["counts"] == [4]


def test_gradnorm_and_loss_at_the_predicted_instances_with_masks_are_the_float64_loop(model):
    from alcli.tasks import detection
    imgs = images()
    rows = instances.rows(model, imgs, IDS, Settings("gradnorm"), None)
    assert any(json.loads(r["masks"]) for r in rows), "the random model predicts some instances"
    for row, img in zip(rows, imgs):
        codes = json.loads(row["masks"])
        assert len(codes) == len(json.loads(row["boxes"]))
        assert all(c["size"] == [img.shape[1], img.shape[2]] for c in codes)
        want_norm, want_loss = oracle(model, img, row, detection.image_seed(0, row["id"]))
        assert row["score"] == pytest.approx(want_norm, rel=1e-9)
        assert row["loss"] == pytest.approx(want_loss, rel=1e-12)
    assert detection.method(model, "auto")[1].startswith("batched")


def test_egl_batched_through_the_engine_equals_the_loop(model):
    """egl's S mask-carrying label sets in one forward (--method ghost; auto loops them, as Faster
    R-CNN's) against the per-image loop, two images of one size in one batch."""
    imgs = images() + [images()[0].flip(-1)]  # two of one size: a batch of two through the engine
    ids = IDS + ["wide, flipped"]
    settings = [Settings("egl", method=m, box_threshold=0.3) for m in ("ghost", "loop")]
    batched, loop = (instances.rows(model, imgs, ids, s, None) for s in settings)
    assert [r["score"] for r in batched] == pytest.approx([r["score"] for r in loop], rel=1e-9)


def test_an_image_without_instances_has_a_finite_score(model):
    row = instances.rows(model, images()[:1], IDS[:1], Settings("gradnorm", box_threshold=1.0), None)[0]
    assert json.loads(row["masks"]) == [] and math.isfinite(row["score"]) and row["score"] > 0


def test_the_task_is_read_from_the_model_and_other_tasks_are_refused(model):
    assert tasks.from_model(model) == "instance-segmentation"
    keypoint_rcnn = torchvision.models.get_model("keypointrcnn_resnet50_fpn", weights=None,
                                                 weights_backbone=None, num_keypoints=3, num_classes=2)
    assert tasks.from_model(keypoint_rcnn) == "keypoints"
    assert "--task instance-segmentation" in instances.not_a_mask_detector(keypoint_rcnn)


def test_score_a_folder_with_a_state_dict_and_arch(tmp_path):
    """The command with --arch torchvision:maskrcnn_resnet50_fpn (the default mask head: a
    state_dict of the model as built): rows with masks, the task in .meta.json."""
    torch.manual_seed(0)
    kwargs = {**SMALL, "box_detections_per_img": 2}
    net = torchvision.models.get_model("maskrcnn_resnet50_fpn", weights=None, weights_backbone=None, **kwargs)
    torch.save(net.state_dict(), tmp_path / "mask.pt")
    (tmp_path / "imgs").mkdir()
    rng = np.random.default_rng(0)
    for name, (h, w) in [("a.png", (60, 80)), ("b.png", (50, 50))]:
        Image.fromarray((rng.random((h, w, 3)) * 255).astype(np.uint8)).save(tmp_path / "imgs" / name)
    done = completed_in(tmp_path, "score", "imgs", "--model", "mask.pt", "--arch",
                        "torchvision:maskrcnn_resnet50_fpn", "--arch-kwargs", json.dumps(kwargs),
                        "-s", "entropy", "-o", "s.csv")
    assert done.returncode == 0, done.stderr
    rows = list(csv.DictReader(open(tmp_path / "s.csv")))
    assert sorted(r["id"] for r in rows) == ["a.png", "b.png"]
    assert all(isinstance(json.loads(r["masks"]), list) for r in rows)
    assert json.load(open(tmp_path / "s.csv.meta.json"))["task"] == "instance-segmentation"
