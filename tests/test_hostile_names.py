"""Hostile input, round 2 (issue 37): numeric class names and the pre-labels made from them
(N-BAD-1), inputs replaced by outputs (N-BAD-4), a bare CR in a table cell (N-BAD-6), and class
names that are not checked (N-BAD-8, N-BAD-11, the lone surrogate of N-BAD-10).

The demo model (10 classes) scores the demo pool once with the class names 1..10; what each row
predicts is read back from the table's own text with the csv module (pred_index), and the names
from the list written here, never from alcli's reader."""
from __future__ import annotations

import csv
import io
import json
import os
import shutil
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import yaml

from alcli.files.config import PATH_KEYS
from alcli.files.outputs import OUTPUT_KEYS
from alcli.files.table import read_table, write_table
from cli_errors import assert_one_error
from shell import invoke_in as run, ok

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "configs" / "default.yaml"
NAMES = [str(k) for k in range(1, 11)]  # seq 1 10: class index i is named i + 1


@pytest.fixture(scope="module")
def scored(tmp_path_factory):
    """t.csv and t.jsonl: the demo pool scored (margin) with the class names 1..10."""
    root = tmp_path_factory.mktemp("numeric")
    (root / "names.txt").write_text("\n".join(NAMES) + "\n")
    for fmt in ("csv", "jsonl"):
        ok(run(root, "score", "-c", CONFIG, "-s", "margin", "--class-names", "names.txt",
               "-f", fmt, "-o", f"t.{fmt}", "-q"))
    return root


def predicted(root: Path) -> dict[str, str]:
    """id -> the name of the class the row predicts: NAMES[pred_index], from the CSV's text."""
    rows = list(csv.DictReader(io.StringIO((root / "t.csv").read_text(), newline="")))
    assert {r["pred"] for r in rows} >= {"2", "10"}  # the ambiguous names are there
    return {r["id"]: NAMES[int(r["pred_index"])] for r in rows}


def choices(stdout: str) -> dict[str, list]:
    return {t["data"]["alcli_id"]: [c for r in t["predictions"][0]["result"]
                                    for c in r["value"]["choices"]]
            for t in json.loads(stdout)}


# --- item 1: numeric class names ------------------------------------------------------------------

@pytest.mark.parametrize("table, extra", [("t.csv", []), ("t.jsonl", []),
                                          ("t.csv", ["--class-names", "names.txt"])])
def test_numeric_names_prelabel_the_class_each_row_predicts(scored, table, extra):
    want = predicted(scored)
    out = ok(run(scored, "select", table, "-n", 60, "--no-diverse", "-f", "labelstudio", *extra))
    got = choices(out.stdout)
    assert len(got) == 60 and all(got[i] == [want[i]] for i in got)
    assert "no class names" not in out.stderr and "carry" not in out.stderr


def test_a_piped_table_with_pred_index_is_read_by_it(scored):
    """On stdin there is no meta.json: the pred_index column says pred holds names."""
    want = predicted(scored)
    out = ok(run(scored, "select", "-", "-n", 60, "--no-diverse", "-f", "labelstudio",
                 "--class-names", "names.txt", input=(scored / "t.csv").read_text()))
    got = choices(out.stdout)
    assert len(got) == 60 and all(got[i] == [want[i]] for i in got)
    # the batch written back as a table keeps each row's class
    out = ok(run(scored, "select", "t.csv", "-n", 400, "--no-diverse", "-f", "csv"))
    back = {r["id"]: r for r in csv.DictReader(io.StringIO(out.stdout))}
    assert all(NAMES[int(r["pred_index"])] == r["pred"] == want[i] for i, r in back.items())


def test_per_class_quotas_count_each_class_once(scored):
    """--per-class equal over 10 named classes: each class's rows grouped by the class, whatever
    its name looks like (2 == "2" would merge nothing here; an index read as a name would)."""
    want = predicted(scored)
    out = ok(run(scored, "select", "t.csv", "-n", 20, "--no-diverse", "--per-class", "equal",
                 "-f", "ids"))
    classes = [want[i] for i in out.stdout.split()]
    counts = {c: classes.count(c) for c in set(classes)}
    present = set(want.values())
    assert len(classes) == 20 and set(counts) <= present
    assert max(counts.values()) - min(counts.values()) <= 1 or len(counts) < len(present)


