"""benchmarks/structured_curves.py's own measures: mAP@0.5 against a hand-worked example, the
constructed token task's tags against a hand-tagged line, macro F1 against scikit-learn's."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import benchmark_scripts


@pytest.fixture(scope="module")
def bench():
    return benchmark_scripts.load("structured_curves")


def _boxes(*b):
    return torch.tensor(b, dtype=torch.float32).reshape(-1, 4)


def test_mean_ap_at_half_iou_is_the_hand_worked_value(bench):
    truths = [{"boxes": _boxes([0, 0, 10, 10]), "labels": torch.tensor([1])},
              {"boxes": _boxes([0, 0, 10, 10], [20, 20, 30, 30], [40, 40, 50, 50]),
               "labels": torch.tensor([1, 1, 2])}]
    preds = [{"boxes": _boxes([0, 0, 10, 10], [0, 0, 10, 10]), "labels": torch.tensor([1, 1]),
              "scores": torch.tensor([0.9, 0.8])},          # a hit, then its duplicate: a miss
             {"boxes": _boxes([50, 50, 60, 60], [20, 20, 30, 30], [0, 0, 10, 10],
                              [40, 40, 50, 55.5]),
              "labels": torch.tensor([1, 1, 1, 2]), "scores": torch.tensor([0.75, 0.7, 0.65, 0.5])}]
    # class 1, 3 boxes; by score: hit, miss, miss, hit, hit -> recall 1/3, 1/3, 1/3, 2/3, 1 and
    # precision 1, 1/2, 1/3, 1/2, 3/5; the envelope (the best precision at that recall or more)
    # is 1 up to recall 1/3, then 3/5: AP = 1/3 + 2/3 * 3/5 = 11/15 (without the envelope,
    # 1/3 (1 + 1/2 + 3/5) = 7/10). Class 2's box [40, 40, 50, 50] against [40, 40, 50, 55.5]:
    # IoU 100 / 155 = 0.645, a hit: AP 1. The mean: (11/15 + 1) / 2 in points.
    assert bench.mean_ap(preds, truths, 3) == pytest.approx(100 * (11 / 15 + 1) / 2)
    # at IoU 0.7 class 2's box misses (0.645): AP 0
    assert bench.mean_ap(preds, truths, 3, iou=0.7) == pytest.approx(100 * (11 / 15 + 0) / 2)
    # a class with boxes but no predictions counts 0; a class in no image does not count
    assert bench.mean_ap(preds, truths, 4) == pytest.approx(100 * (11 / 15 + 1) / 2)
    bare = [{"boxes": _boxes(), "labels": torch.tensor([], dtype=torch.long),
             "scores": torch.tensor([])}] * 2
    assert bench.mean_ap(bare, truths, 3) == 0.0


def test_the_token_tags_follow_their_stated_rule(bench):
    tagged = bench._tag_tokens('class A:\n    def f(self, x):  # note\n        return x.y(1, "s")\n')
    tags = bench.TOKEN_TAGS
    assert [(s, tags[t]) for s, t in tagged] == [
        ("class", "keyword"), ("A", "defined"), (":", "op"),
        ("def", "keyword"), ("f", "defined"), ("(", "op"), ("self", "name"), (",", "op"),
        ("x", "name"), (")", "op"), (":", "op"),
        ("return", "keyword"), ("x", "name"), (".", "op"), ("y", "called"), ("(", "op"),
        ("<number>", "number"), (",", "op"), ("<string>", "string"), (")", "op")]


def test_macro_f1_is_scikit_learns(bench):
    from sklearn.metrics import f1_score
    g = torch.Generator().manual_seed(0)
    y = torch.randint(0, 4, (6, 24), generator=g)
    pred = torch.where(torch.rand(6, 24, generator=g) < 0.6, y, torch.randint(0, 5, (6, 24), generator=g))
    expected = f1_score(y.flatten().numpy(), pred.flatten().numpy(), labels=np.arange(4),
                        average="macro", zero_division=0)
    assert bench.macro_f1(pred, y, 8) == pytest.approx(100 * expected)
