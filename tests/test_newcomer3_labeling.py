"""Issue 49 (a newcomer's first hour, round 3), items 3, 4 and 11, against a small stateful Label
Studio in a thread of the test process (the real server: tests/integration/test_labelstudio_live.py
and test_labelstudio_docs_loop.py):
- item 4: a push without --class-names, of a table whose meta.json names no classes, takes the
  names from the project's labeling config (the control tag's labels in order; after
  torchvision's background where the model outputs one class more than the config offers);
- item 11: an accepted annotation with an empty result is no label (skipped, reason "empty"),
  except for boxes and keypoints, where it says "no objects" (boxes []);
- item 3: after a push, one task's image is fetched (the token only to the server's own origin);
  one that does not open is one warning saying what to configure; --setup with an image root
  under the server's /data/local-files/?d=FOLDER makes the project's Local Files storage.
"""
from __future__ import annotations

import contextlib
import csv
import json
import re
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from typer.testing import CliRunner

from alcli.cli import app

TOKEN = "n3wc0mer-t0ken-never-shown"
ROOT = "/srv/files"  # the fake server's LOCAL_FILES_DOCUMENT_ROOT


class Fake:
    """The few calls push and pull make, kept in memory; `log` holds (method, path, auth)."""

    def __init__(self, serving: bool = True):
        self.serving = serving
        self.projects: dict[int, dict] = {}
        self.tasks: dict[int, dict] = {}
        self.storages: list[dict] = []
        self.log: list[tuple[str, str, str | None]] = []
        self.next = 1

    def new_id(self) -> int:
        self.next += 1
        return self.next

    def handle(self, method: str, path: str, body):
        parts = urllib.parse.urlsplit(path)
        q = {k: v[0] for k, v in urllib.parse.parse_qs(parts.query).items()}
        p = parts.path.rstrip("/")
        if p == "/api/projects" and method == "GET":
            return 200, {"results": [{"id": i, "title": x["title"]} for i, x in self.projects.items()],
                         "next": None}
        if p == "/api/projects" and method == "POST":
            i = self.new_id()
            self.projects[i] = {"id": i, "title": body["title"], "label_config": body["label_config"]}
            return 201, self.projects[i]
        m = re.fullmatch(r"/api/projects/(\d+)", p)
        if m:
            project = self.projects[int(m.group(1))]
            if method == "PATCH":
                project.update(body)
            return 200, project
        m = re.fullmatch(r"/api/projects/(\d+)/import", p)
        if m:
            for t in body:
                i = self.new_id()
                preds = [{**pr, "id": self.new_id()} for pr in t.get("predictions", [])]
                self.tasks[i] = {"id": i, "project": int(m.group(1)), "data": t["data"],
                                 "predictions": preds, "annotations": []}
            return 201, {"task_count": len(body)}
        if p == "/api/tasks":
            ts = [t for t in self.tasks.values() if t["project"] == int(q["project"])]
            return 200, {"tasks": ts if q.get("page") == "1" else [], "total": len(ts)}
        m = re.fullmatch(r"/api/tasks/(\d+)", p)
        if m and method == "PATCH":
            self.tasks[int(m.group(1))]["data"] = body["data"]
            return 200, self.tasks[int(m.group(1))]
        if p == "/api/predictions" and method == "POST":
            self.tasks[body["task"]]["predictions"].append({**body, "id": self.new_id()})
            return 201, {}
        m = re.fullmatch(r"/api/predictions/(\d+)", p)
        if m:
            for t in self.tasks.values():
                for pr in t["predictions"]:
                    if pr["id"] == int(m.group(1)):
                        pr.update(body)
            return 200, {}
        if p == "/api/storages/localfiles" and method == "GET":
            return 200, [s for s in self.storages if s["project"] == int(q["project"])]
        if p == "/api/storages/localfiles/validate":
            return 400, {"validation_errors": {"non_field_errors": [
                f'Absolute local path "/" must be a subdirectory of LOCAL_FILES_DOCUMENT_ROOT='
                f'"{ROOT}" by security reasons.']}}
        if p == "/api/storages/localfiles" and method == "POST":
            if not self.serving:
                return 400, {"validation_errors": {"non_field_errors": [
                    "Serving local files from the host filesystem can be a security risk, so "
                    "LOCAL_FILES_SERVING_ENABLED is disabled by default."]}}
            self.storages.append({**body, "id": self.new_id()})
            return 201, self.storages[-1]
        if p == "/data/local-files":
            folder = ROOT + "/" + q.get("d", "").rsplit("/", 1)[0]
            if self.serving and any(folder.startswith(s["path"]) for s in self.storages):
                return 200, b"\x89PNG" + b"\0" * (1 << 17)  # more than push reads of it
            return 404, {"detail": "Not found"}
        return 404, {"detail": "no"}


