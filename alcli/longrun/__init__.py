"""Long runs: the scoring job (job.py) with its partial file (partial.py) and final files
(finish.py), shards (shard.py) and `alcli merge` (merge.py), and torchrun (distributed.py)."""
