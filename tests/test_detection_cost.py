"""benchmarks/detection_cost.py's measure: curves of different box counts compared on the range
every method covers, against a hand-worked example."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _load():
    spec = importlib.util.spec_from_file_location("detection_cost",
                                                  ROOT / "benchmarks" / "detection_cost.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_curves_are_compared_up_to_the_smallest_final_box_count():
    bench = _load()
    # B* = 20 (random's end). On [10, 20]: topk rises 0 -> 10 (mean 5, 10 at B*); cost rises
    # 0 -> 30 (mean 15, 30 at B*), its later point beyond B* unused; random is flat at 10.
    curves = {"topk": {"boxes": [10, 30], "map": [0.0, 20.0]},
              "cost": {"boxes": [10, 20, 40], "map": [0.0, 30.0, 0.0]},
              "random": {"boxes": [10, 20], "map": [10.0, 10.0]}}
    got = bench.on_common_range(curves)
    assert got["topk"] == pytest.approx((5.0, 10.0))
    assert got["cost"] == pytest.approx((15.0, 30.0))
    assert got["random"] == pytest.approx((10.0, 10.0))
