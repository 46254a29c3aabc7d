"""Hand-offs for a selected batch: Label Studio tasks and a contact sheet PNG (of images or texts).

Rows are dicts with at least `id` and `score` (and optionally `rank`, `pred`), in batch order.
"""
from __future__ import annotations

import json
import math
import os
import posixpath
import re
import sys
from dataclasses import dataclass
from typing import Mapping, Sequence
from urllib.parse import quote
from xml.sax.saxutils import quoteattr

import numpy as np
from PIL import Image, ImageDraw, ImageFont, ImageOps

from ..files.atomic import atomic_open
from ..files.redact import redacted
from ..files.sources import open_source
from ..files.table import MORE

_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
# what a labeling config's names may not hold: the characters XML 1.0 cannot hold, even as
# references (C0 controls, surrogates, U+FFFE, U+FFFF), and tab, CR and LF (a name is one line)
_NOT_XML = re.compile("[\x00-\x1f\ud800-\udfff\ufffe\uffff]")


# --- Label Studio ---------------------------------------------------------------------------------

def model_version_from(checkpoint_path: str) -> str:
    """Label Studio's model_version for a checkpoint: its file name (`runs/best.pt` -> `best.pt`;
    a URL's query and credentials left out)."""
    checkpoint_path = redacted(checkpoint_path)
    return os.path.basename(checkpoint_path.rstrip("/\\")) or checkpoint_path


class ImageRootError(ValueError):
    """An id that cannot be placed under --image-root (absolute, or climbing out with `..`)."""


def image_ref(row_id: str, image_root: str | None) -> str:
    """The `data.image` value for an id: the id itself, or the id under `image_root`.

    A URL root (`https://host/pool`, `s3://bucket/x`) gets the id normalised (`\\` as `/`) and
    percent-encoded, joined with one `/` unless the root already ends in `/` or `=` (e.g. Label
    Studio's local-files `http://host:8080/data/local-files/?d=`). A non-URL root is joined as a
    file path, the id normalised. Ids that are URLs already are left alone. An absolute id, or one
    whose `..` leaves the root, is an ImageRootError.
    """
    row_id = str(row_id)
    if image_root is None or _URL.match(row_id):
        return row_id
    if _URL.match(image_root):
        path = quote(_inside(row_id, row_id.replace("\\", "/"), posixpath), safe="/")
        sep = "" if image_root.endswith(("/", "=")) else "/"
        return image_root + sep + path
    return os.path.join(image_root, _inside(row_id, row_id, os.path))


def _inside(row_id: str, path: str, paths) -> str:
    """`path` (the id as a path of the `paths` module) normalised, refused if it leaves the root."""
    if paths.isabs(path):
        raise ImageRootError(f"the id '{row_id}' is an absolute path, which cannot be placed "
                             f"under an image root; leave --image-root out to use the ids as they "
                             f"are")
    norm = paths.normpath(path)
    if norm == os.pardir or norm.startswith(os.pardir + paths.sep):
        raise ImageRootError(f"the id '{row_id}' goes above the image root with '..'; leave "
                             f"--image-root out to use the ids as they are")
    return norm


