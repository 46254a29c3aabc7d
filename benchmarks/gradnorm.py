"""Per-example gradient norms, side by side: the floor, every alcli method and peer libraries.

In one process, per model, in interleaved rounds (each round runs every contender once, in a
rotating order; the median is reported): the floor (plain batched forward + backward of the summed
loss over all parameters, then zero grads), alcli's methods (auto, ghost, replicate, vmap, loop) and,
when installed, Opacus GradSampleModule (hooks), Opacus ghost clipping's per-sample norms, BackPACK
BatchL2Grad and plain torch.func. Every result is checked against alcli's loop (rtol 1e-3).
Then peak memory of the floor vs auto on resnet18, each in a fresh subprocess, and the targets of
issue 2 (and of issue 11 for its models) with PASS/MISS.

    python benchmarks/gradnorm.py [--device cpu|cuda] [--rounds N] [--models simple,mlp,...]
                                  [--quick] [--json OUT] [--no-memory]
    python benchmarks/gradnorm.py --models issue11   # bert-small, gpt2-small, swin_t, lstm; batch 32
    python benchmarks/gradnorm.py --ops     # aten ops per batch (issue 9's targets), no timing
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
import warnings
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # for _peers when run as a script
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # this checkout's alcli

from alcli.gradnorm import UnsupportedModel, auto_choice, per_example_grad_norms  # noqa: E402
from alcli.gradnorm import select_params  # noqa: E402
from _peers import forward_logits  # noqa: E402

BATCH = 64  # the default models' batch (issue 2)
RTOL = 1e-3
ALCLI_METHODS = ("auto", "ghost", "replicate", "vmap", "loop")
ALL_MODELS = ("simple", "simple-conv2", "mlp", "resnet18", "transformer")  # the default run
ISSUE11_BATCH = 32
ISSUE11_MODELS = ("bert-small", "gpt2-small", "swin_t", "lstm")  # --models issue11
GROUPS = {"issue11": ISSUE11_MODELS}
# issue 53's first calls: torchvision's resnet18 and mobilenet_v3_small at batch 8, 3x32x32 (the op counts' batch)
SMALL_BATCH_MODELS = ("resnet18-b8", "mobilenet-b8")
KNOWN_MODELS = ALL_MODELS + ISSUE11_MODELS + SMALL_BATCH_MODELS

# torch.func's fallback for attention kernels without a batching rule warns on every call
warnings.filterwarnings("ignore", message="There is a performance drop")


# ----------------------------------------------------------------------------------------- models
class SimpleModel(nn.Module):
    """The seed's model (shared/seeds/000): input 3x10x10."""

    def __init__(self, num_classes=10):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 10, kernel_size=3, padding=1, bias=False)          # 10x10x10
        self.conv2 = nn.Conv2d(10, 20, kernel_size=3, stride=2, padding=1, bias=False)  # 20x5x5
        self.fc = nn.Linear(20 * 5 * 5, num_classes, bias=False)

    def forward(self, x):
        x = self.conv1(x)
        x = self.conv2(x)
        x = x.view(x.shape[0], -1)
        return self.fc(x)


class TextTransformer(nn.Module):
    """Embedding (vocab 1000, d 128) + 2 batch_first encoder layers + LayerNorm + mean pool + head."""

    def __init__(self, vocab=1000, d=128, classes=10):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        layer = nn.TransformerEncoderLayer(d_model=d, nhead=4, dim_feedforward=256, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, classes)

    def forward(self, tokens):  # [B, T]
        h = self.norm(self.encoder(self.emb(tokens)))  # [B, T, d]
        return self.head(h.mean(1))


class LSTMClassifier(nn.Module):
    """Issue 11's recurrent model: Embedding(1000, 64) -> LSTM(64, 128) -> last time step -> Linear."""

    def __init__(self, vocab=1000, d=64, hidden=128, classes=10):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.lstm = nn.LSTM(d, hidden, batch_first=True)
        self.head = nn.Linear(hidden, classes)

    def forward(self, tokens):  # [B, T]
        h, _ = self.lstm(self.emb(tokens))  # [B, T, hidden]
        return self.head(h[:, -1])


