"""Issue 49 (a newcomer's first hour, round 3), items 2, 5 and 12, each against numbers computed
here: a causal-LM prompt alone's `confidence` is its last token's top probability (the model's own
logits in float64); `score --class-names` for keypoints names the keypoints (checked against the
keypoint head's count, not the classes) and `select` takes the same file; keypoint pre-labels
score the sigmoid of the heatmap logit (0..1); segmentation's `pred_mask` is relative to the
table's folder, and `select` reads it from there whatever the working folder."""
from __future__ import annotations

import csv
import json
import math
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from conftest import parse_csv, score_in
from shell import invoke_in

# --- item 2: a causal-LM prompt alone's confidence ------------------------------------------------

LM_ROWS = [
    {"id": "asked", "prompt": "the red dog"},                       # a prompt alone
    {"id": "answered", "prompt": "the cat sat on", "response": " the mat"},
]


@pytest.fixture(scope="module")
def lm_dir(tmp_path_factory):
    """A tiny GPT-2 with a word-level tokenizer that adds no special token, right padding."""
    pytest.importorskip("transformers")
    import transformers as tf
    from tokenizers import Tokenizer, models, pre_tokenizers
    import hf_models
    root = tmp_path_factory.mktemp("lm")
    torch.manual_seed(0)
    tf.GPT2LMHeadModel(tf.GPT2Config(vocab_size=len(hf_models.VOCAB), n_embd=32, n_layer=2, n_head=2,
                                     n_positions=64, pad_token_id=0, bos_token_id=2, eos_token_id=3)
                       ).save_pretrained(root / "lm")
    core = Tokenizer(models.WordLevel({w: i for i, w in enumerate(hf_models.VOCAB)}, unk_token="[UNK]"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    tf.PreTrainedTokenizerFast(tokenizer_object=core, pad_token="[PAD]", unk_token="[UNK]",
                               model_max_length=64, model_input_names=["input_ids", "attention_mask"]
                               ).save_pretrained(root / "lm")
    (root / "pool.jsonl").write_text("".join(json.dumps(r) + "\n" for r in LM_ROWS))
    return root


def lm_oracle(root: Path) -> dict:
    """Per row, from the model's own logits in float64, each row alone: the top probability after
    the prompt alone's last token; for the answered row the mean over its answer's positions."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    model = AutoModelForCausalLM.from_pretrained(root / "lm").double().eval()
    tok = AutoTokenizer.from_pretrained(root / "lm")
    want = {}
    for row in LM_ROWS:
        ids = tok(row["prompt"] + row.get("response", ""))["input_ids"]
        with torch.no_grad():
            top = model(input_ids=torch.tensor([ids])).logits[0].double().softmax(-1).max(-1).values  # [T]
        if "response" in row:
            first = len(tok(row["prompt"])["input_ids"])  # the answer's first token
            want[row["id"]] = top[first - 1:len(ids) - 1].mean().item()
        else:
            want[row["id"]] = top[-1].item()
    return want


@pytest.mark.parametrize("strategy", [["-s", "entropy"], ["-s", "egl", "--egl-samples", "pseudo",
                                                          "--max-new-tokens", "2"]])
def test_a_prompt_alone_is_as_confident_as_its_last_tokens_top_probability(lm_dir, strategy):
    rows = {r["id"]: r for r in parse_csv(score_in(lm_dir, "pool.jsonl", "-m", "lm", *strategy,
                                                   "-b", "2", "--no-embeddings").stdout)}
    want = lm_oracle(lm_dir)
    assert 0 < want["asked"] < 1
    for id_, w in want.items():
        assert float(rows[id_]["confidence"]) == pytest.approx(w, rel=1e-5), id_


# --- items 5 and 12: keypoints ----------------------------------------------------------------------

K = 3
KP_NAMES = ["nose", "left eye", "right eye"]
KP_ARCH = "torchvision:keypointrcnn_resnet50_fpn"
KP_KWARGS = {"num_classes": 2, "num_keypoints": K, "min_size": 64, "max_size": 96,
             "rpn_pre_nms_top_n_test": 50, "rpn_post_nms_top_n_test": 50, "box_detections_per_img": 2}


def sigmoid64(x: float) -> float:
    return float(1 / (1 + np.exp(-np.float64(x))))


@pytest.fixture(scope="module")
def kp_dir(tmp_path_factory):
    torchvision = pytest.importorskip("torchvision")
    root = tmp_path_factory.mktemp("kp")
    rng = np.random.default_rng(0)
    (root / "imgs").mkdir()
    Image.fromarray((rng.random((60, 80, 3)) * 255).astype(np.uint8)).save(root / "imgs" / "a.png")
    torch.manual_seed(0)
    model = torchvision.models.get_model(KP_ARCH.split(":")[1], weights=None, weights_backbone=None,
                                         **KP_KWARGS).eval()
    torch.save(model.state_dict(), root / "kp.pt")
    (root / "names.txt").write_text("\n".join(KP_NAMES) + "\n")
    (root / "four.txt").write_text("\n".join(KP_NAMES + ["tail"]) + "\n")
    return root


KP_COMMON = ["--model", "kp.pt", "--arch", KP_ARCH, "--arch-kwargs", json.dumps(KP_KWARGS),
             "--strategy", "entropy", "--box-threshold", "0", "-q"]


def test_keypoints_class_names_name_the_keypoints_in_score_and_select(kp_dir):
    """score takes the names file naming the K keypoints (the model has 2 classes), records them,
    and select hands them to Label Studio with scores in 0..1: the sigmoid of the table's heatmap
    logits, computed here in float64."""
    done = invoke_in(kp_dir, "score", "imgs", *KP_COMMON, "--class-names", "names.txt", "-o", "scores.csv")
    assert done.exit_code == 0, done.stderr
    assert json.load(open(kp_dir / "scores.csv.meta.json"))["class_names"] == KP_NAMES
    done = invoke_in(kp_dir, "select", "scores.csv", "--budget", "1", "--no-diverse", "-f", "labelstudio",
                     "--class-names", "names.txt", "-o", "tasks.json")
    assert done.exit_code == 0, done.stderr
    row = next(csv.DictReader(open(kp_dir / "scores.csv")))
    points = [p for instance in json.loads(row["keypoints"]) for p in instance]
    result = json.load(open(kp_dir / "tasks.json"))[0]["predictions"][0]["result"]
    assert len(result) == len(points) > 0
    assert [r["value"]["keypointlabels"] for r in result] == [[KP_NAMES[k % K]] for k in range(len(points))]
    for region, (_, _, logit) in zip(result, points):
        assert 0 <= region["score"] <= 1
        assert region["score"] == pytest.approx(sigmoid64(logit), rel=1e-12, abs=1e-300)


def test_keypoint_names_of_another_count_are_one_sentence(kp_dir):
    done = invoke_in(kp_dir, "score", "imgs", *KP_COMMON, "--class-names", "four.txt", "-o", "four.csv")
    assert done.exit_code != 0
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert "four.txt" in lines[0] and "4 keypoints" in lines[0] and "predicts 3" in lines[0], lines[0]


def test_a_keypoint_pre_labels_score_is_the_sigmoid_of_its_logit_at_any_size():
    from alcli.selection.export import to_labelstudio
    logits = [14.2, 0.0, -3.5, 800.0, -800.0]
    row = {"id": "a", "score": 1.0, "boxes": json.dumps([[0, 0, 10, 10, 2, 0.9]]), "width": 10, "height": 10,
           "keypoints": json.dumps([[[1.0, 2.0, s] for s in logits]])}
    names = [f"k{i}" for i in range(len(logits))]
    result = to_labelstudio([row], None, "m", class_names=names, task="keypoints")[0]["predictions"][0]["result"]
    got = [r["score"] for r in result]
    want = [math.exp(-math.log1p(math.exp(-s))) if s > -700 else 0.0 for s in logits]  # 1/(1+e^-s)
    assert got == pytest.approx(want, rel=1e-12, abs=1e-300)
    assert got[0] == pytest.approx(0.99999932, rel=1e-6) and got[1] == 0.5
    assert all(0 <= g <= 1 for g in got)


# --- item 12: segmentation's pred_mask, relative to the table ------------------------------------

UNET = ["--arch", "task_models:TinyUNet", "--trust-checkpoint"]


def test_pred_mask_is_relative_to_the_table_and_select_reads_it_from_anywhere(tmp_path):
    """score -o out/scores.csv names each mask relative to out/ (out/scores.csv.masks/...); select
    run from another folder reads it there: the brushes are the mask's own pixels."""
    import task_models as tm
    from alcli.tasks.shared.labelstudio import rle_to_mask
    from alcli.files.names import id_file
    rng = np.random.default_rng(0)
    (tmp_path / "imgs").mkdir()
    for i, (h, w) in enumerate([(20, 30), (18, 26)]):
        Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(tmp_path / "imgs" / f"i{i}.png")
    torch.save(tm.unet().state_dict(), tmp_path / "seg.pt")
    (tmp_path / "out").mkdir()
    (tmp_path / "names.txt").write_text("background\nroad\ncar\n")
    done = invoke_in(tmp_path, "score", "imgs", "--model", "seg.pt", *UNET, "--resize", "24x24",
                     "--task", "segmentation", "--strategy", "entropy", "-o", "out/scores.csv", "-q")
    assert done.exit_code == 0, done.stderr
    rows = list(csv.DictReader(open(tmp_path / "out" / "scores.csv")))
    for row in rows:
        assert row["pred_mask"] == os.path.join("scores.csv.masks", id_file(row["id"], ".png"))
        assert (tmp_path / "out" / row["pred_mask"]).is_file()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    done = invoke_in(elsewhere, "select", "../out/scores.csv", "--budget", "2", "--no-diverse", "-f",
                     "labelstudio", "--class-names", "../names.txt", "-o", "tasks.json")
    assert done.exit_code == 0, done.stderr + done.stdout
    tasks = {t["data"]["alcli_id"]: t for t in json.load(open(elsewhere / "tasks.json"))}
    painted_any = False
    for row in rows:
        with Image.open(tmp_path / "out" / row["pred_mask"]) as img:
            mask = np.array(img)
        for region in tasks[row["id"]]["predictions"][0]["result"]:
            index = ["background", "road", "car"].index(region["value"]["brushlabels"][0])
            painted = rle_to_mask(region["value"]["rle"], *mask.shape)
            np.testing.assert_array_equal(painted, mask == index)
            painted_any = True
        assert {r["value"]["brushlabels"][0] for r in tasks[row["id"]]["predictions"][0]["result"]} == \
            {["background", "road", "car"][c] for c in np.unique(mask).tolist() if c != 0}
    assert painted_any
