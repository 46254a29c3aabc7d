"""Every task end to end on the command line: `alcli score` on an image folder with a torchvision
segmentation checkpoint, text pools with Hugging Face token-classification, multilabel and
regression directories, then `alcli select -n 10` on each table (diverse by default, from the
BADGE factors each task records), and `alcli inspect` naming the task."""
from __future__ import annotations

import csv
import json
import math
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
    run(ws, "score", *SCORES[task], "-s", "egl", "-b", "8", "-o", out, "-q")  # not the task's default
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


def summary_of(result) -> dict:
    """The summary object of a run with --log-format json."""
    lines = [json.loads(line) for line in result.stderr.splitlines() if line.startswith("{")]
    return next(line for line in lines if line.get("event") == "summary")


@pytest.mark.parametrize("task", SCORES)
def test_the_summary_names_the_engine_method_that_ran(ws, task):
    """Each task's gradients go through the engine with the task's own loss (regression egl: one
    output's value); `auto` settles on a method for it, and the summary names that method."""
    done = run(ws, "score", *SCORES[task], "-s", "egl", "-b", "8", "-o", f"method-{task}.csv",
               "--log-format", "json")
    facts = summary_of(done)
    assert facts["strategy"] == "egl"
    assert facts["method"] in ("ghost", "vmap", "loop"), facts
    assert "not decided" not in facts["method_reason"] and facts["method_reason"], facts


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


