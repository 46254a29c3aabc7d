"""The one Label Studio server the integration tests share: a session-scoped fixture (its start-up
is most of their time) that tests/conftest.py imports. It is no conftest.py of tests/integration:
that module, named `conftest` too, would shadow tests/conftest.py for `from conftest import`.
Label Studio pins its own Django, numpy and pyarrow, so it lives in a virtual environment of its
own: found through ALCLI_LABEL_STUDIO, else PATH; the tests skip without one
(docs/labeling.md: "The round trip, tested"). The first run migrates a database once (about a
minute on two cores) into a template under .pytest_cache; later runs copy it. .ci/run makes it
while alcli installs, with the Label Studio environment's own Python (no pytest there):

    python tests/label_studio_server.py LABEL_STUDIO_EXECUTABLE TEMPLATE_FOLDER

and hands it over in ALCLI_LABEL_STUDIO_TEMPLATE.
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import sys
import urllib.request
from pathlib import Path

TOKEN = "a1c11ab5e1a5700a1c11ab5e1a5700a1c11ab5e1"
USER, PASSWORD = "alcli@example.com", "alcli-round-trip"


def executable() -> str | None:
    return os.environ.get("ALCLI_LABEL_STUDIO") or shutil.which("label-studio")


def log(msg: str) -> None:
    print(f"[labelstudio {time.strftime('%H:%M:%S')}] {msg}", flush=True)


# --- the server ----------------------------------------------------------------------------------

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(data_dir: Path) -> dict:
    return {**os.environ, "LABEL_STUDIO_BASE_DATA_DIR": str(data_dir),
            "LATEST_VERSION_CHECK": "false", "COLLECT_ANALYTICS": "false",
            "DJANGO_DB": "sqlite", "PYTHONPATH": ""}


def _start(exe: str, data_dir: Path, port: int, out: Path) -> subprocess.Popen:
    with open(out, "ab") as f:
        return subprocess.Popen(
            [exe, "start", "--no-browser", "--internal-host", "127.0.0.1", "-p", str(port),
             "--username", USER, "--password", PASSWORD, "--user-token", TOKEN,
             "--enable-legacy-api-token"],
            env=_env(data_dir), stdout=f, stderr=subprocess.STDOUT, start_new_session=True)


def _wait(proc: subprocess.Popen, port: int, limit: float, out: Path) -> None:
    end = time.monotonic() + limit
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise RuntimeError(f"label-studio exited ({proc.returncode}): {out.read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                if r.status == 200:
                    return
        except (OSError, urllib.error.URLError):
            pass
        time.sleep(0.5)
    raise RuntimeError(f"label-studio did not answer within {limit:.0f} s: {out.read_text()[-2000:]}")


def _stop(proc: subprocess.Popen) -> None:
    """The server and the workers it started (its own process group, started here)."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _template(exe: str, cache: Path, out: Path) -> Path:
    """A migrated data folder with the test user, made once per label-studio install (pytest-xdist
    workers wait for the one making it: a lock file); ALCLI_LABEL_STUDIO_TEMPLATE's if made."""
    given = Path(os.environ.get("ALCLI_LABEL_STUDIO_TEMPLATE", "/nonexistent"))
    if (given / "label_studio.sqlite3").is_file():
        return given
    cache.mkdir(parents=True, exist_ok=True)
    done = cache / "template"
    with open(cache / "template.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (done / "label_studio.sqlite3").is_file():
            return done
        work = cache / f"making-{os.getpid()}"
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        t0 = time.monotonic()
        proc = _start(exe, work, _free_port(), out)
        try:
            _wait(proc, int(proc.args[proc.args.index("-p") + 1]), 900, out)
        finally:
            _stop(proc)
        log(f"migrated a template database in {time.monotonic() - t0:.1f} s ({done})")
        shutil.rmtree(done, ignore_errors=True)
        work.rename(done)
        return done


class Server:
    def __init__(self, port: int, exe: str):
        self.base = f"http://127.0.0.1:{port}"
        self.token = TOKEN
        self.python = Path(exe).parent / "python"  # the venv's, for its SDK's validator

    def call(self, method: str, path: str, body=None):
        req = urllib.request.Request(
            self.base + path, method=method,
            data=None if body is None else json.dumps(body).encode(),
            headers={"Authorization": f"Token {TOKEN}", "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=120) as r:
                return json.loads(r.read() or b"null")
        except urllib.error.HTTPError as err:
            raise AssertionError(f"{method} {path}: {err.code} {err.read()[:800]!r}") from None


def _fixture(request, tmp_path_factory):
    import pytest
    exe = executable()
    if not exe:
        pytest.skip("label-studio is not installed (set ALCLI_LABEL_STUDIO to its executable; "
                    "docs/labeling.md: The round trip, tested)")
    key = hashlib.sha1(os.path.realpath(exe).encode()).hexdigest()[:12]
    cache = Path(request.config.cache.mkdir(f"label-studio-{key}")
                 if getattr(request.config, "cache", None) else  # -p no:cacheprovider
                 tmp_path_factory.mktemp(f"label-studio-{key}"))
    root = tmp_path_factory.mktemp("labelstudio")
    out = root / "server.log"
    try:
        template = _template(exe, cache, out)
    except RuntimeError as err:
        pytest.fail(str(err))
    data = root / "data"
    shutil.copytree(template, data)
    port = _free_port()
    t0 = time.monotonic()
    proc = _start(exe, data, port, out)
    try:
        try:
            _wait(proc, port, 300, out)
        except RuntimeError as err:
            pytest.fail(str(err))
        log(f"server up on port {port} in {time.monotonic() - t0:.1f} s")
        yield Server(port, exe)
    finally:
        _stop(proc)


try:
    import pytest
    server = pytest.fixture(scope="session", name="server")(_fixture)
except ImportError:  # run as a script by .ci/run, in Label Studio's environment
    pass


if __name__ == "__main__":
    exe, folder = sys.argv[1], Path(sys.argv[2])
    made = _template(exe, folder, folder.parent / "label-studio-template.log")
    print(made)


