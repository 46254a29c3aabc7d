"""A small client of Label Studio's REST API (`alcli push`, `alcli pull`): the few calls they
make, every failure one sentence (unreachable, refused token, missing project, any other answer).

Written on urllib rather than label-studio-sdk: the SDK pulls a large dependency tree and pins
numpy below the version alcli installs, and these are a dozen JSON calls. A personal access token
(a JWT, Label Studio's default since 1.18) is exchanged for a short-lived access token
(/api/token/refresh) sent as `Authorization: Bearer ...`; a legacy token is sent as `Token ...`.
Neither appears in a message, a log line or a file.
"""
from __future__ import annotations

import json
import re
import socket
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass

from ..errors import ConfigError
from .redact import redacted

TIMEOUT_S = 60
REFRESH = "/api/token/refresh"  # a personal access token -> an access token
PAGE = 100  # tasks per page when listing a project's tasks


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
        req = urllib.request.Request(target, method=method, headers=headers,
                                     data=None if body is None else json.dumps(body).encode())
        try:
            with urllib.request.urlopen(req, timeout=TIMEOUT_S) as answer:
                raw = answer.read()
        except urllib.error.HTTPError as err:
            raise self._refused(method, path, err) from None
        except (urllib.error.URLError, OSError) as err:
            reason = getattr(err, "reason", err)
            why = "timed out" if isinstance(reason, (socket.timeout, TimeoutError)) else \
                getattr(reason, "strerror", None) or str(reason)
            raise LabelStudioError(f"cannot reach Label Studio at {self.shown} ({why}); is the "
                                   f"server running, and is --url (or LABEL_STUDIO_URL) its "
                                   f"address?") from None
        try:
            return json.loads(raw) if raw.strip() else None
        except ValueError:
            raise LabelStudioError(f"{self.shown}{path} did not answer JSON; is --url (or "
                                   f"LABEL_STUDIO_URL) the address of a Label Studio server?") from None

    def _authorization(self) -> str:
        """`Token LEGACY`, or `Bearer ACCESS` for a personal access token (a JWT: three base64url
        parts), exchanged once."""
        if re.fullmatch(r"[\w-]+\.[\w-]+\.[\w-]+", self.token):
            access = (self.call("POST", REFRESH, {"refresh": self.token}) or {}).get("access")
            if not access:
                raise LabelStudioError(f"Label Studio at {self.shown} gave no access token for the "
                                       f"personal access token")
            self.auth = f"Bearer {access}"
        else:
            self.auth = f"Token {self.token}"
        return self.auth

    def _refused(self, method: str, path: str, err: urllib.error.HTTPError) -> LabelStudioError:
        if err.code in (401, 403):
            return LabelStudioError(f"Label Studio at {self.shown} refused the token ({err.code}); "
                                    f"pass --token (or LABEL_STUDIO_API_KEY) with the access token "
                                    f"of an account of that server (Account & Settings)")
        try:
            detail = json.loads(err.read() or b"{}")
        except ValueError:
            detail = {}
        said = detail.get("detail") or detail.get("validation_errors") or detail \
            if isinstance(detail, dict) else detail
        said = " ".join(redacted(json.dumps(said, ensure_ascii=False)).split())[:300] if said else ""
        return LabelStudioError(f"Label Studio at {self.shown} answered {method} {path} with "
                                f"{err.code} {err.reason}" + (f": {said}" if said else ""))

    # --- the calls push and pull make ------------------------------------------------------------

    def projects(self) -> list[dict]:
        out, page = [], 1
        while True:
            got = self.call("GET", "/api/projects", query={"page": page, "page_size": PAGE})
            items = got.get("results", []) if isinstance(got, dict) else got or []
            out += items
            if not isinstance(got, dict) or not got.get("next"):
                return out
            page += 1

    def find_project(self, project: str) -> dict | None:
        """The project whose id or title is `project` (a title shared by two is an error)."""
        found = [p for p in self.projects() if str(p.get("id")) == project or p.get("title") == project]
        chosen = [p for p in found if str(p.get("id")) == project] or found
        if len(chosen) > 1:
            raise LabelStudioError(f"Label Studio at {self.shown} has {len(chosen)} projects titled "
                                   f"'{project}'; name it by its id (--project ID)")
        return self.call("GET", f"/api/projects/{chosen[0]['id']}") if chosen else None

    def create_project(self, title: str, config: str) -> dict:
        return self.call("POST", "/api/projects", {"title": title, "label_config": config})

    def set_config(self, project: int, config: str) -> dict:
        return self.call("PATCH", f"/api/projects/{project}", {"label_config": config})

    def tasks(self, project: int) -> list[dict]:
        """Every task of the project with its predictions and annotations."""
        out, page = [], 1
        while True:
            got = self.call("GET", "/api/tasks", query={"project": project, "fields": "all",
                                                        "page": page, "page_size": PAGE})
            items = got.get("tasks", [])
            out += items
            if not items or len(out) >= got.get("total", 0):
                return out
            page += 1

    def import_tasks(self, project: int, tasks: list[dict]) -> dict:
        return self.call("POST", f"/api/projects/{project}/import", tasks,
                         query={"commit_to_project": "true"})

    def update_task(self, task: int, data: dict) -> None:
        self.call("PATCH", f"/api/tasks/{task}", {"data": data})

    def add_prediction(self, task: int, prediction: dict) -> None:
        self.call("POST", "/api/predictions", {"task": task, **prediction})

    def update_prediction(self, prediction: int, fields: dict) -> None:
        self.call("PATCH", f"/api/predictions/{prediction}", fields)


def connect(url: str | None, token: str | None) -> Server:
    """The server from --url/--token (or LABEL_STUDIO_URL / LABEL_STUDIO_API_KEY, read by the
    command); one sentence when either is missing or the URL is not http(s)."""
    if not url:
        raise LabelStudioError("no Label Studio server given; pass --url URL or set LABEL_STUDIO_URL")
    if not token:
        raise LabelStudioError("no Label Studio access token given; pass --token or set "
                               "LABEL_STUDIO_API_KEY (Account & Settings in Label Studio)")
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise LabelStudioError(f"--url {redacted(url)} is not an http(s) address of a Label "
                               f"Studio server (such as http://localhost:8080)")
    return Server(url.rstrip("/"), token)