def to_labelstudio(rows: Sequence[Mapping], image_root: str | None, model_version: str, *,
                   texts: Sequence[str] | None = None, class_names: Sequence[str] | None = None,
                   task: str = "classification", from_name: str = "label",
                   to_name: str | None = None) -> list[dict]:
    """Label Studio import tasks, one per row, in row order.

    Shape (Label Studio's "basic JSON format" with pre-annotations, a JSON array of tasks):
      {"data": {"image": <url or path> | "text": <text>, "alcli_id", "alcli_rank", "alcli_score"
                [, "alcli_pred"]},
       "predictions": [{"model_version": <str>, "score": <float>, "result": [<region>, ...]}]}
    `data.image` feeds an `<Image name="image" value="$image"/>` tag (`data.text`, given `texts`
    one per row, a `<Text name="text" value="$text"/>` tag). The regions are the model's
    prediction in the control tag `from_name` of `task`'s labeling config (`labeling_config`),
    one function per task in PRELABELS: `choices` (classification, multilabel), `labels` spans
    (token classification), `rectanglelabels` (detection); classes by name (the row's own names,
    else `class_names[index]`); what has no name is left out. The prediction's score (alcli's)
    lets the Data Manager sort by it. The top-level task `id` is reserved by Label Studio.
    """
    field = "image" if texts is None else "text"
    regions = PRELABELS.get(task, _nothing)
    tag = Tag(from_name, to_name or field)
    tasks = []
    for n, row in enumerate(rows, 1):
        score = _finite(row, n)
        ref = image_ref(row["id"], image_root) if texts is None else str(texts[n - 1])
        data = {field: ref, "alcli_id": str(row["id"]),
                "alcli_rank": int(row.get("rank", n)), "alcli_score": score}
        if row.get("pred") is not None:
            data["alcli_pred"] = _plain(row["pred"])
        result = regions(row, n, tag, class_names, ref)
        tasks.append({"data": data,
                      "predictions": [{"model_version": str(model_version), "score": score,
                                       "result": result}]})
    return tasks


@dataclass(frozen=True)
class Tag:
    """The labeling config's control tag the regions fill (`from_name`) and its object (`to_name`)."""
    from_name: str
    to_name: str

    def region(self, rid: str, kind: str, value: dict, **more) -> dict:
        return {"id": rid, "type": kind, "from_name": self.from_name, "to_name": self.to_name,
                **more, "value": value}


# --- pre-labels per task: (row, its number n, tag, class names, data value) -> regions -----------

def _choice(row, n, tag, names, ref) -> list[dict]:
    """Classification: the predicted class, one choice."""
    name = predicted_name(row, names)
    return [] if name is None else [tag.region(f"alcli-{n}", "choices", {"choices": [name]})]


def _choice_set(row, n, tag, names, ref) -> list[dict]:
    """Multilabel: every label the model predicts (p > 1/2; the row's pred, joined by |)."""
    chosen = [name for name in (_named(p, names) for p in predicted_labels(row, names))
              if name is not None]
    return [tag.region(f"alcli-{n}", "choices", {"choices": chosen})] if chosen else []


def _spans(row, n, tag, names, text) -> list[dict]:
    """Token classification: each entity as a `labels` span of character offsets into the text
    (code points, as Label Studio stores them), from the per-word predictions (`pred_words`)."""
    words = [m.span() for m in re.finditer(r"\S+", text)]
    if text.endswith(MORE) and words:  # a text cut short: its last word is cut too
        words.pop()
    tags = [_named(t, names) for t in _json_list(row, n, "pred_words")]
    if len(words) > len(tags):
        raise ValueError(f"row {n} (id '{row.get('id')}') predicts {len(tags)} words, but its "
                         f"text has {len(words)}; it is not the text that was scored")
    out = []
    for k, (label, first, last) in enumerate(entities(tags[:len(words)])):
        start, end = words[first][0], words[last][1]
        out.append(tag.region(f"alcli-{n}-{k}", "labels", {
            "start": start, "end": end, "text": text[start:end], "labels": [label]}))
    return out


def _rectangles(row, n, tag, names, ref) -> list[dict]:
    """Detection: each box as `rectanglelabels` in percent of the image (x, y its top-left corner),
    clipped to the image, with the image's size in pixels and the box's score."""
    w, h = (_size(row, n, key) for key in ("width", "height"))
    out = []
    for k, box in enumerate(_json_list(row, n, "boxes")):
        if not (isinstance(box, list) and len(box) == 6 and
                all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
                    for v in box)):
            raise ValueError(f"row {n} (id '{row.get('id')}'): box {k + 1} is not [x0, y0, x1, "
                             f"y1, class_index, score] of finite numbers")
        x0, y0, x1, y1, index, score = box
        if x1 < x0 or y1 < y0:
            raise ValueError(f"row {n} (id '{row.get('id')}'): box {k + 1} ends before it starts "
                             f"(x1 < x0 or y1 < y0); boxes are [x0, y0, x1, y1, ...]")
        name = _named(int(index), names) if float(index).is_integer() else None
        if name is None:
            continue
        x0, x1 = (min(max(v, 0.0), w) for v in (x0, x1))
        y0, y1 = (min(max(v, 0.0), h) for v in (y0, y1))
        out.append(tag.region(f"alcli-{n}-{k}", "rectanglelabels", {
            "x": 100.0 * x0 / w, "y": 100.0 * y0 / h, "width": 100.0 * (x1 - x0) / w,
            "height": 100.0 * (y1 - y0) / h, "rotation": 0, "rectanglelabels": [name]},
            original_width=w, original_height=h, image_rotation=0, score=float(score)))
    return out


