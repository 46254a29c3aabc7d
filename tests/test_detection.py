"""Object detectors (alcli.tasks.detection): every utility against an independent float64
per-image loop of the detector's own training loss, and `alcli score` on a folder of images of
different sizes."""
from __future__ import annotations

import copy
import csv
import io
import json
import math

import numpy as np
import pytest
import torch
from PIL import Image

torchvision = pytest.importorskip("torchvision")

from alcli import tasks  # noqa: E402
from alcli.tasks import detection  # noqa: E402
from shell import completed_in

SMALL = {"min_size": 64, "max_size": 96}
# fewer anchors and proposals than the defaults, so that a test is quick: the same loss otherwise
RCNN_SMALL = {**SMALL, "rpn_pre_nms_top_n_train": 100, "rpn_post_nms_top_n_train": 100,
              "rpn_pre_nms_top_n_test": 100, "rpn_post_nms_top_n_test": 100,
              "rpn_batch_size_per_image": 64, "box_batch_size_per_image": 64}
DETECTORS = {
    "fasterrcnn_mobilenet_v3_large_320_fpn": RCNN_SMALL,
    "fasterrcnn_resnet50_fpn": RCNN_SMALL,
    "retinanet_resnet50_fpn": {**SMALL, "score_thresh": 0.01},  # random heads score about 0.01
    "fcos_resnet50_fpn": {**SMALL, "score_thresh": 0.01},
    "ssdlite320_mobilenet_v3_large": {},                        # resizes to 320 x 320 itself
}
THRESHOLD = 0.02
IDS = ["wide", "square"]


def box_pool(canonical_scale: int = 224):
    """An R-CNN's box pool at 3 x 3 bins instead of 7 x 7: its box head's fc6 of 2.4M weights
    instead of 12.8M, the largest cost of a float64 loop; fc7 and the predictors as torchvision's."""
    from torchvision.ops import MultiScaleRoIAlign
    return MultiScaleRoIAlign(["0", "1", "2", "3"], 3, 2, canonical_scale=canonical_scale)


def build(name: str, dtype=torch.float64) -> torch.nn.Module:
    torch.manual_seed(0)
    pool = {"box_roi_pool": box_pool()} if name.startswith("fasterrcnn") else {}
    model = torchvision.models.get_model(name, weights=None, weights_backbone=None, num_classes=3,
                                         **DETECTORS[name], **pool)
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

def rpn_labels_in_model_dtype(m):
    """torchvision's RPN hands its objectness labels (0, 1, -1) over as float32, which makes the
    BCE of float64 logits a float32 value: the oracle takes them in the model's dtype."""
    assign = m.rpn.assign_targets_to_anchors

    def assign_in_dtype(anchors, targets):
        labels, matched = assign(anchors, targets)
        return [lab.to(anchors[0].dtype) for lab in labels], matched
    m.rpn.assign_targets_to_anchors = assign_in_dtype
    return m


def oracle_norm(model, image, boxes, labels, seed, dtype=torch.float64) -> float:
    """||∇θ ℓ(x, T)|| with the model in training mode but its BatchNorm in inference mode, the
    image alone, R-CNN's sampling seeded as alcli documents."""
    m = copy.deepcopy(model).to(dtype).train()
    for module in m.modules():
        if isinstance(module, torch.nn.BatchNorm2d):
            module.eval()
    if hasattr(m, "rpn"):
        rpn_labels_in_model_dtype(m)
    torch.manual_seed(seed)
    target = {"boxes": torch.tensor(boxes, dtype=dtype).reshape(-1, 4),
              "labels": torch.tensor(labels, dtype=torch.int64)}
    loss = sum(m([image.to(dtype)], [target]).values())
    params = [p for p in m.parameters() if p.requires_grad]
    grads = torch.autograd.grad(loss, params, allow_unused=True)
    return math.sqrt(sum(float(g.double().square().sum()) for g in grads if g is not None))


def oracle_predictions(model, image) -> dict:
    with torch.no_grad():
        return copy.deepcopy(model).double().eval()([image.double()])[0]


def binary_entropy(p: float) -> float:
    return -sum(q * math.log(q) for q in (p, 1 - p) if q > 0)


# --- every utility of every detector ---------------------------------------------------------------

