"""alcli on one GPU, in one command (at most ~9 minutes on one H200):

1. the CUDA-marked tests (tests/test_cuda.py);
2. side by side in one process, per model: plain forward, plain forward+backward, alcli gradnorm
   and EGL (top-10 and exact over all classes) in fp32 and bf16, and the peers (torch.func,
   Opacus, BackPACK where they run) on resnet50 224x224, ViT-B/16, the text transformer and the
   seed's SimpleModel;
3. bf16 against fp32 scores: Spearman rank correlation and overlap of the top 10%, on zoo models
   and the shipped demo;
4. `alcli score` end to end on a folder of JPEGs it writes;
5. the cost that is not arithmetic (benchmarks/call_cost.py): first call ÷ steady call, aten ops
   per call (kernels) beside the plain pass, and a steady call's time in and out of aten ops, on
   the seed's model, resnet18 and BERT-small;
6. `--compile` against the plain ghost call (benchmarks/compiled.py): the compile, steady call ÷
   the floor and launches per call, with CUDA graphs and (seed model) without;
7. EGL's target sets per vmapped backward (benchmarks/egl_chunks.py): all K at once (what CUDA
   does now, ghost.VMAP_ELEMENTS_CUDA = None) against chunks and one backward per target set,
   on resnet18 (10 classes) and fcn_resnet50 (8 label sets, 16x3x128x128);
8. issue 18's tasks against the floor (benchmarks/tasks.py): fcn_resnet50 16x3x128x128 and
   BERT-small token classification 32x64, gradnorm and EGL-8 ÷ the floor and ÷ 8 plain backwards;
9. the detectors (benchmarks/detection.py), batch 8 at 320 px: gradnorm and egl S = 8 as `auto`
   runs them and on the per-image loop, ÷ the floor (issue 33);
10. causal LMs (benchmarks/causal_lm.py), GPT-2 small and a tiny Llama: gradnorm ÷ the floor at
   T = 512, B = 8, and the peak memory of each at T = 2048, B = 2 (issue 36).

    python benchmarks/gpu.py                         # writes benchmarks/results/gpu-<device>.txt
    python benchmarks/gpu.py --only detection tasks  # some sections (names: --help), no results file
    python benchmarks/gpu.py --dry-run               # every section on the CPU at tiny sizes, < 1 minute

The dry run calls each section once at tiny sizes, timing each contender on one call, so that the
script does not crash on the day a GPU is lent; tests/test_gpu_script.py runs each section in it.
"""
from __future__ import annotations

import argparse
import contextlib
import functools
import io
import math
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks"), str(ROOT / "tests")]
warnings.filterwarnings("ignore", message="There is a performance drop")
warnings.filterwarnings("ignore", category=UserWarning, module="backpack")  # modules it has no extension for

from alcli.gradnorm import grad_norms_per_target  # noqa: E402
from gradnorm import SimpleModel, TextTransformer  # noqa: E402  (benchmarks/gradnorm.py)

LOW = {"fp32": None, "bf16": torch.bfloat16}


def autocast(precision: str, device: torch.device):
    dtype = LOW[precision]
    return torch.autocast(device.type, dtype=dtype, enabled=dtype is not None)


# ---------------------------------------------------------------------------------------- models
def models(dry: bool):
    """(name, builder -> (model, inputs [B, ...], labels [B]))."""
    import torchvision
    g = torch.Generator().manual_seed(0)

    def images(n, size, classes):
        return torch.randn(n, 3, size, size, generator=g), torch.randint(0, classes, (n,), generator=g)

    def resnet50():
        if dry:  # resnet50's blocks, one of each stage
            from torchvision.models.resnet import Bottleneck, ResNet
            return ResNet(Bottleneck, [1, 1, 1, 1], num_classes=1000), *images(2, 16, 1000)
        return torchvision.models.resnet50(num_classes=1000), *images(64, 224, 1000)

    def vit():
        if dry:
            m = torchvision.models.VisionTransformer(image_size=32, patch_size=16, num_layers=1, num_heads=2,
                                                     hidden_dim=32, mlp_dim=64, num_classes=10)
            return m, *images(2, 32, 10)
        return torchvision.models.vit_b_16(num_classes=1000), *images(32, 224, 1000)

    def text():
        n = 2 if dry else 64
        return TextTransformer(), torch.randint(0, 1000, (n, 8 if dry else 64), generator=g), \
            torch.randint(0, 10, (n,), generator=g)

    def simple():
        n = 2 if dry else 256
        return SimpleModel(), torch.rand(n, 3, 10, 10, generator=g), torch.randint(0, 10, (n,), generator=g)

    return [("resnet50", resnet50), ("vit_b_16", vit), ("text transformer", text), ("seed SimpleModel", simple)]


