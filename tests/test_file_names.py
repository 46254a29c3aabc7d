"""Ids to file names, through every writer that names a file after an id (files/names.py is the one
door): score's mask PNGs, pull's mask PNGs, YOLO's label files and images.txt, COCO's file_name.

Hypothesis draws hostile id sets (suffix variants of one stem, `\\` and `//` and `./`, `..` parts,
case-folding unicode such as 'ß'/'SS' and the Kelvin sign, line breaks and other controls, a file
beside a folder of the same name) and drives each through each writer. A writer either refuses the
batch with FileNameError (a ValueError) naming the culprit id(s), and only where this file's own
oracle finds the set ambiguous or unsafe for it, writing nothing; or it writes, and then every id's
file lies inside the output folder (realpath), holds that id's own value (a class index per id, read
back), no two ids share a file (case-folded), and nothing is created outside the output folder.
Then the R3-9, R3-15 and R3-19 regressions through the real CLI.
"""
from __future__ import annotations

import csv
import json
import os
import posixpath
import tempfile
import unicodedata
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import event, example, given, settings, strategies as st
from PIL import Image

from alcli.files.names import FileNameError
from alcli.labeling import _save_mask
from alcli.selection.coco_yolo import to_coco, to_yolo, write_yolo
from alcli.tasks.segmentation import _write_masks
from cli_errors import assert_one_error
from shell import invoke_in, ok

PART_BYTES = 200  # the door's longest folder or file name kept from an id

# ------------------------------------------------------------------------------ hostile id sets
STEMS = ["a", "A", "b", "ß", "SS", "ss", "\u212a", "k", "K", "é", "e\u0301", "\ufb01", "fi", "a.txt",
         "A.TXT", "x y", "日本", ".", "..", "...", ".hidden", "", "a.", "x" * (PART_BYTES + 1)]
SUFFIXES = ["", ".png", ".jpg", ".PNG", ".Jpg", ".txt", ".tar.gz"]
PREFIXES = ["", "", "sub/", "SUB/", "sub\\", "sub//", "./", "../", "sub/../", "sub/./", "/", "\\",
            "a/", "a.txt/", "A.TXT/", "a/b/", "..\\", "a/../../"]
CONTROLS = ["\n", "\r", "\r\n", "\t", "\x00", "\x0b", "\x0c", "\x1b", "\x1e", "\x7f", "\x85",
            "\u2028", "\u2029"]
# random text: any character but surrogates (test_lone_surrogate_ids_...)
TEXT = st.text(st.characters(blacklist_categories=("Cs",)), max_size=6)

shaped = st.tuples(st.sampled_from(PREFIXES), st.sampled_from(STEMS), st.sampled_from(SUFFIXES)).map("".join)
controlled = st.tuples(shaped, st.sampled_from(CONTROLS), st.integers(0, 12)).map(
    lambda t: t[0][:t[2]] + t[1] + t[0][t[2]:])
ID = st.one_of(shaped, shaped, controlled, TEXT)
# sets a writer should mostly write: no control, nothing absolute or leaving, so only clashes refuse
SAFE_PREFIXES = ["", "", "sub/", "SUB/", "sub\\", "sub//", "./", "sub/../", "a/", "a.txt/", "日本/"]
SAFE_STEMS = st.one_of(st.sampled_from([s for s in STEMS if s not in ("", ".", "..")
                                        and len(s) <= PART_BYTES]),
                       st.text(st.characters(categories=["L", "N", "M"]), min_size=1, max_size=5))
safe = st.tuples(st.sampled_from(SAFE_PREFIXES), SAFE_STEMS, st.sampled_from(SUFFIXES)).map("".join)
IDS = st.one_of(st.lists(safe, min_size=1, max_size=6, unique=True),
                st.lists(ID, min_size=1, max_size=5, unique=True))


# -------------------------------------------------------------------------- the oracle's reading
def is_control(ch: str) -> bool:
    """A control character (Unicode Cc) or a line or paragraph separator: no line may hold one."""
    return unicodedata.category(ch) == "Cc" or ch in "\u2028\u2029"