def padded_tokens(batch: int, length: int, g: torch.Generator, vocab: int = 1000) -> dict:
    """{"input_ids", "attention_mask"} [batch, length]: token ids 1..vocab-1, and every fourth row
    padded at the end (mask 0, pad id 0) to a length between length/2 and length-1."""
    ids = torch.randint(1, vocab, (batch, length), generator=g)
    lengths = torch.full((batch,), length)
    lengths[::4] = torch.randint(length // 2, length, (len(lengths[::4]),), generator=g)
    mask = (torch.arange(length)[None, :] < lengths[:, None]).long()
    return {"input_ids": ids * mask, "attention_mask": mask}


def to_device(inputs, device):
    if isinstance(inputs, dict):
        return {k: v.to(device) for k, v in inputs.items()}
    return inputs.to(device)


@dataclass
class Case:
    name: str
    title: str
    model: nn.Module
    inputs: torch.Tensor | dict       # a tensor, or a dict of tensors passed as keyword arguments
    targets: torch.Tensor
    params: list[str] | None = None  # alcli's params= selection
    batch: int = BATCH
    group: str = "issue2"            # whose targets apply: issue2 (the default models) or issue11


def build_case(name: str, device: torch.device) -> Case:
    """Deterministic model (eval mode) and a batch for one benchmark case: 64 examples for the
    default models (issue 2), 32 for issue 11's."""
    if name in ISSUE11_MODELS:
        return build_issue11_case(name, device)
    if name in SMALL_BATCH_MODELS:
        return build_small_batch_case(name, device)
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    y = torch.randint(0, 10, (BATCH,), generator=g)
    params = None
    if name in ("simple", "simple-conv2"):
        model, x = SimpleModel(), torch.rand(BATCH, 3, 10, 10, generator=g)
        title = "seed SimpleModel, 3x10x10"
        if name == "simple-conv2":
            params, title = ["conv2"], "seed SimpleModel, params=['conv2'] (the seed's case)"
    elif name == "mlp":
        model = nn.Sequential(nn.Flatten(), nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 256),
                              nn.ReLU(), nn.Linear(256, 10))
        x, title = torch.randn(BATCH, 784, generator=g), "MLP 784-512-256-10"
    elif name == "resnet18":
        import torchvision
        model = torchvision.models.resnet18(weights=None, num_classes=10)
        x, title = torch.randn(BATCH, 3, 32, 32, generator=g), "torchvision resnet18, 3x32x32"
    elif name == "transformer":
        model = TextTransformer()
        x = torch.randint(0, 1000, (BATCH, 64), generator=g)
        title = "text transformer (emb 1000x128, 2 layers, 4 heads, T=64)"
    else:
        raise SystemExit(f"unknown model '{name}'; choose from {', '.join(KNOWN_MODELS)}")
    model = model.to(device).eval()
    return Case(name, title, model, x.to(device), y.to(device), params)


def build_small_batch_case(name: str, device: torch.device) -> Case:
    """resnet18 or mobilenet_v3_small, random weights, eval mode, batch 8 of 3x32x32, 10 classes."""
    import torchvision
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    arch = {"resnet18-b8": "resnet18", "mobilenet-b8": "mobilenet_v3_small"}[name]
    model = getattr(torchvision.models, arch)(weights=None, num_classes=10).to(device).eval()
    x, y = torch.randn(8, 3, 32, 32, generator=g), torch.randint(0, 10, (8,), generator=g)
    return Case(name, f"torchvision {arch}, 3x32x32, batch 8", model, x.to(device), y.to(device), batch=8)


