"""The Python API the CLI calls: settings in, rows out, no printing.

    import alcli
    rows = alcli.score_pool("data/demo/pool", model="data/demo/model.pt",
                            arch="alcli.demo:DigitsCNN", strategy="egl")
    batch = alcli.select(rows, 20)

Keyword options are the config keys (see alcli.config.Settings); `config=` reads a YAML file first.
`model` may also be a torch.nn.Module and `pool` a tensor / array (or an (x, y) pair) or a Pool.
"""
from __future__ import annotations

import contextlib

from dataclasses import dataclass, field
from typing import Callable

import torch
from torch import nn

from .checkpoint import load_model
from .embeddings import EmbeddingRecorder, Embeddings
from .config import Settings, load_settings
from . import preflight
from .errors import ConfigError, PoolError
from .pool import Batch, Pool, PoolOptions, collate, open_pool, tensor_pool
from .runner import RunStats, check_layers, forward, model_channels, resolve_device, run, to_model
from .labeling import Selection, pick, prepare
from .selection import rank
from .table import read_table


@dataclass
class ScoreRun:
    rows: list[dict]   # ranked
    stats: RunStats
    pool: Pool
    embeddings: Embeddings | None = None  # BADGE factors, when asked for (in pool order)


def settings_for(config=None, **options) -> Settings:
    """Settings from an optional YAML file and keyword options (errors name the argument)."""
    return load_settings(config, options, flag_names=False)


def model_for(settings: Settings, model: nn.Module | None = None) -> nn.Module:
    if isinstance(model, nn.Module):
        return model
    if settings.model is None:
        raise ConfigError("no model given; pass --model PATH (or set model: in a config)")
    return load_model(settings.model, arch=settings.arch, arch_kwargs=settings.arch_kwargs,
                      trust=settings.trust_checkpoint)


def pool_for(settings: Settings, model: nn.Module, pool=None, stdin=None) -> Pool:
    """The pool object: given as data, or opened from `settings.pool`."""
    if isinstance(pool, Pool):
        return pool
    if isinstance(pool, tuple) and len(pool) == 2:
        return tensor_pool(*pool)
    if pool is not None and not isinstance(pool, str):
        return tensor_pool(pool)
    if settings.pool is None:
        raise ConfigError("no pool given; pass POOL: a folder of images, a .csv/.jsonl manifest, "
                          "a .pt/.npy/.npz tensor file, or - for image paths on stdin")
    opts = PoolOptions(settings.labels_from_folders, settings.transform, model_channels(model))
    return open_pool(settings.pool, opts, stdin)


@contextlib.contextmanager
def loaded(settings: Settings, model: nn.Module | None, pool, stdin, device_spec: str | None = None):
    """(model on its device in eval mode, device, pool opened and pre-flight checked); the model's
    training flags are restored on exit."""
    net = model_for(settings, model)
    device = resolve_device(device_spec or settings.device)
    modes = [(m, m.training) for m in net.modules()]
    try:
        net.to(device).eval()
        check_layers(net, settings.layers)
        the_pool = pool_for(settings, net, pool, stdin)
        preflight.check(net, the_pool, settings, device)
        yield net, device, the_pool
    finally:
        for m, mode in modes:
            m.training = mode


def run_score(settings: Settings, *, model: nn.Module | None = None, pool=None, stdin=None,
              on_start: Callable[[int], None] | None = None,
              on_batch: Callable[[int], None] | None = None,
              embeddings: bool | None = None) -> ScoreRun:
    """Load, check, score and rank. `on_start(n)` and `on_batch(k)` drive a progress display.
    `embeddings` (default: the setting) also captures each example's BADGE factors."""
    recorder = EmbeddingRecorder() if (settings.embeddings if embeddings is None else embeddings) \
        else None
    with loaded(settings, model, pool, stdin) as (net, device, the_pool):
        if settings.resume:
            raise ConfigError("resume needs an output file; use alcli.api.score_to_table(settings, "
                              "OUTPUT) (alcli score -o OUTPUT --resume)")
        if settings.shard:
            from .shard import SubPool, parse_shard, shard_indices
            the_pool = SubPool(the_pool, shard_indices(the_pool.ids, *parse_shard(settings.shard)))
        if on_start:
            on_start(len(the_pool))
        rows, stats = run(net, the_pool, settings, device, on_batch, embeddings=recorder)
    if not rows and stats.errors:
        raise PoolError(f"no example of pool {the_pool.name} could be read ({len(stats.errors)} "
                        f"skipped; the first: {stats.errors[0][1]})")
    return ScoreRun(rank(rows), stats, the_pool, recorder.result() if recorder else None)


def score_to_table(settings: Settings, dest: str, *, model: nn.Module | None = None, pool=None,
                   stdin=None, on_start: Callable[[int], None] | None = None,
                   on_batch: Callable[[int], None] | None = None,
                   say: Callable[[str], None] | None = None, embeddings=None):
    """`alcli score`: stream the pool's rows through DEST.partial into the ranked table `dest`
    (a path, or '-' for stdout), with resume, --shard and torchrun (see alcli.job). Returns a
    JobResult, or None on torchrun ranks other than 0."""
    from .job import score_job
    return score_job(settings, dest, model=model, pool=pool, stdin=stdin, on_start=on_start,
                     on_batch=on_batch, say=say, embeddings=embeddings)


