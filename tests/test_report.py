"""`alcli report`: one round as one self-contained HTML page. Small rounds built here (8x8 to
40x30 PNGs, hand-made tables, an embeddings file, labels): the rounds table against sklearn's
kappa, numpy's quantiles and a hand count of changed predictions; the PCA against sklearn's;
the thumbnails decoded (downscaled, the predicted box drawn where the box is); ids, class names
and labels holding markup escaped; bad input as one sentence. Then a real headless Chromium
(Debian's, driven by Playwright) opens a classification, a detection and a text round: no console
error, every image loaded, a screenshot that is not blank, an id holding <script> shown as text.
"""
from __future__ import annotations

import base64
import io
import json
import os
import re
import shutil
import sys

import numpy as np
import pytest
from PIL import Image, ImageFilter
from sklearn.decomposition import PCA
from sklearn.metrics import cohen_kappa_score
from typer.testing import CliRunner

from alcli import report as round_page
from alcli.cli import app
from alcli.files.embeddings import save_embeddings
from shell import invoke_in  # noqa: E402

EVIL_ID = "<script>alert(1)</script>.png"
EVIL_CLASS = '<img src=x onerror="alert(2)">'
CLASSES = ["cat", "dog $\\frac{$", EVIL_CLASS]  # "$...$" would be math to matplotlib


run = invoke_in  # alcli ARGS in this process, in cwd


def write_csv(path, rows, columns):
    import csv
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, columns, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)


def picture(path, size, seed):
    rng = np.random.default_rng(seed)
    Image.fromarray(rng.integers(0, 256, (*size[::-1], 3), dtype=np.uint8), "RGB").save(path)


def classification_round(root, n=30):
    """n 8x8 PNGs (one id holding <script>, each row's picture named in the path column), this round's and the previous round's tables (a few
    predictions changed, two ids in one table only), a batch of 6, labels, an embeddings file."""
    rng = np.random.default_rng(0)
    ids = [f"img{i:02d}.png" for i in range(n - 1)] + [EVIL_ID]
    files = [f"img{i:02d}.png" for i in range(n)]  # the pictures, named in the path column
    for k, name in enumerate(files):
        picture(root / name, (8, 8), k)
    preds = rng.choice(CLASSES, n).tolist()
    old = list(preds)
    for k in (1, 4, 7, 11):
        old[k] = CLASSES[(CLASSES.index(old[k]) + 1) % 3]
    scores = rng.random(n)
    order = np.argsort(-scores)
    rows = [{"rank": r + 1, "id": ids[k], "score": scores[k], "pred": preds[k],
             "confidence": 0.5, "path": files[k]} for r, k in enumerate(order)]
    write_csv(root / "r2.csv", rows, ["rank", "id", "score", "pred", "confidence", "path"])
    old_rows = [{"id": ids[k], "score": rng.random(), "pred": old[k]} for k in range(2, n)]
    write_csv(root / "r1.csv", old_rows, ["id", "score", "pred"])
    batch = rows[:5] + [rows[20]]  # one past the top 6: picked for diversity
    if not any(r["id"] == EVIL_ID for r in batch):
        batch[-1] = next(r for r in rows if r["id"] == EVIL_ID)
    write_csv(root / "batch.csv", batch, ["rank", "id", "score", "pred", "confidence", "path"])
    write_csv(root / "labels.csv", [{"id": ids[k], "label": preds[k]} for k in range(8)],
              ["id", "label"])
    b = rng.normal(size=(n, 5)) * [5, 3, 1, 0.5, 0.1]
    save_embeddings(str(root / "r2.csv.emb.npz"), ids, np.ones((n, 3)), b)
    return {"ids": ids, "preds": preds, "old": old, "scores": scores, "rows": rows,
            "batch": batch, "b": b}


def detection_round(root):
    """Four 40x30 grey images, each row with one predicted box [x0, y0, x1, y1, class, score]."""
    rows = []
    for k in range(4):
        Image.new("RGB", (40, 30), (128, 128, 128)).save(root / f"d{k}.png")
        box = [4.0 + k, 5.0, 30.0, 24.0, k % 2, 0.9]
        rows.append({"rank": k + 1, "id": f"d{k}.png", "score": 1.0 - k / 10, "pred": "cat",
                     "confidence": 0.9, "boxes": json.dumps([box]), "width": 40, "height": 30})
    write_csv(root / "det.csv", rows, list(rows[0]))
    return rows


