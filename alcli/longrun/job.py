"""The one scoring path (`alcli score`, and the Python API with rows in memory):

    session.opened -> [shard K/N] -> [skip what OUTPUT.partial already holds]
        -> score.runner.run(sink) -> sink: OUTPUT.partial, or a list in memory
        -> (torchrun: every rank's rows to rank 0) -> ranked OUTPUT, OUTPUT.errors.csv, OUTPUT.meta.json

Writing a file, only the DataLoader's batches and at most `checkpoint_every` finished rows are in
memory at a time; the table is ranked from the partial file (see finish.py). Resuming re-forms the
very batches of the first run (fixed positions in the pool), so a killed and resumed run writes
the same bytes as one that was never interrupted.
"""
from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import signal
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from torch import nn

from ..version import __version__
from ..errors import AlcliError, CheckpointError, ConfigError, PoolError
from ..files.atomic import check_writable, make_folder, writes_stream
from ..files.config import Settings
from ..files import remote
from ..files.outputs import check_not_input, inputs_of, refuse_remote
from ..pools.common import Pool
from ..files.table import FORMATS as TABLE_FORMATS, SIDECARS, check_records, sidecar
from ..files.embeddings import destination, encode_factors
from ..score.embeddings import EmbeddingRecorder
from ..score.runner import RunStats, run
from ..selection.rank import rank
from ..session import Session, opened
from ..tasks import TASKS
from . import distributed
from .exclude import Exclusion
from .finish import Finished, finish, save_table_embeddings, write_sidecars
from .lock import lock_path, output_lock
from .partial import PartialFile, gather_target, new_partial, stdout_folder
from .shard import SubPool, fingerprint, parse_shard, shard_indices

META_VERSION = 1


class Interrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM stopped the run; its finished rows are saved on the way out. A
    KeyboardInterrupt, so that no `except Exception` (an image decoder's, say) swallows it."""

    def __init__(self, message: str, signum: int):
        super().__init__(message)
        self.exit_code = 128 + signum


@dataclass
class JobResult:
    finished: Finished          # rows, NaN count, skipped examples, top rows (all rows in memory)
    stats: RunStats             # this process's scoring (resumed rows not included)
    resumed: int = 0            # rows taken over from OUTPUT.partial
    shard: str | None = None
    files: list[str] = field(default_factory=list)  # written beside the table (errors, meta)
    pool: Pool | None = None
    run_id: str | None = None   # the table's meta.json records it (and its embeddings file)
    excluded: int = 0           # examples --exclude left out (not scored)
    warnings: list[str] = field(default_factory=list)  # for people: --exclude entries unmatched
    embeddings_file: str | None = None  # TABLE.emb.npz written with the table (same run id)


def score(settings: Settings, dest: str | None, *, model: nn.Module | None = None, pool=None,
          stdin=None, on_start: Callable[[int], None] | None = None,
          on_batch: Callable[[int], None] | None = None,
          say: Callable[[str], None] | None = None,
          embeddings: EmbeddingRecorder | None = None,
          narrow: Callable[[Pool], Pool] | None = None) -> JobResult | None:
    """Score the pool into the table `dest` (a path, or '-' for stdout), or, with `dest` None,
    into ranked rows in memory (`result.finished.rows`; no partial file, resume or torchrun).
    `narrow`: the pool as the caller wants it scored (simulate: its labels hidden), in memory
    only. Returns None on the torchrun ranks other than 0, which write nothing."""
    ctx = distributed.from_env() if dest is not None else None
    exclusion = Exclusion(settings) if dest is not None and settings.exclude else None
    if narrow is not None and dest is not None:
        raise ValueError("score(narrow=...) scores in memory only (dest None)")
    _check_options(settings, ctx, dest)
    device_spec = distributed.device_for(settings.device, ctx) if ctx else settings.device
    with distributed.session(ctx, device_spec), \
            opened(settings, model, pool, stdin, device_spec, narrow=exclusion or narrow) as session:
        full = session.pool
        if dest is not None:
            _check_records(settings, full)
        shard = (ctx.rank, ctx.world) if ctx else parse_shard(settings.shard)
        todo = SubPool(full, shard_indices(full.ids, *shard)) if shard else full
        if dest is None:
            result = _score_in_memory(session, todo, settings, on_start, on_batch, say, embeddings)
        else:
            result = _score_to_file(ctx, session, todo, shard, settings, dest, on_start, on_batch,
                                    say, embeddings, exclusion)
    if result is not None:
        result.pool = full
        if exclusion is not None:
            result.excluded, result.warnings = len(exclusion.left_out), exclusion.notes
        _check_something_scored(result, full)
    return result


def _check_records(settings: Settings, pool: Pool) -> None:
    """-f ids / -f paths: a name that cannot be written as one record fails now, not after the
    scoring (the table's writer checks the same)."""
    if settings.format == "ids":
        check_records(pool.ids, "ids", settings.null)
    elif settings.format == "paths" and getattr(pool, "paths", None) is not None:
        check_records((str(p) for p in pool.paths), "paths", settings.null)


def _score_in_memory(session: Session, todo: Pool, settings: Settings, on_start, on_batch, say,
                     embeddings) -> JobResult:
    rows: list[dict] = []
    errors: list[tuple[str, str]] = []

    def sink(batch_rows, batch_errors):
        rows.extend(batch_rows)
        errors.extend(batch_errors)

    if on_start:
        on_start(len(todo))
    stats = run(session.model, todo, settings, session.device, sink, on_batch,
                embeddings=embeddings, say=say)
    ranked = rank(rows)
    finished = Finished(count=len(ranked), nans=stats.nans, errors=sorted(errors), top=ranked[:5],
                        rows=ranked)
    return JobResult(finished, stats, shard=settings.shard)


def _score_to_file(ctx, session: Session, todo: Pool, shard, settings: Settings, dest: str,
                   on_start, on_batch, say, embeddings, exclusion=None) -> JobResult | None:
    """Rows stream through DEST.partial into the ranked table (rank 0 writes it under torchrun)."""
    full, shard_text = session.pool, f"{shard[0]}/{shard[1]}" if shard else None
    key = {**run_key(settings, full, session.model), **(exclusion.key() if exclusion else {})}
    with contextlib.ExitStack() as stack:
        partial_path, resumable = _partial_path(dest, ctx, {**key, "shard": shard_text}, stack)
        stack.enter_context(output_lock(lock_path(partial_path), _shown(dest)))
        log = PartialFile(partial_path, {**key, "shard": shard_text},
                          checkpoint_every=settings.checkpoint_every, resume=settings.resume,
                          restart=settings.restart, pool_ids=full.ids, say=say)
        if log.resumed and say:
            say(f"resuming: {log.resumed} examples of {partial_path} are done already")
        files_dir = None if writes_stream(dest) else os.path.abspath(sidecar(dest, "masks"))
        stats = _score(session, todo, settings, log, partial_path, resumable, on_start, on_batch,
                       say, embeddings, files_dir)
        if ctx is not None:  # the summary speaks for the whole run
            stats.count, stats.seconds = distributed.run_totals(ctx, stats.count, stats.seconds)
        if ctx is None and stats.count == 0 and not log.resumed and log.first_error:
            partial_path.unlink(missing_ok=True)  # fail before the table: an earlier one stays
            raise _nothing_read(full, stats.skipped, log.first_error)
        try:
            with _signals_raise(partial_path, resumable, f" while writing {_shown(dest)}"):
                result = _write(ctx, settings, dest, partial_path, full, todo, key,
                                shard_text if not ctx else None, stats, log.resumed, log.run_id,
                                exclusion.left_out if exclusion else None,
                                factors=embeddings is not None)
                if result is not None and embeddings is not None:
                    result.embeddings_file = _write_embeddings(
                        settings, dest, result, embeddings, partial_path.parent if resumable else None)
        except BrokenPipeError:  # `| head`: the reader has what it wanted; nothing to resume
            partial_path.unlink(missing_ok=True)
            raise
        distributed.barrier(ctx)
        partial_path.unlink(missing_ok=True)
    if result is not None and files_dir is None and stats.task in TASKS and TASKS[stats.task].row_files:
        result.warnings.append(f"the predicted masks are not written for {_shown(dest)}; score with "
                               f"-o FILE to have them in FILE.masks/ (pred_mask)")
    return result


def _shown(dest: str) -> str:
    return "the table to stdout" if dest == "-" else dest


def _partial_path(dest: str, ctx, run: dict, stack: contextlib.ExitStack) -> tuple[Path, bool]:
    """(the partial file, whether a later --resume can find it). For a table on stdout (or into
    a device or FIFO, where nothing is written beside it) it is ./.alcli/stdout-HASH.partial,
    HASH naming the run's settings, so the same command with --resume finds it; where ./.alcli
    cannot be made, a temporary folder (nothing resumable). A link named ./.alcli is refused."""
    suffix = f"{ctx.rank}-of-{ctx.world}.partial" if ctx else "partial"
    if not writes_stream(dest):
        return sidecar(dest, suffix), True
    digest = hashlib.blake2b(json.dumps(run, sort_keys=True).encode(), digest_size=6).hexdigest()
    folder = stdout_folder(f"runs writing {_shown(dest)} keep their partial file; remove it, or "
                           f"write the table with -o FILE")
    if folder is not None:
        return folder / f"stdout-{digest}.{suffix}", True
    folder = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="alcli-")))
    return folder / f"stdout.{suffix}", False


