"""From a ranked table to a labeling batch and its hand-offs (what `alcli select` does after scoring).

    ranked rows -> drop --exclude ids -> choose (top-k | --per-class | --diverse [badge |
                   cluster-margin] | both)
                -> write (csv | jsonl | paths | labelstudio) [+ --contact-sheet PNG]

The algorithms live beside this file: choose.py (top-k, quotas from balance.py, BADGE from
diverse.py), exclusions.py and export.py (Label Studio, contact sheet). This module checks the
options, finds the files they need (embeddings beside the table, images under the pool) and turns
their errors into one sentence naming the option or file.
"""
from __future__ import annotations

import os
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from numbers import Real
from pathlib import Path
from typing import Iterable

import torch

from ..errors import AlcliError, ConfigError, TableError
from ..files.atomic import STREAM_FOLDER, make_folder, writes_stream
from ..files.classnames import check_names, multilabel_names, read_class_names
from ..files.config import Settings
from ..files.embeddings import (STREAM_KEEP, EmbeddingsError, embeddings_path, embeddings_run_id,
                                find_for_rows, load_embeddings)
from ..files.names import FileNameError, file_names, id_file
from ..files.outputs import check_not_input, check_outputs, inputs_of
from ..pools import (extracted, holds_tensors, id_files, local_file, open_pool, open_source,
                     reads_stdin, source_exists)
from ..pools.common import PoolOptions
from ..files.table import (LINE_FORMATS, MORE, SIDECARS, read_meta, remove_sidecars, sidecar,
                           write_table)
from ..tasks import TASKS, from_rows
from . import cost
from .choose import choose
from .duplicates import dedup, dedup_file, mark_labeled_tables, passed_note
from .coco_yolo import image_links, to_coco, to_yolo, write_yolo
from .exclusions import Exclusions, ExclusionsError, excluded_ids, read_exclusion_files
from .export import (IMAGE_ROOT_HINT, ImageRootError, contact_sheet, image_ref,
                     labeling_config, model_version_from, pairwise_config, pairwise_tasks,
                     text_sheet, to_labelstudio, unnamed, unreachable_image, write_folder,
                     write_json, write_text)
from .rank import is_scored, order_key, rank
from .typical import select_typical


# below this many labeled examples per class --typical is the better batch (README, cold start:
# measured with benchmarks/learning_curves.py)
COLD_START_PER_CLASS = 6


@dataclass
class SelectPlan:
    """What `prepare` checked before any scoring: the exclusions and the embeddings file."""

    exclusions: list[Exclusions] = field(default_factory=list)  # what --exclude names
    embeddings_file: str | None = None  # for --diverse on a table read from a file
    meta: dict = field(default_factory=dict)  # TABLE.meta.json of a table read from a file
    diverse: bool = False  # --diverse asked for, or by default with the embeddings at hand
    look_up: str | None = None  # the embeddings file the table lacks, looked up by its rows
    notes: list[str] = field(default_factory=list)  # warnings for people
    dedup_file: str | None = None  # the embeddings the near-duplicate check reads (duplicates.py)
    dedup_missing: str | None = None  # why there are none
    folder: str | None = None  # the folder of a table read from a file: its pred_mask paths' base


@dataclass
class Picked:
    rows: list[dict]       # the batch, best score first; `rank` = place in the whole ranking
    available: int         # how many rows it was chosen from (after exclusions)
    notes: list[str] = field(default_factory=list)  # warnings for people
    meta: dict = field(default_factory=dict)  # the table's meta.json, for the hand-offs
    texts: list[str] | None = None  # the whole text of each row, for a text pool's hand-offs
    class_names: list[str] | None = None  # names of the classes `pred` indexes, where known
    task: str = "classification"  # what the rows predict, for the Label Studio pre-labels


# --- select ---------------------------------------------------------------------------------------