def _number(row, n, tag, names, ref) -> list[dict]:
    """Regression with one output: the predicted value in a `<Number>` tag (several: none)."""
    value = _plain(row.get("pred"))  # a table read back holds it as text ("-1.5")
    try:
        number = float(value) if not isinstance(value, bool) else math.nan
    except (TypeError, ValueError):  # several outputs ("0.5|2"), or none
        return []
    return [tag.region(f"alcli-{n}", "number", {"number": number})] if math.isfinite(number) else []


def _nothing(row, n, tag, names, ref) -> list[dict]:
    """Segmentation: no pre-label (the README says why: rows carry no mask in the image's pixels)."""
    return []


PRELABELS = {"classification": _choice, "multilabel": _choice_set, "token-classification": _spans,
             "detection": _rectangles, "regression": _number, "segmentation": _nothing}


def entities(tags: Sequence[str | None]) -> list[tuple[str, int, int]]:
    """Word tags -> (label, first word, last word) spans. BIO (IOB2) tags: `B-X` starts an X,
    `I-X` goes on with the X just before it (else starts one, as seqeval's lenient mode reads a
    stray I-); `O` and None (no prediction) are outside. Plain labels (IO): consecutive words of
    one label are one span."""
    spans: list[list] = []
    open_ = False  # does the last span end at the word before?
    for k, t in enumerate(tags):
        if t is None or t == "O":
            open_ = False
            continue
        begins = t.startswith("B-")
        label = t[2:] if t.startswith(("B-", "I-")) else t
        if open_ and not begins and spans[-1][0] == label:
            spans[-1][2] = k
        else:
            spans.append([label, k, k])
        open_ = True
    return [tuple(s) for s in spans]


def entity_labels(names: Sequence[str]) -> list[str]:
    """The labels a token-classification config offers: the names with B-/I- cut, `O` left out."""
    out: dict[str, None] = {}
    for name in names:
        if name != "O":
            out.setdefault(name[2:] if name.startswith(("B-", "I-")) else name, None)
    return list(out)


def predicted_labels(row: Mapping, names: Sequence[str] | None = None) -> list:
    """A multilabel row's predicted labels: its pred split at | (names, or indices as numbers
    where they are not among `names`)."""
    pred = _plain(row.get("pred"))
    if pred is None or pred == "":
        return []
    if not isinstance(pred, str):
        return [pred]
    known = set(names or ())
    return [int(p) if p.isdigit() and p not in known else p for p in pred.split("|") if p]


def unnamed(rows: Sequence[Mapping], names: Sequence[str] | None, task: str) -> int:
    """How many rows predict a class that has no name (an index beyond `names`): its pre-label
    is left out."""
    def bare(row) -> bool:
        if task == "classification":
            return row.get("pred") is not None and predicted_name(row, names) is None
        if task == "multilabel":
            found = predicted_labels(row, names)
        elif task == "token-classification":
            found = [t for t in _loose_list(row.get("pred_words")) if t is not None]
        elif task == "detection":
            found = [int(b[4]) for b in _loose_list(row.get("boxes"))
                     if isinstance(b, list) and len(b) == 6 and isinstance(b[4], (int, float))]
        else:
            return False
        return any(_named(v, names) is None for v in found)
    return sum(1 for row in rows if bare(row))


