"""Near-duplicates among a pool's rows and against the examples already labeled.

Two rows are near-duplicates when the cosine of their features (the penultimate features b of
TABLE.emb.npz, alcli/files/embeddings.py) is at least the threshold; exact duplicates when their
content keys are equal: a text row's normalized text (lowercase, whitespace collapsed), an image
row's decoded pixels (alcli.pools.pixel_key of its `path`: one picture under two names or in two
lossless formats), else the bytes of its features (the model saw the very same input). Rows with
one key are duplicates whatever their cosine (a case change moves a case-sensitive model's
features). Pictures are decoded only for the rows that may have a twin: those in a pair above the
threshold or sharing their features' bytes with another row (one picture gives one model input,
so its copies' features are equal or, at worst, a float's rounding apart); features that are the
same for different pictures (a dead layer's zeros) no longer make them one group.

Groups are made in rank order (leader clustering): the best-ranked row is its group's first
member; a later row joins the most similar first member it is a near-duplicate of (a labeled
example first), or the group of an earlier row with its key, else it starts a group. The first
members are exactly the rows a walk down the ranking keeps when it passes over every row that
duplicates one it kept or a labeled one: what `select` chooses from.

The pairs above the threshold come from an exact search (blocks of BLOCK rows: [BLOCK, BLOCK]
cosines at a time, never [N, N]) up to EXACT_LIMIT rows, above it from faiss's inverted-file
index (approximate: it may miss a pair, never invents one; every cosine it reports is recomputed
exactly). The features are read a block at a time from whatever holds them (a memory map of the
.emb.npz, alcli.files.embeddings.open_features, or a tensor).
"""
from __future__ import annotations

import hashlib
import importlib.util
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ..errors import ConfigError
from ..files.config import Settings
from ..files.embeddings import EmbeddingsError, embeddings_path, embeddings_run_id, open_features
from ..files.table import MORE, read_meta, read_table, sidecar
from ..pools import pixel_key
from .exclusions import ExclusionsError, excluded_ids, read_exclusion_files
from .rank import rank

THRESHOLD = Settings.dedup_threshold  # the cosine of near-duplicates (benchmarks/duplicates.py)
EXACT_LIMIT = 20_000  # rows (pool + labeled) up to which the search is exact (benchmarks/duplicates.py)
BLOCK = 2048          # rows per block of the exact search: [BLOCK, BLOCK] cosines at a time
NPROBE = 8            # inverted lists faiss visits per query (of 4·sqrt(N))


@dataclass
class Groups:
    """Each pool row's group, rows in the order given (the ranking).

    first [N]: the index of the group's first member: a pool row (itself for a row that starts a
    group), or N + r for labeled row r. similarity [N]: the cosine to the first member (1 for a
    first member). exact [N]: the row's key equals the first member's."""

    first: np.ndarray
    similarity: np.ndarray
    exact: np.ndarray

    def kept(self) -> np.ndarray:
        """[N] bool: the rows that start a group (no duplicate of a better-ranked or labeled row)."""
        return self.first == np.arange(len(self.first))


def text_key(text) -> str | None:
    """The exact-duplicate key of a text: sha1 of it lowercased, whitespace collapsed."""
    if not isinstance(text, str):
        return None
    return hashlib.sha1(" ".join(text.lower().split()).encode("utf-8")).hexdigest()


def feature_keys(x, block: int = BLOCK) -> list[str]:
    """The exact-duplicate key of each row of features x [N, D]: sha1 of its bytes."""
    keys = []
    for s in range(0, len(x), block):
        chunk = np.ascontiguousarray(np.asarray(x[s:s + block]), dtype=np.float32)
        keys.extend(hashlib.sha1(row.tobytes()).hexdigest() for row in chunk)
    return keys