def prepare(settings: Settings, source: str | None, score_first: bool,
            exclude_ids: Iterable | None = None) -> SelectPlan:
    """Check the selection options and read the exclusion files, before any scoring.

    `source` is the table file ('-' = stdin, None = rows in memory or scored in this process);
    `exclude_ids` are ids to exclude given in memory (the Python API)."""
    plan = SelectPlan()
    if source not in (None, "-"):
        plan.meta = read_meta(sidecar(source, "meta.json")) or {}
        plan.folder = os.path.dirname(os.path.abspath(source))
    if settings.exclude:
        try:
            plan.exclusions = read_exclusion_files(settings.exclude)
            mark_labeled_tables(settings, plan.exclusions)
        except ExclusionsError as err:
            raise ConfigError(f"{settings.where('exclude')}: {_sentence(err)}") from None
    if exclude_ids is not None:
        plan.exclusions.append(Exclusions("argument exclude= (ids)",
                                          [str(i) for i in exclude_ids]))
    _mode_asks_diverse(settings)
    if settings.sampling != "top" and settings.diverse:
        how = "Cluster-Margin" if settings.diverse_mode == "cluster-margin" else "BADGE"
        raise ConfigError(f"{settings.where('sampling')} {settings.sampling} draws the batch from "
                          f"the scores, and {settings.where('diverse')} picks it by {how}; "
                          f"choose one")
    if settings.typical:
        _check_typical(settings)
    # diverse by default, when the embeddings are at hand (and the batch is not drawn)
    plan.diverse = settings.diverse is not False and settings.sampling == "top" and \
        not settings.typical
    asked = _embeddings_flag(settings)  # the flag that needs the embeddings, if one does
    if not ((plan.diverse or settings.typical) and not score_first):  # else the file is looked for here
        plan.dedup_file, plan.dedup_missing = dedup_file(settings, source, plan.meta.get("run_id"))
    if (plan.diverse or settings.typical) and not score_first:
        path = settings.embeddings_file or (embeddings_path(str(source))
                                            if source not in (None, "-") else None)
        if source is None and path is None:
            if asked:
                raise ConfigError(f"{settings.where(asked)} needs the embeddings of the rows, "
                                  f"and rows in memory have none: pass "
                                  f"{settings.option('embeddings_file', 'FILE')}")
            plan.diverse = False
        elif path is None or (not settings.embeddings_file and not Path(path).is_file()):
            plan.look_up = path or "stdin"  # a table on stdout keeps them under ./.alcli/
        elif not Path(path).is_file():
            raise ConfigError(f"{settings.where('embeddings_file')}: the embeddings file {path} "
                              f"does not exist")
        else:
            plan.embeddings_file = path
            _check_same_run(settings, plan, source)
    if settings.null and settings.format not in LINE_FORMATS and \
            not (score_first and reads_stdin(settings.pool)):
        raise ConfigError(f"{settings.where('null')} ends -f paths and -f ids records with NUL; "
                          f"-f {settings.format} has no such records")
    if settings.pairwise and settings.format != "labelstudio" and not settings.labelstudio_config:
        raise ConfigError(f"{settings.where('pairwise')} shapes Label Studio tasks; pass "
                          f"{settings.option('format', 'labelstudio')} or "
                          f"{settings.option('labelstudio_config', 'XML')}")
    if settings.contact_sheet == "-":
        raise ConfigError(f"{settings.where('contact_sheet')} needs a PNG file name, not stdout")
    for key in ("contact_sheet", "output", "labelstudio_config"):
        target = getattr(settings, key)
        if target and target != "-":
            make_folder(Path(target).parent, f"{settings.where(key)} {target}")
    inputs = _inputs(settings, source, score_first)
    check_not_input(settings.output, settings.where("output"), inputs, beside=SIDECARS)
    if settings.format == "labelstudio" and not writes_stream(settings.output or "-"):
        frames = {f"{settings.where('output')}'s frames folder": frames_folder(settings.output)}
        check_outputs(frames, [*inputs, ("the batch written", settings.output)])
    check_not_input(settings.contact_sheet, settings.where("contact_sheet"),
                    [*inputs, ("the batch written", settings.output)])
    check_not_input(settings.labelstudio_config, settings.where("labelstudio_config"),
                    [*inputs, ("the batch written", settings.output),
                     ("the contact sheet", settings.contact_sheet)])
    if settings.contact_sheet and score_first and holds_tensors(settings.pool):
        raise ConfigError(f"{settings.where('contact_sheet')} draws images, but the pool "
                          f"{settings.pool} holds tensors")
    return plan


def _inputs(settings: Settings, source: str | None, score_first: bool) -> list[tuple[str, object]]:
    """The files `select` reads, which no output may replace: the table and every file setting
    but the outputs (the pool and model too: a table's texts and images are read from them)."""
    return [("the table read", source), *inputs_of(settings)]


def _embeddings_flag(settings: Settings) -> str | None:
    """The option that asks for the rows' embeddings (so their absence is an error), or None."""
    return "typical" if settings.typical else "diverse" if settings.diverse else None


def _mode_asks_diverse(settings: Settings) -> None:
    """--diverse-mode cluster-margin asks for a diverse batch (as --diverse does); with
    --no-diverse it is an error. The mode's source then stands for --diverse in messages."""
    if settings.diverse_mode == "badge" or "diverse_mode" not in settings.sources:
        return
    if settings.diverse is False:
        raise ConfigError(f"{settings.where('diverse_mode')} {settings.diverse_mode} picks a "
                          f"diverse batch, and {settings.where('diverse')} turns diverse "
                          f"selection off; choose one")
    if settings.diverse is None:
        settings.diverse = True
        settings.sources["diverse"] = settings.where("diverse_mode")


def _check_typical(settings: Settings) -> None:
    """--typical chooses the whole batch itself: no other way of choosing beside it."""
    others = [key for key, given in (("diverse", settings.diverse),
                                     ("per_class", settings.per_class),
                                     ("sampling", settings.sampling != "top")) if given]
    if others:
        raise ConfigError(f"{settings.where('typical')} picks the batch by typicality among "
                          f"clusters, and {settings.where(others[0])} chooses it another way; "
                          f"choose one")


