"""The benchmark scripts (benchmarks/NAME.py, not a package) as modules, for the tests that check
their parts."""
import importlib.util
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


def load(name: str):
    """benchmarks/NAME.py, run as module NAME (in sys.modules: a dataclass looks its module up)."""
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module
