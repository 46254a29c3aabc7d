"""alcli: rank an unlabeled pool for labeling by exact per-example gradient norms.

Python API (the same work as the CLI, returning rows instead of printing):

    import alcli
    rows = alcli.score_pool("data/demo/pool", model="data/demo/model.pt", arch="alcli.demo:DigitsCNN",
                            transform={"normalize": {"mean": [0.3], "std": [0.4]}})
    batch = alcli.select(rows, 20)

docs/architecture.md maps the package.
"""
from .errors import AlcliError
from .version import __version__

__all__ = ["AlcliError", "__version__", "score_pool", "select", "tensor_pool"]


def score_pool(pool=None, model=None, *, config=None, arch=None, arch_kwargs=None,
               strategy=None, top_classes=None, layers=None, method=None, batch_size=None,
               device=None, workers=None, seed=None, labels_from_folders=None, transform=None,
               trust_checkpoint=None, embeddings=None, embeddings_file=None,
               **options) -> list[dict]:
    """Score every example of `pool` with `model`; the ranked rows (dicts, best first).

    pool: an image folder, image file, .csv/.jsonl manifest or .pt/.npy/.npz file (a path); or
        in-memory data: a tensor or array x, (x,), or (x, y) with integer labels y.
    model: a checkpoint path, or a torch.nn.Module.
    config: a YAML file read first; its relative paths are relative to its folder.
    arch, arch_kwargs: the architecture for a weights-only checkpoint ("torchvision:resnet18",
        "package.module:callable") and its constructor arguments.
    strategy: "egl" (default), "gradnorm", "loss", "entropy", "margin", "least-confidence",
        "random".  top_classes: egl over the K most probable classes only.
    layers: module-name patterns the gradient strategies are restricted to.
    method: the engine's "auto" (default), "ghost", "replicate", "vmap" or "loop".
    batch_size (64), device ("auto"), workers (0), seed (0), labels_from_folders,
    transform ({resize, center_crop, grayscale, normalize}),
    trust_checkpoint / trust_remote_code: run code that comes with the files (pickles,
        TorchScript, an arch module in the working directory; a Hugging Face directory's own
        code); never from a config file.
    embeddings / embeddings_file: also write BADGE embeddings.
    Any other config key is accepted as a keyword too; an unknown one is an AlcliError.
    Bad input raises AlcliError with a one-sentence message.
    """
    from .api import score_pool as _score_pool  # torch loads on first use, not on `import alcli`
    named = dict(arch=arch, arch_kwargs=arch_kwargs, strategy=strategy, top_classes=top_classes,
                 layers=layers, method=method, batch_size=batch_size, device=device,
                 workers=workers, seed=seed, labels_from_folders=labels_from_folders,
                 transform=transform, trust_checkpoint=trust_checkpoint, embeddings=embeddings,
                 embeddings_file=embeddings_file)
    options.update({k: v for k, v in named.items() if v is not None})
    return _score_pool(pool, model, config=config, **options)


def select(scores=None, budget=None, *, pool=None, model=None, config=None, diverse=None,
           diverse_candidates=None, per_class=None, exclude=None, exclude_files=None,
           embeddings_file=None, contact_sheet=None, image_dir=None, seed=None,
           **options) -> list[dict]:
    """The `budget` best rows of `scores` (ranked rows, or a table file), or of `pool` scored
    first with `model` (then every option of score_pool applies too).

    diverse: BADGE k-means++ among the best scores (needs embeddings: embeddings_file=, the
        table's TABLE.emb.npz, or a pool scored here).  diverse_candidates: shortlist size
        (default 10 x budget).  per_class: "proportional" or "equal".  exclude: ids never to
        select (any iterable of them).  exclude_files: exclusion files (a path or a list of
        them, as `alcli select --exclude` reads).  contact_sheet: a PNG grid of the batch is
        written there, images found under image_dir.  seed: for diverse picking.
    Bad input raises AlcliError with a one-sentence message.
    """
    from .api import select as _select  # torch loads on first use, not on `import alcli`
    named = dict(diverse=diverse, diverse_candidates=diverse_candidates, per_class=per_class,
                 exclude=exclude, exclude_files=exclude_files, embeddings_file=embeddings_file,
                 contact_sheet=contact_sheet, image_dir=image_dir, seed=seed)
    options.update({k: v for k, v in named.items() if v is not None})
    return _select(scores, budget, pool=pool, model=model, config=config, **options)


def tensor_pool(x, y=None, ids=None):
    """A pool from tensors or arrays: x [N, ...], optional labels y [N] (-1 = unknown) and ids of
    any type, which scored rows carry as given (alcli.pools.tensors.tensor_pool)."""
    from .pools.tensors import tensor_pool as _tensor_pool  # torch loads on first use
    return _tensor_pool(x, y, ids)