def rel_path(row_id: str) -> str | None:
    """The id as a path relative to the output folder (`\\` read as `/`), or None where it has none:
    empty, absolute, leaving the folder by `..`, holding a control, a part over PART_BYTES."""
    if not row_id or any(is_control(ch) for ch in row_id):
        return None
    text = row_id.replace("\\", "/")
    if text.startswith("/"):
        return None
    parts: list[str] = []
    for part in text.split("/"):
        if part in ("", "."):
            continue
        if part == "..":
            if not parts:
                return None
            parts.pop()
        else:
            parts.append(part)
    if not parts or any(len(p.encode("utf-8")) > PART_BYTES for p in parts):
        return None
    return "/".join(parts)


def label_file(row_id: str) -> str | None:
    """YOLO's rule: the id's path with its own suffix replaced by .txt, under labels/."""
    path = rel_path(row_id)
    return None if path is None else "labels/" + posixpath.splitext(path)[0] + ".txt"


def image_link(row_id: str) -> str | None:
    """Where the YOLO folder links the id's image: images/ID."""
    path = rel_path(row_id)
    return None if path is None else "images/" + path


def folded(name: str) -> str:
    """How a case-insensitive, normalising disk sees a name: NFC of the case-folded NFD."""
    return unicodedata.normalize("NFC", unicodedata.normalize("NFD", name).casefold())


def justified(ids: list[str], name) -> tuple[set[str], set[frozenset]]:
    """Why a writer naming files by `name` may refuse the batch: the ids with no name (unsafe), and
    the pairs of ids whose names clash (equal case-folded, or one's file another's folder)."""
    unsafe = {i for i in ids if name(i) is None}
    keys = {i: folded(name(i)) for i in ids if i not in unsafe}
    pairs = set()
    for i, key in keys.items():
        for j, other in keys.items():
            if i != j and (key == other or other.startswith(key + "/")):
                pairs.add(frozenset((i, j)))
    return unsafe, pairs


def named(message: str, row_id: str) -> bool:
    return (f"'{row_id}'" in message or repr(row_id) in message
            or (len(row_id) > 60 and row_id[:60] in message))


def check_refusal(err: FileNameError, ids: list[str], name) -> None:
    """A refusal is allowed only for an ambiguous or unsafe set, and names its culprit(s)."""
    unsafe, pairs = justified(ids, name)
    message = str(err)
    assert unsafe or pairs, f"refused a set with no clash and no unsafe id: {ids!r}: {message}"
    assert (any(named(message, i) for i in unsafe)
            or any(all(named(message, i) for i in pair) for pair in pairs)), (ids, message)


def inside(folder: Path, path) -> bool:
    real, top = os.path.realpath(path), os.path.realpath(folder)
    return real.startswith(top + os.sep)


def all_files(root: Path) -> set[Path]:
    return {Path(d) / f for d, _, files in os.walk(root) for f in files}


def distinct_case_folded(paths) -> bool:
    names = [folded(str(p)) for p in paths]
    return len(set(names)) == len(names)


# ---------------------------------------------------------------------------------- the writers
def score_masks(ids: list[str], root: Path) -> None:
    """score: `_write_masks`; the id at place k gets class k + 1 and an image (k + 1) x 2."""
    images = root / "images"
    images.mkdir()
    paths = []
    for k in range(len(ids)):
        paths.append(str(images / f"{k}.png"))
        Image.new("RGB", (k + 1, 2)).save(paths[-1])
    logits = torch.zeros(len(ids), len(ids) + 1, 4, 4)
    for k in range(len(ids)):
        logits[k, k + 1] = 1.0
    rows = [{"id": i} for i in ids]
    out = root / "out"
    _write_masks(logits, rows, paths, str(out))  # never refuses: any id has a file
    written = [root / r["pred_mask"] for r in rows]  # relative to the table's folder
    assert distinct_case_folded(written) and distinct_case_folded(p.name for p in written)
    for k, path in enumerate(written):
        assert inside(out, path) and path.parent == out, (ids[k], path)
        with Image.open(path) as img:
            mask = np.array(img)
        assert mask.shape == (2, k + 1) and (mask == k + 1).all(), (ids[k], path)
    assert all_files(root) == set(written) | {images / f"{k}.png" for k in range(len(ids))}
    assert set(os.listdir(root)) == {"images", "out"}