def test_multilabel_labels_are_shown_by_name_and_an_empty_cell_is_unknown(ws):
    """With class names known, `label` names the classes as `pred` does, whether the pool gave
    indices or names; a text labeled with none of the labels shows `[]`, an unlabeled one an
    empty cell (docs/tasks.md)."""
    (ws / "tag_names.txt").write_text("red\ngreen\nblue\n")
    labels = {0: [0, 2], 1: ["green"], 2: "0|green", 3: [], 4: None}
    labeled_texts(ws, "tags_named.jsonl", lambda i, words: labels.get(i, [1]))
    table = scored(ws, "tags_named.csv", "tags_named.jsonl", "--model", "tags", "--class-names", "tag_names.txt")
    shown = {k: table[k]["label"] for k in ("t00", "t01", "t02", "t03", "t04")}
    assert shown == {"t00": "red|blue", "t01": "green", "t02": "red|green", "t03": "[]", "t04": ""}
    assert all(set(filter(None, r["pred"].split("|"))) <= {"red", "green", "blue"} for r in table.values())
    # the cells are labels as a manifest gives them: `[]` is the empty set, an empty cell no label
    with open(ws / "tags_again.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["id", "text", "label"])
        for line in (ws / "tags_named.jsonl").read_text().splitlines():
            row = json.loads(line)
            w.writerow([row["id"], row["text"], table[row["id"]]["label"]])
    again = scored(ws, "tags_again_out.csv", "tags_again.csv", "--model", "tags", "--class-names",
                   "tag_names.txt", "--task", "multilabel")
    assert {k: r["label"] for k, r in again.items()} == {k: r["label"] for k, r in table.items()}
    assert {k: r["loss"] for k, r in again.items()} == {k: r["loss"] for k, r in table.items()}


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


# --- token classification: one position per word (its first sub-token), labeled or not -------------

SUBWORD_TEXTS = ["the cats sated on mats", "birds flewing away fasts", "a dog ran", "cats and dogs ran",
                 "the red birds stopped", "mats sated", "small cats flewing", "the dog"]


def _subword_tokenizer(directory: Path):
    """hf_models' word-piece tokenizer with suffixes, so that words split: cats = cat ##s."""
    from transformers import BertTokenizerFast
    directory.mkdir(parents=True, exist_ok=True)
    vocab = str(directory / "vocab.txt")
    (directory / "vocab.txt").write_text("\n".join(hf_models.VOCAB + ["##s", "##ed", "##ing"]) + "\n")
    return BertTokenizerFast(vocab_file=vocab, vocab=vocab, model_max_length=64)


def test_token_scores_count_each_word_at_its_first_sub_token_labeled_or_not(ws):
    """A mixed pool (3 texts labeled, one word of them null; 5 unlabeled) of words split into
    sub-tokens: gradnorm, loss, egl and entropy against a float64 per-example loop in which the
    labels, the pseudo-labels, the samples and the entropies all sit on each word's first
    sub-token (HF's word_ids, not alcli's offsets), and nowhere else."""
    from alcli.tasks.common import uniforms

    model, tok = tm.bert_tokens(), _subword_tokenizer(ws / "ner_sub")
    model.save_pretrained(ws / "ner_sub")
    tok.save_pretrained(ws / "ner_sub")
    given = {0: [1, 2, 0, None, 2], 3: [2, 1, 0, 1], 5: [0, 2]}
    ids = [f"s{i}" for i in range(len(SUBWORD_TEXTS))]
    with open(ws / "subwords.jsonl", "w") as f:
        for i, text in enumerate(SUBWORD_TEXTS):
            f.write(json.dumps({"id": ids[i], "text": text, **({"label": given[i]} if i in given else {})}) + "\n")
    enc = tok(SUBWORD_TEXTS, padding="longest", return_tensors="pt")
    x = {k: enc[k] for k in ("input_ids", "token_type_ids", "attention_mask")}
    b, t = x["input_ids"].shape
    first = torch.zeros(b, t, dtype=torch.bool)
    word = torch.full((b, t), -1)
    for i in range(b):
        seen = set()
        for j, w in enumerate(enc.word_ids(i)):
            if w is not None and w not in seen:
                seen.add(w)
                first[i, j], word[i, j] = True, w
    assert int(first.sum()) < int(x["attention_mask"].sum()) - 2 * b  # some words do split
    with torch.no_grad():
        probs = model.double()(**x).logits.softmax(-1)                      # [B, T, C] float64
    model.float()

    def at_first(labels):  # [B, T] labels -> targets: given where known, IGNORE off first sub-tokens
        out = torch.where(first, labels, torch.full_like(labels, tm.IGNORE))
        for i, words in given.items():
            for j in range(t):
                if first[i, j]:
                    out[i, j] = tm.IGNORE if words[word[i, j]] is None else words[word[i, j]]
        return out

    pseudo = at_first(probs.argmax(-1))
    norms = tm.loop_norms(model, x, "token-classification", pseudo)
    losses = [float(tm.oracle_loss("token-classification", probs[i:i + 1].log(), pseudo[i:i + 1]))
              for i in range(b)]
    samples = 3  # egl: inverse-CDF draws at every position from the seeded uniforms; unlabeled too
    u = uniforms(ids, t, samples, 0, "cpu")                                   # [S, B, T]
    drawn = (u.unsqueeze(-1) >= probs.cumsum(-1)[..., :-1]).sum(-1)           # [S, B, T]
    sampled = [torch.where(first, d, torch.full_like(d, tm.IGNORE)) for d in drawn]
    egl = torch.stack([tm.loop_norms(model, x, "token-classification", s) for s in sampled]).mean(0)
    h = -(probs * probs.log()).sum(-1)                                        # [B, T]
    entropy = (h * first).sum(1) / first.sum(1)
    want = {"gradnorm": norms, "loss": losses, "egl": egl, "entropy": entropy}
    for strategy, values in want.items():
        run(ws, "score", "subwords.jsonl", "--model", "ner_sub", "--strategy", strategy,
            "--egl-samples", samples, "--seed", 0, "-b", 8, "-o", f"sub_{strategy}.csv", "-q")
        table = {r["id"]: r for r in parse_csv((ws / f"sub_{strategy}.csv").read_text())}
        for i, id_ in enumerate(ids):
            assert float(table[id_]["score"]) == pytest.approx(float(values[i]), rel=2e-5, abs=1e-8), \
                (strategy, id_)
        if strategy == "gradnorm":
            for i, id_ in enumerate(ids):
                assert float(table[id_]["loss"]) == pytest.approx(losses[i], rel=2e-5, abs=1e-8), id_


def test_a_mask_ignoring_every_pixel_has_a_nan_loss_ranked_last_with_a_warning(ws):
    """Its loss, a mean over no pixel, is undefined: gradnorm and loss score it NaN (not 0), rank
    it last and count it in a warning; entropy, which needs no label, keeps its value."""
    masks(ws)
    (ws / "masks_none").mkdir(exist_ok=True)
    Image.fromarray(np.full((16, 16), 255, np.uint8), mode="L").save(ws / "masks_none" / "all255.png")
    with open(ws / "seg_none.jsonl", "w") as f:
        for i in range(4):
            mask = "masks_none/all255.png" if i == 1 else f"masks/im{i:02d}.png"
            f.write(json.dumps({"id": f"im{i:02d}", "path": f"images/im{i:02d}.png", "mask": mask}) + "\n")
    for strategy in ("gradnorm", "loss"):
        out = run(ws, "score", "seg_none.jsonl", *SCORES["segmentation"][1:], "--strategy", strategy,
                  "-o", f"none_{strategy}.csv")
        rows = parse_csv((ws / f"none_{strategy}.csv").read_text())
        assert rows[-1]["id"] == "im01", strategy
        assert math.isnan(float(rows[-1]["score"])) and math.isnan(float(rows[-1]["loss"])), strategy
        assert all(float(r["score"]) > 0 and float(r["loss"]) > 0 for r in rows[:-1]), strategy
        assert "1 example has a NaN score" in out.stderr and "a mask ignoring every pixel" in out.stderr
    run(ws, "score", "seg_none.jsonl", *SCORES["segmentation"][1:], "--strategy", "entropy", "-o", "none_e.csv")
    run(ws, "score", *SCORES["segmentation"], "--strategy", "entropy", "-o", "plain_e.csv")
    labeled = {r["id"]: r for r in parse_csv((ws / "none_e.csv").read_text())}
    plain = {Path(r["id"]).stem: r for r in parse_csv((ws / "plain_e.csv").read_text())}  # im00.png
    assert all(float(labeled[k]["score"]) == float(plain[k]["score"]) > 0 for k in labeled)
    assert math.isnan(float(labeled["im01"]["loss"])) and float(labeled["im00"]["loss"]) > 0