def _check_same_run(settings: Settings, plan: SelectPlan, source: str | None) -> None:
    """The embeddings file and the table must come from one `score` run: both record its run id
    (files without one, from an older alcli or the Python API, are matched by their ids only).
    By default a mismatch means no diverse batch, with a warning; asked for, it is an error."""
    try:
        file_run = embeddings_run_id(plan.embeddings_file)
    except EmbeddingsError as err:
        raise ConfigError(_sentence(err)) from None
    table_run = plan.meta.get("run_id")
    if not file_run or not table_run or file_run == table_run:
        return
    problem = (f"the embeddings file {plan.embeddings_file} was written by another run than the "
               f"table {source} (the run ids in it and in {sidecar(source, 'meta.json').name} "
               f"differ)")
    if settings.diverse is None and not settings.embeddings_file and not settings.typical:
        plan.diverse, plan.embeddings_file = False, None
        plan.notes.append(f"selected the best scores without --diverse: {problem}; score again "
                          f"to write matching ones")
        return
    key = "embeddings_file" if settings.embeddings_file else _embeddings_flag(settings)
    raise ConfigError(f"{settings.where(key)}: {problem}; score the table again to write its "
                      f"own embeddings")


def pick(settings: Settings, rows: list[dict], plan: SelectPlan, *, embeddings=None,
         pool=None) -> Picked:
    """The batch: `rows` ranked, exclusions dropped, then chosen; the contact sheet drawn.

    `embeddings` (alcli.score.embeddings.Embeddings) are those captured in this process; otherwise
    --diverse reads `plan.embeddings_file`. `pool` is the pool scored in this process, if any."""
    ranked = rank(rows)
    try:
        # examples `score --exclude` left out of the table (its meta.json) match entries too
        gone = [e for e in plan.meta.get("excluded") or [] if isinstance(e, dict) and "id" in e]
        excluded, notes = excluded_ids(plan.exclusions, ranked + gone, settings.image_root)
        notes = plan.notes + notes
    except ExclusionsError as err:
        raise ConfigError(f"{settings.where('exclude')}: {_sentence(err)}") from None
    kept = [r for r in ranked if str(r["id"]) not in excluded]
    if not ranked:
        raise ConfigError("there are no rows to select from")
    if not kept:
        raise ConfigError(f"{settings.where('exclude')} excludes every one of the {len(ranked)} "
                          f"rows; nothing is left to select")
    if plan.look_up:
        _look_up(settings, plan, ranked, notes)
    if settings.typical:  # (one row per cluster: no near-duplicate pass)
        chosen, available = _typical(settings, plan, ranked, kept, embeddings), len(kept)
    else:
        if TASKS[export_task(settings, plan.meta, ranked)].no_badge:  # (a task whose rows never
            plan.dedup_missing = None  # have embeddings: nothing to check, nothing to say)
        kept, *passed, more = dedup(settings, plan, ranked, kept, embeddings)
        notes.extend(more)
        chosen, available = _chosen(settings, plan, kept, notes, embeddings)
        if plan.exclusions and not settings.quiet:  # advice, not a problem: -q drops it
            notes.extend(_cold_start_note(settings, ranked, len(excluded)))
        if not settings.quiet:  # a summary, not a problem: -q drops it
            notes.extend(filter(None, [passed_note(*passed, chosen, settings.dedup_threshold)]))
    chosen = table_paths(chosen, plan.folder)
    picked = Picked(chosen, available, notes, plan.meta)
    picked.task = export_task(settings, plan.meta, chosen)
    picked.class_names = class_names(settings, plan.meta, picked.task, ranked)
    if settings.format == "labelstudio":
        picked.notes.extend(_unnamed(chosen, picked.class_names, picked.task, settings))
    handoff = settings.contact_sheet or settings.format == "labelstudio" or settings.labelstudio_config
    if handoff and is_text(chosen, pool, plan.meta):
        picked.texts, more = whole_texts(chosen, settings, pool, plan.meta)
        picked.notes.extend(more)
    if settings.format == "labelstudio" and picked.texts is None and not settings.image_root:
        picked.notes.extend(_unopenable(chosen))
    if settings.contact_sheet and picked.texts is not None:
        draw_text_sheet(chosen, picked.texts, settings)
    elif settings.contact_sheet:
        paths = image_files(chosen, settings, pool, plan.meta)
        picked.notes.extend(draw_sheet(chosen, paths, settings))
    return picked


