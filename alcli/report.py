"""`alcli report`: one round as one self-contained HTML page, written from the files alcli already
writes (the ranked table, its .meta.json and .emb.npz, the selected batch, earlier rounds' tables,
pulled labels). Everything is inline: thumbnails as JPEG data URIs (downscaled to THUMB pixels),
plots as inline SVG (matplotlib), no script, no network. Every value read from a file reaches the
page through `esc` (html.escape) or matplotlib's SVG writer, which escapes its text.
"""
from __future__ import annotations

import base64
import csv
import html
import io
import json
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

from .errors import AlcliError, TableError
from .files.embeddings import embeddings_path, load_embeddings
from .files.regular import check_regular
from .files.table import MORE, read_meta, read_table, sidecar
from .pools import split_source
from .selection import stopping
from .selection.export import OutsideImageDir, load_picture, picture_file
from .tasks import TASKS, from_rows
from .tasks.shared.labelstudio import entities

THUMB = 128  # a thumbnail's longer side, pixels
JPEG_QUALITY = 70
GALLERY_WITHOUT_BATCH = 48  # the table's best rows shown when no --batch is given
MAP_POINTS = 20000  # points drawn on the embeddings map at most (a seeded sample beyond)
MIX_CLASSES = 30  # classes shown in the class mix at most (the pool's most predicted)
LABELS_CAP = 64 << 20  # bytes of a labels file read
EXTRA = "report"  # the pyproject extra that installs matplotlib


@dataclass
class Round:
    """What one page shows: the table's rows and metadata, the batch, the earlier tables, labels."""
    scores: str
    rows: list[dict]
    meta: dict
    batch: list[dict] | None = None
    previous: list[tuple[str, list[dict]]] = field(default_factory=list)
    labels: dict[str, str] | None = None


def esc(value) -> str:
    return html.escape("" if value is None else str(value), quote=True)


def read_round(scores: str, batch: str | None, previous: Sequence[str],
               labels: str | None) -> Round:
    rows = read_table(scores)
    meta = (read_meta(sidecar(scores, "meta.json")) or {}) if scores != "-" else {}
    return Round(scores, rows, meta, read_table(batch) if batch else None,
                 [(p, read_table(p)) for p in previous], read_labels(labels) if labels else None)


def read_labels(path: str) -> dict[str, str]:
    """id -> label of a labels CSV ('alcli pull' writes id,label; other columns ignored)."""
    try:
        check_regular(path)
        with open(path, "rb") as f:
            data = f.read(LABELS_CAP + 1)
    except OSError as err:
        raise TableError(f"labels file {path} cannot be read ({err.strerror or err})") from None
    if len(data) > LABELS_CAP:
        raise TableError(f"labels file {path} is larger than {LABELS_CAP >> 20} MiB")
    reader = csv.DictReader(io.StringIO(data.decode("utf-8", errors="replace"), newline=""))
    if not {"id", "label"} <= set(reader.fieldnames or ()):
        raise TableError(f"labels file {path} has no id and label columns (as 'alcli pull' "
                         f"writes them)")
    try:
        return {r["id"]: r["label"] for r in reader if r.get("id") and r.get("label")}
    except csv.Error as err:
        raise TableError(f"labels file {path} is not a CSV ({err})") from None


# --- plots ---------------------------------------------------------------------------------------