# --------------------------------------------------------------------------------------- timing
def timed(fn, device, seconds: float, reps: int, dry: bool = False) -> float:
    """Median seconds per call after one warm-up call, within `seconds` or `reps` calls; dry: the
    seconds of one call, no warm-up (the dry run checks that it runs, not how fast)."""
    if dry:
        seconds, reps = 0.0, 1
    else:
        fn()
        sync(device)
    times, start = [], time.perf_counter()
    while len(times) < reps and (not times or time.perf_counter() - start < seconds):
        t0 = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def contenders(model, x, y, device, exact_ok: bool):
    def plain_forward():
        with torch.no_grad():
            model(x)

    def plain_backward():
        F.cross_entropy(model(x), y, reduction="sum").backward()
        model.zero_grad(set_to_none=True)

    def engine(precision, k):
        def run():
            with autocast(precision, device):
                grad_norms_per_target(model, x, lambda logits: list(
                    logits.argsort(1, descending=True)[:, :k].T), method="ghost")
        return run

    out = [("forward", plain_forward), ("forward+backward", plain_backward)]
    for precision in ("fp32", "bf16"):
        out.append((f"alcli gradnorm {precision}", engine(precision, 1)))
        out.append((f"alcli EGL top-10 {precision}", engine(precision, 10)))
        if exact_ok:
            out.append((f"alcli EGL exact {precision}", engine(precision, 10 ** 9)))
    return out


def peers(model, x, y):
    import _peers
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    for name, factory in _peers.PEERS.items():
        try:
            yield name, factory(model, x, y, names), None
        except Exception as err:  # noqa: BLE001 - a peer that cannot take the model
            yield name, None, f"{type(err).__name__}: {str(err).strip().splitlines()[0][:80] if str(err).strip() else ''}"


def cuda_tests(device, dry: bool, say):
    """tests/test_cuda.py in a pytest of its own; the summary line (and the failures' tail)."""
    if dry:  # the suite runs them, skipped without CUDA
        say("\n## CUDA-marked tests: not run in a dry run")
        return
    tests = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_cuda.py"],
                           capture_output=True, text=True, cwd=ROOT)
    say(f"\n## CUDA-marked tests: {(tests.stdout.strip().splitlines() or ['(no output)'])[-1]}")
    if tests.returncode not in (0, 5):
        say("\n".join(tests.stdout.strip().splitlines()[-30:]))