# --- item 7: class names checked ------------------------------------------------------------------

@pytest.mark.parametrize("text, needle", [
    ("a\x01\nb\nc\nd\ne\nf\ng\nh\ni\nj\n", "U+0001 in the name at line 1"),
    ("a\nb\x0bB\nc\nd\ne\nf\ng\nh\ni\nj\n", "U+000B in the name at line 2"),
    ("a\nb\nc\x0c\nd\ne\nf\ng\nh\ni\nj\n", "U+000C in the name at line 3"),
    ("a\nb\nc\nd\x1ce\nf\ng\nh\ni\nj\nk\n", "U+001C in the name at line 4"),
    ("a\nb\nc\nd\ne\x85E\nf\ng\nh\ni\nj\n", "U+0085 in the name at line 5"),
    ("a\nb\nc\nd\ne\nf\u2028F\ng\nh\ni\nj\n", "U+2028 in the name at line 6"),
    ("a\nb\nc\nd\ne\nf\ng\u2029\nh\ni\nj\n", "U+2029 in the name at line 7"),
    ("a\nb\nc\nd\ne\nf\ng\nh\ni\x00\nj\n", "U+0000 in the name at line 9"),
    ("a\nb\nc\nd\ne\nf\ng\nh\ni\nj\x1b[31m\n", "U+001B in the name at line 10"),
    ('["a", "b\\u0000"' + ', "c"' * 0 + "]", "U+0000 in the name at position 2"),
    ('["a\\ud800", "b"]', "lone surrogate (U+D800) in the name at position 1"),
    ("a\nb\nc\nd\ne\nf\ng\nh\ni\nj\nk\n", "names 11 classes, but the model that scored"),
    ("a\nb\nc\n", "names 3 classes, but the model that scored"),
])
def test_bad_names_files_are_one_sentence(scored, text, needle):
    (scored / "bad.txt").write_text(text, encoding="utf-8", errors="surrogatepass")
    for cmd in (["select", "t.csv", "-n", 3, "-f", "labelstudio", "--labelstudio-config", "c.xml"],
                ["score", "-c", CONFIG, "-s", "margin", "-o", "never.csv"]):
        result = run(scored, *cmd, "--class-names", "bad.txt")
        if "model that scored" in needle and cmd[0] == "score":
            needle = "but the model outputs 10 classes"
        assert_one_error(result, needle, f"{cmd[0]} {text!r}: {result.stderr}")
        assert "bad.txt" in result.stderr
    assert not (scored / "c.xml").exists() and not (scored / "never.csv").exists()


def test_a_crlf_names_file_reads_as_its_lf_twin_and_the_config_is_xml(scored):
    names = ['a "q"', "<b>", "c & d", "]]>", "<!--", '"/><Script>', "ж", "8", "9", "10"]
    (scored / "crlf.txt").write_bytes("\r\n".join(names).encode() + b"\r\n")
    (scored / "lf.txt").write_text("\n".join(names) + "\n")
    configs = []
    for f in ("crlf.txt", "lf.txt"):
        ok(run(scored, "select", "t.csv", "-n", 5, "--no-diverse", "-f", "labelstudio",
               "--class-names", f, "--labelstudio-config", f"{f}.xml"))
        configs.append((scored / f"{f}.xml").read_text())
    assert configs[0] == configs[1]
    control = ET.fromstring(configs[0]).find("Choices")
    assert [e.get("value") for e in control] == names


def _multilabel_table(root: Path, names: list[str]) -> None:
    write_table([{"rank": 1, "id": "x", "score": 1.0, "pred": "a|b"}], root / "ml.csv")
    (root / "ml.csv.meta.json").write_text(json.dumps({"task": "multilabel", "class_names": names}))


def test_a_multilabel_name_holding_a_bar_is_refused(tmp_path):
    _multilabel_table(tmp_path, ["a|b", "c"])
    assert_one_error(run(tmp_path, "select", "ml.csv", "-n", 1, "--no-diverse", "-f",
                         "labelstudio"), "'a|b'", "meta.json names")
    _multilabel_table(tmp_path, ["a", "b", "c"])
    (tmp_path / "bar.txt").write_text("a|b\nc\nd\n")
    assert_one_error(run(tmp_path, "select", "ml.csv", "-n", 1, "--no-diverse", "-f",
                         "labelstudio", "--class-names", "bar.txt"), "bar.txt", "names file")
    out = ok(run(tmp_path, "select", "ml.csv", "-n", 1, "--no-diverse", "-f", "labelstudio"))
    assert choices(out.stdout) == {"x": ["a", "b"]}


