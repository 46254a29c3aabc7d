"""Issue 49 ("a newcomer's first hour, round 3"), items 1, 6, 8, 9, 10 and 13: a torchvision built
for another torch said in one sentence (a stand-in torchvision whose import fails as the real
mismatch does), the YOLO folder as a trainer reads it (Ultralytics' image-to-label rule), a missing
pool named before "no model given", --arch-kwargs the model does not take, simulate stopped and
resumed in words, and the licence."""
from __future__ import annotations

import contextlib
import io
import json
import os
import re
import signal
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest
import torch
import torchvision

from cli_errors import assert_one_error
from shell import PYTHON, invoke_in, ok

REPO = Path(__file__).resolve().parents[1]
DEMO_POOL = REPO / "data" / "demo" / "pool"


def run_alcli(*args, cwd, env=None, timeout=120):
    return subprocess.run([sys.executable, "-m", "alcli", *map(str, args)], cwd=cwd,
                          env={**os.environ, "PYTHONWARNINGS": "ignore", **(env or {})},
                          capture_output=True, text=True, timeout=timeout)


def one_sentence(out) -> str:
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 1, out.stderr
    assert len(lines) == 1 and lines[0].startswith("alcli: error: "), out.stderr
    assert "Traceback" not in out.stderr
    return lines[0]


# ----------------------------------------------- 1: a torchvision that does not match torch
# what the real mismatch raises (torch 2.13.0+cpu beside a CUDA torchvision 0.28.0): importing
# torchvision registers fake kernels for its ops, whose C++ half never loaded
FAKE_TORCHVISION = '''import torch  # as the real one does first
from torchvision import _meta_registrations  # noqa: F401
'''
FAKE_META = '''raise RuntimeError("operator torchvision::nms does not exist")
'''


@pytest.fixture()
def broken_torchvision(tmp_path):
    """A folder for PYTHONPATH holding a torchvision 0.28.0 whose import fails as the real
    mismatch does."""
    site = tmp_path / "site"
    (site / "torchvision").mkdir(parents=True)
    (site / "torchvision" / "__init__.py").write_text(FAKE_TORCHVISION)
    (site / "torchvision" / "_meta_registrations.py").write_text(FAKE_META)
    meta = site / "torchvision-0.28.0.dist-info"
    meta.mkdir()
    (meta / "METADATA").write_text("Metadata-Version: 2.1\nName: torchvision\nVersion: 0.28.0\n")
    return {"PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])}


def check_mismatch_sentence(line: str) -> None:
    assert "torchvision 0.28.0 does not match the installed torch " + torch.__version__ in line
    assert "torchvision::nms does not exist" in line
    assert "reinstall both from one index" in line
    assert "pip install --force-reinstall torch torchvision --index-url " \
        "https://download.pytorch.org/whl/cpu" in line


def test_1_a_torchvision_arch_with_a_mismatched_torchvision_is_one_sentence(tmp_path,
                                                                             broken_torchvision):
    torch.save({"fc.weight": torch.zeros(2, 2)}, tmp_path / "w.pt")
    out = run_alcli("score", DEMO_POOL, "-m", "w.pt", "--arch", "torchvision:resnet18", cwd=tmp_path,
                    env=broken_torchvision)
    check_mismatch_sentence(one_sentence(out))


def test_1_any_command_meeting_the_mismatch_says_the_same_sentence(tmp_path):
    """Wherever torchvision is first imported (a detector's loss, --decode gpu), the CLI's own
    handler says it: a stand-in command of an app with alcli's error conventions that raises
    what the import raises."""
    import typer
    from typer.testing import CliRunner
    from alcli.cli import _Alcli

    app = typer.Typer(cls=_Alcli)

    @app.command()
    def boom():
        raise RuntimeError("operator torchvision::nms does not exist")

    @app.command()
    def other():
        raise RuntimeError("something else")

    result = CliRunner().invoke(app, ["boom"])
    assert result.exit_code == 1 and result.stdout == ""
    [line] = result.stderr.splitlines()
    assert line.startswith("alcli: error: the installed torchvision ")
    assert "does not match the installed torch " + torch.__version__ in line
    assert "reinstall both from one index" in line
    result = CliRunner().invoke(app, ["other"])  # any other error is not called a mismatch
    assert isinstance(result.exception, RuntimeError)


def test_1_other_errors_are_not_called_a_mismatch():
    from alcli.errors import torchvision_mismatch
    assert torchvision_mismatch(RuntimeError("CUDA out of memory")) is None
    assert torchvision_mismatch(ImportError("No module named 'torchvision'")) is None
    assert torchvision_mismatch(ValueError("torchvision::nms")) is None


def test_1_readme_installs_the_pair_from_one_index_and_checks_it():
    readme = (REPO / "README.md").read_text()
    assert "pip install torch torchvision --index-url https://download.pytorch.org/whl/cpu" in readme
    code = re.search(r'`pyth[o]n -c "(import torch, torchvision;[^`"]*)"`', readme).group(1)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):  # in this process: torchvision is loaded already
        exec(code, {})
    assert printed.getvalue().split()[:2] == [torch.__version__, torchvision.__version__]
    assert printed.getvalue().rstrip().endswith("tensor([0])")
    assert "cannot be reached" in readme or "unreachable" in readme