class Rows:
    """Rows `take` of features x (a memory map or an array), read on demand: rows[s:e] is
    x[take[s:e]], read in file order."""

    def __init__(self, x, take) -> None:
        self.x, self.take = x, np.asarray(take, dtype=np.int64)
        self.shape = (len(self.take), x.shape[1])

    def __len__(self) -> int:
        return len(self.take)

    def __getitem__(self, key) -> np.ndarray:
        index = np.atleast_1d(self.take[key])
        order = np.argsort(index, kind="stable")
        out = np.empty((len(index), self.shape[1]), np.float32)
        out[order] = self.x[index[order]]
        return out


class Features:
    """The features of rows by id: features(ids) -> Rows of x [N, D] (a KeyError names an id
    without)."""

    def __init__(self, ids: list[str], x) -> None:
        self.index = {i: n for n, i in enumerate(ids)}
        self.x = x

    def has(self, id_: str) -> bool:
        return id_ in self.index

    def __call__(self, ids: list[str]) -> Rows:
        return Rows(self.x, [self.index[i] for i in ids])


def _unit(x) -> torch.Tensor:
    """Rows of x scaled to length 1 (zero rows stay zero), float32."""
    t = torch.from_numpy(np.array(x, dtype=np.float32))  # a copy: memory maps are read-only
    return t / t.norm(dim=1, keepdim=True).clamp_min(1e-12)


def pairs_exact(x, threshold: float, ref=None, block: int = BLOCK):
    """(i, j, cosine) of every pair at or above `threshold`: within x [N, D] with i < j, or, with
    `ref` [M, D], between row i of x and row j of ref. One [block, block] cosine block at a time,
    always into the same buffer (fresh blocks fragmented the heap: +0.8 GB at 50,000 rows)."""
    out_i, out_j, out_s = [], [], []
    other = x if ref is None else ref
    buffer = np.empty((block, block), np.float32)
    for s in range(0, len(x), block):
        a = _unit(x[s:s + block]).numpy()
        for t in range(s if ref is None else 0, len(other), block):
            b = a if (ref is None and t == s) else _unit(other[t:t + block]).numpy()
            sim = buffer[:len(a), :len(b)]
            np.matmul(a, b.T, out=sim)                               # [block, block]
            i, j = np.nonzero(sim >= threshold)
            if ref is None and t == s:
                i, j = i[i < j], j[i < j]  # each pair once, no row with itself
            out_i.append(i + s)
            out_j.append(j + t)
            out_s.append(sim[i, j])
    return _cat(out_i, np.int64), _cat(out_j, np.int64), _cat(out_s, np.float32)


def pairs_faiss(x, threshold: float, ref=None, block: int = BLOCK, nprobe: int = NPROBE):
    """pairs_exact's pairs from faiss's inverted-file index (cosines are inner products of unit
    rows): candidates at or above threshold - 0.01, each cosine then recomputed exactly, so none is
    invented; a pair whose rows fall in lists none of the NPROBE visited is missed."""
    index = ivf_index(x if ref is None else ref, block)
    return search(index, x, threshold, ref, block, nprobe)


def ivf_index(base, block: int = BLOCK):
    """faiss's inverted-file index of base's unit rows [M, D], 8-bit codes (the `dedup` extra)."""
    import faiss

    faiss.omp_set_num_threads(torch.get_num_threads())
    return _ivf_index(base, faiss, block)


def search(index, x, threshold: float, ref=None, block: int = BLOCK, nprobe: int = NPROBE):
    """pairs_faiss's pairs of x against the rows `index` holds (ref's, else x's own)."""
    base = x if ref is None else ref
    index.nprobe = nprobe
    out_i, out_j, out_s = [], [], []
    for s in range(0, len(x), block):
        a = _unit(x[s:s + block])
        lims, _, found = index.range_search(a.numpy(), threshold - 0.01)
        i = np.repeat(np.arange(len(a)), np.diff(lims.astype(np.int64))) + s
        keep = i < found if ref is None else np.ones(len(i), bool)
        i, j = i[keep], found[keep].astype(np.int64)
        if len(i):
            sim = (a[torch.as_tensor(i - s)] * _rows(base, j)).sum(1).numpy()  # exact cosines
            hit = sim >= threshold
            out_i.append(i[hit])
            out_j.append(j[hit])
            out_s.append(sim[hit])
    return _cat(out_i, np.int64), _cat(out_j, np.int64), _cat(out_s, np.float32)


