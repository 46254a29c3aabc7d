"""Video pools (alcli/pools/video.py): clips the tests write with PyAV, their frames decoded here
independently (PyAV, every frame, in order) and scored by a float64 per-example loop; ids, the
sampling (--every, --fps), a kill -9 and --resume, shards merged, the contact sheet and -f paths."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from typer.testing import CliRunner

from alcli.cli import app
from alcli.files.names import id_file
from alcli.pools import open_pool, open_source
from alcli.pools.common import PoolOptions
from conftest import MEAN, STD, oracle_grad_norm, parse_csv
from interrupted import kill_when_saved, start_score

av = pytest.importorskip("av")
runner = CliRunner()
SIDE = 32  # frames are SIDE x SIDE, resized to the TinyNet's 6 x 6 (--resize 6)


def write_clip(path: Path, frames: int, fps: int = 10, codec: str = "libx264", seed: int = 0):
    """A clip of `frames` random-ish RGB frames (smooth, so the codec keeps them apart)."""
    rng = np.random.default_rng(seed)
    with av.open(str(path), "w") as out:
        stream = out.add_stream(codec, rate=fps)
        stream.width = stream.height = SIDE
        stream.pix_fmt = "yuv420p"
        for _ in range(frames):
            block = rng.integers(0, 256, (4, 4, 3), dtype=np.uint8)
            rgb = np.asarray(Image.fromarray(block).resize((SIDE, SIDE), Image.NEAREST))
            for packet in stream.encode(av.VideoFrame.from_ndarray(rgb, format="rgb24")):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)


def decoded(path: Path) -> list[tuple[float, np.ndarray]]:
    """Every frame of the clip, (time in seconds, RGB [H, W, 3]), decoded here in order."""
    with av.open(str(path)) as c:
        return [(float(f.time), f.to_ndarray(format="rgb24")) for f in c.decode(c.streams.video[0])]


def model_input(rgb: np.ndarray) -> torch.Tensor:
    """The TinyNet's input for a frame, without alcli: PIL's bilinear resize, [3, 6, 6] float64."""
    small = np.asarray(Image.fromarray(rgb).resize((6, 6), Image.BILINEAR), dtype=np.float64)
    return (torch.from_numpy(small / 255.0).permute(2, 0, 1) - MEAN) / STD


@pytest.fixture(scope="module")
def clips(tmp_path_factory):
    root = tmp_path_factory.mktemp("videos")
    folder = root / "videos"
    (folder / "more").mkdir(parents=True)
    write_clip(folder / "a.mp4", 20)                                 # 2 s at 10 fps
    write_clip(folder / "more" / "b.mkv", 8, codec="mpeg4", seed=1)  # 0.8 s
    (folder / "notes.txt").write_text("not a video\n")
    return folder


def score(ws, *args, ok=True):
    result = runner.invoke(app, ["score", *map(str, args), "-c", str(ws.config), "-q",
                                 "--resize", "6", "-m", "model.pt"])
    if ok:
        assert result.exit_code == 0, result.stderr + result.stdout
    return result


def test_ids_name_each_sampled_frame_by_its_time(clips):
    times = [t for t, _ in decoded(clips / "a.mp4")]
    assert times == pytest.approx([k / 10 for k in range(20)])
    every3 = open_pool(str(clips), PoolOptions(every=3))
    b = [f"more/b.mkv#t={t:.3f}" for t, _ in decoded(clips / "more" / "b.mkv")][::3]
    assert every3.ids == [f"a.mp4#t={t:.3f}" for t in times[::3]] + b
    # --fps 4 on 10 fps: the first frame at or after each quarter second
    steps = [k / 4 for k in range(8)]
    want = [min(t for t in times if t >= s - 1e-9) for s in steps]
    fps4 = open_pool(str(clips / "a.mp4"), PoolOptions(fps=4))
    assert fps4.ids == [f"a.mp4#t={t:.3f}" for t in want]
    assert fps4.ids[:4] == ["a.mp4#t=0.000", "a.mp4#t=0.300", "a.mp4#t=0.500", "a.mp4#t=0.800"]
    assert len(open_pool(str(clips), PoolOptions()).ids) == 28  # every frame by default


def test_scores_equal_a_float64_loop_on_frames_decoded_independently(in_ws, clips):
    rows = parse_csv(score(in_ws, clips, "--every", "2", "-s", "gradnorm", "--method", "loop",
                           "-o", "-").stdout)
    frames = {f"a.mp4#t={t:.3f}": rgb for t, rgb in decoded(clips / "a.mp4")[::2]}
    frames |= {f"more/b.mkv#t={t:.3f}": rgb for t, rgb in decoded(clips / "more" / "b.mkv")[::2]}
    assert sorted(r["id"] for r in rows) == sorted(frames)
    model = in_ws.net()
    for r in rows:
        x = model_input(frames[r["id"]])
        pred = int(model(x[None]).argmax())
        assert int(r["pred"]) == pred
        assert float(r["score"]) == pytest.approx(oracle_grad_norm(model, x, pred), rel=1e-4)
        assert r["path"] == f"{clips}/{r['id']}"  # the row's path names its frame


def test_a_frame_reads_back_as_decoded(clips):
    """The contact sheet's and -f paths' read-back: the frame's pixels, exactly."""
    for t, rgb in decoded(clips / "a.mp4")[5:8]:
        with Image.open(open_source(f"{clips}/a.mp4#t={t:.3f}")) as im:
            assert np.array_equal(np.asarray(im.convert("RGB")), rgb)
    with pytest.raises(ValueError, match="no frame"):
        open_source(f"{clips}/a.mp4#t=99.000")


