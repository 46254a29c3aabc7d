"""Scoring: the batch loop (runner.py), the strategies that turn model outputs and gradient norms
into scores (strategies.py), BADGE embeddings recorded on the way (embeddings.py), and the checks
made before a run starts (preflight.py)."""