def _ivf_index(x, faiss, block: int):
    """An inverted-file index of x's unit rows (inner product): 4·sqrt(N) lists, trained (10
    k-means iterations) on a strided sample of 39 rows a list, the rows added a block at a time.
    The lists hold 8-bit codes of the rows (D bytes a row, a quarter of float32's; its inner
    products off by about 1e-3 at most, well inside search's 0.01 margin, and every cosine is
    recomputed from the features), so the index is no second float32 copy of the features."""
    n, d = x.shape
    lists = max(1, min(int(4 * np.sqrt(n)), n // 39))
    quantizer = faiss.IndexFlatIP(d)
    index = faiss.IndexIVFScalarQuantizer(quantizer, d, lists, faiss.ScalarQuantizer.QT_8bit,
                                          faiss.METRIC_INNER_PRODUCT)
    index.cp.niter = 10
    step = max(1, n // (39 * lists))
    index.train(_unit(x[::step][:39 * lists]).numpy())
    for s in range(0, n, block):
        index.add(_unit(x[s:s + block]).numpy())
    return index


def _rows(x, index: np.ndarray) -> torch.Tensor:
    """Unit rows of x at `index` (read in sorted order, a memory map's friendliest)."""
    order = np.argsort(index, kind="stable")
    picked = np.empty((len(index), x.shape[1]), np.float32)
    picked[order] = np.asarray(x[index[order]], dtype=np.float32)
    return _unit(picked)


def _cat(parts, dtype) -> np.ndarray:
    return np.concatenate(parts).astype(dtype) if parts else np.zeros(0, dtype)


def find_pairs(x, threshold: float, ref=None, method: str = "auto"):
    """pairs_exact or pairs_faiss: `auto` is exact up to EXACT_LIMIT rows in all."""
    total = len(x) + (0 if ref is None else len(ref))
    if method == "auto" and total > EXACT_LIMIT and importlib.util.find_spec("faiss") is None:
        warnings.warn(f"the near-duplicate search over {total:,} rows is exact, which takes N^2 "
                      f"time: pip install 'alcli[dedup]' (faiss-cpu) for its index", stacklevel=2)
        method = "exact"
    if method == "faiss" or (method == "auto" and total > EXACT_LIMIT):
        return pairs_faiss(x, threshold, ref)
    return pairs_exact(x, threshold, ref)


def groups(x, threshold: float = THRESHOLD, *, keys=None, ref=None, ref_keys=None,
           method: str = "auto", pairs=None, ref_pairs=None) -> Groups:
    """Each row's group (see the module's docstring). x [N, D]: the pool's features in rank order;
    ref [M, D]: the labeled examples' (or None); keys, ref_keys: each row's exact key (None: no
    key; default: none for ref, the features' bytes for x); pairs, ref_pairs: find_pairs' of x,
    and of x against ref, where the caller found them already."""
    if not 0 < threshold <= 1:
        raise ValueError(f"the near-duplicate threshold must be above 0 and at most 1; got {threshold}")
    n = len(x)
    keys = feature_keys(x) if keys is None else keys
    ref_keys = [None] * (0 if ref is None else len(ref)) if ref_keys is None else ref_keys
    i, j, sim = find_pairs(x, threshold, None, method) if pairs is None else pairs
    # each row's better-ranked neighbours (i < j), as lists indexed by j
    order = np.argsort(j, kind="stable")
    i, j, sim = i[order], j[order], sim[order]
    starts = np.searchsorted(j, np.arange(n + 1))
    labeled = (_best_labeled(x, threshold, ref, method, ref_pairs)
               if ref is not None and len(ref) else None)
    first = np.arange(n)
    similarity = np.ones(n, np.float32)
    seen = {k: n + r for r, k in enumerate(ref_keys) if k is not None}  # key -> its first row
    for row in range(n):
        key = keys[row]
        if labeled is not None and labeled[0][row] >= 0:
            first[row], similarity[row] = n + labeled[0][row], labeled[1][row]
        elif key is not None and key in seen:
            first[row] = seen[key] if seen[key] >= n else first[seen[key]]
        else:
            lo, hi = starts[row], starts[row + 1]
            cand = i[lo:hi]
            leaders = first[cand] == cand
            if leaders.any():
                best = np.argmax(np.where(leaders, sim[lo:hi], -2.0))
                first[row], similarity[row] = cand[best], sim[lo + best]
        if key is not None:
            seen.setdefault(key, row)
    _similarities(x, ref, first, similarity)
    all_keys = list(keys) + list(ref_keys)
    exact = np.array([first[r] != r and keys[r] is not None and keys[r] == all_keys[first[r]]
                      for r in range(n)], dtype=bool)
    return Groups(first, similarity, exact)


def _best_labeled(x, threshold: float, ref, method: str, pairs=None):
    """([N] the index of each row's most similar labeled row at or above threshold, else -1;
    [N] that cosine)."""
    i, j, sim = find_pairs(x, threshold, ref, method) if pairs is None else pairs
    best = np.full(len(x), -1)
    cos = np.full(len(x), -2.0, np.float32)
    order = np.argsort(sim, kind="stable")  # the largest written last
    best[i[order]], cos[i[order]] = j[order], sim[order]
    return best, cos


def _similarities(x, ref, first: np.ndarray, similarity: np.ndarray) -> None:
    """The cosine of each row joined by its key (not by a pair) to its first member, in place."""
    n = len(first)
    todo = np.nonzero((first != np.arange(n)) & (similarity == 1))[0]
    if not len(todo):
        return
    mine = _rows(x, todo)
    to_pool = first[todo] < n
    other = torch.empty_like(mine)
    if to_pool.any():
        other[torch.as_tensor(to_pool)] = _rows(x, first[todo][to_pool])
    if (~to_pool).any():
        other[torch.as_tensor(~to_pool)] = _rows(ref, first[todo][~to_pool] - n)
    similarity[todo] = (mine * other).sum(1).numpy()


# --- select: pass over the duplicates -------------------------------------------------------------

def row_keys(rows: list[dict], x, pictures=()) -> list[str]:
    """Each row's exact key: its normalized text where the row carries its whole text (not cut
    at --text-width), its decoded pixels for the rows in `pictures` (indices) with a readable
    `path`, else its features' bytes (x [N, D], aligned with rows)."""
    keys = feature_keys(x)
    for k in pictures:
        path = rows[k].get("path")
        keys[k] = (pixel_key(path) if isinstance(path, str) and path else None) or keys[k]
    return [text_key(r["text"]) if isinstance(r.get("text"), str) and not r["text"].endswith(MORE)
            else k for r, k in zip(rows, keys)]


def may_be_twins(x, ref, threshold: float, known: int):
    """(pairs of x, pairs of x against ref, the pool rows and the first `known` ref rows whose
    pictures are worth decoding): rows in a pair at or above the threshold, or whose features'
    bytes another row shares."""
    pairs = find_pairs(x, threshold)
    ref_pairs = find_pairs(x, threshold, ref) if ref is not None and len(ref) else None
    mine = feature_keys(x)
    theirs = feature_keys(ref[:known]) if known else []
    count: dict[str, int] = {}
    for k in mine + theirs:
        count[k] = count.get(k, 0) + 1
    pool = {int(r) for r in np.concatenate([pairs[0], pairs[1]])}
    pool |= {n for n, k in enumerate(mine) if count[k] > 1}
    labeled = {n for n, k in enumerate(theirs) if count[k] > 1}
    if ref_pairs is not None:
        pool |= {int(r) for r in ref_pairs[0]}
        labeled |= {int(r) for r in ref_pairs[1] if r < known}
    return pairs, ref_pairs, sorted(pool), sorted(labeled)


def grouped(kept: list[dict], labeled: list[dict], features: Features, threshold: float,
            extra_labeled=()) -> tuple[Groups, list[str]]:
    """(the groups of `kept`, the candidate rows in rank order; the ids of the labeled rows that
    Groups.first's N + r index). labeled: the table's excluded rows (those with features count);
    features(ids) -> their Rows (a KeyError names an id without); extra_labeled: more labeled
    examples as (ids, features [M, D]), e.g. a labeled table's."""
    x = features([str(r["id"]) for r in kept])
    known = [r for r in labeled if features.has(str(r["id"]))]
    parts = [features([str(r["id"]) for r in known])[:]] if known else []
    parts += [np.asarray(e, dtype=np.float32) for _, e in extra_labeled if len(e)]
    ref = np.concatenate(parts) if parts else None
    ref_ids = [str(r["id"]) for r in known] + [str(i) for ids, _ in extra_labeled for i in ids]
    found = {}
    pictures, labeled_pictures = (), ()
    if any(r.get("path") for r in kept + known):  # an image pool: decode the possible twins
        found["pairs"], found["ref_pairs"], pictures, labeled_pictures = \
            may_be_twins(x, ref, threshold, len(known))
    ref_keys = (row_keys(known, parts[0], labeled_pictures) if known else []) + \
        [None] * (len(ref_ids) - len(known))
    return groups(x, threshold, keys=row_keys(kept, x, pictures), ref=ref, ref_keys=ref_keys,
                  **found), ref_ids


def passed_note(of_pool: list[dict], of_labeled: list[dict], chosen: list[dict],
                threshold: float) -> str | None:
    """How many duplicates ranked above the batch's last row were passed over (None: none)."""
    if not chosen:
        return None
    last = max(r["rank"] for r in chosen)
    pool = sum(r["rank"] < last for r in of_pool)
    labeled = sum(r["rank"] < last for r in of_labeled)
    if pool + labeled == 0:
        return None
    return (f"passed over {pool + labeled} near-duplicates ranked above the batch's last row "
            f"({pool} of a better-ranked row, {labeled} of a labeled or excluded example; cosine "
            f">= {threshold:g} or the same content); --no-dedup keeps them")


def dedup(settings, plan, ranked: list[dict], kept: list[dict], embeddings
          ) -> tuple[list[dict], list[dict], list[dict], list[str]]:
    """`select`'s pass: (the rows left to choose from, those passed over as duplicates of a
    better-ranked row, of a labeled one, notes). The features are `embeddings` (captured in this
    process), else the table's embeddings file (plan.embeddings_file, else plan.dedup_file);
    without either the rows stay as they are, said once. The labeled examples: the table's
    excluded rows, and the rows of each --exclude FILE with a FILE.emb.npz beside it."""
    if not settings.dedup:
        return kept, [], [], []
    path = plan.embeddings_file or plan.dedup_file
    try:
        if embeddings is not None:
            features = Features(list(embeddings.ids), torch.as_tensor(embeddings.b).numpy())
        elif path is not None:
            features = Features(*open_features(path))
        else:
            # (a diverse batch without its embeddings says so itself: once is enough)
            said = plan.dedup_missing and not plan.diverse
            return kept, [], [], [plan.dedup_missing] if said else []
        extra = [(f, open_features(f)) for f in labeled_tables(settings.exclude or [])]
    except EmbeddingsError as err:
        raise ConfigError(f"near-duplicates: {str(err).rstrip('.')}; pass --no-dedup to select "
                          f"without the check") from None
    _same_width(extra, features.x.shape[1], f"those of the table's rows ({path or 'scored here'})")
    extra = [e for _, e in extra]
    kept_ids = {str(r["id"]) for r in kept}
    labeled = [r for r in ranked if str(r["id"]) not in kept_ids]
    try:
        found, _ = grouped(kept, labeled, features, settings.dedup_threshold, extra)
    except KeyError as err:  # an error when asked for, else a warning (as for --diverse)
        problem = (f"the row '{err.args[0]}' has no embedding in "
                   f"{path or 'those recorded when the rows were scored'}")
        if "dedup" in settings.sources:
            raise ConfigError(f"{settings.where('dedup')}: {problem}, so its near-duplicates "
                              f"cannot be found; score the table again, or pass --no-dedup") from None
        return kept, [], [], [f"no near-duplicate check: {problem}; score the table again to "
                              f"write its own embeddings"]
    n, first = len(kept), found.first
    mine = [r for k, r in enumerate(kept) if first[k] == k]
    of_pool = [r for k, r in enumerate(kept) if k != first[k] < n]
    of_labeled = [r for k, r in enumerate(kept) if first[k] >= n]
    short = (settings.budget or 0) - len(mine)
    if short <= 0 or not (of_pool or of_labeled):
        return mine, of_pool, of_labeled, []
    # fewer distinct rows than -n asks for (features that barely vary: an untrained model's): the
    # batch is filled with the best-ranked of those passed over, and says so
    order = {id(r): k for k, r in enumerate(kept)}
    back = {id(r) for r in sorted(of_pool + of_labeled, key=lambda r: order[id(r)])[:short]}
    note = (f"only {len(mine)} rows are not near-duplicates of one another or of a labeled example "
            f"(cosine >= {settings.dedup_threshold:g} or the same content): the batch takes "
            f"{len(back)} near-duplicates to reach {settings.where('budget')} {settings.budget}; "
            f"features that barely vary (an untrained model's?) call for a higher "
            f"--dedup-threshold or --no-dedup")
    return ([r for r in kept if id(r) in back or first[order[id(r)]] == order[id(r)]],
            [r for r in of_pool if id(r) not in back], [r for r in of_labeled if id(r) not in back],
            [note])


NO_FEATURES = ("no near-duplicate check: the rows have no embeddings (score writes them beside a "
               "table file; pass --embeddings FILE); --no-dedup says you know")


def labeled_tables(files: list[str]) -> list[str]:
    """The embeddings files beside the --exclude files that have one (a labeled alcli table)."""
    return [embeddings_path(f) for f in files if f != "-" and Path(embeddings_path(f)).is_file()]


def mark_labeled_tables(settings, sources: list) -> None:
    """The --exclude files with an embeddings file beside them are labeled tables, compared with
    the rows by content: with the near-duplicate check on, they may name none of the rows."""
    with_features = set(labeled_tables(settings.exclude or [])) if settings.dedup else set()
    for path, source in zip(settings.exclude or [], sources):
        source.by_content = path != "-" and embeddings_path(path) in with_features


def _same_width(extra: list, width: int, where: str) -> None:
    """Labeled tables' features must be as wide as the table's (the same model's)."""
    for path, (_, x) in extra:
        if x.shape[1] != width:
            raise ConfigError(f"the embeddings file {path} holds {x.shape[1]} features a row, and "
                              f"{where} {width}: were they written by another model? Score the "
                              f"labeled examples with the same model, or pass --no-dedup")


def dedup_file(settings, source: str | None, table_run: str | None) -> tuple[str | None, str | None]:
    """(the embeddings file select's near-duplicate check reads, or None; the note that says why
    there is none). --embeddings FILE, else SCORES.emb.npz; one of another run than the table is
    an error when named, else no check."""
    if not settings.dedup:
        return None, None
    if source in (None, "-"):  # scored in this process (its embeddings), else none to read
        return None, NO_FEATURES
    path = settings.embeddings_file or embeddings_path(source)
    if not Path(path).is_file():
        if settings.embeddings_file:
            raise ConfigError(f"{settings.where('embeddings_file')}: the embeddings file {path} "
                              f"does not exist")
        return None, (f"no near-duplicate check: the table has no embeddings file {path} (scored "
                      f"with --no-embeddings, or by a model without an nn.Linear head); "
                      f"--no-dedup says you know")
    try:
        run = embeddings_run_id(path)
    except EmbeddingsError as err:
        raise ConfigError(f"near-duplicates: {str(err).rstrip('.')}; pass --no-dedup to select "
                          f"without the check") from None
    if run and table_run and run != table_run:
        problem = (f"the embeddings file {path} was written by another run than the table "
                   f"{source}")
        if settings.embeddings_file:
            raise ConfigError(f"{settings.where('embeddings_file')}: {problem}; score the table "
                              f"again to write its own embeddings")
        return None, f"no near-duplicate check: {problem}; score again to write matching ones"
    return path, None


# --- `alcli duplicates`: the groups, for a person to look at --------------------------------------

GROUP_COLUMNS = ["group", "id", "similarity", "kind"]


def duplicate_groups(settings, source: str) -> tuple[list[dict], int]:
    """(the rows of the groups table, the number of groups): each group of two or more, its first
    member first (kind `first`, or `labeled` for an --exclude'd or labeled example), then the
    rows passed over for it (kind `exact`: the same content key; `near`: a cosine at or above
    the threshold), with their cosine to the first member. Groups in the order of their first
    rows' ranks (labeled first members: the best-ranked row that duplicates them)."""
    rows = rank(read_table(source))
    if not rows:
        raise ConfigError(f"the table {source} has no rows")
    try:
        sources = read_exclusion_files(settings.exclude or [])
        mark_labeled_tables(settings, sources)
        excluded, _ = excluded_ids(sources, rows)
    except ExclusionsError as err:
        raise ConfigError(f"{settings.where('exclude')}: {str(err).rstrip('.')}") from None
    path = settings.embeddings_file or embeddings_path(source)
    if not Path(path).is_file():
        raise ConfigError(f"the table {source} has no embeddings file {path}; score it with "
                          f"--embeddings (a model with an nn.Linear head), or pass "
                          f"{settings.option('embeddings_file', 'FILE')}")
    meta = read_meta(sidecar(source, "meta.json")) or {}
    try:
        run = embeddings_run_id(path)
        if run and meta.get("run_id") and run != meta["run_id"]:
            raise EmbeddingsError(f"the embeddings file {path} was written by another run than "
                                  f"the table {source}; score the table again to write its own")
        features = Features(*open_features(path))
        extra = [(f, open_features(f)) for f in labeled_tables(settings.exclude or [])]
    except EmbeddingsError as err:
        raise ConfigError(str(err).rstrip(".")) from None
    _same_width(extra, features.x.shape[1], f"{path}")
    extra = [e for _, e in extra]
    kept = [r for r in rows if str(r["id"]) not in excluded]
    labeled = [r for r in rows if str(r["id"]) in excluded]
    try:
        found, ref_ids = grouped(kept, labeled, features, settings.dedup_threshold, extra)
    except KeyError as err:
        raise ConfigError(f"the row '{err.args[0]}' of {source} has no embedding in {path}; "
                          f"score the table again to write its own") from None
    n = len(kept)
    members: dict[int, list[int]] = {}
    for k in range(n):
        members.setdefault(int(found.first[k]), []).append(k)
    out, group = [], 0
    for first, rows_of in members.items():  # dicts keep the order first met: the rank order
        passed = [k for k in rows_of if k != first]
        if not passed:
            continue
        group += 1
        head = ({"group": group, "id": ref_ids[first - n], "similarity": 1.0, "kind": "labeled"}
                if first >= n else
                {"group": group, "id": str(kept[first]["id"]), "similarity": 1.0, "kind": "first"})
        out.append(head)
        out.extend({"group": group, "id": str(kept[k]["id"]),
                    "similarity": round(float(found.similarity[k]), 6),
                    "kind": "exact" if found.exact[k] else "near"} for k in passed)
    return out, group