def pyplot():
    """matplotlib's pyplot on the Agg backend; one sentence naming the extra when it is absent."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise AlcliError(f"alcli report draws its plots with matplotlib, which is not installed; "
                         f"pip install 'alcli[{EXTRA}]'") from None
    return plt


def svg(fig) -> str:
    """The figure as an inline <svg> element (the XML prologue and doctype left out)."""
    plt = pyplot()
    buf = io.StringIO()
    fig.savefig(buf, format="svg", bbox_inches="tight")
    plt.close(fig)
    text = buf.getvalue()
    text = re.sub(r"<metadata>.*?</metadata>", "", text, flags=re.S)  # the date, a dc: namespace
    return text[text.index("<svg"):]


def figure(width: float = 5.2, height: float = 3.0):
    return pyplot().subplots(figsize=(width, height))


# while the page's plots are drawn: a class name holding $...$ is text, not math; SVG text as
# <text> elements (escaped by matplotlib's writer), not glyph paths
RC = {"text.parse_math": False, "svg.fonttype": "none"}


def finite_scores(rows: Sequence[Mapping]) -> np.ndarray:
    s = np.array([float(r["score"]) if r.get("score") is not None else math.nan for r in rows])
    return s[np.isfinite(s)]


def score_plot(rows: Sequence[Mapping], batch: Sequence[Mapping] | None) -> str:
    """Histogram of the pool's scores, the batch's cut-off (its lowest score) as a line."""
    fig, ax = figure()
    scores = finite_scores(rows)
    ax.hist(scores, bins=min(60, max(5, int(math.sqrt(len(scores))))), color="#8aa9c9")
    cut = finite_scores(batch) if batch else np.array([])
    if cut.size:
        ax.axvline(cut.min(), color="#c0392b", label=f"batch cut-off {cut.min():.4g}")
        ax.legend()
    ax.set_xlabel("score")
    ax.set_ylabel("examples")
    return svg(fig)


def classes_of(value) -> list[str]:
    """A prediction or label as the classes it holds ('a|b': a label set, or a detection's)."""
    return [c for c in str(value).split("|") if c] if value not in (None, "") else []


def shares(values) -> dict[str, float]:
    counts: dict[str, int] = {}
    for v in values:
        for c in classes_of(v):
            counts[c] = counts.get(c, 0) + 1
    total = sum(counts.values()) or 1
    return {c: n / total for c, n in counts.items()}


def class_mix_plot(rnd: Round) -> str | None:
    """Share of each class among the pool's predictions, the batch's, and the labels so far."""
    groups = {"pool (predicted)": shares(r.get("pred") for r in rnd.rows)}
    if rnd.batch:
        groups["batch (predicted)"] = shares(r.get("pred") for r in rnd.batch)
    if rnd.labels:
        groups["labels"] = shares(rnd.labels.values())
    names = sorted(groups["pool (predicted)"], key=lambda c: -groups["pool (predicted)"][c])
    names = (names + sorted({c for g in groups.values() for c in g} - set(names)))[:MIX_CLASSES]
    if not names:
        return None
    fig, ax = figure(max(5.2, 0.35 * len(names) * len(groups)), 3.0)
    width = 0.8 / len(groups)
    x = np.arange(len(names))
    for k, (what, share) in enumerate(groups.items()):
        ax.bar(x + k * width, [share.get(c, 0.0) for c in names], width, label=what)
    ax.set_xticks(x + width * (len(groups) - 1) / 2, [c[:24] for c in names], rotation=45,
                  ha="right")
    ax.set_ylabel("share")
    ax.legend()
    return svg(fig)


def pca_2d(features: np.ndarray) -> np.ndarray:
    """[N, D] -> [N, 2]: the centred rows on their two principal directions (SVD)."""
    centred = features - features.mean(0)
    _, _, vt = np.linalg.svd(centred, full_matrices=False)
    out = centred @ vt[:2].T
    return out if out.shape[1] == 2 else np.column_stack([out, np.zeros(len(out))])


def embedding_map(rnd: Round) -> tuple[str | None, str]:
    """The PCA map of the table's embeddings file (the features b of each row), batch and
    labeled marked; None and why when there is no such file."""
    if rnd.scores == "-":
        return None, "no embeddings file for a table read from stdin"
    path = embeddings_path(rnd.scores)
    no_badge = TASKS[from_rows(rnd.rows)].no_badge if rnd.rows else None
    if not os.path.isfile(path):
        return None, (f"no embeddings to map: {no_badge}" if no_badge else
                      f"no embeddings file {path} beside the table (alcli score --embeddings)")
    ids, _, b = load_embeddings(path)
    points = pca_2d(b.double().numpy())
    keep = np.arange(len(ids))
    if len(ids) > MAP_POINTS:
        keep = np.sort(np.random.default_rng(0).choice(len(ids), MAP_POINTS, replace=False))
    batch = {str(r["id"]) for r in rnd.batch or ()}
    labeled = set(rnd.labels or ())
    fig, ax = figure(5.2, 4.0)
    marks = [("pool", "#b8c4d0", 6, "o"), ("labeled", "#222222", 14, "x"),
             ("batch", "#c0392b", 16, "o")]
    for what, colour, size, marker in marks:
        mine = [k for k in keep if (ids[k] in batch if what == "batch" else ids[k] in labeled
                                    if what == "labeled" else True)]
        if mine:
            ax.scatter(points[mine, 0], points[mine, 1], s=size, c=colour, marker=marker,
                       label=f"{what} ({len(mine)})", linewidths=1 if marker == "x" else 0)
    ax.set_xlabel("PC 1")
    ax.set_ylabel("PC 2")
    ax.legend(fontsize=8)
    return svg(fig), f"PCA of the features in {path}"


# --- across rounds -------------------------------------------------------------------------------

QUANTILES = (0.1, 0.5, 0.9)


def across_rounds(rnd: Round, threshold: float, window: int) -> dict:
    """Per table (the earlier ones, oldest first, then this one): rows, predictions changed and
    kappa against the table before, score quantiles; and the stopping rule's record."""
    tables = [*rnd.previous, (rnd.scores, rnd.rows)]
    result = stopping.rounds([stopping.predictions(rows) for _, rows in tables], threshold, window)
    for record, (name, rows) in zip(result["rounds"], tables):
        s = finite_scores(rows)
        record.update(table=name, rows=len(rows),
                      quantiles=[float(np.quantile(s, q)) for q in QUANTILES] if s.size else None)
    return result


# --- the gallery ---------------------------------------------------------------------------------

COLOURS = ["#e6194b", "#3cb44b", "#4363d8", "#f58231", "#911eb4", "#42d4f4", "#f032e6", "#9a6324"]


def thumbnail(row: Mapping, n: int, path: str, instances,
              folder: str = ".") -> tuple[str | None, int]:
    """The row's picture as a JPEG data URI, its predicted masks painted (`masks_of`) and its
    boxes and keypoints drawn (the task's `instances`, in the image's pixels: scaled by the
    thumbnail's width over the row's `width`); None when it cannot be read. Also how many
    instances were drawn."""
    from PIL import Image, ImageDraw
    try:
        pic = load_picture(path, THUMB)
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError):
        return None, 0
    try:
        pic = overlay(pic, masks_of(row, folder))
    except (OSError, ValueError, TypeError, KeyError, IndexError, SyntaxError, RecursionError,
            Image.DecompressionBombError):
        pass  # a mask that cannot be read is not drawn (json recurses once per level)
    drawn = 0
    if instances is not None:
        try:
            found = instances(row, n)
            scale = pic.width / float(row["width"])
        except (ValueError, TypeError, KeyError, ZeroDivisionError, RecursionError):
            found = []
        draw = ImageDraw.Draw(pic)
        for box, cls, _, points in found:
            colour = COLOURS[cls % len(COLOURS)]
            draw.rectangle([v * scale for v in box], outline=colour, width=2)
            for x, y, _ in points or ():
                draw.ellipse([x * scale - 2, y * scale - 2, x * scale + 2, y * scale + 2],
                             fill=colour)
            drawn += 1
    buf = io.BytesIO()
    pic.save(buf, format="JPEG", quality=JPEG_QUALITY)
    return "data:image/jpeg;base64," + base64.b64encode(buf.getvalue()).decode(), drawn


