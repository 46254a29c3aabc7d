"""Class names end to end, text in the outputs, and every Label Studio export as --exclude.

Class names come from a Hugging Face model's id2label, a --class-names file, class folders, or
string labels in manifests; tables show them in `pred` (the index in `pred_index`), Label Studio
tasks pre-select them. Text pools get a `text` column, `data.text` in their tasks and a contact
sheet of texts. The Label Studio exports in tests/data/labelstudio/ were written by Label Studio's
own converter (make_exports.py there); each must exclude exactly its labeled tasks' rows.
"""
from __future__ import annotations

import csv
import io
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image

from alcli.selection.export import PAD, sheet_layout
from cli_errors import assert_one_error
from conftest import parse_csv
from shell import invoke_in as cli, ok

pytest.importorskip("transformers")
import hf_models  # noqa: E402

EXPORTS = Path(__file__).resolve().parent / "data" / "labelstudio"
NAMES = ["sports", "politics", "science"]
TEXTS = [line for line in (EXPORTS / "texts.txt").read_text().splitlines()]
LONG = 5  # TEXTS[LONG] is 81 characters: cut in tables of --text-width 30 or less


@pytest.fixture(scope="module")
def named(tmp_path_factory):
    """A saved BERT whose id2label names its classes (`bert/`), one with the default LABEL_i
    (`plain/`), and text pools: texts.txt (ids are line numbers) and labeled.jsonl (labels by
    name, one missing)."""
    root = tmp_path_factory.mktemp("named")
    torch.manual_seed(0)
    for name in ("bert", "plain"):
        model = hf_models.bert(len(hf_models.VOCAB))
        if name == "bert":
            model.config.id2label = dict(enumerate(NAMES))
            model.config.label2id = {n: i for i, n in enumerate(NAMES)}
        model.save_pretrained(root / name)
        hf_models.tokenizer(root / name).save_pretrained(root / name)
    shutil.copy(EXPORTS / "texts.txt", root / "texts.txt")
    with open(root / "labeled.jsonl", "w") as f:
        for i, text in enumerate(TEXTS[:6]):
            label = "" if i == 2 else NAMES[i % 3]
            f.write(json.dumps({"id": f"t{i}", "text": text, "label": label}) + "\n")
    return root


def oracle(directory: Path, text: str) -> torch.Tensor:
    """The model's logits [C] for one text alone, computed with transformers, in float64."""
    from transformers import AutoModelForSequenceClassification, BertTokenizerFast
    model = AutoModelForSequenceClassification.from_pretrained(directory, local_files_only=True)
    tok = BertTokenizerFast.from_pretrained(directory, local_files_only=True)
    with torch.no_grad():
        return model.double().eval()(**tok([text], return_tensors="pt")).logits[0]


# --- text pools: the table, Label Studio tasks, the contact sheet ---------------------------------

def test_text_table_shows_class_names_text_and_string_labels(named):
    ok(cli(named, "score", "labeled.jsonl", "-m", "bert", "-s", "loss", "--text-width", 20,
           "-o", "table.csv", "-q"))
    rows = parse_csv((named / "table.csv").read_text())
    header = list(rows[0])
    assert header[:5] == ["rank", "id", "score", "pred", "pred_index"] and header[-1] == "text"
    by_id = {f"t{i}": t for i, t in enumerate(TEXTS[:6])}
    for row in rows:
        text = by_id[row["id"]]
        assert row["text"] == (text if len(text) <= 20 else text[:20] + "\u2026")
        logits = oracle(named / "bert", text)
        assert int(row["pred_index"]) == int(logits.argmax())
        assert row["pred"] == NAMES[int(row["pred_index"])]
        n = int(row["id"][1:])
        if n == 2:
            assert row["label"] == ""
            continue
        assert row["label"] == NAMES[n % 3]  # given by name, shown by name
        target = torch.tensor(n % 3)  # the name's index: the loss is against it
        assert float(row["loss"]) == pytest.approx(float(F.cross_entropy(logits, target)), rel=1e-4)
    assert any(r["text"].endswith("\u2026") for r in rows)
    meta = json.loads((named / "table.csv.meta.json").read_text())
    assert meta["class_names"] == NAMES and meta["pool_kind"] == "text"
    assert meta["text_width"] == 20


