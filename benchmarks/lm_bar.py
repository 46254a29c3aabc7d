"""The language-model bar (issue 51, item 3): what gradnorm's selection costs against the
fine-tuning it saves, and whether its short-text bias is why its top-k lost to random.

The corpus, tokenizer, tiny GPT-2, pretraining and fine-tuning of benchmarks/lm_pruning.py (the
Python reference manual's paragraphs; pool 729, held-out 292; k = 15%), run one at a time on one
thread so that each is timed alone:

Times are CPU seconds (user + system, of this process or of the alcli subprocess), which a shared
machine's load does not stretch as it stretches wall time.

1. selection: `python -m alcli score POOL --task causal-lm -s gradnorm` and `-s loss` (a forward
   only), each a subprocess, start-up included; and a no-op run on one text (the start-up alone);
2. fine-tuning: the 40 steps of batch 16 that lm_pruning runs on the k chosen texts, and one epoch
   of the whole pool at the same batch (what training on everything costs per pass);
3. the length question: top-k by gradnorm (the mean-loss gradient's norm), by gradnorm x tokens
   (the norm of the summed loss's gradient: a text's token gradients added, not averaged), and by
   gradnorm within length (the pool cut into 5 bands of equal size by tokens, the top k/5 of each),
   against random, each fine-tuned as lm_pruning does, paired by seed.

    nice -n 10 python benchmarks/lm_bar.py [--seeds 5] [--out benchmarks/results/lm-bar-cpu-2core.txt]
    python benchmarks/lm_bar.py --quick          # tiny sizes (lm_pruning's QUICK), under a minute
"""
from __future__ import annotations

import argparse
import copy
import csv
import json
import resource
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import lm_pruning as lm  # noqa: E402

REPO = lm.REPO
BANDS = 5  # length bands for gradnorm within length


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def timed_score(pool: Path, base: Path, strategy: str, max_length: int, out: Path
                ) -> tuple[float, dict[str, float]]:
    """(CPU seconds, id -> score) of one `alcli score` run, alone."""
    t0 = children_cpu()
    proc = lm.alcli_score(pool, base, strategy, max_length, 1, out)
    lm.ranked_ids(proc, out)
    seconds = children_cpu() - t0
    with open(out, newline="") as f:
        return seconds, {r["id"]: float(r["score"]) for r in csv.DictReader(f)}


