"""The pieces every task's Label Studio pre-labels are made of (alcli.selection.export writes them):
the control tag a region fills, class names, the JSON list columns rows carry, entity spans."""
from __future__ import annotations

import json

import numpy as np
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence
from xml.sax.saxutils import quoteattr


@dataclass(frozen=True)
class Tag:
    """The labeling config's control tag the regions fill (`from_name`) and its object (`to_name`)."""
    from_name: str
    to_name: str

    def region(self, rid: str, kind: str, value: dict, **more) -> dict:
        return {"id": rid, "type": kind, "from_name": self.from_name, "to_name": self.to_name,
                **more, "value": value}


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
    pred = plain_value(row.get("pred"))
    if pred is None or pred == "":
        return []
    if not isinstance(pred, str):
        return [pred]
    known = set(names or ())
    return [int(p) if p.isdigit() and p not in known else p for p in pred.split("|") if p]


def loose_list(value) -> list:
    """A JSON list column read for a warning: [] where it is missing or bad (the export says why)."""
    try:
        parsed = json.loads(value) if isinstance(value, str) else value
    except json.JSONDecodeError:
        return []
    return parsed if isinstance(parsed, list) else []


def named_class(value, names: Sequence[str] | None) -> str | None:
    """A class by name: a name as it is, an index by `names`; None when there is no name."""
    value = plain_value(value)
    if isinstance(value, str):
        return value or None
    if names and isinstance(value, int) and not isinstance(value, bool) and 0 <= value < len(names):
        return str(names[value])
    return None


def json_list(row: Mapping, n: int, key: str) -> list:
    """Row n's column `key` as a JSON list (a pre-label's boxes, keypoints, words); a ValueError
    naming the row where it is missing or not a list."""
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


def row_size(row: Mapping, n: int, key: str) -> int:
    """Row n's column `key` (width, height) as an image size in pixels; a ValueError naming the row
    where it is not a positive integer."""
    value = plain_value(row.get(key))
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
    index = plain_value(row.get("pred_index"))
    if class_names and isinstance(index, int) and not isinstance(index, bool) and \
            0 <= index < len(class_names):
        return str(class_names[index])
    pred = plain_value(row.get("pred"))
    if isinstance(pred, str) and pred:
        return pred
    if class_names and isinstance(pred, int) and not isinstance(pred, bool) and 0 <= pred < len(class_names):
        return str(class_names[pred])
    return None


def plain_value(v):
    """numpy / torch scalars -> Python numbers, so json can write them."""
    return v.item() if hasattr(v, "item") and not isinstance(v, (str, bytes)) else v


def names_control(task: str, tag: str, item: str = "Label", more: str = "",
                  labels: Callable | None = None) -> Callable:
    """`control` of a task whose Label Studio tag lists the class names (`labels(names)`: those
    offered, by default each name once); a ValueError without names."""
    def control(names, from_name: str, to_name: str) -> str:
        if not names:
            raise ValueError(f"the labeling config of a {task} project lists the class names, and "
                             f"none are known")
        offered = labels(names) if labels else list(dict.fromkeys(names))
        items = "".join(f"\n    <{item} value={quoteattr(str(n))}/>" for n in offered)
        return (f"  <{tag} name={quoteattr(from_name)} toName={quoteattr(to_name)}{more}>{items}"
                f"\n  </{tag}>")
    return control


# --- brush masks: Label Studio's run-length encoding ------------------------------------------------
# A brush region's `value.rle` is a byte list holding a bit stream: a 32-bit count N of values (the
# image's RGBA bytes, H x W x 4, row by row), the word size - 1 (5 bits), four run-length field
# sizes - 1 (4 bits each); then records until N values are out: 1 bit (1: one word repeated, 0: a
# list of words), 2 bits choosing a field size, that many bits holding the run length - 1, then the
# word (or the words). A pixel is painted where its alpha byte is not 0.

RLE_SIZES = (3, 4, 8, 16)
LONGEST = 1 << RLE_SIZES[3]


