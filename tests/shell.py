"""How tests start alcli and users' commands: always with the interpreter that runs the tests
(sys.executable), never a bare `python` from PATH, which may be another Python, one without torch."""
import shlex
import sys

PYTHON = shlex.quote(sys.executable)  # the head of a shell command line: PYTHON + " train.py ..."


def alcli_args(*args) -> list[str]:
    """argv that runs this interpreter's alcli: [python, -m, alcli, *args]."""
    return [sys.executable, "-m", "alcli", *map(str, args)]


def invoke_in(cwd, *args, input=None):
    """`alcli ARGS` in this process (Typer's CliRunner) with `cwd` as the working directory."""
    import os
    from typer.testing import CliRunner
    from alcli.cli import app
    old = os.getcwd()
    os.chdir(cwd)
    try:
        return CliRunner().invoke(app, [str(a) for a in args], input=input)
    finally:
        os.chdir(old)


def completed_in(cwd, *args, input=None):
    """`alcli ARGS` in this process, answered as subprocess.run answers (returncode, stdout,
    stderr): for tests that check what a command says, not how a process starts or dies."""
    import subprocess
    result = invoke_in(cwd, *args, input=input)
    return subprocess.CompletedProcess(["alcli", *map(str, args)], result.exit_code,
                                       result.stdout, result.stderr)


def ok(result):
    """A CliRunner result that exited 0 (else its output, in the assertion)."""
    assert result.exit_code == 0, result.stderr + result.stdout
    return result
