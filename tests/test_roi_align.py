"""roi_align.pooled, the R-CNNs' batched RoI pool, against torchvision's MultiScaleRoIAlign in
float64: values and the maps' gradients, with boxes on every level, boxes partly or wholly off
the map, boxes thinner than a cell, and outputs that are not square."""
import pytest
import torch
from torchvision.ops import MultiScaleRoIAlign

from alcli.tasks.detectors import roi_align

NAMES = ["0", "1", "2", "3"]


def pyramid(b: int, c: int = 5, size: tuple = (64, 48)) -> dict:
    """Feature maps at strides 4, 8, 16, 32 of a [size] image, needing gradients."""
    g = torch.Generator().manual_seed(0)
    return {name: torch.randn(b, c, size[0] // 4 >> i, size[1] // 4 >> i, generator=g, dtype=torch.float64,
                              requires_grad=True) for i, name in enumerate(NAMES)}


def boxes(b: int, n: int, size: tuple = (64, 48)) -> torch.Tensor:
    """[b, n, 4]: random boxes of 0.3 to 60 px from 4 px before the image to past its end (many
    partly off it), one box wholly off it and one of zero width per image."""
    g = torch.Generator().manual_seed(1)
    h, w = size
    corner = torch.rand(b, n, 2, generator=g, dtype=torch.float64) * torch.tensor([w, h]) * 1.2 - 4
    extent = torch.exp(torch.rand(b, n, 2, generator=g, dtype=torch.float64) * 5.3 - 1.2)
    rois = torch.cat([corner, corner + extent], -1)
    rois[:, 0] = torch.tensor([w + 3.0, h + 2.0, w + 9.0, h + 7.0])    # off the image
    rois[:, 1, 2] = rois[:, 1, 0]                                      # zero width
    return rois


@pytest.mark.parametrize("output_size, ratio, canonical", [(7, 2, 16), ((14, 14), 2, 8), ((3, 5), 1, 4), (7, 3, 224)])
def test_pooled_equals_torchvisions_multiscale_roi_align(output_size, ratio, canonical):
    b, n, size = 3, 40, (64, 48)
    pool = MultiScaleRoIAlign(NAMES, output_size, ratio, canonical_scale=canonical)
    maps, rois = pyramid(b, size=size), boxes(b, n, size)
    want = pool(maps, list(rois), [size] * b)                                   # [b*n, C, h, w]
    got = roi_align.pooled(list(maps.values()), pool, rois)
    levels = pool.map_levels([rois.flatten(0, 1)])
    assert len(levels.unique()) >= (1 if canonical == 224 else 3)             # rows on several levels
    assert got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    cotangent = torch.randn_like(want)
    want_grads = torch.autograd.grad(want, list(maps.values()), cotangent)
    got_grads = torch.autograd.grad(got, list(maps.values()), cotangent)
    for g_got, g_want in zip(got_grads, want_grads):
        torch.testing.assert_close(g_got, g_want, rtol=1e-12, atol=1e-12)
    assert sum(g.abs().sum() for g in want_grads) > 0


def test_an_adaptive_sampling_ratio_is_not_served():
    assert roi_align.servable(MultiScaleRoIAlign(NAMES, 7, 2))
    assert not roi_align.servable(MultiScaleRoIAlign(NAMES, 7, 0))


def test_the_pool_swapped_into_the_roi_heads_pools_as_torchvisions():
    """roi_align.Pool takes a MultiScaleRoIAlign's call (boxes per image, as many as each has,
    none for one) and gives its numbers; swapped puts it in the heads and the original back."""
    import torchvision
    model = torchvision.models.get_model("maskrcnn_resnet50_fpn", weights=None, weights_backbone=None,
                                         num_classes=3)
    heads = model.roi_heads
    originals = {name: getattr(heads, name) for name in roi_align.POOLS}
    size, counts = (64, 48), [7, 0, 12]
    maps = pyramid(len(counts), size=size)
    per_image = [boxes(1, 12, size)[0][:k] for k in counts]
    with roi_align.swapped(heads):
        assert isinstance(heads.box_roi_pool, roi_align.Pool) and isinstance(heads.mask_roi_pool, roi_align.Pool)
        got = {name: getattr(heads, name)(maps, per_image, [size] * len(counts)) for name in ("box_roi_pool", "mask_roi_pool")}
    assert {name: getattr(heads, name) for name in roi_align.POOLS} == originals
    for name, pooled in got.items():
        want = originals[name](maps, per_image, [size] * len(counts))
        assert pooled.shape == want.shape == (sum(counts), 5, *originals[name].output_size)
        torch.testing.assert_close(pooled, want, rtol=1e-12, atol=1e-12)