@contextlib.contextmanager
def serve(fake: Fake):
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do(self, method):
            size = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(size)) if size else None
            fake.log.append((method, self.path, self.headers.get("Authorization")))
            status, answer = fake.handle(method, self.path, body)
            raw = answer if isinstance(answer, bytes) else json.dumps(answer).encode()
            self.send_response(status)
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

        def do_GET(self):
            self.do("GET")

        def do_POST(self):
            self.do("POST")

        def do_PATCH(self):
            self.do("PATCH")

        def do_DELETE(self):
            self.do("DELETE")

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}"
    finally:
        srv.shutdown()
        srv.server_close()


def run(tmp_path, monkeypatch, *args, code: int = 0):
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, [str(a) for a in args],
                                env={"LABEL_STUDIO_URL": None, "LABEL_STUDIO_API_KEY": TOKEN})
    assert result.exit_code == code, result.output
    assert TOKEN not in result.output
    return result


def predicted(fake: Fake) -> dict[str, list]:
    """alcli id -> the labels of its task's prediction, region by region."""
    out = {}
    for t in fake.tasks.values():
        values = [r["value"] for r in t["predictions"][0]["result"]]
        out[t["data"]["alcli_id"]] = [v.get("choices", v.get("rectanglelabels")) for v in values]
    return out


# --- item 4: round 2's push, without --class-names, keeps its pre-labels ---------------------------

def test_a_push_without_class_names_takes_them_from_the_projects_config(tmp_path, monkeypatch):
    (tmp_path / "digits.txt").write_text("".join(f"{d}\n" for d in range(10)))
    (tmp_path / "s1.csv").write_text("id,score,pred\n2/a.png,0.9,2\n7/b.png,0.8,7\n")
    (tmp_path / "s2.csv").write_text("id,score,pred\n3/c.png,0.9,3\n5/d.png,0.8,5\n")
    (tmp_path / "s2.csv.meta.json").write_text(json.dumps({"class_names": None, "classes": 10}))
    fake = Fake()
    with serve(fake) as url:
        push = ["-p", "digits", "--url", url, "--image-root", url + "/data/local-files/?d=pool"]
        run(tmp_path, monkeypatch, "push", "s1.csv", "--setup", "--class-names", "digits.txt", *push)
        second = run(tmp_path, monkeypatch, "push", "s2.csv", *push)  # the docs' round 2
    assert predicted(fake) == {"2/a.png": [["2"]], "7/b.png": [["7"]], "3/c.png": [["3"]],
                               "5/d.png": [["5"]]}
    assert "no class names are known" not in second.stderr


def test_box_labels_of_a_config_follow_torchvisions_background_where_the_model_says_so(tmp_path, monkeypatch):
    (tmp_path / "names.txt").write_text("background\ncat\ndog\n")
    boxes = '"[[1, 2, 30, 40, 1, 0.9], [5, 5, 20, 20, 2, 0.8]]"'
    row = f"id,score,boxes,width,height\na.png,1.0,{boxes},64,48\n"
    (tmp_path / "s1.csv").write_text(row)
    (tmp_path / "s2.csv").write_text(row.replace("a.png", "b.png"))
    (tmp_path / "s2.csv.meta.json").write_text(json.dumps({"task": "detection", "classes": 3}))
    (tmp_path / "s3.csv").write_text(row.replace("a.png", "c.png"))  # no meta.json: how many?
    fake = Fake()
    with serve(fake) as url:
        push = ["-p", "boxes", "--url", url, "--image-root", "http://127.0.0.1:9/"]
        run(tmp_path, monkeypatch, "push", "s1.csv", "--setup", "--class-names", "names.txt", *push)
        run(tmp_path, monkeypatch, "push", "s2.csv", *push)
        third = run(tmp_path, monkeypatch, "push", "s3.csv", *push)
    got = predicted(fake)
    assert got["a.png"] == got["b.png"] == [["cat"], ["dog"]]  # class 1 is cat, not dog
    assert got["c.png"] == []
    assert "could be the model's classes from 0 or after a background class 0" in third.stderr


# --- item 11: an empty result ---------------------------------------------------------------------

def annotate(fake: Fake, results: dict[str, list]) -> None:
    for t in fake.tasks.values():
        if t["data"]["alcli_id"] in results:
            t["annotations"] = [{"id": fake.new_id(), "result": results[t["data"]["alcli_id"]],
                                 "was_cancelled": False, "updated_at": "2026-12-06T10:00:00Z"}]


