"""`-s align` beside `-s gradnorm` (and `-s loss`, the forward alone) on causal LMs at long texts:
the wall time and peak memory of whole `alcli score` runs, side by side, on the same pool (issue
54), for both of align's routes to g_i·ḡ (alcli/score/align.py). align computes the target's mean
gradient once (one backward per target batch), then per batch either
- ghost (the default): gradnorm's own backward, each layer's per-example gradient (dense or
  factored) dotted with ḡ's slice beside its norm; or
- jvp: one forward-mode pass along ḡ (attention on its math kernel), and gradnorm's pass for
  the norm (the route before issue 54's ghost inner products; `align.ROUTE = "jvp"`, set here
  in the child process).

Models built here from their configs (no download): GPT-2 small's shape (12 layers, d = 768,
12 heads; a 1,000-word vocabulary) and a tiny Llama (4 layers, d = 256). Texts: random words of a
word-level tokenizer, T tokens each; the target: two texts of T tokens.

    nice -n 10 python benchmarks/align.py [--out benchmarks/results/align-cpu-2core.txt]
    python benchmarks/align.py --quick       # T = 32 and 64, tiny models, ~1 min

Each run is a subprocess (`python -m alcli score`), its peak RSS sampled (benchmarks/_memory.py);
the time includes Python's and torch's start, the same for every strategy, and so does the
memory. Ratios: align / gradnorm, measured in one process tree, one after the other.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import random
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _memory import run_measured  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
WORDS = [f"w{i}" for i in range(995)]


def build(kind: str, positions: int, folder: Path, quick: bool, gpt2_layers: int = 12) -> None:
    import transformers as tf
    from tokenizers import Tokenizer, models, pre_tokenizers
    torch.manual_seed(0)
    vocab = ["[PAD]", "[UNK]", "[BOS]", "[EOS]", "[SEP]"] + WORDS
    if kind == "gpt2-small":
        width, layers, heads = (64, 2, 2) if quick else (768, gpt2_layers, 12)
        model = tf.GPT2LMHeadModel(tf.GPT2Config(vocab_size=len(vocab), n_embd=width, n_layer=layers,
                                                 n_head=heads, n_positions=positions, pad_token_id=0))
    else:
        width, layers, heads = (32, 2, 2) if quick else (256, 4, 4)
        model = tf.LlamaForCausalLM(tf.LlamaConfig(
            vocab_size=len(vocab), hidden_size=width, intermediate_size=width * 8 // 3,
            num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=heads,
            max_position_embeddings=positions, pad_token_id=0))
    model.save_pretrained(folder)
    core = Tokenizer(models.WordLevel({w: i for i, w in enumerate(vocab)}, unk_token="[UNK]"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    tok = tf.PreTrainedTokenizerFast(tokenizer_object=core, pad_token="[PAD]", unk_token="[UNK]",
                                     model_max_length=positions,
                                     model_input_names=["input_ids", "attention_mask"])
    tok.save_pretrained(folder)


def texts(n: int, length: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(length)) for _ in range(n)]


# `python -c JVP_ROUTE score ...`: alcli with align's labeled rows on the jvp route
JVP_ROUTE = ("import sys; import alcli.score.align as align; align.ROUTE = 'jvp'; "
             "from alcli.cli import main; sys.argv[0] = 'alcli'; main()")


def largest_difference(ghost: Path, jvp: Path) -> float:
    """The largest |score| difference between the two routes' tables, row by row."""
    import csv

    def scores(path):
        with open(path, newline="") as f:
            return {r["id"]: float(r["score"]) for r in csv.DictReader(f)}
    a, b = scores(ghost), scores(jvp)
    assert a.keys() == b.keys()
    return max(abs(a[i] - b[i]) for i in a)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--models", default="gpt2-small,llama-tiny", help="which of gpt2-small, llama-tiny, in order")
    ap.add_argument("--lengths", default="512:4,2048:2", help="T:texts in the pool, comma-separated")
    ap.add_argument("--no-loss", action="store_true", help="leave out the loss runs (the forward alone)")
    ap.add_argument("--gpt2-layers", type=int, default=12, help="GPT-2 small's width with this many of "
                    "its 12 layers (a machine without the memory for all 12 at T = 2,048)")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="align_bench_"))
    lengths = [(32, 4), (64, 2)] if args.quick else [tuple(map(int, x.split(":"))) for x in args.lengths.split(",")]
    out = Path(args.out or (work / "align.txt" if args.quick else
                            REPO / "benchmarks" / "results" / "align-cpu-2core.txt"))
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": str(args.threads),
           "TOKENIZERS_PARALLELISM": "false"}
    rows, started = [], time.perf_counter()
    runs = ["gradnorm", "align", "align-jvp"] if args.no_loss else ["loss", "gradnorm", "align", "align-jvp"]
    for kind in args.models.split(","):
        for length, n in lengths:
            folder = work / f"{kind}-{length}"
            build(kind, length + 8, folder, args.quick, args.gpt2_layers)
            (work / "pool.jsonl").write_text("".join(
                json.dumps({"id": f"t{i}", "text": t}) + "\n" for i, t in enumerate(texts(n, length - 2, 1))))
            (work / "target.jsonl").write_text("".join(
                json.dumps({"text": t}) + "\n" for t in texts(2, length - 2, 2)))
            got = {}
            for name in runs:
                strategy = name.split("-")[0]
                start = ["-c", JVP_ROUTE] if name == "align-jvp" else ["-m", "alcli"]
                cmd = [sys.executable, *start, "score", str(work / "pool.jsonl"), "-m", str(folder),
                       "--task", "causal-lm", "-s", strategy, "--max-length", str(length), "-b", "1",
                       "--no-embeddings", "-q", "-o", str(work / f"{name}.csv")]
                if strategy == "align":
                    cmd += ["--target", str(work / "target.jsonl")]
                t0 = time.perf_counter()
                proc, _, rss = run_measured(cmd, env, REPO)
                seconds = time.perf_counter() - t0
                if proc.returncode:
                    sys.exit(f"{' '.join(cmd[2:])} failed: {proc.stderr[-2000:]}")
                got[name] = (seconds, rss)
                print(f"{kind} T={length} {name}: {seconds:.1f} s, peak RSS {rss / 2**20:.0f} MiB",
                      file=sys.stderr, flush=True)
            got["max |ghost - jvp|"] = largest_difference(work / "align.csv", work / "align-jvp.csv")
            rows.append((kind, length, n, got))
            write_table(out, rows, args, started)  # after each row: a long run's rows so far are kept


