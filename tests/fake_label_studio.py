"""A hostile Label Studio on 127.0.0.1, in a thread of the test process: the modes of
shared/hostile-inputs-3.md's fake_ls.py (round 3), each answering the few calls push and pull
make the way an attacker would. `serve(mode, arg)` gives (url, log): log lists each request's
path and Authorization header."""
from __future__ import annotations

import contextlib
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np

from alcli.tasks.shared.labelstudio import mask_to_rle

CHOICES = ('<View><Image name="image" value="$image"/><Choices name="label" toName="image">'
           '<Choice value="cat"/><Choice value="dog"/></Choices></View>')
BRUSH = ('<View><Image name="image" value="$image"/><BrushLabels name="label" toName="image">'
         + "".join(f'<Label value="c{i}"/>' for i in range(300)) + '</BrushLabels></View>')
RECT = ('<View><Image name="image" value="$image"/><RectangleLabels name="label" toName="image">'
        '<Label value="cat"/><Label value="dog"/></RectangleLabels></View>')
CHOICE_IDS = ["a.png", "=HYPERLINK(\"http://x\")", "b\x00c.png", "l1\nl2.png"]


def brush(h, w, label, on):
    return {"from_name": "label", "to_name": "image", "type": "brushlabels", "original_width": w,
            "original_height": h,
            "value": {"format": "rle", "rle": mask_to_rle(np.full((h, w), on, bool)),
                      "brushlabels": [label]}}


def task(i, id_, result):
    return {"id": i, "data": {"alcli_id": id_},
            "annotations": [{"id": i, "result": result, "was_cancelled": False}]}


def _box(label, x=10):
    return {"from_name": "label", "to_name": "image", "type": "rectanglelabels",
            "original_width": 100, "original_height": 50,
            "value": {"x": x, "y": 10, "width": 20, "height": 20, "rectanglelabels": [label]}}


def tasks(mode, arg):
    if mode == "brush":  # arg: JSON list of ids; even ones painted c1, odd ones left unpainted
        return [task(i + 1, s, [brush(4, 4, "c1", i % 2 == 0)]) for i, s in enumerate(json.loads(arg))]
    if mode == "brushclass":  # arg: the class painted over the whole 4x4 image
        return [task(1, "a.png", [brush(4, 4, arg, True)])]
    if mode == "brushsize":  # arg: the size the region claims (its code holds 1 pixel)
        r = brush(1, 1, "c1", True)
        r["original_width"] = r["original_height"] = int(arg)
        return [task(1, "a.png", [r])]
    if mode == "brushmix":
        return [task(1, "a.png", [brush(4, 4, "c1", True), brush(8, 8, "c2", True)])]
    if mode == "rect":  # arg: the label of task 2's box ("nan": a box at NaN)
        second = _box("cat", float("nan")) if arg == "nan" else _box(arg)
        return [task(1, "a.png", [_box("cat")]), task(2, "b.png", [second])]
    return [task(i + 1, s, [{"from_name": "label", "to_name": "image", "type": "choices",
                             "value": {"choices": ["cat"]}}]) for i, s in enumerate(CHOICE_IDS)]


def handler(mode, arg, log):
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def answer(self, raw, code=200, extra=()):
            self.send_response(code)
            for k, v in extra:
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

        def do_GET(self):
            p = self.path
            log.append({"path": p, "auth": self.headers.get("Authorization")})
            if mode == "redirect":  # arg: where to send the client
                return self.answer(b"", 302, [("Location", arg + p)])
            if mode == "deep" and p.startswith("/api/projects?"):
                return self.answer(b"[" * 100000 + b"]" * 100000)
            if mode == "types" and p.startswith("/api/projects?"):
                return self.answer(b'{"results": "abc", "next": null}')
            if mode == "drip" and p.startswith("/api/projects?"):
                self.send_response(200)
                self.end_headers()
                for ch in b'{"results": [], "next": null}':
                    self.wfile.write(bytes([ch]))
                    self.wfile.flush()
                    time.sleep(float(arg or 5))
                return
            if mode == "big" and p.startswith("/api/projects?"):  # an endless answer
                self.send_response(200)
                self.end_headers()
                with contextlib.suppress(OSError):
                    while True:
                        self.wfile.write(b" " * (1 << 20))
                return
            if p.startswith("/api/projects?"):
                return self.answer(json.dumps({"results": [{"id": 1, "title": "P"}],
                                               "next": None}).encode())
            if p.startswith("/api/projects/1"):
                cfg = BRUSH if mode.startswith("brush") else RECT if mode == "rect" else CHOICES
                return self.answer(json.dumps({"id": 1, "title": "P", "label_config": cfg}).encode())
            if p.startswith("/api/tasks?"):
                page = int(p.split("page=")[1].split("&")[0])
                if mode == "pages":  # every page full, the total never reached
                    return self.answer(json.dumps({"tasks": [task(i, "x" * 20000 + str(i), [])
                                                             for i in range(100)],
                                                   "total": 10 ** 12}).encode())
                if mode == "newpages":  # every page new ids, the total never reached
                    return self.answer(json.dumps({"tasks": [task(page * 100 + i, f"p{page}-{i}", [])
                                                             for i in range(100)],
                                                   "total": 10 ** 12}).encode())
                ts = tasks(mode, arg)
                return self.answer(json.dumps({"tasks": ts if page == 1 else [],
                                               "total": len(ts)}).encode())
            self.answer(b'{"detail": "no"}', 404)
    return Handler


class QuietServer(ThreadingHTTPServer):
    """A client hanging up on a hostile answer (the deadline, the size cap) is expected: no
    traceback from the server's thread, which would land in whatever a later test captures."""

    def handle_error(self, request, client_address):
        pass


@contextlib.contextmanager
def serve(mode: str, arg: str = ""):
    log: list[dict] = []
    srv = QuietServer(("127.0.0.1", 0), handler(mode, arg, log))
    srv.daemon_threads = True
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}", log
    finally:
        srv.shutdown()
        srv.server_close()