# ------------------------------------------------------------------------ 8: a missing pool first
def test_8_a_missing_pool_is_named_before_the_missing_model(tmp_path):
    result = invoke_in(tmp_path, "score", "no/such/dir")
    assert_one_error(result, "pool no/such/dir does not exist", "item 8")
    assert "no model given" not in result.stderr


# ------------------------------------------------------------- 10: simulate stopped and resumed
TOY = "import torch.nn as nn\n\n\ndef Net():\n    return nn.Linear(4, 3)\n"
TOY_MODULE = "newcomer3_toy"  # imported in this process by the rerun: a name no other test uses
# no torch here (fast): every round's checkpoint is the same saved one; round 1 waits while the
# file `hang` exists, so that the test can stop the run there
TRAIN = """import os, shutil, sys, time
labeled, out, r = sys.argv[1:4]
if r == "1" and os.path.exists("hang"):
    open("waiting", "w").close()
    time.sleep(120)
shutil.copy("init.pt", out)
"""


def simulate_folder(tmp_path: Path) -> Path:
    g = torch.Generator().manual_seed(0)
    y = torch.arange(30) % 3
    x = torch.eye(3, 4)[y] * 2 + torch.randn(30, 4, generator=g)
    torch.save({"x": x, "y": y, "ids": [f"r{i:02d}" for i in range(30)]}, tmp_path / "pool.pt")
    (tmp_path / f"{TOY_MODULE}.py").write_text(TOY)
    (tmp_path / "train.py").write_text(TRAIN)
    torch.manual_seed(0)
    torch.save(torch.nn.Linear(4, 3).state_dict(), tmp_path / "init.pt")
    return tmp_path


SIMULATE = ("simulate", "pool.pt", "--eval", "pool.pt", "--arch", f"{TOY_MODULE}:Net", "--trust-checkpoint",
            "--train", f"{PYTHON} train.py {{labeled}} {{model}} {{round}}", "--init", 6, "-n", 3,
            "--rounds", 1, "--strategies", "margin", "--seeds", 1, "--workdir", "runs",
            "-o", "curves.csv")


def _signals_as_a_shell_leaves_them():
    """The run starts as from a shell: SIGINT and SIGCHLD at their defaults, none blocked (a
    disposition a test worker inherited or set, ignored or blocked, would pass to the run and
    its training command: in the full suite the SIGINT went unanswered for 60 s)."""
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGCHLD):
        signal.signal(signum, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_SETMASK, set())


def test_10_simulate_stopped_says_what_it_keeps_and_the_rerun_says_what_it_reuses(tmp_path):
    """Ctrl-C (SIGINT to the process; SIGTERM takes the same way out, with 143)."""
    signum = signal.SIGINT
    folder = simulate_folder(tmp_path)
    (folder / "hang").touch()
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(folder), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen([sys.executable, "-m", "alcli", *map(str, SIMULATE)], cwd=folder,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=_signals_as_a_shell_leaves_them)
    deadline = time.monotonic() + 60
    while not (folder / "waiting").exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline
        time.sleep(0.02)
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signum, err
    last = err.strip().splitlines()[-1]
    assert last == (f"alcli: stopped by {signal.Signals(signum).name} in round 1 (strategy margin, "
                    f"seed 0); 1 finished round of 2 is kept in the work folder runs: run the same "
                    f"command again to go on from there"), err
    assert "Traceback" not in err
    (folder / "hang").unlink()
    out = ok(invoke_in(folder, *SIMULATE))  # in this process (no second torch import)
    assert ("resuming from the work folder runs: 1 of the 2 rounds are finished there and kept, "
            "not rerun") in out.stderr
    assert "margin seed 0 round 0" not in out.stderr and "margin seed 0 round 1" in out.stderr


