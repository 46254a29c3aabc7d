"""Fuzzing the files users hand to alcli (hypothesis): pool manifests, exclusion files, configs and
Label Studio exports. Whatever they hold, a run ends with exit 0, or exit 1 and one
`alcli: error:` line on stderr; never a traceback; and no file but the output and its sidecars
(OUTPUT.*) is created, changed or removed.

The examples are derandomized so that CI sees the same inputs every run;
ALCLI_FUZZ_EXAMPLES=N runs more of them (with fresh randomness) when looking for new defects.
"""
from __future__ import annotations

import csv
import hashlib
import json
import os
import shutil
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, example, given, settings, strategies as st
from typer.testing import CliRunner

from alcli.cli import app
from alcli.files.table import write_table

REPO = Path(__file__).resolve().parents[1]
DEMO = REPO / "data" / "demo"
IMAGES = sorted((DEMO / "pool").rglob("*.png"))[:4]  # 8x8 digits, read as 1 channel
CONFIG = {"model": "model.pt", "arch": "alcli.demo:DigitsCNN", "arch_kwargs": {"num_classes": 10},
          "transform": {"normalize": {"mean": [0.3], "std": [0.4]}}, "strategy": "margin",
          "batch_size": 4}

_MORE = int(os.environ.get("ALCLI_FUZZ_EXAMPLES", "0"))
FUZZ = settings(max_examples=_MORE or 12, derandomize=not _MORE, deadline=None, database=None,
                suppress_health_check=list(HealthCheck))

# values a user file might hold where a string, number or structure is expected
NAMES = st.sampled_from(["img0.png", "img1.png", "imgs/img2.png", "missing.png", "model.pt",
                         "config.yaml", "..", "/etc/passwd", "", "out/t.csv", "t.csv"])
TEXT = st.text(st.characters(blacklist_categories=("Cs",)), max_size=12)
SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-3, 12), st.integers(),
                    st.floats(allow_nan=True), TEXT, NAMES)
VALUES = st.recursive(SCALARS, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                        st.dictionaries(TEXT | NAMES, inner,
                                                                        max_size=3)),
                      max_leaves=6)


def _workspace(root: Path) -> None:
    """The demo model, four images (one in a subfolder), the config; the output folder `out/`."""
    shutil.copy(DEMO / "model.pt", root / "model.pt")
    (root / "imgs").mkdir()
    for i, image in enumerate(IMAGES):
        shutil.copy(image, root / ("imgs/" if i == 2 else "") / f"img{i}.png")
    (root / "config.yaml").write_text(yaml.safe_dump(CONFIG))
    (root / "out").mkdir()


def _snapshot(root: Path) -> dict[str, str]:
    """Every path under `root` -> a digest of what it is (file bytes, link target, folder)."""
    seen = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            rel = str(path.relative_to(root))
            if path.is_symlink():
                seen[rel] = "link:" + os.readlink(path)
            elif path.is_dir():
                seen[rel] = "dir"
            else:
                seen[rel] = hashlib.sha256(path.read_bytes()).hexdigest()
    return seen


def run_in_fresh_workspace(write_input, args: list[str], check=None):
    """Builds a workspace, lets `write_input(root)` add the fuzzed file, runs `alcli ARGS` in it,
    and checks the run's contract (and `check(root, result)`, before the workspace goes)."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        _workspace(root)
        write_input(root)
        before = _snapshot(root)
        cwd = os.getcwd()
        os.chdir(root)
        try:
            result = CliRunner().invoke(app, args)
        finally:
            os.chdir(cwd)
        after = _snapshot(root)
        if check is not None:
            check(root, result)
    where = f"alcli {' '.join(args)}\nstderr: {result.stderr[-2000:]}"
    assert result.exit_code in (0, 1), where
    assert result.exception is None or isinstance(result.exception, SystemExit), \
        f"{where}\n{result.exception!r}"
    assert "Traceback" not in result.stderr, where
    if result.exit_code == 1:
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("alcli: error: "), where
        assert len(lines[0]) < 2000, where
    changed = {p for p in before.keys() | after.keys() if before.get(p) != after.get(p)}
    outside = {p for p in changed if not (p == "out" or p.startswith("out/t.csv"))}
    assert not outside, f"{where}\nchanged outside the output: {sorted(outside)}"
    return result


def _manifest_text(kind: str, rows: list[dict]) -> str:
    if kind == "jsonl":
        return "".join(json.dumps(r, default=str) + "\n" for r in rows)
    columns = sorted({k for r in rows for k in r})
    lines = [",".join(columns)] + [",".join(str(r.get(c, "")) for c in columns) for r in rows]
    return "\n".join(lines) + "\n"


MANIFEST_ROWS = st.lists(st.dictionaries(st.sampled_from(["path", "id", "label", "text", "x"]) | TEXT,
                                         VALUES, max_size=4), max_size=5)


@FUZZ
@example(kind="csv", rows=[{"\x85": None}], raw=None)  # a column name holding a line break (NEL)
@given(kind=st.sampled_from(["csv", "jsonl"]), rows=MANIFEST_ROWS, raw=st.none() | st.binary(max_size=60))
def test_manifests(kind, rows, raw):
    def write(root):
        data = raw if raw is not None else _manifest_text(kind, rows).encode("utf-8", "surrogatepass")
        (root / f"in.{kind}").write_bytes(data)
    run_in_fresh_workspace(write, ["score", f"in.{kind}", "-c", "config.yaml", "-q", "-o", "out/t.csv"])


EXCLUDE_KINDS = st.sampled_from(["txt", "csv", "jsonl", "json"])


@pytest.fixture(scope="module")
def scored_table():
    """A ranked table of the workspace's four images, scored once."""
    folder = Path(tempfile.mkdtemp())
    _workspace(folder)
    cwd = os.getcwd()
    os.chdir(folder)
    try:
        result = CliRunner().invoke(app, ["score", ".", "-c", "config.yaml", "-q", "-o", "t.csv"])
    finally:
        os.chdir(cwd)
    assert result.exit_code == 0, result.stderr
    yield folder
    shutil.rmtree(folder)


