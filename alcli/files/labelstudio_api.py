"""A small client of Label Studio's REST API (`alcli push`, `alcli pull`): the few calls they
make, every failure one sentence (unreachable, refused token, missing project, any other answer).
Every request goes through files/http.py, the one door to servers (no cross-origin redirect,
a deadline per call, a cap on an answer's size and depth); an answer's shape is checked here.

Written on urllib rather than label-studio-sdk: the SDK pulls a large dependency tree and pins
numpy below the version alcli installs, and these are a dozen JSON calls. A personal access token
(a JWT, Label Studio's default since 1.18) is exchanged for a short-lived access token
(/api/token/refresh) sent as `Authorization: Bearer ...`; a legacy token is sent as `Token ...`.
Neither appears in a message, a log line or a file.
"""
from __future__ import annotations

import json
import math
import re
import urllib.parse
from dataclasses import dataclass
from typing import Iterator

from ..errors import ConfigError
from . import http
from .redact import redacted

REFRESH = "/api/token/refresh"  # a personal access token -> an access token
PAGE = 100  # tasks per page when listing a project's tasks
MAX_PAGES = 100_000  # 10 million tasks: a listing stops here whatever the server says
IMAGE_WAIT_S = 15.0  # the longest push waits to see that one task's image opens
IMAGE_PEEK = 1 << 16  # an image is read this far: its answer is what is checked


class LabelStudioError(ConfigError):
    """The server cannot be reached, refuses the token, has no such project, or answers an error."""