@pytest.mark.parametrize("name", list(DETECTORS))
def test_gradnorm_at_the_predicted_boxes_is_the_float64_per_image_loop(name):
    """The pseudo-labels are the model's own predictions, whichever pass they are decoded from."""
    model, imgs = build(name), images()
    # RetinaNet's random head scores every box about 0.01: all its boxes are the pseudo-labels
    threshold = 0.0 if name.startswith("retinanet") else THRESHOLD
    rows = detection.rows(model, imgs, IDS, Settings("gradnorm", box_threshold=threshold), None)
    for row, img in zip(rows, imgs):
        boxes = json.loads(row["boxes"])  # what the table shows: the pseudo-labels
        # decoded from the engine's pass (one-stage) or the choices' (R-CNN): the model's own
        found = detection.kept(oracle_predictions(model, img), threshold)
        assert [b[4] for b in boxes] == found["labels"].tolist() and boxes
        assert np.allclose([b[:4] for b in boxes], found["boxes"], rtol=1e-9, atol=1e-6)
        want = oracle_norm(model, img, [b[:4] for b in boxes], [b[4] for b in boxes],
                           detection.image_seed(0, row["id"]))
        assert row["score"] == pytest.approx(want, rel=1e-9, abs=1e-12)
        assert (row["width"], row["height"]) == (img.shape[2], img.shape[1])


@pytest.mark.parametrize("name", ["fasterrcnn_mobilenet_v3_large_320_fpn"])
def test_egl_is_the_mean_norm_over_box_sets_drawn_from_the_scores(name):
    """Under auto the loop, its backbone once per image for the S sets; with --method ghost
    batched, all S sets' proposals through one forward."""
    model, imgs = build(name), images()
    rows = detection.rows(model, imgs, IDS, Settings("egl"), None)
    assert detection.method(model, "auto")[0] == "loop"
    ghost = detection.rows(model, imgs, IDS, Settings("egl", method="ghost"), None)
    assert detection.method(model, "ghost")[1].startswith("batched")
    for row, img, other in zip(rows, imgs, ghost):
        assert other["score"] == pytest.approx(row["score"], rel=1e-9)
        found = oracle_predictions(model, img)
        k = len(found["scores"])
        u = tasks.uniforms([row["id"]], max(k, 1), 2, 0, "cpu")[:, 0, :k]  # the seeded draws
        norms = []
        for draws in u:
            keep = [j for j in range(k) if draws[j] < found["scores"][j]
                    and found["boxes"][j, 2] > found["boxes"][j, 0] and found["boxes"][j, 3] > found["boxes"][j, 1]]
            norms.append(oracle_norm(model, img, found["boxes"][keep].tolist(), found["labels"][keep].tolist(),
                                     detection.image_seed(0, row["id"])))
        assert row["score"] == pytest.approx(sum(norms) / len(norms), rel=1e-9)


@pytest.mark.parametrize("name", ["ssdlite320_mobilenet_v3_large"])
def test_the_cheap_utilities_are_taken_over_each_images_boxes(name):
    model, imgs = build(name), images()
    found = [oracle_predictions(model, img)["scores"].tolist() for img in imgs]
    assert all(found), "the random detector predicts some boxes"
    want = {"entropy": [sum(map(binary_entropy, s)) / len(s) for s in found],
            "margin": [sum(1 - abs(2 * p - 1) for p in s) / len(s) for s in found],
            "least-confidence": [1 - max(s) for s in found],
            "uncertain-boxes": [sum(p < THRESHOLD for p in s) for s in found]}
    for strategy, values in want.items():
        got = [r["score"] for r in detection.rows(model, imgs, IDS, Settings(strategy), None)]
        assert got == pytest.approx(values, rel=1e-9), strategy
    top = detection.rows(model, imgs, IDS, Settings("entropy", aggregate="max"), None)
    assert [r["score"] for r in top] == pytest.approx([max(map(binary_entropy, s)) for s in found])