def _loose_list(value) -> list:
    """A JSON list column read for a warning: [] where it is missing or bad (the export says why)."""
    try:
        parsed = json.loads(value) if isinstance(value, str) else value
    except json.JSONDecodeError:
        return []
    return parsed if isinstance(parsed, list) else []


def _named(value, names: Sequence[str] | None) -> str | None:
    """A class by name: a name as it is, an index by `names`; None when there is no name."""
    value = _plain(value)
    if isinstance(value, str):
        return value or None
    if names and isinstance(value, int) and not isinstance(value, bool) and 0 <= value < len(names):
        return str(names[value])
    return None


def _json_list(row: Mapping, n: int, key: str) -> list:
    value = row.get(key)
    if value is None or value == "":
        raise ValueError(f"row {n} (id '{row.get('id')}') has no '{key}' column, which these "
                         f"pre-labels are made from")
    try:
        parsed = json.loads(value) if isinstance(value, str) else value
    except json.JSONDecodeError as err:
        raise ValueError(f"row {n} (id '{row.get('id')}'): {key} is not a JSON list ({err.msg})") from None
    if not isinstance(parsed, list):
        raise ValueError(f"row {n} (id '{row.get('id')}'): {key} is not a JSON list")
    return parsed


def _size(row: Mapping, n: int, key: str) -> int:
    value = _plain(row.get(key))
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ValueError(f"row {n} (id '{row.get('id')}'): {key} {value!r} is not an image size "
                         f"in pixels (a positive integer)")
    return value


def predicted_name(row: Mapping, class_names: Sequence[str] | None) -> str | None:
    """The predicted class's name: that of index `pred_index` in `class_names` (a table of named
    classes says its index there), else `pred` itself when it is a name, the name of index
    `pred` in `class_names`, else None."""
    index = _plain(row.get("pred_index"))
    if class_names and isinstance(index, int) and not isinstance(index, bool) and \
            0 <= index < len(class_names):
        return str(class_names[index])
    pred = _plain(row.get("pred"))
    if isinstance(pred, str) and pred:
        return pred
    if class_names and isinstance(pred, int) and not isinstance(pred, bool) and 0 <= pred < len(class_names):
        return str(class_names[pred])
    return None


# --- the labeling config each task's pre-labels fit ---------------------------------------------------

CONTROLS = {"classification": ("Choices", "Choice", ' choice="single"'),
            "multilabel": ("Choices", "Choice", ' choice="multiple"'),
            "token-classification": ("Labels", "Label", ""),
            "detection": ("RectangleLabels", "Label", ""),
            "segmentation": ("BrushLabels", "Label", "")}


def labeling_config(task: str, names: Sequence[str] | None, field: str = "image",
                    from_name: str = "label", to_name: str | None = None) -> str:
    """Label Studio's labeling config (XML) for `task`: the object tag (`<Image>` reading
    data.image, or `<Text>` reading data.text) named `to_name`, and the control tag `from_name`
    holding the class names, the one alcli's pre-labels fill. Token classification offers the
    entity types (BIO prefixes cut, `O` left out); regression a `<Number>`. Without names: a
    ValueError (the control tag must list them)."""
    to_name = to_name or field
    for what, value in (("--from-name", from_name), ("--to-name", to_name),
                        *(("class name", str(n)) for n in names or ())):
        bad = _NOT_XML.search(value)
        if bad:
            raise ValueError(f"the {what} {ascii(value)[:80]} holds U+{ord(bad.group()):04X}, "
                             f"which an XML labeling config cannot hold")
    obj = f'  <{"Image" if field == "image" else "Text"} name={quoteattr(to_name)} value="${field}"/>'
    if task == "regression":
        return (f"<View>\n{obj}\n  <Number name={quoteattr(from_name)} toName={quoteattr(to_name)}/>"
                f"\n</View>\n")
    if task not in CONTROLS:
        raise ValueError(f"no labeling config is known for the task {task}")
    if not names:
        raise ValueError(f"the labeling config of a {task} project lists the class names, and "
                         f"none are known")
    tag, item, more = CONTROLS[task]
    labels = entity_labels(names) if task == "token-classification" else list(dict.fromkeys(names))
    items = "".join(f"\n    <{item} value={quoteattr(str(n))}/>" for n in labels)
    control = (f"  <{tag} name={quoteattr(from_name)} toName={quoteattr(to_name)}{more}>{items}"
               f"\n  </{tag}>")
    return f"<View>\n{obj}\n{control}\n</View>\n"