def pull_masks(ids: list[str], root: Path) -> None:
    """pull: `_save_mask` into a staged folder, the path it will have under the final folder."""
    base = root / "labels"
    staged, final = base / ".m.csv.x.pull" / "masks", base / "m_masks"
    staged.parent.mkdir(parents=True)  # `staging` makes it; _save_mask makes masks/ in it
    final.mkdir()
    cells = []
    for k, row_id in enumerate(ids):
        cells.append(_save_mask(np.full((2, k + 1), k + 1, np.uint8), staged, final, row_id, base))
    assert distinct_case_folded(cells)
    staged_files = []
    for k, cell in enumerate(cells):
        assert not os.path.isabs(cell) and inside(final, base / cell), (ids[k], cell)
        assert (base / cell).parent.resolve() == final.resolve()
        staged_files.append(staged / Path(cell).name)
        with Image.open(staged_files[-1]) as img:
            mask = np.array(img)
        assert mask.shape == (2, k + 1) and (mask == k + 1).all(), (ids[k], cell)
    assert all_files(root) == set(staged_files) and os.listdir(final) == []
    assert set(os.listdir(root)) == {"labels"}


def det_rows(ids: list[str]) -> list[dict]:
    """One box of class k + 1 per id (4x4 images), and one wholly outside the image (left out)."""
    return [{"id": i, "score": 1.0, "width": 4, "height": 4,
             "boxes": json.dumps([[0, 0, 2, 2, k + 1, 0.9], [-5, -5, -1, -1, 99, 0.5]])}
            for k, i in enumerate(ids)]


def yolo(ids: list[str], root: Path) -> None:
    """select -f yolo: `to_yolo` + `write_yolo` (class k + 1; no names, so classes as given)."""
    out = root / "out"
    try:
        files = to_yolo(det_rows(ids), None, "detection")
    except FileNameError as err:
        try:
            check_refusal(err, ids, label_file)
        except AssertionError:  # or two ids whose images' links clash in images/ ('a' and 'a/b')
            try:
                check_refusal(err, ids, image_link)
            except AssertionError:  # or one id's label file is another's image link
                def trainers_label(i):  # Ultralytics' rule on images/ID: the last /images/ -> /labels/
                    head, _, tail = ("/" + posixpath.splitext(image_link(i))[0] + ".txt").rpartition("/images/")
                    return (head + "/labels/" + tail)[1:]
                clash = [(i, j) for i in ids for j in ids if i != j and image_link(i) and image_link(j)
                         and folded(trainers_label(i)) == folded(image_link(j))]
                assert any(named(str(err), i) and named(str(err), j) for i, j in clash), (ids, str(err))
        event("refused")
        assert os.listdir(root) == []
        return
    event(f"written, {len(ids)} ids")
    write_yolo(files, str(out))
    assert all(label_file(i) for i in ids), f"wrote files for an id with no safe name: {ids!r}"
    labels = [out / label_file(i) for i in ids]
    assert distinct_case_folded(labels)
    for a in labels:  # no file doubles as another's folder
        assert not any(folded(str(b)).startswith(folded(str(a)) + os.sep) for b in labels)
    for k, (row_id, path) in enumerate(zip(ids, labels)):
        assert inside(out, path) and path.is_file(), (row_id, path)
        box = "0.250000 0.250000 0.500000 0.500000"  # [0, 0, 2, 2] of 4x4; [-5, -5, -1, -1] left out
        assert path.read_text(encoding="utf-8").splitlines() == [f"{k + 1} {box}"], (row_id, path)
    text = (out / "images.txt").read_bytes().decode("utf-8")
    lines = text.split("\n")
    assert lines[-1] == "" and lines[:-1] == ["./images/" + rel_path(i) for i in ids], (ids, text)
    assert text.splitlines() == lines[:-1]  # no other line break in a line
    assert not any(is_control(ch) for line in lines for ch in line), (ids, text)
    assert all_files(root) == set(labels) | {out / "images.txt", out / "data.yaml"}
    assert os.listdir(root) == ["out"]


