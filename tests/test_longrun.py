"""Long runs on real files and real processes: kill -9 and resume, bad examples skipped, pre-flight
checks, NaN scores, micro-batching on out-of-memory, --shard + merge, and torchrun on the CPU.

Tables are compared byte for byte where the batches are the same (resume re-forms the first run's
batches; -b 1 makes every batch one example). Across different batch compositions float32 matrix
products round differently (~1e-7 relative), so there the scores are compared at rel 1e-5.
"""
from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from alcli.cli import app
from alcli.files.embeddings import embeddings_run_id, load_embeddings
from alcli.tasks import TASKS
from conftest import parse_csv
from interrupted import data_lines, start_score, wait_for_rows

runner = CliRunner()


pytestmark = pytest.mark.usefixtures("one_thread")  # tables compared byte for byte


def cli(ws, *args, ok=True, config=True):
    extra = ["-c", str(ws.config)] if config and args[0] in ("score", "select") else []
    result = runner.invoke(app, [*map(str, args), *extra])
    if ok:
        assert result.exit_code == 0, result.stderr + result.stdout
    return result


def env(**more):
    return {**os.environ, "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1", **more}


def one_sentence(result, *needles):
    """Exit 1, one line on stderr naming the culprit, nothing on stdout, no traceback."""
    lines = result.stderr.strip().splitlines()
    where = f"{result.exit_code} {result.stderr!r}"
    assert result.exit_code == 1, where
    assert len(lines) == 1 and lines[0].startswith("alcli: error: "), where
    for needle in needles:
        assert needle in lines[0], where
    assert result.stdout == "" and "Traceback" not in result.stderr


def same_scores(a: list[dict], b: list[dict], rel=1e-5):
    """Same ids in the same order, same predictions, scores equal up to float32 rounding."""
    assert [r["id"] for r in a] == [r["id"] for r in b]
    assert [r["pred"] for r in a] == [r["pred"] for r in b]
    for r, s in zip(a, b):
        for key in ("score", "confidence", "loss"):
            assert float(r[key]) == pytest.approx(float(s[key]), rel=rel, abs=1e-12), (r, s)


# --- kill -9, SIGTERM, resume -------------------------------------------------------------------

def _start(ws, pool, out, *more):
    return start_score(ws.root, pool, "-m", "model.pt", "-c", "config.yaml", "-b", "8", "-o", out,
                       "-q", *more)


def test_sigterm_and_sigkill_then_resume_give_the_uninterrupted_table(in_ws, tmp_path):
    n = 2000  # rows enough to stop each run at a point of its own choosing, twice
    g = torch.Generator().manual_seed(1)
    pool = tmp_path / "big.pt"
    torch.save({"x": torch.randn(n, 3, 6, 6, generator=g),
                "ids": [f"ex{i:05d}" for i in range(n)]}, pool)
    full, out = tmp_path / "full.csv", tmp_path / "resumed.csv"
    partial = tmp_path / "resumed.csv.partial"

    out.write_text("the old table\n")
    first = _start(in_ws, pool, out, "--checkpoint-every", "96")
    wait_for_rows(first, partial, 200)
    first.send_signal(signal.SIGTERM)
    _, err = first.communicate(timeout=60)
    assert first.returncode == 128 + signal.SIGTERM, err
    assert "SIGTERM" in err and "--resume" in err and str(partial) in err
    saved = data_lines(partial)
    assert saved % 8 == 0 and 200 <= saved < n  # whole batches

    # a partial file is never overwritten by accident, nor resumed with other settings
    again = runner.invoke(app, ["score", str(pool), "-m", "model.pt", "-c", "config.yaml", "-b", "8",
                                "-o", str(out)])
    one_sentence(again, str(partial), "--resume")
    other = runner.invoke(app, ["score", str(pool), "-m", "model.pt", "-c", "config.yaml", "-b", "8",
                                "-o", str(out), "--resume", "-s", "entropy"])
    # the first run took the classifier's default (Task.default_strategy)
    one_sentence(other, "strategy", TASKS["classification"].default_strategy, "entropy")

    second = _start(in_ws, pool, out, "--resume", "--checkpoint-every", "40")
    wait_for_rows(second, partial, saved + 300)
    second.kill()  # SIGKILL: no handler runs
    second.communicate(timeout=60)
    assert second.returncode == -signal.SIGKILL
    assert out.read_text() == "the old table\n"  # the table is the old file or the complete new one
    killed_at = data_lines(partial)
    assert saved + 300 <= killed_at < n

    third = _start(in_ws, pool, out, "--resume")
    _, err = third.communicate(timeout=120)
    assert third.returncode == 0, err
    assert f"resuming: {killed_at} examples" in err
    assert not partial.exists()
    cli(in_ws, "score", pool, "-m", "model.pt", "-b", "8", "-o", full, "-q")  # uninterrupted
    assert out.read_bytes() == full.read_bytes()
    rows = parse_csv(out.read_text())
    assert len(rows) == n and rows[0]["rank"] == "1"
    meta = json.loads((tmp_path / "resumed.csv.meta.json").read_text())
    ref_meta = json.loads((tmp_path / "full.csv.meta.json").read_text())
    assert meta == {**ref_meta, "table": "resumed.csv", "run_id": meta["run_id"]}  # ids: per run
    assert meta["rows"] == n and meta["run_id"] != ref_meta["run_id"]


