"""Round 4 of the hostile-input review (docs/hostile-inputs-4.md): embeddings files whose headers
claim more than they hold, that inflate, or hold NaN or text; videos of decompression-bomb size."""
from __future__ import annotations

import io
import zipfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from typer.testing import CliRunner

from alcli.cli import app
from alcli.files.embeddings import (EmbeddingsError, embeddings_run_id, load_embeddings,
                                    open_features, save_embeddings)
from alcli.pools import open_pool
from alcli.pools.common import PoolOptions

runner = CliRunner()
N, C, D = 12, 3, 4


def table(folder: Path) -> Path:
    """A ranked table of N rows (no model needed) and its embeddings file, both honest."""
    rng = np.random.default_rng(0)
    ids = [f"x{i}" for i in range(N)]
    path = folder / "t.csv"
    path.write_text("rank,id,score,pred,confidence\n" + "".join(
        f"{k + 1},{i},{N - k}.5,{k % C},0.5\n" for k, i in enumerate(ids)))
    save_embeddings(str(path) + ".emb.npz", ids, rng.normal(size=(N, C)), rng.normal(size=(N, D)))
    return path


def rewrite(npz: Path, compress: bool = False, **members) -> None:
    """The embeddings file again, with `members` (name -> array, or raw .npy bytes) replaced."""
    arrays = dict(np.load(npz))
    with zipfile.ZipFile(npz, "w", zipfile.ZIP_DEFLATED if compress else zipfile.ZIP_STORED) as zf:
        for name, value in {**arrays, **members}.items():
            if not isinstance(value, bytes):
                buf = io.BytesIO()
                np.save(buf, value)
                value = buf.getvalue()
            zf.writestr(name + ".npy", value)


def claims(shape, tail: bytes = b"\0" * 64) -> bytes:
    """A .npy member whose header claims `shape` float64 and whose data is `tail`."""
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": "<f8", "fortran_order": False,
                                               "shape": shape})
    return buf.getvalue() + tail


def readers(npz: Path):
    return [lambda: load_embeddings(str(npz)), lambda: open_features(str(npz)),
            lambda: embeddings_run_id(str(npz))]


@pytest.mark.parametrize("compress", [False, True])
def test_a_header_claiming_a_huge_shape_is_one_sentence_before_any_allocation(tmp_path, compress):
    npz = Path(str(table(tmp_path)) + ".emb.npz")
    rewrite(npz, compress, a=claims((10 ** 7, 10 ** 7)))  # 728 TiB claimed by a 200-byte member
    for read in readers(npz):
        with pytest.raises(EmbeddingsError, match=r"a\.npy claims shape \(10000000, 10000000\)"):
            read()


def test_a_member_that_inflates_a_thousandfold_is_refused_an_honest_compressed_one_read(tmp_path):
    npz = Path(str(table(tmp_path)) + ".emb.npz")
    honest = load_embeddings(str(npz))
    rewrite(npz, compress=True)  # random floats: deflate saves little, the file still reads
    again = load_embeddings(str(npz))
    assert again[0] == honest[0] and np.array_equal(again[2].numpy(), honest[2].numpy())
    rewrite(npz, compress=True, b=np.zeros((N, 200_000)))  # 19 MB of zeros in about 20 KB
    assert npz.stat().st_size < 100_000
    for read in readers(npz):
        with pytest.raises(EmbeddingsError, match="b.npy inflates from .* more than 64 times"):
            read()


@pytest.mark.parametrize("member,value,says", [
    ("b", "nan", "b row 5 holds NaN or infinity"),
    ("b", "inf", "b row 5 holds NaN or infinity"),
    ("a", "nan", "a row 5 holds NaN or infinity"),
    ("a", "text", "a holds <U"),
])
def test_features_that_are_not_finite_floats_are_one_sentence(tmp_path, member, value, says):
    npz = Path(str(table(tmp_path)) + ".emb.npz")
    arrays = dict(np.load(npz))
    x = arrays[member].astype(str) if value == "text" else arrays[member].copy()
    if value != "text":
        x[5, 1] = float(value)
    rewrite(npz, **{member: x})
    with pytest.raises(EmbeddingsError, match=says):
        load_embeddings(str(npz))
    if member == "b":
        with pytest.raises(EmbeddingsError, match=says):
            open_features(str(npz))


