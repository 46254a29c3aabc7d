"""benchmarks/gpu.py --dry-run: the GPU script itself, run whole on the CPU at tiny sizes."""
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_gpu_script_dry_run():
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu.py"), "--dry-run"],
                          capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    out = done.stdout
    for section in ("CUDA-marked tests", "## resnet50", "## vit_b_16", "## text transformer",
                    "## seed SimpleModel", "bf16 against fp32", "shipped demo", "## detection", "end to end", "## --compile",
                    "## Causal LMs"):
        assert section in out, f"missing section {section!r}"
    assert "alcli EGL top-10 bf16" in out and "  ok" in out.split("end to end")[1]
    table = out.split("## detection")[1].split("##")[0]
    assert table.count("| fasterrcnn_mobilenet_v3_large_320_fpn |") == 1 and table.count("x |") == 2, table
    lm = out.split("## Causal LMs")[1]
    assert re.search(r"tiny-llama +floor +[\d.]+ ms +gradnorm +[\d.]+ ms +[\d.]+x", lm), lm