# --- item 3: no output replaces an input ----------------------------------------------------------

INPUT_KEYS = [k for k in PATH_KEYS if k not in OUTPUT_KEYS and k != "image_dir"]  # a folder


def test_the_input_keys_are_every_file_setting_but_the_outputs():
    assert set(INPUT_KEYS) == {"model", "pool", "scores", "embeddings_file", "exclude",
                               "class_names", "target"}


@pytest.mark.parametrize("key", INPUT_KEYS)
@pytest.mark.parametrize("option", ["-o", "--contact-sheet", "--labelstudio-config"])
def test_no_select_output_replaces_a_file_setting(scored, tmp_path, key, option):
    """Each file setting, given in a config (as any key can be), is refused as each output."""
    for name in os.listdir(scored):
        if name.startswith("t.csv"):
            shutil.copy(scored / name, tmp_path / name)
    given = {"model": "t.csv.emb.npz", "embeddings_file": "t.csv.emb.npz", "scores": "t.csv",
             "pool": "names.txt", "exclude": "names.txt", "class_names": "names.txt",
             "target": "names.txt"}[key]
    (tmp_path / "names.txt").write_text("\n".join(NAMES) + "\n")
    cfg = yaml.safe_load(CONFIG.read_text())
    cfg = {k: str((CONFIG.parent / v).resolve()) if k in ("model", "pool") else v
           for k, v in cfg.items()}
    cfg[key] = [given] if key == "exclude" else given
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cfg))
    before = (tmp_path / given).read_bytes()
    result = run(tmp_path, "select", "t.csv", "-c", "c.yaml", "-n", 3, "--no-diverse",
                 option, given)
    assert_one_error(result, "that input would be replaced", result.stderr)
    assert (tmp_path / given).read_bytes() == before


@pytest.mark.parametrize("via", ["-o", "embeddings_file"])
def test_no_score_output_replaces_the_class_names_file(tmp_path, via):
    (tmp_path / "n.txt").write_text("\n".join(str(k) for k in range(10)) + "\n")
    cfg = {k: str((CONFIG.parent / v).resolve()) if k in ("model", "pool") else v
           for k, v in yaml.safe_load(CONFIG.read_text()).items()}
    if via == "embeddings_file":
        cfg["embeddings_file"] = "n.txt"
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cfg))
    result = run(tmp_path, "score", "-c", "c.yaml", "-s", "margin", "--class-names", "n.txt",
                 "-o", "n.txt" if via == "-o" else "t.csv")
    assert_one_error(result, "--class-names", result.stderr)
    assert (tmp_path / "n.txt").read_text().startswith("0\n1\n")


def test_a_sidecar_of_the_table_read_is_an_input(scored):
    before = (scored / "t.csv.meta.json").read_bytes()
    assert_one_error(run(scored, "select", "t.csv", "-n", 3, "-o", "t.csv.meta.json"),
                     "t.csv.meta.json, read with the table read", "sidecar")
    assert (scored / "t.csv.meta.json").read_bytes() == before


def test_a_file_inside_a_model_folder_is_an_input(tmp_path):
    folder = tmp_path / "hf"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    write_table([{"rank": 1, "id": "x", "score": 1.0}], tmp_path / "s.csv")
    assert_one_error(run(tmp_path, "select", "s.csv", "-n", 1, "-m", "hf", "-o", "hf/config.json"),
                     "a folder whose files are read", "model folder")
    assert (folder / "config.json").read_text() == "{}"


# --- item 5: line breaks in table cells -----------------------------------------------------------

BREAKS = ["two\rthree", "cr at end\r", "\r", "crlf\r\nin", "lf\nin", "vt\x0bff\x0c",
          "fs\x1cgs\x1drs\x1e", "nel\x85", "ls\u2028ps\u2029", 'quote " and , comma']


