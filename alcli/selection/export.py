"""Hand-offs for a selected batch: Label Studio tasks and a contact sheet PNG (of images or texts).

Rows are dicts with at least `id` and `score` (and optionally `rank`, `pred`), in batch order.
"""
from __future__ import annotations

import json
import math
import os
import posixpath
import re
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Mapping, Sequence
from urllib.parse import quote
from xml.sax.saxutils import quoteattr

import numpy as np
from PIL import Image, ImageDraw, ImageFont, ImageOps

from ..files.atomic import atomic_open
from ..files.redact import redacted
from ..pools import open_source, split_source
from ..tasks import TASKS
from ..tasks.shared.labelstudio import Tag, entities, plain_value  # noqa: F401 - entities: the token pre-labels' spans

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
       "predictions": [{"model_version": <str>, "score": <float>, "result": [<region>, ...]}]
       [, "annotations": [{"result": [<region>, ...]}]]}
    `data.image` feeds an `<Image name="image" value="$image"/>` tag (`data.text`, given `texts`
    one per row, a `<Text name="text" value="$text"/>` tag). The regions are the model's
    prediction in the control tag `from_name` of `task`'s labeling config (`labeling_config`),
    made by the task (`Task.prelabels`: `choices` for classification and multilabel, `labels`
    spans for token classification, `rectanglelabels` for detection, ...); classes by name (the row's own names,
    else `class_names[index]`); what has no name is left out. The prediction's score (alcli's)
    lets the Data Manager sort by it. The top-level task `id` is reserved by Label Studio. A row
    of `alcli review`'s table also brings its given label as an annotation, for a person to verify
    against the prediction (the model's suggestion).
    """
    field = "image" if texts is None else "text"
    regions = TASKS[task].prelabels if task in TASKS else _nothing
    tag = Tag(from_name, to_name or field)
    tasks = []
    for n, row in enumerate(rows, 1):
        score = _finite(row, n)
        ref = image_ref(row["id"], image_root) if texts is None else str(texts[n - 1])
        data = {field: ref, "alcli_id": str(row["id"]),
                "alcli_rank": int(row.get("rank", n)), "alcli_score": score}
        if row.get("pred") is not None:
            data["alcli_pred"] = plain_value(row["pred"])
        result = regions(row, n, tag, class_names, ref)
        ls_task = {"data": data, "predictions": [{"model_version": str(model_version),
                                                  "score": score, "result": result}]}
        if _reviewed(row):  # alcli review's table: the given label is the annotation to verify
            given = {k: v for k, v in row.items() if k != "pred_index"}
            verify = regions({**given, "pred": row["label"],
                              **({"pred_words": row["label_words"]} if "label_words" in row else {}),
                              **({"boxes": row["label_boxes"]} if "label_boxes" in row else {})},
                             n, tag, class_names, ref)
            if verify:  # (a label no class name is known for: none)
                ls_task["annotations"] = [{"result": verify}]
        tasks.append(ls_task)
    return tasks


def _reviewed(row: Mapping) -> bool:
    """A row of `alcli review`'s table (it has `flagged`) with a given label."""
    return "flagged" in row and row.get("label") not in (None, "")


def unreachable_image(tasks: Sequence[Mapping]) -> str | None:
    """The first `data.image` a Label Studio server cannot open (neither a URL nor a path on the
    server such as its /data/local-files/?d=...), or None."""
    return next((t["data"]["image"] for t in tasks if "image" in t["data"]
                 and not _URL.match(t["data"]["image"]) and not t["data"]["image"].startswith("/data/")),
                None)


IMAGE_ROOT_HINT = ("pass --image-root URL (an object store's, or the server's own local files: its "
                   "address and /data/local-files/?d=FOLDER)")


def _nothing(row, n, tag, names, ref) -> list[dict]:
    return []


def unnamed(rows: Sequence[Mapping], names: Sequence[str] | None, task: str) -> int:
    """How many rows predict a class that has no name (an index beyond `names`): its pre-label
    is left out."""
    bare = TASKS[task].unnamed if task in TASKS else (lambda row, names: False)
    return sum(1 for row in rows if bare(row, names))


# --- the labeling config each task's pre-labels fit ---------------------------------------------------

def labeling_config(task: str, names: Sequence[str] | None, field: str = "image",
                    from_name: str = "label", to_name: str | None = None) -> str:
    """Label Studio's labeling config (XML) for `task`: the object tag (`<Image>` reading
    data.image, or `<Text>` reading data.text) named `to_name`, and the control tag `from_name`
    the task's pre-labels fill (`Task.control`: the class names, or the entity types for token
    classification, BIO prefixes cut and `O` left out; a `<Number>` for regression). A task whose
    control lists names, without names: a ValueError (the control tag must list them)."""
    to_name = to_name or field
    for what, value in (("--from-name", from_name), ("--to-name", to_name),
                        *(("class name", str(n)) for n in names or ())):
        bad = _NOT_XML.search(value)
        if bad:
            raise ValueError(f"the {what} {ascii(value)[:80]} holds U+{ord(bad.group()):04X}, "
                             f"which an XML labeling config cannot hold")
    obj = f'  <{"Image" if field == "image" else "Text"} name={quoteattr(to_name)} value="${field}"/>'
    spec = TASKS.get(task)
    if spec is None or spec.control is None:
        raise ValueError(f"no labeling config is known for the task {task}")
    return f"<View>\n{obj}\n{spec.control(names, from_name, to_name)}\n</View>\n"


# --- pairwise preference: a prompt and two answers ------------------------------------------------

def pairwise_tasks(rows: Sequence[Mapping], model_version: str, pair) -> list[dict]:
    """Label Studio tasks for the pairwise-preference template (`pairwise_config`), one per row:
      {"data": {"prompt", "answer1", "answer2", "alcli_id", "alcli_rank", "alcli_score"},
       "predictions": [{"model_version", "score", "result": []}]}
    `pair(row)` -> (prompt, answer1, answer2) (Task.pairs); a ValueError names a row without."""
    tasks = []
    for n, row in enumerate(rows, 1):
        score = _finite(row, n)
        prompt, first, second = pair(row)
        tasks.append({"data": {"prompt": prompt, "answer1": first, "answer2": second,
                               "alcli_id": str(row["id"]), "alcli_rank": int(row.get("rank", n)),
                               "alcli_score": score},
                      "predictions": [{"model_version": str(model_version), "score": score,
                                       "result": []}]})
    return tasks


def pairwise_config(from_name: str = "label") -> str:
    """Label Studio's pairwise-preference config: the prompt, then a <Pairwise> control over the
    two answers (`toName` names both Text tags) that records which one the annotator prefers."""
    bad = _NOT_XML.search(from_name)
    if bad:
        raise ValueError(f"the --from-name {ascii(from_name)[:80]} holds U+{ord(bad.group()):04X}, "
                         f"which an XML labeling config cannot hold")
    return ("<View>\n"
            '  <Text name="prompt" value="$prompt"/>\n'
            '  <Header value="Which answer is better?"/>\n'
            f'  <Pairwise name={quoteattr(from_name)} toName="answer1,answer2"/>\n'
            '  <Text name="answer1" value="$answer1"/>\n'
            '  <Text name="answer2" value="$answer2"/>\n'
            "</View>\n")


def _finite(row: Mapping, n: int) -> float:
    try:
        s = float(row["score"])
    except (KeyError, TypeError, ValueError):
        raise ValueError(f"row {n} (id '{row.get('id')}') has no numeric score") from None
    if not math.isfinite(s):
        raise ValueError(f"row {n} (id '{row.get('id')}') has a score that is not finite; "
                         f"JSON cannot hold it")
    return s


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
                                        default=plain_value) + "\n")


