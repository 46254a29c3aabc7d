"""From a ranked table to a labeling batch and its hand-offs (what `alcli select` does after scoring).

    ranked rows -> drop --exclude ids -> choose (top-k | --per-class | --diverse | both)
                -> write (csv | jsonl | paths | labelstudio) [+ --contact-sheet PNG]

The algorithms live in alcli.selection (choose), alcli.balance (quotas, exclusion files),
alcli.diverse (BADGE) and alcli.export (Label Studio, contact sheet); this module checks the options,
finds the files they need (embeddings beside the table, images under the pool) and turns their
errors into one sentence naming the option or file.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from .config import Settings
from .errors import ConfigError, TableError
from .selection import choose, is_scored, rank


@dataclass
class Plan:
    """What `prepare` checked before any scoring: the excluded ids and the embeddings file."""

    excluded: set[str] = field(default_factory=set)
    embeddings_file: str | None = None  # for --diverse on a table read from a file


@dataclass
class Selection:
    rows: list[dict]       # the batch, best score first; `rank` = place in the whole ranking
    available: int         # how many rows it was chosen from (after exclusions)
    notes: list[str] = field(default_factory=list)  # warnings for people


# --- score --embeddings -------------------------------------------------------------------------

def embeddings_destination(settings: Settings, table_dest: str | None) -> str | None:
    """Where `score` writes embeddings: None (not asked), the configured file, or beside the table."""
    from .diverse import embeddings_path
    if not settings.embeddings:
        return None
    if isinstance(settings.embeddings, str):
        return settings.embeddings
    if table_dest in (None, "-"):
        raise ConfigError(f"{settings.where('embeddings')} writes the embeddings beside the table, "
                          f"so the table must go to a file: pass -o/--output FILE")
    return embeddings_path(str(table_dest))


def save_embeddings(embeddings, path: str) -> None:
    from .diverse import save_embeddings as save
    try:
        save(path, embeddings.ids, embeddings.a, embeddings.b)
    except OSError as err:
        raise TableError(f"cannot write embeddings file {path} ({err.strerror or err})") from None


# --- select ---------------------------------------------------------------------------------------

def prepare(settings: Settings, source: str | None, score_first: bool) -> Plan:
    """Check the selection options and read the exclusion files, before any scoring.

    `source` is the table file ('-' = stdin, None = rows in memory or scored in this process)."""
    from .balance import ExclusionsError, read_exclusions
    from .diverse import embeddings_path
    plan = Plan()
    if settings.exclude:
        try:
            plan.excluded = read_exclusions(settings.exclude)
        except ExclusionsError as err:
            raise ConfigError(f"{settings.where('exclude')}: {_sentence(err)}") from None
    if settings.diverse and not score_first:
        if isinstance(settings.embeddings, str):
            path = settings.embeddings
        elif source not in (None, "-"):
            path = embeddings_path(str(source))
        else:
            raise ConfigError(f"{settings.where('diverse')} needs the embeddings of the table, and "
                              f"a table from stdin (or rows in memory) has no file beside it: "
                              f"pass --embeddings FILE")
        if not Path(path).is_file():
            raise ConfigError(f"{settings.where('diverse')} needs the embeddings file {path}, which "
                              f"does not exist; write it with `alcli score --embeddings -o TABLE`")
        plan.embeddings_file = path
    if settings.contact_sheet == "-":
        raise ConfigError(f"{settings.where('contact_sheet')} needs a PNG file name, not stdout")
    for key in ("contact_sheet", "output"):
        target = getattr(settings, key)
        if target and target != "-" and not Path(target).resolve().parent.is_dir():
            raise ConfigError(f"{settings.where(key)} {target}: the folder "
                              f"{Path(target).parent} does not exist")
    if settings.contact_sheet and score_first and settings.pool and \
            Path(settings.pool).suffix.lower() in (".pt", ".pth", ".npy", ".npz"):
        raise ConfigError(f"{settings.where('contact_sheet')} draws images, but the pool "
                          f"{settings.pool} holds tensors")
    return plan


def pick(settings: Settings, rows: list[dict], plan: Plan, *, embeddings=None,
         pool=None) -> Selection:
    """The batch: `rows` ranked, exclusions dropped, then chosen; the contact sheet drawn.

    `embeddings` (alcli.embeddings.Embeddings) are those captured in this process; otherwise
    --diverse reads `plan.embeddings_file`. `pool` is the pool scored in this process, if any."""
    ranked = rank(rows)
    kept = [r for r in ranked if str(r["id"]) not in plan.excluded]
    notes = []
    if not ranked:
        raise ConfigError("there are no rows to select from")
    if not kept:
        raise ConfigError(f"{settings.where('exclude')} excludes every one of the {len(ranked)} "
                          f"rows; nothing is left to select")
    if settings.per_class or settings.diverse:
        eligible = [r for r in kept if is_scored(r)]
        if len(eligible) < len(kept):
            notes.append(f"{len(kept) - len(eligible)} rows without a finite score are left out "
                         f"of {'per-class' if settings.per_class else 'diverse'} selection")
        if not eligible:
            raise ConfigError("no row has a finite score; nothing to select")
    else:
        eligible = kept
    factors = _factors(settings, eligible, plan, embeddings) if settings.diverse else None
    try:
        chosen = choose(eligible, settings.budget, per_class=settings.per_class, factors=factors,
                        seed=settings.seed, candidates=settings.diverse_candidates)
    except ValueError as err:
        raise ConfigError(_sentence(err)) from None
    selection = Selection(chosen, len(eligible), notes)
    if settings.contact_sheet:
        paths = image_files(chosen, settings, pool)
        selection.notes.extend(draw_sheet(chosen, paths, settings))
    return selection


def _factors(settings: Settings, rows: list[dict], plan: Plan, embeddings):
    """(a, b) aligned with `rows`: from this process's capture, or from the embeddings file."""
    import torch
    from .diverse import EmbeddingsError, load_embeddings
    ids = [str(r["id"]) for r in rows]
    if embeddings is not None:
        index = {i: n for n, i in enumerate(embeddings.ids)}
        take = torch.tensor([index[i] for i in ids], dtype=torch.long)
        return embeddings.a[take], embeddings.b[take]
    try:
        _, a, b = load_embeddings(plan.embeddings_file, ids)
    except EmbeddingsError as err:
        raise ConfigError(_sentence(err)) from None
    return a, b