def test_select_diverse_on_nan_features_exits_1_and_writes_no_batch(tmp_path):
    """Before: rc 0 and a batch chosen by k-means++ over NaN distances (and dedup calling every
    row a near-duplicate of every other)."""
    path = table(tmp_path)
    npz = Path(str(path) + ".emb.npz")
    b = dict(np.load(npz))["b"]
    b[:] = np.nan
    rewrite(npz, b=b)
    out = tmp_path / "batch.csv"
    result = runner.invoke(app, ["select", str(path), "-n", "4", "--diverse", "-o", str(out),
                                 "-q"])
    assert result.exit_code == 1, result.output
    assert "NaN or infinity" in result.stderr and str(npz) in result.stderr
    assert "Traceback" not in result.stderr and not out.exists()


def test_a_video_of_bomb_sized_frames_is_an_error_row_not_decoded(tmp_path, monkeypatch):
    av = pytest.importorskip("av")
    clip = tmp_path / "c.mp4"
    with av.open(str(clip), "w") as out:  # two 32 x 32 frames
        stream = out.add_stream("mpeg4", rate=10)
        stream.width = stream.height = 32
        stream.pix_fmt = "yuv420p"
        for k in range(2):
            frame = av.VideoFrame.from_ndarray(np.full((32, 32, 3), 40 * k, np.uint8), "rgb24")
            for packet in stream.encode(frame):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)
    assert len(open_pool(str(clip), PoolOptions())) == 2
    # PIL's limit lowered so that 32 x 32 = 1024 pixels is past twice it, as 14000 x 14000 is
    # past twice the default (a 140 KB clip claims such frames)
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 500)
    pool = open_pool(str(clip), PoolOptions())
    assert len(pool) == 1
    item = pool[0]
    assert item.input is None and "frames of 32 x 32 pixels, more than 1000" in item.error


DEEP = "[" * 20000 + "]" * 20000  # json's decoder recurses once per level: RecursionError


def test_deeply_nested_cells_are_not_drawn_in_the_report(tmp_path):
    """A `masks` or `pred_words` cell nested 20000 deep: the page is written (the text shown
    plain, the picture without masks) instead of a RecursionError traceback."""
    pytest.importorskip("matplotlib")
    picture = tmp_path / "p.png"
    Image.new("RGB", (8, 8), "white").save(picture)
    images = tmp_path / "images.csv"
    images.write_text(f"rank,id,score,pred,masks\n1,{picture},2.0,1,{DEEP}\n2,q,1.0,0,\n")
    texts = tmp_path / "texts.csv"
    texts.write_text(f"rank,id,score,pred,text,pred_words\n1,a,1.0,x,<b>hi</b> there,{DEEP}\n")
    for t in (images, texts):
        out = tmp_path / (t.stem + ".html")
        result = runner.invoke(app, ["report", str(t), "-o", str(out), "-q"])
        assert result.exit_code == 0, result.output
        assert "Traceback" not in result.stderr
    page = (tmp_path / "texts.html").read_text()
    assert "&lt;b&gt;hi&lt;/b&gt; there" in page and "<b>hi" not in page
    assert page.count("data:image/jpeg;base64,") == 0
    assert (tmp_path / "images.html").read_text().count("data:image/jpeg;base64,") == 1


