"""Video pools: an .mp4/.mkv/.webm file, or a folder of them (every video under it, sorted); each
sampled frame is one example, decoded with PyAV (`pip install 'alcli[video]'`).

Opening reads the packets' timestamps only (no decoding) to list the frames sampled: every N-th
(--every N, default 1) or one per 1/F seconds (--fps F: the first frame at or after each step). A
frame's id is its video (the file name, or its path under the folder) and its time:
`clip.mp4#t=12.500`; its row's `path` names it the same way under the pool, and is read back
(contact sheet, -f paths) by decoding that one frame (read_frame). Frames are decoded when an item
is asked for, one at a time: each process keeps one video open, decoding on from the frame it
last gave when the next one is later in the same video, else seeking to the keyframe before it;
no more than one decoded frame is held. A video that cannot be read is one error row.
"""
from __future__ import annotations

import io
import math
import os
from pathlib import Path
from typing import NamedTuple

from PIL import Image

from ..errors import ConfigError, PoolError, first_line
from ..files.regular import check_regular
from .common import IMAGE_EXTS, Item, Pool, PoolKind, PoolOptions, check_unique_ids, image_transform

VIDEO_EXTS = (".mp4", ".mkv", ".webm")
INSTALL = "pip install 'alcli[video]'"


def _av():
    try:
        import av
    except ImportError:
        raise PoolError(f"video pools need PyAV; {INSTALL}") from None
    return av


def is_video(spec) -> bool:
    """A video file, or a folder holding videos (and no images) at its top."""
    if not isinstance(spec, str):
        return False
    path = Path(spec)
    if path.is_dir():
        try:
            names = [e.name.lower() for e in os.scandir(path)]
        except OSError:
            return False
        return any(n.endswith(VIDEO_EXTS) for n in names) and \
            not any(n.endswith(IMAGE_EXTS) for n in names)
    return path.suffix.lower() in VIDEO_EXTS


class Frame(NamedTuple):
    video: int       # index into the pool's videos
    pts: int | None  # its presentation time in the stream's time base; None: the video is unreadable
    time: float      # seconds


def sampled(pts: list[int], time_base, fps: float | None, every: int) -> list[int]:
    """The frames kept of a video's frames (their pts, in presentation order): one per 1/fps
    seconds (the first at or after each step, from the first frame), else every `every`-th."""
    if fps is None:
        return pts[::every]
    kept, start, step = [], float(pts[0] * time_base), 0
    for p in pts:
        t = float(p * time_base) - start
        if t >= step / fps - 1e-9:
            kept.append(p)
            step = math.floor(t * fps + 1e-9) + 1  # the next step after this frame
    return kept


def frame_id(name: str, time: float) -> str:
    return f"{name}#t={time:.3f}"


def max_pixels() -> int:
    """A frame's pixels at most: PIL's decompression-bomb limit, as for an image pool's files."""
    return 2 * (Image.MAX_IMAGE_PIXELS or 89_478_485)


def check_size(file, width: int, height: int) -> None:
    """A ValueError when a frame of `width` x `height` would be a decompression bomb (a 140 KB
    video can claim 14000 x 14000 frames, 590 MB each as RGB)."""
    if width * height > max_pixels():
        raise ValueError(f"video {file} has frames of {width} x {height} pixels, more than "
                         f"{max_pixels()}")


def _opened(file):
    """The video open for reading. FFmpeg's stream probe decodes no frame (`skip_frame`): the
    frame size is the container's header's, checked before any frame is decoded (a bomb's probe
    cost 1 GB, hostile inputs R4-14); decoding later is not affected."""
    return _av().open(str(file), options={"skip_frame": "all"})


def _stream_pts(file: Path) -> tuple[list[int], object]:
    """(the video stream's frames' pts in presentation order, its time base), from the packets."""
    with _opened(file) as container:
        stream = container.streams.video[0]
        check_size(file, stream.codec_context.width, stream.codec_context.height)
        pts = sorted(p.pts for p in container.demux(stream) if p.pts is not None and p.size)
        return pts, stream.time_base


class VideoPool(Pool):
    kind = "images"

    def __init__(self, name: str, files: list[Path], names: list[str], frames: list[Frame],
                 errors: dict[int, str], opts: PoolOptions):
        self.name, self.files, self.frames, self.errors = name, files, frames, errors
        self.ids = [names[f.video] if f.pts is None else frame_id(names[f.video], f.time)
                    for f in frames]
        self.paths = [f"{files[f.video]}#t={f.time:.3f}" for f in frames]  # the table's `path`
        self.labels, self.has_labels = [-1] * len(frames), False
        self.transform = image_transform(opts.transform, opts.channels)
        self.to_float = self.transform.to_float
        self._open: tuple | None = None  # (video, container, decoder, last pts): the one open

    def __getstate__(self):
        return {**self.__dict__, "_open": None}  # a DataLoader worker opens its own

    def __getitem__(self, i: int) -> Item:
        f, path = self.frames[i], self.paths[i]
        if f.pts is None:
            return Item(self.ids[i], None, -1, self.errors[f.video])
        try:
            rgb = self._decode(f)
            x = self.transform(Image.fromarray(rgb))
        except Exception as err:  # noqa: BLE001 - any undecodable frame becomes an error row
            self._close()
            return Item(self.ids[i], None, -1, f"cannot read frame {path} ({first_line(err)})")
        return Item(self.ids[i], x, -1, None, path)

    def _decode(self, f: Frame):
        """The frame's RGB array [H, W, 3], decoding on in the open video when it lies ahead."""
        if self._open is None or self._open[0] != f.video or self._open[3] >= f.pts:
            self._close()
            container, decoder = _seek(self.files[f.video], f.pts)
            self._open = (f.video, container, decoder, -math.inf)
        video, container, decoder, _ = self._open
        frame = _next_at(decoder, f.pts, self.files[f.video])
        self._open = (video, container, decoder, frame.pts)
        return frame.to_ndarray(format="rgb24")

    def _close(self) -> None:
        if getattr(self, "_open", None) is not None:
            self._open[1].close()
            self._open = None

    def __del__(self):
        self._close()


