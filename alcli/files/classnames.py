"""Class names: index i of the model's output is names[i].

They come from a --class-names file, from a Hugging Face model's `id2label` (unless it is the
default LABEL_0, LABEL_1, ...), or from class folders (pool.py). Tables show them in `pred` (and
`label`), and string labels in manifests are mapped to indices through them.
"""
from __future__ import annotations

import json
from pathlib import Path

from ..errors import ConfigError


def read_class_names(path: str | Path, where: str = "option --class-names") -> list[str]:
    """The names in `path`: a JSON list of strings, or one name per line (surrounding spaces and
    trailing blank lines dropped). Empty names and duplicates are errors naming the line."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8-sig")
    except FileNotFoundError:
        raise ConfigError(f"{where}: class names file {path} does not exist") from None
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError(f"{where}: class names file {path} cannot be read ({err})") from None
    if text.lstrip().startswith("["):
        names = _json_names(text, path, where)
    else:
        names = [line.strip() for line in text.rstrip().splitlines()]
    if not names:
        raise ConfigError(f"{where}: class names file {path} names no class")
    seen: dict[str, int] = {}
    for n, name in enumerate(names, 1):
        if not name:
            raise ConfigError(f"{where}: class names file {path} has an empty name at line {n}")
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
