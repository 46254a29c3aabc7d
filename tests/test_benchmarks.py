"""The benchmark scripts run: their quick modes, on the CPU (timings are never asserted)."""
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


def test_learning_curves_quick(tmp_path):
    pytest.importorskip("sklearn")
    out = tmp_path / "lc"
    # --quick's settings (2 seeds, batch 50, cnn, 4 methods) on a 200-example pool, 2 rounds, 5
    # epochs: every step of the loop and the report, at a fifth of the quick run's time
    proc = subprocess.run([sys.executable, str(BENCH / "learning_curves.py"), "--quick",
                           "--pool-size", "200", "--max-labels", "120", "--epochs", "5",
                           "--out", str(out)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    text = Path(f"{out}.txt").read_text()
    assert "AUC" in text and "random" in text and "egl+div" in text
    assert "a fixed subset of 200 pool examples" in text and "Win matrix (BADGE" in text
    auc = {}
    for line in text.splitlines():  # the AUC table: method, per-setting columns, mean, ...
        parts = line.split()
        if parts and parts[0] in ("egl", "egl+div") and parts[0] not in auc and len(parts) >= 4:
            auc[parts[0]] = parts[1:]
    assert auc["egl"] != auc["egl+div"]  # the two variants really differ (diverse is explicit)