def test_text_labelstudio_tasks_and_contact_sheet(named, tmp_path):
    ok(cli(named, "score", "texts.txt", "-m", "bert", "--text-width", 20, "-o", "t.csv", "-q"))
    table = parse_csv((named / "t.csv").read_text())
    out, sheet = tmp_path / "tasks.json", tmp_path / "sheet.png"
    ok(cli(named, "select", "t.csv", "-n", len(TEXTS), "--no-diverse", "-f", "labelstudio",
           "-o", out, "--contact-sheet", sheet))
    tasks = json.loads(out.read_text())
    assert [t["data"]["alcli_id"] for t in tasks] == [r["id"] for r in table]
    for task, row in zip(tasks, table):
        assert "image" not in task["data"] and "id" not in task
        assert task["data"]["text"] == TEXTS[int(row["id"]) - 1]  # whole, not the table's 20
        [pred] = task["predictions"]
        assert pred["model_version"] == "bert" and pred["score"] == float(row["score"])
        assert pred["result"] == [{"id": pred["result"][0]["id"], "type": "choices",
                                   "from_name": "label", "to_name": "text",
                                   "value": {"choices": [row["pred"]]}}]
        assert row["pred"] in NAMES
    assert len({t["predictions"][0]["result"][0]["id"] for t in tasks}) == len(tasks)
    # the contact sheet: one tile per text, with the text drawn in it
    cols, nrows, cell_w, cell_h = sheet_layout(len(TEXTS), 240, 4)
    img = np.asarray(Image.open(sheet).convert("L"))
    assert img.shape == (nrows * cell_h, cols * cell_w)
    for i in range(len(TEXTS)):
        x0, y0 = (i % cols) * cell_w + PAD, (i // cols) * cell_h + PAD
        tile = img[y0 + 4:y0 + 236, x0 + 4:x0 + 236]
        assert (tile < 100).sum() > 20, f"tile {i} holds no text"
    # the tags' names are options
    ok(cli(named, "select", "t.csv", "-n", 1, "--no-diverse", "-f", "labelstudio", "-o", out,
           "--from-name", "topic", "--to-name", "review"))
    result = json.loads(out.read_text())[0]["predictions"][0]["result"][0]
    assert (result["from_name"], result["to_name"]) == ("topic", "review")


def test_text_tasks_from_a_pipe_say_when_texts_are_cut(named):
    table = ok(cli(named, "score", "texts.txt", "-m", "bert", "--text-width", 20, "-o", "-",
                   "-q")).stdout
    picked = cli(named, "select", "-", "-n", len(TEXTS), "-f", "labelstudio", "--no-diverse",
                 input=table)
    ok(picked)
    texts = {t["data"]["alcli_id"]: t["data"]["text"] for t in json.loads(picked.stdout)}
    assert texts[str(LONG + 1)] == TEXTS[LONG][:20] + "\u2026"
    assert "cut at 20 characters" in picked.stderr and "--text-width 0" in picked.stderr
    whole = ok(cli(named, "score", "texts.txt", "-m", "bert", "--text-width", 0, "-o", "-",
                   "-q")).stdout
    assert TEXTS[LONG] in whole


def test_select_scoring_its_pool_writes_whole_texts(named):
    picked = ok(cli(named, "select", "--pool", "texts.txt", "-m", "bert", "--text-width", 10,
                    "-n", len(TEXTS), "-f", "labelstudio", "--no-diverse", "-q"))
    tasks = json.loads(picked.stdout)
    assert sorted(t["data"]["text"] for t in tasks) == sorted(TEXTS)
    assert all(t["predictions"][0]["result"][0]["value"]["choices"][0] in NAMES for t in tasks)


# --- class names from each source -----------------------------------------------------------------

def test_default_id2label_names_nothing(named):
    rows = parse_csv(ok(cli(named, "score", "texts.txt", "-m", "plain", "-o", "-", "-q")).stdout)
    assert "pred_index" not in rows[0] and {r["pred"] for r in rows} <= {"0", "1", "2"}


def test_class_names_file_lines_and_json(in_ws, tmp_path):
    names = ["cat", "dog", "bird"]
    (tmp_path / "names.txt").write_text("\ufeffcat\n dog \nbird\n\n")
    (tmp_path / "names.json").write_text(json.dumps(names))
    data = torch.load(in_ws.tensors)
    with torch.no_grad():
        want = in_ws.net()(data["x"].double()).argmax(1).tolist()
    index = {id_: i for i, id_ in enumerate(data["ids"])}
    for f in ("names.txt", "names.json"):
        rows = parse_csv(ok(cli(in_ws.root, "score", "pool.pt", "-m", "model.pt", "-c",
                                "config.yaml", "-s", "entropy", "--class-names", tmp_path / f,
                                "-o", "-", "-q")).stdout)
        for r in rows:
            assert int(r["pred_index"]) == want[index[r["id"]]]
            assert r["pred"] == names[int(r["pred_index"])]
            assert r["label"] == names[int(data["y"][index[r["id"]]])]


def test_class_names_from_folders(in_ws):
    rows = parse_csv(ok(cli(in_ws.root, "score", "pool", "-m", "model.pt", "-c", "config.yaml",
                            "-s", "entropy", "--labels-from-folders", "-o", "-", "-q")).stdout)
    for r in rows:
        assert r["label"] == r["id"].split("/")[0]
        assert r["pred"] == "abc"[int(r["pred_index"])]


def test_class_folders_map_to_the_named_classes(in_ws, tmp_path):
    """With --class-names, folder c is class 0 when the file lists c first (not its sorted place)."""
    (tmp_path / "names.txt").write_text("c\nb\na\n")
    rows = parse_csv(ok(cli(in_ws.root, "score", "pool", "-m", "model.pt", "-c", "config.yaml",
                            "-s", "loss", "--labels-from-folders", "--class-names",
                            tmp_path / "names.txt", "-o", "-", "-q")).stdout)
    model = in_ws.net()
    for r in rows:
        folder = r["id"].split("/")[0]
        assert r["label"] == folder
        logits = model(in_ws.image_input(r["id"])[None])[0].detach()
        target = torch.tensor("cba".index(folder))
        assert float(r["loss"]) == pytest.approx(float(F.cross_entropy(logits, target)), rel=1e-4)
        assert r["pred"] == "cba"[int(logits.argmax())]


def test_string_labels_in_an_image_manifest(in_ws, tmp_path):
    (tmp_path / "names.txt").write_text("a\nb\nc\n")
    manifest = tmp_path / "m.csv"
    with open(manifest, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["id", "path", "label"])
        for rel, (path, label) in sorted(in_ws.images.items()):
            w.writerow([rel, path, "abc"[label]])
    rows = parse_csv(ok(cli(in_ws.root, "score", manifest, "-m", "model.pt", "-c", "config.yaml",
                            "-s", "loss", "--class-names", tmp_path / "names.txt", "-o", "-",
                            "-q")).stdout)
    model = in_ws.net()
    for r in rows:
        label = in_ws.images[r["id"]][1]
        assert r["label"] == "abc"[label]
        logits = model(in_ws.image_input(r["id"])[None])[0].detach()
        assert float(r["loss"]) == pytest.approx(float(F.cross_entropy(logits, torch.tensor(label))),
                                                 rel=1e-4)


def test_names_through_per_class_quotas_and_merge(in_ws, tmp_path):
    """Shards scored with class folders merge into the one-process table, names and all; select's
    per-class quotas group by the names."""
    m = ["-m", "model.pt", "-c", "config.yaml", "-s", "entropy", "--labels-from-folders", "-q"]
    ok(cli(in_ws.root, "score", "pool", *m, "-o", tmp_path / "whole.csv"))
    for k in (0, 1):
        ok(cli(in_ws.root, "score", "pool", *m, "--shard", f"{k}/2", "-o", tmp_path / f"p{k}.csv"))
    ok(cli(in_ws.root, "merge", tmp_path / "p0.csv", tmp_path / "p1.csv", "-o", tmp_path / "m.csv",
           "-q"))
    whole = parse_csv((tmp_path / "whole.csv").read_text())
    merged = parse_csv((tmp_path / "m.csv").read_text())
    floats = ("score", "confidence", "loss")  # a shard's batches differ: float32 rounding may too
    assert [{k: v for k, v in r.items() if k not in floats} for r in merged] == \
        [{k: v for k, v in r.items() if k not in floats} for r in whole]
    for r, w in zip(merged, whole):
        assert [float(r[k]) for k in floats] == pytest.approx([float(w[k]) for k in floats], rel=1e-5)
    assert json.loads((tmp_path / "m.csv.meta.json").read_text())["class_names"] == ["a", "b", "c"]
    batch = parse_csv(ok(cli(in_ws.root, "select", tmp_path / "whole.csv", "-n", 6, "--per-class",
                             "equal", "--no-diverse")).stdout)
    available = {c: sum(r["pred"] == c for r in whole) for c in "abc"}
    assert available == {"a": 12, "b": 0, "c": 2}  # the workspace's model predicts no b
    # equal quotas of 3 over the predicted classes: c has only 2, its last place goes to a
    assert {c: sum(r["pred"] == c for r in batch) for c in "abc"} == {"a": 4, "b": 0, "c": 2}


def test_class_names_errors(in_ws, tmp_path):
    files = {"dup.txt": "a\nb\na\n", "two.txt": "a\nb\n", "gap.txt": "a\n\nb\n", "cab.txt": "c\na\nz\n"}
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    (tmp_path / "bad.csv").write_text(f"path,label\n{in_ws.images['a/img00.png'][0]},a\n"
                                      f"{in_ws.images['b/img01.png'][0]},zebra\n")
    m = ["-m", "model.pt", "-c", "config.yaml", "-o", "-"]
    cases = [
        (["score", "pool", *m, "--class-names", tmp_path / "dup.txt"], "names 'a' twice (lines 1 and 3)"),
        (["score", "pool", *m, "--class-names", tmp_path / "gap.txt"], "empty name at line 2"),
        (["score", "pool", *m, "--class-names", tmp_path / "nope.txt"], "nope.txt does not exist"),
        (["score", "pool", *m, "--class-names", tmp_path / "two.txt"],
         "names 2 classes (a, b) but the model outputs 3 classes"),
        (["score", "pool", *m, "--labels-from-folders", "--class-names", tmp_path / "cab.txt"],
         "class folder pool/b is not one of the 3 class names"),
        (["score", tmp_path / "bad.csv", *m, "--class-names", tmp_path / "cab.txt"],
         "bad.csv line 3: label 'zebra' is not one of the 3 class names"),
        (["score", tmp_path / "bad.csv", *m],
         "line 2: label 'a' is not a class index (an integer), and no class names are known"),
    ]
    for args, culprit in cases:
        assert_one_error(cli(in_ws.root, *args), culprit, " ".join(map(str, args)))


def test_labelstudio_names_integer_preds_from_class_names(in_ws, tmp_path):
    table = tmp_path / "t.csv"
    ok(cli(in_ws.root, "score", "pool", "-m", "model.pt", "-c", "config.yaml", "-s", "entropy",
           "-o", table, "-q"))
    rows = parse_csv(table.read_text())
    assert "pred_index" not in rows[0]
    (tmp_path / "names.txt").write_text("cat\ndog\nbird\n")
    named = ok(cli(in_ws.root, "select", table, "-n", 3, "--no-diverse", "-f", "labelstudio",
                   "--class-names", tmp_path / "names.txt"))
    for task, row in zip(json.loads(named.stdout), rows):
        result = task["predictions"][0]["result"]
        assert [r["value"]["choices"] for r in result] == [[["cat", "dog", "bird"][int(row["pred"])]]]
        assert result[0]["to_name"] == "image" and result[0]["from_name"] == "label"
        assert task["data"]["image"] == row["id"]
    bare = ok(cli(in_ws.root, "select", table, "-n", 3, "--no-diverse", "-f", "labelstudio"))
    assert all(t["predictions"][0]["result"] == [] for t in json.loads(bare.stdout))
    assert "3 of the 3 Label Studio tasks carry no predicted class" in bare.stderr
    assert "--class-names FILE" in bare.stderr


# --- every Label Studio export as --exclude ----------------------------------------------------------

def _selected(root, table, *args) -> set[str]:
    out = ok(cli(root, "select", table, "-n", 100, "--no-diverse", "-f", "ids", *args))
    return set(out.stdout.split())


@pytest.mark.parametrize("export", ["images-json.json", "images-json-min.json", "images.csv",
                                    "images.tsv"])
def test_labelstudio_image_exports_exclude_exactly_the_labeled(in_ws, tmp_path, export):
    table = tmp_path / "t.csv"
    ok(cli(in_ws.root, "score", "pool", "-m", "model.pt", "-c", "config.yaml", "-s", "entropy",
           "-o", table, "-q"))
    everything = {r["id"] for r in parse_csv(table.read_text())}
    labeled = {"a/img00.png", "b/img01.png", "b/img04.png", "c/img05.jpg"}  # 104 cancelled, 103 open
    assert _selected(in_ws.root, table, "--exclude", EXPORTS / export) == everything - labeled


@pytest.mark.parametrize("export", ["texts-json.json", "texts-json-min.json", "texts.csv",
                                    "texts.tsv"])
def test_labelstudio_text_exports_exclude_exactly_the_labeled(named, export):
    """Row ids are line numbers, as Label Studio's task ids are (1..6 here): matching by task id
    would exclude rows 1, 2, 5 and 6. Task 5 has only its text, longer than the table's 30."""
    ok(cli(named, "score", "texts.txt", "-m", "bert", "--text-width", 30, "-o", "x.csv", "-q"))
    everything = {str(n) for n in range(1, len(TEXTS) + 1)}
    labeled = {"4", "7", "6", "8"}
    assert _selected(named, "x.csv", "--exclude", EXPORTS / export) == everything - labeled


def test_labelstudio_export_without_a_key_is_refused(named, tmp_path):
    record = {"id": 3, "review": "great", "label": "sports", "annotator": 1, "annotation_id": 9,
              "created_at": "x", "updated_at": "x", "lead_time": 1.0}
    (tmp_path / "min.json").write_text(json.dumps([record]))
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=sorted(record))
    w.writeheader()
    w.writerow(record)
    (tmp_path / "export.csv").write_text(buf.getvalue())
    ok(cli(named, "score", "texts.txt", "-m", "bert", "-o", "y.csv", "-q"))
    for f in ("min.json", "export.csv"):
        result = cli(named, "select", "y.csv", "-n", 2, "--exclude", tmp_path / f)
        assert_one_error(result, "no alcli_id, image, text field", f)
