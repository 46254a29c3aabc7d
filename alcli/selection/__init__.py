"""From a ranked table to a labeling batch: the order (rank.py), choosing (choose.py: top-k,
per-class quotas from balance.py, BADGE from diverse.py), exclusions (exclusions.py), the
`select` workflow (pick.py) and hand-offs (export.py)."""