@pytest.mark.parametrize("name", ["fasterrcnn_mobilenet_v3_large_320_fpn"])
def test_float32_matches_float64_at_drawn_boxes(name):
    """The float32 model's norms at hand-drawn boxes, and at none, against the float64 loop.
    (FCOS assigns points to boxes by comparing distances with fixed scale ranges, and SSD picks
    its hard negatives by sorting: a float32 run can flip one assignment, as training would.)"""
    model, imgs = build(name, torch.float32), images(torch.float32)
    targets = [([[5.0, 6.0, 40.0, 50.0], [30.0, 10.0, 70.0, 30.0]], [1, 2]), ([], [])]
    params = [p for p in model.parameters() if p.requires_grad]
    with detection.loss_mode(model):
        for img, (boxes, labels), id_ in zip(imgs, targets, IDS):
            target = {"boxes": torch.tensor(boxes).reshape(-1, 4), "labels": torch.tensor(labels, dtype=torch.long)}
            seed = detection.image_seed(0, id_)
            got = detection.grad_norm(model, img, target, seed, params)[0]
            assert got == pytest.approx(oracle_norm(model, img, boxes, labels, seed), rel=1e-4)
    assert not model.training


# RetinaNet's and FCOS's random heads score about 0.01: their drawn label sets are mostly empty;
# their batched gradnorm is checked against the float64 loop above, and FCOS's below
@pytest.mark.parametrize("name", ["ssdlite320_mobilenet_v3_large"])
def test_one_stage_detectors_egl_goes_through_the_engine_batched_and_equals_the_loop(name):
    """Their losses split by image: images of one padded size share one batched forward and
    backward (alcli.tasks.detectors.batched), all S label sets through it, and give the per-image
    loop's numbers."""
    model = build(name)
    imgs = [images()[0], images()[0].flip(-1)]
    ids = ["wide", "mirrored"]
    batched = detection.rows(model, imgs, ids, Settings("egl", box_threshold=0.0), None)
    looped = detection.rows(model, imgs, ids, Settings("egl", box_threshold=0.0, method="loop"), None)
    assert detection.method(model, "auto")[1].startswith("batched") and detection.method(model, "loop")[0] == "loop"
    assert any(json.loads(r["boxes"]) for r in batched)
    for b, l in zip(batched, looped):
        assert b["score"] == pytest.approx(l["score"], rel=1e-9)


# hand-drawn targets: two boxes, none, one; the third image's own size pads as the first's does
DRAWN = [([[5.0, 6.0, 40.0, 50.0], [30.0, 10.0, 70.0, 30.0]], [1, 2]), ([], []), ([[10.0, 8.0, 60.0, 40.0]], [2])]


@pytest.mark.parametrize("name", ["fcos_resnet50_fpn", "ssdlite320_mobilenet_v3_large",
                                  "fasterrcnn_mobilenet_v3_large_320_fpn"])
def test_a_batch_of_other_sizes_and_an_image_without_boxes_is_each_image_alone(name):
    """Each image's loss over its own foreground count (SSD: its own hard negatives; Faster
    R-CNN: its own sampled anchors and proposals, drawn as the loop draws them), whatever its
    neighbours hold: a batch of different sizes padded alike, one image without boxes, against
    torchvision's own float64 loss of each image alone."""
    from alcli.tasks.detectors import batched
    model = build(name)
    g = torch.Generator().manual_seed(3)
    imgs = [images()[0], images()[0].flip(1), torch.rand(3, 63, 84, generator=g, dtype=torch.float64)]
    ids = ["two", "none", "one"]
    with torch.no_grad():
        assert len(batched.padded_groups(model, imgs)) == 1  # one batch: three originals, one padded size
    sets = [[{"boxes": torch.tensor(b, dtype=torch.float64).reshape(-1, 4), "labels": torch.tensor(c, dtype=torch.long)}]
            for b, c in DRAWN]
    norms, losses = detection.gradient_norms(model, imgs, sets, ids, Settings("gradnorm"))
    assert detection.method(model, "auto")[1].startswith("batched")
    for img, (boxes, labels), id_, norm in zip(imgs, DRAWN, ids, norms):
        assert norm[0] == pytest.approx(oracle_norm(model, img, boxes, labels, detection.image_seed(0, id_)), rel=1e-9)
    if name.startswith("ssd"):
        assert norms[1] == [0.0] and losses[1] == [0.0]  # no box: SSD's loss is 0