GATE = textwrap.dedent('''
    import time
    from tinynet import TinyNet

    class Net(TinyNet):
        """TinyNet that stops at a batch of 2 (the last of 14 in 4s), saying so in a file."""
        def forward(self, x):
            if x.shape[0] == 2:
                open("reached", "w").close()
                while True:
                    time.sleep(0.01)
            return super().forward(x)
''')


def test_sigterm_writes_the_rows_waiting_for_a_checkpoint(in_ws, tmp_path):
    """The 14 images, and a model that stops at the last batch: the run waits there with 12 rows
    (3 batches) finished but not yet checkpointed; SIGTERM then must write them before the
    process ends. (A FIFO in the pool once made it wait; FIFOs are now error rows, never opened.)"""
    pool = tmp_path / "pool"
    for rel, (path, _) in in_ws.images.items():
        (pool / rel).parent.mkdir(parents=True, exist_ok=True)
        (pool / rel).write_bytes(path.read_bytes())
    (tmp_path / "tinynet.py").write_text((in_ws.lib / "tinynet.py").read_text())
    (tmp_path / "gate.py").write_text(GATE)
    out = tmp_path / "s.csv"
    proc = subprocess.Popen([sys.executable, "-m", "alcli", "score", str(pool), "-m", str(in_ws.model),
                             "-c", str(in_ws.config), "--arch", "gate:Net", "--trust-checkpoint",
                             "-s", "entropy", "-b", "4",
                             "--checkpoint-every", "1000", "-o", str(out)],
                            cwd=tmp_path, env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    deadline = time.monotonic() + 60
    while not (tmp_path / "reached").exists():
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.01)
    time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)  # while the model waits
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert err.strip().splitlines() == [f"alcli: stopped by SIGTERM; the finished rows are in "
                                        f"{out}.partial, run the same command with --resume to continue"]
    lines = Path(f"{out}.partial").read_text().splitlines()
    assert sorted(json.loads(line)["id"] for line in lines[1:]) == sorted(in_ws.images)[:12]
    assert not out.exists()


# --- bad examples -------------------------------------------------------------------------------