def _check_options(settings: Settings, ctx, dest: str | None) -> None:
    if dest is None:
        if settings.resume:
            raise ConfigError("resume needs an output file, where an unfinished run keeps its rows "
                              "(alcli score -o OUTPUT --resume)")
        return
    if ctx and settings.shard:
        raise ConfigError(f"--shard {settings.shard} cannot be combined with torchrun, where each "
                          f"process scores shard RANK/WORLD_SIZE already")
    if settings.resume and settings.restart:
        raise ConfigError("--resume and --restart contradict each other: --resume continues the "
                          "unfinished run, --restart discards it")
    refuse_remote(dest, settings.where("output"))
    refuse_remote(settings.embeddings_file, settings.where("embeddings_file"))
    if not writes_stream(dest):
        folder = Path(dest).parent
        make_folder(folder, f"output {dest}")
        if Path(dest).is_dir():
            raise ConfigError(f"output {dest} is a directory")
        check_writable(folder, f"output {dest}")
        check_not_input(dest, settings.where("output"), _inputs(settings),
                        beside=(*SIDECARS, "partial", "lock"))
        check_not_input(settings.embeddings_file, settings.where("embeddings_file"),
                        [*_inputs(settings), ("the table written", dest)])
    if settings.format not in TABLE_FORMATS:
        raise ConfigError(f"--format {settings.format} is for select; score writes "
                          f"{', '.join(TABLE_FORMATS)}")


def _inputs(settings: Settings) -> list[tuple[str, object]]:
    """The files `score` reads, which no output may replace: every file setting but the
    outputs (the table, its embeddings) and select's table (`scores`, which a config shared by
    score and select may name as score's output)."""
    return inputs_of(settings, unread=("embeddings_file", "scores"))


def run_key(settings: Settings, full: Pool, net: nn.Module) -> dict:
    """What must not change between a run and its resumption, or between the parts of a merge."""
    transform = dataclasses.asdict(settings.transform) if full.kind == "images" else None
    return {"pool_fingerprint": fingerprint(full.ids), "model": _model_key(settings, net),
            "arch": settings.arch, "arch_kwargs": settings.arch_kwargs or None,
            "strategy": settings.strategy, "top_classes": settings.top_classes,
            "layers": settings.layers, "seed": settings.seed,
            "labels_from_folders": settings.labels_from_folders, "transform": transform,
            **_text_key(settings, full),
            # settings that change the numbers, recorded when they are not the default
            **{k: getattr(settings, k) for k, default in (("decode", "cpu"), ("precision", "fp32"),
                                                          ("task", "auto"), ("egl_samples", 8),
                                                          ("aggregate", "mean"), ("temperature", 1.0), ("max_new_tokens", 32),
                                                          ("box_threshold", 0.5))
               if getattr(settings, k) != default}}


