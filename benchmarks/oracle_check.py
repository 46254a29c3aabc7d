"""A second oracle: float64 central finite differences decide where the per-example loop and the
batched methods disagree (issue 10, item 5).

For each timm model (random init, eval mode, float64) this compares, per parameter:

* the plain per-example loop: one forward/backward per example at batch size 1
  (`torch.autograd.grad` of example i's cross-entropy);
* the "pair" loop: the same, but example i runs as a batch of two copies and only row 0's loss is
  differentiated (eval mode: rows are independent, so this is example i's own gradient);
* alcli's auto / ghost / vmap (`per_example_grad_norms(..., params=[name])`, and the engine's
  projection of example i's gradient on a direction v, read through a zero scalar probe
  `w + s * v` (torch.nn.utils.parametrize) whose per-example gradient norm is |<g_i, v>|);
* float64 central differences of example i's loss: the projection <g_i, v> on a direction, and,
  for parameters with few entries, every coordinate (hence the norm), with the step chosen per
  parameter and an error estimate from two step sizes (h and 2h).

What was found (docs/scores.md, "How the numbers are checked"): the loop is wrong, not the engine. PyTorch's CPU
BatchNorm backward (`batch_norm_backward_cpu`) takes its raw-pointer fast path when the incoming
gradient is channels_last-contiguous but `suggest_memory_format()` calls it contiguous, which
happens only at batch size 1 with a non-canonical batch stride, exactly what
`x.flatten(2).transpose(1, 2)` after a Conv2d+BatchNorm2d stem hands back. The gradient is then
read as NCHW while it is NHWC. FD sides with the batched methods on those parameters (and the
engine inherits the bug for a batch of one example: every method but vmap). Separately,
timm's eval-mode attention-bias cache (LeViT, EfficientFormer) makes every alcli method return 0
for `attention_biases`; FD (cache cleared between evaluations) and the loop agree it is not 0.

    python benchmarks/oracle_check.py --check [--models levit_128s,...] [--batch 4]
                                      [--fd-examples 2] [--out FILE] [--quick]
"""
from __future__ import annotations

import argparse
import platform
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils import parametrize

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from alcli.gradnorm import UnsupportedModel, per_example_grad_norms  # noqa: E402

EPS = torch.finfo(torch.float64).eps
DISAGREE = 1e-6  # relative difference that counts as a disagreement
METHODS = ("auto", "ghost", "vmap")

# model name -> timm kwargs (the smallest input each accepts; efficientformer's attention bias is
# fixed at a 7x7 grid, so it needs 224)
MODELS = {
    "efficientformer_l1": dict(img_size=224),
    "xcit_nano_12_p16_224": dict(img_size=32),
    "levit_128s": dict(img_size=64),
}


# ------------------------------------------------------------------------------- the FD oracle
def fresh(model: nn.Module) -> nn.Module:
    """Eval mode through Module.train, which also empties eval-mode caches (timm's LeViT and
    EfficientFormer cache `attention_biases[:, idxs]` until train()/eval()/_apply is called)."""
    return model.train(False)


def example_loss(model: nn.Module, x_i: torch.Tensor, y_i: torch.Tensor, pair: bool = False):
    """Cross-entropy of one example ([1, ...] input). pair=True runs it as a batch of two copies
    and keeps row 0 (the same number; a different kernel path in PyTorch's BatchNorm backward)."""
    fresh(model)
    x = x_i.expand(2, *x_i.shape[1:]) if pair else x_i
    return F.cross_entropy(model(x)[:1], y_i)


def fd_step(param: torch.Tensor, v: torch.Tensor) -> float:
    """Central-difference step along v for this parameter: eps^(1/3) (the optimum for O(h^2)
    truncation against O(eps/h) rounding) times the parameter's scale along v."""
    scale = max(1.0, float(param.detach().abs().max()))
    return EPS ** (1 / 3) * scale / max(float(v.abs().max()), 1e-300)


@dataclass
class FD:
    value: float  # the central difference with step h
    err: float    # error estimate: |D(h) - D(2h)| (truncation) + rounding eps*|L|/h
    h: float


@torch.no_grad()
def fd_directional(loss_of, param: torch.Tensor, v: torch.Tensor, h: float | None = None) -> FD:
    """Central difference of loss_of() along v at `param` (changed in place, restored)."""
    h = fd_step(param, v) if h is None else h
    p0 = param.detach().clone()

    def at(t):
        param.copy_(p0 + t * v)
        return float(loss_of())

    try:
        l0 = at(0.0)
        d = [(at(s * h) - at(-s * h)) / (2 * s * h) for s in (1, 2)]
    finally:
        param.copy_(p0)
    return FD(d[0], abs(d[0] - d[1]) + 4 * EPS * max(abs(l0), 1.0) / h, h)


