"""A warm `alcli` for tests/test_docs.py: one process imports alcli (and torch) once, then forks a
child per command that runs `alcli.cli.main()` on the caller's own stdin, stdout and stderr, in its
working directory and environment, and hands back the exit code. Each example then costs its own
work, not two seconds of imports. The child is the command as `python -m alcli` runs it, started
from a process that has imported alcli and run nothing (no thread pool exists yet to fork).

  python tests/docs_zygote.py SOCKET          the server (stops when the socket file goes)
  python -S tests/docs_zygote.py SOCKET ARGS   a client: `alcli ARGS` through the server
"""
from __future__ import annotations

import array
import io
import json
import os
import signal
import socket
import sys

MAX_MESSAGE = 1 << 20


def client(path: str, args: list[str]) -> int:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.connect(path)
        message = json.dumps({"argv": args, "cwd": os.getcwd(), "env": dict(os.environ)}).encode()
        conn.sendmsg([message], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [0, 1, 2]))])
        conn.shutdown(socket.SHUT_WR)
        reply = conn.recv(16)
    if not reply:
        sys.stderr.write("docs_zygote: the command died without an exit code\n")
        return 1
    return int(reply)


def _stream(fd: int, old):
    raw = open(fd, "rb" if fd == 0 else "wb", closefd=False)
    return io.TextIOWrapper(raw, encoding=old.encoding, errors=old.errors,
                            line_buffering=fd == 2 or os.isatty(fd))


def serve(path: str) -> None:
    import atexit

    from alcli import api  # noqa: F401  (torch, numpy, PIL: what every command imports)
    import torch.fx.experimental.symbolic_shapes  # noqa: F401  (sympy, which scoring imports)
    from alcli.cli import main
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children are reaped by the kernel
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:
        server.bind(f"{path}.new")  # ready (listening) before its name appears
        server.listen(8)
        os.rename(f"{path}.new", path)
        server.settimeout(1.0)
        parent = os.getppid()
        while os.path.exists(path) and os.getppid() == parent:  # the test gone: stop too
            try:
                conn, _ = server.accept()
            except socket.timeout:
                continue
            conn.settimeout(None)
            message, fds = b"", []
            while True:
                data, ancillary, _, _ = conn.recvmsg(MAX_MESSAGE, socket.CMSG_SPACE(3 * 4))
                for level, kind, payload in ancillary:
                    if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                        fds += array.array("i", payload[:len(payload) - len(payload) % 4])
                if not data:
                    break
                message += data
            if os.fork() == 0:  # the child: become the command
                server.close()
                request = json.loads(message)
                for target, fd in enumerate(fds):
                    os.dup2(fd, target)
                    os.close(fd)
                os.chdir(request["cwd"])
                os.environ.clear()
                os.environ.update(request["env"])
                sys.argv = ["alcli", *request["argv"]]
                # new stream objects, as Python's start makes them: the old ones know the
                # zygote's files (a regular file's position, say), not these
                sys.stdin, sys.stdout, sys.stderr = (_stream(fd, old) for fd, old in enumerate(
                    (sys.stdin, sys.stdout, sys.stderr)))
                sys.__stdin__, sys.__stdout__, sys.__stderr__ = sys.stdin, sys.stdout, sys.stderr
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                try:
                    main()
                    code = 0
                except SystemExit as stop:
                    code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
                atexit._run_exitfuncs()
                for stream in (sys.stdout, sys.stderr):
                    try:
                        stream.flush()
                    except (OSError, ValueError):
                        pass
                conn.sendall(str(code).encode())
                os._exit(code)
            for fd in fds:
                os.close(fd)
            conn.close()


if __name__ == "__main__":
    if len(sys.argv) == 2:
        serve(sys.argv[1])
    else:
        sys.exit(client(sys.argv[1], sys.argv[2:]))
