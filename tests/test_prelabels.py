"""Label Studio pre-labels per task (`select -f labelstudio`) and the labeling config they fit
(`--labelstudio-config`): detection boxes in percent against a per-box loop in exact fractions,
multilabel choices, token-classification spans against word offsets found here, the per-word
predictions a real token-classification model writes (`pred_words`) against its float64 forward,
and bad input as one sentence. The real Label Studio round trip is tests/integration."""
from __future__ import annotations

import csv
import json
import os
import xml.etree.ElementTree as ET
from fractions import Fraction
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from cli_errors import assert_one_error
from conftest import parse_csv
from alcli.cli import app
from alcli.selection.export import entities, labeling_config, to_labelstudio

runner = CliRunner()
NAMES = ["background", "cat", "dog"]


def run(cwd: Path, *args, ok=True, stdin=None):
    old = os.getcwd()
    os.chdir(cwd)
    try:
        result = runner.invoke(app, [str(a) for a in args], input=stdin)
    finally:
        os.chdir(old)
    if ok:
        assert result.exit_code == 0, result.stderr + result.stdout
    return result


def write_table(path: Path, rows: list[dict], meta: dict | None = None) -> Path:
    columns = list(dict.fromkeys(k for r in rows for k in r))
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, columns)
        w.writeheader()
        w.writerows(rows)
    if meta is not None:
        Path(f"{path}.meta.json").write_text(json.dumps(meta))
    return path


# --- detection ------------------------------------------------------------------------------------

DETECTIONS = [
    {"id": "a.jpg", "score": 0.9, "width": 640, "height": 480,
     "boxes": json.dumps([[10.5, 20.25, 110.0, 220.75, 1, 0.93], [-5.0, 400.0, 700.0, 500.0, 2, 0.41],
                          [1.0, 2.0, 3.0, 4.0, 7, 0.3]])},
    {"id": "b.jpg", "score": 0.5, "width": 33, "height": 17, "boxes": "[]"},
    {"id": "c.jpg", "score": 0.25, "width": 333, "height": 101,
     "boxes": json.dumps([[0, 0, 333, 101, 2, 1.0]])},
]


def expected_boxes(row) -> list[dict]:
    """The oracle: each named box clipped to the image, in percent, by exact fractions."""
    w, h = Fraction(row["width"]), Fraction(row["height"])
    out = []
    for x0, y0, x1, y1, c, s in json.loads(row["boxes"]):
        if not 0 <= c < len(NAMES):
            continue
        clip = lambda v, hi: min(max(Fraction(v), Fraction(0)), hi)  # noqa: E731
        x0, x1, y0, y1 = clip(x0, w), clip(x1, w), clip(y0, h), clip(y1, h)
        out.append({"x": 100 * x0 / w, "y": 100 * y0 / h, "width": 100 * (x1 - x0) / w,
                    "height": 100 * (y1 - y0) / h, "label": NAMES[c], "score": s})
    return out


def test_detection_boxes_are_rectanglelabels_in_percent_of_the_image(tmp_path):
    table = write_table(tmp_path / "det.csv", DETECTIONS)  # no meta.json: the boxes column says so
    (tmp_path / "names.txt").write_text("\n".join(NAMES) + "\n")
    out = run(tmp_path, "select", table, "-n", 3, "--no-diverse", "-f", "labelstudio",
              "--class-names", "names.txt", "--labelstudio-config", "det.xml")
    tasks = json.loads(out.stdout)
    assert "1 of the 3 Label Studio tasks carry predicted classes without a name" in out.stderr
    for task, row in zip(tasks, DETECTIONS):
        result = task["predictions"][0]["result"]
        want = expected_boxes(row)
        assert len(result) == len(want)
        for region, box in zip(result, want):
            assert region["type"] == "rectanglelabels"
            assert (region["from_name"], region["to_name"]) == ("label", "image")
            assert (region["original_width"], region["original_height"]) == (row["width"], row["height"])
            v = region["value"]
            for key in ("x", "y", "width", "height"):
                assert v[key] == pytest.approx(float(box[key]), rel=1e-12, abs=1e-12), key
                assert 0 <= v[key] <= 100
            assert v["rectanglelabels"] == [box["label"]] and v["rotation"] == 0
            assert region["score"] == box["score"]
        assert len({r["id"] for r in result}) == len(result)
    config = ET.fromstring((tmp_path / "det.xml").read_text())
    control = config.find("RectangleLabels")
    assert control.get("name") == "label" and control.get("toName") == "image"
    assert [e.get("value") for e in control] == NAMES[1:]  # torchvision's background not offered
    assert config.find("Image").get("value") == "$image"


