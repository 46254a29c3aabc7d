"""Everything alcli reads or writes: settings (config.py), checkpoints (checkpoint.py), pools
(pool.py), ranked tables (table.py, with jsonl.py and atomic.py), embeddings files (embeddings.py)."""
