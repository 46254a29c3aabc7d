"""Video pools: frames read per second on this machine, side by side in one process (one thread).
A clip of --frames frames at --size (H.264 in .mp4, written once with PyAV under --dir, a temporary folder) is read

  decode     PyAV alone: every frame decoded and turned to RGB (the floor alcli cannot beat)
  pool       alcli's video pool (alcli.pools.video), every frame: decode + the image transform
             (uint8 [3, 224, 224], --resize 224 --center-crop 224) through pool[i], in order
  every N    the same, --every N: frames skipped are still decoded (forward, no seek)
  fps F      the same, --fps F
  loader     every frame through a DataLoader of 2 workers, batch 32 (each worker reopens the clip
             and seeks to its batches)

and, for pool, the peak RSS growth while reading (bounded: one decoded frame at a time).

    python benchmarks/video.py [--frames 600] [--size 640x360] [--quick]
"""
from __future__ import annotations

import argparse
import resource
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def write_clip(path: Path, frames: int, width: int, height: int, fps: int = 30) -> None:
    import av
    rng = np.random.default_rng(0)
    with av.open(str(path), "w") as out:
        stream = out.add_stream("libx264", rate=fps)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        base = rng.integers(0, 256, (height // 8, width // 8, 3), dtype=np.uint8)
        for i in range(frames):  # a slowly moving pattern, as real footage compresses
            rgb = np.kron(np.roll(base, i // 4, axis=1), np.ones((8, 8, 1), dtype=np.uint8))
            for packet in stream.encode(av.VideoFrame.from_ndarray(rgb, format="rgb24")):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)


def pyav_alone(path: Path) -> int:
    import av
    with av.open(str(path)) as c:
        return sum(1 for f in c.decode(c.streams.video[0]) if f.to_ndarray(format="rgb24") is not None)


def pool_read(path: Path, **sampling) -> int:
    from alcli.files.config import Transform
    from alcli.pools import open_pool
    from alcli.pools.common import PoolOptions
    pool = open_pool(str(path), PoolOptions(transform=Transform(resize=224, center_crop=224),
                                            **sampling))
    for i in range(len(pool)):
        assert pool[i].error is None
    return len(pool)


def loader_read(path: Path) -> int:
    from alcli.files.config import Transform
    from alcli.pools import open_pool
    from alcli.pools.common import PoolOptions, collate
    pool = open_pool(str(path), PoolOptions(transform=Transform(resize=224, center_crop=224)))
    loader = torch.utils.data.DataLoader(pool, batch_size=32, num_workers=2, collate_fn=collate)
    return sum(len(b.ids) for b in loader)


def timed(fn, *args, **kwargs) -> tuple[int, float]:
    start = time.perf_counter()
    n = fn(*args, **kwargs)
    return n, time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--frames", type=int, default=600)
    ap.add_argument("--size", default="640x360")
    ap.add_argument("--dir", default=str(Path(tempfile.gettempdir()) / "alcli-video-bench"),
                    help="where the clip is written once and kept")
    ap.add_argument("--quick", action="store_true", help="60 frames at 160x96")
    args = ap.parse_args()
    if args.quick:
        args.frames, args.size = 60, "160x96"
    torch.set_num_threads(1)
    width, height = map(int, args.size.split("x"))
    folder = Path(args.dir)
    folder.mkdir(parents=True, exist_ok=True)
    clip = folder / f"clip_{args.frames}_{width}x{height}.mp4"
    if not clip.exists():
        write_clip(clip, args.frames, width, height)
    import alcli.pools  # noqa: F401 - imported before the baseline of the RSS growth
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    runs = [("decode (PyAV alone)", pyav_alone, {}), ("pool, every frame", pool_read, {}),
            ("pool, --every 5", pool_read, {"every": 5}), ("pool, --fps 2", pool_read, {"fps": 2.0}),
            ("DataLoader, 2 workers", loader_read, {})]
    print(f"{args.frames} frames of {width}x{height} H.264 ({clip.name}), one thread\n")
    print(f"| read | frames | seconds | frames/s | clip frames/s |")
    print(f"|---|---|---|---|---|")
    for name, fn, kwargs in runs:
        n, s = timed(fn, clip, **kwargs)
        print(f"| {name} | {n} | {s:.2f} | {n / s:.0f} | {args.frames / s:.0f} |")
    grew = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0) / 1024
    print(f"\npeak RSS growth over all runs in this process: {grew:.0f} MiB "
          f"(the whole clip decoded would be {args.frames * width * height * 3 / 2**20:.0f} MiB)")


if __name__ == "__main__":
    main()