def timing_table(device, dry: bool, say, deadline: float = math.inf):
    for name, build in models(dry):
        torch.manual_seed(0)
        model, x, y = build()
        model = model.to(device).eval()
        if device.type == "cuda" and x.dim() == 4:
            x = x.contiguous(memory_format=torch.channels_last)
        model = model.to(memory_format=torch.channels_last) if device.type == "cuda" and x.dim() == 4 else model
        x, y = x.to(device), y.to(device)
        with torch.no_grad():
            classes = model(x[:1]).shape[1]
        say(f"\n## {name}: batch {x.shape[0]}, input {list(x.shape[1:])}, {classes} classes")
        say(f"   {'contender':<28} {'ms/batch':>10} {'examples/s':>11}  note")
        # exact EGL over 1000 classes is 100x the top-10 work: timed only where it fits the budget
        rows = [(n, f, None) for n, f in contenders(model, x, y, device, exact_ok=classes <= 10)]
        rows += list(peers(model, x, y))
        for label, fn, note in rows:
            if note is None and not dry and time.perf_counter() > deadline:
                note = "skipped: over the time budget"
            if note is not None:
                say(f"   {label:<28} {'-':>10} {'-':>11}  {note}")
                continue
            try:
                s = timed(fn, device, 3.0, 20, dry)
            except torch.OutOfMemoryError:
                torch.cuda.empty_cache()
                say(f"   {label:<28} {'-':>10} {'-':>11}  out of memory")
                continue
            except Exception as err:  # noqa: BLE001 - a peer failing on this model
                say(f"   {label:<28} {'-':>10} {'-':>11}  {type(err).__name__}: {str(err)[:80]}")
                continue
            say(f"   {label:<28} {s * 1e3:>10.2f} {x.shape[0] / s:>11.0f}")
        if classes > 10:
            say(f"   (EGL exact over {classes} classes: {classes // 10}x the top-10 backward, not timed; "
                "`alcli score --top-classes 0` runs it)")
        del model, x, y
        if device.type == "cuda":
            torch.cuda.empty_cache()