@pytest.mark.parametrize("boxes, size, culprit", [
    ("[[1, 2, 3]]", (10, 10), "box 1 is not [x0, y0, x1, y1, class_index, score]"),
    ("{not json", (10, 10), "boxes is not a JSON list"),
    ('[[1, 2, 3, 4, 1, NaN]]', (10, 10), "box 1 is not"),
    ("[]", (0, 10), "width 0 is not an image size"),
    ("[[5, 1, 2, 9, 1, 0.5]]", (10, 10), "box 1 ends before it starts"),
])
def test_bad_detection_rows_are_one_sentence(tmp_path, boxes, size, culprit):
    rows = [{"id": "ok.jpg", "score": 0.9, "width": 8, "height": 8, "boxes": "[]"},
            {"id": "bad.jpg", "score": 0.5, "width": size[0], "height": size[1], "boxes": boxes}]
    table = write_table(tmp_path / "det.csv", rows)
    bad = run(tmp_path, "select", table, "-n", 2, "--no-diverse", "-f", "labelstudio", ok=False)
    assert_one_error(bad, culprit, boxes)
    assert "row 2 (id 'bad.jpg')" in bad.stderr


# --- multilabel, regression -----------------------------------------------------------------------

def test_multilabel_choices_are_every_predicted_label(tmp_path):
    rows = [{"id": "x", "score": 3.0, "pred": "cat|dog"}, {"id": "y", "score": 2.0, "pred": ""},
            {"id": "z", "score": 1.0, "pred": "dog"}]
    table = write_table(tmp_path / "ml.csv", rows, {"task": "multilabel", "class_names": NAMES})
    out = run(tmp_path, "select", table, "-n", 3, "--no-diverse", "-f", "labelstudio",
              "--labelstudio-config", "ml.xml")
    results = [t["predictions"][0]["result"] for t in json.loads(out.stdout)]
    assert [[r["value"]["choices"] for r in res] for res in results] == [[["cat", "dog"]], [], [["dog"]]]
    assert all(r["type"] == "choices" for res in results for r in res)
    control = ET.fromstring((tmp_path / "ml.xml").read_text()).find("Choices")
    assert control.get("choice") == "multiple" and [e.get("value") for e in control] == NAMES
    # indices (a model without names) are named by --class-names
    rows = [{"id": "x", "score": 1.0, "pred": "0|2"}]
    write_table(tmp_path / "ix.csv", rows, {"task": "multilabel"})
    (tmp_path / "names.txt").write_text("\n".join(NAMES))
    out = run(tmp_path, "select", "ix.csv", "-n", 1, "--no-diverse", "-f", "labelstudio",
              "--class-names", "names.txt")
    assert json.loads(out.stdout)[0]["predictions"][0]["result"][0]["value"]["choices"] == \
        ["background", "dog"]


def test_a_piped_table_takes_the_task_from_task_flag(tmp_path):
    """A table on stdin has no meta.json: --task names what its rows predict (no warning)."""
    text = "rank,id,score,pred\n1,x,0.5,cat|dog\n2,y,0.25,1.5\n"
    out = run(tmp_path, "select", "-", "-n", 1, "--no-diverse", "-f", "labelstudio", "--task",
              "multilabel", stdin=text)
    assert json.loads(out.stdout)[0]["predictions"][0]["result"][0]["value"]["choices"] == ["cat", "dog"]
    assert "no effect" not in out.stderr
    out = run(tmp_path, "select", "-", "-n", 2, "--no-diverse", "-f", "labelstudio", "--task",
              "regression", stdin=text)
    results = [t["predictions"][0]["result"] for t in json.loads(out.stdout)]
    assert results[0] == [] and results[1][0]["value"] == {"number": 1.5}


# --- token classification -------------------------------------------------------------------------

@pytest.mark.parametrize("tags, spans", [
    (["B-PER", "I-PER", "O", "B-LOC"], [("PER", 0, 1), ("LOC", 3, 3)]),
    (["I-LOC", "I-LOC", "B-LOC", "I-PER"], [("LOC", 0, 1), ("LOC", 2, 2), ("PER", 3, 3)]),
    (["B-PER", "B-PER", None, "I-PER"], [("PER", 0, 0), ("PER", 1, 1), ("PER", 3, 3)]),
    (["PER", "PER", "O", "LOC", "PER"], [("PER", 0, 1), ("LOC", 3, 3), ("PER", 4, 4)]),
    (["O", None, "O"], []),
])
def test_word_tags_become_entities(tags, spans):
    assert entities(tags) == spans