def fd_gradient(loss_of, param: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Every coordinate by central differences (step per coordinate) -> (gradient, error bound)."""
    g = torch.zeros(param.numel(), dtype=torch.float64)
    err = torch.zeros_like(g)
    flat = param.detach().reshape(-1)
    for j in range(param.numel()):
        e = torch.zeros_like(param).reshape(-1)
        e[j] = 1.0
        h = EPS ** (1 / 3) * max(1.0, float(flat[j].abs()))
        r = fd_directional(loss_of, param, e.view_as(param), h)
        g[j], err[j] = r.value, r.err
    return g.view_as(param), err.view_as(param)


class Probe(nn.Module):
    """Parametrization w -> w + s * v with s a zero scalar parameter: d loss_i / d s = <g_i, v>,
    so any method's per-example norm for `s` is |<g_i, v>|."""

    def __init__(self, v: torch.Tensor):
        super().__init__()
        self.register_buffer("v", v.detach().clone())
        self.s = nn.Parameter(torch.zeros((), dtype=v.dtype))

    def forward(self, w):
        return w + self.s * self.v


def engine_projection(model, inputs, targets, name: str, v: torch.Tensor, method: str = "auto"):
    """|<g_i, v>| for every example as alcli computes it (probe on parameter `name`)."""
    mod_name, _, attr = name.rpartition(".")
    mod = model.get_submodule(mod_name)
    parametrize.register_parametrization(mod, attr, Probe(v))
    try:
        probe = f"{mod_name + '.' if mod_name else ''}parametrizations.{attr}.0.s"
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return per_example_grad_norms(fresh(model), inputs, targets, method=method, params=[probe])
    finally:
        parametrize.remove_parametrizations(mod, attr, leave_parametrized=True)
        fresh(model)


def engine_norms(model, inputs, targets, params, method: str):
    """alcli's per-example norms over `params` (None: the method declines the model)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return per_example_grad_norms(fresh(model), inputs, targets, method=method, params=params)
    except UnsupportedModel:
        return None


def loop_grads(model, inputs, targets, names, pair: bool):
    """{name: [B, *shape]} per-example gradients from one forward/backward per example."""
    named = dict(model.named_parameters())
    params = [named[n] for n in names]
    out = {n: [] for n in names}
    for i in range(inputs.shape[0]):
        loss = example_loss(model, inputs[i:i + 1], targets[i:i + 1], pair)
        grads = torch.autograd.grad(loss, params, allow_unused=True)
        for n, p, g in zip(names, params, grads):
            out[n].append(torch.zeros_like(p) if g is None else g.detach())
    fresh(model)
    return {n: torch.stack(gs) for n, gs in out.items()}


def rel(a: float, b: float) -> float:
    """|a - b| relative to b (b: the reference, FD)."""
    return abs(a - b) / max(abs(b), 1e-300)


def rel2(a: float, b: float) -> float:
    """|a - b| relative to the larger of the two (neither is the reference)."""
    return abs(a - b) / max(abs(a), abs(b), 1e-300)


# --------------------------------------------------------------------------------- the check
@dataclass
class Row:
    model: str
    param: str
    numel: int
    kind: str          # "norm" (every coordinate by FD) or "proj" (FD along a direction)
    loop_vs_engine: float
    fd_vs_loop: float
    fd_vs_engine: float
    fd_err: float      # FD error estimate, relative to the FD value
    methods: str       # engine methods that served
    verdict: str


def verdict(fd_loop: float, fd_engine: float, fd_err: float) -> str:
    tol = max(10 * fd_err, 1e-6)
    ok_loop, ok_engine = fd_loop <= tol, fd_engine <= tol
    return {(True, True): "both right", (False, True): "engine right",
            (True, False): "loop right", (False, False): "neither"}[(ok_loop, ok_engine)]


def build(name: str, batch: int, seed: int = 0):
    import timm
    torch.manual_seed(seed)
    model = timm.create_model(name, pretrained=False, num_classes=10, **MODELS[name]).double()
    fresh(model)
    size = MODELS[name]["img_size"]
    gen = torch.Generator().manual_seed(seed + 1)
    inputs = torch.randn(batch, 3, size, size, dtype=torch.float64, generator=gen)
    targets = torch.randint(0, 10, (batch,), generator=gen)
    return model, inputs, targets


def choose(model, loop_n, pair_n, max_coord: int) -> list[tuple[str, str]]:
    """(name, why) for a few parameters: loop and batched disagree on them, plus attention biases."""
    names = list(loop_n)
    dis = [n for n in names if float(((loop_n[n] - pair_n[n]).abs() / pair_n[n].clamp_min(1e-300)).max()) > DISAGREE]
    numel = {n: p.numel() for n, p in model.named_parameters()}
    picks: list[tuple[str, str]] = []
    small = [n for n in dis if numel[n] <= max_coord]
    if small:
        picks.append((small[0], "first small"))
    bn = [n for n in dis if n.endswith(".weight") and isinstance(model.get_submodule(n.rpartition(".")[0]), nn.BatchNorm2d)]
    if bn and bn[-1] not in dict(picks):
        picks.append((bn[-1], "last BN"))
    if dis:
        big = max(dis, key=lambda n: float(pair_n[n].max()))
        if big not in dict(picks):
            picks.append((big, "largest"))
    return picks


def check_model(name: str, batch: int, fd_examples: int, max_coord: int, log=print) -> tuple[list[Row], dict]:
    t0 = time.perf_counter()
    model, x, y = build(name, batch)
    names = [n for n, _ in model.named_parameters()]
    loop = loop_grads(model, x, y, names, pair=False)
    pair = loop_grads(model, x, y, names, pair=True)
    loop_n = {n: g.flatten(1).norm(dim=1) for n, g in loop.items()}
    pair_n = {n: g.flatten(1).norm(dim=1) for n, g in pair.items()}
    total = lambda d: torch.stack(list(d.values())).square().sum(0).sqrt()  # noqa: E731
    summary = {"loop_total": total(loop_n), "pair_total": total(pair_n),
               "n_params": len(names),
               "n_disagree": sum(float(((loop_n[n] - pair_n[n]).abs() / pair_n[n].clamp_min(1e-300)).max()) > DISAGREE
                                 for n in names)}
    for m in METHODS:
        v = engine_norms(model, x, y, None, m)
        summary[m] = None if v is None else v.detach()
    log(f"{name}: loop/pair/engine totals in {time.perf_counter() - t0:.0f}s")

    rows = []
    for pname, why in choose(model, loop_n, pair_n, max_coord):
        rows.append(check_param(model, x, y, name, pname, why, loop, pair, fd_examples, max_coord))
        log(f"  {pname}: {rows[-1].verdict} ({time.perf_counter() - t0:.0f}s)")
    ab = [n for n in names if n.endswith("attention_biases")]
    if ab:
        # timm initialises attention biases to zero, where their gradient is ~0; draw them as a
        # trained model would have them, so that what the engine does with them shows
        gen = torch.Generator().manual_seed(3)
        with torch.no_grad():
            for n in ab:
                p = model.get_parameter(n)
                p.copy_(torch.randn(p.shape, dtype=p.dtype, generator=gen))
        fresh(model)
        loop = loop_grads(model, x, y, ab, pair=False)
        pair = loop_grads(model, x, y, ab, pair=True)
        pname = max(ab, key=lambda n: float(pair[n].flatten(1).norm(dim=1).max()))
        rows.append(check_param(model, x, y, name, pname, "attention bias ~ N(0,1)", loop, pair,
                                fd_examples, max_coord))
        log(f"  {pname}: {rows[-1].verdict} ({time.perf_counter() - t0:.0f}s)")
    fresh(model)
    return rows, summary


def check_param(model, x, y, name, pname, why, loop, pair, fd_examples, max_coord) -> Row:
    """One table row: FD decides between the batch-1 loop and the engine on parameter pname."""
    param = model.get_parameter(pname)
    loop_n = {pname: loop[pname].flatten(1).norm(dim=1)}
    ex = range(min(fd_examples, x.shape[0]))
    if param.numel() <= max_coord:  # every coordinate: the norm itself, against alcli's norms
        served = {m: engine_norms(model, x, y, [pname], m) for m in METHODS}
        served = {m: v.detach() for m, v in served.items() if v is not None}
        fl, fe, le, er = [], [], [], []
        for i in ex:
            g, err = fd_gradient(lambda: example_loss(model, x[i:i + 1], y[i:i + 1]), param)
            fdn = float(g.norm())
            er.append(float(err.norm()) / max(fdn, 1e-300))
            fl.append(rel(float(loop_n[pname][i]), fdn))
            fe.append(max(rel(float(v[i]), fdn) for v in served.values()))
            le.append(max(rel2(float(loop_n[pname][i]), float(v[i])) for v in served.values()))
        kind = "norm"
    else:  # a direction: where loop and batched differ, their difference (separates them most)
        fl, fe, le, er = [], [], [], []
        gen = torch.Generator().manual_seed(7)
        proj = {}
        for i in ex:
            d = loop[pname][i] - pair[pname][i]
            if float(d.norm()) <= DISAGREE * float(pair[pname][i].norm()):
                d = torch.randn(param.shape, dtype=torch.float64, generator=gen)
            v = d / d.norm()
            key = tuple(v.flatten()[:4].tolist())
            if key not in proj:
                proj[key] = {m: engine_projection(model, x, y, pname, v, m).detach() for m in ("auto", "vmap")}
            fd = fd_directional(lambda: example_loss(model, x[i:i + 1], y[i:i + 1]), param, v)
            lp = float((loop[pname][i] * v).sum())
            eps_ = [float(p[i]) for p in proj[key].values()]  # |<g_i, v>|: compare magnitudes
            er.append(fd.err / max(abs(fd.value), 1e-300))
            fl.append(rel(lp, fd.value))
            fe.append(max(rel(e, abs(fd.value)) for e in eps_))
            le.append(max(rel2(abs(lp), e) for e in eps_))
        kind = "proj"
        served = {"auto,vmap (probe)": None}
    r = Row(name, f"{pname} ({why})", param.numel(), kind, max(le), max(fl), max(fe), max(er),
            ",".join(served), "")
    r.verdict = verdict(r.fd_vs_loop, r.fd_vs_engine, r.fd_err)
    return r


def fmt(v: float) -> str:
    return f"{v:.1e}"


def table(rows: list[Row]) -> str:
    head = ["model", "parameter", "numel", "FD of", "loop vs engine", "FD vs loop", "FD vs engine",
            "FD err", "engine methods", "verdict"]
    body = [[r.model, r.param, str(r.numel), r.kind, fmt(r.loop_vs_engine), fmt(r.fd_vs_loop),
             fmt(r.fd_vs_engine), fmt(r.fd_err), r.methods, r.verdict] for r in rows]
    widths = [max(len(row[c]) for row in [head] + body) for c in range(len(head))]
    line = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()  # noqa: E731
    return "\n".join([line(head), line(["-" * w for w in widths])] + [line(b) for b in body])


def summary_lines(name: str, s: dict) -> list[str]:
    out = [f"{name}: {s['n_disagree']}/{s['n_params']} parameter tensors where the batch-1 loop and "
           f"the pair loop differ by > {DISAGREE:g} (relative, some example)"]
    lt, pt = s["loop_total"], s["pair_total"]
    out.append(f"  total norm, batch-1 loop vs pair loop: max rel {fmt(float(((lt - pt).abs() / pt).max()))}")
    for m in METHODS:
        v = s[m]
        if v is None:
            out.append(f"  {m:5s}: declines (UnsupportedModel)")
        else:
            out.append(f"  {m:5s}: vs batch-1 loop {fmt(float(((v - lt).abs() / lt).max()))}, "
                       f"vs pair loop {fmt(float(((v - pt).abs() / pt).max()))}")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="run the FD check (the default action)")
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--fd-examples", type=int, default=2, help="examples checked by FD")
    ap.add_argument("--max-coord", type=int, default=32,
                    help="parameters with at most this many entries get every coordinate by FD")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="levit_128s only, batch 2, 1 FD example")
    ap.add_argument("--out", help="also write the report to this file")
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    if a.quick:
        a.models, a.batch, a.fd_examples = "levit_128s", 2, 1
    lines = ["# oracle check: float64 central differences decide (issue 10, item 5)",
             f"# torch {torch.__version__}, timm {__import__('timm').__version__}, "
             f"python {platform.python_version()}, {platform.machine()}, threads {a.threads}, "
             f"batch {a.batch}, FD on {a.fd_examples} example(s), FD step eps^(1/3)*max(1,|theta|), "
             f"error from steps h and 2h", ""]
    rows, summaries = [], []
    t0 = time.perf_counter()
    for name in a.models.split(","):
        r, s = check_model(name, a.batch, a.fd_examples, a.max_coord, log=lambda m: print(m, file=sys.stderr))
        rows += r
        summaries += summary_lines(name, s)
    lines += summaries + ["", table(rows), "",
                          "loop = one forward/backward per example at batch size 1; pair loop = the example "
                          "twice in a batch of 2, row 0's loss;",
                          "engine = alcli per_example_grad_norms (norm rows: params=[name] for every method "
                          "that serves; proj rows: a zero probe w + s*v, auto and vmap);",
                          "FD of norm: every coordinate by central differences; FD of proj: along v = "
                          "normalised (loop - pair) gradient, or a random v where they agree;",
                          "relative differences are the max over the FD-checked examples; verdict: who is "
                          "within max(10 x FD err, 1e-6) of FD.",
                          f"wall time {time.perf_counter() - t0:.0f}s"]
    text = "\n".join(lines)
    print(text)
    if a.out:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(text + "\n")
    bad = [r for r in rows if r.verdict not in ("engine right", "both right")]
    return 0 if not bad else 1


if __name__ == "__main__":
    sys.exit(main())
