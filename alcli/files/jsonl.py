"""JSON Lines input: one object per non-blank line."""
from __future__ import annotations

import json
from typing import Callable, Iterable, Iterator


def json_objects(lines: Iterable[str], where: Callable[[int], str],
                 error: Callable[[str], Exception]) -> Iterator[tuple[int, dict]]:
    """(line number, object) for every non-blank line; a line that is not a JSON object raises
    `error("<where(n)> is not ...")`."""
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError:
            raise error(f"{where(n)} is not valid JSON") from None
        if not isinstance(obj, dict):
            raise error(f"{where(n)} is not a JSON object")
        yield n, obj