def masks_round(root):
    """Two 20x10 white images: one with an instance mask (COCO run-length code, column-major,
    the left half set), one with a segmentation pred_mask PNG (class 2 on the top half)."""
    for k in range(2):
        Image.new("RGB", (20, 10), (255, 255, 255)).save(root / f"m{k}.png")
    left = np.zeros((10, 20), bool)
    left[:, :10] = True
    counts = [0, 100, 100]  # column-major: the first 10 columns (100 pixels) set, then 100 unset
    top = np.zeros((10, 20), np.uint8)
    top[:5] = 2
    Image.fromarray(top).save(root / "m1_pred.png")
    rows = [{"rank": 1, "id": "m0.png", "score": 0.9, "pred": "cat",
             "boxes": json.dumps([[0, 0, 10, 10, 1, 0.9]]), "width": 20, "height": 10,
             "masks": json.dumps([{"size": [10, 20], "counts": counts}])},
            {"rank": 2, "id": "m1.png", "score": 0.5, "pred": "dog", "pred_mask": "m1_pred.png"}]
    write_csv(root / "masks.csv", rows, ["rank", "id", "score", "pred", "boxes", "width",
                                         "height", "masks", "pred_mask"])
    return left, top == 2


def text_round(root):
    rows = [{"rank": k + 1, "id": f"t{k}" if k else EVIL_ID, "score": 1.0 - k / 10,
             "pred": "dog", "text": f"text number {k} <b>not bold</b> & more"} for k in range(5)]
    write_csv(root / "text.csv", rows, list(rows[0]))
    return rows


@pytest.fixture(scope="module")
def rounds(tmp_path_factory):
    root = tmp_path_factory.mktemp("report")
    made = {"cls": classification_round(root), "det": detection_round(root),
            "text": text_round(root)}
    return root, made


def write_report(root, *args):
    result = run(root, "report", *args, "-q")
    assert result.exit_code == 0, result.stderr + result.stdout
    return result


def cells(page: str, round_no: int) -> list[str]:
    """The cells of the rounds table's row for round `round_no` (html-unescaped)."""
    import html
    table = page[page.index("<h2>Across rounds</h2>"):]
    for row in re.findall(r"<tr>(.*?)</tr>", table):
        found = [html.unescape(c) for c in re.findall(r"<td>(.*?)</td>", row)]
        if found and found[0] == str(round_no):
            return found
    raise AssertionError(f"no row for round {round_no}")


def test_the_rounds_table_against_sklearn_and_numpy(rounds):
    root, made = rounds
    write_report(root, "r2.csv", "--batch", "batch.csv", "--previous", "r1.csv",
                 "--labels", "labels.csv", "-o", "cls.html")
    page = (root / "cls.html").read_text()
    m = made["cls"]
    common = m["ids"][2:]  # the ids both tables scored
    old = dict(zip(m["ids"], m["old"]))
    new = dict(zip(m["ids"], m["preds"]))
    a, b = [old[i] for i in common], [new[i] for i in common]
    row = cells(page, 1)  # round, table, rows, compared, changed, kappa, mean, stop, q10, q50, q90
    assert row[1] == "r2.csv" and row[2] == str(len(m["ids"])) and row[3] == str(len(common))
    assert int(row[4]) == sum(x != y for x, y in zip(a, b)) == 3  # index 1 is in r2 only
    assert float(row[5]) == pytest.approx(cohen_kappa_score(a, b), abs=5e-4)
    assert [float(v) for v in row[8:11]] == pytest.approx(
        np.quantile(m["scores"], [0.1, 0.5, 0.9]), rel=5e-4)
    assert "go on: " in page  # one kappa over a few ids: no mean of 3


def test_the_gallery_holds_the_batch_escaped_and_downscaled(rounds):
    root, made = rounds
    write_report(root, "r2.csv", "--batch", "batch.csv", "--labels", "labels.csv", "-o",
                 "g.html")
    page = (root / "g.html").read_text()
    assert "<script" not in page.lower() and "<img src=x" not in page  # no markup from the files
    assert "&lt;script&gt;alert(1)&lt;/script&gt;.png" in page
    uris = re.findall(r'<img src="data:image/jpeg;base64,([^"]+)"', page)
    assert len(uris) == len(made["cls"]["batch"])
    for uri in uris:  # 8x8 pictures come out enlarged to the thumbnail, whole
        assert Image.open(io.BytesIO(base64.b64decode(uri))).size == (round_page.THUMB,) * 2
    past = [r for r in made["cls"]["batch"] if r["rank"] > len(made["cls"]["batch"])]
    assert page.count("past the top 6") == len(past) >= 1
    assert "http" not in re.sub(r'xmlns(:\w+)?="http[^"]+"', "", page)  # nothing fetched
    assert not re.findall(r'(?:src|href)="(?!data:|#)', page)
    assert f"Labels so far: 8" in page


