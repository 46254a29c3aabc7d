"""benchmarks/gpu.py --dry-run: the GPU script on the CPU at tiny sizes, so that it does not crash on
the day a GPU is lent. One test per section, each run in this process (no interpreter to start;
pytest-xdist spreads them), its table checked; and the command line itself, in a process of its own."""
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import benchmark_scripts

ROOT = Path(__file__).resolve().parents[1]
# gpu.py's own filter, which the first test's warning capture would drop for the later ones
pytestmark = pytest.mark.filterwarnings("ignore:There is a performance drop")
NUMBER = r"-?\d[\d.]*(?:e[-+]\d+)?[x%]?"  # 12, 0.25, 1.2e-05, 1.69x, 95%


@pytest.fixture(scope="module")
def gpu():
    return benchmark_scripts.load("gpu")


def dry_run(gpu, section: str) -> str:
    """What one section says in a dry run (the global RNG left as it was for the other tests)."""
    lines = []
    with torch.random.fork_rng(devices=[]):
        gpu.sections()[section](torch.device("cpu"), True, lambda line="": lines.append(line))
    return "\n".join(lines)


def rows(out: str, name: str, numbers: int) -> list[str]:
    """The lines of `out` that are `name` and then `numbers` figures, nothing else."""
    pattern = re.compile(rf" *{re.escape(name)} +" + " +".join([NUMBER] * numbers) + " *")
    return [line for line in out.splitlines() if pattern.fullmatch(line)]


def check_cuda_tests(out):
    assert "## CUDA-marked tests: not run in a dry run" in out


def check_timing(out):
    models = ("resnet50", "vit_b_16", "text transformer", "seed SimpleModel")
    blocks = re.split(r"\n## ", out)[1:]
    assert [b.split(":")[0] for b in blocks] == list(models), out
    for block in blocks:  # alcli's contenders and the plain passes timed in every block (peers may refuse)
        for contender in ("forward", "forward+backward", "alcli gradnorm fp32", "alcli EGL top-10 fp32",
                          "alcli gradnorm bf16", "alcli EGL top-10 bf16"):
            assert len(rows(block, contender, 2)) == 1, f"{contender!r} not timed:\n{block}"
    assert "EGL exact over 1000 classes" in blocks[0] and len(rows(blocks[3], "alcli EGL exact bf16", 2)) == 1


def check_precision(out):
    assert "## bf16 against fp32" in out
    for name in ("simple", "bn_res_cnn", "shipped demo (DigitsCNN)"):
        assert len(rows(out, name, 5)) == 1, f"no figures for {name!r}:\n{out}"


def check_detection(out):
    table = out.split("## detection")[1]
    assert table.count("| fasterrcnn_mobilenet_v3_large_320_fpn |") == 1 and table.count("x |") == 3, table


def check_end_to_end(out):
    assert "## alcli score end to end: 4 JPEGs" in out and "  ok (4 rows)" in out.split("end to end")[1], out


def check_call_cost(out):
    assert "## The cost that is not arithmetic" in out and "steady call by phase" in out
    assert len(rows(out, "simple", 8)) == 1 and len(rows(out, "simple", 7)) == 1, out  # the two tables


def check_compile(out):
    assert "## --compile" in out and len(rows(out, "mlp", 7)) == 1, out


def check_egl_chunks(out):
    assert "## EGL: target sets" in out and len(rows(out, "simple", 4)) == 1, out


def check_tasks(out):
    assert "## Tasks" in out, out
    for task in ("segmentation", "token-classification"):
        assert len(rows(out, task, 6)) == 1, f"no figures for {task!r}:\n{out}"


def check_causal_lm(out):
    lm = out.split("## Causal LMs")[1]
    assert re.search(r"tiny-llama +floor +[\d.]+ ms +gradnorm +[\d.]+ ms +[\d.]+x", lm), lm


CHECKS = {"cuda-tests": check_cuda_tests, "timing": check_timing, "precision": check_precision,
          "detection": check_detection, "end-to-end": check_end_to_end, "call-cost": check_call_cost,
          "compile": check_compile, "egl-chunks": check_egl_chunks, "tasks": check_tasks,
          "causal-lm": check_causal_lm}


def test_every_section_has_a_dry_run_test(gpu):
    assert list(gpu.sections()) == list(CHECKS)


@pytest.mark.parametrize("section", list(CHECKS))
def test_gpu_script_section_dry_run(gpu, section):
    CHECKS[section](dry_run(gpu, section))


def test_gpu_script_command_line(gpu, tmp_path, capsys):
    """The script as the GPU day runs it: header, the sections asked for in the script's order, the
    total, the results file; an unknown section is a usage error."""
    out = tmp_path / "results.txt"
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu.py"), "--dry-run",
                           "--only", "egl-chunks", "cuda-tests", "--out", str(out)],
                          capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert lines[0].startswith("# alcli on CPU (dry run): torch ") and re.fullmatch(r"\(total \d+ s\)", lines[-1])
    assert [line for line in lines if line.startswith("## ")] == [
        "## CUDA-marked tests: not run in a dry run",
        "## EGL: target sets per vmapped backward (median s per call; 2^v: K x largest tap <= 2^v elements)"]
    assert out.read_text() == done.stdout
    with pytest.raises(SystemExit) as bad:
        gpu.parse_args(["--dry-run", "--only", "detectoin"])
    assert bad.value.code == 2 and "invalid choice: 'detectoin'" in capsys.readouterr().err
    assert gpu.parse_args([]).only is None  # no flags: every section, the results file
