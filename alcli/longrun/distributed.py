"""Running under torchrun: one process per device, each scoring shard RANK/WORLD_SIZE of the pool.

torchrun (torch.distributed.run) sets RANK, WORLD_SIZE and LOCAL_RANK (and MASTER_ADDR/PORT); this
module starts the process group (nccl on CUDA, gloo on the CPU), picks the rank's device, and sends
each rank's finished rows to rank 0 in chunks over a gloo group (bounded memory, no shared
filesystem needed), where the one table is written.
"""
from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Iterator

import torch
import torch.distributed as dist

from ..errors import ConfigError
from .partial import copy_lines, data_lines

CHUNK_LINES = 4096  # partial-file lines per message to rank 0


@dataclass
class Context:
    rank: int
    world: int
    local_rank: int
    group: object = None  # the gloo group rows travel over


def from_env() -> Context | None:
    """The torchrun context, or None for a plain run (no WORLD_SIZE/RANK, or a world of one)."""
    world, rank = os.environ.get("WORLD_SIZE"), os.environ.get("RANK")
    if world is None or rank is None:
        return None
    try:
        ctx = Context(int(rank), int(world), int(os.environ.get("LOCAL_RANK", rank)))
    except ValueError:
        raise ConfigError(f"RANK={rank!r} and WORLD_SIZE={world!r} must be integers") from None
    return ctx if ctx.world > 1 else None


def device_for(spec: str, ctx: Context) -> str:
    """The rank's device: CUDA device LOCAL_RANK when the run is on CUDA, else the setting."""
    if spec in ("auto", "cuda") or spec.startswith("cuda:"):
        if torch.cuda.is_available():
            if ctx.local_rank >= torch.cuda.device_count():
                raise ConfigError(f"LOCAL_RANK {ctx.local_rank} has no CUDA device (this machine has "
                                  f"{torch.cuda.device_count()}); start fewer processes per node")
            return f"cuda:{ctx.local_rank}"
        if spec != "auto":
            raise ConfigError(f"--device {spec}: CUDA is not available on this machine")
        return "cpu"
    return spec


@contextlib.contextmanager
def session(ctx: Context | None, device: str) -> Iterator[None]:
    """The process group for the run (nothing for a plain run); torn down at the end."""
    if ctx is None:
        yield
        return
    nccl = device.startswith("cuda")
    if nccl:
        torch.cuda.set_device(torch.device(device))
    # a long timeout: ranks wait for the slowest one at the end, which may be hours later
    dist.init_process_group("nccl" if nccl else "gloo", timeout=timedelta(hours=24))
    try:
        ctx.group = dist.new_group(backend="gloo") if nccl else dist.group.WORLD
        yield
    finally:
        dist.destroy_process_group()


def gather_lines(ctx: Context, source: Path, dest: Path | None) -> None:
    """Every rank's partial-file lines (`source`) are appended to `dest` on rank 0; rank 0's own
    lines stay in its own file. Collective: every rank calls it."""
    chunks = data_lines(source, CHUNK_LINES) if ctx.rank != 0 else iter(())
    finished = False
    while True:
        chunk = [] if finished else next(chunks, None)
        if chunk is None:
            finished, chunk = True, []
        got = [None] * ctx.world if ctx.rank == 0 else None
        dist.gather_object((chunk, finished), got, dst=0, group=ctx.group)
        flag = [None]
        if ctx.rank == 0:
            for lines, _ in got[1:]:
                if lines:
                    copy_lines(lines, dest)
            flag = [all(done for _, done in got[1:])]
        dist.broadcast_object_list(flag, src=0, group=ctx.group)
        if flag[0]:
            return


def run_totals(ctx: Context, count: int, seconds: float) -> tuple[int, float]:
    """(examples scored by all ranks, the longest rank's seconds): the run's speed, on every
    rank. Collective: every rank calls it."""
    got = [None] * ctx.world
    dist.all_gather_object(got, (count, seconds), group=ctx.group)
    return sum(c for c, _ in got), max(s for _, s in got)


def barrier(ctx: Context | None) -> None:
    if ctx is not None:
        dist.barrier(group=ctx.group)


def rank0_ok(ctx: Context | None, ok: bool) -> bool:
    """Rank 0's `ok` on every rank (has it written the table?); `ok` elsewhere is ignored."""
    if ctx is None:
        return ok
    flag = [ok]
    dist.broadcast_object_list(flag, src=0, group=ctx.group)
    return bool(flag[0])