@dataclass
class Server:
    url: str    # http(s)://host:port, no trailing '/'
    token: str  # never shown
    auth: str = ""  # the Authorization header, once known

    @property
    def shown(self) -> str:
        return redacted(self.url)

    def call(self, method: str, path: str, body=None, query: dict | None = None):
        """One JSON request; the decoded answer (None for an empty one)."""
        target = self.url + path + ("?" + urllib.parse.urlencode(query) if query else "")
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if path != REFRESH:
            headers["Authorization"] = self.auth or self._authorization()
        try:
            answer = http.request(method, target, headers,
                                  None if body is None else json.dumps(body).encode())
            return http.decode_json(answer.body)
        except http.HttpError as err:
            raise self._failed(method, path, err) from None

    def _failed(self, method: str, path: str, err: http.HttpError) -> LabelStudioError:
        if err.kind == "unreachable":
            return LabelStudioError(f"cannot reach Label Studio at {self.shown} ({err.why}); is the "
                                    f"server running, and is --url (or LABEL_STUDIO_URL) its "
                                    f"address?")
        if err.kind == "status":
            return self._refused(method, path, err)
        if err.kind == "not-json":
            return LabelStudioError(f"Label Studio at {self.shown} {err.why} to {method} {path}; is "
                                    f"--url (or LABEL_STUDIO_URL) the address of a Label Studio "
                                    f"server?")
        return LabelStudioError(f"Label Studio at {self.shown} {err.why} ({method} {path})")

    def _authorization(self) -> str:
        """`Token LEGACY`, or `Bearer ACCESS` for a personal access token (a JWT: three base64url
        parts), exchanged once."""
        if re.fullmatch(r"[\w-]+\.[\w-]+\.[\w-]+", self.token):
            got = self.call("POST", REFRESH, {"refresh": self.token})
            access = got.get("access") if isinstance(got, dict) else None
            if not isinstance(access, str) or not _printable(access):
                raise LabelStudioError(f"Label Studio at {self.shown} gave no access token for the "
                                       f"personal access token")
            self.auth = f"Bearer {access}"
        else:
            self.auth = f"Token {self.token}"
        return self.auth

    def _refused(self, method: str, path: str, err: http.HttpError) -> LabelStudioError:
        if err.status in (401, 403):
            return LabelStudioError(f"Label Studio at {self.shown} refused the token ({err.status}); "
                                    f"pass --token (or LABEL_STUDIO_API_KEY) with the access token "
                                    f"of an account of that server (Account & Settings)")
        try:
            detail = http.decode_json(err.body) or {}
        except http.HttpError:
            detail = {}
        said = detail.get("detail") or detail.get("validation_errors") or detail \
            if isinstance(detail, dict) else detail
        said = " ".join(redacted(json.dumps(said, ensure_ascii=False)).split())[:300] if said else ""
        return LabelStudioError(f"Label Studio at {self.shown} answered {method} {path} with "
                                f"{err.why}" + (f": {said}" if said else ""))

    # --- the calls push and pull make ------------------------------------------------------------

    def projects(self) -> list[dict]:
        out, seen = [], set()
        for page in range(1, MAX_PAGES + 1):
            got = self.call("GET", "/api/projects", query={"page": page, "page_size": PAGE})
            items = got.get("results") if isinstance(got, dict) else got
            items = self._objects(items or [], "GET /api/projects", "a list of projects")
            new = [p for p in items if _key(p.get("id")) not in seen]
            seen.update(_key(p.get("id")) for p in new)
            out += new
            if not isinstance(got, dict) or not got.get("next") or not new:
                return out
        return out

    def find_project(self, project: str) -> dict | None:
        """The project whose id or title is `project` (a title shared by two is an error)."""
        found = [p for p in self.projects() if str(p.get("id")) == project or p.get("title") == project]
        chosen = [p for p in found if str(p.get("id")) == project] or found
        if len(chosen) > 1:
            raise LabelStudioError(f"Label Studio at {self.shown} has {len(chosen)} projects titled "
                                   f"'{project}'; name it by its id (--project ID)")
        if not chosen:
            return None
        if not isinstance(chosen[0].get("id"), int) or isinstance(chosen[0].get("id"), bool):
            raise self._malformed("GET /api/projects", "a list of projects with numeric ids")
        got = self.call("GET", f"/api/projects/{chosen[0]['id']}")
        if not isinstance(got, dict) or not isinstance(got.get("label_config") or "", str) \
                or not isinstance(got.get("id"), int):
            raise self._malformed(f"GET /api/projects/{chosen[0]['id']}",
                                  "a project with an id and a labeling config")
        return got

    def create_project(self, title: str, config: str) -> dict:
        return self._project(self.call("POST", "/api/projects", {"title": title, "label_config": config}),
                             "POST /api/projects")

    def set_config(self, project: int, config: str) -> dict:
        return self._project(self.call("PATCH", f"/api/projects/{project}", {"label_config": config}),
                             f"PATCH /api/projects/{project}")

    def _project(self, got, where: str) -> dict:
        if not isinstance(got, dict) or not isinstance(got.get("id"), int) \
                or not isinstance(got.get("label_config") or "", str):
            raise self._malformed(where, "a project with an id and a labeling config")
        return got

    def tasks(self, project: int) -> Iterator[dict]:
        """Every task of the project with its predictions and annotations, page by page. The
        listing ends at an empty page, a page that adds no new task id, or the pages the first
        page's `total` allows (at most MAX_PAGES)."""
        seen: set = set()
        pages = MAX_PAGES
        for page in range(1, MAX_PAGES + 1):
            if page > pages:
                return
            got = self.call("GET", "/api/tasks", query={"project": project, "fields": "all",
                                                        "page": page, "page_size": PAGE})
            where = "GET /api/tasks"
            if not isinstance(got, dict):
                raise self._malformed(where, "an object with the tasks")
            items = self._objects(got.get("tasks") or [], where, "a list of tasks")
            if page == 1:
                total = got.get("total", 0)
                if not isinstance(total, int) or isinstance(total, bool) or total < 0:
                    raise self._malformed(where, "a count of tasks in 'total'")
                pages = min(MAX_PAGES, max(1, math.ceil(total / PAGE)))
            new = []
            for t in items:
                if _key(t.get("id")) in seen:
                    continue
                _check_task(t, lambda what: self._malformed(where, what))
                seen.add(_key(t.get("id")))
                new.append(t)
            yield from new
            if not new:
                return

    def _objects(self, items, where: str, what: str) -> list[dict]:
        if not isinstance(items, list) or not all(isinstance(i, dict) for i in items):
            raise self._malformed(where, what)
        return items

    def _malformed(self, where: str, what: str) -> LabelStudioError:
        return LabelStudioError(f"Label Studio at {self.shown} answered {where} with JSON that is "
                                f"not {what}; is --url (or LABEL_STUDIO_URL) the address of a "
                                f"Label Studio server?")

    def import_tasks(self, project: int, tasks: list[dict]) -> dict:
        return self.call("POST", f"/api/projects/{project}/import", tasks,
                         query={"commit_to_project": "true"})

    def update_task(self, task: int, data: dict) -> None:
        self.call("PATCH", f"/api/tasks/{task}", {"data": data})

    def delete_task(self, task: int) -> None:
        self.call("DELETE", f"/api/tasks/{task}")

    def add_prediction(self, task: int, prediction: dict) -> None:
        self.call("POST", "/api/predictions", {"task": task, **prediction})

    def update_prediction(self, prediction: int, fields: dict) -> None:
        self.call("PATCH", f"/api/predictions/{prediction}", fields)

    # --- images: does one open, and a Local Files storage for a folder -----------------------------

    def opens(self, url: str, wait_s: float = IMAGE_WAIT_S) -> str | None:
        """Does `url` (a task's image) answer 2xx? None when it does, else why not in a few words.
        The Authorization header goes with it only where the URL is on this server's own origin
        (as the browser of a logged-in annotator sends its session); a URL elsewhere gets no
        credentials. The answer is read no further than its first bytes, and the check waits
        `wait_s` at most."""
        headers = {"Accept": "*/*"}
        if http.origin(url) == http.origin(self.url):
            headers["Authorization"] = self.auth or self._authorization()
        try:
            http.request("GET", url, headers, limit=IMAGE_PEEK, deadline=wait_s)
            return None
        except http.HttpError as err:
            if err.kind == "too-large":  # it answered 2xx: enough
                return None
            if err.kind == "deadline" or err.why == "timed out":
                return f"no answer within {wait_s:.0f} s"
            return f"it answered {err.why}" if err.kind == "status" else err.why
        except Exception as err:  # noqa: BLE001 - a check, never the push's failure
            return type(err).__name__

    def _answer(self, method: str, path: str, body=None) -> tuple[int, object]:
        """A JSON request whose refusal (4xx) is an answer too: (status, the decoded body)."""
        headers = {"Content-Type": "application/json", "Accept": "application/json",
                   "Authorization": self.auth or self._authorization()}
        try:
            got = http.request(method, self.url + path, headers, json.dumps(body).encode())
            return got.status, http.decode_json(got.body)
        except http.HttpError as err:
            if err.kind != "status" or not 400 <= err.status < 500 or err.status in (401, 403):
                raise self._failed(method, path, err) from None
            try:
                return err.status, http.decode_json(err.body)
            except http.HttpError:
                return err.status, None

    def local_storages(self, project: int) -> list[dict]:
        got = self.call("GET", "/api/storages/localfiles", query={"project": project})
        items = got.get("results") if isinstance(got, dict) else got
        return self._objects(items or [], "GET /api/storages/localfiles", "a list of storages")

    def document_root(self, project: int) -> tuple[str | None, str]:
        """The server's LOCAL_FILES_DOCUMENT_ROOT, as its check of a storage path names it
        (Label Studio tells no other way), and what it said: (root or None, its words)."""
        status, said = self._answer("POST", "/api/storages/localfiles/validate",
                                    {"project": project, "path": "/", "use_blob_urls": True})
        text = _words(said)
        found = re.search(r'LOCAL_FILES_DOCUMENT_ROOT="([^"]*)"', text)
        return (found.group(1) if found else None), text

    def add_local_storage(self, project: int, path: str, title: str) -> str | None:
        """A Local Files import storage of the project for the server's folder `path` (tasks'
        images under /data/local-files/?d=... then open); None when made, else the server's
        words."""
        status, said = self._answer("POST", "/api/storages/localfiles",
                                    {"project": project, "path": path, "use_blob_urls": True,
                                     "title": title})
        return None if status < 300 else (_words(said) or f"status {status}")


