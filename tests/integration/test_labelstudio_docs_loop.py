"""Issue 49: docs/labeling.md's push loop (the block marked `docs-test: yours: a Label Studio
server and its token`), run as written against a real Label Studio for two rounds: the server's address and token are this server's, nothing else of the commands changes. The pool is small (8 images, all
pushed in round 1 under `-n 100`), and two images arrive before round 2, which pushes them as new
tasks and updates the 4 left unlabeled (their ranks changed).

The server here is one of its own (not the shared one of tests/label_studio_server.py): it runs as
the docs tell a reader to run theirs for local files, LOCAL_FILES_SERVING_ENABLED=true with the
pool's folder under LOCAL_FILES_DOCUMENT_ROOT, so `--setup` makes the project's Local Files storage
and the tasks' images open (item 3). Round 2's push, without --class-names, keeps every task's
pre-label (item 4); an accepted annotation with an empty result is pulled as skipped, reason
"empty" (item 11).
"""
from __future__ import annotations

import csv
import os
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

import label_studio_server as lss

pytestmark = pytest.mark.labelstudio
REPO = Path(__file__).resolve().parents[2]
MARKER = "<!-- docs-test: yours: a Label Studio server and its token -->"


def docs_loop() -> list[str]:
    """The block's commands, one per entry (continued lines joined), comments kept."""
    text = (REPO / "docs" / "labeling.md").read_text()
    block = text.split(MARKER, 1)[1].split("```bash\n", 1)[1].split("```", 1)[0]
    return [c.strip() for c in block.replace("\\\n", " ").splitlines() if c.strip()]


@pytest.fixture(scope="module")
def local_files_server(tmp_path_factory):
    """A Label Studio serving local files under a temporary document root (its own process)."""
    exe = lss.executable()
    if not exe:
        pytest.skip("label-studio is not installed (set ALCLI_LABEL_STUDIO to its executable; "
                    "docs/labeling.md: The round trip, tested)")
    root = tmp_path_factory.mktemp("lsdocs")
    out = root / "server.log"
    cache = Path(os.environ.get("ALCLI_LABEL_STUDIO_TEMPLATE", "")) if \
        os.environ.get("ALCLI_LABEL_STUDIO_TEMPLATE") else root / "cache"
    try:
        template = lss._template(exe, cache.parent if cache.name == "template" else cache, out)
    except RuntimeError as err:
        pytest.fail(str(err))
    data, docroot = root / "data", root / "files"
    shutil.copytree(template, data)
    docroot.mkdir()
    port = lss._free_port()
    saved = {k: os.environ.get(k) for k in ("LOCAL_FILES_SERVING_ENABLED", "LOCAL_FILES_DOCUMENT_ROOT")}
    os.environ.update(LOCAL_FILES_SERVING_ENABLED="true", LOCAL_FILES_DOCUMENT_ROOT=str(docroot))
    try:
        proc = lss._start(exe, data, port, out)  # its environment: os.environ's, read now
    finally:
        for k, v in saved.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
    try:
        t0 = time.monotonic()
        try:
            lss._wait(proc, port, 300, out)
        except RuntimeError as err:
            pytest.fail(str(err))
        lss.log(f"local-files server up on port {port} in {time.monotonic() - t0:.1f} s")
        yield lss.Server(port, exe), docroot
    finally:
        lss._stop(proc)


def the_demo_in(folder: Path, images: int) -> None:
    """configs/ and the demo model (`alcli score` with no --model), and `pool`: `images` demo
    images in their class folders."""
    shutil.copytree(REPO / "configs", folder / "configs")
    (folder / "data" / "demo").mkdir(parents=True)
    shutil.copy(REPO / "data" / "demo" / "model.pt", folder / "data" / "demo" / "model.pt")
    for path in sorted((REPO / "data" / "demo" / "pool").rglob("*.png"))[::3][:images]:
        (folder / "pool" / path.parent.name).mkdir(parents=True, exist_ok=True)
        shutil.copy(path, folder / "pool" / path.parent.name / path.name)


def tasks_of(server, title: str) -> tuple[int, list[dict]]:
    project = next(p for p in server.call("GET", "/api/projects?page_size=100")["results"]
                   if p["title"] == title)
    got = server.call("GET", f"/api/tasks?project={project['id']}&fields=all&page_size=1000")
    return project["id"], got["tasks"]


