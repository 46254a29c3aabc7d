"""The one door to the HTTP servers alcli talks to with its own client (Label Studio's REST API).

Each call: a redirect is followed only within the same scheme, host and port, so credentials
never reach another origin (one sentence names where the server pointed); the whole call has a
deadline (DEADLINE_S, enforced while reading, besides READ_TIMEOUT_S per read); an answer is read
up to MAX_ANSWER_BYTES; a JSON answer is decoded with its depth bounded (MAX_DEPTH). Every failure
is an HttpError, whose sentence says what went wrong at which endpoint (never a header's value).
"""
from __future__ import annotations

import json
import re
import socket
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass

READ_TIMEOUT_S = 60.0   # the longest a server may take to accept or send the next bytes
DEADLINE_S = 120.0      # the longest one call may take, all of it
MAX_ANSWER_BYTES = 64 << 20  # 64 MiB: a page of 100 tasks with their brushes is far less
MAX_DEPTH = 64          # the deepest nesting of a JSON answer
MAX_REDIRECTS = 5
CHUNK = 1 << 16


class HttpError(Exception):
    """A call that did not give an answer: `kind` is "unreachable", "redirect", "status",
    "too-large", "deadline" or "not-json"; `status` and `body` for "status"."""

    def __init__(self, kind: str, why: str, status: int = 0, body: bytes = b""):
        super().__init__(why)
        self.kind, self.why, self.status, self.body = kind, why, status, body


@dataclass
class Answer:
    status: int
    body: bytes


def origin(url: str) -> tuple[str, str, int | None]:
    parts = urllib.parse.urlsplit(url)
    port = parts.port or {"http": 80, "https": 443}.get(parts.scheme)
    return parts.scheme, (parts.hostname or "").lower(), port


class _SameOrigin(urllib.request.HTTPRedirectHandler):
    """Follows a redirect only to the origin of the first request."""
    max_redirections = MAX_REDIRECTS

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        target = urllib.parse.urljoin(req.full_url, newurl)
        if origin(target) != origin(req.full_url):
            raise HttpError("redirect", f"redirects to {_origin_text(target)}, another server; "
                                        f"alcli does not send its token there")
        return super().redirect_request(req, fp, code, msg, headers, target)


def _origin_text(url: str) -> str:
    scheme, host, port = origin(url)
    return f"{scheme}://{host}" + (f":{port}" if port else "")


_OPENER = urllib.request.build_opener(_SameOrigin)


def request(method: str, url: str, headers: dict[str, str], body: bytes | None = None,
            limit: int | None = None, deadline: float | None = None) -> Answer:
    """One call through the door; HttpError for anything but a 2xx answer read whole within
    `deadline` seconds (DEADLINE_S) and `limit` bytes (MAX_ANSWER_BYTES)."""
    limit = MAX_ANSWER_BYTES if limit is None else limit
    deadline = DEADLINE_S if deadline is None else deadline
    ends = time.monotonic() + deadline
    req = urllib.request.Request(url, data=body, method=method, headers=headers)
    try:
        with _OPENER.open(req, timeout=min(READ_TIMEOUT_S, deadline)) as answer:
            return Answer(answer.status, _read(answer, ends, deadline, limit))
    except HttpError:
        raise
    except urllib.error.HTTPError as err:
        with err:
            try:
                said = _read(err, ends, deadline, 1 << 16) if err.fp is not None else b""
            except HttpError:
                said = b""
        if 300 <= err.code < 400:
            raise HttpError("redirect", f"redirects more than {MAX_REDIRECTS} times, or in a "
                                        f"loop") from None
        reason = " ".join(str(err.reason).split())[:100]
        raise HttpError("status", f"{err.code} {reason}", err.code, said) from None
    except (urllib.error.URLError, OSError) as err:
        reason = getattr(err, "reason", err)
        why = "timed out" if isinstance(reason, (socket.timeout, TimeoutError)) else \
            getattr(reason, "strerror", None) or str(reason)
        raise HttpError("unreachable", why) from None
    except (ValueError, UnicodeError, http_client_errors()) as err:
        # a header value the request cannot carry, or an answer that is no HTTP; never quoted,
        # as http.client's message holds the header with its value
        raise HttpError("unreachable", f"the request or its answer is not valid HTTP "
                                       f"({type(err).__name__})") from None


def http_client_errors():
    import http.client
    return http.client.HTTPException


def _read(answer, ends: float, deadline: float, limit: int) -> bytes:
    """The answer's body, read a chunk at a time until `ends` (the call's `deadline` seconds after
    it began) and within `limit` bytes."""
    sock = _socket_of(answer)
    chunks, size = [], 0
    while True:
        left = ends - time.monotonic()
        if left <= 0:
            raise HttpError("deadline", f"took more than {deadline:.0f} s to answer")
        if sock is not None:
            sock.settimeout(min(READ_TIMEOUT_S, left))
        try:
            chunk = answer.read1(CHUNK) if hasattr(answer, "read1") else answer.read(CHUNK)
        except (socket.timeout, TimeoutError):
            if ends - time.monotonic() <= 0:
                raise HttpError("deadline", f"took more than {deadline:.0f} s to answer") from None
            raise HttpError("unreachable", "timed out") from None
        if not chunk:
            return b"".join(chunks)
        size += len(chunk)
        if size > limit:
            raise HttpError("too-large", f"answered more than {limit >> 20} MiB")
        chunks.append(chunk)


def _socket_of(answer):
    """The socket under an http.client answer (to bound each read by the deadline), or None."""
    raw = getattr(getattr(answer, "fp", None), "raw", None)
    return getattr(raw, "_sock", None)


def decode_json(raw: bytes):
    """A JSON answer (None when empty); HttpError("not-json") for anything else, also for nesting
    deeper than MAX_DEPTH."""
    if not raw.strip():
        return None
    try:
        text = raw.decode("utf-8")
        if _depth(raw) > MAX_DEPTH:
            raise HttpError("not-json", f"answered JSON nested more than {MAX_DEPTH} deep")
        return json.loads(text)
    except HttpError:
        raise
    except (ValueError, UnicodeError, RecursionError):
        raise HttpError("not-json", "did not answer JSON") from None


_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.S)


def _depth(raw: bytes) -> int:
    """The deepest nesting of brackets outside strings (checked before json.loads recurses)."""
    import numpy as np
    code = np.frombuffer(_STRING.sub(b'""', raw), dtype=np.uint8)
    step = np.isin(code, (ord("["), ord("{"))).astype(np.int64) - np.isin(code, (ord("]"), ord("}")))
    return int(np.cumsum(step).max(initial=0))
