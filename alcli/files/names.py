"""The one door from an example's id to a file name. Every writer that names a file after an id
asks here: score's and pull's mask PNGs (`id_file`), YOLO's label files and images.txt
(`stem_file`, `id_path`), COCO's file_name (`id_path`), each batch through `file_names`.

Ids come from outside and are hostile: `a.png` beside `a.jpg`, `../x`, `a\\nb`, `A` beside `a` on a
case-insensitive disk, `a.txt/b` beside `a`. Every name given here stays inside the output folder,
holds no control character (a line break would split a line of images.txt), and no two ids of a
batch share one (compared case-folded and Unicode-normalised, and a file never doubles as another's
folder).
"""
from __future__ import annotations

import hashlib
import posixpath
import re
import unicodedata
from typing import Callable, Iterable

CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")  # line breaks, C0 and C1 controls
UNSAFE = re.compile(r"[^A-Za-z0-9._-]")
PART_BYTES = 200  # the longest folder or file name kept from an id (file systems allow 255)


class FileNameError(ValueError):
    """An id that cannot name a file, or two ids that would name one."""


def id_path(row_id) -> str:
    """The id as a normalised relative POSIX path (`\\` read as `/`): COCO's file_name, a line of
    YOLO's images.txt. Refused: an empty or absolute id, one leaving its folder with `..`, one
    holding a control character, one with a part longer than PART_BYTES."""
    text = str(row_id)
    if CONTROL.search(text):
        raise FileNameError(f"the id {text!r} holds a line break or another control character, which "
                         f"cannot name a file")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate: a file name's undecodable byte, kept
        raise FileNameError(f"the id {text!r} is not valid UTF-8 text, which the files are "
                            f"written in") from None
    norm = posixpath.normpath(text.replace("\\", "/"))
    if not text or norm in (".", "..") or norm.startswith(("/", "../")):
        raise FileNameError(f"the id '{text}' is not a path relative to the pool's folder, which the "
                         f"files name images by")
    if any(len(part.encode("utf-8")) > PART_BYTES for part in norm.split("/")):
        raise FileNameError(f"the id '{text[:60]}...' has a folder or file name longer than "
                         f"{PART_BYTES} bytes")
    return norm


def stem_file(row_id, suffix: str) -> str:
    """The id's path with its own suffix replaced (YOLO's rule: a.jpg -> a.txt), so a.png and a.jpg
    name one file: `file_names` refuses such a batch."""
    return posixpath.splitext(id_path(row_id))[0] + suffix


def id_file(row_id, suffix: str) -> str:
    """A flat file name that is the id's alone: its safe characters (at most 100) and a 64-bit hash
    of the whole id, `x.png` -> `x.png-<16 hex>.png`. Any id has one."""
    text = str(row_id)
    digest = hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=8).hexdigest()
    return f"{UNSAFE.sub('_', text)[:100]}-{digest}{suffix}"


def file_names(ids: Iterable, name: Callable[[object], str]) -> dict[str, str]:
    """{id: name(id)} for a batch's distinct ids. FileNameError names both ids when two share a name
    (case-folded), or when one's file is a folder of another's."""
    names = {row_id: name(row_id) for row_id in dict.fromkeys(str(i) for i in ids)}
    apart(names)
    return names


def apart(*maps: dict[str, str]) -> None:
    """FileNameError unless the files that the maps ({id: name}, written into one folder) name are
    all different (case-folded) and none is a folder another needs, naming both ids."""
    owner: dict[str, str] = {}  # case-folded name -> its id
    for names in maps:
        for row_id, given in names.items():
            key = _folded(given)
            if key in owner:
                raise FileNameError(f"the ids '{owner[key]}' and '{row_id}' would both be written to "
                                    f"the file {given}; rename one of them")
            owner[key] = row_id
    for key, row_id in owner.items():  # a file where another id needs a folder
        parts = key.split("/")
        for k in range(1, len(parts)):
            folder = "/".join(parts[:k])
            if folder in owner:
                raise FileNameError(f"the id '{owner[folder]}' would be written to the file {folder}, "
                                    f"which the id '{row_id}' needs as a folder; rename one of them")


def _folded(name: str) -> str:
    """The name as a case-insensitive, normalising disk (macOS, Windows) may see it."""
    return unicodedata.normalize("NFC", unicodedata.normalize("NFD", name).casefold())