def coco(ids: list[str], root: Path) -> None:
    """select -f coco: `to_coco`'s images (file_name) and their annotations (category k + 1)."""
    try:
        doc = to_coco(det_rows(ids), None, "detection")
    except FileNameError as err:
        check_refusal(err, ids, rel_path)
        event("refused")
        return
    event(f"written, {len(ids)} ids")
    out = root / "out"
    out.mkdir()
    (out / "batch.json").write_text(json.dumps(doc, ensure_ascii=False), encoding="utf-8")
    doc = json.loads((out / "batch.json").read_text(encoding="utf-8"))
    names = [image["file_name"] for image in doc["images"]]
    assert names == [rel_path(i) for i in ids], ids
    assert distinct_case_folded(names)
    for a in names:
        assert not any(folded(b).startswith(folded(a) + "/") for b in names), names
    for k, image in enumerate(doc["images"]):
        assert inside(out, out / image["file_name"])
        assert not any(is_control(ch) for ch in image["file_name"])
        anns = [a for a in doc["annotations"] if a["image_id"] == image["id"]]
        assert [(a["category_id"], a["bbox"]) for a in anns] == [(k + 1, [0, 0, 2, 2])], ids[k]
    assert all_files(root) == {out / "batch.json"}


WRITERS = {"score-masks": score_masks, "pull-masks": pull_masks, "yolo": yolo, "coco": coco}


@pytest.mark.parametrize("writer", list(WRITERS))
@settings(max_examples=60, deadline=None)
@given(ids=IDS)
@example(ids=["a.png", "a.jpg"])                      # R3-9, R3-3: one stem, two suffixes
@example(ids=["x.png", "x.jpg", "sub/a", "sub/a.png"])  # R3-3's own pair of pairs
@example(ids=["a.png", "A.PNG"])                      # case
@example(ids=["ß.png", "SS.png"])                     # case-folding that changes length
@example(ids=["\u212a.png", "k.png"])                 # the Kelvin sign folds to k
@example(ids=["a.txt", "a.txt/b.png"])                # a file and a folder of one name
@example(ids=["sub/images/x.png", "sub/labels/x.txt"])  # a label file where an image is linked
@example(ids=["a.png", "a/b.png", "sub\\c.png", "日本.jpg", "e\u0301.png", "é.png"])  # all fine
@example(ids=["x\ny.png"])                            # R3-15
@example(ids=["../x.png", "sub/../../y.png", "/abs.png", "", "."])
@example(ids=["ok.png", "../x.png"])                  # one id leaving the folder, alone
@example(ids=["a/../b.png", "b.png"])                 # .. inside the folder: one file
def test_each_id_gets_its_own_file_inside_the_folder(writer, ids):
    with tempfile.TemporaryDirectory() as tmp:
        WRITERS[writer](ids, Path(tmp))


@pytest.mark.parametrize("writer", ["score-masks", "pull-masks"])
def test_mask_names_never_refuse_and_keep_the_ids_apart(writer):
    """The masks' names (id_file) hold an id's hash, so any id has one of its own, even those YOLO
    and COCO refuse."""
    ids = ["../x.png", "/abs.png", "", ".", "x\ny.png", "a.png", "a.jpg", "a", "A.PNG", "a.txt",
           "a.txt/b.png", "ß", "SS", "ss", "\u212a", "k", "x" * 5000, "a\x00b", "con", "a:b"]
    with tempfile.TemporaryDirectory() as tmp:
        WRITERS[writer](ids, Path(tmp))


# ------------------------------------------------------------------------- the CLI regressions
DN = "background\ncat\ndog\n"


def det_table(path: Path, rows: list[tuple]) -> Path:
    """A scored detection table: (id, boxes, width, height) per row."""
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f, lineterminator="\n", quoting=csv.QUOTE_ALL)  # a bare \r is quoted too
        w.writerow(["rank", "id", "score", "boxes", "width", "height"])
        for n, (row_id, boxes, width, height) in enumerate(rows, 1):
            w.writerow([n, row_id, 10 - n, json.dumps(boxes), width, height])
    (path.parent / "dn.txt").write_text(DN)
    return path