def write_folder(files: dict[str, bytes], folder: Path) -> None:
    """A folder of `files` ({name: bytes}) written whole: into a temporary folder beside it, which
    then replaces it (an older one's files go with it)."""
    temp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=folder.parent))
    try:
        for name, data in files.items():
            (temp / name).write_bytes(data)
        old = folder.with_name(f".{folder.name}.{os.getpid()}.old")
        if folder.exists():
            os.replace(folder, old)
        os.replace(temp, folder)
        shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(temp, ignore_errors=True)


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


def load_picture(path: str, tile: int) -> Image.Image:
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


class OutsideImageDir(ValueError):
    """An id that names a picture outside --image-dir."""


def picture_file(row_id: str, image_root_dir: str | None) -> str:
    """The picture an id names: the id itself, or under `image_root_dir`. The contact sheet's and
    the report's. Under a given folder it stays there: an absolute id, one climbing out with
    `..` or through a link is refused (OutsideImageDir), so a table from elsewhere cannot pull a
    private picture into a page meant to be shared (hostile inputs R4-12)."""
    if image_root_dir is None:
        return row_id
    path = os.path.join(image_root_dir, row_id)
    root, file = os.path.realpath(image_root_dir), os.path.realpath(split_source(path)[0])
    if os.path.commonpath([root, file]) != root:
        raise OutsideImageDir(f"the id '{row_id}' names a picture outside --image-dir {image_root_dir}")
    return path


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
        try:
            pic = load_picture(paths[i] if paths is not None else picture_file(rid, image_root_dir), tile)
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