def _words(said) -> str:
    """A server's JSON answer as plain words (its strings joined; of Label Studio's error
    object, its validation errors, else its detail), tokens redacted, one line."""
    if isinstance(said, dict) and (said.get("validation_errors") or said.get("detail")):
        said = said.get("validation_errors") or said.get("detail")
    if isinstance(said, dict):
        said = " ".join(_words(v) for v in said.values())
    elif isinstance(said, list):
        said = " ".join(_words(v) for v in said)
    return " ".join(redacted(str(said if said is not None else "")).split())


def _key(value) -> str:
    """A task's or project's id as a hashable key (ids from a server may be of any JSON type)."""
    return json.dumps(value, sort_keys=True)


def _check_task(task: dict, malformed) -> None:
    """The shape push and pull read of a task: an id, `data` an object, `annotations` and
    `predictions` lists of objects, each annotation's `result` a list of objects."""
    if not isinstance(task.get("id"), (int, str)) or isinstance(task.get("id"), bool):
        raise malformed("a list of tasks with ids")
    if not isinstance(task.get("data", {}), dict):
        raise malformed(f"a task whose data is an object (task {task['id']})")
    for key in ("annotations", "predictions"):
        given = task.get(key) or []
        if not isinstance(given, list) or not all(isinstance(a, dict) for a in given):
            raise malformed(f"a task whose {key} are a list of objects (task {task['id']})")
    for a in task.get("annotations") or []:
        result = a.get("result") or []
        if not isinstance(result, list) or not all(isinstance(r, dict) for r in result):
            raise malformed(f"an annotation whose result is a list of regions (task {task['id']})")