def _seek(file: Path, pts: int):
    """The video open, positioned at the keyframe at or before `pts`: (container, frame iterator)."""
    check_regular(file)
    container = _opened(file)
    stream = container.streams.video[0]
    try:
        check_size(file, stream.codec_context.width, stream.codec_context.height)
    except ValueError:
        container.close()
        raise
    container.seek(pts, stream=stream, backward=True, any_frame=False)
    return container, container.decode(stream)


def _next_at(decoder, pts: int, file):
    """The first decoded frame at or after `pts` (the earlier ones are dropped as they come). Each
    frame's own size is checked: a stream may change resolution after its header (R4-13)."""
    for frame in decoder:
        check_size(file, frame.width, frame.height)
        if frame.pts is not None and frame.pts >= pts:
            return frame
    raise ValueError(f"no frame at pts {pts}")


def from_videos(spec: str, opts: PoolOptions) -> Pool:
    """A video file, or every video under a folder (recursive, sorted by path)."""
    if opts.labels_from_folders:
        raise ConfigError("--labels-from-folders needs a folder of images in class subfolders; "
                          "a video pool's frames are unlabeled")
    if opts.fps is not None and opts.every is not None:
        raise ConfigError("--fps and --every both sample a video's frames; pass one")
    root = Path(spec)
    if root.is_dir():
        files = sorted((p for p in root.rglob("*") if p.suffix.lower() in VIDEO_EXTS),
                       key=lambda p: p.relative_to(root).as_posix())
        names = [p.relative_to(root).as_posix() for p in files]
    else:
        files, names = [root], [root.name]
    frames, errors = [], {}
    for v, file in enumerate(files):
        try:
            check_regular(file)
            pts, time_base = _stream_pts(file)
        except PoolError:
            raise
        except Exception as err:  # noqa: BLE001 - not a video, no video stream, truncated
            errors[v] = f"cannot read video {file} ({first_line(err)})"
            frames.append(Frame(v, None, 0.0))
            continue
        if not pts:
            errors[v] = f"video {file} holds no frames"
            frames.append(Frame(v, None, 0.0))
            continue
        frames += [Frame(v, p, float(p * time_base))
                   for p in sampled(pts, time_base, opts.fps, opts.every or 1)]
    if not frames:
        raise PoolError(f"pool {spec} holds no videos (looked for {', '.join(VIDEO_EXTS)})")
    pool = VideoPool(str(root), files, names, frames, errors, opts)
    check_unique_ids(str(root), pool.ids)
    return pool


# --- a frame, read back ----------------------------------------------------------------------------

def read_frame(file: str, part: str) -> bytes:
    """The frame a row's FILE#t=SECONDS path names, as PNG bytes (contact sheet, -f paths)."""
    if not part.startswith("t="):
        raise ValueError(f"{file}#{part}: after '#' a video's frame is t=SECONDS")
    try:
        t = float(part[2:])
    except ValueError:
        raise ValueError(f"{file}#{part}: after '#' a video's frame is t=SECONDS") from None
    with _opened(file) as container:
        stream = container.streams.video[0]
        check_size(file, stream.codec_context.width, stream.codec_context.height)
        target = round(t / stream.time_base) if math.isfinite(t) else 0
        container.seek(max(target, 0), stream=stream, backward=True, any_frame=False)
        for frame in container.decode(stream):
            check_size(file, frame.width, frame.height)
            if frame.pts is not None and round(float(frame.time), 3) >= round(t, 3):
                out = io.BytesIO()
                frame.to_image().save(out, "PNG")
                return out.getvalue()
    raise ValueError(f"video {file} has no frame at {t:.3f} s")


def _frames_under(spec: str):
    """A row's id (VIDEO#t=SECONDS) -> its frame's path under the pool."""
    base = Path(spec) if Path(spec).is_dir() else Path(spec).parent
    return lambda i: str(base / i)


KIND = PoolKind("video", lambda spec, opts: is_video(spec),
                lambda spec, opts, stdin: from_videos(spec, opts), options=("fps", "every"),
                parts=VIDEO_EXTS, read_part=read_frame, files_of=_frames_under, extracted=True)