def test_an_rcnn_trained_at_several_sizes_draws_each_images_size_as_its_loss_does():
    """A training transform of several min sizes draws one per image from the image's seed: the
    batched forward's tensor, the loop's features and every label set's targets at that size
    (each was drawn unseeded once: a norm at the wrong size's features)."""
    torch.manual_seed(0)
    model = torchvision.models.get_model("fasterrcnn_mobilenet_v3_large_320_fpn", weights=None,
                                         weights_backbone=None, num_classes=3, box_roi_pool=box_pool(),
                                         **{**RCNN_SMALL, "min_size": (48, 64, 80)}).double().eval()
    imgs = images()
    wants = []
    for row, img in zip(detection.rows(model, imgs, IDS, Settings("uncertain-boxes"), None), imgs):
        boxes = json.loads(row["boxes"])
        wants.append(oracle_norm(model, img, [b[:4] for b in boxes], [b[4] for b in boxes],
                                 detection.image_seed(0, row["id"])))
    for method in ("ghost", "loop"):
        torch.manual_seed(1)  # the global generator an unseeded draw would follow (either old draw: red)
        rows = detection.rows(model, imgs, IDS, Settings("gradnorm", method=method), None)
        assert [r["score"] for r in rows] == pytest.approx(wants, rel=1e-9), method


def rcnn_over_levels() -> torch.nn.Module:
    """A ResNet-50 Faster R-CNN whose box pool maps the small test images' boxes over all four
    pyramid levels (canonical_scale 16 in place of 224)."""
    torch.manual_seed(0)
    return torchvision.models.get_model("fasterrcnn_resnet50_fpn", weights=None, weights_backbone=None,
                                        num_classes=3, box_roi_pool=box_pool(16), **RCNN_SMALL).eval()


def test_an_rcnns_rows_at_every_pyramid_level_are_pooled_at_their_own(monkeypatch):
    """RoIAlign takes each proposal at its own level, chosen in the forward: gradnorm and the
    batched egl at proposals spread over the four levels (a level mapping of small boxes: the
    test's images are small) against the float64 loop."""
    from alcli.tasks.detectors import roi_align
    model = rcnn_over_levels().double()
    imgs, pooled_levels = images(), set()

    def pooled(maps, pool_, rois, *table):  # the levels of the rows the batched forward pools
        pooled_levels.update(pool_.map_levels([rois.flatten(0, 1)]).tolist())
        return original(maps, pool_, rois, *table)
    original = roi_align.pooled
    monkeypatch.setattr(roi_align, "pooled", pooled)
    rows = detection.rows(model, imgs, IDS, Settings("gradnorm"), None)
    assert detection.method(model, "auto")[1].startswith("batched")
    assert len(pooled_levels) >= 3
    boxes = [json.loads(row["boxes"]) for row in rows]
    for row, img, found in zip(rows, imgs, boxes):
        want = oracle_norm(model, img, [b[:4] for b in found], [b[4] for b in found], detection.image_seed(0, row["id"]))
        assert row["score"] == pytest.approx(want, rel=1e-9)
    ghost = detection.rows(model, imgs, IDS, Settings("egl", method="ghost"), None)
    loop = detection.rows(model, imgs, IDS, Settings("egl", method="loop"), None)
    assert [r["score"] for r in ghost] == pytest.approx([r["score"] for r in loop], rel=1e-9)


@pytest.mark.parametrize("vmapped", [False, True])
def test_an_rcnns_label_set_backward_runs_the_heads_at_its_own_proposals(monkeypatch, vmapped):
    """egl batched (--method ghost), S = 3: one backward per label set reaches the box head at
    that set's proposals alone (rcnn._Parts), 3 pool backwards per batch and not 3 x 3; with the
    S backwards vmapped as one (as on CUDA) every set's rows, once. The scores are the loop's."""
    from alcli.gradnorm import ghost
    from alcli.tasks.detectors import rcnn, roi_align
    backwards = []

    class Counted(torch.autograd.Function):  # the pool's output, the backwards that reach it counted
        @staticmethod
        def forward(ctx, x):
            ctx.set_materialize_grads(False)  # an unreached output's gradient stays None
            return x.clone()

        @staticmethod
        def backward(ctx, grad):
            if grad is not None:
                backwards.append(grad.shape)
            return grad
    original = roi_align.pooled
    monkeypatch.setattr(roi_align, "pooled", lambda *args: Counted.apply(original(*args)))
    monkeypatch.setattr(ghost, "VMAP_ELEMENTS", None if vmapped else 1)  # all S in one backward, or 1
    model, imgs = build("fasterrcnn_mobilenet_v3_large_320_fpn"), images()
    ghost_rows = detection.rows(model, imgs, IDS, Settings("egl", method="ghost", egl_samples=3), None)
    assert ghost._k_mode.get(rcnn.heads(model)) == ("batched" if vmapped else None)  # None: one at a time
    assert len(backwards) == 2 * 3                                   # two batches (two sizes), 3 sets each
    loop = detection.rows(model, imgs, IDS, Settings("egl", method="loop", egl_samples=3), None)
    assert [r["score"] for r in ghost_rows] == pytest.approx([r["score"] for r in loop], rel=1e-9)