def test_pca_is_sklearns_up_to_sign(rounds):
    b = rounds[1]["cls"]["b"]
    mine, theirs = round_page.pca_2d(b), PCA(2).fit_transform(b)
    for k in range(2):
        sign = np.sign(mine[:, k] @ theirs[:, k])
        np.testing.assert_allclose(sign * mine[:, k], theirs[:, k], atol=1e-9)


def test_a_detection_rows_box_is_drawn_where_the_box_is(rounds):
    root, made = rounds
    write_report(root, "det.csv", "--batch", "det.csv", "-o", "det.html")
    page = (root / "det.html").read_text()
    uris = re.findall(r'<img src="data:image/jpeg;base64,([^"]+)"', page)
    assert len(uris) == 4
    for uri, row in zip(uris, made["det"]):
        pic = np.asarray(Image.open(io.BytesIO(base64.b64decode(uri))).convert("RGB"), float)
        assert pic.shape[1] == round_page.THUMB  # 40 wide -> 128
        scale = round_page.THUMB / 40
        x0, y0, x1, y1 = (v * scale for v in json.loads(row["boxes"])[0][:4])
        grey = np.abs(pic - 128).sum(2)
        left_edge = grey[int(y0 + 5):int(y1 - 5), int(round(x0))]
        inside = grey[int(y0 + 5):int(y1 - 5), int((x0 + x1) / 2)]
        assert left_edge.mean() > 100 and inside.mean() < 15  # coloured edge, untouched inside
    # a detector's rows never have embeddings: the map says why, not to score --embeddings
    assert "no embeddings to map: a detector&#x27;s rows have no BADGE embeddings" in page


def test_masks_are_painted_where_they_are(tmp_path):
    left, top = masks_round(tmp_path)
    assert (round_page.rle_mask({"size": [10, 20], "counts": [0, 100, 100]}) == left).all()
    write_report(tmp_path, "masks.csv", "--batch", "masks.csv", "-o", "m.html")
    page = (tmp_path / "m.html").read_text()
    uris = re.findall(r'<img src="data:image/jpeg;base64,([^"]+)"', page)
    assert len(uris) == 2
    for uri, mask in zip(uris, (left, top)):
        pic = np.asarray(Image.open(io.BytesIO(base64.b64decode(uri))).convert("RGB"), float)
        big = np.asarray(Image.fromarray(mask.astype(np.uint8) * 255).resize(
            pic.shape[1::-1], Image.Resampling.NEAREST)) > 0
        inner = np.asarray(Image.fromarray(big.astype(np.uint8)).filter(
            ImageFilter.MinFilter(9))) > 0  # away from the edge
        outer = ~(np.asarray(Image.fromarray(big.astype(np.uint8)).filter(
            ImageFilter.MaxFilter(9))) > 0)
        whiteness = pic.min(2)
        assert whiteness[inner].mean() < 200 and whiteness[outer].mean() > 240


def test_predicted_spans_are_highlighted(tmp_path):
    rows = [{"id": "s1", "score": 1.0, "pred": "LOC", "text": "Ann lives in New York now",
             "pred_words": json.dumps(["B-PER", "O", "O", "B-LOC", "I-LOC", "O"])},
            {"id": "s2", "score": 0.5, "pred": "x", "text": "a <b> c",
             "pred_words": json.dumps(["O", "<script>", "O"])}]
    write_csv(tmp_path / "tok.csv", rows, ["id", "score", "pred", "text", "pred_words"])
    write_report(tmp_path, "tok.csv", "-o", "tok.html")
    page = (tmp_path / "tok.html").read_text()
    assert ('<p class="text"><mark title="PER">Ann</mark> lives in '
            '<mark title="LOC">New York</mark> now</p>') in page
    assert '<p class="text">a <mark title="&lt;script&gt;">&lt;b&gt;</mark> c</p>' in page


