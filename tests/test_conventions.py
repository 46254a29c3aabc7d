"""Issue 13, "a newcomer's first hour": errors as one sentence (no traceback), partial files a person
can act on, logs and pipes (progress lines, JSON, exit 141, NUL-separated paths), config paths,
the conventions of CLI tools (--version, -h, completion, -v), help at 80 columns, and a run under a
real pseudo-terminal. Real files and real processes throughout; nothing mocked."""
from __future__ import annotations

import json
import os
import re
import select as select_module
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from typer.testing import CliRunner

import alcli
from alcli.cli import app
from alcli.errors import AlcliError
from cli_errors import assert_one_error
from conftest import parse_csv

REPO = Path(__file__).resolve().parents[1]
runner = CliRunner()


def cli(*args, input=None, env=None):
    return runner.invoke(app, [str(a) for a in args], input=input, env=env)


def ok(result):
    assert result.exit_code == 0, result.stderr + result.stdout
    return result


def env(**more):
    return {**os.environ, "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1", **more}


def alcli_cmd(*args):
    return [sys.executable, "-m", "alcli", *map(str, args)]


BIG = 1500  # rows of big_pool: ~70 bytes each in a table


@pytest.fixture(scope="module")
def big_pool(tmp_path_factory):
    """BIG tensor examples: long enough to interrupt, and a table (~105 KB) larger than a pipe's
    buffer (64 KiB)."""
    path = tmp_path_factory.mktemp("big") / "big.pt"
    g = torch.Generator().manual_seed(1)
    torch.save({"x": torch.randn(BIG, 3, 6, 6, generator=g),
                "ids": [f"ex{i:05d}" for i in range(BIG)]}, path)
    return path


def unwritable_folder() -> Path:
    """A real folder in which no file can be created, even by root (the tests run as root, so a
    chmod 0o555 folder would not do): sysfs, /sys."""
    folder = Path("/sys")
    if not folder.is_dir():
        pytest.skip("no /sys on this machine")
    try:
        with tempfile.TemporaryFile(dir=folder):
            pytest.skip("/sys is writable here")
    except OSError:
        return folder


# --- no traceback for an input or environment fault -------------------------------------------

def test_an_unwritable_output_folder_is_one_sentence(in_ws, tmp_path):
    ro = unwritable_folder()
    for extra in ([], ["--embeddings"]):
        result = cli("score", "pool", "-m", "model.pt", "-c", "config.yaml", "-s", "loss",
                     "-o", ro / "x.csv", *extra)
        assert_one_error(result, f"cannot write in the folder {ro}", f"score {extra}")
    for k in (0, 1):
        ok(cli("score", "pool", "-m", "model.pt", "-c", "config.yaml", "-s", "loss", "--shard",
               f"{k}/2", "-o", tmp_path / f"part{k}.csv", "-q"))
    result = cli("merge", tmp_path / "part0.csv", tmp_path / "part1.csv", "-o", ro / "m.csv")
    assert_one_error(result, f"cannot write in the folder {ro}", "merge")
    # an OSError no check foresaw (the contact sheet's temporary file): still one sentence
    result = cli("select", tmp_path / "part0.csv", "-n", "2", "-o", tmp_path / "b.csv",
                 "--contact-sheet", ro / "sheet.png", "--image-dir", "pool")
    assert_one_error(result, str(ro), "contact sheet")


def test_a_huge_batch_size_is_one_sentence_and_leaves_nothing(in_ws, tmp_path):
    out = tmp_path / "s.csv"
    result = cli("score", "pool", "-m", "model.pt", "-c", "config.yaml", "-b",
                 "99999999999999999999", "-o", out)
    assert_one_error(result, "--batch-size must be an integer <=", "-b huge")
    assert list(tmp_path.iterdir()) == []


def test_usage_errors_are_one_line_with_exit_2():
    for args, needle in ((["score", "-b", "abc"], "--batch-size"), (["score", "--nope"], "--nope"),
                         (["merge"], "PART"), (["frobnicate"], "frobnicate")):
        result = cli(*args)
        assert result.exit_code == 2, args
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("alcli: error: "), (args, result.stderr)
        assert needle in lines[0] and "--help'" in lines[0] and "╭" not in result.stderr


def test_a_text_file_as_checkpoint_says_so(in_ws, tmp_path):
    (tmp_path / "notes.pt").write_text("epoch 3: loss 0.12\n")
    result = cli("score", "pool", "-m", tmp_path / "notes.pt", "-c", "config.yaml")
    assert_one_error(result, "it is a text file, starting 'epoch 3: loss 0.12'", "text checkpoint")