def _text_key(settings: Settings, full: Pool) -> dict:
    """What else must not change: the EMA weights, how texts are read, tokenized and shown, and
    the class names."""
    key = {"ema": True} if settings.ema else {}
    if full.kind == "text":
        key.update(text_column=settings.text_column, max_length=settings.max_length,
                   text_width=settings.text_width)
    if full.classes is not None:  # the names the pred and label columns show
        key.update(class_names=full.classes)
    return key


def _model_key(settings: Settings, net: nn.Module) -> str:
    """The checkpoint's name and a hash of its bytes (the first 256 MiB and the size beyond that);
    of a Hugging Face directory, those of all its files."""
    if settings.model is None:
        return type(net).__name__
    path = Path(settings.model)
    if remote.is_url(settings.model):  # the copy session.model_for loaded, named as the URL ends
        path = remote.local_copy(settings.model, CheckpointError)
    digest = hashlib.blake2b(digest_size=8)
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    size = sum(p.stat().st_size for p in files)
    left = 256 << 20
    for file in files:
        with open(file, "rb") as f:
            while left > 0 and (block := f.read(min(left, 1 << 20))):
                digest.update(block)
                left -= len(block)
    return f"{path.name} ({size} bytes, blake2b {digest.hexdigest()})"


class _Batches:
    """Consecutive batches of `size` pool positions, leaving out those whose examples are all
    done: the same batches the first run formed, so resumed rows match it exactly."""

    def __init__(self, ids: list[str], done: set[str], size: int):
        self.ids, self.done, self.size = ids, done, size

    def __iter__(self):
        n = len(self.ids)
        for start in range(0, n, self.size):
            positions = list(range(start, min(n, start + self.size)))
            if any(self.ids[i] not in self.done for i in positions):
                yield positions


def _score(session: Session, todo: Pool, settings: Settings, log: PartialFile, partial_path: Path,
           resumable: bool, on_start, on_batch, say, embeddings, files_dir: str | None) -> RunStats:
    done = log.done
    already = sum(1 for id_ in todo.ids if id_ in done) if done else 0
    if on_start:
        on_start(len(todo), done=already)  # the whole pool, the resumed part already counted

    def sink(rows, errors):  # a batch cut short by the crash is scored whole, written once
        rows = with_factors(rows, embeddings)
        if done:
            rows, errors = [r for r in rows if r["id"] not in done], [e for e in errors if e[0] not in done]
        log.add(rows, errors)

    batches = _Batches(todo.ids, done, settings.batch_size) if done else None
    try:
        with _signals_raise(partial_path, resumable):
            stats = run(session.model, todo, settings, session.device, sink, on_batch,
                        batches=batches, say=say, embeddings=embeddings, files_dir=files_dir)
    except Interrupted as err:
        log.close()
        if log.discard_if_empty():
            raise Interrupted(f"stopped by {signal.Signals(err.exit_code - 128).name} before any "
                              f"example was scored; nothing to resume", err.exit_code - 128) from None
        raise
    except BaseException:
        log.close()
        log.discard_if_empty()  # a run that scored nothing leaves no partial file
        raise
    log.close()  # what is finished is on disk, whatever stopped the run
    return stats


def with_factors(rows: list[dict], embeddings: EmbeddingRecorder | None) -> list[dict]:
    """Each row with its example's BADGE factors (`_emb`, see files.embeddings.encode_factors),
    so that they go wherever the row goes: the partial file, a resumed run, rank 0."""
    if embeddings is None:
        return rows
    taken = embeddings.take()
    if not taken.ids:
        return rows
    at = {id_: n for n, id_ in enumerate(taken.ids)}
    a, b = taken.a.numpy(), taken.b.numpy()
    return [{**row, "_emb": encode_factors(a[at[row["id"]]], b[at[row["id"]]])}
            if row["id"] in at else row for row in rows]


