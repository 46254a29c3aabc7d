"""Where the batch dimension lives in a module's inputs and outputs.

Used wherever a module is re-run one example at a time under `torch.func.vmap` (the generic
rule and the replicate method). Batch-first by default; modules with `batch_first=False`
(RNNs, MultiheadAttention) carry it in dim 1, and an RNN's hidden states always do.
"""
from __future__ import annotations

import torch
from torch import nn
from torch.utils._pytree import tree_map


def module_batch_dim(module: nn.Module) -> int:
    return 1 if getattr(module, "batch_first", True) is False else 0


def _leaf_dim(leaf, dim: int, batch: int):
    if isinstance(leaf, torch.Tensor) and leaf.dim() > dim and leaf.shape[dim] == batch:
        return dim
    return None


def input_batch_dims(module: nn.Module, args: tuple, kwargs: dict, batch: int):
    """in_dims pytrees for (args, kwargs): the batch dim of every batched tensor, else None."""
    dim = module_batch_dim(module)
    args_dims = list(tree_map(lambda leaf: _leaf_dim(leaf, dim, batch), tuple(args)))
    if isinstance(module, nn.RNNBase) and len(args) > 1:  # hx: [layers, B, H] (or a tuple of them)
        args_dims[1] = tree_map(lambda leaf: _leaf_dim(leaf, 1, batch), args[1])
    kwargs_dims = {}
    for key, value in kwargs.items():
        key_dim = 0 if key == "key_padding_mask" else (1 if key == "hx" else dim)
        kwargs_dims[key] = tree_map(lambda leaf: _leaf_dim(leaf, key_dim, batch), value)
    return tuple(args_dims), kwargs_dims


def output_batch_dims(module: nn.Module, output):
    """out_dims pytree matching `output`."""
    dim = module_batch_dim(module)
    if isinstance(module, nn.RNNBase) and isinstance(output, tuple):
        return (dim, tree_map(lambda _: 1, output[1]))
    if isinstance(module, nn.MultiheadAttention) and isinstance(output, tuple):
        return (dim, 0)  # (attn_output, attn_weights [B, T, S])
    return tree_map(lambda _: dim, output)


def unsqueeze_at(tree, dims):
    """Put back a size-1 batch dim on every leaf that had one (inside vmap the dim is gone)."""
    from torch.utils._pytree import tree_flatten, tree_unflatten
    leaves, spec = tree_flatten(tree)
    dim_leaves = broadcast_dims(dims, tree)
    out = [leaf.unsqueeze(d) if d is not None else leaf for leaf, d in zip(leaves, dim_leaves)]
    return tree_unflatten(out, spec)


def squeeze_at(tree, dims):
    from torch.utils._pytree import tree_flatten, tree_unflatten
    leaves, spec = tree_flatten(tree)
    dim_leaves = broadcast_dims(dims, tree)
    out = [leaf.squeeze(d) if d is not None and isinstance(leaf, torch.Tensor) else leaf
           for leaf, d in zip(leaves, dim_leaves)]
    return tree_unflatten(out, spec)


def broadcast_dims(dims, tree) -> list:
    """Flatten an in_dims/out_dims pytree to one entry per leaf of `tree` (an int covers a subtree)."""
    from torch.utils._pytree import tree_flatten
    if dims is None or isinstance(dims, int):
        return [dims] * len(tree_flatten(tree)[0])
    if isinstance(tree, dict):
        return [d for key in tree for d in broadcast_dims(dims[key], tree[key])]
    if isinstance(tree, (tuple, list)):
        return [d for sub_dims, sub in zip(dims, tree) for d in broadcast_dims(sub_dims, sub)]
    return [dims]
