"""How tests start alcli and users' commands: always with the interpreter that runs the tests
(sys.executable), never a bare `python` from PATH, which may be another Python, one without torch."""
import shlex
import sys

PYTHON = shlex.quote(sys.executable)  # the head of a shell command line: PYTHON + " train.py ..."


def alcli_args(*args) -> list[str]:
    """argv that runs this interpreter's alcli: [python, -m, alcli, *args]."""
    return [sys.executable, "-m", "alcli", *map(str, args)]