def _pool_with_bad_files(ws, root: Path) -> list[str]:
    """The workspace's first 6 images plus 4 entries that are not readable images."""
    good = sorted(ws.images)[:6]
    for rel in good:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(ws.images[rel][0].read_bytes())
    png = ws.images["a/img00.png"][0].read_bytes()
    (root / "corrupt.png").write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(range(200)))
    (root / "truncated.png").write_bytes(png[: len(png) // 2])
    (root / "notes.png").write_text("this is not an image\n")
    (root / "folder.jpg").mkdir()  # a directory entry named like an image
    (root / "readme.txt").write_text("not named like an image: not part of the pool\n")
    return good


def test_unreadable_examples_are_skipped_and_listed(in_ws, tmp_path):
    pool = tmp_path / "pool"
    good = _pool_with_bad_files(in_ws, pool)
    out = tmp_path / "s.csv"
    result = cli(in_ws, "score", pool, "-m", "model.pt", "-o", out, "-q")
    assert sorted(r["id"] for r in parse_csv(out.read_text())) == good
    errors = parse_csv((tmp_path / "s.csv.errors.csv").read_text())
    assert [e["id"] for e in errors] == ["corrupt.png", "folder.jpg", "notes.png", "truncated.png"]
    assert all(e["error"].startswith(f"cannot read image {pool / e['id']}") for e in errors)
    assert "truncated" in errors[3]["error"]
    assert f"skipped 4 unreadable examples (they are listed in {out}.errors.csv)" in result.stderr
    meta = json.loads((tmp_path / "s.csv.meta.json").read_text())
    assert (meta["rows"], meta["skipped"], meta["errors_file"]) == (6, 4, "s.csv.errors.csv")

    piped = cli(in_ws, "score", pool, "-m", "model.pt", "-q")  # no output file: named on stderr
    assert len(parse_csv(piped.stdout)) == 6 and "corrupt.png: cannot read image" in piped.stderr

    strict = cli(in_ws, "score", pool, "-m", "model.pt", "-o", tmp_path / "t.csv", "--strict", ok=False)
    one_sentence(strict, "corrupt.png")
    assert not (tmp_path / "t.csv").exists()

    # a clean run over the same output removes the stale errors file
    clean = tmp_path / "clean"
    for rel in good:
        (clean / rel).parent.mkdir(parents=True, exist_ok=True)
        (clean / rel).write_bytes((pool / rel).read_bytes())
    cli(in_ws, "score", clean, "-m", "model.pt", "-o", out, "-q")
    assert not (tmp_path / "s.csv.errors.csv").exists()


def test_nan_scores_rank_last_with_a_warning(in_ws, tmp_path):
    data = torch.load(in_ws.tensors)
    x = data["x"].clone()
    x[3, 0, 0, 0] = float("nan")
    x[7] = float("inf")
    torch.save({"x": x, "ids": data["ids"]}, tmp_path / "p.pt")
    result = cli(in_ws, "score", tmp_path / "p.pt", "-m", "model.pt", "-q")
    rows = parse_csv(result.stdout)
    nan_ids = sorted([data["ids"][3], data["ids"][7]])
    assert [r["id"] for r in rows[-2:]] == nan_ids and all(r["score"] == "nan" for r in rows[-2:])
    assert all(r["score"] != "nan" for r in rows[:-2])
    assert "warning: 2 examples have a NaN score" in result.stderr


# --- pre-flight checks --------------------------------------------------------------------------

def test_each_preflight_error_is_exit_1_and_one_sentence(in_ws, tmp_path):
    first = in_ws.images["a/img00.png"][0]
    (tmp_path / "empty").mkdir()
    torch.save({"x": torch.zeros(0, 3, 6, 6)}, tmp_path / "none.pt")
    (tmp_path / "dups.csv").write_text(f"id,path\nk,{first}\nj,{first}\nk,{first}\n")
    (tmp_path / "label.csv").write_text(f"path,label\n{first},1\n{first.parent / 'img03.png'},7\n")
    for cls in ("a", "b"):  # two class folders for a 3-class model
        (tmp_path / "two" / cls).mkdir(parents=True)
        (tmp_path / "two" / cls / "x.png").write_bytes(first.read_bytes())
    torch.jit.script(in_ws.net(torch.float32)).save(str(tmp_path / "scripted.pt"))
    (tmp_path / "five.yaml").write_text("arch_kwargs: {num_classes: 5}\nbatch_size: 5\n")
    table = tmp_path / "t.csv"
    cli(in_ws, "score", "pool", "-m", "model.pt", "-o", table, "-q")
    m = ["-m", "model.pt"]
    cases = [
        (["score", tmp_path / "empty", *m], ["empty", "holds no images"]),
        (["score", tmp_path / "none.pt", *m], ["none.pt", "holds no examples"]),
        (["score", tmp_path / "dups.csv", *m], ["dups.csv", "'k' twice"]),
        (["score", tmp_path / "label.csv", *m], ["img03.png", "label 7", "3 classes"]),
        (["score", tmp_path / "two", *m, "--labels-from-folders"], ["2 class folders", "3 classes"]),
        (["score", "pool", "-m", tmp_path / "scripted.pt", "-c", tmp_path / "five.yaml",
          "--trust-checkpoint"],
         ["five.yaml", "num_classes 5", "3 classes"]),
        (["select", table, "-n", "0"], ["--budget", ">= 1"]),
        (["score", "pool", *m, "--shard", "3/3"], ["--shard", "0 <= K < N"]),
        (["score", "pool", *m, "--resume", "--restart"], ["--resume and --restart"]),
        (["score", "pool", *m, "-o", table / "nowhere" / "s.csv"], ["cannot create the folder"]),
    ]
    for args, needles in cases:
        out = tmp_path / "out.csv"
        if args[0] == "score" and "-o" not in args and "--resume" not in args:
            args = [*args, "-o", out]
        if "-c" not in args:
            args = [*args, "-c", in_ws.config]
        result = runner.invoke(app, list(map(str, args)))
        one_sentence(result, *needles)
        assert not out.exists() and not Path(f"{out}.partial").exists(), args  # no work started

    too_many = cli(in_ws, "select", table, "-n", "100")
    assert len(parse_csv(too_many.stdout)) == len(in_ws.images) and "warning" in too_many.stderr


# --- micro-batching on CUDA out-of-memory -------------------------------------------------------

CAPPED = textwrap.dedent('''
    import torch
    from tinynet import TinyNet

    class Capped(TinyNet):
        """TinyNet on a device with room for at most CAP examples at a time."""
        CAP = 2

        def forward(self, x):
            if x.shape[0] > self.CAP:
                raise torch.cuda.OutOfMemoryError(
                    f"CUDA out of memory. Tried to allocate {x.shape[0]} examples")
            return super().forward(x)

    class Full(Capped):
        CAP = 0

    class GradCapped(TinyNet):
        """Room for a no-grad forward of any batch, but for the gradient pass of 2 examples."""

        def forward(self, x):
            if torch.is_grad_enabled() and x.shape[0] > 2:
                raise torch.cuda.OutOfMemoryError(
                    f"CUDA out of memory. Tried to allocate {x.shape[0]} examples")
            return super().forward(x)
''')


def test_out_of_memory_splits_batches_and_keeps_the_scores(in_ws, tmp_path):
    (in_ws.lib / "capped.py").write_text(CAPPED)  # an installed module: no trust needed
    args = ["score", "manifest.csv", "-m", "model.pt", "-s", "gradnorm", "-q"]
    split = cli(in_ws, *args, "--arch", "capped:Capped", "-b", "8")
    assert split.stderr.count("out of memory") == 1, split.stderr
    assert "CUDA out of memory at batch size 8; scoring in micro-batches of at most 4" in split.stderr
    same_batches = cli(in_ws, *args, "-b", "2")  # the plain model, in the batches that fit
    assert split.stdout == same_batches.stdout
    unsplit = cli(in_ws, *args, "-b", "8")
    same_scores(parse_csv(split.stdout), parse_csv(unsplit.stdout))
    nothing_fits = cli(in_ws, *args, "--arch", "capped:Full", "-b", "8", ok=False)
    one_sentence(nothing_fits, "out of memory on a single example")


@pytest.mark.parametrize("method", ["ghost", "auto"])
def test_out_of_memory_inside_the_engine_splits_batches(in_ws, method):
    (in_ws.lib / "capped.py").write_text(CAPPED)  # an installed module: no trust needed
    args = ["score", "manifest.csv", "-m", "model.pt", "-s", "gradnorm", "-q", "--method", method]
    split = cli(in_ws, *args, "--arch", "capped:GradCapped", "-b", "8")
    assert "CUDA out of memory at batch size 8; scoring in micro-batches of at most 4" in split.stderr
    assert split.stdout == cli(in_ws, *args, "-b", "2").stdout


# --- shards and merge ---------------------------------------------------------------------------

def test_three_shards_merged_equal_one_process(in_ws, tmp_path):
    pool = tmp_path / "pool"
    _pool_with_bad_files(in_ws, pool)
    for rel, (path, _) in in_ws.images.items():  # all 14 images, plus the 4 bad entries
        (pool / rel).parent.mkdir(parents=True, exist_ok=True)
        (pool / rel).write_bytes(path.read_bytes())
    common = ["-m", "model.pt", "-s", "gradnorm", "-q"]
    for b in ("1", "5"):
        one = tmp_path / f"one{b}.csv"
        cli(in_ws, "score", pool, *common, "-b", b, "-o", one)
        parts = [tmp_path / f"part{k}-{b}.csv" for k in range(3)]
        for k, part in enumerate(parts):
            cli(in_ws, "score", pool, *common, "-b", b, "--shard", f"{k}/3", "-o", part)
        sizes = [json.loads(Path(f"{p}.meta.json").read_text())["shard_size"] for p in parts]
        assert sum(sizes) == 18 and all(sizes)
        merged = tmp_path / f"merged{b}.csv"
        cli(in_ws, "merge", *reversed(parts), "-o", merged)
        if b == "1":  # the same batches and forwards: the same bytes, the same embeddings
            assert merged.read_bytes() == one.read_bytes()
            ids, a, e = load_embeddings(f"{merged}.emb.npz")
            assert len(ids) == 14 and not Path(f"{merged}.emb.npz.partial").exists()
            _, a_one, e_one = load_embeddings(f"{one}.emb.npz", ids)
            assert torch.equal(a, a_one) and torch.equal(e, e_one)
            run_ids = [json.loads(Path(f"{t}.meta.json").read_text())["run_id"] for t in (merged, one)]
            assert embeddings_run_id(f"{merged}.emb.npz") == run_ids[0] != run_ids[1]
        else:
            same_scores(parse_csv(merged.read_text()), parse_csv(one.read_text()))
        assert Path(f"{merged}.errors.csv").read_text() == Path(f"{one}.errors.csv").read_text()
        meta, one_meta = (json.loads(Path(f"{t}.meta.json").read_text()) for t in (merged, one))
        for key in ("rows", "skipped", "pool_size", "shard", "run"):
            assert meta[key] == one_meta[key]

    # shards follow the ids, not the listing order; the ids relative to tmp_path, so that the
    # shard's members do not hang on the temporary folder's name (an absolute id's hash)
    listing = [str(p.relative_to(tmp_path)) for p in sorted(pool.rglob("*.png"), reverse=True)]
    in_tmp = ["-m", str(in_ws.root / "model.pt"), *common[2:]]
    os.chdir(tmp_path)
    try:
        lst = runner.invoke(app, ["score", "-", *in_tmp, "-c", str(in_ws.config), "--shard", "1/3"],
                            input="\n".join(listing) + "\n")
        fwd = runner.invoke(app, ["score", "-", *in_tmp, "-c", str(in_ws.config), "--shard", "1/3"],
                            input="\n".join(reversed(listing)) + "\n")
    finally:
        os.chdir(in_ws.root)
    ids = sorted(r["id"] for r in parse_csv(lst.stdout))
    assert ids == sorted(r["id"] for r in parse_csv(fwd.stdout)) and 0 < len(ids) < 14

    parts = [tmp_path / f"part{k}-5.csv" for k in range(3)]
    refusals = [
        ([parts[0], parts[2]], ["shard 1/3 is missing"]),
        ([parts[0], parts[1], parts[2], parts[1]], ["both shard 1/3", "overlap"]),
        ([parts[0], parts[1], tmp_path / "one5.csv"], ["one5.csv", "not a shard"]),
    ]
    other = tmp_path / "entropy2.csv"
    cli(in_ws, "score", pool, "-m", "model.pt", "-s", "entropy", "-q", "--shard", "2/3", "-o", other)
    refusals.append(([parts[0], parts[1], other], ["different strategy"]))
    (tmp_path / "bare.csv").write_text(parts[2].read_text())
    refusals.append(([parts[0], parts[1], tmp_path / "bare.csv"], ["bare.csv.meta.json"]))
    cut = tmp_path / "cut.csv"
    cut.write_text("".join(parts[2].read_text().splitlines(keepends=True)[:-1]))
    Path(f"{cut}.meta.json").write_text(Path(f"{parts[2]}.meta.json").read_text())
    refusals.append(([parts[0], parts[1], cut], ["cut.csv", "rows"]))
    for args, needles in refusals:
        one_sentence(runner.invoke(app, ["merge", *map(str, args), "-o", str(tmp_path / "m.csv")]),
                     *needles)


# --- torchrun -----------------------------------------------------------------------------------

def test_torchrun_two_processes_write_the_one_process_table(in_ws, tmp_path):
    pool = tmp_path / "pool"
    _pool_with_bad_files(in_ws, pool)
    for rel, (path, _) in in_ws.images.items():
        (pool / rel).parent.mkdir(parents=True, exist_ok=True)
        (pool / rel).write_bytes(path.read_bytes())
    args = ["score", str(pool), "-m", "model.pt", "-c", "config.yaml", "-s", "egl", "-b", "3", "-q"]
    dist = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           "--nproc-per-node", "2", "-m", "alcli", *args, "-o", str(tmp_path / "tr.csv")],
                          cwd=in_ws.root, env=env(), capture_output=True, text=True, timeout=300)
    assert dist.returncode == 0, dist.stderr
    cli(in_ws, *args, "-o", tmp_path / "one.csv", config=False)  # one process: this one
    same_scores(parse_csv((tmp_path / "tr.csv").read_text()), parse_csv((tmp_path / "one.csv").read_text()))
    assert (tmp_path / "tr.csv.errors.csv").read_text() == (tmp_path / "one.csv.errors.csv").read_text()
    assert dist.stderr.count("skipped 4 unreadable") == 1  # rank 0 speaks for the run
    meta = json.loads((tmp_path / "tr.csv.meta.json").read_text())
    assert (meta["rows"], meta["skipped"], meta["shard"]) == (14, 4, None)
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("tr.csv")) == \
        ["tr.csv", "tr.csv.emb.npz", "tr.csv.errors.csv", "tr.csv.meta.json"]  # partials gone
    ids, a, b = load_embeddings(tmp_path / "tr.csv.emb.npz")  # both ranks' rows' embeddings
    _, a_one, b_one = load_embeddings(tmp_path / "one.csv.emb.npz", ids)
    assert len(ids) == 14 and torch.allclose(a, a_one, atol=1e-5) and torch.allclose(b, b_one, atol=1e-5)


