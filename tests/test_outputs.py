"""Outputs never destroy inputs, and two runs never corrupt each other (hostile-inputs BAD-1, 2,
6, 7, 8, 20 (merge), 21, 24): special files written as streams, an output that is an input
refused, sidecars that go with their table and carry its run id, one writer per output, no temp
files left by signals, no ./.alcli link followed, file names of any bytes.

The runs that must be caught in the middle use `gated.py`'s models, whose forward waits while a
file named `gate` exists (after a few calls): the run then holds its lock with rows in its
partial file for as long as the test needs, with no timing to guess.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from alcli.cli import app
from alcli.files.embeddings import embeddings_run_id
from conftest import TINYNET, parse_csv

runner = CliRunner()

GATED = TINYNET + '''
import os, time

CALLS = [0]


def _gate():
    """Wait while ./gate exists, once GATE_AFTER forwards have run."""
    CALLS[0] += 1
    while CALLS[0] > int(os.environ.get("GATE_AFTER", "3")) and os.path.exists("gate"):
        time.sleep(0.01)


class Linear(nn.Linear):
    def forward(self, x):
        _gate()
        return super().forward(x)


class Tiny(TinyNet):
    def forward(self, x):
        _gate()
        return super().forward(x)
'''
LINEAR = ["--arch", "gated:Linear", "--arch-kwargs", '{"in_features": 4, "out_features": 3}',
          "-m", "lin.pt", "-s", "margin", "-q", "--trust-checkpoint"]  # gated.py: code of the test


pytestmark = pytest.mark.usefixtures("one_thread")  # tables compared byte for byte


def env(**more):
    return {**os.environ, "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1", **more}


def invoke(*args, input=None):
    return runner.invoke(app, [*map(str, args)], input=input)


def ok(result):
    assert result.exit_code == 0, result.stderr + result.stdout
    return result


def one_sentence(result, *needles):
    """Exit 1, one `alcli: error:` line naming the culprit, no traceback."""
    lines = result.stderr.strip().splitlines()
    where = f"{result.exit_code} {result.stderr!r}"
    assert result.exit_code == 1 and len(lines) == 1, where
    assert lines[0].startswith("alcli: error: ") and "Traceback" not in result.stderr, where
    for needle in needles:
        assert needle in lines[0], where


def score_ws(ws, *args):
    """`alcli score` on the workspace's tensor pool with its tiny CNN."""
    return invoke("score", ws.tensors, "-m", ws.model, "-c", ws.config, "-q", *args)


@pytest.fixture
def gated(tmp_path, monkeypatch):
    """tmp_path as the working directory, holding gated.py, lin.pt and a 1000-row pool.pt."""
    (tmp_path / "gated.py").write_text(GATED)
    g = torch.Generator().manual_seed(0)
    torch.save({"x": torch.randn(1000, 4, generator=g)}, tmp_path / "pool.pt")
    torch.manual_seed(0)
    torch.save(torch.nn.Linear(4, 3).state_dict(), tmp_path / "lin.pt")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("GATE_AFTER", "1000000")  # runs inside the test never wait
    return tmp_path


def start(cwd, *args, stdout=subprocess.PIPE, gate_after=3):
    return subprocess.Popen([sys.executable, "-m", "alcli", "score", *map(str, args)], cwd=cwd,
                            env=env(GATE_AFTER=str(gate_after)), stdout=stdout,
                            stderr=subprocess.PIPE)


def rows_in(path: Path) -> int:
    try:
        return max(0, path.read_bytes().count(b"\n") - 1)
    except FileNotFoundError:
        return 0


def wait_for(proc, check, what, timeout=240.0):
    deadline = time.monotonic() + timeout
    while not check():
        assert proc.poll() is None, f"the run ended before {what}: {proc.communicate()}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def finish(proc, timeout=240):
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out, err.decode()


# --- BAD-1: special files are streams, never replaced ---------------------------------------------

def read_fifo(path: Path) -> tuple[threading.Thread, list[bytes]]:
    got: list[bytes] = []

    def read():
        with open(path, "rb") as f:
            got.append(f.read())
    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    return thread, got