def read_csv(path: Path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_the_docs_push_loop_runs_as_written_for_two_rounds(local_files_server):
    server, work = local_files_server
    t0 = time.monotonic()
    the_demo_in(work, 10)
    arriving = sorted((work / "pool").rglob("*.png"))[-2:]  # new images, before round 2
    later = work / "later"
    for path in arriving:
        (later / path.parent.name).mkdir(parents=True, exist_ok=True)
        path.rename(later / path.parent.name / path.name)
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}

    def sh(command: str) -> subprocess.CompletedProcess:
        """One of the loop's commands in bash, the server's address and token this server's."""
        command = command.replace("http://localhost:8080", server.base) \
            .replace("LABEL_STUDIO_API_KEY=...", f"LABEL_STUDIO_API_KEY={server.token}")
        done = subprocess.run(["bash", "-euo", "pipefail", "-c", prelude + command], cwd=work,
                              env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, f"{command}\n{done.stderr[-3000:]}"
        lss.log(f"{time.monotonic() - t0:.1f} s: {command[:40]}")
        return done

    sh_alcli = shutil.which("alcli", path=env["PATH"])
    assert sh_alcli, "alcli is not on PATH"
    prelude = ""
    # the page's first block makes digits.txt, the README's demo the first scores.csv
    sh("seq 0 9 > digits.txt && alcli score pool -o scores.csv -q")
    loop = docs_loop()
    assert [c.split()[:2] for c in loop] == [["export", "LABEL_STUDIO_URL=http://localhost:8080"],
                                             ["alcli", "push"], ["alcli", "pull"],
                                             ["alcli", "score"], ["alcli", "push"]], loop
    prelude = loop[0].replace("http://localhost:8080", server.base).replace(
        "LABEL_STUDIO_API_KEY=...", f"LABEL_STUDIO_API_KEY={server.token}") + "\n"
    first = sh(loop[1])
    assert "does not open" not in first.stderr, first.stderr  # item 3: the images open
    project, tasks = tasks_of(server, "digits")
    assert len(tasks) == 8 and all(t["predictions"][0]["result"] for t in tasks)
    storages = server.call("GET", f"/api/storages/localfiles?project={project}")
    assert [s["path"] for s in storages] == [str(work / "pool")]
    image = urllib.request.Request(tasks[0]["data"]["image"],
                                   headers={"Authorization": f"Token {server.token}"})
    with urllib.request.urlopen(image, timeout=60) as answer:
        assert answer.status == 200 and answer.read(4) == b"\x89PNG"
    # an annotator: two pre-labels accepted, one submitted empty, one skipped
    by_score = sorted(tasks, key=lambda t: -t["data"]["alcli_score"])
    accepted, empty, skipped = by_score[:2], by_score[2], by_score[3]
    for t in accepted:
        server.call("POST", f"/api/tasks/{t['id']}/annotations", {"result": t["predictions"][0]["result"]})
    server.call("POST", f"/api/tasks/{empty['id']}/annotations", {"result": []})
    server.call("POST", f"/api/tasks/{skipped['id']}/annotations", {"result": [], "was_cancelled": True})
    sh(loop[2])
    labels = {r["id"]: r["label"] for r in read_csv(work / "labels.csv")}
    assert labels == {t["data"]["alcli_id"]: t["predictions"][0]["result"][0]["value"]["choices"][0]
                      for t in accepted}
    assert {r["id"]: r["reason"] for r in read_csv(work / "labels.skipped.csv")} == {
        empty["data"]["alcli_id"]: "empty", skipped["data"]["alcli_id"]: "skipped"}
    shutil.copytree(later, work / "pool", dirs_exist_ok=True)
    sh(loop[3])  # round 2's scores, without the four labeled or skipped
    second = sh(loop[4])
    assert "2 new, 4 updated" in second.stderr and "does not open" not in second.stderr, second.stderr
    _, tasks = tasks_of(server, "digits")
    fresh = [t for t in tasks if not t["annotations"]]
    assert len(tasks) == 10 and len(fresh) == 6
    names = [str(d) for d in range(10)]
    for t in fresh:  # item 4: every task of round 2 carries its pre-label, a class of the config
        result = t["predictions"][0]["result"]
        assert len(t["predictions"]) == 1 and [r["value"]["choices"] for r in result] == \
            [[names[t["data"]["alcli_pred"]]]], t
    lss.log(f"the docs' loop, two rounds: {time.monotonic() - t0:.1f} s")