# ------------------------------------------------------------- 6: the YOLO folder trains as it is
def ultralytics_dataset(data_yaml: Path) -> tuple[dict, list[str], list[str]]:
    """What Ultralytics (8.x: check_det_dataset, get_img_files, img2label_paths; not a test
    dependency, it pulls OpenCV and polars: its own YOLODataset was checked by hand on such a
    folder, 8.4.190, 3 images, 3 labels found) reads from a data.yaml: the yaml, the image files of `train`, and where it looks for their label files.
    No `path` key: the paths are relative to the yaml's folder; a list file's lines starting ./
    are relative to the list's folder, the rest as given; an image's label file is its path with
    the last /images/ replaced by /labels/ and its suffix by .txt."""
    import yaml
    data = yaml.safe_load(data_yaml.read_text())
    root = Path(data.get("path") or data_yaml.parent)
    listing = root / data["train"]
    parent = str(listing.parent) + os.sep
    images = [x.replace("./", parent) if x.startswith("./") else x
              for x in listing.read_text().strip().splitlines()]
    sa, sb = f"{os.sep}images{os.sep}", f"{os.sep}labels{os.sep}"
    labels = [sb.join(x.rsplit(sa, 1)).rsplit(".", 1)[0] + ".txt" for x in images]
    return data, images, labels


def det_rows(folder: Path) -> list[dict]:
    from PIL import Image
    rows = []
    for k, (row_id, size) in enumerate([("imgs/a.jpg", (64, 48)), ("imgs/sub/b.png", (33, 17)),
                                        ("c.png", (20, 10))]):
        path = folder / "pool" / row_id
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.new("RGB", size, (k * 40, 0, 0)).save(path)
        rows.append({"id": row_id, "score": 1.0 - k / 10, "width": size[0], "height": size[1],
                     "boxes": json.dumps([[1, 2, 11, 8, k % 2 + 1, 0.9]]),
                     "path": f"pool/{row_id}"})
    return rows


def write_det_table(path: Path, rows: list[dict], meta: dict) -> Path:
    import csv
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    Path(f"{path}.meta.json").write_text(json.dumps(meta))
    return path


@pytest.mark.parametrize("column", ["path", "pool"])
def test_6_the_yolo_folder_resolves_every_image_and_label_from_anywhere(tmp_path, column,
                                                                       monkeypatch):
    """From the table's path column, or from the pool its meta.json records; the folder moved
    elsewhere and read from another working directory still resolves."""
    rows = det_rows(tmp_path)
    meta = {"task": "detection", "class_names": ["background", "cat", "dog"]}
    if column == "pool":
        rows = [{k: v for k, v in r.items() if k != "path"} for r in rows]
        meta["pool_path"] = "pool"
    table = write_det_table(tmp_path / "det.csv", rows, meta)
    result = ok(invoke_in(tmp_path, "select", table, "-n", 3, "--no-diverse", "-f", "yolo", "-o", "out"))
    assert "warning" not in result.stderr
    moved = tmp_path / "elsewhere" / "batch"
    moved.parent.mkdir()
    (tmp_path / "out").rename(moved)
    monkeypatch.chdir(tmp_path / "elsewhere")
    data, images, labels = ultralytics_dataset(moved / "data.yaml")
    assert data["names"] == {0: "cat", 1: "dog"}
    assert len(images) == 3
    for row, image, label in zip(rows, images, labels):
        assert Path(image).read_bytes() == (tmp_path / "pool" / row["id"]).read_bytes(), image
        cls, cx, cy, w, h = Path(label).read_text().split()  # the row's box, where it looks
        assert int(cls) == json.loads(row["boxes"])[0][4] - 1
        assert float(w) == pytest.approx(10 / row["width"], abs=1e-6)