MAX_MASK_PIXELS = 64 << 20  # a mask larger than this is not drawn (a hostile size)


def rle_mask(code) -> np.ndarray:
    """COCO's uncompressed run-length code {size: [h, w], counts} (instance segmentation's
    `masks` column) -> a boolean [h, w]; ValueError when it does not describe h x w pixels."""
    h, w = (int(v) for v in code["size"])
    counts = np.asarray(code["counts"], dtype=np.int64)
    if not 0 < h * w <= MAX_MASK_PIXELS or (counts < 0).any() or counts.sum() != h * w:
        raise ValueError("a mask's runs do not cover its size")
    values = np.arange(len(counts)) % 2 == 1  # runs of 0s and 1s, the first of 0s
    return np.repeat(values, counts).reshape(w, h).T  # column-major


def masks_of(row: Mapping, folder: str) -> list[tuple[int, np.ndarray]]:
    """(class, boolean mask at the image's size) for each mask the row predicts: its `masks`
    column's codes (their box's class), or its `pred_mask` PNG of class indices (as given, else
    under the table's folder; background 0 and the ignore value 255 left out)."""
    from PIL import Image
    if row.get("masks") not in (None, ""):
        codes = json.loads(row["masks"])
        classes = [int(b[4]) for b in json.loads(row.get("boxes") or "[]")]
        return [(c, rle_mask(code)) for c, code in zip(classes + [0] * len(codes), codes)]
    if row.get("pred_mask") not in (None, ""):
        path = str(row["pred_mask"])  # as select's batch names it, else under the table's folder
        path = path if os.path.isfile(path) else os.path.join(folder, path)
        check_regular(path)
        with Image.open(path) as img:
            if img.width * img.height > MAX_MASK_PIXELS:  # from the header, before decoding
                raise ValueError("not a single-channel mask")
            m = np.array(img)
        if m.ndim != 2:
            raise ValueError("not a single-channel mask")
        return [(int(c), m == c) for c in np.unique(m).tolist() if c not in (0, 255)]
    return []