def _sentence(err: Exception) -> str:
    return str(err).rstrip(".")


# --- hand-offs ------------------------------------------------------------------------------------

def write_batch(rows: list[dict], dest: str | None, settings: Settings) -> None:
    """The batch to `dest` ('-' or None = stdout) as csv, jsonl, paths or Label Studio tasks."""
    if settings.format != "labelstudio":
        from .table import write_table
        write_table(rows, dest, settings.format)
        return
    from .export import model_version_from, to_labelstudio, write_json
    version = model_version_from(settings.model) if settings.model else "unknown"
    try:
        write_json(to_labelstudio(rows, settings.image_root, version), dest or "-")
    except ValueError as err:  # a score that JSON cannot hold
        raise TableError(f"cannot write Label Studio tasks: {_sentence(err)}") from None
    except OSError as err:
        raise TableError(f"cannot write output {dest} ({err.strerror or err})") from None


def image_files(rows: list[dict], settings: Settings, pool=None) -> list[str]:
    """The image file of each row, for the contact sheet.

    --image-dir DIR: the ids are paths under DIR. Else the pool scored in this process maps ids to
    its files; else the configured pool (a folder: ids under it; a manifest: its path column);
    an id that is itself an existing file path is taken as it is."""
    ids = [str(r["id"]) for r in rows]
    if settings.image_dir:
        return [i if os.path.isabs(i) else os.path.join(settings.image_dir, i) for i in ids]
    if pool is not None:
        if getattr(pool, "kind", None) != "images":
            raise ConfigError(f"{settings.where('contact_sheet')} draws images, but the pool "
                              f"{pool.name} holds tensors")
        by_id = dict(zip(pool.ids, (str(p) for p in pool.paths)))
        return [by_id.get(i, i) for i in ids]
    mapped = _pool_files(settings)
    out = []
    for i in ids:
        guess = mapped(i)
        if guess and os.path.isfile(guess):
            out.append(guess)
        elif guess and not os.path.isfile(i):
            out.append(guess)  # missing either way: name the file under the pool
        else:
            out.append(i)
    return out


def _pool_files(settings: Settings):
    """id -> file under the configured pool (None when it says nothing about that id)."""
    spec = settings.pool
    if not spec or spec == "-":
        return lambda i: None
    path = Path(spec)
    if path.is_dir():
        return lambda i: str(path / i)
    if path.suffix.lower() in (".csv", ".jsonl") and path.is_file():
        from .pool import PoolOptions, open_pool
        pool = open_pool(spec, PoolOptions())
        by_id = dict(zip(pool.ids, (str(p) for p in pool.paths)))
        return by_id.get
    return lambda i: None


def draw_sheet(rows: list[dict], paths: list[str], settings: Settings) -> list[str]:
    """Draw the contact sheet; warnings for images that could not be read."""
    from .export import contact_sheet
    where = settings.where("contact_sheet")
    if not any(os.path.isfile(p) for p in paths):
        raise ConfigError(f"{where}: none of the {len(paths)} selected images was found (the "
                          f"first would be {paths[0]}); pass --image-dir DIR, the folder the ids "
                          f"are relative to")
    try:
        failed = contact_sheet(rows, None, settings.contact_sheet, paths=paths)
    except OSError as err:
        raise ConfigError(f"{where}: cannot write {settings.contact_sheet} "
                          f"({err.strerror or err})") from None
    if failed:
        return [f"{len(failed)} of {len(rows)} images could not be read for the contact sheet "
                f"(the first is {failed[0]}); they are grey tiles"]
    return []