def merge(parts: list[str], dest: str, fmt: str = "csv"):
    """`alcli merge`: shard tables -> one ranked table at `dest` (see alcli.merge)."""
    from .merge import merge_tables
    return merge_tables(parts, dest, fmt)


def score_pool(pool=None, model=None, *, config=None, **options) -> list[dict]:
    """Score every example of `pool` with `model`; the ranked rows (dicts, best first)."""
    if isinstance(pool, str):
        options["pool"] = pool
    if isinstance(model, str):
        options["model"] = model
    settings = settings_for(config, **options)
    from .labeling import embeddings_destination, save_embeddings
    emb_file = embeddings_destination(settings, settings.output)  # embeddings=PATH (or True + output=)
    result = run_score(settings, model=model if isinstance(model, nn.Module) else None,
                       pool=None if isinstance(pool, str) else pool)
    if emb_file:
        save_embeddings(result.embeddings, emb_file)
    return result.rows


def select(scores=None, budget: int | None = None, *, pool=None, model=None, config=None,
           **options) -> list[dict]:
    """The `budget` examples to label: from ranked rows or a table file, or by scoring `pool` first.

    Selection options are the config keys: diverse=True (with embeddings=FILE for rows or a table
    whose embeddings are not beside it), per_class="proportional"|"equal", exclude=[FILES],
    contact_sheet="sheet.png" (written), seed, diverse_candidates."""
    if budget is not None:
        options["budget"] = budget
    if isinstance(pool, str):
        options["pool"] = pool
    if isinstance(model, str):
        options["model"] = model
    settings = settings_for(config, **options)
    if settings.budget is None:
        raise ConfigError("no budget given; pass budget=N (how many examples to select)")
    return run_select(settings, scores=scores, model=model if isinstance(model, nn.Module) else None,
                      pool=None if isinstance(pool, str) else pool).rows


def run_select(settings: Settings, *, scores=None, model: nn.Module | None = None, pool=None,
               stdin=None, on_start: Callable[[int], None] | None = None,
               on_batch: Callable[[int], None] | None = None) -> Selection:
    """The batch from `scores` (ranked rows, a table file, or '-' for stdin), or, when None, from
    scoring the pool first in this process (embeddings kept in memory for --diverse)."""
    source = None if scores is None or isinstance(scores, list) else str(scores)
    plan = prepare(settings, source, score_first=scores is None)
    if scores is None:
        scored = run_score(settings, model=model, pool=pool, stdin=stdin, on_start=on_start,
                           on_batch=on_batch, embeddings=settings.diverse)
        return pick(settings, scored.rows, plan, embeddings=scored.embeddings, pool=scored.pool)
    rows = scores if isinstance(scores, list) else read_table(source)
    return pick(settings, rows, plan)


# --- inspect ------------------------------------------------------------------------------------

@dataclass
class ModuleInfo:
    name: str
    kind: str        # module class name
    params: int      # parameters it owns directly
    selected: bool   # in the gradient strategies' selection (--layers)
    rule: str        # the engine rule that serves it, "-" where the engine offers no lookup


@dataclass
class Inspection:
    model: str
    total_params: int
    selected_params: int
    channels: int | None
    modules: list[ModuleInfo] = field(default_factory=list)
    method: str = "auto"
    reason: str = ""


def inspect_model(settings: Settings, *, model: nn.Module | None = None, pool=None,
                  stdin=None) -> Inspection:
    """Modules, parameter counts, selection and rules; and, given a pool, the method `auto` picks
    (found by running the engine on the pool's first two examples)."""
    from .gradnorm import auto_choice, grad_norms_per_target, rule_names, select_params
    net = model_for(settings, model).eval()
    check_layers(net, settings.layers)
    chosen = {id(p) for p in select_params(net, settings.layers).params}
    info = Inspection(model=settings.model or type(net).__name__,
                      total_params=sum(p.numel() for p in net.parameters()),
                      selected_params=sum(p.numel() for p in net.parameters() if id(p) in chosen),
                      channels=model_channels(net))
    rules = rule_names(net)
    for name, module in net.named_modules():
        own = list(module.parameters(recurse=False))
        if own:
            info.modules.append(ModuleInfo(name or "(root)", type(module).__name__,
                                           sum(p.numel() for p in own),
                                           any(id(p) in chosen for p in own), rules.get(name, "-")))
    if settings.method != "auto":
        info.method, info.reason = settings.method, "asked for with --method"
        return info
    if settings.pool is None and pool is None:
        info.reason = "decided at the first batch; give a pool to try it here"
        return info
    the_pool = pool_for(settings, net, pool, stdin)
    batch: Batch = collate([the_pool[i] for i in range(min(2, len(the_pool)))])
    if batch.errors:
        raise ConfigError(batch.errors[0][1])
    inputs = to_model(batch.inputs, net, torch.device("cpu"))
    targets = forward(net, inputs, the_pool.name).argmax(dim=1)
    grad_norms_per_target(net, inputs, [targets], params=settings.layers, method="auto")
    info.method, info.reason = auto_choice(net, settings.layers) or ("auto", "")
    return info
