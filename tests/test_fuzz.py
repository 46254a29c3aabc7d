"""Fuzzing the files users hand to alcli (hypothesis): pool manifests, exclusion files, configs and
Label Studio exports. Whatever they hold, a run ends with exit 0, or exit 1 and one
`alcli: error:` line on stderr; never a traceback; and no file but the output and its sidecars
(OUTPUT.*) is created, changed or removed.

The examples are derandomized so that CI sees the same inputs every run;
ALCLI_FUZZ_EXAMPLES=N runs more of them (with fresh randomness) when looking for new defects.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, example, given, settings, strategies as st
from typer.testing import CliRunner

from alcli.cli import app

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


def run_in_fresh_workspace(write_input, args: list[str]):
    """Builds a workspace, lets `write_input(root)` add the fuzzed file, runs `alcli ARGS` in it,
    and checks the run's contract."""
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