def test_unknown_layers_list_module_names_and_point_to_inspect(in_ws):
    result = cli("score", "pool", "-m", "model.pt", "-c", "config.yaml", "--layers", "nonexistent")
    assert_one_error(result, "modules with parameters: conv, fc", "--layers")
    assert "alcli inspect" in result.stderr


def test_a_config_typo_gets_did_you_mean(in_ws, tmp_path):
    (tmp_path / "typo.yaml").write_text("batch_sise: 3\n")
    result = cli("score", "pool", "-m", "model.pt", "-c", tmp_path / "typo.yaml")
    assert_one_error(result, "did you mean 'batch_size'?", "typo")
    assert "strategy" not in result.stderr  # not the list of every key


# --- partial files --------------------------------------------------------------------------------

def _image_pool(folder: Path, n: int, odd: set[int] = frozenset()) -> None:
    """n 6x6 images (8x8 at the positions in `odd`, which stop a run)."""
    rng = np.random.default_rng(3)
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        side = 8 if i in odd else 6
        Image.fromarray(rng.integers(0, 256, (side, side, 3), dtype=np.uint8), "RGB").save(
            folder / f"im{i:02d}.png")


def test_a_run_that_scored_nothing_leaves_no_partial_file(in_ws, tmp_path):
    pool, out = tmp_path / "pool", tmp_path / "s.csv"
    _image_pool(pool, 8, odd={1})  # the first batch cannot be formed
    args = ["score", pool, "-m", "model.pt", "-c", "config.yaml", "-o", out, "-q"]
    result = cli(*args)
    assert result.exit_code == 1 and "alcli: error:" in result.stderr
    assert not Path(f"{out}.partial").exists()
    _image_pool(pool, 8)  # corrected: the same command runs, no --resume, no file to delete
    ok(cli(*args))
    assert len(parse_csv(out.read_text())) == 8


def test_another_runs_partial_file_is_explained_and_restart_discards_it(in_ws, tmp_path):
    pool, out = tmp_path / "pool", tmp_path / "s.csv"
    partial = Path(f"{out}.partial")
    _image_pool(pool, 12, odd={11})  # batches of 5: two batches finish, the third stops the run
    args = ["score", pool, "-m", "model.pt", "-c", "config.yaml", "-o", out, "-q"]
    assert cli(*args, "--checkpoint-every", "1").exit_code == 1
    assert partial.exists()
    (pool / "im11.png").unlink()
    (pool / "im00.png").unlink()   # one of the finished examples
    result = cli(*args)
    assert_one_error(result, "holds 10 finished rows of an earlier run", "no --resume")
    assert "--resume" in result.stderr and "--restart" in result.stderr
    result = cli(*args, "--resume")
    assert_one_error(result, "the pool had 12 examples, now 10; 1 of the finished examples are "
                             "no longer in it", "--resume")
    assert "--restart" in result.stderr and "pool_fingerprint" not in result.stderr
    result = ok(cli(*args, "--restart"))
    assert f"alcli: discarded {partial} (10 finished rows of an earlier run)" in result.stderr
    assert len(parse_csv(out.read_text())) == 10 and not partial.exists()


def _rows_in(path: Path) -> int:
    try:
        return max(0, path.read_bytes().count(b"\n") - 1)
    except FileNotFoundError:
        return 0