def test_an_rcnns_next_batch_reuses_the_engines_layout():
    """The engine learns a layout per input shape (about ten images' forward): a batch of other
    images of the same size, whose proposals fall differently across the levels, has the same
    inputs' shapes and learns none."""
    from alcli.gradnorm import layout
    from alcli.tasks.detectors import rcnn
    model = rcnn_over_levels()
    g = torch.Generator().manual_seed(3)
    for batch in range(3):
        imgs = [torch.rand(3, 60, 80, generator=g) for _ in range(2)]
        detection.rows(model, imgs, [f"b{batch}-{i}" for i in range(2)], Settings("gradnorm"), None)
        assert len(layout._cache[rcnn.heads(model)]) == 1, batch


def test_an_rcnn_whose_roi_pool_samples_adaptively_is_scored_on_the_loop():
    """A sampling ratio of 0 samples each bin by the box's size, which the batched pool does
    not: `auto` and `--method ghost` take the loop, whose scores are the float64 oracle's."""
    model, imgs = build("fasterrcnn_mobilenet_v3_large_320_fpn"), images()
    model.roi_heads.box_roi_pool.sampling_ratio = 0
    for method in ("auto", "ghost"):
        rows = detection.rows(model, imgs, IDS, Settings("gradnorm", method=method), None)
        assert detection.method(model, method)[0] == "loop"
    for row, img in zip(rows, imgs):
        boxes = json.loads(row["boxes"])
        want = oracle_norm(model, img, [b[:4] for b in boxes], [b[4] for b in boxes], detection.image_seed(0, row["id"]))
        assert row["score"] == pytest.approx(want, rel=1e-9)


def test_a_one_stage_detector_trained_at_several_sizes_is_scored_on_the_loop():
    """Its loss draws a size per image, which its inference (the batched forward's tensor) does
    not: `auto` takes the loop, seeded as the loss is."""
    torch.manual_seed(0)
    model = torchvision.models.get_model("fcos_resnet50_fpn", weights=None, weights_backbone=None, num_classes=3,
                                         **{**DETECTORS["fcos_resnet50_fpn"], "min_size": (48, 64, 80)}).double().eval()
    imgs = images()
    rows = detection.rows(model, imgs, IDS, Settings("gradnorm"), None)
    assert detection.method(model, "auto")[0] == "loop"
    for row, img in zip(rows, imgs):
        boxes = json.loads(row["boxes"])
        want = oracle_norm(model, img, [b[:4] for b in boxes], [b[4] for b in boxes], detection.image_seed(0, row["id"]))
        assert row["score"] == pytest.approx(want, rel=1e-9)


def test_a_row_does_not_depend_on_its_batch():
    """Predictions per group of same-sized images, the loss per image alone: an image scored
    with others of other sizes, or alone, gets the same row (shards, resume, batch sizes)."""
    model, imgs = build("fasterrcnn_mobilenet_v3_large_320_fpn"), images()
    both = detection.rows(model, imgs, IDS, Settings("gradnorm"), None)
    alone = detection.rows(model, imgs[1:], IDS[1:], Settings("gradnorm"), None)
    assert alone[0]["score"] == pytest.approx(both[1]["score"], rel=1e-12)
    assert alone[0]["boxes"] == both[1]["boxes"]


