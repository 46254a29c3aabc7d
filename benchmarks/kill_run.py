"""kill -9 at random moments of a long `alcli score` run: how much finished work each kill loses.

A run over a synthetic pool is started, killed with SIGKILL after a random wait, resumed with
--resume, killed again, ... until `--minutes` of wall time have passed; then it is resumed to the
end. Each kill compares the rows in OUTPUT.partial with the progress the run had reported (JSON
progress lines every 0.05 s): rows finished before (kill - interval - one batch) must all be saved,
and the rows lost are reported in seconds of work.

    python benchmarks/kill_run.py                       # 10 minutes, --checkpoint-every 30s
    python benchmarks/kill_run.py --minutes 2 --every 5s
"""
from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from alcli.files.config import duration_seconds  # noqa: E402
NET = '''
import torch
from torch import nn

class Net(nn.Module):
    def __init__(self, classes=10):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, 3, padding=1)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
        self.fc = nn.Linear(32, classes)

    def forward(self, x):
        x = torch.relu(self.conv1(x))
        x = torch.relu(self.conv2(torch.max_pool2d(x, 2)))
        return self.fc(x.mean((2, 3)))
'''


def start(work: Path, out: Path, every: str, resume: bool) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{work}", "PYTHONWARNINGS": "ignore"}
    return subprocess.Popen(
        [sys.executable, "-m", "alcli", "score", str(work / "pool.pt"), "-m", str(work / "net.pt"),
         "--arch", "killnet:Net", "--trust-checkpoint", "-b", "32", "-o", str(out),
         "--checkpoint-every", every, "--log-format", "json", "--progress-every", "0.05",
         *(["--resume"] if resume else [])],
        cwd=work, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def saved_rows(partial: Path) -> int:
    try:
        return max(0, partial.read_bytes().count(b"\n") - 1)
    except FileNotFoundError:
        return 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--every", default="30s", help="--checkpoint-every")
    parser.add_argument("--pool", type=int, default=400_000, help="examples (3x16x16)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    interval = duration_seconds(args.every)
    moments = random.Random(args.seed)
    with tempfile.TemporaryDirectory(prefix="alcli-kill-") as tmp:
        work = Path(tmp)
        (work / "killnet.py").write_text(NET)
        sys.path.insert(0, str(work))
        from killnet import Net
        torch.manual_seed(args.seed)
        torch.save(Net().state_dict(), work / "net.pt")
        torch.save({"x": torch.randn(args.pool, 3, 16, 16),
                    "ids": [f"ex{i:07d}" for i in range(args.pool)]}, work / "pool.pt")
        out, partial = work / "t.csv", work / "t.csv.partial"
        t_end = time.monotonic() + 60 * args.minutes
        kills = []
        while time.monotonic() < t_end:
            proc = start(work, out, args.every, resume=partial.exists())
            progress: list[tuple[float, int, float]] = []  # (arrival, done, examples/s)

            def read(stream=proc.stderr, progress=progress):
                for line in stream:
                    if line.startswith("{"):
                        event = json.loads(line)
                        if event["event"] == "progress":
                            progress.append((time.monotonic(), event["done"],
                                             event["per_second"] or 0.0))
            reader = threading.Thread(target=read, daemon=True)
            reader.start()
            while not progress and proc.poll() is None:
                time.sleep(0.01)
            if proc.poll() is not None:
                break
            time.sleep(min(moments.uniform(0.2, 3 * interval), max(0.0, t_end - time.monotonic())))
            killed_at = time.monotonic()
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            reader.join(timeout=10)
            saved = saved_rows(partial)
            done_at_kill = progress[-1][1]
            bound = max([d for t, d, _ in progress if t <= killed_at - interval - 0.5], default=0)
            # the work lost, in wall time: since the first row not saved was reported done
            unsaved = [t for t, d, _ in progress if d > saved]
            kills.append({"saved": saved, "done": done_at_kill, "lost": max(0, done_at_kill - saved),
                          "lost_seconds": killed_at - unsaved[0] if unsaved else 0.0,
                          "ok": saved >= bound})
            k = kills[-1]
            print(f"kill {len(kills):3d}: {k['done']:8d} done, {k['saved']:8d} saved, lost "
                  f"{k['lost']:6d} rows = {k['lost_seconds']:5.1f} s of work "
                  f"({'within' if k['ok'] else 'BEYOND'} the {interval:g} s interval)", flush=True)
        finish = start(work, out, args.every, resume=partial.exists())
        finish.communicate()
        rows = out.read_text().count("\n") - 1 if out.exists() else 0
        print(f"\n{len(kills)} kills in {args.minutes:g} min, --checkpoint-every {args.every}: "
              f"most work lost {max((k['lost_seconds'] for k in kills), default=0):.1f} s; "
              f"{sum(not k['ok'] for k in kills)} kills lost rows older than the interval; "
              f"final table {rows} rows of {args.pool} (exit {finish.returncode})")


if __name__ == "__main__":
    main()