def build_issue11_case(name: str, device: torch.device) -> Case:
    """Issue 11's models, random weights, eval mode, batch 32, 10 classes."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    b = ISSUE11_BATCH
    y = torch.randint(0, 10, (b,), generator=g)
    if name == "bert-small":
        from transformers import BertConfig, BertForSequenceClassification
        model = BertForSequenceClassification(BertConfig(
            vocab_size=1000, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
            intermediate_size=256, max_position_embeddings=64, num_labels=10))
        x = padded_tokens(b, 16, g)
        title = "HF BertForSequenceClassification (hidden 64, 2 layers, 2 heads), dict inputs T=16, padded"
    elif name == "gpt2-small":
        from transformers import GPT2Config, GPT2ForSequenceClassification
        model = GPT2ForSequenceClassification(GPT2Config(
            vocab_size=1000, n_embd=64, n_layer=2, n_head=2, n_positions=64, num_labels=10,
            pad_token_id=0, bos_token_id=1, eos_token_id=1))  # bos/eos inside the vocabulary (unused here)
        x = padded_tokens(b, 16, g)
        title = "HF GPT2ForSequenceClassification (n_embd 64, 2 layers, 2 heads), dict inputs T=16, padded"
    elif name == "swin_t":
        import torchvision
        model = torchvision.models.swin_t(weights=None, num_classes=10)
        x, title = torch.randn(b, 3, 64, 64, generator=g), "torchvision swin_t, 3x64x64"
    elif name == "lstm":
        model = LSTMClassifier()
        x = torch.randint(0, 1000, (b, 32), generator=g)
        title = "Embedding 1000x64 -> LSTM(64, 128) -> last step -> Linear, T=32"
    else:
        raise SystemExit(f"unknown model '{name}'; choose from {', '.join(KNOWN_MODELS)}")
    model = model.to(device).eval()
    return Case(name, title, model, to_device(x, device), y.to(device), batch=b, group="issue11")


# ------------------------------------------------------------------------------------ contenders
def floor_fn(case: Case):
    model, x, y = case.model, case.inputs, case.targets

    def run():  # model(**x) for a dict of inputs; the logits of an output object
        F.cross_entropy(forward_logits(model, x), y, reduction="none").sum().backward()
        model.zero_grad(set_to_none=True)
    return run


def alcli_fn(case: Case, method: str):
    return lambda: per_example_grad_norms(case.model, case.inputs, case.targets, params=case.params,
                                          method=method)


def sync(device: torch.device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn, device):
    sync(device)
    t = time.perf_counter()
    out = fn()
    sync(device)
    return out, time.perf_counter() - t


def one_line(err: BaseException) -> str:
    lines = str(err).strip().splitlines()
    text = lines[0] if lines else ""
    return f"{type(err).__name__}: {text[:160]}"


@dataclass
class Row:
    name: str
    kind: str                     # floor | alcli | peer
    fn: object = None
    status: str = "ok"            # ok | n/a | failed | missing
    note: str = ""                # why it did not run, or how a peer was adapted
    match: str = ""               # "ref", "yes", "NO (...)", ""
    matches: bool | None = None
    max_rel: float | None = None
    reps: int = 1                 # calls per timed sample (fast contenders: less timer noise)
    cold: bool = False            # too slow to repeat: its one (warm-up) call is its timing
    max_rounds: int = 0
    budgeted: bool = True         # stops after ~budget seconds of timed calls
    times: list = field(default_factory=list)  # seconds per call, one per round

    @property
    def median(self):
        return statistics.median(self.times) if self.times else None


def check(norms: torch.Tensor, ref: torch.Tensor, row: Row):
    got = norms.detach().to("cpu", torch.float64).flatten()
    if got.shape != ref.shape:
        row.matches, row.match = False, f"NO (shape {tuple(got.shape)})"
        return
    rel = ((got - ref).abs() / ref.abs().clamp_min(1e-12)).max().item()
    ok = bool(torch.allclose(got, ref, rtol=RTOL, atol=1e-6 * ref.abs().max().item()))
    row.max_rel, row.matches = rel, ok
    row.match = "yes" if ok else f"NO (max rel err {rel:.1e})"


def quiet(fn):
    """Peers warn on every call (hooks, unextended containers); keep the table readable."""
    def run():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return fn()
    return run


@dataclass
class Timing:
    rounds: int        # timed rounds for floor and auto (others at most this many)
    loop_rounds: int   # timed rounds for the loop oracle
    budget_s: float    # seconds of timed calls after which a contender stops (not floor/auto)
    slow_s: float      # a first call this slow is not repeated: it is the contender's one timing
    sample_s: float    # fast contenders repeat calls within one sample to last about this long


def run_case(case: Case, tm: Timing, device, peers: bool) -> list[Row]:
    rows: list[Row] = [Row("floor (fwd+bwd, summed loss)", "floor", floor_fn(case), budgeted=False)]
    rows += [Row(f"alcli {m}", "alcli", alcli_fn(case, m), budgeted=(m != "auto")) for m in ALCLI_METHODS]
    if peers:
        import _peers
        names = select_params(case.model, case.params).names
        for pname, factory in _peers.PEERS.items():
            row = Row(pname, "peer")
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    run = factory(case.model, case.inputs, case.targets, names)
                row.fn, row.note = quiet(run), getattr(run, "note", "")
            except _peers.PeerMissing as err:
                row.status, row.note = "missing", f"not installed ({one_line(err)})"
            except Exception as err:  # a peer's own failure, reported as is
                row.status, row.note = "failed", one_line(err)
            rows.append(row)
    for row in rows:
        row.max_rounds = tm.loop_rounds if row.name == "alcli loop" else tm.rounds

    # Warm-up, untimed: alcli's loop first (it is the reference), then everyone once; the result
    # of that first call is the one checked. A second call sizes the repeats of fast contenders.
    loop_row = next(r for r in rows if r.name == "alcli loop")
    ref = None
    for row in [loop_row] + [r for r in rows if r is not loop_row]:
        if row.status != "ok":
            continue
        try:
            out, t1 = timed(row.fn, device)
        except UnsupportedModel as err:
            row.status, row.note = "n/a", str(err).strip().splitlines()[0][:200]
            continue
        except Exception as err:
            row.status, row.note = "failed", one_line(err)
            continue
        if row is loop_row:
            ref, row.match = out.detach().to("cpu", torch.float64).flatten(), "ref"
        elif row.kind != "floor" and ref is not None:
            check(out, ref, row)
        if t1 >= tm.slow_s and row.budgeted:
            row.cold, row.times = True, [t1]
            continue
        _, t2 = timed(row.fn, device)
        row.reps = max(1, min(100, math.ceil(tm.sample_s / max(t2, 1e-6))))

    def sample(row):
        def calls():
            for _ in range(row.reps):
                row.fn()
        _, dt = timed(calls, device)
        return dt / row.reps

    # Interleaved rounds: each round runs every live contender once, in a rotating order.
    live = [r for r in rows if r.status == "ok" and not r.cold]
    for rnd in range(tm.rounds):
        if not live:
            break
        k = rnd % len(live)
        for row in live[k:] + live[:k]:
            try:
                row.times.append(sample(row))
            except Exception as err:
                row.status, row.note, row.times = "failed", f"in round {rnd + 1}: {one_line(err)}", []
        live = [r for r in live if r.status == "ok" and len(r.times) < r.max_rounds
                and not (r.budgeted and sum(r.times) * r.reps >= tm.budget_s)]
    return rows


def process_warmup(device):
    """Pay one-time costs (torch.func and autograd initialisation) before anything is timed, so
    that a slow contender's single cold call measures the method, not the process start."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 3)).to(device).eval()
    x, y = torch.randn(4, 8, device=device), torch.randint(0, 3, (4,), device=device)
    for method in ALCLI_METHODS:
        per_example_grad_norms(model, x, y, method=method)
    from torch.func import functional_call, grad, vmap
    params = {n: p.detach() for n, p in model.named_parameters()}
    vmap(grad(lambda p, xi, yi: F.cross_entropy(functional_call(model, p, (xi[None],)), yi[None])),
         in_dims=(None, 0, 0))(params, x, y)