def test_an_image_with_hundreds_of_boxes():
    model, img = build("fasterrcnn_mobilenet_v3_large_320_fpn"), images()[0]
    g = torch.Generator().manual_seed(2)
    corner = torch.rand(300, 2, generator=g, dtype=torch.float64) * torch.tensor([60.0, 40.0])
    boxes = torch.cat([corner, corner + 5 + 15 * torch.rand(300, 2, generator=g, dtype=torch.float64)], 1)
    labels = torch.randint(1, 3, (300,), generator=g)
    params = [p for p in model.parameters() if p.requires_grad]
    with detection.loss_mode(model):
        got = detection.grad_norm(model, img, {"boxes": boxes, "labels": labels}, 7, params)[0]
    assert got == pytest.approx(oracle_norm(model, img, boxes.tolist(), labels.tolist(), 7), rel=1e-9)


def test_an_image_without_boxes_has_a_finite_score():
    model = build("retinanet_resnet50_fpn")
    row = detection.rows(model, images()[:1], IDS[:1], Settings("gradnorm", box_threshold=1.0), None)[0]
    assert json.loads(row["boxes"]) == [] and row["pred"] == "" and row["confidence"] is None
    assert math.isfinite(row["score"]) and row["score"] > 0


# --- the command line ----------------------------------------------------------------------------

CLI_ARCH = "torchvision:fasterrcnn_mobilenet_v3_large_320_fpn"
CLI_KWARGS = {"num_classes": 3, **RCNN_SMALL}


@pytest.fixture(scope="module")
def detector_files(tmp_path_factory):
    """Images of three sizes (one grayscale) and a detector's state_dict."""
    root = tmp_path_factory.mktemp("det")
    rng = np.random.default_rng(0)
    (root / "imgs").mkdir()
    for name, (h, w), mode in [("a.png", (60, 80), "RGB"), ("b.png", (50, 50), "RGB"),
                               ("c.png", (70, 40), "L"), ("d.jpg", (60, 80), "RGB")]:
        Image.fromarray((rng.random((h, w, 3)) * 255).astype(np.uint8)).convert(mode).save(root / "imgs" / name)
    torch.manual_seed(0)
    model = torchvision.models.get_model(CLI_ARCH.split(":")[1], weights=None, weights_backbone=None,
                                         **CLI_KWARGS)
    torch.save(model.state_dict(), root / "det.pt")
    return root, model.eval()


def alcli(*args, cwd, stdin=None):
    return completed_in(cwd, *args, input=stdin)  # in this process: an interpreter start costs more


def test_score_ranks_a_folder_of_images_of_any_size(detector_files):
    """The command's float32 rows (Faster R-CNN batched) against the loop in float32 too: with a random detector's
    predicted boxes as targets, float32 and float64 can differ by an anchor or proposal assigned
    differently (the tests above compare with float64 where that cannot happen)."""
    root, model = detector_files
    done = alcli("score", "imgs", "--model", "det.pt", "--arch", CLI_ARCH, "--arch-kwargs",
                 json.dumps(CLI_KWARGS), "--strategy", "gradnorm", "--box-threshold", "0",
                 "--batch-size", "3", "-o", "scores.csv", cwd=root)
    assert done.returncode == 0, done.stderr
    assert "method    ghost (batched: FasterRCNN's loss splits by image" in done.stderr
    rows = list(csv.DictReader(open(root / "scores.csv")))
    assert sorted(r["id"] for r in rows) == ["a.png", "b.png", "c.png", "d.jpg"]
    assert json.load(open(root / "scores.csv.meta.json"))["task"] == "detection"
    for row in rows:
        img = Image.open(root / "imgs" / row["id"]).convert("RGB")
        x = torch.from_numpy(np.array(img)).permute(2, 0, 1).float() / 255
        boxes = json.loads(row["boxes"])
        assert (int(row["width"]), int(row["height"])) == img.size
        assert boxes, "threshold 0 keeps every proper box"
        want = oracle_norm(model, x, [b[:4] for b in boxes], [b[4] for b in boxes],
                           detection.image_seed(0, row["id"]), torch.float32)
        assert float(row["score"]) == pytest.approx(want, rel=1e-5)