def table_paths(rows: list[dict], folder: str | None) -> list[dict]:
    """The rows with a relative `pred_mask` (segmentation's predicted mask, which `score` names
    relative to the table's folder, as a manifest's paths are) joined to `folder`, the table's:
    the hand-offs (Label Studio's brushes, the batch written) read it from any working folder.
    Rows not read from a file (`folder` None) are left as they are."""
    if folder is None:
        return rows
    return [{**r, "pred_mask": os.path.join(folder, r["pred_mask"])}
            if isinstance(r.get("pred_mask"), str) and r["pred_mask"] and not os.path.isabs(r["pred_mask"])
            else r for r in rows]


def _unopenable(rows: list[dict]) -> list[str]:
    """A warning when, without --image-root, data.image will hold ids a Label Studio server cannot
    open (not URLs)."""
    bare = unreachable_image([{"data": {"image": str(r["id"])}} for r in rows])
    if bare is None:
        return []
    return [f"data.image holds ids a Label Studio server cannot open (the first is '{bare}'); "
            f"{IMAGE_ROOT_HINT}"]


def _cold_start_note(settings: Settings, ranked: list[dict], labeled: int) -> list[str]:
    """A note when --exclude names fewer labeled examples than COLD_START_PER_CLASS per predicted
    class: there --typical beat the score-based batches in benchmarks/learning_curves.py."""
    classes = {r.get("pred") for r in ranked if isinstance(r.get("pred"), (int, str))}
    if len(classes) < 2 or labeled >= COLD_START_PER_CLASS * len(classes):
        return []
    return [f"{settings.where('exclude')} names {labeled} labeled examples, fewer than "
            f"{COLD_START_PER_CLASS} per class for the {len(classes)} classes predicted: at "
            f"that stage --typical picked better first batches than the scores (see "
            f"docs/selection.md, Cold start)"]


def _chosen(settings: Settings, plan: SelectPlan, kept: list[dict], notes: list[str],
            embeddings) -> tuple[list[dict], int]:
    """The batch by the scores (top, drawn, per class, diverse) and how many rows it came from."""
    diverse = plan.diverse and (embeddings is not None or plan.embeddings_file is not None)
    if plan.diverse and not diverse and settings.diverse:
        raise ConfigError(f"{settings.where('diverse')} needs the examples' embeddings, and none "
                          f"were recorded")
    if plan.diverse and not diverse:
        notes.append("selected the best scores without --diverse: no embeddings were recorded "
                     "(the model has no nn.Linear classification head)")
    if settings.per_class or diverse:
        eligible = [r for r in kept if is_scored(r)]
        if len(eligible) < len(kept):
            notes.append(f"{len(kept) - len(eligible)} rows without a finite score are left out "
                         f"of {'per-class' if settings.per_class else 'diverse'} selection")
        if not eligible:
            raise ConfigError("no row has a finite score; nothing to select")
    else:
        eligible = kept
    try:  # --cost: chosen by score per cost, then cut to --budget-cost (selection/cost.py)
        eligible = cost.per_cost(eligible, settings.cost) if settings.cost else eligible
        budget = min(settings.budget or len(eligible), cost.fits(eligible, settings.budget_cost)
                     if settings.budget_cost is not None else len(eligible))
    except ValueError as err:
        raise ConfigError(_sentence(err)) from None
    factors = _factors(settings, eligible, plan, embeddings) if diverse else None
    try:
        chosen = choose(eligible, max(1, budget), per_class=settings.per_class, factors=factors,
                        seed=settings.seed, candidates=settings.diverse_candidates,
                        sampling=settings.sampling, beta=settings.sampling_beta,
                        diverse_mode=settings.diverse_mode, clusters=settings.diverse_clusters)
    except ValueError as err:
        raise ConfigError(_sentence(err)) from None
    if settings.cost:
        chosen = cost.restored(cost.within(chosen, settings.budget_cost, eligible,
                                           settings.budget))
    return chosen, len(eligible)


def _typical(settings: Settings, plan: SelectPlan, ranked: list[dict], kept: list[dict],
             embeddings) -> list[dict]:
    """--typical: TypiClust over every kept row (scored or not); the excluded rows with an
    embedding are the labeled ones, whose clusters count as covered."""
    if embeddings is None and plan.embeddings_file is None:
        raise ConfigError(f"{settings.where('typical')} needs the examples' embeddings, and none "
                          f"were recorded (the model has no nn.Linear classification head)")
    if embeddings is not None:
        file_ids, b = embeddings.ids, embeddings.b
    else:
        try:
            file_ids, _, b = load_embeddings(plan.embeddings_file)
        except EmbeddingsError as err:
            raise ConfigError(_sentence(err)) from None
    index = {i: n for n, i in enumerate(file_ids)}
    kept_ids = {str(r["id"]) for r in kept}
    missing = next((str(r["id"]) for r in kept if str(r["id"]) not in index), None)
    if missing is not None:
        raise ConfigError(f"the row '{missing}' has no embedding in "
                          f"{plan.embeddings_file or 'those recorded when the rows were scored'}; "
                          f"score the table again to write its own embeddings")
    labeled = [index[str(r["id"])] for r in ranked
               if str(r["id"]) not in kept_ids and str(r["id"]) in index]
    b = torch.as_tensor(b)
    take = torch.tensor([index[str(r["id"])] for r in kept], dtype=torch.long)
    picks = select_typical(b[take], b[torch.tensor(labeled, dtype=torch.long)], settings.budget,
                           settings.seed)
    return sorted((kept[p] for p in picks), key=order_key)


