"""What every command reads or writes: settings (config.py), checkpoints (checkpoint.py), ranked
tables (table.py, with jsonl.py and atomic.py), embeddings files (embeddings.py), outputs, names,
HTTP, object stores (remote.py). The pools' kinds are in alcli/pools/."""