@pytest.mark.parametrize("fmt", ["csv", "jsonl"])
def test_a_cell_with_any_line_break_reads_back(tmp_path, fmt):
    rows = [{"rank": k + 1, "id": f"{k}{text}", "score": 1.0 - k / 100, "text": f"x {text} y"}
            for k, text in enumerate(BREAKS)]
    path = tmp_path / f"b.{fmt}"
    write_table(rows, path, fmt)
    back = read_table(path)
    assert [(r["id"], r["text"]) for r in back] == [(r["id"], r["text"]) for r in rows]
    stdin = path.read_bytes().decode()
    out = ok(run(tmp_path, "select", "-", "-n", len(rows), "--no-diverse", "-f", "jsonl",
                 input=stdin))
    got = [json.loads(line) for line in out.stdout.splitlines()]
    assert [(r["id"], r["text"]) for r in got] == [(r["id"], r["text"]) for r in rows]


def test_numeric_multilabel_names_stay_names(tmp_path):
    """A multilabel table has no pred_index: its meta.json's names say pred holds names, so
    "2" is the class named 2, not index 2."""
    rows = [{"rank": 1, "id": "x", "score": 3.0, "pred": "2"}, {"rank": 2, "id": "y", "score": 2.0,
            "pred": "10"}, {"rank": 3, "id": "z", "score": 1.0, "pred": "2|3"}]
    write_table(rows, tmp_path / "ml.csv")
    (tmp_path / "ml.csv.meta.json").write_text(json.dumps({"task": "multilabel",
                                                           "class_names": NAMES}))
    out = ok(run(tmp_path, "select", "ml.csv", "-n", 3, "--no-diverse", "-f", "labelstudio"))
    assert choices(out.stdout) == {"x": ["2"], "y": ["10"], "z": ["2", "3"]}
    assert "carry" not in out.stderr


def test_a_from_name_xml_cannot_hold_is_one_sentence(scored):
    result = run(scored, "select", "t.csv", "-n", 3, "--no-diverse", "-f", "labelstudio",
                 "--from-name", "lab\x01el", "--labelstudio-config", "f.xml")
    assert_one_error(result, "U+0001", result.stderr)
    assert not (scored / "f.xml").exists()


def test_names_a_model_gives_are_checked_at_score(tmp_path):
    """id2label with a control character, and a multilabel name holding '|', refused by the
    pre-flight whatever gives them (a names file, the model's id2label)."""
    pytest.importorskip("transformers")
    import hf_models
    import task_models as tm
    model = tm.bert_multilabel()
    model.resize_token_embeddings(len(hf_models.VOCAB))
    labels = model.config.num_labels
    model.config.id2label = {i: f"c{i}" + ("\x01" if i == 1 else "") for i in range(labels)}
    model.save_pretrained(tmp_path / "tags")
    hf_models.tokenizer(tmp_path / "tags").save_pretrained(tmp_path / "tags")
    (tmp_path / "texts.jsonl").write_text("".join(
        json.dumps({"id": f"t{i}", "text": " ".join(hf_models.WORDS[i:i + 3])}) + "\n"
        for i in range(3)))
    result = run(tmp_path, "score", "texts.jsonl", "-m", "tags", "-s", "entropy", "-o", "a.csv")
    assert_one_error(result, "the model's id2label has the control character U+0001", "id2label")
    (tmp_path / "bar.txt").write_text("\n".join(["a|b"] + [f"c{i}" for i in range(1, labels)]))
    result = run(tmp_path, "score", "texts.jsonl", "-m", "tags", "-s", "entropy", "-o", "b.csv",
                 "--class-names", "bar.txt")
    assert_one_error(result, "'a|b'", "multilabel bar")
    assert not (tmp_path / "a.csv").exists() and not (tmp_path / "b.csv").exists()


def test_a_config_shared_by_score_and_select_may_name_the_table_twice(tmp_path):
    """`scores` (the table select reads) is no input of score, which writes it."""
    cfg = {k: str((CONFIG.parent / v).resolve()) if k in ("model", "pool") else v
           for k, v in yaml.safe_load(CONFIG.read_text()).items()}
    (tmp_path / "c.yaml").write_text(yaml.safe_dump({**cfg, "scores": "t.csv", "output": "t.csv"}))
    ok(run(tmp_path, "score", "-c", "c.yaml", "-s", "margin", "-q"))
    assert (tmp_path / "t.csv").is_file()