# ------------------------------------------------------------------------------------- reporting
def print_table(case: Case, rows: list[Row], device) -> dict:
    floor = rows[0].median
    print(f"\n## {case.name}: {case.title}, batch {case.batch}, {device.type}")
    choice = auto_choice(case.model, case.params)
    if choice:
        print(f"   auto chose '{choice[0]}' ({choice[1]})")
    head = (f"{'contender':<30} {'ms/batch':>10} {'time/floor':>11} {'examples/s':>11}  "
            f"{'matches loop':<24} {'n':>4}")
    print(head)
    print("-" * len(head))
    out = {"title": case.title, "params": case.params, "batch": case.batch, "group": case.group,
           "auto_choice": list(choice) if choice else None, "contenders": {}}
    notes = []
    for row in rows:
        med = row.median
        if row.status == "ok" and med is not None:
            n = f"{len(row.times)}{'*' if row.cold else ''}"
            ratio = f"{med / floor:10.2f}x" if floor else f"{'-':>11}"
            print(f"{row.name:<30} {med * 1e3:10.1f} {ratio} {case.batch / med:11.1f}  "
                  f"{row.match or '-':<24} {n:>4}")
            if row.note:
                notes.append(f"   {row.name}: {row.note}")
        else:
            label = {"missing": "skipped"}.get(row.status, row.status)
            print(f"{row.name:<30} {label}: {row.note}")
            if row.match.startswith("NO"):
                notes.append(f"   {row.name}: its result did not match loop: {row.match}")
        out["contenders"][row.name] = {
            "kind": row.kind, "status": row.status, "note": row.note, "median_s": med,
            "time_over_floor": (med / floor) if med and floor else None,
            "examples_per_s": (case.batch / med) if med else None, "matches_loop": row.matches,
            "max_rel_err": row.max_rel, "rounds": len(row.times), "calls_per_round": row.reps,
            "cold_single_call": row.cold, "times_s": row.times}
    if any(r.cold for r in rows):
        notes.append("   * too slow to repeat: its single (first, cold) call is its timing")
    for line in notes:
        print(line)
    return out