@contextlib.contextmanager
def _signals_raise(partial_path: Path, resumable: bool = True, doing: str = ""):
    """SIGINT and SIGTERM raise Interrupted (so the partial file is flushed on the way out, and
    a table being written is left as it was, its temporary file removed)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    owner = os.getpid()

    def stop(signum, frame):
        if os.getpid() != owner:  # a forked DataLoader worker: quietly, as torch expects
            raise KeyboardInterrupt
        name = signal.Signals(signum).name
        if resumable:
            raise Interrupted(f"stopped by {name}{doing}; the finished rows are in {partial_path}, "
                              f"run the same command with --resume to continue", signum)
        raise Interrupted(f"stopped by {name}{doing}; nothing can be resumed (the finished rows "
                          f"could not be kept under ./.alcli/; write the table with -o FILE to "
                          f"be able to resume)", signum)

    previous = {s: signal.signal(s, stop) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def _write(ctx, settings: Settings, dest: str, partial_path: Path, full: Pool, todo: Pool,
           key: dict, shard: str | None, stats: RunStats, resumed: int,
           run_id: str, left_out: list[dict] | None = None,
           factors: bool = False) -> JobResult | None:
    """The final table (rank 0 under torchrun, after gathering every rank's rows)."""
    sources = [partial_path]
    with contextlib.ExitStack() as stack:
        if ctx is not None:
            gathered = None
            if ctx.rank == 0:
                gathered = gather_target(partial_path)
                stack.callback(gathered.unlink, missing_ok=True)
                new_partial(gathered, key)
                sources.append(gathered)
            distributed.gather_lines(ctx, partial_path, gathered)
            if ctx.rank != 0:
                if not distributed.rank0_ok(ctx, True):
                    raise AlcliError("rank 0 could not write the table")
                return None
        try:
            finished = finish(sources, dest, settings.format, null=settings.null,
                              factors=factors)
            files = [] if writes_stream(dest) else write_sidecars(dest, finished, {
                "format": "alcli-table", "version": META_VERSION, "alcli_version": __version__, "table_format": settings.format,
                "shard": shard, "pool": full.name, "pool_size": len(full),
                "pool_path": _absolute(settings.pool), "model_file": _absolute(settings.model),
                "shard_size": len(todo) if shard else len(full), "run": key, "run_id": run_id,
                "task": stats.task,
                **described(full, settings), **({"excluded": left_out} if left_out else {})})
        except BaseException:
            distributed.rank0_ok(ctx, False)
            raise
        distributed.rank0_ok(ctx, True)
    return JobResult(finished, stats, resumed, shard, files, run_id=run_id)


def _write_embeddings(settings: Settings, dest: str, result: JobResult,
                      recorder: EmbeddingRecorder, stream_folder: Path | None) -> str | None:
    """TABLE.emb.npz from the factors the rows carried; None, with a note saying why, where
    there are none to write."""
    finished = result.finished
    if finished.embeddings is None and finished.count:
        why = recorder.skipped or (f"{finished.without_factors} of the {finished.count} rows were "
                                   f"scored without them, by an earlier run")
        result.stats.notes.append(f"no embeddings written ({why}); select cannot pick a diverse "
                                  f"batch from this table")
        return None
    path, note = save_table_embeddings(finished, dest, settings.format, result.run_id,
                                       destination(settings, dest), stream_folder)
    if note:
        result.stats.notes.append(note)
    return path


def described(full: Pool, settings: Settings) -> dict:
    """What `select` needs to know of the pool: its kind, its class names, the model's number of
    classes (a names file given to select must name as many) and, for text, where the whole
    texts are (the table holds them cut at text_width characters)."""
    meta = {"pool_kind": full.kind, "class_names": full.classes, "classes": full.outputs}
    if full.kind == "text":
        meta.update(text_column=settings.text_column, text_width=settings.text_width)
    return meta


def _absolute(path) -> str | None:
    """A file setting as an absolute path (what `select` reads back from OUTPUT.meta.json); a
    URL without its credentials."""
    if remote.is_url(path):
        return remote.shown(path)
    return os.path.abspath(path) if isinstance(path, str) and path != "-" else None


def _check_something_scored(result: JobResult, full: Pool) -> None:
    """Every example unreadable is a failed run, not an empty table."""
    f = result.finished
    if f.count == 0 and f.errors:
        raise _nothing_read(full, len(f.errors), f.errors[0][1])


def _nothing_read(pool: Pool, skipped: int, first: str) -> PoolError:
    return PoolError(f"no example of pool {pool.name} could be read ({skipped} skipped; the "
                     f"first: {first})")