def _look_up(settings: Settings, plan: SelectPlan, rows: list[dict], notes: list[str]) -> None:
    """A table without its embeddings file beside it (on stdin, or written to stdout and saved
    by the shell) finds it under ./.alcli/ by its rows' ids and scores; else the plain top N,
    with the warning that says how to get a diverse batch (an error when --diverse asks for it)."""
    no_badge = TASKS[export_task(settings, plan.meta, rows)].no_badge
    if no_badge:  # no file can hold them: say what spreads a batch without them
        _without_embeddings(settings, plan, no_badge, notes)
        return
    found = find_for_rows(STREAM_FOLDER, rows)
    if found:
        plan.embeddings_file = found
        return
    if plan.look_up == "stdin":
        problem = (f"the table on stdin matches none of the embeddings `alcli score` keeps under "
                   f"./{STREAM_FOLDER}/ for tables it writes to stdout (the newest "
                   f"{STREAM_KEEP}, in the folder it ran in)")
    else:
        problem = (f"the table has no embeddings file {plan.look_up} (scored with "
                   f"--no-embeddings, or by a model without an nn.Linear classification head)")
    if _embeddings_flag(settings):
        write = "; score with --embeddings to write them" if settings.typical else ""
        raise ConfigError(f"{settings.where(_embeddings_flag(settings))} needs the table's "
                          f"embeddings: {problem}; pass "
                          f"{settings.option('embeddings_file', 'FILE')}{write}")
    plan.diverse = False
    notes.append(f"selected the best scores without --diverse: {problem}; pass "
                 f"{settings.option('embeddings_file', 'FILE')}")


WITHOUT_EMBEDDINGS = ("--no-diverse takes the best scores, --per-class proportional|equal spreads "
                      "them over the predicted classes, --sampling power|softmax draws them from "
                      "the scores")


def _without_embeddings(settings: Settings, plan: SelectPlan, no_badge: str, notes: list[str]) -> None:
    """The rows' task has no BADGE embeddings (Task.no_badge): --diverse or --typical is an
    error, else the best scores, each with what works instead."""
    if _embeddings_flag(settings):
        raise ConfigError(f"{settings.where(_embeddings_flag(settings))} needs the rows' "
                          f"embeddings, and {no_badge}; {WITHOUT_EMBEDDINGS}")
    plan.diverse = False
    notes.append(f"no --diverse batch: {no_badge}; {WITHOUT_EMBEDDINGS}")


def check_rows(rows: list) -> None:
    """Rows given in memory (the Python API): dicts, each with an id and a numeric score (None or
    NaN: unscored), no id twice (as text, which is what selection compares)."""
    seen: dict[str, int] = {}
    for n, row in enumerate(rows):
        if not isinstance(row, Mapping):
            raise TableError(f"rows[{n}] is not a dict with 'id' and 'score' (type "
                             f"{type(row).__name__})")
        for key in ("id", "score"):
            if key not in row:
                raise TableError(f"rows[{n}] has no '{key}' (keys: {', '.join(map(str, row))})")
        score = row["score"]
        if score is not None and (isinstance(score, bool) or not isinstance(score, Real)):
            raise TableError(f"rows[{n}] (id '{row['id']}'): score {score!r} is not a number")
        id_ = str(row["id"])
        if id_ in seen:
            raise TableError(f"rows[{seen[id_]}] and rows[{n}] have the same id '{id_}'; each "
                             f"example must appear once")
        seen[id_] = n


def _factors(settings: Settings, rows: list[dict], plan: SelectPlan, embeddings):
    """(a, b) aligned with `rows`: from this process's capture, or from the embeddings file."""
    ids = [str(r["id"]) for r in rows]
    if embeddings is not None:
        index = {i: n for n, i in enumerate(embeddings.ids)}
        missing = next((i for i in ids if i not in index), None)
        if missing is not None:
            raise ConfigError(f"the row '{missing}' has no embedding among those recorded when "
                              f"the rows were scored (was it renamed or added since?); select "
                              f"with {settings.option('diverse', 'False')}, or from the rows "
                              f"as scored")
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