# ------------------------------------------------------------------------------------- precision
def rank_agreement(a: torch.Tensor, b: torch.Tensor) -> tuple[float, float]:
    """(Spearman rank correlation, overlap of the top 10%) of two score vectors."""
    ra, rb = a.argsort().argsort().double(), b.argsort().argsort().double()
    rho = float(torch.corrcoef(torch.stack([ra, rb]))[0, 1])
    k = max(1, len(a) // 10)
    top_a, top_b = set(a.argsort(descending=True)[:k].tolist()), set(b.argsort(descending=True)[:k].tolist())
    return rho, len(top_a & top_b) / k


def precision_table(device, dry: bool, say):
    import alcli
    from gradnorm_zoo import build
    say("\n## bf16 against fp32 scores (egl, every class): Spearman rank correlation, top-10% overlap")
    say("   (spread: std/mean of the fp32 scores; where it is below bf16's error the ranks are noise)")
    say(f"   {'model':<24} {'pool':>5} {'Spearman':>9} {'top 10%':>8} {'spread':>9} {'median rel. diff':>17}")
    n = 20 if dry else 400
    cases = ["simple", "bn_res_cnn"] if dry else ["simple", "mlp", "bn_res_cnn", "resnet18", "mobilenet_v3_small",
                                                  "transformer", "conv2d_variants"]
    for case in cases:
        model, inputs, _ = build(case)
        gen = torch.Generator().manual_seed(5)
        if inputs.is_floating_point():
            pool = torch.randn(n, *inputs.shape[1:], generator=gen)
        else:
            pool = torch.randint(1, int(inputs.max()) + 1, (n, *inputs.shape[1:]), generator=gen)
        report(say, case, *scores_both(alcli.score_pool, pool, model, device))
    demo = ROOT / "data" / "demo"
    if (demo / "model.pt").is_file():
        from alcli.files.checkpoint import load_model
        model = load_model(demo / "model.pt", arch="alcli.demo:DigitsCNN")
        pool = str(demo / "pool")
        report(say, "shipped demo (DigitsCNN)", *scores_both(alcli.score_pool, pool, model, device))


def scores_both(score_pool, pool, model, device):
    out = []
    for precision in ("fp32", "bf16"):
        rows = score_pool(pool, model, device=device.type, precision=precision, batch_size=64, top_classes=0)
        out.append({str(r["id"]): r["score"] for r in rows})
    ids = sorted(out[0])
    return len(ids), torch.tensor([out[0][i] for i in ids]), torch.tensor([out[1][i] for i in ids])


def report(say, name, n, a, b):
    rho, overlap = rank_agreement(a, b)
    spread, diff = float(a.std() / a.mean()), float(((b - a) / a).abs().median())
    say(f"   {name:<24} {n:>5} {rho:>9.4f} {overlap:>8.0%} {spread:>9.1e} {diff:>17.1e}")


# ------------------------------------------------------------------------------------ end to end
def end_to_end(device, dry: bool, say):
    import numpy as np
    import torchvision
    from PIL import Image
    n, size = (4, 32) if dry else (1024, 224)
    arch = "resnet18" if dry else "resnet50"
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "pool"
        folder.mkdir()
        rng = np.random.default_rng(0)
        for i in range(n):
            Image.fromarray(rng.integers(0, 256, (size, size, 3), dtype=np.uint8)).save(folder / f"{i:05d}.jpg")
        weights = Path(tmp) / f"{arch}.pt"
        torch.save(getattr(torchvision.models, arch)(num_classes=1000).state_dict(), weights)
        say(f"\n## alcli score end to end: {n} JPEGs {size}x{size}, {arch} (1000 classes), {device.type}")
        for precision in ("bf16",) if dry else ("fp32", "bf16"):
            out = Path(tmp) / f"{precision}.csv"
            args = ["score", str(folder), "-m", str(weights), "--arch", f"torchvision:{arch}", "--device", device.type,
                    "--precision", precision, "-b", "2" if dry else "64", "-o", str(out), "-q"]
            t0 = time.perf_counter()
            code, err = alcli_command(args, own_process=not dry)
            s = time.perf_counter() - t0
            rows = len(out.read_text().splitlines()) - 1 if code == 0 else 0  # under a header line
            status = f"ok ({rows} rows)" if code == 0 else f"failed: {err.strip().splitlines()[-1:]}"
            how = "process start included" if not dry else "in this process"
            say(f"   egl top-10 {precision}: {s:6.1f} s wall ({how}), {n / s:7.1f} images/s  {status}")


def alcli_command(args: list[str], own_process: bool) -> tuple[int, str]:
    """(exit code, stderr) of `alcli ARGS`: in a process of its own, as a user runs it, or (the dry
    run) in this one, where torch and torchvision are imported already (5 s of a 7 s CPU run)."""
    if own_process:
        done = subprocess.run([sys.executable, "-m", "alcli", *args], capture_output=True, text=True, cwd=ROOT)
        return done.returncode, done.stderr
    from alcli.cli import app
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        try:
            app(args, prog_name="alcli")
        except SystemExit as done:  # the app always exits with the command's code
            return done.code, err.getvalue()
    return 0, err.getvalue()


def detection_table(device, dry: bool, say):
    """Issue 33's speed targets on the device (benchmarks/detection.py): gradnorm and egl as `auto`
    runs them (batched through the engine) and on the per-image loop, each ÷ one forward+backward
    of the batch's summed loss."""
    from detection import DETECTORS, HEADER, measure, row
    n, size, samples = (2, 64, 2) if dry else (8, 320, 8)
    say(f"\n## detection: batch {n} x {size}px, egl S = {samples}, ÷ the batch's forward+backward")
    say(HEADER)
    g = torch.Generator().manual_seed(0)
    images = [torch.rand(3, size, size, generator=g).to(device) for _ in range(n)]
    for name in ["fasterrcnn_mobilenet_v3_large_320_fpn"] if dry else DETECTORS:
        say(row(name, measure(name, images, samples, 1 if dry else 5, loop=not dry, sync=lambda: sync(device),
                              warm=not dry, proposals=64 if dry else None)))


def call_cost_table(device, dry: bool, say):
    """Issue 23's figures where launches cost most: first/steady, kernels and dispatches per call,
    time outside ops, and a steady call by phase."""
    from call_cost import first_vs_steady, norms_fn, op_counts, phases, where_time_goes
    from gradnorm import build_case, floor_fn
    say("\n## The cost that is not arithmetic (first call ÷ steady; aten ops per call; us per steady call)")
    say(f"{'model':<12} {'first/steady':>12} {'kernels plain':>13} {'kernels alcli':>13} {'dispatches plain':>16} "
        f"{'dispatches alcli':>16} {'wall plain':>10} {'wall alcli':>10} {'outside ops alcli':>17}")
    by_phase = {}
    for name in ("simple",) if dry else ("simple", "resnet18", "bert-small"):
        case = build_case(name, device)
        timing = first_vs_steady(case, device, 1 if dry else 5)
        plain_k, plain_all = op_counts(floor_fn(case))
        ours_k, ours_all = op_counts(norms_fn(case, case.model))
        calls = 2 if dry else 20
        plain = where_time_goes(floor_fn(case), device, calls)
        ours = where_time_goes(norms_fn(case, case.model), device, calls)
        say(f"{name:<12} {timing['first_x_steady']:>11.2f}x {plain_k:>13} {ours_k:>13} {plain_all:>16} {ours_all:>16} "
            f"{plain['wall']:>10.0f} {ours['wall']:>10.0f} {ours['rest (Python, dispatch)']:>17.0f}")
        by_phase[name] = phases(norms_fn(case, case.model), device, 2 if dry else 50)
    say("\nsteady call by phase, us (benchmarks/call_cost.py phases)")
    say(f"{'model':<12} " + " ".join(f"{k:>10}" for k in next(iter(by_phase.values()))))
    for name, parts in by_phase.items():
        say(f"{name:<12} " + " ".join(f"{v:>10.0f}" for v in parts.values()))


def compile_table(device, dry: bool, say):
    """--compile against the plain ghost call (benchmarks/compiled.py): with CUDA graphs (what
    --compile does on CUDA) and, for the seed model, inductor's kernels without them."""
    import compiled
    from alcli.gradnorm import compiled as engine_compiled
    from gradnorm import build_case
    say("\n## --compile (benchmarks/compiled.py): steady call ÷ floor, ghost and compiled; launches per call")
    say(compiled.HEADER)
    # dry: the MLP, whose compile on a cold cache takes 14 s against the seed model's 21 s
    runs = [("mlp", 1)] if dry else [("simple", 1), ("resnet18", 1), ("bert-small", 1), ("simple", 10)]
    for name, k in runs:
        say(compiled.row(f"{name}{' egl' + str(k) if k > 1 else ''}",
                         compiled.compare(build_case(name, device), device, k, 1 if dry else 11)))
    if device.type == "cuda":  # the same kernels launched one by one
        engine_compiled.CUDA_MODE = None
        engine_compiled._compiled.clear()
        say(compiled.row("simple, no graphs", compiled.compare(build_case("simple", device), device, 1, 11)))
        engine_compiled.CUDA_MODE = "reduce-overhead"
        engine_compiled._compiled.clear()


def egl_chunks_table(device, dry: bool, say):
    """Whether CUDA, like the CPU, should split EGL's K target sets over several backwards."""
    from egl_chunks import limits_table
    say("\n## EGL: target sets per vmapped backward (median s per call; 2^v: K x largest tap <= 2^v elements)")
    limits_table(["simple"] if dry else ["resnet18", "seg:16:128"], [None, 24, 21, 0], 1 if dry else 3, device, say)


def tasks_table(device, dry: bool, say):
    """Issue 18's speed targets where a GPU is lent: gradnorm ≤ 1.5x the floor per task."""
    from tasks import measure
    say("\n## Tasks: seconds per batch; gradnorm and EGL-8 ÷ the floor, EGL-8 ÷ 8 plain backwards")
    say(f"{'task':22} {'floor':>8} {'gradnorm':>9} {'egl8':>8} {'gn/floor':>9} {'egl/gn':>7} {'egl/(floor x 8)':>16}")
    for task in ("segmentation", "token-classification"):
        shape = (2, 32 if task == "segmentation" else 16) if dry else (None, None)
        t = measure(task, 1 if dry else 5, *shape, device=device)
        say(f"{task:22} {t['floor']:8.4f} {t['gradnorm']:9.4f} {t['egl8']:8.4f} {t['gradnorm'] / t['floor']:8.2f}x "
            f"{t['egl8'] / t['gradnorm']:6.2f}x {t['egl8'] / t['floor_s']:15.2f}x")


def causal_lm_table(device, dry: bool, say):
    """Issue 36's targets on the device: gradnorm ÷ the floor at T = 512 and, on CUDA, the peak
    memory of each above the model at T = 2048 (a first gradnorm call at that length, its layout
    probe included). The CPU's figures are benchmarks/causal_lm.py's."""
    from causal_lm import batch, build, floor, gradnorm
    t_time, t_memory, b = (16, 32, 2) if dry else (512, 2048, 8)
    say(f"\n## Causal LMs (benchmarks/causal_lm.py): gradnorm ÷ the floor at T = {t_time}, B = {b}; "
        f"peak memory above the model at T = {t_memory}, B = 2")

    def on_device(length: int, n: int):
        inputs, targets = batch(model, n, length)
        return {k: v.to(device) for k, v in inputs.items()}, targets.to(device)

    for name in ("tiny-llama",) if dry else ("gpt2-small", "tiny-llama"):
        model = build(name).to(device)
        inputs, targets = on_device(t_time, b)
        gradnorm(model, inputs, targets)  # ghost's first call probes the model
        f = timed(lambda: floor(model, inputs, targets), device, 3.0, 10, dry)
        g = timed(lambda: gradnorm(model, inputs, targets), device, 3.0, 10, dry)
        line = f"{name:11} floor {f * 1e3:9.1f} ms  gradnorm {g * 1e3:9.1f} ms  {g / f:5.2f}x"
        if device.type == "cuda":
            peaks = {}
            for what, fn in (("floor", floor), ("gradnorm", gradnorm)):
                model.zero_grad(set_to_none=True)
                inputs, targets = on_device(t_memory, 2)
                torch.cuda.empty_cache()
                base = torch.cuda.memory_allocated(device)
                torch.cuda.reset_peak_memory_stats(device)
                try:
                    fn(model, inputs, targets)
                    sync(device)
                    peaks[what] = (torch.cuda.max_memory_allocated(device) - base) / 2 ** 20
                except torch.cuda.OutOfMemoryError:
                    peaks[what] = float("nan")
            model.zero_grad(set_to_none=True)
            line += (f"   peak MiB: floor {peaks['floor']:8.0f}  gradnorm {peaks['gradnorm']:8.0f}  "
                     f"{peaks['gradnorm'] / peaks['floor']:5.2f}x")
        say(line)
        del model


# ------------------------------------------------------------------------------------------ main
def sections(deadline: float = math.inf) -> dict:
    """name -> section(device, dry, say), in the order a whole run goes through them; `deadline`
    (time.perf_counter()) stops the timing table's contenders on a GPU."""
    return {"cuda-tests": cuda_tests, "timing": functools.partial(timing_table, deadline=deadline),
            "precision": precision_table, "detection": detection_table, "end-to-end": end_to_end,
            "call-cost": call_cost_table, "compile": compile_table, "egl-chunks": egl_chunks_table,
            "tasks": tasks_table, "causal-lm": causal_lm_table}


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dry-run", action="store_true", help="the script on the CPU at tiny sizes")
    ap.add_argument("--only", nargs="+", choices=list(sections()), metavar="SECTION",
                    help=f"run these sections only, in the script's order ({', '.join(sections())})")
    ap.add_argument("--out", help="the results file (default benchmarks/results/gpu-<device>.txt when every "
                                  "section runs; none for --dry-run or --only)")
    ap.add_argument("--budget", type=float, default=420.0, help="seconds before timing stops (default 420)")
    return ap.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    if not args.dry_run and not torch.cuda.is_available():
        raise SystemExit("no CUDA device: run with --dry-run to check the script on the CPU")
    device = torch.device("cpu" if args.dry_run else "cuda")
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
        torch.backends.cudnn.benchmark = True
    lines: list[str] = []

    def say(line=""):
        print(line, flush=True)
        lines.append(line)

    start = time.perf_counter()
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU (dry run)"
    say(f"# alcli on {name}: torch {torch.__version__}")
    for section, run in sections(start + args.budget).items():
        if args.only is None or section in args.only:
            run(device, args.dry_run, say)
    say(f"\n(total {time.perf_counter() - start:.0f} s)")
    whole = not args.dry_run and args.only is None
    out = args.out or (ROOT / "benchmarks" / "results" / f"gpu-{device.type}.txt" if whole else None)
    if out:
        Path(out).write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