def test_select_cost_boxes_on_a_deeply_nested_cell_is_one_sentence(tmp_path):
    t = tmp_path / "t.csv"
    t.write_text(f"rank,id,score,pred,boxes\n1,a,1.0,x,{DEEP}\n2,b,0.5,x,[]\n")
    out = tmp_path / "b.csv"
    result = runner.invoke(app, ["select", str(t), "--cost", "boxes", "-n", "1", "--no-diverse",
                                 "--no-dedup", "-o", str(out), "-q"])
    assert result.exit_code == 1 and not out.exists()
    assert "row 'a' has no JSON list in its 'boxes' column" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_target_row_with_a_nan_input_is_one_sentence_not_every_score_nan():
    """Before: ḡ was NaN (norm NaN passes the `norm == 0` check), so every pool row scored NaN,
    ranked in file order, rc 0."""
    import torch
    from torch import nn

    from alcli.errors import ConfigError
    from alcli.files.config import Settings
    from alcli.pools.tensors import tensor_pool
    from alcli.score.target import target_for
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 5), nn.Tanh(), nn.Linear(5, 3)).double()
    xt, yt = torch.randn(5, 4, dtype=torch.float64), torch.tensor([0, 1, 2, 0, 1])
    settings = Settings(strategy="align", target="t.pt", batch_size=2, task="classification")
    ok = target_for(settings, model, torch.device("cpu"), lambda s: tensor_pool(xt, yt))
    assert np.isfinite(ok.norm) and ok.norm > 0
    xt[3, 2] = float("nan")  # row '3', in the second batch
    with pytest.raises(ConfigError, match="target t.pt: the row '3' has a loss that is not finite"):
        target_for(settings, model, torch.device("cpu"), lambda s: tensor_pool(xt, yt))


def test_a_missing_target_does_not_name_the_configs_pool_key(in_ws, tmp_path):
    """Before: "pool nope.pt (key 'pool' in CONFIG) does not exist", naming the wrong setting."""
    config = tmp_path / "config.yaml"
    config.write_text(in_ws.config.read_text() + f"\npool: {in_ws.pool}\n")
    result = runner.invoke(app, ["score", "-c", str(config), "-m", "model.pt", "-q",
                                 "-s", "align", "--target", "nope.pt", "-o", "o.csv"])
    assert result.exit_code == 1 and "nope.pt does not exist" in result.stderr
    assert "key 'pool'" not in result.stderr and "Traceback" not in result.stderr


def test_the_report_never_replaces_a_picture_it_shows(tmp_path):
    """Before: `report t.csv -o PICTURE` wrote the page over the gallery's own picture, rc 0."""
    pytest.importorskip("matplotlib")
    picture, mask = tmp_path / "p.png", tmp_path / "m.png"
    Image.new("RGB", (8, 8), "white").save(picture)
    Image.new("L", (8, 8), 1).save(mask)
    t = tmp_path / "t.csv"
    t.write_text(f"rank,id,score,pred,path,pred_mask\n1,a,2.0,1,{picture},m.png\n")
    before = picture.read_bytes(), mask.read_bytes()
    for out in (picture, mask):
        result = runner.invoke(app, ["report", str(t), "-o", str(out), "-q"])
        assert result.exit_code == 1 and "a picture the page shows" in result.stderr
    assert (picture.read_bytes(), mask.read_bytes()) == before
    ok = runner.invoke(app, ["report", str(t), "-o", str(tmp_path / "r.html"), "-q"])
    assert ok.exit_code == 0 and (tmp_path / "r.html").exists()


def test_a_hostile_file_among_the_stdout_embeddings_is_passed_over(tmp_path):
    """select on a table from a pipe looks through ./.alcli/*.emb.npz; a newer file whose
    `scores` header claims [10^7, 10^7] raised MemoryError; now it is skipped."""
    import os

    from alcli.files.embeddings import find_for_rows
    rng = np.random.default_rng(1)
    ids, scores = ["a", "b"], [2.5, 1.5]
    good, bad = tmp_path / "stdout-1.emb.npz", tmp_path / "stdout-2.emb.npz"
    for path in (good, bad):
        save_embeddings(str(path), ids, rng.normal(size=(2, C)), rng.normal(size=(2, D)),
                        scores=scores)
    rewrite(bad, compress=True, scores=claims((10 ** 7, 10 ** 7)))
    os.utime(good, (1, 1))  # the hostile one is the newest, looked at first
    rows = [{"id": i, "score": s} for i, s in zip(ids, scores)]
    assert find_for_rows(tmp_path, rows) == str(good)


def test_a_row_naming_a_file_past_the_cell_cap_is_refused_before_it_is_read(tmp_path):
    """R4-10: open_source (the report's and the contact sheet's pictures, a hand-off's frames)
    read a row's file whole; a sparse file past the tables' cell cap is refused from its size."""
    from alcli.pools import open_source
    from alcli.pools.tables import MAX_CELL_BYTES
    big = tmp_path / "big.png"
    with open(big, "wb") as f:
        f.truncate(MAX_CELL_BYTES + 1)  # sparse: nothing on disk, nothing to read
    with pytest.raises(ValueError, match="larger than 256 MiB"):
        open_source(str(big))
    small = tmp_path / "small.png"
    Image.new("RGB", (3, 2)).save(small)
    assert Image.open(open_source(str(small))).size == (3, 2)


