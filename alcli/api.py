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

import os
from dataclasses import dataclass, replace
from typing import Callable, Iterable

from torch import nn

from .errors import ConfigError
from .files.config import Settings, load_settings
from .files.embeddings import embeddings_path, save_embeddings
from .files.outputs import check_outputs, inputs_of
from .files.table import read_table, write_rows
from .pools.common import Pool
from .inspection import Inspection, inspect_model  # noqa: F401 - the CLI's `inspect`
from .longrun.job import JobResult, score
from .longrun.merge import MergeResult, merge_tables
from .score.embeddings import EmbeddingRecorder, Embeddings
from .score.runner import RunStats
from .selection.duplicates import GROUP_COLUMNS, duplicate_groups
from .selection.pick import Picked, check_rows, pick, prepare
from .selection.pick import write_batch  # noqa: F401 - the CLI's `select`


class Rows(list):
    """Ranked rows (dicts, best first), with the BADGE embeddings of their examples when they were
    asked for (`embeddings=True`), so that `select(rows, n, diverse=True)` needs no file."""
    embeddings: Embeddings | None = None


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
              embeddings: bool | None = None,
              narrow: Callable[[Pool], Pool] | None = None) -> ScoreRun:
    """Load, check, score and rank, keeping the rows in memory. `on_start(n)` and `on_batch(k)`
    drive a progress display. `embeddings` (default: the setting) also captures each example's
    BADGE factors: True asks for them, None takes them where the model has a head to take them
    from, False does not. `narrow(pool)`: the opened pool as it is to be scored (simulate hides
    its labels)."""
    wanted = settings.embeddings if embeddings is None else embeddings
    recorder = None if wanted is False else EmbeddingRecorder(optional=wanted is None)
    result = score(settings, None, model=model, pool=pool, stdin=stdin, on_start=on_start,
                   on_batch=on_batch, embeddings=recorder, narrow=narrow)
    rows = result.finished.rows
    if result.pool.given_ids is not None:  # the caller's ids, as given
        given = dict(zip(result.pool.ids, result.pool.given_ids))
        rows = [{**row, "id": given[row["id"]]} for row in rows]
    return ScoreRun(rows, result.stats, result.pool, recorder.result() if recorder else None)


def score_to_table(settings: Settings, dest: str, *, model: nn.Module | None = None, pool=None,
                   stdin=None, on_start: Callable[[int], None] | None = None,
                   on_batch: Callable[[int], None] | None = None,
                   say: Callable[[str], None] | None = None) -> tuple[JobResult | None, str | None]:
    """`alcli score`: stream the pool's rows through DEST.partial into the ranked table `dest`
    (a path, or '-' for stdout), with resume, --shard and torchrun, and the embeddings file (by
    default, wherever the model has a classification head to take them from; a table on stdout
    keeps them under ./.alcli/, where `select` finds them). Returns (the JobResult, or None on
    torchrun ranks other than 0; the embeddings file written, or None)."""
    recorder = None if settings.embeddings is False else \
        EmbeddingRecorder(optional=settings.embeddings is None)
    result = score(settings, dest, model=model, pool=pool, stdin=stdin, on_start=on_start,
                   on_batch=on_batch, say=say, embeddings=recorder)
    return result, result.embeddings_file if result is not None else None


def merge(parts: list[str], dest: str, fmt: str = "csv", null: bool = False) -> MergeResult:
    """`alcli merge`: shard tables -> one ranked table at `dest` (see alcli.longrun.merge)."""
    return merge_tables(parts, dest, fmt, null)


@dataclass
class DuplicateGroups:
    rows: list[dict]  # group, id, similarity, kind (alcli.selection.duplicates.duplicate_groups)
    groups: int       # how many groups


def duplicates(settings: Settings, scores: str) -> DuplicateGroups:
    """`alcli duplicates`: the groups of near-duplicates of the table `scores`, written to
    settings.output (stdout when None or '-') as CSV."""
    check_outputs({settings.where("output"): settings.output},
                  [("the table read", scores), ("its embeddings file", embeddings_path(scores)),
                   *inputs_of(settings)])
    rows, count = duplicate_groups(settings, scores)
    write_rows(rows, GROUP_COLUMNS, settings.output or "-")
    return DuplicateGroups(rows, count)