def select(tmp_path: Path, table: Path, n: int, *args):
    return invoke_in(tmp_path, "select", table, "-n", n, "--no-diverse", "--class-names", "dn.txt",
                     *args)


def test_r3_9_two_ids_of_one_stem_are_refused_for_yolo_naming_both(tmp_path):
    table = det_table(tmp_path / "det.csv", [("a.png", [[1, 1, 5, 5, 1, 0.9]], 10, 10),
                                             ("a.jpg", [[2, 2, 8, 8, 2, 0.8]], 10, 10)])
    result = select(tmp_path, table, 2, "-f", "yolo", "-o", "yolo")
    assert_one_error(result, "'a.png'", "R3-9")
    assert "'a.jpg'" in result.stderr and "labels/a.txt" in result.stderr
    assert not (tmp_path / "yolo").exists()  # no label file, no images.txt, no data.yaml


def test_r3_15_an_id_holding_a_line_break_is_refused_for_yolo(tmp_path):
    for k, brk in enumerate(["\n", "\r", "\u2028"]):
        row_id = f"x{brk}y.png"
        table = det_table(tmp_path / f"nl{k}.csv", [(row_id, [[1, 1, 5, 5, 1, 0.9]], 10, 10)])
        result = select(tmp_path, table, 1, "-f", "yolo", "-o", f"y{k}")
        assert_one_error(result, repr(row_id), f"R3-15 {brk!r}")
        assert "line break" in result.stderr
        assert not (tmp_path / f"y{k}").exists()


def test_r3_19_a_box_wholly_outside_the_image_is_left_out_of_yolo_and_coco(tmp_path):
    table = det_table(tmp_path / "det.csv", [
        ("in.png", [[-5, -5, -1, -1, 1, 0.9], [2, 2, 8, 8, 2, 0.8], [12, 0, 15, 5, 1, 0.7],
                    [3, 3, 3, 9, 1, 0.6]], 10, 10),
        ("out.png", [[-5, -5, -1, -1, 1, 0.9]], 10, 10)])
    ok(select(tmp_path, table, 2, "-f", "yolo", "-o", "y"))
    assert (tmp_path / "y" / "labels" / "in.txt").read_text() == "1 0.500000 0.500000 0.600000 0.600000\n"
    assert (tmp_path / "y" / "labels" / "out.txt").read_text() == ""  # an image with no box left
    assert (tmp_path / "y" / "images.txt").read_text() == "./images/in.png\n./images/out.png\n"
    ok(select(tmp_path, table, 2, "-f", "coco", "-o", "c.json"))
    doc = json.loads((tmp_path / "c.json").read_text())
    assert [i["file_name"] for i in doc["images"]] == ["in.png", "out.png"]
    [ann] = doc["annotations"]
    assert ann["image_id"] == 1 and ann["category_id"] == 2
    assert ann["bbox"] == [2, 2, 6, 6] and ann["area"] == 36


# ------------------------------------------------- two gaps a first version of the door had
def test_lone_surrogate_ids_are_refused_or_written_whole(tmp_path):
    """A folder pool's file name that is not UTF-8 (byte 0xff) reaches the table as '\\udcff'."""
    (tmp_path / "dn.txt").write_text(DN)
    (tmp_path / "det.csv").write_bytes(b'rank,id,score,boxes,width,height\n'
                                       b'1,a\xff.png,9,"[[1,1,5,5,1,0.9]]",10,10\n')
    result = select(tmp_path, tmp_path / "det.csv", 1, "-f", "yolo", "-o", "y")
    if result.exit_code == 0:
        assert (tmp_path / "y" / "images.txt").read_bytes() == b"./images/a\xff.png\n"
        assert os.listdir(os.fsencode(tmp_path / "y" / "labels")) == [b"a\xff.txt"]
    else:
        assert_one_error(result, ".png", "surrogate")  # the id, however it is spelled
        assert "codec" not in result.stderr and not (tmp_path / "y").exists()


def test_c1_control_ids_are_refused_for_yolo(tmp_path):
    row_id = "a\x9b31mb.png"
    with pytest.raises(FileNameError, match="control"):
        to_yolo(det_rows([row_id]), None, "detection")