def rows(path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_an_empty_annotation_is_skipped_but_an_empty_box_list_is_no_objects(tmp_path, monkeypatch):
    (tmp_path / "names.txt").write_text("cat\ndog\n")
    (tmp_path / "c.csv").write_text("id,score,pred\na.png,0.9,0\nb.png,0.8,1\n")
    (tmp_path / "d.csv").write_text('id,score,boxes,width,height\nx.png,1.0,"[[1, 2, 30, 40, 1, 0.9]]",64,48\n'
                                    'y.png,0.5,"[[1, 2, 30, 40, 0, 0.9]]",64,48\n')
    fake = Fake()
    with serve(fake) as url:
        common = ["--url", url]
        run(tmp_path, monkeypatch, "push", "c.csv", "-p", "cls", "--setup", "--class-names",
            "names.txt", "--image-root", "http://127.0.0.1:9/", *common)
        run(tmp_path, monkeypatch, "push", "d.csv", "-p", "det", "--setup", "--class-names",
            "names.txt", "--image-root", "http://127.0.0.1:9/", *common)
        chosen = [r for t in fake.tasks.values() if t["data"]["alcli_id"] == "a.png"
                  for r in t["predictions"][0]["result"]]
        drawn = [r for t in fake.tasks.values() if t["data"]["alcli_id"] == "y.png"
                 for r in t["predictions"][0]["result"]]
        annotate(fake, {"a.png": chosen, "b.png": [], "x.png": [], "y.png": drawn})
        run(tmp_path, monkeypatch, "pull", "-p", "cls", "-o", "cls.csv", *common)
        run(tmp_path, monkeypatch, "pull", "-p", "det", "-o", "det.csv", "--class-names", "names.txt",
            *common)
    assert rows(tmp_path / "cls.csv") == [{"id": "a.png", "label": "cat"}]
    assert rows(tmp_path / "cls.skipped.csv") == [{"id": "b.png", "reason": "empty"}]
    det = {r["id"]: json.loads(r["boxes"]) for r in rows(tmp_path / "det.csv")}
    assert det["x.png"] == [] and len(det["y.png"]) == 1  # no objects: a label
    assert rows(tmp_path / "det.skipped.csv") == []


# --- item 3: pushed images open, or one warning says what to configure ---------------------------

def push_local_files(tmp_path, monkeypatch, fake, times: int = 1):
    """`push --setup` of two digits to `fake` with an image root under its local files, `times`
    times -> (the server's address, each push's result)."""
    (tmp_path / "digits.txt").write_text("0\n1\n2\n")
    (tmp_path / "s.csv").write_text("id,score,pred\n2/a.png,0.9,2\n1/b.png,0.8,1\n")
    with serve(fake) as url:
        root = url + "/data/local-files/?d=pool"
        return url, [run(tmp_path, monkeypatch, "push", "s.csv", "-p", "digits", "--setup",
                         "--class-names", "digits.txt", "--url", url, "--image-root", root)
                     for _ in range(times)]


def test_a_push_whose_image_does_not_open_says_what_to_configure(tmp_path, monkeypatch):
    fake = Fake(serving=False)
    url, (result,) = push_local_files(tmp_path, monkeypatch, fake)
    warning = [line for line in result.stderr.splitlines() if "does not open" in line]
    assert len(warning) == 1, result.stderr
    assert f"({url}/data/local-files/ for the file pool/2/a.png) does not open (it answered 404" \
        in warning[0]
    assert "LOCAL_FILES_SERVING_ENABLED=true" in warning[0] and "LOCAL_FILES_DOCUMENT_ROOT" in warning[0]
    assert "LOCAL_FILES_SERVING_ENABLED is disabled" in warning[0]  # what the server said of --setup's storage
    image = [e for e in fake.log if e[1].startswith("/data/local-files/")]
    assert len(image) == 1 and image[0][2] == f"Token {TOKEN}"  # its own origin: the session's token
    assert "2 new" in result.stderr  # the push itself went through


def test_setup_makes_the_local_files_storage_and_the_images_open(tmp_path, monkeypatch):
    fake = Fake(serving=True)
    url, (result, again) = push_local_files(tmp_path, monkeypatch, fake, times=2)
    assert [(s["path"], s["use_blob_urls"]) for s in fake.storages] == [(ROOT + "/pool", True)]
    assert "does not open" not in result.stderr + again.stderr


def test_an_image_on_another_host_is_fetched_without_the_token(tmp_path, monkeypatch):
    (tmp_path / "digits.txt").write_text("0\n1\n2\n")
    (tmp_path / "s.csv").write_text("id,score,pred\n2/a.png,0.9,2\n")
    fake, images = Fake(), Fake()
    with serve(fake) as url, serve(images) as elsewhere:
        result = run(tmp_path, monkeypatch, "push", "s.csv", "-p", "digits", "--setup",
                     "--class-names", "digits.txt", "--url", url, "--image-root", elsewhere + "/imgs")
    assert [(m, p) for m, p, _ in images.log] == [("GET", "/imgs/2/a.png")]
    assert images.log[0][2] is None  # never the token to another origin
    assert "does not open (it answered 404" in result.stderr
    assert "pass an --image-root the server and the annotators' browsers can reach" in result.stderr