def test_kill_9_at_random_moments_loses_at_most_the_checkpoint_interval(in_ws, tmp_path):
    """--checkpoint-every 1s: whatever the moment of a kill -9, every row the run had finished a
    second before it is in the partial file (give or take the longest pause between progress
    lines: a busy CPU delays batches and their flush alike), and --resume goes on."""
    g = torch.Generator().manual_seed(2)
    pool = tmp_path / "long.pt"
    rows = 100_000  # more than three attempts of at most 3.5 s each can score on a fast CPU
    torch.save({"x": torch.randn(rows, 3, 6, 6, generator=g),
                "ids": [f"ex{i:06d}" for i in range(rows)]}, pool)
    out, partial = tmp_path / "t.csv", tmp_path / "t.csv.partial"
    interval = 1.0
    moments = random.Random(11)
    checked = 0
    for attempt in range(3):
        proc = subprocess.Popen(
            [sys.executable, "-m", "alcli", "score", str(pool), "-m", "model.pt", "-c", "config.yaml",
             "-b", "8", "-o", str(out), "--checkpoint-every", "1s", "--log-format", "json",
             "--progress-every", "0.05", *(["--resume"] if attempt else [])],
            cwd=in_ws.root, env=env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        progress: list[tuple[float, int]] = []  # (when the line arrived, examples done by then)

        def read(stream=proc.stderr):
            for line in stream:
                if line.startswith("{") and json.loads(line)["event"] == "progress":
                    progress.append((time.monotonic(), json.loads(line)["done"]))
        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        deadline = time.monotonic() + 60
        while not progress:
            assert proc.poll() is None and time.monotonic() < deadline, "no progress"
            time.sleep(0.01)
        time.sleep(moments.uniform(1.8, 3.5))
        killed_at = time.monotonic()
        proc.kill()
        proc.wait(timeout=60)
        reader.join(timeout=10)
        saved = data_lines(partial)
        slack = 0.3 + max(b[0] - a[0] for a, b in zip(progress, progress[1:] + [(killed_at, 0)]))
        finished_before = max([done for t, done in progress if t <= killed_at - interval - slack],
                              default=0)
        assert proc.returncode == -signal.SIGKILL and saved < rows
        assert saved >= finished_before, (attempt, saved, finished_before, slack, progress[-3:])
        checked += finished_before > (progress[0][1] if attempt else 0)
    assert checked  # a kill came late enough after a flush was due to tell