def test_kill_9_then_resume_gives_the_uninterrupted_table(in_ws, tmp_path):
    clip = tmp_path / "long.mkv"
    write_clip(clip, 300, fps=25, codec="mpeg4", seed=2)
    out, full = tmp_path / "resumed.csv", tmp_path / "full.csv"
    args = [clip, "-m", "model.pt", "-c", "config.yaml", "--resize", "6", "-b", "4", "-q",
            "-s", "gradnorm", "--checkpoint-every", "12"]
    saved = kill_when_saved(start_score(in_ws.root, *args, "-o", out), Path(f"{out}.partial"), 24)
    assert 0 < saved < 300
    second = start_score(in_ws.root, *args, "-o", out, "--resume")
    _, err = second.communicate(timeout=300)
    assert second.returncode == 0, err
    assert f"resuming: {saved} examples" in err
    reference = runner.invoke(app, ["score", *map(str, args), "-o", str(full)])
    assert reference.exit_code == 0, reference.stderr
    assert out.read_bytes() == full.read_bytes()
    assert len(parse_csv(full.read_text())) == 300


def test_two_shards_merged_equal_one_process(in_ws, clips, tmp_path):
    one = tmp_path / "one.csv"
    common = ["-s", "gradnorm", "-b", "1", "--every", "2"]
    score(in_ws, clips, *common, "-o", one)
    parts = [tmp_path / f"part{k}.csv" for k in range(2)]
    for k, part in enumerate(parts):
        score(in_ws, clips, *common, "--shard", f"{k}/2", "-o", part)
    merged = tmp_path / "merged.csv"
    result = runner.invoke(app, ["merge", *map(str, parts), "-o", str(merged), "-q"])
    assert result.exit_code == 0, result.stderr
    assert merged.read_bytes() == one.read_bytes()


def test_select_names_frames_and_draws_them(in_ws, clips, tmp_path):
    table = tmp_path / "t.csv"
    score(in_ws, clips, "--fps", "5", "-o", table)
    paths = runner.invoke(app, ["select", str(table), "--budget", "3", "-f", "paths", "-o", "-",
                                "--contact-sheet", str(tmp_path / "sheet.png")])
    assert paths.exit_code == 0, paths.stderr
    assert "could not be read" not in paths.stderr
    ids = runner.invoke(app, ["select", str(table), "--budget", "3", "-f", "ids", "-o", "-"])
    top = ids.stdout.splitlines()
    assert len(top) == 3 and set(top) <= {r["id"] for r in parse_csv(table.read_text())}
    assert paths.stdout.splitlines() == [f"{clips}/{i}" for i in top]
    frames = {f"{name}#t={t:.3f}": rgb for name in ("a.mp4", "more/b.mkv")
              for t, rgb in decoded(clips / name)}
    for line, i in zip(paths.stdout.splitlines(), top):
        with Image.open(open_source(line)) as im:
            assert np.array_equal(np.asarray(im.convert("RGB")), frames[i])
    with Image.open(tmp_path / "sheet.png") as sheet:
        assert sheet.size[0] > 3 * 8 and len(set(sheet.convert("L").getdata())) > 20  # drawn tiles


def test_label_studio_tasks_carry_each_frame_extracted_beside_the_batch(in_ws, clips, tmp_path):
    table, batch = tmp_path / "t.csv", tmp_path / "batch.json"
    score(in_ws, clips, "--every", "3", "-o", table)
    root = "http://ls:8080/data/local-files/?d=work/"
    result = runner.invoke(app, ["select", str(table), "--budget", "4", "-f", "labelstudio",
                                 "-o", str(batch), "--image-root", root])
    assert result.exit_code == 0, result.stderr
    frames = {f"{name}#t={t:.3f}": rgb for name in ("a.mp4", "more/b.mkv")
              for t, rgb in decoded(clips / name)}
    tasks = json.loads(batch.read_text())
    assert len(tasks) == 4 and len(list((tmp_path / "batch.json.frames").iterdir())) == 4
    for task in tasks:
        frame_id = task["data"]["alcli_id"]
        name = id_file(frame_id, ".png")
        assert task["data"]["image"] == root + "batch.json.frames/" + name
        with Image.open(tmp_path / "batch.json.frames" / name) as im:
            assert np.array_equal(np.asarray(im.convert("RGB")), frames[frame_id])
    to_stdout = runner.invoke(app, ["select", str(table), "--budget", "2", "-f", "labelstudio",
                                    "-o", "-"])
    assert to_stdout.exit_code == 1 and "name it with --output FILE" in to_stdout.stderr
    assert "Traceback" not in to_stdout.stderr


def test_bad_videos_and_options_are_one_sentence(in_ws, clips, tmp_path):
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "broken.mp4").write_bytes(b"not a video at all")
    write_clip(bad / "ok.webm", 3, codec="libvpx")
    result = score(in_ws, bad, "-o", tmp_path / "t.csv")
    rows = parse_csv((tmp_path / "t.csv").read_text())
    assert sorted(r["id"] for r in rows) == ["ok.webm#t=0.000", "ok.webm#t=0.100", "ok.webm#t=0.200"]
    errors = (tmp_path / "t.csv.errors.csv").read_text()
    assert "broken.mp4" in errors and "cannot read video" in errors
    both = score(in_ws, clips, "--fps", "2", "--every", "2", ok=False)
    assert both.exit_code == 1 and "--fps and --every" in both.stderr
    assert "Traceback" not in both.stderr + result.stderr
    zero = score(in_ws, clips, "--every", "0", ok=False)
    assert zero.exit_code == 1 and "every" in zero.stderr
