"""Every task end to end on the command line: `alcli score` on an image folder with a torchvision
segmentation checkpoint, text pools with Hugging Face token-classification, multilabel and
regression directories, then `alcli select -n 10` on each table (diverse by default, from the
BADGE factors each task records), and `alcli inspect` naming the task."""
from __future__ import annotations

import csv
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


# --- labels from pools: gradnorm and loss at the true labels, against the float64 loop --------------

def labeled_texts(ws, name, label_of):
    """texts.jsonl's first 8 texts with `label_of(i, words)` as their label (None: no label)."""
    rows = [json.loads(line) for line in (ws / "texts.jsonl").read_text().splitlines()][:8]
    with open(ws / name, "w") as f:
        for i, row in enumerate(rows):
            label = label_of(i, row["text"].split())
            f.write(json.dumps({**row, **({"label": label} if label is not None else {})}) + "\n")
    return rows


def encoded(ws, model_dir, texts):
    """The texts tokenized as a batch: [CLS] one token per word [SEP], then padding."""
    tok = hf_models.tokenizer(ws / f"{model_dir}_tok")
    enc = tok(texts, padding="longest", return_tensors="pt")
    return {k: enc[k] for k in ("input_ids", "token_type_ids", "attention_mask")}


def oracle_rows(ws, model_dir, task, texts, targets):
    """(gradnorm, loss) per example, one at a time through a float64 copy."""
    from transformers import AutoModelForTokenClassification, AutoModelForSequenceClassification
    kind = AutoModelForTokenClassification if task == "token-classification" else AutoModelForSequenceClassification
    model = kind.from_pretrained(ws / model_dir).eval()
    x = encoded(ws, model_dir, texts)
    norms = tm.loop_norms(model, x, task, targets)
    m = model.double()
    with torch.no_grad():
        z = m(**x).logits
    losses = torch.stack([tm.oracle_loss(task, z[i:i + 1], targets[i:i + 1]) for i in range(len(texts))])
    return norms, losses


def scored(ws, out, *args):
    run(ws, "score", *args, "--strategy", "gradnorm", "-b", "8", "-o", out, "-q")
    return {r["id"]: r for r in parse_csv((ws / out).read_text())}


def check_against(table, rows, norms, losses):
    for i, row in enumerate(rows):
        got = table[row["id"]]
        assert float(got["score"]) == pytest.approx(float(norms[i]), rel=2e-5, abs=1e-8), row["id"]
        assert float(got["loss"]) == pytest.approx(float(losses[i]), rel=2e-5, abs=1e-8), row["id"]


def test_token_labels_per_word_and_special_tokens_left_out(ws):
    """Labels per word for some texts: the loss is at them on each word's token; [CLS], [SEP] and
    padding count nowhere, with or without labels (unlabeled: at the predicted tags)."""
    label_of = lambda i, words: [(i + k) % tm.CLASSES for k in range(len(words))] if i % 2 == 0 else None
    rows = labeled_texts(ws, "ner_labeled.jsonl", label_of)
    table = scored(ws, "ner_l.csv", "ner_labeled.jsonl", "--model", "ner")
    texts = [r["text"] for r in rows]
    x = encoded(ws, "ner", texts)
    from transformers import AutoModelForTokenClassification
    with torch.no_grad():
        pred = AutoModelForTokenClassification.from_pretrained(ws / "ner").eval()(**x).logits.argmax(-1)
    t = torch.full(x["input_ids"].shape, tm.IGNORE)
    for i, text in enumerate(texts):
        words = text.split()
        given = label_of(i, words)
        for k in range(len(words)):  # word k is token k + 1 ([CLS] first); [SEP] and padding after
            t[i, k + 1] = given[k] if given is not None else pred[i, k + 1]
    norms, losses = oracle_rows(ws, "ner", "token-classification", texts, t)
    check_against(table, rows, norms, losses)
    assert table["t00"]["label"] == "|".join(map(str, label_of(0, texts[0].split())))
    assert table["t01"]["label"] == ""
    with open(ws / "ner_labeled.csv", "w", newline="") as f:  # a CSV: the word labels joined by |
        w = csv.writer(f)
        w.writerow(["id", "text", "label"])
        for i, text in enumerate(texts):
            given = label_of(i, text.split())
            w.writerow([rows[i]["id"], text, "" if given is None else "|".join(map(str, given))])
    from_csv = scored(ws, "ner_csv.csv", "ner_labeled.csv", "--model", "ner")
    assert {k: r["score"] for k, r in from_csv.items()} == {k: r["score"] for k, r in table.items()}


def test_multilabel_and_regression_labels(ws):
    label_of = lambda i, words: [c for c in range(tm.CLASSES) if (i >> c) & 1] if i != 3 else None
    rows = labeled_texts(ws, "tags_labeled.jsonl", label_of)
    table = scored(ws, "tags_l.csv", "tags_labeled.jsonl", "--model", "tags")
    texts = [r["text"] for r in rows]
    from transformers import AutoModelForSequenceClassification
    with torch.no_grad():
        z = AutoModelForSequenceClassification.from_pretrained(ws / "tags").eval()(**encoded(ws, "tags", texts)).logits
    t = (z > 0).long()
    for i in range(len(texts)):
        if label_of(i, None) is not None:
            t[i] = torch.tensor([int(c in label_of(i, None)) for c in range(tm.CLASSES)])
    check_against(table, rows, *oracle_rows(ws, "tags", "multilabel", texts, t))
    assert table["t05"]["label"] == "0|2"

    value = lambda i, words: 0.5 * i - 1.25
    rows = labeled_texts(ws, "value_labeled.jsonl", value)
    table = scored(ws, "value_l.csv", "value_labeled.jsonl", "--model", "value")
    t = torch.tensor([[value(i, None)] for i in range(len(rows))], dtype=torch.float64)
    check_against(table, rows, *oracle_rows(ws, "value", "regression", [r["text"] for r in rows], t))
    assert float(table["t03"]["label"]) == 0.25