def write_batch(rows: list[dict], dest: str | None, settings: Settings,
                meta: dict | None = None, *, texts: list[str] | None = None,
                class_names: list[str] | None = None, task: str | None = None) -> None:
    """The batch to `dest` ('-' or None = stdout) as csv, jsonl, paths, ids or Label Studio tasks
    (pre-labelled as `task`'s predictions, by default the one `export_task` finds), and the
    labeling config to --labelstudio-config. Label Studio's model_version is the checkpoint the
    table's `meta` names, else --model's; `texts` (a text pool's, one per row) go in data.text;
    `class_names` name integer preds."""
    task = task or export_task(settings, meta or {}, rows)
    # refused before any output: a config that cannot be made, rows without a pair
    pairs = _pairwise_tasks(rows, settings, meta, task) if settings.pairwise else None
    config = _config(settings, task, class_names, texts is not None)
    if pairs is not None and settings.format == "labelstudio":
        _write_json(pairs, dest)
    elif settings.format == "labelstudio":
        _write_tasks(rows, dest, settings, meta, texts, class_names, task)
    elif settings.format in ("coco", "yolo"):
        _write_boxes(rows, dest, settings, class_names, task, meta)
    else:
        write_table(rows, dest, settings.format, settings.null)
    if config is not None:
        try:
            write_text(config, settings.labelstudio_config)
        except OSError as err:
            raise ConfigError(f"{settings.where('labelstudio_config')} "
                              f"{settings.labelstudio_config}: cannot write it "
                              f"({err.strerror or err})") from None
    if not writes_stream(dest):
        remove_sidecars(dest)  # a batch written over an earlier table: its files go with it


def _write_tasks(rows: list[dict], dest: str | None, settings: Settings, meta: dict | None,
                 texts: list[str] | None, class_names: list[str] | None, task: str) -> None:
    tasks = labelstudio_tasks(rows, settings, meta, texts, class_names, task)
    if texts is None:
        _extract_frames(rows, tasks, dest, settings, meta)
    _write_json(tasks, dest)


def frames_folder(dest: str) -> Path:
    """BATCH.frames/, beside the batch: the images extracted for its tasks (a video's frames)."""
    return Path(f"{dest}.frames")


def _extract_frames(rows: list[dict], tasks: list[dict], dest: str | None, settings: Settings,
                    meta: dict | None) -> None:
    """Rows whose source Label Studio cannot show in place (a video's frame): each extracted as a
    PNG into BATCH.frames/ (named by files.names.id_file), its task's data.image that file's path
    relative to the batch's folder, under --image-root."""
    sources = image_files(rows, settings, None, meta)
    wanted = [n for n, source in enumerate(sources) if extracted(source)]
    if not wanted:
        return
    if dest is None or writes_stream(dest):
        raise ConfigError(f"{settings.where('format')} labelstudio: the batch's {len(wanted)} video "
                          f"frames are extracted as images beside the batch; name it with "
                          f"{settings.option('output', 'FILE')}")
    folder = frames_folder(dest)
    try:
        names = file_names([rows[n]["id"] for n in wanted], lambda i: id_file(i, ".png"))
        files = {names[rows[n]["id"]]: open_source(sources[n]).getvalue() for n in wanted}
    except FileNameError as err:
        raise TableError(f"cannot name the batch's frames: {_sentence(err)}") from None
    except (OSError, ValueError) as err:
        raise TableError(f"cannot extract a frame of the batch ({_sentence(err)})") from None
    try:
        write_folder(files, folder)
    except OSError as err:
        raise TableError(f"cannot write {folder} ({err.strerror or err})") from None
    for n in wanted:
        ref = image_ref(f"{folder.name}/{names[rows[n]['id']]}", settings.image_root)
        tasks[n]["data"]["image"] = ref


def _write_json(tasks: list[dict], dest: str | None) -> None:
    try:
        write_json(tasks, dest or "-")
    except ValueError as err:  # a value that JSON cannot hold
        raise TableError(f"cannot write Label Studio tasks: {_sentence(err)}") from None
    except OSError as err:
        raise TableError(f"cannot write output {dest} ({err.strerror or err})") from None


def _write_boxes(rows: list[dict], dest: str | None, settings: Settings,
                 class_names: list[str] | None, task: str, meta: dict | None = None) -> None:
    """-f coco (a JSON document to DEST or stdout) or -f yolo (a folder, -o DIR)."""
    if settings.format == "yolo" and dest in (None, "-"):
        raise ConfigError(f"{settings.where('format')} yolo writes a folder of files; name it with "
                          f"{settings.option('output', 'DIR')}")
    try:
        if settings.format == "coco":
            write_json(to_coco(rows, class_names, task), dest or "-")
        else:
            files = to_yolo(rows, class_names, task)
            sources = image_files(rows, settings, None, meta)
            links = image_links(rows, sources)
            missing = [src for row, src in zip(rows, sources) if not (src and os.path.isfile(src))]
            if missing:
                warnings.warn(f"{len(missing)} of the batch's {len(rows)} images were not found (the "
                              f"first: {missing[0]}), so the YOLO folder's images/ lacks them; "
                              f"give --image-dir DIR, the folder their ids are paths under",
                              stacklevel=2)
            write_yolo(files, dest, links)
    except ValueError as err:
        raise TableError(f"cannot write {settings.format.upper()} files: {_sentence(err)}") from None
    except OSError as err:
        raise TableError(f"cannot write output {dest} ({err.strerror or err})") from None


