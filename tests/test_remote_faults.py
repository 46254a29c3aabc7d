"""Object stores that fail in time or leave files behind (issue 37, items 8 and 10): an http(s)
server that accepts and never answers is one sentence after alcli.files.remote.HTTP_TIMEOUT
(lowered here), and the temporary copy of a remote checkpoint a kill -9 leaves is removed by the
next run that loads a model."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from alcli.cli import app
from alcli.files import remote
from cli_errors import assert_one_error
from object_store import store, upload  # noqa: F401 - `store` is a fixture

pytest.importorskip("aiohttp")
runner = CliRunner()


@pytest.fixture
def silent_server():
    """A localhost port whose connections the kernel accepts and nobody ever answers."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(64)
        yield s.getsockname()[1]


def test_a_server_that_never_answers_is_one_sentence_naming_the_url(in_ws, silent_server,
                                                                    monkeypatch):
    monkeypatch.setattr(remote, "HTTP_TIMEOUT", 1.0)
    url = f"http://user:pw@127.0.0.1:{silent_server}/models/model.pt"
    started = time.monotonic()
    result = runner.invoke(app, ["score", "pool", "--labels-from-folders", "-c", "config.yaml",
                                 "-m", url, "-o", "-"])
    assert time.monotonic() - started < 60
    shown = f"http://127.0.0.1:{silent_server}/models/model.pt"
    assert_one_error(result, f"model {shown}: the server did not answer within 1 seconds", url)
    table = f"http://127.0.0.1:{silent_server}/pool.parquet?sig=abcd"
    result = runner.invoke(app, ["score", table, "-c", "config.yaml", "-m", "model.pt", "-o", "-"])
    assert_one_error(result, f"http://127.0.0.1:{silent_server}/pool.parquet: the server did not "
                             f"answer within 1 seconds", table)


def copies(tmp: Path) -> list[Path]:
    return sorted(tmp.glob("alcli-model-*"))


def test_a_copy_left_by_kill_9_is_removed_by_the_next_run(in_ws, tmp_path, store):
    upload(store, in_ws.model, "k/model.pt")
    model = store.generate_presigned_url("get_object", {"Bucket": "pools", "Key": "k/model.pt"})
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {**os.environ, "TMPDIR": str(tmp), "PYTHONWARNINGS": "ignore"}
    # the pool is read from stdin, after the model is copied: the run waits there until killed
    args = [sys.executable, "-m", "alcli", "score", "-", "-c", "config.yaml", "-m", model,
            "-o", str(tmp_path / "out.csv")]
    run = subprocess.Popen(args, cwd=in_ws.root, env=env, stdin=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not any(p.name == "model.pt" and p.stat().st_size == in_ws.model.stat().st_size
                  for c in copies(tmp) for p in c.iterdir()):
        assert run.poll() is None, run.communicate()
        assert time.monotonic() < deadline, "the model was never copied"
        time.sleep(0.05)
    time.sleep(0.5)
    os.kill(run.pid, signal.SIGKILL)
    run.communicate(timeout=60)
    left = copies(tmp)
    assert len(left) == 1 and left[0].name.startswith(f"alcli-model-{run.pid}-")
    other = tmp / "alcli-model-1-alive"  # a live process's copy (pid 1) stays
    other.mkdir()
    images = "\n".join(str(p) for p, _ in in_ws.images.values())
    local = [a if a != model else "model.pt" for a in args]  # any later run, of any model
    done = subprocess.run(local, cwd=in_ws.root, env=env, input=images, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert copies(tmp) == [other]  # the killed run's copy swept
