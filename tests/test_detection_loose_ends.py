"""Detection's loose ends (issue 53): Keypoint R-CNN's batched loss for an image without instances
is torchvision's own (the loop's), not NaN."""
from __future__ import annotations

import copy
import math

import pytest
import torch

pytest.importorskip("torchvision")

from alcli.tasks import detection, keypoints  # noqa: E402
from test_keypoints import IDS, Settings, build, images, oracle  # noqa: E402


@pytest.fixture(scope="module")
def doubtful():
    model = build()
    model.roi_heads.box_predictor.cls_score.bias.data[1] -= 3.0  # scores 0.5 to 0.7
    return model


def test_keypoint_rcnn_batched_loss_of_an_image_without_instances_is_torchvisions(doubtful):
    imgs = [images()[0], images()[0].flip(-1)]
    ids = [IDS[0], "wide, flipped"]
    found = detection.predict(doubtful, imgs)
    assert [int((f["scores"] >= 0.6).sum()) for f in found] == [3, 0]
    batched, loop = (keypoints.rows(doubtful, imgs, ids, Settings("gradnorm", box_threshold=0.6, method=m), None)
                     for m in ("ghost", "loop"))
    assert all(math.isfinite(r["loss"]) for r in batched), [r["loss"] for r in batched]
    assert [r["loss"] for r in batched] == pytest.approx([r["loss"] for r in loop], rel=1e-12)
    assert [r["score"] for r in batched] == pytest.approx([r["score"] for r in loop], rel=1e-9)
    # the image without instances against torchvision's own training loss
    norm, loss = oracle(doubtful, imgs[1], [], [], [], detection.image_seed(0, ids[1]))
    assert batched[1]["loss"] == pytest.approx(loss, rel=1e-12)
    assert batched[1]["score"] == pytest.approx(norm, rel=1e-9)


# --- a detection manifest's given boxes: refused in one sentence, not silently ignored -------------

def test_a_manifest_with_given_boxes_is_refused_for_gradnorm_and_loss(tmp_path):
    import json

    import numpy as np
    import torchvision
    from PIL import Image

    from shell import invoke_in
    from test_detection import CLI_ARCH, CLI_KWARGS

    (tmp_path / "imgs").mkdir()
    rng = np.random.default_rng(0)
    for name in ("a.png", "b.png"):
        Image.fromarray((rng.random((50, 60, 3)) * 255).astype(np.uint8)).save(tmp_path / "imgs" / name)
    torch.manual_seed(0)
    model = torchvision.models.get_model(CLI_ARCH.split(":")[1], weights=None, weights_backbone=None, **CLI_KWARGS)
    torch.save(model.state_dict(), tmp_path / "det.pt")
    boxes = json.dumps([[1, 2, 30, 40, 1]]).replace('"', '""')
    (tmp_path / "given.csv").write_text(f'path,boxes\nimgs/a.png,"{boxes}"\nimgs/b.png,\n')
    (tmp_path / "plain.csv").write_text("path\nimgs/a.png\nimgs/b.png\n")
    common = ("--model", "det.pt", "--arch", CLI_ARCH, "--arch-kwargs", json.dumps(CLI_KWARGS))
    for strategy in ("gradnorm", "loss"):
        refused = invoke_in(tmp_path, "score", "given.csv", *common, "--task", "detection", "-s", strategy, "-o", "s.csv")
        assert refused.exit_code != 0
        said = " ".join(refused.output.split())
        assert "manifest given.csv has a 'boxes' column, but detection does not read given boxes" in said, said
    (tmp_path / "labeled.csv").write_text("path,label\nimgs/a.png,1\nimgs/b.png,\n")
    refused = invoke_in(tmp_path, "score", "labeled.csv", *common, "--task", "detection", "-s", "gradnorm", "-o", "s.csv")
    assert "manifest labeled.csv has a 'label' column" in " ".join(refused.output.split()), refused.output
    untold = invoke_in(tmp_path, "score", "given.csv", *common, "-s", "gradnorm", "-o", "s.csv")  # --task auto
    assert untold.exit_code == 1 and "has a 'boxes' column" in " ".join(untold.output.split()), untold.output
    done = invoke_in(tmp_path, "score", "plain.csv", *common, "-s", "gradnorm", "-o", "s.csv")
    assert done.exit_code == 0, done.output


@pytest.mark.parametrize("task", ["detection", "instance-segmentation", "keypoints"])
def test_every_detector_task_refuses_a_manifests_given_boxes(tmp_path, task):
    """Mask and Keypoint R-CNN score at their predicted instances as detection does: a manifest's
    `boxes` column is refused in one sentence naming the task, not silently ignored."""
    import json

    import numpy as np
    from PIL import Image

    from alcli import tasks
    from alcli.pools import open_pool
    from alcli.pools.common import PoolOptions

    Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(tmp_path / "a.png")
    boxes = json.dumps([[1, 2, 5, 6, 1]]).replace('"', '""')
    (tmp_path / "given.csv").write_text(f'path,boxes\na.png,"{boxes}"\n')
    (tmp_path / "plain.csv").write_text("path\na.png\n")
    refuse = tasks.TASKS[task].unanswered
    said = refuse(open_pool(str(tmp_path / "given.csv"), PoolOptions()), "gradnorm")
    assert said is not None and f"has a 'boxes' column, but {task} does not read given boxes" in said
    assert refuse(open_pool(str(tmp_path / "plain.csv"), PoolOptions()), "gradnorm") is None