def word_offsets(text: str) -> list[tuple[int, int]]:
    """Whitespace words found by walking the text one character at a time (the oracle)."""
    out, start = [], None
    for i, ch in enumerate(text + " "):
        if ch.isspace() and start is not None:
            out.append((start, i))
            start = None
        elif not ch.isspace() and start is None:
            start = i
    return out


def test_token_spans_are_character_offsets_into_the_text():
    text = "  Zoë\tand Émile  Zola\nlive in São Paulo "
    tags = ["B-PER", "O", "B-PER", "I-PER", "O", "O", "B-LOC", "I-LOC"]
    rows = [{"id": "t", "score": 1.0, "pred_words": json.dumps(tags)}]
    result = to_labelstudio(rows, None, "m", texts=[text], task="token-classification")[0]
    regions = result["predictions"][0]["result"]
    words = word_offsets(text)
    want = [(words[0][0], words[0][1], "PER"), (words[2][0], words[3][1], "PER"),
            (words[6][0], words[7][1], "LOC")]
    assert [(r["value"]["start"], r["value"]["end"], r["value"]["labels"][0]) for r in regions] == want
    assert [r["value"]["text"] for r in regions] == ["Zoë", "Émile  Zola", "São Paulo"]
    assert all(r["type"] == "labels" and r["to_name"] == "text" for r in regions)
    # a text cut short ("…"): its last, cut word gets no span; a text with more words is refused
    cut = to_labelstudio([{"id": "t", "score": 1.0, "pred_words": json.dumps(["B-LOC", "I-LOC"])}],
                         None, "m", texts=["São Pau\u2026"], task="token-classification")
    assert [r["value"]["text"] for r in cut[0]["predictions"][0]["result"]] == ["São"]
    with pytest.raises(ValueError, match="predicts 1 words, but its text has 2"):
        to_labelstudio([{"id": "t", "score": 1.0, "pred_words": '["O"]'}], None, "m",
                       texts=["two words"], task="token-classification")


pytest.importorskip("transformers")
import hf_models  # noqa: E402
import task_models as tm  # noqa: E402

TEXTS = ["the cats sat on a mat", "a dog ran fast", "birds flew away and then stopped",
         "the big red cats and the small blue dogs ran away fast and then sat"]
TAGS = ["O", "B-ANIMAL", "I-ANIMAL"]


@pytest.fixture(scope="module")
def ner(tmp_path_factory):
    """A tiny BERT token classifier whose tokenizer splits plurals into two tokens (cat ##s)."""
    root = tmp_path_factory.mktemp("ner")
    model = tm.bert_tokens()
    vocab = hf_models.VOCAB + ["##s"]
    model.resize_token_embeddings(len(vocab))
    torch.manual_seed(1)
    with torch.no_grad():  # a head that does not predict one class everywhere
        model.classifier.weight.normal_(0, 2.0)
    from transformers import BertTokenizerFast
    for name in ("ner", "ner_named"):  # ner_named: the same model, its id2label the tags
        if name == "ner_named":
            model.config.id2label = dict(enumerate(TAGS))
            model.config.label2id = {t: i for i, t in enumerate(TAGS)}
        model.save_pretrained(root / name)
        (root / name / "vocab.txt").write_text("\n".join(vocab) + "\n")
        vocab_file = str(root / name / "vocab.txt")
        BertTokenizerFast(vocab_file=vocab_file, vocab=vocab_file, model_max_length=64).save_pretrained(root / name)
    with open(root / "texts.jsonl", "w") as f:
        for i, text in enumerate(TEXTS):
            f.write(json.dumps({"id": f"t{i}", "text": text}) + "\n")
    (root / "tags.txt").write_text("\n".join(TAGS) + "\n")
    return root


def oracle_word_preds(root: Path, text: str, max_length: int | None) -> list:
    """Each whitespace word's class at its first token, from a float64 forward of the text alone,
    the token -> word map from the tokenizer's own word_ids(); None past the truncation."""
    from transformers import AutoModelForTokenClassification, AutoTokenizer
    tok = AutoTokenizer.from_pretrained(root / "ner")
    model = AutoModelForTokenClassification.from_pretrained(root / "ner").double().eval()
    enc = tok(text, truncation=max_length is not None, max_length=max_length, return_tensors="pt")
    with torch.no_grad():
        labels = model(**enc).logits[0].argmax(-1).tolist()
    first: dict[int, int] = {}
    for t, w in enumerate(enc.word_ids()):
        if w is not None and w not in first:
            first[w] = labels[t]
    return [first.get(w) for w in range(len(text.split()))]