def test_a_classifier_given_task_detection_is_one_sentence(detector_files, workspace):
    done = alcli("score", str(workspace.pool), "-c", str(workspace.config), "--model",
                 str(workspace.model), "--task", "detection", cwd=workspace.root)
    assert done.returncode == 1
    assert done.stderr.strip().startswith("alcli: error:") and len(done.stderr.strip().splitlines()) == 1
    assert "--task detection" in done.stderr and "TinyNet" in done.stderr


def test_a_detector_given_another_task_is_one_sentence(detector_files):
    root, _ = detector_files
    done = alcli("score", "imgs", "--model", "det.pt", "--arch", CLI_ARCH, "--arch-kwargs",
                 json.dumps(CLI_KWARGS), "--task", "classification", cwd=root)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr


# --- Hugging Face DETR-style detectors ------------------------------------------------------------

def tiny_detr(dtype=torch.float64):
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("scipy")  # its loss matches queries to boxes with the Hungarian method
    torch.manual_seed(0)
    cfg = transformers.DetrConfig(
        use_timm_backbone=True, backbone="resnet18", use_pretrained_backbone=False, num_queries=8,
        d_model=32, encoder_layers=1, decoder_layers=1, encoder_ffn_dim=32, decoder_ffn_dim=32,
        encoder_attention_heads=2, decoder_attention_heads=2, num_labels=3, auxiliary_loss=False,
        id2label={0: "cat", 1: "dog", 2: "cow"}, label2id={"cat": 0, "dog": 1, "cow": 2})
    return transformers.DetrForObjectDetection(cfg).to(dtype).eval()


def detr_oracle(model, image, boxes, labels, dtype) -> float:
    """The model's own loss for the image alone, boxes as (cx, cy, w, h) / image size."""
    m = copy.deepcopy(model).to(dtype).eval()
    h, w = image.shape[-2:]
    xyxy = torch.tensor(boxes, dtype=dtype).reshape(-1, 4)
    cxcywh = torch.stack([(xyxy[:, 0] + xyxy[:, 2]) / 2 / w, (xyxy[:, 1] + xyxy[:, 3]) / 2 / h,
                          (xyxy[:, 2] - xyxy[:, 0]) / w, (xyxy[:, 3] - xyxy[:, 1]) / h], 1)
    loss = m(pixel_values=image.to(dtype)[None],
             labels=[{"class_labels": torch.tensor(labels, dtype=torch.long), "boxes": cxcywh}]).loss
    grads = torch.autograd.grad(loss, [p for p in m.parameters() if p.requires_grad], allow_unused=True)
    return math.sqrt(sum(float(g.double().square().sum()) for g in grads if g is not None))


def test_a_hugging_face_detr_is_the_per_image_loop():
    """In float32: Hugging Face's DETR loss does not run in float64 (its class weights are a
    float32 buffer)."""
    model, imgs = tiny_detr(torch.float32), images(torch.float32)
    rows = detection.rows(model, imgs, IDS, Settings("gradnorm", box_threshold=0.1), ["cat", "dog", "cow"])
    assert any(json.loads(r["boxes"]) for r in rows)
    for row, img in zip(rows, imgs):
        boxes = json.loads(row["boxes"])
        want = detr_oracle(model, img, [b[:4] for b in boxes], [b[4] for b in boxes], torch.float32)
        assert row["score"] == pytest.approx(want, rel=1e-5)
        with torch.no_grad():
            probs = model(pixel_values=img[None]).logits.softmax(-1)[0, :, :-1]
        assert sorted(b[5] for b in boxes) == pytest.approx(sorted(p for p in probs.max(-1).values.tolist() if p >= 0.1))


