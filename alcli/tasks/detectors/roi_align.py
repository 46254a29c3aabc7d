"""Multi-scale RoIAlign as one weighted sum of feature-map cells, for the R-CNNs' batched forward
and their loop (swapped into the RoI heads).

The numbers of torchvision's MultiScaleRoIAlign (aligned=False, a fixed sampling ratio r): each
row's box goes to its pyramid level, each of its n x n bins is the mean of r x r bilinear samples,
and a sample reads 4 cells. So a bin is a weighted sum of 4 r^2 cells of one table holding every
level's cells, an embedding bag:

    pooled(maps [L][B, C, H_l, W_l], pool, rois [B, N, 4]) -> [B*N, C, n, n]

torchvision's CPU kernels run the rows one after another, forward and backward; the bag sum and
its backward are threaded (3x and 7x faster on 2 cores: benchmarks/roi_pool.py), and all levels
are one call (no host sync for the rows' levels). The tests' oracle is torchvision's own RoIAlign, in float64.
"""
from __future__ import annotations

import contextlib

import torch
from torch import nn


def servable(pool: nn.Module) -> bool:
    """A MultiScaleRoIAlign with a fixed sampling ratio (an adaptive one samples a row's bins by
    its size: a bag of varying length)."""
    return type(pool).__name__ == "MultiScaleRoIAlign" and pool.sampling_ratio > 0


def _axis(at: torch.Tensor, size: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample coordinates along one axis [R, m], the map's size there [R, 1] -> the two cells each
    sample reads [R, m, 2] and their bilinear weights, 0 for a sample more than a cell outside the
    map (torchvision's bilinear_interpolate: clamped to the map's first and last cell; past the
    last, both cells are the last, so their weights sum to its 1)."""
    inside = (at >= -1) & (at <= size)
    at = at.clamp(min=0)
    low = torch.minimum(at.floor(), size - 1)
    frac = at - low
    cells = torch.stack([low, torch.minimum(low + 1, size - 1)], -1).long()
    return cells, torch.stack([1 - frac, frac], -1) * inside[..., None]


def with_scales(pool: nn.Module, features: dict, image_shapes: list) -> None:
    """A MultiScaleRoIAlign's level scales, which its first call sets from the maps' sizes (as in
    the loop): one call at a unit box per image."""
    if pool.scales is None:
        unit = next(iter(features.values())).new_tensor([[0.0, 0.0, 1.0, 1.0]])
        pool(features, [unit] * len(image_shapes), image_shapes)


def maps_of(pool: nn.Module, features: dict) -> list[torch.Tensor]:
    """The feature maps the pool reads, in the features' order (as MultiScaleRoIAlign filters)."""
    return [f for name, f in features.items() if name in pool.featmap_names]


def cell_table(maps: list[torch.Tensor]) -> torch.Tensor:
    """Every level's cells, level by level, image by image: [sum_l B H_l W_l, C]."""
    return torch.cat([m.permute(0, 2, 3, 1).reshape(-1, m.shape[1]) for m in maps])


def pooled(maps: list[torch.Tensor], pool: nn.Module, rois: torch.Tensor, table: torch.Tensor | None = None
           ) -> torch.Tensor:
    """rois [B, N, 4] (x1, y1, x2, y2 in the image) -> [B*N, C, n_h, n_w]."""
    b, n = rois.shape[:2]
    image = torch.arange(b, device=rois.device).repeat_interleave(n)
    return pooled_rows(maps, pool, rois.flatten(0, 1), image, table)


def pooled_rows(maps: list[torch.Tensor], pool: nn.Module, rois: torch.Tensor, image: torch.Tensor,
                table: torch.Tensor | None = None) -> torch.Tensor:
    """rois [R, 4] of the images `image` [R] -> [R, C, n_h, n_w]: every row pooled at its own
    pyramid level (pool.map_levels, pool.scales: with_scales has run), from cell_table(maps)
    (`table`: made once for several calls)."""
    (out_h, out_w), ratio = pool.output_size, pool.sampling_ratio
    level = pool.map_levels([rois]).long()                                      # [R]
    sizes = torch.tensor([m.shape[-2:] for m in maps], device=rois.device)      # [L, 2]
    starts = torch.tensor([0] + [m[:, 0].numel() for m in maps[:-1]], device=rois.device).cumsum(0)
    h, w = sizes[level].unbind(1)                                               # [R], [R]
    base = starts[level] + image * h * w                                        # the row's map in the table
    x1, y1, x2, y2 = (rois * rois.new_tensor(pool.scales)[level, None]).unbind(1)

    def samples(start, length, bins, size):  # -> [R, bins, 2r] cells and weights of each bin's samples
        steps = (torch.arange(bins * ratio, device=rois.device, dtype=rois.dtype) + 0.5) / ratio
        cells, weights = _axis(start[:, None] + steps * (length.clamp(min=1) / bins)[:, None],
                               size[:, None].to(rois.dtype))
        return cells.view(len(start), bins, 2 * ratio), weights.view(len(start), bins, 2 * ratio)

    ys, wy = samples(y1, y2 - y1, out_h, h)
    xs, wx = samples(x1, x2 - x1, out_w, w)
    # bin (p, q): every (y cell of bin p's samples) x (x cell of bin q's samples), mean over r^2 samples
    at = base[:, None, None, None, None] + ys[:, :, None, :, None] * w[:, None, None, None, None] \
        + xs[:, None, :, None, :]                                               # [R, n_h, n_w, 2r, 2r]
    weights = wy[:, :, None, :, None] * wx[:, None, :, None, :] / ratio ** 2
    c = maps[0].shape[1]
    bins = nn.functional.embedding_bag(at.flatten(3).flatten(0, 2), cell_table(maps) if table is None else table,
                                       per_sample_weights=weights.flatten(3).flatten(0, 2), mode="sum")
    return bins.view(len(rois), out_h, out_w, c).permute(0, 3, 1, 2).contiguous()


class Pool(nn.Module):
    """A MultiScaleRoIAlign's call (feature maps by name, boxes per image, the images' sizes), its
    numbers from pooled_rows: what swapped puts in an R-CNN's RoI heads."""

    def __init__(self, pool: nn.Module):
        super().__init__()
        self.pool = pool

    def forward(self, features: dict, boxes: list[torch.Tensor], image_shapes: list) -> torch.Tensor:
        with_scales(self.pool, features, image_shapes)
        image = torch.cat([torch.full((len(b),), i, device=b.device) for i, b in enumerate(boxes)])
        return pooled_rows(maps_of(self.pool, features), self.pool, torch.cat(boxes), image)


POOLS = ("box_roi_pool", "mask_roi_pool", "keypoint_roi_pool")  # torchvision's RoIHeads' pools


@contextlib.contextmanager
def swapped(roi_heads: nn.Module):
    """An R-CNN's RoI heads with each pool servable() computed by pooled_rows, for the duration."""
    originals = {name: getattr(roi_heads, name) for name in POOLS
                 if getattr(roi_heads, name, None) is not None and servable(getattr(roi_heads, name))}
    for name, pool in originals.items():
        setattr(roi_heads, name, Pool(pool))
    try:
        yield
    finally:
        for name, pool in originals.items():
            setattr(roi_heads, name, pool)