def _finite(row: Mapping, n: int) -> float:
    try:
        s = float(row["score"])
    except (KeyError, TypeError, ValueError):
        raise ValueError(f"row {n} (id '{row.get('id')}') has no numeric score") from None
    if not math.isfinite(s):
        raise ValueError(f"row {n} (id '{row.get('id')}') has a score that is not finite; "
                         f"JSON cannot hold it")
    return s


def _plain(v):
    """numpy / torch scalars -> Python numbers, so json can write them."""
    return v.item() if hasattr(v, "item") and not isinstance(v, (str, bytes)) else v


# --- writing --------------------------------------------------------------------------------------

def _atomic_write_text(path: str, text: str) -> None:
    if path == "-":
        sys.stdout.write(text)
        sys.stdout.flush()
        return
    with atomic_open(path, "w", encoding="utf-8", newline="\n") as fh:
        fh.write(text)


def write_text(text: str, path: str) -> None:
    """Write a text file (e.g. a labeling config) atomically; `-` = stdout."""
    _atomic_write_text(path, text)


def write_json(obj, path: str) -> None:
    """Write one JSON document (e.g. Label Studio tasks) atomically; `-` = stdout. NaN is an error."""
    _atomic_write_text(path, json.dumps(obj, indent=2, ensure_ascii=False, allow_nan=False,
                                        default=_plain) + "\n")


# --- contact sheet --------------------------------------------------------------------------------

PAD = 4
CAPTION_LINES = 3  # "#rank", id, "score …"
BACKGROUND = (255, 255, 255)
TILE_BACKGROUND = (235, 235, 235)


def _font():
    """DejaVu Sans where there is one (the system's, or matplotlib's copy): it has glyphs for
    accented, Greek and Cyrillic ids, which Pillow's built-in font draws as boxes. CJK ids still
    need a CJK font, which is not looked for."""
    for name in filter(None, ("DejaVuSans.ttf", _matplotlib_font())):
        try:
            return ImageFont.truetype(name, 11)
        except OSError:
            continue
    return ImageFont.load_default()


def _matplotlib_font() -> str | None:
    try:
        import matplotlib  # optional: only its font file is used
    except ImportError:
        return None
    return os.path.join(os.path.dirname(matplotlib.__file__), "mpl-data", "fonts", "ttf",
                        "DejaVuSans.ttf")


def _line_height(font) -> int:
    top, bottom = font.getbbox("Ag#|(")[1::2]
    return bottom - min(top, 0) + 2