def _short(text: str, n: int = 150) -> str:
    return text if len(text) <= n else text[:n - 3] + "..."


# Per group: (auto's time at most this many times the floor's, the fastest matching peer's time
# over auto's: at least this ("auto >= 1.3x faster", issue 2), or more than this ("auto faster",
# issue 11)).
TARGETS = {"issue2": {"floor_x": 1.25, "peer_x": 1.3, "strict": False},
           "issue11": {"floor_x": 2.0, "peer_x": 1.0, "strict": True}}


def targets_summary(results: dict, memory: dict | None) -> list[dict]:
    """Each model's group's targets (issue 2 for the default models, issue 11 for its group), each
    PASS/MISS with its numbers (n/a only when it cannot be measured); "issue" says whose."""
    lines = []
    issue = "issue2"

    def add(target, verdict, detail):
        lines.append({"issue": issue, "target": target, "verdict": verdict, "detail": detail})

    for name, res in results.items():
        issue = res.get("group", "issue2")
        tg = TARGETS[issue]
        floor_target = (f"{name}: auto within {tg['floor_x']:g}x of the floor" if issue == "issue2"
                        else f"{name}: auto at most {tg['floor_x']:g}x the floor")
        peer_target = (f"{name}: auto >= {tg['peer_x']:g}x faster than the fastest peer" if not tg["strict"]
                       else f"{name}: auto faster than the fastest peer that runs and matches loop")
        c = res["contenders"]
        auto, floor = c.get("alcli auto", {}), c["floor (fwd+bwd, summed loss)"]
        a = auto.get("median_s")
        if issue == "issue11":
            choice = res.get("auto_choice")
            add(f"{name}: auto chose", "info",
                f"'{choice[0]}' ({_short(choice[1])})" if choice else "nothing recorded (auto did not run)")
        if floor["median_s"] is None:
            add(floor_target, "MISS", f"the floor did not run: {floor['note']}")
            continue
        if a is None:
            add(floor_target, "MISS", f"auto did not run: {auto.get('note')}")
            continue
        if auto.get("matches_loop") is False:
            add(f"{name}: auto matches loop", "MISS", f"max rel err {auto['max_rel_err']:.1e}")
        r = a / floor["median_s"]
        add(floor_target, "PASS" if r <= tg["floor_x"] else "MISS",
            f"auto {a * 1e3:.1f} ms / floor {floor['median_s'] * 1e3:.1f} ms = {r:.2f}x")
        peers = {k: v for k, v in c.items() if v["kind"] == "peer" and v["median_s"] is not None}
        good = {k: v for k, v in peers.items() if v["matches_loop"]}
        if good:
            best = min(good, key=lambda k: good[k]["median_s"])
            s = good[best]["median_s"] / a
            ok = s > tg["peer_x"] if tg["strict"] else s >= tg["peer_x"]
            add(peer_target, "PASS" if ok else "MISS",
                f"{best} {good[best]['median_s'] * 1e3:.1f} ms / auto {a * 1e3:.1f} ms = {s:.2f}x")
        else:
            add(peer_target, "n/a", "no peer ran and matched loop")
        for k, v in peers.items():
            if not v["matches_loop"] and v["median_s"] < a * max(tg["peer_x"], 1.3):
                add(f"{name}: note", "info", f"{k} ran {v['median_s'] * 1e3:.1f} ms but disagrees with loop")
        if name == "simple-conv2":
            add("simple-conv2 (seed's case): auto at or under the floor", "PASS" if r <= 1.0 else "MISS",
                f"{r:.2f}x of the floor")
        if name == "resnet18":
            lp = c.get("alcli loop", {}).get("median_s")
            if lp is None:
                add("resnet18: auto >= 10x faster than loop", "MISS", "loop did not run")
            else:
                add("resnet18: auto >= 10x faster than loop", "PASS" if lp / a >= 10 else "MISS",
                    f"loop {lp * 1e3:.0f} ms / auto {a * 1e3:.1f} ms = {lp / a:.1f}x")
    issue = "issue2"
    if memory is not None:
        f, a = memory.get("floor"), memory.get("auto")
        if f and a and f.get("peak_bytes") and a.get("peak_bytes") is not None:
            r = a["peak_bytes"] / f["peak_bytes"]
            add("resnet18 memory: auto peak <= 1.5x the floor's", "PASS" if r <= 1.5 else "MISS",
                f"auto {a['peak_bytes'] / 2**20:.0f} MiB / floor {f['peak_bytes'] / 2**20:.0f} MiB = {r:.2f}x "
                f"({f['metric']})")
        else:
            add("resnet18 memory: auto peak <= 1.5x the floor's", "MISS", f"probe failed: {memory}")
    return lines