def test_score_reads_a_detr_directory(tmp_path):
    model = tiny_detr(torch.float32)
    model.save_pretrained(tmp_path / "detr")
    (tmp_path / "imgs").mkdir()
    rng = np.random.default_rng(0)
    for name, (h, w) in [("a.png", (60, 80)), ("b.png", (50, 50))]:
        Image.fromarray((rng.random((h, w, 3)) * 255).astype(np.uint8)).save(tmp_path / "imgs" / name)
    done = alcli("score", "imgs", "--model", "detr", "--strategy", "gradnorm", "--box-threshold", "0.1",
                 "-o", "scores.csv", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    rows = list(csv.DictReader(open(tmp_path / "scores.csv")))
    for row in rows:
        x = torch.from_numpy(np.array(Image.open(tmp_path / "imgs" / row["id"]))).permute(2, 0, 1).float() / 255
        boxes = json.loads(row["boxes"])
        assert set(row["pred"].split("|")) <= {"cat", "dog", "cow", ""}
        want = detr_oracle(model, x, [b[:4] for b in boxes], [b[4] for b in boxes], torch.float32)
        assert float(row["score"]) == pytest.approx(want, rel=1e-5)


def test_a_large_layer_s_norm_sums_its_squares_in_float64():
    """Faster R-CNN's fc6 (12.8M weights) in a float32 detector: its norm is the float64 norm of
    its float32 gradient; float32 summation (torch._foreach_norm) is off by about 3e-4 here."""
    torch.manual_seed(0)  # torchvision's own 7 x 7 box pool: the full fc6
    model = torchvision.models.get_model("fasterrcnn_mobilenet_v3_large_320_fpn", weights=None, weights_backbone=None,
                                         num_classes=3, **RCNN_SMALL).eval()
    img = images(torch.float32)[0]
    fc6 = model.roi_heads.box_head.fc6.weight
    assert fc6.numel() > 12_000_000
    target = {"boxes": torch.tensor([[5.0, 6.0, 40.0, 50.0], [30.0, 10.0, 70.0, 30.0]]),
              "labels": torch.tensor([1, 2])}
    with detection.loss_mode(model):
        got = detection.grad_norm(model, img, target, 3, [fc6])[0]
        g, = torch.autograd.grad(detection.image_loss(model, img, target, 3), [fc6])
    want = math.sqrt(math.fsum(v * v for v in g.double().flatten().tolist()))  # exact squares, exact sum
    assert got == pytest.approx(want, rel=1e-9)


def test_select_on_a_detection_table_advises_what_works_without_embeddings(tmp_path):
    """A detector's rows have no BADGE embeddings, so `--embeddings FILE` cannot help: the note
    (and the error under --diverse or --typical) says why and names the options that work."""
    boxes = json.dumps([[1, 2, 10, 12, 1, 0.9]])
    (tmp_path / "det.csv").write_text("id,score,pred,boxes\n" + "".join(
        f"im{i}.png,{i / 10},1,\"{boxes.replace(chr(34), chr(34) * 2)}\"\n" for i in range(6)))
    done = alcli("select", "det.csv", "-n", "3", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert [r["id"] for r in csv.DictReader(io.StringIO(done.stdout))] == ["im5.png", "im4.png", "im3.png"]
    note = " ".join(done.stderr.split())
    assert detection.TASK.no_badge in note and "--per-class" in note and "--sampling" in note, note
    assert "--embeddings" not in note, note
    for flag in ("--diverse", "--typical"):
        refused = alcli("select", "det.csv", "-n", "3", flag, cwd=tmp_path)
        assert refused.returncode == 1 and refused.stderr.count("\n") == 1, refused.stderr
        assert flag in refused.stderr and detection.TASK.no_badge in refused.stderr
        assert "--embeddings" not in refused.stderr and "--no-diverse" in refused.stderr


def test_a_slow_cpu_run_times_its_first_image_alone_and_says_the_estimate(detector_files, tmp_path,
                                                                          monkeypatch):
    """On the CPU a detector's first image is scored alone, and a run estimated past
    LONG_RUN_SECONDS (0 here, so this small run is one) says so once, with what cuts it."""
    from alcli import api
    from alcli.score import runner
    root, model = detector_files
    monkeypatch.setattr(runner, "LONG_RUN_SECONDS", 0.0)
    notes, batches = [], []
    settings = api.settings_for(pool=str(root / "imgs"), strategy="egl", egl_samples=1, batch_size=3,
                                box_threshold=0.0, device="cpu")
    api.score_to_table(settings, str(tmp_path / "s.csv"), model=copy.deepcopy(model),
                       say=notes.append, on_batch=batches.append)
    assert batches == [1, 3]
    assert len(notes) == 1 and notes[0].startswith("on the CPU this run takes about ")
    assert "3 examples left" in notes[0] and "`-s gradnorm`" in notes[0]