def overlay(pic, masks: list[tuple[int, np.ndarray]]):
    """The masks painted over the thumbnail, each in its class's colour at 45 % opacity."""
    from PIL import Image, ImageColor
    out = np.asarray(pic, dtype=np.float32).copy()
    for cls, mask in masks:
        small = np.asarray(Image.fromarray(mask.astype(np.uint8) * 255).resize(
            pic.size, Image.Resampling.NEAREST)) > 0
        colour = np.array(ImageColor.getrgb(COLOURS[cls % len(COLOURS)]), dtype=np.float32)
        out[small] = 0.55 * out[small] + 0.45 * colour
    return Image.fromarray(out.astype(np.uint8))


def highlighted(row: Mapping, names: Sequence[str] | None) -> str:
    """The row's text, escaped, its predicted entities (`pred_words`, one tag per word, read as
    Label Studio's spans are: BIO or plain labels, `O` outside) as <mark title=LABEL> spans;
    the text alone where the row has no word predictions that fit it."""
    text = str(row["text"])
    try:
        tags = json.loads(row["pred_words"]) if isinstance(row.get("pred_words"), str) else None
    except (ValueError, RecursionError):
        tags = None
    words = [m.span() for m in re.finditer(r"\S+", text)]
    if text.endswith(MORE) and words:  # a text cut short: its last word is cut too
        words.pop()
    if not isinstance(tags, list) or len(tags) < len(words):
        return esc(text)
    named = [None if t is None else str(names[t]) if isinstance(t, int) and names
             and 0 <= t < len(names) else str(t) for t in tags[:len(words)]]
    out, at = [], 0
    for label, first, last in entities(named):
        start, end = words[first][0], words[last][1]
        out += [esc(text[at:start]), f'<mark title="{esc(label)}">{esc(text[start:end])}</mark>']
        at = end
    return "".join(out) + esc(text[at:])


def why(row: Mapping, k: int, top: int) -> str:
    """Why a batch row was picked: among the table's `top` best by score, or past them (a
    diverse batch's cluster, or a class quota, reached down the ranking)."""
    rank = row.get("rank")
    if isinstance(rank, int) and rank > top:
        return f"rank {rank}: past the top {top} (diversity or a class quota)"
    return f"rank {rank if rank is not None else k + 1}: among the top {top} scores"