def mask_to_rle(mask: np.ndarray) -> list[int]:
    """A boolean mask [H, W] -> a brush region's `rle`: every pixel's RGBA bytes 255 where painted,
    0 elsewhere, written as repeated runs of at most 2^16 bytes."""
    flat = np.repeat(mask.astype(bool).reshape(-1), 4)
    bits = [f"{flat.size:032b}", f"{8 - 1:05b}", *(f"{s - 1:04b}" for s in RLE_SIZES)]
    change = np.flatnonzero(np.diff(flat.view(np.int8))) + 1
    for start, end in zip([0, *change], [*change, flat.size]):
        word = "11111111" if flat[start] else "00000000"
        for at in range(start, end, LONGEST):
            bits.append(f"111{min(LONGEST, end - at) - 1:016b}{word}")
    stream = "".join(bits)
    stream += "0" * (-len(stream) % 8)
    return np.packbits(np.frombuffer(stream.encode(), np.uint8) - ord("0")).tolist()


MAX_RUN_VALUES_PER_BIT = 3277  # a run of 2^16 values costs at least 1 + 2 + 16 + 1 bits


def check_brush_size(rle, height, width) -> None:
    """A ValueError unless height and width are positive integers within PIL's MAX_IMAGE_PIXELS and
    the run-length stream `rle` (a list of bytes) counts height x width x 4 values and can hold them:
    what a server claims is checked before anything of that size is allocated."""
    from PIL import Image
    if not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in (height, width)):
        raise ValueError(f"the brush region's size {width!r}x{height!r} is not two positive integers")
    if not isinstance(rle, list) or not all(isinstance(b, int) and 0 <= b < 256 for b in rle):
        raise ValueError("the brush region's rle is not a list of bytes")
    cap = Image.MAX_IMAGE_PIXELS or 89_478_485
    if height * width > cap:
        raise ValueError(f"the brush region claims {width}x{height} pixels, more than the {cap} "
                         f"pixels of the largest image alcli reads")
    count = int.from_bytes(bytes(rle[:4]).ljust(4, b"\0"), "big")
    if count != height * width * 4 or count > len(rle) * 8 * MAX_RUN_VALUES_PER_BIT:
        raise ValueError(f"the brush mask holds {count} values in {len(rle)} bytes, not those of a "
                         f"{width}x{height} image (x 4)")


def rle_to_mask(rle, height: int, width: int) -> np.ndarray:
    """A brush region's `rle` -> a boolean mask [height, width] (alpha byte not 0); a ValueError
    when the stream does not hold height x width x 4 values."""
    bits = (np.unpackbits(np.asarray(rle, dtype=np.uint8)) + ord("0")).tobytes().decode()
    at = 0

    def read(n: int) -> int:
        nonlocal at
        if at + n > len(bits):
            raise ValueError("the brush mask's run-length stream ends early")
        value = int(bits[at:at + n], 2)
        at += n
        return value

    count, word = read(32), read(5) + 1
    sizes = [read(4) + 1 for _ in range(4)]
    if count != height * width * 4:
        raise ValueError(f"the brush mask holds {count} values, not those of a {width}x{height} "
                         f"image (x 4)")
    out = np.zeros(count, dtype=np.uint8)
    i = 0
    while i < count:
        repeated = read(1)
        end = min(count, i + 1 + read(sizes[read(2)]))
        if repeated:
            out[i:end] = read(word)
        else:
            for k in range(i, end):
                out[k] = read(word)
        i = end
    return out.reshape(height, width, 4)[:, :, 3] > 0


# --- annotations read back (alcli pull) ---------------------------------------------------------

def chosen(regions: Sequence[Mapping], kind: str) -> list:
    """The values of kind `kind` (choices, labels, ...) the regions hold, in order."""
    return [v for r in regions for v in r.get("value", {}).get(kind, [])]


def class_index(name: str, names: Sequence[str] | None):
    """A label as the labels file holds it: its index among `names`, else the name itself."""
    return list(names).index(name) if names and name in names else name


def offered(names: Sequence[str]) -> list[str]:
    """The class names a box or mask config offers: torchvision's class 0 left out when it is its
    background (named `background` or `__background__`), which no annotator draws."""
    first = str(names[0]).strip("_").lower() if names else ""
    return list(dict.fromkeys(names[1:] if first == "background" else names))