@pytest.mark.parametrize("max_length", [None, 8])
def test_pred_words_of_a_real_token_model_and_their_spans(ner, max_length):
    extra = [] if max_length is None else ["--max-length", max_length]
    out = f"t{max_length}.csv"
    run(ner, "score", "texts.jsonl", "--model", "ner", "-s", "entropy", "-b", 3, "-o", out, "-q", *extra)
    rows = {r["id"]: r for r in parse_csv((ner / out).read_text())}
    found = []
    for i, text in enumerate(TEXTS):
        want = oracle_word_preds(ner, text, max_length)
        got = json.loads(rows[f"t{i}"]["pred_words"])
        assert got == want, text
        found.extend(got)
    assert len(set(found) - {None}) > 1  # the check can tell classes apart
    if max_length is not None:
        assert None in found  # the long text's last words are past the tokens the model saw
    picked = run(ner, "select", out, "-n", len(TEXTS), "--no-diverse", "-f", "labelstudio",
                 "--class-names", "tags.txt", "--labelstudio-config", "ner.xml")
    for task in json.loads(picked.stdout):
        text = task["data"]["text"]
        tags = [None if t is None else TAGS[t] for t in json.loads(rows[task["data"]["alcli_id"]]["pred_words"])]
        words = word_offsets(text)
        want = [(words[a][0], words[b][1], label) for label, a, b in entities(tags)]
        got = [(r["value"]["start"], r["value"]["end"], r["value"]["labels"][0])
               for r in task["predictions"][0]["result"]]
        assert got == want
    control = ET.fromstring((ner / "ner.xml").read_text()).find("Labels")
    assert [e.get("value") for e in control] == ["ANIMAL"] and control.get("toName") == "text"
    bare = run(ner, "select", out, "-n", 2, "--no-diverse", "-f", "labelstudio")
    assert "Label Studio tasks carry predicted classes without a name" in bare.stderr


def test_names_from_the_models_id2label_reach_pred_words_spans_and_config(ner):
    run(ner, "score", "texts.jsonl", "--model", "ner", "-s", "entropy", "-o", "plain.csv", "-q")
    run(ner, "score", "texts.jsonl", "--model", "ner_named", "-s", "entropy", "-o", "named.csv", "-q")
    plain = {r["id"]: json.loads(r["pred_words"]) for r in parse_csv((ner / "plain.csv").read_text())}
    named = {r["id"]: json.loads(r["pred_words"]) for r in parse_csv((ner / "named.csv").read_text())}
    assert named == {i: [TAGS[t] for t in tags] for i, tags in plain.items()}
    picked = run(ner, "select", "named.csv", "-n", 2, "--no-diverse", "-f", "labelstudio",
                 "--labelstudio-config", "named.xml")
    assert "without a name" not in picked.stderr
    spans = [r for t in json.loads(picked.stdout) for r in t["predictions"][0]["result"]]
    assert spans and {r["value"]["labels"][0] for r in spans} <= {"ANIMAL"}
    control = ET.fromstring((ner / "named.xml").read_text()).find("Labels")
    assert [e.get("value") for e in control] == ["ANIMAL"]


# --- the labeling config ------------------------------------------------------------------------

@pytest.mark.parametrize("task, control", [("classification", "Choices"), ("multilabel", "Choices"),
                                           ("detection", "RectangleLabels"),
                                           ("segmentation", "BrushLabels"),
                                           ("token-classification", "Labels"), ("regression", "Number")])
def test_labeling_config_per_task_escapes_names(task, control):
    names = ['a "quoted" <name> & co', "B-x", "O"]
    field = "text" if task == "token-classification" else "image"
    root = ET.fromstring(labeling_config(task, names, field, "lbl", "obj"))
    obj = root.find("Text" if field == "text" else "Image")
    assert obj.get("name") == "obj" and obj.get("value") == f"${field}"
    tag = root.find(control)
    assert tag.get("name") == "lbl" and tag.get("toName") == "obj"
    values = [e.get("value") for e in tag]
    if task == "regression":
        assert values == []
    elif task == "token-classification":
        assert values == [names[0], "x"]
    else:
        assert values == names


def test_a_config_without_class_names_is_one_sentence(tmp_path):
    table = write_table(tmp_path / "c.csv", [{"id": "x", "score": 1.0, "pred": 2}])
    bad = run(tmp_path, "select", table, "-n", 1, "--no-diverse", "-f", "labelstudio",
              "--labelstudio-config", "c.xml", ok=False)
    assert_one_error(bad, "--labelstudio-config c.xml", "config")
    assert "--class-names FILE" in bad.stderr and not (tmp_path / "c.xml").exists()
