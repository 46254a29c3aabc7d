"""The benchmark scripts run: their quick modes, on the CPU (timings are never asserted)."""
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


def test_learning_curves_quick(tmp_path):
    pytest.importorskip("sklearn")
    out = tmp_path / "lc"
    # --quick's settings (2 seeds, batch 50, cnn, 5 methods) on a 200-example pool, 2 rounds, 5
    # epochs: every step of the loop and the report, at a fifth of the quick run's time
    proc = subprocess.run([sys.executable, str(BENCH / "learning_curves.py"), "--quick",
                           "--pool-size", "200", "--max-labels", "120", "--epochs", "5",
                           "--out", str(out)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    text = Path(f"{out}.txt").read_text()
    assert "AUC" in text and "random" in text and "egl+div" in text
    assert "a fixed subset of 200 pool examples" in text and "Win matrix (BADGE" in text
    auc = {}
    table = text.split("## AUC (mean test accuracy", 1)[1].split("\n\n")[1]  # after its title
    for line in table.splitlines()[1:]:  # method, per-setting columns, mean, - random, - egl
        parts = line.split()
        auc[parts[0]] = parts[1:]
    assert set(auc) == {"egl", "egl+div", "margin+div", "typical", "random"}
    assert "Cold start: accuracy(typical) - accuracy(X)" in text and "behind from" in text
    assert auc["egl"] != auc["egl+div"]  # the two variants really differ (diverse is explicit)
    assert "egl = egl+div" not in text