def labelstudio_tasks(rows: list[dict], settings: Settings, meta: dict | None,
                      texts: list[str] | None, class_names: list[str] | None, task: str) -> list[dict]:
    """The batch as Label Studio tasks with `task`'s pre-labels (-f labelstudio, alcli push)."""
    model = (meta or {}).get("model_file") or settings.model
    version = model_version_from(model) if model else "unknown"
    try:
        return to_labelstudio(rows, settings.image_root, version, texts=texts,
                              class_names=class_names, task=task,
                              from_name=settings.from_name or "label", to_name=settings.to_name)
    except ImageRootError as err:
        raise ConfigError(f"{settings.where('image_root')} {settings.image_root}: "
                          f"{_sentence(err)}") from None
    except ValueError as err:  # a score that JSON cannot hold, a bad boxes or pred_mask cell
        raise TableError(f"cannot write Label Studio tasks: {_sentence(err)}") from None


def _pairwise_tasks(rows: list[dict], settings: Settings, meta: dict | None, task: str) -> list[dict]:
    """--pairwise: each row as a prompt and two answers (Task.pairs), for Label Studio's
    pairwise-preference template; one sentence for rows of a task without pairs, or without them."""
    where = settings.where("pairwise")
    pair = TASKS[task].pairs if task in TASKS else None
    if pair is None:
        raise ConfigError(f"{where} hands over a prompt and two completions per task, which "
                          f"{task} rows do not have; it is for tables of --task causal-lm scored "
                          f"with -s egl")
    for row in rows:
        try:
            pair(row)
        except ValueError as err:
            raise ConfigError(f"{where}: {_sentence(err)}; score the pool with -s egl (and "
                              f"--egl-samples 2 or more) on the causal language model") from None
    model = (meta or {}).get("model_file") or settings.model
    try:
        return pairwise_tasks(rows, model_version_from(model) if model else "unknown", pair)
    except ValueError as err:  # a score that JSON cannot hold
        raise TableError(f"cannot write Label Studio tasks: {_sentence(err)}") from None


def _config(settings: Settings, task: str, class_names: list[str] | None, text: bool) -> str | None:
    """--labelstudio-config FILE: the labeling config the tasks' pre-labels fit (None: not asked)."""
    if not settings.labelstudio_config:
        return None
    try:
        if settings.pairwise:
            return pairwise_config(settings.from_name or "label")
        return labeling_config(task, class_names, "text" if text else "image",
                               settings.from_name or "label", settings.to_name)
    except ValueError as err:
        raise ConfigError(f"{settings.where('labelstudio_config')} {settings.labelstudio_config}: "
                          f"{_sentence(err)}; pass {settings.option('class_names', 'FILE')}, one "
                          f"name per line") from None


def export_task(settings: Settings, meta: dict, rows: list[dict]) -> str:
    """The task the rows predict: --task when given, else the one the table's meta.json (or this
    process's run) records, else what the rows carry (`tasks.from_rows`: `boxes` for detection,
    `pred_words` for token classification; else classification)."""
    if settings.task not in (None, "auto"):
        return settings.task
    if isinstance(meta.get("task"), str):
        return meta["task"]
    return from_rows(rows)


def image_files(rows: list[dict], settings: Settings, pool=None, meta: dict | None = None
                ) -> list[str]:
    """The image file of each row, for the contact sheet, from the first that knows it:
    --image-dir DIR (the ids are paths under DIR); the row's `path` column; the pool scored in
    this process; the pool the table's `meta` records; the configured pool (a folder: ids under
    it; a manifest: its path column); else the id itself."""
    ids = [str(r["id"]) for r in rows]
    if settings.image_dir:
        return [i if os.path.isabs(i) else os.path.join(settings.image_dir, i) for i in ids]
    if all(r.get("path") for r in rows):
        return [str(r["path"]) for r in rows]
    if pool is not None:
        if getattr(pool, "kind", None) != "images":
            raise ConfigError(f"{settings.where('contact_sheet')} draws images, but the pool "
                              f"{pool.name} holds tensors")
        by_id = dict(zip(pool.ids, (str(p) for p in pool.paths)))
        return [by_id.get(i, i) for i in ids]
    mapped = id_files((meta or {}).get("pool_path") or settings.pool)
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


def draw_sheet(rows: list[dict], paths: list[str], settings: Settings) -> list[str]:
    """Draw the contact sheet; warnings for images that could not be read."""
    where = settings.where("contact_sheet")
    if not any(source_exists(p) for p in paths):
        raise ConfigError(f"{where}: none of the {len(paths)} selected images was found (the "
                          f"first would be {paths[0]}); pass {settings.option('image_dir', 'DIR')}, "
                          f"the folder the ids are relative to")
    try:
        failed = contact_sheet(rows, None, settings.contact_sheet, paths=paths)
    except OSError as err:
        raise ConfigError(f"{where}: cannot write {settings.contact_sheet} "
                          f"({err.strerror or err})") from None
    if failed:
        return [f"{len(failed)} of {len(rows)} images could not be read for the contact sheet "
                f"(the first is {failed[0]}); they are grey tiles"]
    return []