def within_length(scores: dict[str, float], tokens: dict[str, int], k: int) -> list[str]:
    """The top k/BANDS by score in each of BANDS equal-size bands of the pool by token count."""
    by_length = sorted(scores, key=lambda i: (tokens[i], i))
    bands = np.array_split(np.array(by_length), BANDS)
    quota = [k // BANDS + (b < k % BANDS) for b in range(BANDS)]
    return [i for band, q in zip(bands, quota)
            for i in sorted(band.tolist(), key=lambda i: -scores[i])[:q]]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--seeds", type=int)
    ap.add_argument("--out")
    args = ap.parse_args()
    torch.set_num_threads(1)
    from transformers.utils import logging
    logging.disable_progress_bar()
    s = dict(lm.QUICK if args.quick else lm.FULL)
    s["seeds"] = args.seeds or s["seeds"]
    work = Path(tempfile.mkdtemp(prefix="lm_bar_"))
    out = Path(args.out or (work / "lm-bar.txt" if args.quick
                            else REPO / "benchmarks" / "results" / "lm-bar-cpu-2core.txt"))

    paragraphs, _, _ = lm.corpus()
    slices = lm.split(paragraphs, s["pretrain"], s["heldout"], s["limit"])
    tok = lm.train_tokenizer(slices["pretrain"], s["vocab"], s["max_length"])
    pad = tok.pad_token_id
    seqs = {name: lm.encode(tok, texts) for name, texts in slices.items()}
    base = lm.build_model(tok, s)
    lm.train(base, seqs["pretrain"], s["pretrain_steps"], s["batch"], s["pretrain_lr"], 0, pad)
    base.save_pretrained(work / "base")
    tok.save_pretrained(work / "base")
    ids = [f"pool-{i:04d}" for i in range(len(slices["pool"]))]
    index = {i: n for n, i in enumerate(ids)}
    tokens = {i: len(seqs["pool"][index[i]]) - 1 for i in ids}        # predicted tokens per text
    with open(work / "pool.jsonl", "w") as f:
        f.writelines(json.dumps({"id": i, "text": t}) + "\n" for i, t in zip(ids, slices["pool"]))
    with open(work / "one.jsonl", "w") as f:
        f.write(json.dumps({"id": "one", "text": slices["pool"][0]}) + "\n")

    # 1. selection, each run alone
    seconds = {}
    seconds["start-up (1 text)"], _ = timed_score(work / "one.jsonl", work / "base", "loss",
                                                   s["max_length"], work / "one.csv")
    seconds["loss"], _ = timed_score(work / "pool.jsonl", work / "base", "loss", s["max_length"],
                                     work / "loss.csv")
    seconds["gradnorm"], grad = timed_score(work / "pool.jsonl", work / "base", "gradnorm",
                                            s["max_length"], work / "gradnorm.csv")
    k = max(1, round(len(ids) * s["budget"]))

    # 2. fine-tuning, timed: lm_pruning's fixed steps on k texts, and one epoch of the pool
    pool_seqs = [seqs["pool"][index[i]] for i in ids]
    t0 = time.process_time()
    lm.train(copy.deepcopy(base), pool_seqs[:k], s["steps"], s["batch"], s["lr"], 0, pad)
    seconds["fine-tune: steps on k"] = time.process_time() - t0
    epoch = -(-len(ids) // s["batch"])
    t0 = time.process_time()
    lm.train(copy.deepcopy(base), pool_seqs, epoch, s["batch"], s["lr"], 0, pad)
    seconds[f"fine-tune: 1 epoch of the pool ({epoch} steps)"] = time.process_time() - t0

    # 3. the length question
    top = lambda score: sorted(ids, key=lambda i: (-score[i], i))[:k]  # noqa: E731
    fixed = {"gradnorm top-k": top(grad),
             "gradnorm x tokens top-k": top({i: grad[i] * tokens[i] for i in ids}),
             "gradnorm within length": within_length(grad, tokens, k)}
    heldout: dict[str, list[float]] = {name: [] for name in [*fixed, "random"]}
    chosen_tokens = {name: float(np.mean([tokens[i] for i in sel])) for name, sel in fixed.items()}
    rand_tokens = []
    for seed in range(s["seeds"]):
        draw = sorted(np.random.default_rng(seed).choice(ids, k, replace=False).tolist())
        rand_tokens.append(np.mean([tokens[i] for i in draw]))
        for name in heldout:
            sel = fixed.get(name, draw)
            model = lm.train(copy.deepcopy(base), [seqs["pool"][index[i]] for i in sel],
                             s["steps"], s["batch"], s["lr"], seed, pad)
            heldout[name].append(lm.heldout_loss(model, seqs["heldout"], pad)[0])
            print(f"seed {seed} {name:24s} {heldout[name][-1]:.4f}", file=sys.stderr, flush=True)
    chosen_tokens["random"] = float(np.mean(rand_tokens))

    lines = [f"# python benchmarks/lm_bar.py{' --quick' if args.quick else ''}  ({lm.platform.python_version()}, "
             f"torch {torch.__version__}, 1 thread; lm_pruning's corpus and model: "
             f"{sum(p.numel() for p in base.parameters()):,} parameters, pool {len(ids)}, "
             f"k = {k}, {s['steps']} fine-tuning steps of batch {s['batch']})", "",
             "## compute, each run alone (CPU seconds, user + system: the machine was shared)", ""]
    lines += [f"{name:34s} {v:8.2f}" for name, v in seconds.items()]
    lines += ["", "## held-out loss after fine-tuning (mean over texts of each one's mean "
              "next-token loss); - random: paired by seed", "",
              f"{'selection':26s} {'tokens/text':>11s} {'held-out loss':>18s} {'- random':>18s} "
              f"{'p (paired t)':>12s}"]
    for name, v in heldout.items():
        if name == "random":
            diff = "·"
            p = "·"
        else:
            d, sd, pv = lm.paired_t(v, heldout["random"])
            diff, p = f"{d:+.4f} ± {sd:.4f}", f"{pv:.3g}"
        lines.append(f"{name:26s} {chosen_tokens[name]:11.1f} {lm.mean_sd(v):>18s} {diff:>18s} "
                     f"{p:>12s}")
    lines += ["", "per seed:"] + [f"  {name:26s} " + "  ".join(f"{x:.4f}" for x in v)
                                  for name, v in heldout.items()]
    text = "\n".join(lines) + "\n"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    Path(f"{out}.json").write_text(json.dumps({"settings": s, "k": k, "seconds": seconds,
                                               "heldout": heldout, "tokens": chosen_tokens,
                                               "chosen": fixed}, indent=1))
    print(text)


if __name__ == "__main__":
    main()
