"""Class names: index i of the model's output is names[i].

They come from a --class-names file, from a Hugging Face model's `id2label` (unless it is the
default LABEL_0, LABEL_1, ...), or from class folders (alcli/pools/folder.py). Tables show them in `pred` (and
`label`), and string labels in manifests are mapped to indices through them.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

from ..errors import ConfigError


# no control character (C0, DEL, C1) and no line or paragraph separator: XML 1.0 cannot hold most
# of them, and each would split or garble the name in a table, a labeling config or a terminal
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def read_class_names(path: str | Path, where: str = "option --class-names") -> list[str]:
    """The names in `path`: a JSON list of strings, or one name per line (lines end at \n only,
    a CRLF file's \r dropped; surrounding spaces and trailing blank lines dropped). Empty names,
    duplicates, control characters and lone surrogates are errors naming the line (the name's
    number in a JSON list)."""
    path = Path(path)
    try:
        with open(path, encoding="utf-8-sig", newline="") as f:  # \n alone ends a line
            text = f.read()
    except FileNotFoundError:
        raise ConfigError(f"{where}: class names file {path} does not exist") from None
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError(f"{where}: class names file {path} cannot be read ({err})") from None
    if text.lstrip().startswith("["):
        names = _json_names(text, path, where)
    else:
        lines = text.split("\n")
        while lines and not lines[-1].strip(" \t\r"):
            lines.pop()  # trailing blank lines
        names = [line.removesuffix("\r").strip(" \t") for line in lines]
    if not names:
        raise ConfigError(f"{where}: class names file {path} names no class")
    seen: dict[str, int] = {}
    unit = "position" if text.lstrip().startswith("[") else "line"  # in a JSON list: the n-th
    for n, name in enumerate(names, 1):
        check_name(name, f"{where}: class names file {path}", f"{unit} {n}")
        if not name:
            raise ConfigError(f"{where}: class names file {path} has an empty name at {unit} {n}")
        if name in seen:
            raise ConfigError(f"{where}: class names file {path} names '{name}' twice (lines "
                              f"{seen[name]} and {n})")
        seen[name] = n
    return names


def _json_names(text: str, path: Path, where: str) -> list[str]:
    try:
        names = json.loads(text)
    except json.JSONDecodeError as err:
        raise ConfigError(f"{where}: class names file {path} is not valid JSON ({err.msg}, line "
                          f"{err.lineno})") from None
    if not isinstance(names, list) or not all(isinstance(x, str) for x in names):
        raise ConfigError(f"{where}: class names file {path} must hold a JSON list of strings")
    return [x.strip() for x in names]


def check_name(name: str, source: str, at: str) -> None:
    """Refuse a class name holding a control character or a lone surrogate (`source` names where
    it came from, `at` the line or position)."""
    bad = _CONTROL.search(name)
    if bad:
        raise ConfigError(f"{source} has the control character U+{ord(bad.group()):04X} in the "
                          f"name at {at} ({ascii(name)[:80]}); class names are printable text")
    try:
        name.encode("utf-8")
    except UnicodeEncodeError as err:
        raise ConfigError(f"{source} has a lone surrogate (U+{ord(name[err.start]):04X}) in the "
                          f"name at {at} ({ascii(name)[:80]}), which is no character") from None


def check_names(names: list[str], source: str) -> list[str]:
    """Every name of `source` (a model's id2label, a dataset's ClassLabel) checked as a names
    file's are; the names, as they are."""
    for n, name in enumerate(names, 1):
        check_name(name, source, f"position {n}")
    return names


def multilabel_names(names: list[str] | None, source: str) -> None:
    """A multilabel table joins a row's labels with |: a name holding one would come back as
    two labels, so it is refused."""
    for n, name in enumerate(names or [], 1):
        if "|" in name:
            raise ConfigError(f"{source} names the class '{name}' (name {n}), which holds '|': a "
                              f"multilabel row joins its labels with '|', so the name would come "
                              f"back as two; rename it")


def id2label_names(model) -> list[str] | None:
    """A Hugging Face model's `config.id2label` as a list, or None when it is missing, has gaps,
    or is the default LABEL_0, LABEL_1, ..."""
    mapping = getattr(getattr(model, "config", None), "id2label", None)
    if not isinstance(mapping, dict) or not mapping:
        return None
    try:
        by_index = {int(k): str(v) for k, v in mapping.items()}
    except (TypeError, ValueError):
        return None
    names = [by_index.get(i) for i in range(len(by_index))]
    if None in names or names == [f"LABEL_{i}" for i in range(len(names))]:
        return None
    return names


def class_name(value, names: list[str] | None):
    """A class index shown by its name (when the names know it); anything else as it is."""
    if names and isinstance(value, int) and not isinstance(value, bool) and 0 <= value < len(names):
        return names[value]
    return value