def sheet_layout(n: int, tile: int = 160, columns: int = 8) -> tuple[int, int, int, int]:
    """Grid of a contact sheet for n images -> (cols, rows, cell_w, cell_h); the PNG is
    (cols·cell_w) × (rows·cell_h), image i (0-based) in cell (i % cols, i // cols), its picture
    fitted into the tile×tile square at (PAD, PAD) inside the cell, the caption below."""
    if n < 1 or tile < 8 or columns < 1:
        raise ValueError(f"contact sheet needs >= 1 image, tile >= 8 and columns >= 1; "
                         f"got {n}, {tile}, {columns}")
    cols = min(columns, n)
    rows = -(-n // cols)
    return cols, rows, tile + 2 * PAD, tile + 3 * PAD + CAPTION_LINES * _line_height(_font())


def _to_rgb(im: Image.Image) -> Image.Image:
    """Any Pillow mode -> RGB: high-bit-depth greyscale is min-max stretched, alpha is composited
    over the tile background, palette / CMYK / 1-bit are converted."""
    if im.mode in ("I", "F") or im.mode.startswith("I;"):
        arr = np.asarray(im, dtype=np.float64)
        lo, hi = (float(np.nanmin(arr)), float(np.nanmax(arr))) if arr.size else (0.0, 0.0)
        arr = np.nan_to_num((arr - lo) / (hi - lo) * 255.0 if hi > lo else arr * 0.0)
        return Image.fromarray(arr.clip(0, 255).astype(np.uint8), "L").convert("RGB")
    if im.mode in ("RGBA", "LA", "PA", "La", "RGBa") or (im.mode == "P" and "transparency" in im.info):
        rgba = im.convert("RGBA")
        out = Image.new("RGB", rgba.size, TILE_BACKGROUND)
        out.paste(rgba, mask=rgba.getchannel("A"))
        return out
    return im.convert("RGB")


def _load_picture(path: str, tile: int) -> Image.Image:
    with Image.open(open_source(path)) as im:  # a file, a shard's member, a table's cell
        im.draft("RGB", (tile, tile))  # JPEG: decode at a reduced scale when much larger
        im = _to_rgb(ImageOps.exif_transpose(im))
    w, h = im.size
    scale = min(tile / w, tile / h)
    size = (max(1, round(w * scale)), max(1, round(h * scale)))
    # small images (28×28 digits) are enlarged with crisp pixels, large ones reduced smoothly
    return im.resize(size, Image.Resampling.NEAREST if scale >= 1 else Image.Resampling.LANCZOS)


def _fit(draw: ImageDraw.ImageDraw, text: str, font, width: int) -> str:
    """The text, or its tail after "...", so it fits in `width` pixels (paths end in the name).

    Only the last 2 x `width` characters can be shown (glyphs are wider than half a pixel), and
    the cut is found by bisection, so a 30 000-character id costs a dozen measurements."""
    tail = text[-2 * width:]
    if tail == text and draw.textlength(text, font=font) <= width:
        return text
    lo, hi = 0, len(tail)  # the shortest cut of `tail` after which "..." + the rest fits
    while lo < hi:
        mid = (lo + hi) // 2
        if draw.textlength("..." + tail[mid:], font=font) <= width:
            hi = mid
        else:
            lo = mid + 1
    return "..." + tail[lo:]


def contact_sheet(rows: Sequence[Mapping], image_root_dir: str | None, out_png: str, *,
                  tile: int = 160, columns: int = 8,
                  paths: Sequence[str] | None = None) -> list[str]:
    """Draw the batch as one PNG grid, each image with its rank, id and score beneath it.

    Image paths are the ids, under `image_root_dir` when given (absolute ids stay as they are),
    or `paths` (one per row) when given.
    An image that cannot be read gets a grey tile marked "unreadable"; those ids are returned so
    the caller can warn. The PNG is written atomically.
    """
    cols, nrows, cell_w, cell_h = sheet_layout(len(rows), tile, columns)
    font = _font()
    line_h = _line_height(font)
    sheet = Image.new("RGB", (cols * cell_w, nrows * cell_h), BACKGROUND)
    draw = ImageDraw.Draw(sheet)
    failed = []
    for i, row in enumerate(rows):
        x0, y0 = (i % cols) * cell_w, (i // cols) * cell_h
        draw.rectangle([x0 + PAD, y0 + PAD, x0 + PAD + tile - 1, y0 + PAD + tile - 1],
                       fill=TILE_BACKGROUND)
        rid = str(row["id"])
        path = (paths[i] if paths is not None else
                rid if image_root_dir is None else os.path.join(image_root_dir, rid))
        try:
            pic = _load_picture(path, tile)
            sheet.paste(pic, (x0 + PAD + (tile - pic.width) // 2, y0 + PAD + (tile - pic.height) // 2))
        except (OSError, ValueError, SyntaxError, Image.DecompressionBombError):
            failed.append(rid)
            draw.text((x0 + PAD + 4, y0 + PAD + tile // 2 - line_h // 2), "unreadable",
                      fill=(160, 0, 0), font=font)
        draw.rectangle([x0 + PAD - 1, y0 + PAD - 1, x0 + PAD + tile, y0 + PAD + tile],
                       outline=(200, 200, 200))  # frames white images on the white sheet
        score = float(row["score"])
        pred = row.get("pred")
        caption = [f"#{row.get('rank', i + 1)}", rid,
                   f"score {score:.4g}" + (f", pred {pred}" if pred not in (None, "") else "")]
        for j, text in enumerate(caption):
            draw.text((x0 + PAD, y0 + 2 * PAD + tile + j * line_h), _fit(draw, text, font, tile),
                      fill=(0, 0, 0), font=font)
    _atomic_save_png(sheet, out_png)
    return failed


def text_sheet(rows: Sequence[Mapping], texts: Sequence[str], out_png: str, *, tile: int = 240,
               columns: int = 4) -> None:
    """The contact sheet of a text batch: each text word-wrapped in a tile×tile box (cut with
    "..." where it does not fit), its rank, id, score and prediction beneath, as for images."""
    cols, nrows, cell_w, cell_h = sheet_layout(len(rows), tile, columns)
    font = _font()
    line_h = _line_height(font)
    sheet = Image.new("RGB", (cols * cell_w, nrows * cell_h), BACKGROUND)
    draw = ImageDraw.Draw(sheet)
    for i, row in enumerate(rows):
        x0, y0 = (i % cols) * cell_w, (i // cols) * cell_h
        draw.rectangle([x0 + PAD, y0 + PAD, x0 + PAD + tile - 1, y0 + PAD + tile - 1],
                       fill=TILE_BACKGROUND, outline=(200, 200, 200))
        lines = _wrap(draw, str(texts[i]), font, tile - 8, max(1, (tile - 8) // line_h))
        for j, text in enumerate(lines):
            draw.text((x0 + PAD + 4, y0 + PAD + 4 + j * line_h), text, fill=(0, 0, 0), font=font)
        pred = row.get("pred")
        caption = [f"#{row.get('rank', i + 1)}", str(row["id"]),
                   f"score {float(row['score']):.4g}" + (f", pred {pred}" if pred not in (None, "") else "")]
        for j, text in enumerate(caption):
            draw.text((x0 + PAD, y0 + 2 * PAD + tile + j * line_h), _fit(draw, text, font, tile),
                      fill=(0, 0, 0), font=font)
    _atomic_save_png(sheet, out_png)


def _wrap(draw: ImageDraw.ImageDraw, text: str, font, width: int, max_lines: int) -> list[str]:
    """`text` in lines of at most `width` pixels, broken between words (inside a word too long
    for a line); at most `max_lines`, the last ending in "..." when the text goes on."""
    lines: list[str] = []
    words = text.split()
    line = ""
    while words and len(lines) < max_lines:
        word = words[0]
        trial = f"{line} {word}" if line else word
        if len(trial) <= width and draw.textlength(trial, font=font) <= width:  # >= 1 px a character
            line = trial
            words.pop(0)
        elif line:
            lines.append(line)
            line = ""
        else:  # one word wider than the line: as many characters as fit
            cut = 1
            while cut < len(word) and draw.textlength(word[:cut + 1], font=font) <= width:
                cut += 1
            lines.append(word[:cut])
            words[0] = word[cut:]
    if line and len(lines) < max_lines:
        lines.append(line)
        line = ""
    if words or line:
        lines[-1] = _fit_end(draw, lines[-1], font, width)
    return lines


def _fit_end(draw: ImageDraw.ImageDraw, text: str, font, width: int) -> str:
    """The start of `text` and "...", within `width` pixels."""
    while text and draw.textlength(text + "...", font=font) > width:
        text = text[:-1]
    return text.rstrip() + "..."


def _atomic_save_png(img: Image.Image, path: str) -> None:
    with atomic_open(path, "wb") as fh:
        img.save(fh, format="PNG")