# ---------------------------------------------------------------------------------------- memory
def _rss() -> int:
    try:
        import psutil
        return psutil.Process().memory_info().rss
    except ImportError:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _maxrss() -> int:
    import resource
    kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return kb if sys.platform == "darwin" else kb * 1024


def memory_probe(which: str, device: torch.device) -> dict:
    """In a fresh process: peak memory increase over the baseline while running `which` twice."""
    case = build_case("resnet18", device)
    fn = floor_fn(case) if which == "floor" else alcli_fn(case, "auto")
    if device.type == "cuda":
        sync(device)
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
        for _ in range(2):
            fn()
        sync(device)
        peak = torch.cuda.max_memory_allocated(device) - base
        return {"which": which, "peak_bytes": peak, "metric": "torch.cuda.max_memory_allocated"}
    import gc
    gc.collect()
    base, maxrss_before = _rss(), _maxrss()
    sampled = [base]
    stop = threading.Event()

    def sample():
        while not stop.is_set():
            sampled[0] = max(sampled[0], _rss())
            time.sleep(0.0005)

    th = threading.Thread(target=sample, daemon=True)
    th.start()
    for _ in range(2):
        fn()
    stop.set()
    th.join()
    peak = max(sampled[0], _rss())
    maxrss_after = _maxrss()
    if maxrss_after > maxrss_before:  # the kernel's own high-water mark, when this run raised it
        peak = max(peak, maxrss_after)
    return {"which": which, "peak_bytes": peak - base, "baseline_rss": base,
            "metric": "CPU RSS increase (psutil sampling + ru_maxrss)"}


def run_memory(device: torch.device) -> dict:
    out = {}
    for which in ("floor", "auto"):
        cmd = [sys.executable, os.path.abspath(__file__), "--memory-probe", which, "--device", device.type,
               "--threads", str(torch.get_num_threads())]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        try:
            out[which] = json.loads(proc.stdout.strip().splitlines()[-1])
        except (IndexError, json.JSONDecodeError):
            err = (proc.stderr.strip().splitlines() or ["no output"])[-1]
            out[which] = {"which": which, "peak_bytes": None, "error": err}
    return out


# ------------------------------------------------------------------------------------------ main
# ------------------------------------------------------------------------------ ops per batch
class OpCounter(TorchDispatchMode):
    """Counts aten ops, as a GPU would launch kernels: views (view, _unsafe_view, permute,
    expand, t, transpose, ...), detach and alias are free and not counted (with every=True: all
    dispatches, those too)."""

    FREE = {"detach", "alias", "lift_fresh", "_unsafe_view"}

    def __init__(self, every: bool = False):
        super().__init__()
        self.count = 0
        self.every = every

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if self.every or (not func.is_view and func.overloadpacket.__name__ not in self.FREE):
            self.count += 1
        return func(*args, **(kwargs or {}))


