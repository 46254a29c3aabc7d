"""Secrets of URLs kept out of every message and file alcli writes: a URL's `user:password@`
(the authority up to its last '@') and its query (a presigned URL's signature and credential).
What a URL opened held is remembered too, so text a library writes without the scheme (s3fs
quotes `KEY:SECRET@bucket/key`) loses it as well."""
from __future__ import annotations

import re
from urllib.parse import parse_qsl, unquote

SCHEME = r"[A-Za-z][A-Za-z0-9+.-]*://"
USERINFO = re.compile(rf"({SCHEME})[^/?#\s]*@")  # greedy: up to the authority's last '@'
QUERY = re.compile(rf"({SCHEME}[^\s?#'\"]*)\?[^\s#'\")]*")
HIDDEN = "***"
SHORTEST = 4  # a password or query value shorter than this is not searched for alone
_secrets: set[str] = set()


def remember(url: str) -> None:
    """Keep the user-info and the query of `url` (and their parts) to hide wherever they appear.
    A `user:password` here runs to the last '@' before the query, as an AWS secret key may hold
    an unescaped '/'."""
    m = re.match(rf"{SCHEME}([^/?#\s:@]*:[^?#\s]*)@", url) or re.match(rf"{SCHEME}([^/?#\s]*)@", url)
    found = []
    if m:
        userinfo = m.group(1)
        found += [userinfo, userinfo.partition(":")[2]]
    query = url.partition("?")[2].partition("#")[0]
    if query:
        found += [query, *(v for _, v in parse_qsl(query, keep_blank_values=True))]
    for secret in found:
        for form in (secret, unquote(secret)):
            if len(form) >= SHORTEST or form == found[0]:
                _secrets.add(form)
    _secrets.discard("")


def redacted(text) -> str:
    """`text` with every URL's user-info and query left out, and every remembered secret hidden."""
    text = QUERY.sub(r"\1", USERINFO.sub(r"\1", str(text)))
    for secret in sorted(_secrets, key=len, reverse=True):
        text = text.replace(secret, HIDDEN)
    return text
