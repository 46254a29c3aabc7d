"""Every task end to end on the command line: `alcli score` on an image folder with a torchvision
segmentation checkpoint, text pools with Hugging Face token-classification, multilabel and
regression directories, then `alcli select -n 10` on each table (diverse by default, from the
BADGE factors each task records), and `alcli inspect` naming the task."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from typer.testing import CliRunner

import task_models as tm
from cli_errors import assert_one_error
from conftest import parse_csv
from alcli.cli import app

pytest.importorskip("transformers")
import hf_models  # noqa: E402

runner = CliRunner()
WORDS = hf_models.WORDS


@pytest.fixture(scope="module")
def ws(tmp_path_factory):
    root = tmp_path_factory.mktemp("tasks_ws")
    rng = np.random.default_rng(0)
    (root / "images").mkdir()
    for i in range(12):
        Image.fromarray(rng.integers(0, 256, (16, 16, 3), dtype=np.uint8)).save(root / "images" / f"im{i:02d}.png")
    (root / "mixed").mkdir()
    for i, side in enumerate((16, 16, 24)):
        Image.fromarray(rng.integers(0, 256, (side, side, 3), dtype=np.uint8)).save(root / "mixed" / f"m{i}.png")
    torch.save(tm.lraspp().state_dict(), root / "seg.pt")
    models = {"ner": tm.bert_tokens, "tags": tm.bert_multilabel, "value": tm.bert_regression}
    for name, make in models.items():
        model = make()
        model.resize_token_embeddings(len(hf_models.VOCAB))
        model.save_pretrained(root / name)
        hf_models.tokenizer(root / name).save_pretrained(root / name)
    with open(root / "texts.jsonl", "w") as f:
        for i in range(14):
            words = [WORDS[(i * 7 + k * 3) % len(WORDS)] for k in range(2 + i % 5)]
            f.write(json.dumps({"id": f"t{i:02d}", "text": " ".join(words)}) + "\n")
    return root


def run(root: Path, *args, ok=True):
    import os
    old = os.getcwd()
    os.chdir(root)
    try:
        result = runner.invoke(app, [*map(str, args)])
    finally:
        os.chdir(old)
    if ok:
        assert result.exit_code == 0, result.stderr + result.stdout
    return result


SCORES = {
    "segmentation": ["images", "--model", "seg.pt", "--arch", "torchvision:lraspp_mobilenet_v3_large",
                     "--arch-kwargs", '{"num_classes": 3}', "--normalize", "imagenet"],
    "token-classification": ["texts.jsonl", "--model", "ner"],
    "multilabel": ["texts.jsonl", "--model", "tags"],
    "regression": ["texts.jsonl", "--model", "value"],
}


@pytest.mark.parametrize("task", SCORES)
def test_score_then_select_ten_for_every_task(ws, task):
    out = f"{task}.csv"
    run(ws, "score", *SCORES[task], "-b", "8", "-o", out, "-q")
    rows = parse_csv((ws / out).read_text())
    assert len(rows) == (12 if task == "segmentation" else 14)
    assert all(float(r["score"]) > 0 for r in rows)
    meta = json.loads((ws / f"{out}.meta.json").read_text())
    assert meta["task"] == task
    if task == "regression":
        assert rows[0]["confidence"] == "" and "loss" not in rows[0]
    else:
        assert "egl_se" in rows[0] and 0 < float(rows[0]["confidence"]) <= 1
    assert (ws / f"{out}.emb.npz").exists()
    picked = run(ws, "select", out, "-n", "10")
    chosen = parse_csv(picked.stdout)
    assert len(chosen) == 10 and len({r["id"] for r in chosen}) == 10
    assert "not diverse" not in picked.stderr and "no embeddings" not in picked.stderr


def test_the_task_flag_is_in_the_run_key_and_inspect_names_the_task(ws):
    shown = run(ws, "inspect", "--model", "ner")
    assert "task: token-classification" in shown.stdout
    shown = run(ws, "inspect", "--model", "seg.pt", "--arch", "torchvision:lraspp_mobilenet_v3_large",
                "--arch-kwargs", '{"num_classes": 3}', "--pool", "images")
    assert "task: segmentation" in shown.stdout and "method: ghost" in shown.stdout
    run(ws, "score", *SCORES["multilabel"], "--strategy", "entropy", "--aggregate", "max",
        "-o", "agg.csv", "-q")
    meta = json.loads((ws / "agg.csv.meta.json").read_text())
    assert meta["run"]["aggregate"] == "max" and meta["task"] == "multilabel"


def test_bad_input_is_one_sentence(ws):
    bad = run(ws, "score", *SCORES["token-classification"], "--task", "segmentation", "-o", "x.csv", ok=False)
    assert_one_error(bad, "--task segmentation", "task")
    bad = run(ws, "score", "mixed", *SCORES["segmentation"][1:], "-b", "4", "-o", "y.csv", ok=False)
    assert_one_error(bad, "m2", "sizes")
    bad = run(ws, "score", *SCORES["regression"], "--strategy", "margin", "-o", "z.csv", ok=False)
    assert_one_error(bad, "--strategy margin", "utility")
    bad = run(ws, "score", *SCORES["multilabel"], "--aggregate", "top:2", "-o", "z.csv", ok=False)
    assert_one_error(bad, "--aggregate", "aggregate")
