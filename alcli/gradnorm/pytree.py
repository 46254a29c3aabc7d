"""Moving a batch dimension in and out of pytrees of tensors, given one dim per leaf
(None for leaves that are not batched), as `layout.Layout` records them.

A leaf whose dim d holds the batch as the outer factor of B*k rows (`Layout.in_blocks`: swin's
windows) is unflattened to [.., B, k, ..] and vmapped over the B: each example then sees its
own k rows where the module expects its batch, so no size-1 dim is put back for it."""
from __future__ import annotations

import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

from .errors import UnsupportedModel
from .layout import MERGED


def dims_like(tree, dims: list):
    """The flat per-leaf dims as a pytree shaped like `tree` (for vmap's in_dims)."""
    leaves, spec = tree_flatten(tree)
    if MERGED in dims:
        raise UnsupportedModel("an input merges the batch with another dimension")
    return tree_unflatten([d if isinstance(leaf, torch.Tensor) else None for leaf, d in zip(leaves, dims)], spec)


def unsqueeze_leaves(tree, dims: list):
    """Put back a size-1 batch dim on every batched leaf (inside vmap the dim is gone)."""
    leaves, spec = tree_flatten(tree)
    return tree_unflatten([leaf.unsqueeze(d) if d is not None and isinstance(leaf, torch.Tensor) else leaf
                           for leaf, d in zip(leaves, dims)], spec)


def squeeze_leaves(tree, dims: list):
    leaves, spec = tree_flatten(tree)
    return tree_unflatten([leaf.squeeze(d) if d is not None and isinstance(leaf, torch.Tensor) else leaf
                           for leaf, d in zip(leaves, dims)], spec)


def unmerge_blocks(tree, dims: list, blocks: list | None):
    """-> (tree with blocked leaves unflattened at their dim, per-leaf vmap dims, per-leaf dims
    of the size-1 batch to put back inside vmap)."""
    leaves, spec = tree_flatten(tree)
    vmap_dims, batch_dims = list(dims), list(dims)
    for i, leaf in enumerate(leaves):
        if dims[i] == MERGED and blocks and blocks[i] is not None and isinstance(leaf, torch.Tensor):
            d, k = blocks[i]
            leaves[i] = leaf.unflatten(d, (-1, k))
            vmap_dims[i], batch_dims[i] = d, None
    return tree_unflatten(leaves, spec), vmap_dims, batch_dims