def test_with_an_image_dir_no_picture_from_outside_it_reaches_the_page_or_the_sheet(tmp_path):
    """R4-12: with --image-dir the report and the contact sheet showed an absolute id's picture,
    one climbing out with `..` and one through a link; now only pictures under the folder."""
    pytest.importorskip("matplotlib")
    from alcli.selection.export import contact_sheet
    pool, private = tmp_path / "pool", tmp_path / "private"
    pool.mkdir()
    private.mkdir()
    Image.new("RGB", (8, 8), "white").save(pool / "ok.png")
    Image.new("RGB", (8, 8), "red").save(private / "secret.png")
    (pool / "link.png").symlink_to(private / "secret.png")
    ids = ["ok.png", str(private / "secret.png"), "../private/secret.png", "link.png"]
    t = tmp_path / "t.csv"
    t.write_text("rank,id,score,pred\n" + "".join(f"{k + 1},{i},{4 - k}.0,1\n" for k, i in enumerate(ids)))
    out = tmp_path / "r.html"
    result = runner.invoke(app, ["report", str(t), "--image-dir", str(pool), "-o", str(out), "-q"])
    assert result.exit_code == 0, result.output
    page = out.read_text()
    assert page.count("data:image/jpeg;base64,") == 1 and page.count('class="missing"') == 3
    rows = [{"id": i, "score": 1.0} for i in ids]
    assert contact_sheet(rows, str(pool), str(tmp_path / "s.png")) == ids[1:]
    assert contact_sheet(rows[:1], None, str(tmp_path / "s2.png"), paths=[str(pool / "ok.png")]) == []


def _resizing_video(path):
    """An .mkv whose header says 32 x 32 and whose last two frames are 64 x 64 (mpeg4 packets
    carry their own size, so the decoder follows the change)."""
    av = pytest.importorskip("av")
    parts = []
    for size in (32, 64):
        part = path.parent / f"{size}.m4v"
        with av.open(str(part), "w", format="m4v") as out:
            stream = out.add_stream("mpeg4", rate=10)
            stream.width = stream.height = size
            stream.pix_fmt = "yuv420p"
            for k in range(2):
                frame = av.VideoFrame.from_ndarray(np.full((size, size, 3), 60 * k, np.uint8), "rgb24")
                for packet in stream.encode(frame):
                    out.mux(packet)
            for packet in stream.encode():
                out.mux(packet)
        parts.append(part)
    with av.open(str(parts[0])) as first, av.open(str(path), "w") as out:
        stream = out.add_stream_from_template(first.streams.video[0])
        stream.time_base = first.streams.video[0].time_base
        pts = 0
        for part in parts:
            with av.open(str(part)) as src:
                for packet in src.demux(src.streams.video[0]):
                    if packet.size:
                        packet.stream, packet.pts, packet.dts = stream, pts * 100, pts * 100
                        packet.time_base = stream.time_base
                        out.mux(packet)
                        pts += 1


def test_frames_grown_past_the_limit_after_the_header_are_error_rows(tmp_path, monkeypatch):
    """R4-13: the size check read the stream's header only; a stream that grows its frames
    mid-stream had them converted to RGB unchecked."""
    clip = tmp_path / "grows.mkv"
    _resizing_video(clip)
    assert [item.error for item in open_pool(str(clip), PoolOptions())] == [None] * 4
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)  # 32 x 32 passes twice it, 64 x 64 does not
    items = list(open_pool(str(clip), PoolOptions()))
    assert [item.error is None for item in items] == [True, True, False, False]
    assert "frames of 64 x 64 pixels, more than 2000" in items[2].error
    from alcli.pools.video import read_frame
    with pytest.raises(ValueError, match="64 x 64"):
        read_frame(str(clip), "t=0.300")
    assert Image.open(io.BytesIO(read_frame(str(clip), "t=0.100"))).size == (32, 32)