def count_ops(fn) -> int:
    fn()
    fn()  # first calls probe (layout, checks): counted is a later batch
    with OpCounter() as counter:
        fn()
    return counter.count


def ops_table(batch: int = 8, size: int = 32, classes: int = 10) -> list[dict]:
    """Issue 9's op targets: gradnorm <= 3x a plain forward+backward of the summed loss, exact EGL
    over 10 classes <= 1.5x gradnorm, on resnet18 and mobilenet_v3_small at 32x32, batch 8."""
    import torchvision
    from alcli.gradnorm import grad_norms_per_target
    rows = []
    for name in ("resnet18", "mobilenet_v3_small"):
        torch.manual_seed(0)
        model = getattr(torchvision.models, name)(num_classes=classes).eval()
        x = torch.randn(batch, 3, size, size)
        labels = torch.randint(0, classes, (batch,))

        def plain():
            model.zero_grad(set_to_none=True)
            F.cross_entropy(model(x), labels, reduction="sum").backward()

        def gradnorm():
            per_example_grad_norms(model, x, labels, method="ghost")

        def egl():  # every class, most probable first, as `--strategy egl --top-classes 0` asks
            grad_norms_per_target(model, x, lambda logits: list(logits.argsort(1, descending=True).T),
                                  method="ghost")
        counts = {fn.__name__: count_ops(fn) for fn in (plain, gradnorm, egl)}
        model.zero_grad(set_to_none=True)
        rows.append({"model": name, **counts, "gradnorm_x_plain": counts["gradnorm"] / counts["plain"],
                     "egl_x_gradnorm": counts["egl"] / counts["gradnorm"]})
    return rows


def print_ops(rows: list[dict]) -> None:
    print("aten ops per batch (batch 8, 3x32x32, 10 classes; views, detach, alias not counted)")
    print(f"{'model':<20} {'plain f+b':>9} {'gradnorm':>9} {'EGL x10':>8} {'gn/plain':>9} {'EGL/gn':>7}")
    for r in rows:
        print(f"{r['model']:<20} {r['plain']:>9} {r['gradnorm']:>9} {r['egl']:>8} "
              f"{r['gradnorm_x_plain']:>8.2f}x {r['egl_x_gradnorm']:>6.2f}x")
    for r in rows:
        for what, value, limit in (("gradnorm <= 3x plain", r["gradnorm_x_plain"], 3.0),
                                   ("EGL x10 <= 1.5x gradnorm", r["egl_x_gradnorm"], 1.5)):
            print(f"   {'PASS' if value <= limit else 'MISS':<5} {r['model']}: {what} ({value:.2f}x)")