def _with_table(table_folder: Path, write):
    def both(root):
        for name in os.listdir(table_folder):
            if name.startswith("t.csv"):
                shutil.copy(table_folder / name, root / name)
        write(root)
    return both


@FUZZ
@given(kind=EXCLUDE_KINDS, entries=st.lists(VALUES, max_size=5), raw=st.none() | st.binary(max_size=60))
def test_exclusion_files(scored_table, kind, entries, raw):
    def write(root):
        if raw is not None:
            data = raw
        elif kind == "json":
            data = json.dumps(entries, default=str).encode()
        elif kind == "jsonl":
            data = "".join(json.dumps(e, default=str) + "\n" for e in entries).encode()
        else:
            data = "".join(f"{e}\n" for e in entries).encode("utf-8", "surrogatepass")
        (root / f"ex.{kind}").write_bytes(data)
    run_in_fresh_workspace(_with_table(scored_table, write),
                           ["select", "t.csv", "-n", "2", "--exclude", f"ex.{kind}", "-q",
                            "-o", "out/t.csv"])


LS_TASK = st.fixed_dictionaries(
    {}, optional={"id": VALUES, "data": st.dictionaries(st.sampled_from(["image", "text", "alcli_id"]),
                                                          VALUES | NAMES.map(lambda n: f"/data/{n}"),
                                                          max_size=3),
                  "annotations": VALUES, "predictions": VALUES, "image": VALUES,
                  "alcli_id": VALUES, "choice": VALUES})


@FUZZ
@given(tasks=st.lists(LS_TASK, max_size=4), kind=st.sampled_from(["json", "jsonl", "csv"]))
def test_label_studio_exports(scored_table, tasks, kind):
    def write(root):
        if kind == "json":
            text = json.dumps(tasks, default=str)
        elif kind == "jsonl":
            text = "".join(json.dumps(t, default=str) + "\n" for t in tasks)
        else:
            flat = [{k: (json.dumps(v, default=str) if isinstance(v, (dict, list)) else v)
                     for k, v in t.items()} for t in tasks]
            text = _manifest_text("csv", flat)
        (root / f"export.{kind}").write_text(text, encoding="utf-8", errors="surrogatepass")
    run_in_fresh_workspace(_with_table(scored_table, write),
                           ["select", "t.csv", "-n", "2", "--exclude", f"export.{kind}", "-q",
                            "-o", "out/t.csv"])


CONFIG_KEYS = st.sampled_from(["model", "arch", "arch_kwargs", "pool", "transform", "strategy",
                               "top_classes", "layers", "method", "precision", "batch_size",
                               "device", "format", "embeddings", "embeddings_file", "exclude",
                               "checkpoint_every", "resume", "restart", "strict", "shard",
                               "labels_from_folders", "text_column", "max_length", "log_format",
                               "trust_checkpoint", "progress_every", "nonsense"])


@FUZZ
@given(changes=st.dictionaries(CONFIG_KEYS, VALUES, max_size=3), raw=st.none() | st.text(max_size=80))
def test_configs(changes, raw):
    def write(root):
        if raw is not None:
            (root / "config.yaml").write_text(raw, encoding="utf-8", errors="surrogatepass")
        else:
            (root / "config.yaml").write_text(json.dumps({**CONFIG, **changes}, default=str))
    run_in_fresh_workspace(write, ["score", "imgs", "-c", "config.yaml", "-q", "-o", "out/t.csv"])


