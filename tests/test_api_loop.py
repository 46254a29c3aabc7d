"""The Python API serves a labeling loop without files: caller's ids, in-memory exclusions and
embeddings; the guide's loop example (docs/python-api.md) runs as written."""
import re
from pathlib import Path

import pytest
import torch
from torch import nn

import alcli
from alcli.errors import ConfigError

GUIDE = Path(__file__).resolve().parents[1] / "docs" / "python-api.md"


def _net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Flatten(), nn.Linear(12, 16), nn.ReLU(), nn.Linear(16, 4))


def test_three_rounds_with_caller_ids_never_select_twice():
    x = torch.randn(60, 12)
    ids = [1000 + 7 * i for i in range(60)]  # ints, not positions
    net, labeled = _net(), set()
    for round_ in range(3):
        rows = alcli.score_pool((x, None, ids), net, strategy="egl", embeddings=True)
        assert {r["id"] for r in rows} == set(ids) and all(type(r["id"]) is int for r in rows)
        batch = alcli.select(rows, 8, diverse=True, exclude=labeled or None, seed=round_)
        got = [r["id"] for r in batch]
        assert len(got) == 8 and all(type(i) is int for i in got)
        assert not labeled & set(got)  # never an id twice
        labeled |= set(got)
    assert len(labeled) == 24
    # in-memory exclusions that name nothing cannot pass silently
    with pytest.raises(ConfigError, match="argument exclude=.*none of the 1 entries.*'999'"):
        alcli.select(rows, 3, exclude={999})
    # classic BADGE over the whole pool
    every = alcli.select(rows, 5, diverse=True, diverse_candidates="all")
    assert len(every) == 5


def test_tensor_pool_ids_and_errors_name_arguments():
    pool = alcli.tensor_pool(torch.randn(5, 12), ids=[("a", 1), ("b", 2), ("c", 3), ("d", 4), ("e", 5)])
    rows = alcli.score_pool(pool, _net(), strategy="entropy")
    assert {r["id"] for r in rows} == {("a", 1), ("b", 2), ("c", 3), ("d", 4), ("e", 5)}
    default = alcli.score_pool((torch.randn(4, 12),), _net(), strategy="margin")
    assert sorted(r["id"] for r in default) == [0, 1, 2, 3]  # positions, as ints
    with pytest.raises(ConfigError, match="pass model=PATH"):
        alcli.score_pool((torch.randn(4, 12),))
    with pytest.raises(alcli.AlcliError, match="pool must be x, .*cannot be made a tensor"):
        alcli.score_pool(([torch.randn(3), "x"],), _net())
    with pytest.raises(ConfigError, match="embeddings_file=FILE"):
        alcli.select([{"id": "a", "score": 1.0}], 1, diverse=True)


def test_the_functions_returning_rows_refuse_output_file_options_instead_of_ignoring_them(tmp_path):
    with pytest.raises(ConfigError, match=r"score_pool\(\) returns the rows .* no output= argument"):
        alcli.score_pool((torch.randn(4, 12),), _net(), output=str(tmp_path / "t.csv"))
    with pytest.raises(ConfigError, match=r"select\(\) returns the rows .* no format= argument"):
        alcli.select([{"id": "a", "score": 1.0}], 1, format="jsonl")
    assert not list(tmp_path.iterdir())


def test_guide_loop_example_runs():
    text = GUIDE.read_text()
    block = re.search(r"<!-- loop-example[^>]*-->\n```python\n(.*?)```", text, re.S).group(1)
    assert len(block.strip().splitlines()) < 20
    scope: dict = {}
    exec(compile(block, "docs/python-api.md loop example", "exec"), scope)
    assert len(scope["labeled"]) == 80  # 20 + 3 rounds of 20, none twice
    assert scope["labeled"] <= set(scope["ids"])


class NoHead(nn.Module):
    """Logits from a bare parameter: no nn.Linear head to take BADGE embeddings from."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(1)
        self.w = nn.Parameter(torch.randn(12, 4))

    def forward(self, x):
        return x.flatten(1) @ self.w


def test_default_embeddings_and_diversity_step_aside_for_a_model_without_head():
    x = torch.randn(20, 12)
    rows = alcli.score_pool((x,), NoHead(), strategy="entropy")
    assert rows.embeddings is None  # recorded by default only where there is a head
    top = alcli.select(rows, 3)  # the default: diverse when embeddings are at hand, else top N
    assert [r["id"] for r in top] == [r["id"] for r in rows[:3]]
    with pytest.raises(ConfigError, match="diverse="):
        alcli.select(rows, 3, diverse=True)
    with_head = alcli.score_pool((x,), _net(), strategy="entropy")
    assert with_head.embeddings is not None and len(with_head.embeddings.ids) == 20