def write_table(out: Path, rows: list, args, started: float) -> None:
    lines = [f"# python benchmarks/align.py{' --quick' if args.quick else ''}   ({args.threads} torch "
             f"threads, torch {torch.__version__}, python {platform.python_version()}, "
             f"{os.cpu_count()} CPUs)",
             "# whole `alcli score` runs (start included), one text per batch; align's target: 2 texts of T tokens",
             "# align: the ghost route (default); jvp: the forward-mode route; /gn: over gradnorm's",
             f"# gpt2-small: {args.gpt2_layers} of its 12 layers" if args.gpt2_layers != 12 else "#",
             "",
             f"{'model':12s} {'T':>5s} {'texts':>5s}  {'loss s':>7s} {'gn s':>6s} {'ghost s':>7s} {'jvp s':>6s} "
             f"{'ghost/gn':>8s} {'jvp/gn':>6s}  {'loss MiB':>8s} {'gn MiB':>6s} {'ghost MiB':>9s} {'jvp MiB':>7s} "
             f"{'ghost/gn':>8s} {'jvp/gn':>6s}  {'max |ghost-jvp|':>15s}"]
    for kind, length, n, got in rows:
        (ls, lm), (gs, gm), (as_, am), (js, jm) = (got.get(k, (float("nan"),) * 2) for k in
                                                   ("loss", "gradnorm", "align", "align-jvp"))
        lines.append(f"{kind:12s} {length:5d} {n:5d}  {ls:7.1f} {gs:6.1f} {as_:7.1f} {js:6.1f} "
                     f"{as_ / gs:8.2f} {js / gs:6.2f}  {lm / 2**20:8.0f} {gm / 2**20:6.0f} {am / 2**20:9.0f} "
                     f"{jm / 2**20:7.0f} {am / gm:8.2f} {jm / gm:6.2f}  {got['max |ghost - jvp|']:15.1e}")
    lines.append(f"\nwall time {time.perf_counter() - started:.0f} s")
    text = "\n".join(lines) + "\n"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
