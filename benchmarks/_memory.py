"""A child process's peak memory, for the benchmarks that measure it: its whole process tree's
PSS and RSS (DataLoader workers included), sampled every 0.2 s while it runs."""
from __future__ import annotations

import subprocess
import threading


def run_measured(cmd: list[str], env: dict, cwd) -> tuple[subprocess.CompletedProcess, int, int]:
    """Run `cmd` -> (its completed process with stdout and stderr, peak PSS, peak RSS in bytes)."""
    import psutil
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=cwd)
    peak = {"pss": 0, "rss": 0}
    done = threading.Event()

    def sample():
        root = psutil.Process(proc.pid)
        while not done.is_set():
            pss = rss = 0
            try:
                for p in [root, *root.children(recursive=True)]:
                    try:
                        info = p.memory_full_info()
                        pss += info.pss
                        rss += info.rss
                    except (psutil.NoSuchProcess, psutil.AccessDenied):
                        pass
            except psutil.NoSuchProcess:
                return
            peak["pss"], peak["rss"] = max(peak["pss"], pss), max(peak["rss"], rss)
            done.wait(0.2)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    stdout, stderr = proc.communicate()
    done.set()
    sampler.join()
    return subprocess.CompletedProcess(cmd, proc.returncode, stdout, stderr), peak["pss"], peak["rss"]