# --- class names files and table cells (issue 37): pre-labels, labeling config, rows kept --------

# the characters that broke names and tables: line breaks of every kind, controls, XML and CSV
# specials, the multilabel separator, lone surrogates
HOSTILE = st.sampled_from(["\r", "\n", "\r\n", "\x0b", "\x0c", "\x1c", "\x85", "\u2028", "\x00",
                           "\x1b", "|", '"', ",", "<", "&", "]]>", " ", "\ud800", "2", "10", "ж"])
NAME = st.lists(HOSTILE | st.text(st.characters(), max_size=3), max_size=4).map("".join)


def _clean(name: str) -> bool:
    """A name the names file must take as it is."""
    return (name != "" and name == name.strip() and name.isprintable()
            and not any(0xD800 <= ord(c) <= 0xDFFF for c in name))


@FUZZ
@example(names=[str(k) for k in range(1, 11)], kind="txt")  # N-BAD-1
@example(names=["a\x01", "b\x0bB"] + list("cdefghij"), kind="txt")  # N-BAD-8
@example(names=["a\ud800"] + list("bcdefghij"), kind="json")  # N-BAD-10
@given(names=st.lists(NAME, min_size=9, max_size=11), kind=st.sampled_from(["txt", "crlf", "json"]))
def test_class_names_files(scored_table, names, kind):
    """Whatever the names file holds: the labeling config parses as XML, the tasks as JSON, and
    every pre-label is the name of the class its row predicts (the table's pred, an index)."""
    preds = {}

    def write(root):
        if kind == "json":
            data = json.dumps(names).encode()
        else:
            data = ("\r\n" if kind == "crlf" else "\n").join(names).encode("utf-8", "surrogatepass")
        (root / "names.x").write_bytes(data)
        for row in csv.DictReader(open(root / "t.csv", newline="")):
            preds[row["id"]] = int(row["pred"])

    def check(root, result):
        if result.exit_code != 0:
            return
        config = ET.fromstring((root / "out" / "t.csv.xml").read_text(encoding="utf-8"))
        offered = [e.get("value") for e in config.find("Choices")]
        assert len(offered) == 10  # as many as the model's outputs
        if all(map(_clean, names)) and kind != "json":
            assert offered == names
        tasks = json.loads((root / "out" / "t.csv").read_text(encoding="utf-8"))
        assert len(tasks) == len(preds)
        for task in tasks:
            got = [c for r in task["predictions"][0]["result"] for c in r["value"]["choices"]]
            assert got == [offered[preds[task["data"]["alcli_id"]]]]

    result = run_in_fresh_workspace(
        _with_table(scored_table, write),
        ["select", "t.csv", "-n", "4", "--no-diverse", "-f", "labelstudio", "--class-names",
         "names.x", "--labelstudio-config", "out/t.csv.xml", "-q", "-o", "out/t.csv"], check)
    if kind != "json" and len(names) == 10 and all(map(_clean, names)) and \
            len(set(names)) == 10 and not any("\n" in n for n in names):
        assert result.exit_code == 0, result.stderr


CELL = st.lists(HOSTILE.filter(lambda c: c != "\ud800") |
                st.text(st.characters(blacklist_categories=("Cs",)), max_size=3),
                max_size=4).map("".join)


@FUZZ
@example(cells=[("a", "2", "two\rthree"), ("b", "10", "x")], fmt="csv")  # N-BAD-1, N-BAD-6
@given(cells=st.lists(st.tuples(CELL, CELL, CELL), min_size=1, max_size=6,
                      unique_by=lambda c: c[0].strip()),
       fmt=st.sampled_from(["csv", "jsonl"]))
def test_table_cells(cells, fmt):
    """Rows whose id, pred (a class name: the table has pred_index) and text cells hold any text
    come back from `select` all there, in order, each cell as written."""
    rows = [{"rank": k + 1, "id": f"#{k}{i}", "score": 1.0 - k / 64, "pred": p or "x",
             "pred_index": k, "text": t} for k, (i, p, t) in enumerate(cells)]

    def check(root, result):
        assert result.exit_code == 0, result.stderr
        back = [json.loads(line) for line in (root / "out" / "t.csv").read_text().splitlines()]
        assert [(r["id"], r["pred"], r["pred_index"], r["text"]) for r in back] == \
            [(r["id"], r["pred"], r["pred_index"], r["text"] or None) for r in rows]

    run_in_fresh_workspace(lambda root: write_table(rows, root / f"in.{fmt}", fmt),
                           ["select", f"in.{fmt}", "-n", str(len(rows)), "--no-diverse", "-f",
                            "jsonl", "-q", "-o", "out/t.csv"], check)
