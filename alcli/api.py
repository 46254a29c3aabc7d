"""The Python API the CLI calls: settings in, rows out, no printing.

    import alcli
    rows = alcli.score_pool("data/demo/pool", model="data/demo/model.pt",
                            arch="alcli.demo:DigitsCNN", strategy="egl")
    batch = alcli.select(rows, 20)

Keyword options are the config keys (see alcli.files.config.Settings); `config=` reads a YAML file
first. `model` may also be a torch.nn.Module and `pool` a tensor / array (or an (x, y) pair) or a
Pool. Scoring always runs alcli.longrun.job.score, with the rows kept in memory or written to a
table (docs/architecture.md follows one batch through it).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from torch import nn

from .errors import ConfigError
from .files.config import Settings, load_settings
from .files.embeddings import destination, save_embeddings
from .files.pool import Pool
from .files.table import read_table
from .inspection import Inspection, inspect_model  # noqa: F401 - the CLI's `inspect`
from .longrun.distributed import is_rank0  # noqa: F401 - the CLI prints on rank 0 only
from .longrun.job import JobResult, score
from .longrun.merge import MergeResult, merge_tables
from .score.embeddings import EmbeddingRecorder, Embeddings
from .score.runner import RunStats
from .selection.pick import Picked, pick, prepare, write_batch  # noqa: F401 - write_batch: `select`


@dataclass
class ScoreRun:
    rows: list[dict]   # ranked
    stats: RunStats
    pool: Pool
    embeddings: Embeddings | None = None  # BADGE factors, when asked for (in scoring order)


def settings_for(config=None, **options) -> Settings:
    """Settings from an optional YAML file and keyword options (errors name the argument)."""
    return load_settings(config, options, flag_names=False)


def run_score(settings: Settings, *, model: nn.Module | None = None, pool=None, stdin=None,
              on_start: Callable[[int], None] | None = None,
              on_batch: Callable[[int], None] | None = None,
              embeddings: bool | None = None) -> ScoreRun:
    """Load, check, score and rank, keeping the rows in memory. `on_start(n)` and `on_batch(k)`
    drive a progress display. `embeddings` (default: the setting) also captures each example's
    BADGE factors."""
    recorder = EmbeddingRecorder() if (settings.embeddings if embeddings is None else embeddings) \
        else None
    result = score(settings, None, model=model, pool=pool, stdin=stdin, on_start=on_start,
                   on_batch=on_batch, embeddings=recorder)
    return ScoreRun(result.finished.rows, result.stats, result.pool,
                    recorder.result() if recorder else None)


def score_to_table(settings: Settings, dest: str, *, model: nn.Module | None = None, pool=None,
                   stdin=None, on_start: Callable[[int], None] | None = None,
                   on_batch: Callable[[int], None] | None = None,
                   say: Callable[[str], None] | None = None) -> tuple[JobResult | None, str | None]:
    """`alcli score`: stream the pool's rows through DEST.partial into the ranked table `dest`
    (a path, or '-' for stdout), with resume, --shard and torchrun, and the embeddings file when
    asked for. Returns (the JobResult, or None on torchrun ranks other than 0; the embeddings
    file written, or None)."""
    emb_file = destination(settings, dest)  # checked before the work
    recorder = EmbeddingRecorder() if emb_file else None
    result = score(settings, dest, model=model, pool=pool, stdin=stdin, on_start=on_start,
                   on_batch=on_batch, say=say, embeddings=recorder)
    if result is not None and emb_file:
        embeddings = recorder.result()
        save_embeddings(emb_file, embeddings.ids, embeddings.a, embeddings.b)
    return result, emb_file


def merge(parts: list[str], dest: str, fmt: str = "csv") -> MergeResult:
    """`alcli merge`: shard tables -> one ranked table at `dest` (see alcli.longrun.merge)."""
    return merge_tables(parts, dest, fmt)


def score_pool(pool=None, model=None, *, config=None, **options) -> list[dict]:
    """Score every example of `pool` with `model`; the ranked rows (dicts, best first)."""
    if isinstance(pool, str):
        options["pool"] = pool
    if isinstance(model, str):
        options["model"] = model
    settings = settings_for(config, **options)
    emb_file = destination(settings, settings.output)  # embeddings=True: embeddings_file= or output=
    result = run_score(settings, model=model if isinstance(model, nn.Module) else None,
                       pool=None if isinstance(pool, str) else pool)
    if emb_file:
        save_embeddings(emb_file, result.embeddings.ids, result.embeddings.a, result.embeddings.b)
    return result.rows


def select(scores=None, budget: int | None = None, *, pool=None, model=None, config=None,
           **options) -> list[dict]:
    """The `budget` examples to label: from ranked rows or a table file, or by scoring `pool` first.

    Selection options are the config keys: diverse=True (with embeddings_file=FILE for rows or a
    table whose embeddings are not beside it), per_class="proportional"|"equal", exclude=[FILES],
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
               on_batch: Callable[[int], None] | None = None) -> Picked:
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
