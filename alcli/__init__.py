"""alcli: rank an unlabeled pool for labeling by exact per-example gradient norms.

Python API (the same work as the CLI, returning rows instead of printing):

    import alcli
    rows = alcli.score_pool("data/demo/pool", model="data/demo/model.pt", arch="alcli.demo:DigitsCNN",
                            transform={"normalize": {"mean": [0.3], "std": [0.4]}})
    batch = alcli.select(rows, 20)

docs/architecture.md maps the package.
"""
from .errors import AlcliError

__version__ = "0.2.0"
__all__ = ["AlcliError", "__version__", "score_pool", "select"]


def score_pool(pool=None, model=None, *, config=None, **options):
    """Score every example of `pool` with `model`; the ranked rows, best first (see alcli.api)."""
    from .api import score_pool as _score_pool  # torch loads on first use, not on `import alcli`
    return _score_pool(pool, model, config=config, **options)


def select(scores=None, budget=None, *, pool=None, model=None, config=None, **options):
    """The `budget` best rows of `scores` (rows or a table file), or of `pool` scored first."""
    from .api import select as _select  # torch loads on first use, not on `import alcli`
    return _select(scores, budget, pool=pool, model=model, config=config, **options)