def test_fifo_and_link_to_fifo_get_the_table_and_stay_fifos(in_ws, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the partial file of a stream output goes under ./.alcli
    reference = ok(score_ws(in_ws, "-o", "-", "--no-embeddings")).stdout.encode()
    fifo = tmp_path / "out.fifo"
    os.mkfifo(fifo)
    (tmp_path / "link.csv").symlink_to(fifo)
    for target in (fifo, tmp_path / "link.csv"):
        thread, got = read_fifo(fifo)
        ok(score_ws(in_ws, "-o", target))
        thread.join(30)
        assert got == [reference]
        assert stat.S_ISFIFO(os.stat(fifo).st_mode) and (tmp_path / "link.csv").is_symlink()
    # nothing beside the FIFO or the link, no partial file left
    assert sorted(p.name for p in tmp_path.iterdir()) == [".alcli", "link.csv", "out.fifo"]
    kept = sorted(p.name for p in (tmp_path / ".alcli").iterdir())  # no partial file; the
    assert kept[0] == ".gitignore" and all(k.endswith(".emb.npz") for k in kept[1:])  # embeddings

    # select writes its batch into a FIFO the same way
    table = tmp_path / "t.csv"
    ok(score_ws(in_ws, "-o", table))
    thread, got = read_fifo(fifo)
    ok(invoke("select", table, "-n", "3", "--no-diverse", "-f", "ids", "-o", fifo))
    thread.join(30)
    assert got[0].decode().splitlines() == [r["id"] for r in parse_csv(table.read_text())[:3]]
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)