def test_a_stdout_run_keeps_its_partial_under_dot_alcli_and_resumes(in_ws, tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    for name in ("model.pt", "config.yaml"):
        shutil.copy(in_ws.root / name, work / name)
    # long enough that a loaded machine cannot finish it between the first flushes and SIGINT
    rows = 4 * BIG
    torch.save({"x": torch.randn(rows, 3, 6, 6, generator=torch.Generator().manual_seed(2)),
                "ids": [f"ex{i:05d}" for i in range(rows)]}, tmp_path / "pool.pt")
    args = alcli_cmd("score", tmp_path / "pool.pt", "-m", "model.pt", "-c", "config.yaml", "-b", "8", "-q",
                     "--checkpoint-every", "96")
    first = subprocess.Popen(args, cwd=work, env=env(), stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not any(_rows_in(p) >= 200 for p in (work / ".alcli").glob("*.partial")):
        assert first.poll() is None and time.monotonic() < deadline, first.communicate()
        time.sleep(0.01)
    first.send_signal(signal.SIGINT)
    out, err = first.communicate(timeout=60)
    assert first.returncode == 130 and out == ""
    m = re.search(r"stopped by SIGINT; the finished rows are in (\.alcli/stdout-\w+\.partial), "
                  r"run the same command with --resume to continue", err)
    assert m and (work / m.group(1)).is_file(), err
    second = subprocess.run(args + ["--resume"], cwd=work, env=env(), capture_output=True,
                            text=True, timeout=120)
    assert second.returncode == 0, second.stderr
    assert "resuming: " in second.stderr and len(parse_csv(second.stdout)) == rows
    assert not (work / m.group(1)).exists()


# --- pipes and logs ---------------------------------------------------------------------------------

def test_a_closed_stdout_exits_141_quietly(in_ws, big_pool):
    proc = subprocess.Popen(alcli_cmd("score", big_pool, "-m", "model.pt", "-c", "config.yaml",
                                      "-s", "loss", "-q"),
                            cwd=in_ws.root, env=env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    assert proc.stdout.readline().startswith(b"rank,id,score")  # then go away, like `head -1`
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 141 and err == ""  # BIG rows overflow the pipe's buffer


def test_progress_lines_and_a_plain_summary_in_a_log(in_ws, tmp_path):
    result = ok(cli("score", "pool", "-m", "model.pt", "-c", "config.yaml", "-o",
                    tmp_path / "s.csv", "--progress-every", "0"))
    lines = result.stderr.splitlines()
    progress = [line for line in lines if line.startswith("alcli: scoring ")]
    assert len(progress) == 3  # batches of 5 of 14 examples: a line after each
    assert re.fullmatch(r"alcli: scoring 5/14 \(36%\), [\d,.]+ ex/s, eta \d+s", progress[0])
    assert progress[-1].startswith("alcli: scoring 14/14 (100%)")
    assert "examples  14" in lines and "top 5:" in lines
    assert all(ord(c) < 128 for c in result.stderr)  # no box drawing, no bar
    assert lines[-2:] == [f"alcli: wrote 14 rows to {tmp_path / 's.csv'}",
                          f"alcli: wrote their embeddings to {tmp_path / 's.csv'}.emb.npz"]


def test_log_format_json_for_progress_and_summary(in_ws, tmp_path):
    result = ok(cli("score", "pool", "-m", "model.pt", "-c", "config.yaml", "-o",
                    tmp_path / "s.csv", "--progress-every", "0", "--log-format", "json"))
    events = [json.loads(line) for line in result.stderr.splitlines()]  # every line is JSON
    progress = [e for e in events if e["event"] == "progress"]
    assert [e["done"] for e in progress] == [5, 10, 14] and progress[0]["total"] == 14
    summary = next(e for e in events if e["event"] == "summary")
    assert summary["examples"] == 14 and summary["device"] == "cpu"
    assert summary["output"] == str(tmp_path / "s.csv") and len(summary["top"]) == 5
    assert summary["top"][0]["rank"] == 1


def test_nul_separated_paths_and_image_files_as_the_pool(in_ws):
    paths = sorted(str(p) for p, _ in in_ws.images.values() if p.suffix == ".png")[:5]
    rows = parse_csv(ok(cli("score", "-", "-0", "-m", "model.pt", "-c", "config.yaml", "-q",
                            input="\0".join(paths) + "\0")).stdout)
    assert sorted(r["id"] for r in rows) == paths
    result = cli("score", "-", "-m", "model.pt", "-c", "config.yaml", input="\0".join(paths))
    assert_one_error(result, "pass -0/--null", "NUL without -0")
    rows = parse_csv(ok(cli("score", *paths[:3], "-m", "model.pt", "-c", "config.yaml",
                            "-q")).stdout)
    assert sorted(r["id"] for r in rows) == paths[:3]
    rows = parse_csv(ok(cli("score", paths[0], "-m", "model.pt", "-c", "config.yaml",
                            "-q")).stdout)
    assert [r["id"] for r in rows] == [paths[0]]


def test_select_on_an_empty_stdin_never_scores_the_configs_pool(tmp_path, monkeypatch):
    """A pipeline never changes its input: an empty stdin (a failed `score |`, </dev/null) is
    an error even where ./configs/default.yaml names a pool; nothing reaches stdout. (In-process,
    stdin given as an empty stream: a subprocess with stdin=DEVNULL flaked here, reading another
    process's text, in full-suite runs on this shared machine.)"""
    monkeypatch.chdir(REPO)
    for where in (REPO, tmp_path):
        monkeypatch.chdir(where)
        assert_one_error(cli("select", "-n", "3", input=""), "nothing on stdin, so no table to "
                         "select from (did the command before the pipe fail?)", str(where))


def test_a_failing_score_piped_into_select_selects_nothing():
    """`alcli score BAD | alcli select -n 3` in the repository (whose configs/default.yaml names
    the demo pool): select exits non-zero and writes nothing; before, it scored the demo pool."""
    done = subprocess.run(f"set -o pipefail; {sys.executable} -m alcli score no/such/pool -q | "
                          f"{sys.executable} -m alcli select -n 3", shell=True, cwd=REPO,
                          capture_output=True, text=True, env=env(), executable="/bin/bash")
    assert done.returncode == 1 and done.stdout == "", done.stderr
    assert "pool no/such/pool does not exist" in done.stderr
    assert "nothing on stdin, so no table to select from" in done.stderr


def test_config_paths_are_relative_to_the_config_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # anywhere but the repository
    rows = parse_csv(ok(cli("score", "-c", REPO / "configs" / "default.yaml", "-s", "loss",
                            "-q")).stdout)
    assert len(rows) == 400
    (tmp_path / "c.yaml").write_text("model: data/demo/model.pt\n")
    result = cli("score", "-c", "c.yaml")
    assert_one_error(result, "model file data/demo/model.pt (key 'model' in c.yaml) does not "
                             "exist", "config path")


# --- conventions: version, help, completion, verbose, warnings --------------------------------------

def test_version_help_and_completion(in_ws, tmp_path):
    assert ok(cli("--version")).stdout == f"alcli {alcli.__version__}\n"
    assert ok(cli("-V")).stdout == f"alcli {alcli.__version__}\n"
    for args in (["-h"], ["--help"], ["score", "-h"], ["select", "-h"], ["merge", "-h"]):
        assert ok(cli(*args)).stdout.startswith("Usage: alcli")
    assert "--install-completion" in ok(cli("-h")).stdout
    for words, cword, expected in (("alcli sc", "1", "score"), ("alcli score --batch", "2",
                                                                "--batch-size")):
        done = subprocess.run(alcli_cmd(), env=env(COMP_WORDS=words, COMP_CWORD=cword,
                                                   _ALCLI_COMPLETE="complete_bash"),
                              capture_output=True, text=True, timeout=60)
        assert done.stdout.split() == [expected], done.stderr  # what bash's completion asks
    out = tmp_path / "s.csv"
    ok(cli("score", "pool", "-m", "model.pt", "-c", "config.yaml", "-o", out, "-q"))
    text = Path(f"{out}.meta.json").read_text()
    assert text.endswith("}\n") and json.loads(text)["alcli_version"] == alcli.__version__


def test_verbose_says_where_each_setting_came_from(in_ws, tmp_path):
    result = ok(cli("score", "pool", "-m", "model.pt", "-c", "config.yaml", "-o",
                    tmp_path / "s.csv", "-v", "-b", "7"))
    assert "alcli: batch_size = 7 (option --batch-size)" in result.stderr
    assert "alcli: arch = 'tinynet:TinyNet' (key 'arch' in config.yaml)" in result.stderr


def test_warnings_have_one_prefix_and_select_says_what_it_wrote(in_ws, tmp_path):
    table = tmp_path / "t.csv"
    ok(cli("score", "pool", "-m", "model.pt", "-c", "config.yaml", "-o", table, "-q"))
    result = ok(cli("select", table, "-n", "99", "-o", tmp_path / "b.csv"))
    assert result.stderr.splitlines() == [
        "alcli: warning: the budget is 99 but only 14 rows are left to choose from; selected "
        "them all", f"alcli: wrote 14 rows to {tmp_path / 'b.csv'}"]
    # every warning goes through alcli.terminal, whose prefix is `alcli: warning: `
    sources = [p for p in (REPO / "alcli").rglob("*.py") if p.name != "terminal.py"]
    assert not [p for p in sources if re.search(r"[\"']warning:", p.read_text())]


HELP_TYPE_TAGS = re.compile(r"<(str|int|float|bool|path|list\[[a-z]+\])>")


def test_help_reads_cleanly_at_80_columns():
    """Every command's help at COLUMNS=80: no line over 80, no Typer type tags, no `{ARG}`, no
    line broken after "[default:" or inside a hyphenated word, examples whole on their lines, and
    --format naming labelstudio only where select takes it."""
    for command in ("", "score", "merge", "select", "push", "pull", "inspect", "simulate"):
        text = ok(cli(*filter(None, [command]), "--help", env={"COLUMNS": "80"})).stdout
        lines = text.splitlines()
        assert max(map(len, lines)) <= 80, command
        assert not HELP_TYPE_TAGS.search(text), command
        assert "{" not in lines[0] and lines[0].startswith("Usage: alcli"), command
        assert not [line for line in lines if re.search(r"(\[default:|[a-z]-)$", line)], command
        examples = text.split("Examples:")[1] if "Examples:" in text else ""
        for line in examples.splitlines():  # each example a whole command on its own line
            assert not line.strip() or line.startswith(("  alcli ", "  find ", "  torchrun ",
                                                        "      --", "  Diverse")), line
        if command in ("score", "merge"):
            assert "labelstudio" not in text
        if command == "select":
            assert "labelstudio" in text
        # every option that takes a value shows a metavar in capitals (or its choices)
        for line in text.split("Examples:")[0].splitlines():
            m = re.match(r"  (?:-\w, )?(--[\w-]+)(?: (\S+))?\s", line)
            if m and m.group(2):
                assert m.group(2) == m.group(2).upper() or "|" in m.group(2), line
    assert "Usage: alcli merge [OPTIONS] PART..." in ok(cli("merge", "-h")).stdout


# --- README and the Python API ------------------------------------------------------------------------

def test_readme_sample_is_what_the_demo_prints(demo_run):
    readme = (REPO / "README.md").read_text()
    block = readme.split("head -4 scores.csv\n```\n\n```\n", 1)[1].split("```", 1)[0]
    shown = parse_csv(block)
    assert demo_run.returncode == 0, demo_run.stderr  # `python -m alcli score` (conftest)
    printed = parse_csv(demo_run.stdout)[:len(shown)]
    assert [(r["id"], r["pred"]) for r in printed] == [(r["id"], r["pred"]) for r in shown]
    for got, want in zip(printed, shown):  # float32 sums may differ in the last bits by machine
        assert float(got["score"]) == pytest.approx(float(want["score"]), rel=1e-6)


def test_the_python_api_on_a_one_tensor_tuple_and_its_signature(in_ws):
    net = in_ws.net(torch.float32)
    x = torch.randn(4, 3, 6, 6)
    assert len(alcli.score_pool((x,), net, strategy="entropy")) == 4
    with pytest.raises(AlcliError, match=r"pool must be x, \(x,\), \(x, y\) or \(x, y, ids\)"):
        alcli.score_pool(([x, x],), net)
    import inspect
    params = inspect.signature(alcli.score_pool).parameters
    assert {"strategy", "batch_size", "layers", "device", "arch"} <= set(params)
    assert "per_class" in inspect.signature(alcli.select).parameters
    assert "strategy:" in alcli.score_pool.__doc__


def test_contact_sheet_font_has_glyphs_for_accented_ids():
    from PIL import ImageFont
    from alcli.selection.export import _font
    font = _font()
    if not isinstance(font, ImageFont.FreeTypeFont):
        pytest.skip("no DejaVu Sans here: Pillow's built-in font is used")
    missing = font.getmask("\u4e00").getbbox()  # CJK: not in DejaVu, drawn as the empty box
    assert font.getmask("é").getbbox() != missing and font.getmask("Ж").getbbox() != missing


# --- a real terminal -----------------------------------------------------------------------------------

def _read_until(fd: int, proc, needle: bytes, seen: bytearray, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while needle not in seen:
        assert time.monotonic() < deadline, seen.decode(errors="replace")[-500:]
        ready, _, _ = select_module.select([fd], [], [], 0.1)
        if ready:
            try:
                chunk = os.read(fd, 65536)
            except OSError:
                chunk = b""
            if not chunk:
                return
            seen += chunk
        elif proc.poll() is not None:
            return


def _read_once(fd: int, seen: bytearray) -> None:
    ready, _, _ = select_module.select([fd], [], [], 0.005)
    if ready:
        try:
            seen += os.read(fd, 65536)
        except OSError:
            pass


def _drain(fd: int, seen: bytearray) -> None:
    while True:
        ready, _, _ = select_module.select([fd], [], [], 0.5)
        if not ready:
            return
        try:
            chunk = os.read(fd, 65536)
        except OSError:
            return
        if not chunk:
            return
        seen += chunk


def test_under_a_terminal_the_bar_shows_ctrl_c_saves_and_resume_prefills(in_ws, big_pool, tmp_path):
    out = tmp_path / "s.csv"
    args = alcli_cmd("score", big_pool, "-m", "model.pt", "-c", "config.yaml", "-b", "4", "-o", out,
                     "--checkpoint-every", "16")
    term = env(TERM="xterm", COLUMNS="120")
    master, slave = os.openpty()
    proc = subprocess.Popen(args, cwd=in_ws.root, env=term, stdin=slave, stdout=slave,
                            stderr=slave)
    seen = bytearray()
    try:
        _read_until(master, proc, b"scoring", seen)  # the bar (it says "loading" before)
        while _rows_in(Path(f"{out}.partial")) < 100:
            assert proc.poll() is None, seen.decode(errors="replace")[-300:]
            _read_once(master, seen)
        proc.send_signal(signal.SIGINT)
        _read_until(master, proc, b"--resume to continue", seen)
        assert proc.wait(timeout=60) == 130
    finally:
        os.close(slave)
    text = seen.decode(errors="replace")
    assert "━" in text or f"/{BIG}" in text, text[-500:]
    assert f"stopped by SIGINT; the finished rows are in {out}.partial, run the same command " \
           f"with --resume to continue" in " ".join(text.split())
    saved = _rows_in(Path(f"{out}.partial"))

    master2, slave2 = os.openpty()
    resumed = subprocess.Popen(args + ["--resume"], cwd=in_ws.root, env=term, stdin=slave2,
                               stdout=slave2, stderr=slave2)
    seen2 = bytearray()
    try:
        _read_until(master2, resumed, f"wrote {BIG} rows".encode(), seen2, timeout=120)
        assert resumed.wait(timeout=60) == 0, seen2.decode(errors="replace")
    finally:
        os.close(slave2)
        _drain(master2, seen2)
        os.close(master2)
        os.close(master)
    counts = [int(n) for n in re.findall(rf"(\d+)/{BIG}", seen2.decode(errors="replace"))]
    assert counts and min(counts) >= saved  # the whole pool, the resumed part already counted


TIED = '''
import torch
from torch import nn

class Net(nn.Module):
    """A weight used outside its module: ghost cannot serve it, auto settles on vmap."""
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 3)

    def forward(self, x):
        return self.lin(x) + x[:, :3] @ self.lin.weight[:, :3].T
'''


def test_a_slower_engine_method_is_one_warning_line_with_its_cost(tmp_path):
    (tmp_path / "tied.py").write_text(TIED)
    torch.manual_seed(0)
    sys.path.insert(0, str(tmp_path))
    try:
        import tied
    finally:
        sys.path.remove(str(tmp_path))
    torch.save(tied.Net().state_dict(), tmp_path / "m.pt")
    torch.save({"x": torch.randn(6, 4)}, tmp_path / "p.pt")
    proc = subprocess.run(alcli_cmd("score", "p.pt", "-m", "m.pt", "--arch", "tied:Net",
                                    "--trust-checkpoint", "-q",
                                    "-o", "s.csv"), cwd=tmp_path, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=120)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("alcli: warning: "), proc.stderr
    assert "'vmap' method" in lines[0] and "used outside the module" in lines[0]
    assert "expected cost: typically 3 to 50 times ghost's time" in lines[0]


def test_select_at_a_terminal_with_no_table_scores_the_configs_pool_and_says_so():
    import pty
    master, slave = pty.openpty()  # stdin a terminal: a person typing `alcli select -n 2`
    try:
        done = subprocess.run(alcli_cmd("select", "-n", "2", "-s", "margin"), cwd=REPO,
                              stdin=slave, capture_output=True, text=True, env=env(), timeout=300)
    finally:
        os.close(slave)
        os.close(master)
    assert done.returncode == 0, done.stderr
    assert len(parse_csv(done.stdout)) == 2
    assert "no table given: scoring the pool" in done.stderr and "data/demo/pool" in done.stderr


def test_a_piped_table_says_why_the_batch_is_not_diverse(in_ws):
    table = ok(cli("score", "pool", "-m", "model.pt", "-c", "config.yaml", "-s", "margin", "-q",
                   "--no-embeddings")).stdout
    result = ok(cli("select", "-n", "3", input=table))
    assert len(parse_csv(result.stdout)) == 3
    warning = [line for line in result.stderr.splitlines() if "without --diverse" in line]
    assert len(warning) == 1 and "the table on stdin matches none of the embeddings" in warning[0]
    assert "--embeddings FILE" in warning[0]