def _printable(text: str) -> bool:
    return bool(text) and all(" " < ch <= "~" for ch in text)


def connect(url: str | None, token: str | None) -> Server:
    """The server from --url/--token (or LABEL_STUDIO_URL / LABEL_STUDIO_API_KEY, read by the
    command); one sentence when either is missing or malformed: the URL an http(s) address with no
    user, query or fragment, the token printable ASCII (surrounding whitespace, such as a CRLF
    file's CR, stripped). The token is never quoted."""
    if not url:
        raise LabelStudioError("no Label Studio server given; pass --url URL or set LABEL_STUDIO_URL")
    token = (token or "").strip()
    if not token:
        raise LabelStudioError("no Label Studio access token given; pass --token or set "
                               "LABEL_STUDIO_API_KEY (Account & Settings in Label Studio)")
    if not _printable(token):
        raise LabelStudioError("the Label Studio access token (--token or LABEL_STUDIO_API_KEY) "
                               "holds a space, a line break or a character that is not printable "
                               "ASCII; copy it again from Account & Settings")
    try:
        parts = urllib.parse.urlsplit(url)
        parts.port  # noqa: B018 - a port that is no number raises here
    except ValueError:
        parts = None
    if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
        raise LabelStudioError(f"--url {redacted(url)} is not an http(s) address of a Label "
                               f"Studio server (such as http://localhost:8080)")
    if "@" in parts.netloc or parts.query or parts.fragment or "?" in url or "#" in url:
        raise LabelStudioError(f"--url {redacted(url)} holds a user name, a query or a fragment; "
                               f"give the server's address alone (such as http://localhost:8080) "
                               f"and its token with --token")
    if any(not " " < ch <= "~" for ch in url):
        raise LabelStudioError(f"--url {redacted(url)} holds a space or a character that is not "
                               f"printable ASCII")
    return Server(url.rstrip("/"), token)