def gallery(rnd: Round, image_dir: str | None) -> tuple[str, list[str]]:
    """The batch (or the table's best rows) as figure cards: thumbnail with the predictions
    drawn, or the row's text; rank, id, score, prediction, confidence, why. Also the ids whose
    picture could not be read."""
    rows = rnd.batch if rnd.batch is not None else rnd.rows[:GALLERY_WITHOUT_BATCH]
    table_folder = os.path.dirname(rnd.scores) or "."  # a segmentation row's pred_mask is under it
    names = rnd.meta.get("class_names") if isinstance(rnd.meta.get("class_names"), list) else None
    instances = TASKS[from_rows(rows)].instances if rows else None
    cards, unreadable = [], []
    for k, row in enumerate(rows):
        rid = str(row["id"])
        cells = [f'<div class="id">{esc(rid)}</div>',
                 f"<div>rank {esc(row.get('rank', k + 1))} &middot; score "
                 f"{esc(number(row.get('score')))}</div>",
                 f"<div>pred <b>{esc(row.get('pred'))}</b>"
                 + (f" &middot; conf {esc(number(row.get('confidence')))}"
                    if row.get("confidence") is not None else "") + "</div>"]
        if rnd.batch is not None:
            cells.append(f'<div class="why">{esc(why(row, k, len(rows)))}</div>')
        if row.get("text") not in (None, ""):
            body = f'<p class="text">{highlighted(row, names)}</p>'
        else:
            try:
                uri, _ = thumbnail(row, k + 1, picture_path(row, image_dir), instances, table_folder)
            except OutsideImageDir:
                uri = None
            if uri is None:
                unreadable.append(rid)
                body = '<div class="missing">unreadable</div>'
            else:
                body = f'<img src="{uri}" alt="{esc(rid)}">'
        cards.append(f'<figure>{body}<figcaption>{"".join(cells)}</figcaption></figure>')
    return '<div class="gallery">' + "".join(cards) + "</div>", unreadable


def pictures(rnd: Round, image_dir: str | None) -> list[str]:
    """The files the gallery reads (each card's picture, FILE of a FILE#PART such as a video's
    frame; its pred_mask, as given and under the table's folder): the page may replace none."""
    rows = rnd.batch if rnd.batch is not None else rnd.rows[:GALLERY_WITHOUT_BATCH]
    folder = os.path.dirname(rnd.scores) or "."
    files = []
    for row in rows:
        if row.get("text") in (None, ""):
            try:
                files.append(split_source(picture_path(row, image_dir))[0])
            except OutsideImageDir:
                pass  # never read
        if row.get("pred_mask") not in (None, ""):
            files += [str(row["pred_mask"]), os.path.join(folder, str(row["pred_mask"]))]
    return files


def picture_path(row: Mapping, image_dir: str | None) -> str:
    """The id under --image-dir when given, else the row's `path` (select's batch, a folder
    pool's table), else the id itself."""
    if image_dir is not None or row.get("path") in (None, ""):
        return picture_file(str(row["id"]), image_dir)
    return str(row["path"])


def number(value) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return "" if value is None else str(value)


# --- the page ------------------------------------------------------------------------------------

STYLE = """body{font:14px system-ui,sans-serif;margin:1.5em;color:#222;max-width:1400px}
h1{font-size:1.4em}h2{font-size:1.15em;margin-top:1.6em;border-bottom:1px solid #ddd}
table{border-collapse:collapse}td,th{padding:2px 8px;border-bottom:1px solid #eee;text-align:left}
.gallery{display:flex;flex-wrap:wrap;gap:8px}figure{margin:0;width:160px;border:1px solid #ddd;
padding:4px;background:#fafafa;font-size:12px;overflow-wrap:anywhere}figure img{display:block;
margin:auto;max-width:100%}.text{max-height:9em;overflow:auto;margin:0 0 4px}.id{font-weight:600}
.why{color:#666}.missing{height:128px;background:#eee;color:#a00;text-align:center;line-height:128px}
.plots{display:flex;flex-wrap:wrap;gap:16px}.plots svg{max-width:100%;height:auto}
.verdict{font-size:1.1em;font-weight:600}mark{background:#ffe08a}"""