def score_pool(pool=None, model=None, *, config=None, **options) -> Rows:
    """Score every example of `pool` with `model`; the ranked rows (dicts, best first).

    With embeddings=True the rows keep their examples' BADGE embeddings (`rows.embeddings`) for
    `select(rows, n, diverse=True)`; embeddings_file=PATH also writes them there."""
    _refuse_file_options(options, "score_pool", "`alcli score -o FILE` or alcli.api.score_to_table")
    if _names_files(pool):
        options["pool"] = _as_setting(pool)
    if _names_files(model):
        options["model"] = _as_setting(model)
    settings = settings_for(config, **options)
    result = run_score(settings, model=model if isinstance(model, nn.Module) else None,
                       pool=None if _names_files(pool) else pool)
    rows = Rows(result.rows)
    rows.embeddings = result.embeddings
    if result.embeddings is not None and settings.embeddings_file:
        save_embeddings(settings.embeddings_file, result.embeddings.ids, result.embeddings.a,
                        result.embeddings.b)
    return rows


def select(scores=None, budget: int | None = None, *, pool=None, model=None, config=None,
           **options) -> list[dict]:
    """The `budget` examples to label: from ranked rows or a table file, or by scoring `pool` first.

    Selection options are the config keys: diverse=True (rows from score_pool(...,
    embeddings=True) carry their embeddings; a table reads TABLE.emb.npz, or embeddings_file=FILE),
    diverse_candidates=M or "all", diverse_mode="cluster-margin" (Cluster-Margin instead of
    BADGE, into diverse_clusters=M clusters), per_class="proportional"|"equal", typical=True
    (TypiClust cold start; the excluded ids are the labeled examples), dedup=False (no pass over
    near-duplicates; dedup_threshold=T their cosine), contact_sheet="sheet.png"
    (written), seed, exclude= ids never to select (any iterable: a set, list, tuple, generator),
    and exclude_files= exclusion files (a path or a list of them, as `select --exclude` reads)."""
    _refuse_file_options(options, "select", "`alcli select -o FILE -f FORMAT` or alcli.api.write_batch")
    exclude_ids = _exclude_ids(options.pop("exclude", None))
    exclude_files = options.pop("exclude_files", None)
    if exclude_files is not None:
        options["exclude"] = _exclude_files(exclude_files)
    if budget is not None:
        options["budget"] = budget
    if _names_files(pool):
        options["pool"] = _as_setting(pool)
    if _names_files(model):
        options["model"] = _as_setting(model)
    settings = settings_for(config, **options)
    if exclude_files is not None:  # errors name the argument the files came from
        settings.sources["exclude"] = "argument exclude_files="
    if settings.budget is None:
        raise ConfigError("no budget given; pass budget=N (how many examples to select)")
    return run_select(settings, scores=scores, model=model if isinstance(model, nn.Module) else None,
                      pool=None if _names_files(pool) else pool, exclude_ids=exclude_ids).rows


# options of the command's output file, which the functions returning rows have no use for
_FILE_OPTIONS = ("output", "format", "resume", "restart", "checkpoint_every")


def _refuse_file_options(options: dict, function: str, instead: str):
    given = [key for key in _FILE_OPTIONS if key in options]
    if given:
        raise ConfigError(f"{function}() returns the rows and writes no table, so it takes no "
                          f"{given[0]}= argument; to write one use {instead}")


def _names_files(value) -> bool:
    """A path (str or PathLike), or a list of them (several image files as a pool)."""
    if isinstance(value, list):
        return bool(value) and all(isinstance(v, (str, os.PathLike)) for v in value)
    return isinstance(value, (str, os.PathLike))


def _as_setting(value):
    return [os.fspath(v) for v in value] if isinstance(value, list) else os.fspath(value)


def _exclude_ids(exclude) -> list | None:
    """`exclude=`: the ids of any iterable (set, list, tuple, generator, dict keys). One string
    (an id, or a file as exclude= once took) is refused: exclusion files go to exclude_files=."""
    if exclude is None:
        return None
    if isinstance(exclude, (str, os.PathLike)):
        raise ConfigError(f"exclude= takes ids (a set, list or other iterable of them), not one "
                          f"{type(exclude).__name__} {str(exclude)!r:.60}: pass "
                          f"exclude_files={str(exclude)!r:.60} for an exclusion file, or "
                          f"exclude={{{str(exclude)!r:.60}}} for one id")
    if isinstance(exclude, (bytes, bytearray)) or not isinstance(exclude, Iterable):
        raise ConfigError(f"exclude= takes ids: a set, list, tuple or other iterable of them "
                          f"(got {type(exclude).__name__} {exclude!r:.40}); exclusion files go "
                          f"to exclude_files=")
    return list(exclude)