def masks(ws, folder="masks", size=16):
    (ws / folder).mkdir(exist_ok=True)
    rng = np.random.default_rng(3)
    out = {}
    for i in range(4):
        m = rng.integers(0, 3, (size, size)).astype(np.uint8)
        m[:2, :] = 255  # ignored
        Image.fromarray(m, mode="L").save(ws / folder / f"im{i:02d}.png")
        out[f"im{i:02d}"] = m
    return out


def test_segmentation_mask_labels(ws):
    given = masks(ws)
    with open(ws / "seg.jsonl", "w") as f:
        for i in range(6):
            row = {"id": f"im{i:02d}", "path": f"images/im{i:02d}.png"}
            f.write(json.dumps({**row, **({"mask": f"masks/im{i:02d}.png"} if i < 4 else {})}) + "\n")
    table = scored(ws, "seg_l.csv", "seg.jsonl", *SCORES["segmentation"][1:])
    model = tm.lraspp()
    model.load_state_dict(torch.load(ws / "seg.pt"))
    model.eval()
    mean, std = torch.tensor([0.485, 0.456, 0.406]).view(3, 1, 1), torch.tensor([0.229, 0.224, 0.225]).view(3, 1, 1)
    x = torch.stack([(torch.from_numpy(np.array(Image.open(ws / "images" / f"im{i:02d}.png"))).permute(2, 0, 1) / 255.0
                      - mean) / std for i in range(6)]).float()
    with torch.no_grad():
        pred = model(x)["out"].argmax(1)
    t = pred.clone()
    for i in range(4):
        m = torch.from_numpy(given[f"im{i:02d}"].astype(np.int64))
        t[i] = torch.where(m == 255, torch.full_like(m, tm.IGNORE), m)
    norms = tm.loop_norms(model, x, "segmentation", t)
    m64 = copy_double(model)
    with torch.no_grad():
        z = m64(x.double())["out"]
    losses = torch.stack([tm.oracle_loss("segmentation", z[i:i + 1], t[i:i + 1]) for i in range(6)])
    check_against(table, [{"id": f"im{i:02d}"} for i in range(6)], norms, losses)
    assert table["im00"]["label"].endswith("masks/im00.png") and table["im05"]["label"] == ""


def copy_double(model):
    import copy
    return copy.deepcopy(model).double().eval()


def test_bad_labels_are_one_sentence_naming_the_row(ws):
    labeled_texts(ws, "ner_bad.jsonl", lambda i, words: [0] * (len(words) + (i == 2)))
    bad = run(ws, "score", "ner_bad.jsonl", "--model", "ner", "--strategy", "gradnorm", "-o", "b.csv", ok=False)
    assert_one_error(bad, "ner_bad.jsonl line 3", "token labels of another length")
    labeled_texts(ws, "tags_bad.jsonl", lambda i, words: [0, 7] if i == 4 else [1])
    bad = run(ws, "score", "tags_bad.jsonl", "--model", "tags", "--strategy", "loss", "-o", "b.csv", ok=False)
    assert_one_error(bad, "tags_bad.jsonl line 5: label 7 is out of range", "class out of range")
    labeled_texts(ws, "value_bad.jsonl", lambda i, words: [1.0, 2.0] if i == 1 else 1.0)
    bad = run(ws, "score", "value_bad.jsonl", "--model", "value", "--strategy", "loss", "-o", "b.csv", ok=False)
    assert_one_error(bad, "value_bad.jsonl line 2", "regression values of another count")
    masks(ws, "masks_big", size=20)
    (ws / "masks_big" / "broken.png").write_bytes(b"not a png")
    for name, mask, culprit in (("size", "masks_big/im00.png", "is 20x20 pixels"),
                                ("broken", "masks_big/broken.png", "masks_big/broken.png cannot be read")):
        (ws / f"seg_{name}.jsonl").write_text(json.dumps({"path": "images/im00.png", "mask": mask}) + "\n")
        bad = run(ws, "score", f"seg_{name}.jsonl", *SCORES["segmentation"][1:], "--strategy", "gradnorm",
                  "-o", "b.csv", ok=False)
        assert_one_error(bad, culprit, name)
        assert f"seg_{name}.jsonl line 1" in bad.stderr
    # labels lists on a classification model: the row, and the --task that reads them
    labeled_texts(ws, "cls_bad.jsonl", lambda i, words: [0, 1])
    bad = run(ws, "score", "cls_bad.jsonl", "--model", "tags", "--task", "classification", "-o", "b.csv", ok=False)
    assert_one_error(bad, "cls_bad.jsonl line 1: label [0, 1] is not a class index", "lists for classification")


def test_resume_with_every_row_done_records_the_task(ws):
    """A partial file holding every row (the run stopped before writing its table): the resumed
    run scores nothing and still names the task in .meta.json."""
    from alcli.api import settings_for
    from alcli.longrun import job
    import os
    old = os.getcwd()
    os.chdir(ws)
    try:
        kw = dict(model="value", pool="texts.jsonl", batch_size=32)

        def stop(done):
            raise KeyboardInterrupt
        with pytest.raises(KeyboardInterrupt):
            job.score(settings_for(None, **kw), "resumed.csv", on_batch=stop)
        assert (ws / "resumed.csv.partial").exists()
        result = job.score(settings_for(None, resume=True, **kw), "resumed.csv")
        assert result.stats.count == 0
    finally:
        os.chdir(old)
    assert json.loads((ws / "resumed.csv.meta.json").read_text())["task"] == "regression"
