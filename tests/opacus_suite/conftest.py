"""The `opacus` group: Opacus' own grad-sample test configurations, checked with our oracle.

Run it with `python -m pytest -q tests/opacus_suite -s` (the -s shows counts per layer family and
method); ALCLI_OPACUS_FULL=1 draws 1000 fresh examples per test instead of the fixed 100. Leave
it out of a run with `-m "not opacus"`. It skips when opacus (or hypothesis) is not installed."""
import os
import tempfile


def pytest_configure(config):
    config.addinivalue_line("markers", "opacus: Opacus' grad-sample configurations vs our oracle")
    try:  # optional dependency; hypothesis keeps a cache in ./.hypothesis: keep the checkout clean
        from hypothesis.configuration import set_hypothesis_home_dir
    except ImportError:
        return
    set_hypothesis_home_dir(os.path.join(tempfile.gettempdir(), "alcli-hypothesis"))