def page(rnd: Round, image_dir: str | None, threshold: float = stopping.THRESHOLD,
         window: int = stopping.WINDOW) -> tuple[str, list[str]]:
    """The HTML page and the ids whose pictures could not be read."""
    rounds = across_rounds(rnd, threshold, window)
    cards, unreadable = gallery(rnd, image_dir)
    with pyplot().rc_context(RC):
        scores_svg, mix = score_plot(rnd.rows, rnd.batch), class_mix_plot(rnd)
        emb, emb_note = embedding_map(rnd)
    what = (f"{len(rnd.batch)} selected of {len(rnd.rows)}" if rnd.batch is not None
            else f"the best {min(len(rnd.rows), GALLERY_WITHOUT_BATCH)} of {len(rnd.rows)}")
    costs = [r.get("cost") for r in rnd.batch or ()]
    if costs and all(isinstance(c, (int, float)) for c in costs):  # select --cost
        what += f", costing {sum(costs):g} in all"
    run = rnd.meta.get("run") if isinstance(rnd.meta.get("run"), dict) else {}
    said = {"task": rnd.meta.get("task"), "strategy": run.get("strategy"),
            "model": rnd.meta.get("model_file"), "pool": rnd.meta.get("pool")}
    meta = " &middot; ".join(f"{k} {esc(v)}" for k, v in said.items()
                             if isinstance(v, (str, int, float)))
    parts = [f"<!DOCTYPE html><html><head><meta charset=\"utf-8\"><title>alcli round: "
             f"{esc(Path(rnd.scores).name)}</title><style>{STYLE}</style></head><body>",
             f"<h1>Round: {esc(rnd.scores)}</h1><p>{meta}</p>",
             f'<p class="verdict">{esc(stopping.verdict(rounds))}</p>',
             f"<h2>The batch: {what}</h2>", cards]
    if unreadable:
        parts.append(f"<p>{len(unreadable)} pictures could not be read (ids relative to "
                     f"{esc(image_dir or 'the working folder')}).</p>")
    parts.append('<h2>Scores and classes</h2><div class="plots">'
                 + scores_svg + (mix or "") + "</div>")
    parts.append("<h2>The pool's embeddings</h2>"
                 + (f'<div class="plots">{emb}</div><p>{esc(emb_note)}</p>' if emb
                    else f"<p>{esc(emb_note)}</p>"))
    parts.append("<h2>Across rounds</h2>" + rounds_table(rounds))
    if rnd.labels:
        counts: dict[str, int] = {}
        for label in rnd.labels.values():
            for c in classes_of(label):
                counts[c] = counts.get(c, 0) + 1
        parts.append(f"<h2>Labels so far: {len(rnd.labels)}</h2><table><tr><th>class</th>"
                     f"<th>labels</th></tr>" + "".join(
                         f"<tr><td>{esc(c)}</td><td>{n}</td></tr>"
                         for c, n in sorted(counts.items(), key=lambda kv: -kv[1])) + "</table>")
    parts.append("</body></html>\n")
    return "".join(parts), unreadable


def rounds_table(rounds: dict) -> str:
    head = ("<tr><th>round</th><th>table</th><th>rows</th><th>compared</th><th>changed</th>"
            "<th>kappa</th><th>mean kappa</th><th>stop</th>"
            + "".join(f"<th>score q{int(100 * q)}</th>" for q in QUANTILES) + "</tr>")
    body = []
    for r in rounds["rounds"]:
        q = r["quantiles"] or [None] * len(QUANTILES)
        cells = [r["round"], r["table"], r["rows"], r["common"], r["changed"],
                 number(r["kappa"]), number(r.get("mean_kappa")), "yes" if r["stop"] else "no",
                 *map(number, q)]
        body.append("<tr>" + "".join(f"<td>{esc(c)}</td>" for c in cells) + "</tr>")
    return f"<table>{head}{''.join(body)}</table>"