def _exclude_files(files) -> list[str]:
    """`exclude_files=`: a path (str or Path) or an iterable of them."""
    items = [files] if isinstance(files, (str, os.PathLike)) else files
    if isinstance(items, (bytes, bytearray)) or not isinstance(items, Iterable):
        items = None
    else:
        items = list(items)
    if not items or not all(isinstance(f, (str, os.PathLike)) for f in items):
        raise ConfigError(f"exclude_files= takes an exclusion file (a str or Path) or a list of "
                          f"them (got {type(files).__name__} {files!r:.40})")
    return [os.fspath(f) for f in items]


def run_select(settings: Settings, *, scores=None, model: nn.Module | None = None, pool=None,
               stdin=None, on_start: Callable[[int], None] | None = None,
               on_batch: Callable[[int], None] | None = None, exclude_ids=None,
               narrow: Callable[[Pool], Pool] | None = None) -> Picked:
    """The batch from `scores` (ranked rows, a table file, or '-' for stdin), or, when None, from
    scoring the pool first in this process (embeddings kept in memory for --diverse; `narrow`
    as run_score takes it)."""
    source = None if scores is None or isinstance(scores, list) else str(scores)
    if isinstance(scores, list):
        check_rows(scores)
    carried = getattr(scores, "embeddings", None)  # Rows from score_pool(..., embeddings=True)
    plan = prepare(settings, source, score_first=scores is None or carried is not None,
                   exclude_ids=exclude_ids)
    if carried is not None:
        return pick(settings, scores, plan, embeddings=carried)
    if scores is None:
        scored = run_score(settings, model=model, pool=pool, stdin=stdin, on_start=on_start,
                           on_batch=on_batch, narrow=narrow, embeddings=settings.typical or (
                               False if settings.diverse is False and not settings.dedup
                               else settings.diverse or settings.embeddings))
        plan.meta = {"task": scored.stats.task, "class_names": scored.pool.classes, **plan.meta}
        return pick(settings, scored.rows, plan, embeddings=scored.embeddings, pool=scored.pool)
    rows = scores if isinstance(scores, list) else read_table(source)
    return pick(settings, rows, plan)


def review_to_table(settings: Settings, dest: str, ranking: str, *, model: nn.Module | None = None,
                    pool=None, on_start: Callable[[int], None] | None = None,
                    on_batch: Callable[[int], None] | None = None):
    """`alcli review`: score the labeled pool once (`--strategy review`: loss and gradnorm at the
    given label, each labeled decision's probabilities), then rank its labels most likely wrong
    first (alcli.review) into the table `dest` ('-': stdout) and DEST.meta.json. Returns
    (alcli.review.Reviewed, the ScoreRun)."""
    from .files.outputs import check_not_input, inputs_of, refuse_remote
    from .files.table import SIDECARS, sidecar, write_meta, write_table
    from .files.atomic import check_writable, make_folder, writes_stream
    from .review import review_rows
    refuse_remote(dest, settings.where("output"))
    if not writes_stream(dest):  # checked before the scoring, not after it
        make_folder(os.path.dirname(os.path.abspath(dest)), f"output {dest}")
        if os.path.isdir(dest):
            raise ConfigError(f"output {dest} is a directory")
        check_writable(os.path.dirname(os.path.abspath(dest)), f"output {dest}")
        check_not_input(dest, settings.where("output"), inputs_of(settings, unread=("scores",)),
                        beside=SIDECARS)
    settings = replace(settings, strategy="review")
    run = run_score(settings, model=model, pool=pool, on_start=on_start, on_batch=on_batch,
                    embeddings=False)
    names = run.pool.classes
    reviewed = review_rows(run.rows, run.stats.task, names, ranking, run.pool.name)
    write_table(reviewed.rows, dest, settings.format)
    if not writes_stream(dest):
        write_meta(sidecar(dest, "meta.json"), {
            "table": os.path.basename(dest), "rows": len(reviewed.rows), "task": run.stats.task,
            "class_names": list(names) if names else None, "review": ranking,
            "flagged": reviewed.flagged, "unlabeled": reviewed.unlabeled,
            "pool_path": str(settings.pool) if isinstance(settings.pool, str) else None})
    return reviewed, run