def test_6_images_not_found_are_named_in_a_warning(tmp_path):
    rows = [{**r, "path": "gone/" + r["id"]} for r in det_rows(tmp_path)]
    table = write_det_table(tmp_path / "det.csv", rows, {"task": "detection"})
    result = ok(invoke_in(tmp_path, "select", table, "-n", 3, "--no-diverse", "-f", "yolo", "-o", "out"))
    assert "3 of the batch's 3 images were not found (the first: gone/imgs/a.jpg)" in result.stderr
    assert "--image-dir" in result.stderr
    assert not (tmp_path / "out" / "images").exists() and (tmp_path / "out" / "labels").is_dir()


# ------------------------------------------------------------------- 9: --arch-kwargs not taken
def test_9_an_arch_kwarg_the_detector_does_not_take_is_named_with_the_one_it_takes():
    from alcli.files.checkpoint import build_arch
    with pytest.warns(UserWarning, match=r"takes no argument detections_per_img \(did you mean "
                                         r"box_detections_per_img\?\); FasterRCNN was built without it"):
        build_arch("torchvision:fasterrcnn_mobilenet_v3_large_320_fpn",
                   {"num_classes": 3, "detections_per_img": 5})
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the right names: no warning
        model = build_arch("torchvision:fasterrcnn_mobilenet_v3_large_320_fpn",
                           {"num_classes": 3, "box_detections_per_img": 5, "min_size": 320})
        assert model.roi_heads.detections_per_img == 5
        build_arch("torchvision:retinanet_resnet50_fpn", {"num_classes": 3, "detections_per_img": 5})


def test_9_the_docs_name_each_detectors_own_keys():
    text = (REPO / "docs" / "detection.md").read_text()
    assert "`box_detections_per_img`" in text and "`box_score_thresh`" in text
    prose = " ".join(text.split())
    assert "(its own `score_thresh` and `detections_per_img`)" not in prose


# ------------------------------------------------------------------------------------ 13: licence
PERMISSIVE = {"Apache-2.0", "LLVM-exception", "MIT", "MIT-CMU", "BSD", "BSD-2-Clause",
              "BSD-3-Clause", "0BSD", "BSL-1.0", "Zlib", "CC0-1.0", "HPND", "PSF-2.0", "ISC"}


def licence_terms(dist: str) -> set[str]:
    """The SPDX terms a distribution's metadata names (License-Expression, else the License field's
    first word, else the OSI classifiers)."""
    from importlib.metadata import metadata
    meta = metadata(dist)
    if meta.get("License-Expression"):
        return set(re.findall(r"[A-Za-z0-9.+-]+", meta["License-Expression"])) - {"AND", "OR", "WITH"}
    if meta.get("License") and len(meta["License"]) < 40:
        return {meta["License"].split()[0]}
    found = {c.rsplit("::", 1)[-1].strip() for c in meta.get_all("Classifier") or []
             if c.startswith("License ::")}
    return {{"MIT License": "MIT", "BSD License": "BSD"}.get(c, c) for c in found}


def test_13_the_licence_file_pyproject_and_every_runtime_dependency():
    text = (REPO / "LICENSE").read_text()
    assert text.lstrip().startswith("Apache License") and "Version 2.0, January 2004" in text
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert project["license"] == "Apache-2.0" and project["license-files"] == ["LICENSE"]
    for requirement in project["dependencies"]:
        dist = re.match(r"[A-Za-z0-9_.-]+", requirement).group(0)
        terms = licence_terms(dist)
        assert terms and terms <= PERMISSIVE, (dist, terms)


def test_a_long_run_note_is_revised_once_when_later_batches_run_off_it():
    """Issue 49 item 7: a detector's first image alone said 14.4 s per image; the run took 27.4."""
    from alcli.score.runner import Estimate
    eta = Estimate(1001, "egl")
    assert "(14.4 s per example, 1,000 examples left)" in eta.after(14.4, 1)
    revised = eta.after(14.4 + 8 * 27.4, 9)  # the next batch of 8, at 27.4 s each
    assert revised.startswith("revised: on the CPU this run takes about") and "(27.4 s per example" in revised
    assert eta.after(14.4 + 16 * 27.4, 17) is None  # revised once
    steady = Estimate(1001, "egl")
    assert steady.after(10.0, 1) and steady.after(10.0 + 8 * 11.0, 9) is None  # within 25%: kept
    late = Estimate(1001, "egl")  # the first batch says nothing (0.1 s each), the next ones 2 s each
    assert late.after(0.1, 1) is None
    note = late.after(0.1 + 8 * 2.0, 9)
    assert note.startswith("on the CPU this run takes about") and "(2.0 s per example" in note