def test_char_device_is_written_into_not_replaced(in_ws, tmp_path, monkeypatch):
    """A null device made in tmp_path (the real /dev/null is never at stake)."""
    null = tmp_path / "null"
    try:
        os.mknod(null, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    except PermissionError:
        pytest.skip("mknod needs CAP_MKNOD")
    monkeypatch.chdir(tmp_path)
    ok(score_ws(in_ws, "-o", null))
    assert stat.S_ISCHR(os.stat(null).st_mode)
    assert null.read_bytes() == b""
    assert sorted(p.name for p in tmp_path.iterdir()) == [".alcli", "null"]


def test_embeddings_of_a_table_into_a_fifo_are_kept_under_dot_alcli(in_ws, tmp_path, monkeypatch):
    """Nothing can be written beside a FIFO: the embeddings go to ./.alcli/, where `select`
    reading the table from the FIFO's other end finds them by its rows."""
    monkeypatch.chdir(tmp_path)
    fifo = tmp_path / "f"
    os.mkfifo(fifo)
    got = {}
    reader = threading.Thread(target=lambda: got.update(table=fifo.read_text()), daemon=True)
    reader.start()
    ok(score_ws(in_ws, "-o", fifo, "--embeddings", "-s", "entropy"))
    reader.join(timeout=60)
    kept = list((tmp_path / ".alcli").glob("stdout-*.emb.npz"))
    assert len(kept) == 1 and sorted(p.name for p in tmp_path.iterdir()) == [".alcli", "f"]
    picked = ok(invoke("select", "-n", "3", "--diverse", input=got["table"]))
    assert len(parse_csv(picked.stdout)) == 3 and picked.stderr == ""


def test_dev_stdout_is_stdout_even_when_it_is_a_file(in_ws, tmp_path):
    args = [in_ws.tensors, "-m", in_ws.model, "-c", in_ws.config, "-q"]
    log = tmp_path / "log.csv"
    log.write_bytes(b"previous\n")
    cwds = [tmp_path / name for name in "abc"]  # each its own ./.alcli: they run side by side
    for cwd in cwds:
        cwd.mkdir()
    with open(log, "ab") as f:  # `>> log.csv`: appended to, as by `-o -`
        runs = [start(cwds[0], *args, "-o", "-"),
                start(cwds[1], *args, "-o", "/dev/stdout"),  # a pipe
                start(cwds[2], *args, "-o", "/dev/stdout", stdout=f)]
        (rc0, reference, err0), (rc1, out, err1), (rc2, _, err2) = map(finish, runs)
    assert rc0 == rc1 == rc2 == 0, err0 + err1 + err2
    assert out == reference and log.read_bytes() == b"previous\n" + reference
    assert not list(tmp_path.glob("log.csv.*")) and not Path("/dev/stdout.meta.json").exists()


def test_link_to_a_regular_file_is_written_through(in_ws, tmp_path):
    real = tmp_path / "real.csv"
    real.write_text("old\n")
    (tmp_path / "link.csv").symlink_to(real)
    ok(score_ws(in_ws, "-o", tmp_path / "link.csv"))
    assert (tmp_path / "link.csv").is_symlink()
    assert len(parse_csv(real.read_text())) == 14


# --- BAD-8: an output that is an input ------------------------------------------------------------

def test_an_output_that_is_an_input_is_refused(in_ws, tmp_path):
    table = tmp_path / "s.csv"
    ok(score_ws(in_ws, "-o", table))
    before = table.read_bytes()
    manifest = tmp_path / "m.csv"
    manifest.write_text(in_ws.manifest.read_text().replace("pool/", f"{in_ws.pool}/"))
    excl = tmp_path / "labeled.txt"
    excl.write_text("a/img00.png\n")
    (tmp_path / "alias.csv").symlink_to(table)
    cfg = tmp_path / "cfg.yaml"  # score writes the embeddings where the table goes
    cfg.write_text(in_ws.config.read_text() + f"embeddings_file: {tmp_path / 'x.csv'}\n")
    refused = [
        (["select", table, "-n", "5", "-o", table], ["--output", "table read"]),
        (["select", table, "-n", "5", "-o", tmp_path / "alias.csv"], ["alias.csv", "table read"]),
        (["select", table, "-n", "5", "--exclude", excl, "-o", excl], ["exclude input given by option --exclude"]),
        (["select", table, "-n", "5", "--embeddings", tmp_path / "c.emb.npz", "-o", tmp_path / "c"],
         ["would remove", "c.emb.npz", "embeddings file input given by option --embeddings"]),
        (["select", table, "-n", "5", "--contact-sheet", tmp_path / "b.png", "-o",
          tmp_path / "b.png"], ["--contact-sheet", "batch written"]),
        (["score", manifest, "-m", in_ws.model, "-c", in_ws.config, "-o", manifest], ["the pool"]),
        (["score", in_ws.tensors, "-m", in_ws.model, "-c", in_ws.config, "-o", in_ws.model],
         ["the model"]),
        (["score", in_ws.tensors, "-m", in_ws.model, "-c", in_ws.config, "-o", in_ws.config],
         ["the config file"]),
        (["score", in_ws.tensors, "-m", in_ws.model, "-c", cfg, "-o", tmp_path / "x.csv"],
         ["key 'embeddings_file'", "the table written"]),
    ]
    shutil.copy(f"{table}.emb.npz", tmp_path / "c.emb.npz")
    kept = {p: p.read_bytes() for p in (manifest, in_ws.model, in_ws.config, excl, in_ws.tensors,
                                        tmp_path / "c.emb.npz")}
    for args, needles in refused:
        one_sentence(invoke(*args), *needles)
    assert table.read_bytes() == before and not (tmp_path / "b.png").exists()
    assert all(p.read_bytes() == data for p, data in kept.items())


def test_merge_into_one_of_its_parts_is_refused(in_ws, tmp_path):
    parts = [tmp_path / f"p{k}.csv" for k in range(3)]
    for k, part in enumerate(parts):
        ok(score_ws(in_ws, "--shard", f"{k}/3", "-o", part))
    before = parts[0].read_bytes()
    one_sentence(invoke("merge", *parts, "-o", parts[0]), "--output", "p0.csv", "a part")
    assert parts[0].read_bytes() == before
    ok(invoke("merge", *parts, "-o", tmp_path / "m.csv"))


# --- BAD-20 (merge): edited part descriptions -----------------------------------------------------

@pytest.mark.parametrize("edit, needle", [
    ({"shard": "x/3"}, 'shard "x/3"'), ({"shard": "1/2/3"}, 'shard "1/2/3"'),
    ({"shard": 5}, "shard 5"), ({"shard": "3/3"}, 'shard "3/3"'), ({"run": []}, "run []"),
    ({"rows": None}, "rows is missing"), ({"pool_size": None}, "pool_size is missing"),
    ({"rows": "7"}, 'rows is "7"'), ({"skipped": -1}, "skipped is -1"),
])
def test_merge_names_an_edited_part_description(in_ws, tmp_path, edit, needle):
    parts = [tmp_path / f"p{k}.csv" for k in range(2)]
    for k, part in enumerate(parts):
        ok(score_ws(in_ws, "--shard", f"{k}/2", "-o", part))
    meta_path = Path(f"{parts[1]}.meta.json")
    meta = json.loads(meta_path.read_text())
    meta.update(edit)
    meta = {k: v for k, v in meta.items() if v is not None}
    meta_path.write_text(json.dumps(meta))
    one_sentence(invoke("merge", *parts, "-o", tmp_path / "m.csv"), "p1.csv.meta.json", needle)


# --- BAD-7: sidecars go with their table ----------------------------------------------------------

def test_a_new_table_removes_the_sidecars_it_does_not_write(in_ws, tmp_path):
    out = tmp_path / "s.csv"
    ok(score_ws(in_ws, "-o", out))
    meta = json.loads(Path(f"{out}.meta.json").read_text())
    with np.load(f"{out}.emb.npz") as z:
        assert str(z["run_id"]) == meta["run_id"] and len(meta["run_id"]) == 32
    Path(f"{out}.errors.csv").write_text("id,error\nold,gone\n")  # as from an earlier run
    ok(score_ws(in_ws, "-o", out, "--no-embeddings", "-s", "entropy"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.csv", "s.csv.meta.json"]
    assert json.loads(Path(f"{out}.meta.json").read_text())["run_id"] != meta["run_id"]

    # a batch written over a table takes the place of its files too
    ok(score_ws(in_ws, "-o", out))
    ok(invoke("select", out, "-n", "3", "-o", tmp_path / "t.csv"))
    ok(score_ws(in_ws, "-o", tmp_path / "b.csv"))
    ok(invoke("select", out, "-n", "3", "-o", tmp_path / "b.csv"))
    assert not list(tmp_path.glob("b.csv.*"))


def test_select_tells_another_runs_embeddings_from_the_tables_own(in_ws, tmp_path):
    table, other = tmp_path / "s.csv", tmp_path / "o.csv"
    ok(score_ws(in_ws, "-o", table, "-s", "entropy"))
    ok(score_ws(in_ws, "-o", other, "-s", "entropy"))  # same ids, another run
    top = [r["id"] for r in parse_csv(table.read_text())[:4]]
    shutil.copy(f"{other}.emb.npz", f"{table}.emb.npz")

    # by default: a warning naming the file, and the best scores
    result = ok(invoke("select", table, "-n", "4", "-f", "ids"))
    assert result.stdout.splitlines() == top
    assert "without --diverse" in result.stderr and f"{table}.emb.npz" in result.stderr
    assert "another run" in result.stderr
    # asked for: refused
    one_sentence(invoke("select", table, "-n", "4", "--diverse"), "--diverse", "another run")
    one_sentence(invoke("select", table, "-n", "4", "--embeddings", f"{other}.emb.npz"),
                 "--embeddings", "o.csv.emb.npz", "another run")
    # the table's own embeddings again: no warning
    ok(score_ws(in_ws, "-o", table, "-s", "entropy"))
    result = ok(invoke("select", table, "-n", "4", "-f", "ids"))
    assert result.stderr == "" and result.stdout.splitlines() != top


# --- BAD-24: ./.alcli ---------------------------------------------------------------------------

def test_a_link_or_file_named_dot_alcli_is_not_written_through(in_ws, tmp_path, monkeypatch):
    victim, cwd = tmp_path / "victim", tmp_path / "cwd"
    victim.mkdir()
    cwd.mkdir()
    (cwd / ".alcli").symlink_to(victim)
    monkeypatch.chdir(cwd)
    one_sentence(score_ws(in_ws, "-o", "-"), "./.alcli is a link", "-o FILE")
    assert list(victim.iterdir()) == []
    (cwd / ".alcli").unlink()
    (cwd / ".alcli").write_text("mine\n")
    one_sentence(score_ws(in_ws, "-o", "-"), "./.alcli is not a folder")
    assert (cwd / ".alcli").read_text() == "mine\n"


# --- BAD-21: temp files ---------------------------------------------------------------------------

def test_temp_files_of_dead_runs_are_removed_and_live_ones_kept(in_ws, tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True).stdout.strip()
    stale, live = tmp_path / f".s.csv.{dead}.tmp", tmp_path / f".s.csv.{os.getppid()}.tmp"
    stale_meta = tmp_path / f".s.csv.meta.json.{dead}.tmp"
    for p in (stale, live, stale_meta):
        p.write_text("half a table")
    ok(score_ws(in_ws, "-o", tmp_path / "s.csv"))
    assert not stale.exists() and not stale_meta.exists() and live.exists()


def test_sigterm_while_the_table_is_written_leaves_no_temp_file(in_ws, tmp_path):
    """The run's temporary table is planted as a FIFO, so the run blocks opening it: it is caught
    inside the final write, every time."""
    out = tmp_path / "out.csv"
    out.write_text("the old table\n")
    args = [in_ws.tensors, "-m", in_ws.model, "-c", in_ws.config, "-q", "-o", out]
    proc = start(in_ws.root, *args)
    tmp = tmp_path / f".out.csv.{proc.pid}.tmp"
    os.mkfifo(tmp)

    def blocked():
        try:
            wchan = Path(f"/proc/{proc.pid}/wchan").read_text()
            syscall = Path(f"/proc/{proc.pid}/syscall").read_text()
        except OSError:
            return False
        return rows_in(Path(f"{out}.partial")) == 14 and (
            "wait_for_partner" in wchan or syscall.startswith("257 "))
    wait_for(proc, blocked, "the final write")
    proc.send_signal(signal.SIGTERM)
    rc, _, err = finish(proc)
    assert rc == 128 + signal.SIGTERM
    assert err.strip().splitlines() == [f"alcli: stopped by SIGTERM while writing {out}; the "
                                        f"finished rows are in {out}.partial, run the same "
                                        f"command with --resume to continue"]
    assert not tmp.exists() and out.read_text() == "the old table\n"
    ok(invoke("score", *args, "--resume"))
    assert len(parse_csv(out.read_text())) == 14
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.csv", "out.csv.emb.npz", "out.csv.meta.json"]


# --- BAD-2: one writer per output -----------------------------------------------------------------

def test_a_second_run_on_the_same_output_is_refused_naming_the_first(gated):
    (gated / "gate").touch()
    out = gated / "out.csv"
    first = start(gated, "pool.pt", *LINEAR, "-b", "64", "--checkpoint-every", "64", "-o", out,
                  "--no-embeddings")
    piped = start(gated, "pool.pt", *LINEAR, "-b", "64", "-o", "-")  # its partial: ./.alcli
    wait_for(first, lambda: rows_in(Path(f"{out}.partial")) >= 64, "rows in out.csv.partial")
    wait_for(piped, lambda: list(gated.glob(".alcli/*.lock")), "the stdout run's lock")
    held = rows_in(Path(f"{out}.partial"))

    for more in (["--restart"], [], ["--resume"]):
        result = invoke("score", "pool.pt", *LINEAR, "-b", "64", "-o", out, *more)
        one_sentence(result, f"process {first.pid}", str(out))
        assert result.stderr.startswith(f"alcli: error: another alcli run (process {first.pid}) "
                                        f"is writing {out}"), result.stderr
    one_sentence(invoke("score", "pool.pt", *LINEAR, "-b", "64", "-o", "-"),
                 f"process {piped.pid}", "writing the table to stdout")
    assert rows_in(Path(f"{out}.partial")) >= held  # --restart deleted nothing

    (gated / "gate").unlink()
    rc, _, err = finish(first)
    assert rc == 0, err
    rows = parse_csv(out.read_text())
    assert len(rows) == 1000 and [r["rank"] for r in rows] == [str(i) for i in range(1, 1001)]
    rc, piped_out, err = finish(piped)
    assert rc == 0 and piped_out == out.read_bytes(), err
    assert sorted(p.name for p in gated.iterdir() if p.name.startswith("out.csv")) == [
        "out.csv", "out.csv.meta.json"]  # no lock, no partial left
    assert [p.name for p in (gated / ".alcli").iterdir() if "partial" in p.name or "lock" in p.name] == []


def test_kill_9_releases_the_lock_and_resume_gives_the_uninterrupted_table(gated):
    ref = gated / "ref.csv"
    ok(invoke("score", "pool.pt", *LINEAR, "-b", "64", "-o", ref))
    out = gated / "out.csv"
    out.write_text("an earlier table\n")
    Path(f"{out}.emb.npz").write_bytes(b"an earlier run's embeddings")
    (gated / "gate").touch()
    first = start(gated, "pool.pt", *LINEAR, "-b", "64", "--checkpoint-every", "64", "-o", out)
    wait_for(first, lambda: rows_in(Path(f"{out}.partial")) >= 64, "rows in out.csv.partial")
    first.kill()
    first.communicate(timeout=240)
    assert (gated / "out.csv.lock").read_text().strip() == str(first.pid)  # left, but not held
    run_id = json.loads(Path(f"{out}.partial").read_text().splitlines()[0])["run_id"]

    (gated / "gate").unlink()
    ok(invoke("score", "pool.pt", *LINEAR, "-b", "64", "-o", out, "--resume"))
    assert out.read_bytes() == ref.read_bytes()
    assert json.loads(Path(f"{out}.meta.json").read_text())["run_id"] == run_id
    # the earlier table's embeddings were replaced by the resumed run's; no lock, no partial left
    assert sorted(p.name for p in gated.iterdir() if p.name.startswith("out")) == [
        "out.csv", "out.csv.emb.npz", "out.csv.meta.json"]
    assert embeddings_run_id(f"{out}.emb.npz") == run_id


# --- BAD-6: file names of any bytes ---------------------------------------------------------------

ODD = os.fsdecode(b"x\xff.png")   # sorts first: scored in the first batch
BAD = os.fsdecode(b"bad\xfe.png")  # not an image: listed in the errors file


def test_non_utf8_file_names_round_trip_through_kill_resume_and_select(in_ws, tmp_path,
                                                                        monkeypatch):
    (tmp_path / "gated.py").write_text(GATED)
    shutil.copy(in_ws.model, tmp_path / "model.pt")
    pool = tmp_path / "np"
    pool.mkdir()
    images = sorted(in_ws.images)[:6]
    for n, rel in enumerate(images):
        shutil.copy(in_ws.images[rel][0], pool / f"z{n:02d}.png")
    shutil.copy(in_ws.images[images[0]][0], pool / ODD)
    (pool / BAD).write_bytes(b"not an image")
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(in_ws.config.read_text().replace("tinynet:TinyNet", "gated:Tiny"))
    args = ["np", "-m", "model.pt", "-c", cfg, "-s", "margin", "-b", "2", "-q", "--trust-checkpoint"]
    out = tmp_path / "np.csv"

    (tmp_path / "gate").touch()
    first = start(tmp_path, *args, "--checkpoint-every", "2", "-o", out, gate_after=2)
    wait_for(first, lambda: rows_in(Path(f"{out}.partial")) >= 2, "rows in np.csv.partial")
    first.kill()
    first.communicate(timeout=240)
    assert json.dumps(ODD) in Path(f"{out}.partial").read_text()  # escaped: an ASCII line
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("GATE_AFTER", "1000000")
    ok(invoke("score", *args, "-o", tmp_path / "ref.csv"))  # uninterrupted
    ok(invoke("score", *args, "-o", out, "--resume"))
    assert out.read_bytes() == (tmp_path / "ref.csv").read_bytes()

    # the table and errors file hold the names' own bytes; select gives them back unchanged
    assert b"x\xff.png" in [line.split(b",")[1] for line in out.read_bytes().splitlines()]
    assert b"bad\xfe.png," in Path(f"{out}.errors.csv").read_bytes()
    paths = subprocess.run([sys.executable, "-m", "alcli", "select", out, "-n", "7", "-f", "paths",
                            "--no-dedup"],  # x\xff.png is z00.png's copy
                           cwd=tmp_path, env=env(), capture_output=True)
    assert paths.returncode == 0, paths.stderr
    assert b"np/x\xff.png" in paths.stdout.split(b"\n") and len(paths.stdout.split(b"\n")) == 8
    assert (tmp_path / os.fsdecode(b"np/x\xff.png")).is_file()
    # JSONL escapes them (ASCII) and reads back the same; tables piped in too
    jsonl = ok(invoke("score", *args, "-f", "jsonl", "--no-embeddings")).stdout_bytes
    assert b"x\\udcff.png" in jsonl
    for table in (jsonl, out.read_bytes()):
        ids = ok(invoke("select", "-", "-n", "7", "-f", "ids", input=table)).stdout_bytes
        assert b"x\xff.png" in ids.split(b"\n")