def parse_models(spec: str) -> list[str]:
    """A comma list of model names and group names (issue11), groups expanded, first seen kept."""
    models = []
    for m in (m.strip() for m in spec.split(",")):
        if not m:
            continue
        if m not in KNOWN_MODELS and m not in GROUPS:
            raise SystemExit(f"unknown model '{m}'; choose from {', '.join(KNOWN_MODELS)} "
                             f"or a group: {', '.join(GROUPS)}")
        for name in GROUPS.get(m, (m,)):
            if name not in models:
                models.append(name)
    return models


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=("cpu", "cuda"),
                    default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--rounds", type=int, default=None, help="timed rounds per model (default 7, quick 3)")
    ap.add_argument("--loop-rounds", type=int, default=1, help="timed rounds for the slow loop oracle")
    ap.add_argument("--budget", type=float, default=None,
                    help="seconds of timed calls after which a contender other than floor/auto stops "
                         "(default 12, quick 4)")
    ap.add_argument("--slow", type=float, default=None,
                    help="a contender whose first call takes this long is timed by that call alone "
                         "(default 5, quick 2; never floor or auto)")
    ap.add_argument("--models", default=",".join(ALL_MODELS),
                    help=f"comma list of {', '.join(KNOWN_MODELS)}, or a group: issue11 "
                         f"({', '.join(ISSUE11_MODELS)}; batch 32) (default: {', '.join(ALL_MODELS)})")
    ap.add_argument("--quick", action="store_true", help="fewer rounds, a smoke run")
    ap.add_argument("--no-peers", action="store_true", help="skip Opacus, BackPACK and torch.func")
    ap.add_argument("--no-memory", action="store_true", help="skip the resnet18 memory probes")
    ap.add_argument("--threads", type=int, default=None,
                    help="torch.set_num_threads(N) (default: torch's own default, left alone)")
    ap.add_argument("--json", metavar="OUT", help="also write all results as JSON")
    ap.add_argument("--memory-probe", choices=("floor", "auto"), help=argparse.SUPPRESS)
    ap.add_argument("--ops", action="store_true", help="only count aten ops per batch (issue 9's targets)")
    args = ap.parse_args()
    if args.ops:
        print_ops(ops_table())
        return
    device = torch.device(args.device)
    if args.threads:
        torch.set_num_threads(args.threads)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: CUDA is not available")

    if args.memory_probe:
        print(json.dumps(memory_probe(args.memory_probe, device)))
        return

    rounds = args.rounds or (3 if args.quick else 7)
    tm = Timing(rounds=rounds, loop_rounds=min(args.loop_rounds, rounds),
                budget_s=args.budget or (4.0 if args.quick else 12.0),
                slow_s=args.slow or (2.0 if args.quick else 5.0),
                sample_s=0.02 if args.quick else 0.05)
    models = parse_models(args.models)
    dev_name = torch.cuda.get_device_name(device) if device.type == "cuda" else _cpu_name()
    batches = sorted({ISSUE11_BATCH if m in ISSUE11_MODELS else BATCH for m in models}, reverse=True)
    print(f"torch {torch.__version__}, device {device.type} ({dev_name}), {torch.get_num_threads()} threads, "
          f"batch {'/'.join(map(str, batches))}, {rounds} rounds (loop {tm.loop_rounds}), median per call reported")
    print(_versions())
    print("floor = one batched forward + backward of the summed per-example loss over ALL parameters, "
          "then zero grads; n = timed rounds (fast contenders repeat calls within a round)")

    t_start = time.perf_counter()
    process_warmup(device)
    results = {}
    for name in models:
        case = build_case(name, device)
        rows = run_case(case, tm, device, not args.no_peers)
        results[name] = print_table(case, rows, device)
        del case, rows
        sys.stdout.flush()

    memory = None
    if not args.no_memory and "resnet18" in models:
        memory = run_memory(device)
        print(f"\n## memory: resnet18, batch {BATCH}, {device.type}, each in a fresh process, contender run 2x")
        for which in ("floor", "auto"):
            m = memory[which]
            if m.get("peak_bytes") is not None:
                print(f"   {which:<6} peak increase {m['peak_bytes'] / 2**20:8.0f} MiB  ({m['metric']})")
            else:
                print(f"   {which:<6} probe failed: {m.get('error')}")

    summary = targets_summary(results, memory)
    for issue, head in (("issue2", "issue 2"), ("issue11", f"issue 11: batch {ISSUE11_BATCH}, {device.type}")):
        mine = [s for s in summary if s["issue"] == issue]
        if mine:
            print(f"\n## targets ({head})")
        for s in mine:
            print(f"   {s['verdict']:<5} {s['target']}: {s['detail']}")
    print(f"\n(total {time.perf_counter() - t_start:.0f} s)")
    if args.json:  # "batch" is the default models'; each model's own is in models[name]["batch"]
        with open(args.json, "w") as fh:
            json.dump({"device": device.type, "device_name": dev_name, "torch": torch.__version__,
                       "threads": torch.get_num_threads(), "batch": BATCH, "rounds": rounds,
                       "models": results, "memory": memory, "targets": summary}, fh, indent=1)


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return f"{line.split(':', 1)[1].strip()}, {os.cpu_count()} cores"
    except OSError:
        pass
    return f"{platform.processor() or 'cpu'}, {os.cpu_count()} cores"


def _versions() -> str:
    parts = []
    for mod in ("opacus", "backpack", "torchvision"):
        try:
            from importlib.metadata import version
            pkg = {"backpack": "backpack-for-pytorch"}.get(mod, mod)
            parts.append(f"{mod} {version(pkg)}")
        except Exception:
            parts.append(f"{mod} not installed")
    return "peers: " + ", ".join(parts)


if __name__ == "__main__":
    main()