# --- class names and texts ------------------------------------------------------------------------

def class_names(settings: Settings, meta: dict, task: str = "classification",
                rows: list[dict] = ()) -> list[str] | None:
    """The names of the classes: from --class-names, else those the table's meta.json records.
    A names file must name as many classes as the model outputs: as many as the table's
    meta.json records, and more than any class index a classification row predicts."""
    recorded = meta.get("class_names")
    recorded = recorded if isinstance(recorded, list) and recorded and \
        all(isinstance(n, str) for n in recorded) else None
    if not settings.class_names:
        if recorded is not None:
            check_names(recorded, "the table's meta.json")
            if TASKS[task].joins_labels:
                multilabel_names(recorded, "the table's meta.json")
        return recorded
    where = settings.where("class_names")
    names = read_class_names(settings.class_names, where)
    source = f"{where}: class names file {settings.class_names}"
    outputs = meta.get("classes") if isinstance(meta.get("classes"), int) else \
        len(recorded) if recorded is not None else None
    if outputs is not None and len(names) != outputs and TASKS[task].names_classes:
        raise ConfigError(f"{source} names {len(names)} classes, but the model that scored the "
                          f"table outputs {outputs} (its meta.json says so)")
    if TASKS[task].class_pred:
        for n, row in enumerate(rows, 1):
            index = row.get("pred_index", row.get("pred"))
            if isinstance(index, int) and not isinstance(index, bool) and index >= len(names):
                raise ConfigError(f"{source} names {len(names)} classes, but the row of id "
                                  f"'{row.get('id')}' predicts class index {index}, so the "
                                  f"model outputs at least {index + 1}")
    if TASKS[task].joins_labels:
        multilabel_names(names, source)
    return names


def _unnamed(rows: list[dict], names: list[str] | None, task: str, settings: Settings) -> list[str]:
    """A warning when Label Studio tasks go without (some of) their pre-labels for want of class
    names."""
    bare = unnamed(rows, names, task)
    if not bare:
        return []
    what = TASKS[task].unnamed_note if task in TASKS else "predicted classes without a name, left out"
    return [f"{bare} of the {len(rows)} Label Studio tasks carry {what}: the table gives class "
            f"indices and no class names are known (pass "
            f"{settings.option('class_names', 'FILE')}, one name per line)"]


def is_text(rows: list[dict], pool, meta: dict) -> bool:
    """Are these rows of a text pool? The pool scored here, the table's meta.json, or the rows'
    own columns (a `text`, no `path`) say so."""
    if pool is not None:
        return getattr(pool, "kind", None) == "text"
    if meta.get("pool_kind"):
        return meta["pool_kind"] == "text"
    return bool(rows) and all("text" in r and "path" not in r for r in rows)


NO_TOKENIZER = lambda: None  # noqa: E731 - a text pool opened for its texts only


def whole_texts(rows: list[dict], settings: Settings, pool, meta: dict) -> tuple[list[str], list[str]]:
    """(each row's whole text, warnings): from the pool scored here, else from the text pool file
    the table's meta.json (or the config) names, else the table's `text` column, which may be
    cut at --text-width characters (said in a warning)."""
    by_id = {}
    if pool is not None:
        by_id = dict(zip(pool.ids, getattr(pool, "texts", [])))
    else:
        spec = meta.get("pool_path") or settings.pool
        if local_file(spec):
            opts = PoolOptions(text_column=meta.get("text_column") or settings.text_column,
                               tokenizer=NO_TOKENIZER, class_names=meta.get("class_names"))
            try:
                opened = open_pool(spec, opts)
                by_id = dict(zip(opened.ids, getattr(opened, "texts", [])))
            except AlcliError:
                by_id = {}
    texts = [by_id.get(str(r["id"]), str(r.get("text") or "")) for r in rows]
    cut = [r for r, t in zip(rows, texts) if t.endswith(MORE) and str(r["id"]) not in by_id]
    notes = [] if not cut else [
        f"the texts of {len(cut)} selected rows are cut at {len(cut[0]['text']) - 1} characters "
        f"(the table's text column; the text pool file was not found); score with "
        f"{settings.option('text_width', '0')} to keep whole texts"]
    return texts, notes


def draw_text_sheet(rows: list[dict], texts: list[str], settings: Settings) -> None:
    try:
        text_sheet(rows, texts, settings.contact_sheet)
    except OSError as err:
        raise ConfigError(f"{settings.where('contact_sheet')}: cannot write "
                          f"{settings.contact_sheet} ({err.strerror or err})") from None