def test_a_text_round_shows_its_texts_escaped(rounds):
    root, _ = rounds
    write_report(root, "text.csv", "-o", "text.html")
    page = (root / "text.html").read_text()
    assert "<img" not in page and "<b>not bold</b>" not in page
    assert page.count("&lt;b&gt;not bold&lt;/b&gt; &amp; more") == 5


def test_a_table_from_stdin_makes_round_html(rounds):
    root, _ = rounds
    old = os.getcwd()
    os.chdir(root)
    try:
        result = CliRunner().invoke(app, ["report", "-", "-q"],
                                    input=(root / "text.csv").read_text())
    finally:
        os.chdir(old)
    assert result.exit_code == 0, result.stderr
    assert "text number 3" in (root / "round.html").read_text()


@pytest.mark.parametrize("args, needle", [
    (["r2.csv", "-o", "r2.csv"], "choose another"),
    (["r2.csv", "--batch", "batch.csv", "-o", "batch.csv"], "choose another"),
    (["r2.csv", "-o", "x.html", "--labels", "r1.csv"], "no id and label columns"),
    (["r2.csv", "-o", "x.html", "--previous", "missing.csv"], "missing.csv"),
    (["r2.csv", "-o", "x.html", "--kappa", "1.5"], "--kappa 1.5"),
])
def test_bad_input_is_one_sentence(rounds, args, needle):
    root, _ = rounds
    before = (root / "r2.csv").read_bytes()
    result = run(root, "report", *args)
    assert result.exit_code == 1, result.stderr + result.stdout
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("alcli: error:") and needle in lines[0]
    assert (root / "r2.csv").read_bytes() == before and not (root / "x.html").exists()


def test_without_matplotlib_it_names_the_extra(rounds, monkeypatch):
    root, _ = rounds
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` raises ImportError
    monkeypatch.setitem(sys.modules, "matplotlib.pyplot", None)
    result = run(root, "report", "text.csv", "-o", "nompl.html")
    assert result.exit_code == 1 and "alcli[report]" in result.stderr
    assert not (root / "nompl.html").exists()


# --- a real browser --------------------------------------------------------------------------------

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def browser_or_skip():
    """Chromium and Playwright, or a skip: only outside CI (in CI, .ci/run installs both)."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        sync_playwright = None
    if CHROMIUM and sync_playwright:
        return sync_playwright
    why = "chromium (apt-get install chromium)" if not CHROMIUM else "playwright (pip install playwright)"
    if os.environ.get("CI"):
        pytest.fail(f"{why} is missing in CI: .ci/run installs it")
    pytest.skip(f"{why} is not installed here")


def test_reports_open_in_a_headless_chromium(rounds):
    sync_playwright = browser_or_skip()
    root, made = rounds
    write_report(root, "r2.csv", "--batch", "batch.csv", "--previous", "r1.csv", "--labels",
                 "labels.csv", "-o", "b-cls.html")
    write_report(root, "det.csv", "--batch", "det.csv", "-o", "b-det.html")
    write_report(root, "text.csv", "-o", "b-text.html")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            for name, images in (("b-cls.html", 6), ("b-det.html", 4), ("b-text.html", 0)):
                page = browser.new_page(viewport={"width": 1000, "height": 800})
                errors, dialogs = [], []
                page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
                page.on("pageerror", lambda e: errors.append(str(e)))
                page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
                page.goto((root / name).as_uri())
                page.wait_for_load_state("load")
                widths = page.evaluate("Array.from(document.images).map(i => i.complete ? "
                                       "i.naturalWidth : 0)")
                assert len(widths) == images and all(w > 0 for w in widths), (name, widths)
                assert page.evaluate("document.querySelectorAll('svg').length") >= 1, name
                assert not errors and not dialogs, (name, errors, dialogs)
                if name != "b-det.html":  # the id holding <script> is shown as text
                    ids = page.evaluate("Array.from(document.querySelectorAll('.id'))"
                                        ".map(e => e.textContent)")
                    assert EVIL_ID in ids, (name, ids)
                    assert page.evaluate("document.scripts.length") == 0
                shot = np.asarray(Image.open(io.BytesIO(page.screenshot())).convert("L"), float)
                assert shot.std() > 10, name  # not a blank page
                page.close()
        finally:
            browser.close()
