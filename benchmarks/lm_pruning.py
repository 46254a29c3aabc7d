"""Data pruning for a small language model (issue 36): fine-tune on the top-k of the pool by alcli's
gradnorm, by loss, by alignment with the held-out texts' mean gradient (align, as LESS selects), on
the bottom-k by gradnorm, or on k random examples, at equal budget k, and
compare the held-out loss (5 seeds, paired differences against random).

Data that ships offline: the Python reference manual's text as the standard library ships it in
pydoc_data/topics.py (what `help("if")` shows). Its topics are cut into paragraphs (blocks between
blank lines, whitespace collapsed, at least 8 words, duplicates dropped) and split by the sha256 of
each paragraph's text into a pretraining slice, the pool and a held-out set, all disjoint.

The model: a byte-level BPE tokenizer trained (tokenizers) on the pretraining slice, a tiny GPT-2
pretrained briefly on that slice so that its gradients mean something, both saved with
save_pretrained into WORK/base. Then:
1. `python -m alcli score WORK/pool.jsonl -m WORK/base --task causal-lm -s gradnorm` (and `-s
   loss`), in a subprocess; the ranked CSVs give the top-k (and gradnorm's bottom-k).
2. Per seed and selection, a copy of the base model is fine-tuned for a fixed number of steps on the
   k chosen texts (the seed draws the order of the examples, dropout, and random's choice), and its
   held-out loss taken: the mean over held-out texts of each text's mean next-token cross-entropy
   (the per-example loss alcli scores), with the per-token mean beside it. `all` (the whole pool,
   same steps) is a reference, not at the budget.

    nice -n 10 python benchmarks/lm_pruning.py [--out benchmarks/results/lm-pruning-cpu-2core.txt]
    python benchmarks/lm_pruning.py --quick       # tiny sizes, < 60 s (output to a temp dir)
    nice -n 10 python benchmarks/lm_pruning.py --target-topic data-model

`--target-topic GROUP` (a family of the manual's topics, GROUPS): the same corpus, split and model;
the group's held-out paragraphs are cut in two (alternately, in sha256 order): the target
(topic_target.jsonl, align's `--target`) and the topic's test texts. The pool is ranked by align
with that target, by gradnorm and by loss; the fine-tuned copies are evaluated on the topic's test
texts and on the held-out texts of the other topics (the general loss); `topic` (k random texts of
the group from the pool: a selector that knows each text's topic) is a reference beside `all`.

Writes OUT (the table) and OUT.json (every number, the selections' ids, the settings).
"""
from __future__ import annotations

import argparse
import copy
import csv
import hashlib
import json
import math
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

REPO = Path(__file__).resolve().parents[1]
STRATEGIES = ("gradnorm", "loss", "align")  # align: with the held-out texts' mean gradient (LESS)
EOS = "<|endoftext|>"
MIN_WORDS = 8

FULL = dict(pretrain=0.3, heldout=0.2, limit=0, vocab=1024, max_length=128, layers=2, width=64,
            heads=4, pretrain_steps=250, pretrain_lr=3e-3, budget=0.15, steps=40, batch=16,
            lr=1e-3, seeds=5)
QUICK = dict(FULL, limit=150, vocab=320, max_length=32, layers=1, width=32, heads=2,
             pretrain_steps=30, budget=0.2, steps=10, batch=8, seeds=2)


# --target-topic's families of the manual's topics (pydoc_data.topics' keys)
GROUPS = {
    "data-model": ("attribute-access", "callable-types", "context-managers", "customization",
                   "numeric-types", "sequence-types", "specialattrs", "specialnames"),
    "statements": ("assert", "assignment", "async", "augassign", "break", "class", "compound",
                   "continue", "del", "else", "for", "function", "global", "if", "import",
                   "nonlocal", "pass", "raise", "return", "try", "while", "with", "yield"),
}


def corpus() -> tuple[list[str], dict[str, str], str]:
    """The paragraphs of the reference manual's topics (sorted by topic name), each one's topic
    (the first that holds it), and its file."""
    from pydoc_data import topics
    topic_of: dict[str, str] = {}
    for name in sorted(topics.topics):
        for block in re.split(r"\n\s*\n", topics.topics[name]):
            text = " ".join(block.split())
            if len(text.split()) >= MIN_WORDS:
                topic_of.setdefault(text, name)
    return list(topic_of), topic_of, topics.__file__


def topic_split(heldout: list[str], topic_of: dict[str, str], group: str) -> dict[str, list[str]]:
    """--target-topic: the group's held-out paragraphs, alternately, as the target and the topic's
    test texts; the other held-out paragraphs as the general test texts."""
    topical = [t for t in heldout if topic_of[t] in GROUPS[group]]
    if len(topical) < 2:
        sys.exit(f"--target-topic {group}: {len(topical)} held-out paragraph(s) of the group; "
                 f"a target and a test text need 2")
    return {"target": topical[::2], "topic": topical[1::2],
            "general": [t for t in heldout if topic_of[t] not in GROUPS[group]]}


def split(paragraphs: list[str], pretrain: float, heldout: float, limit: int) -> dict[str, list[str]]:
    """Disjoint slices in the order of sha256(text): deterministic, independent of topic order.
    `limit` > 0 keeps only the first `limit` paragraphs of that order (--quick)."""
    ordered = sorted(paragraphs, key=lambda t: hashlib.sha256(t.encode()).hexdigest())
    if limit:
        ordered = ordered[:limit]
    a = round(len(ordered) * pretrain)
    b = len(ordered) - round(len(ordered) * heldout)
    return {"pretrain": ordered[:a], "pool": ordered[a:b], "heldout": ordered[b:]}


def train_tokenizer(texts: list[str], vocab: int, max_length: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast
    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    core.train_from_iterator(texts, trainers.BpeTrainer(
        vocab_size=vocab, special_tokens=[EOS], initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False))
    return PreTrainedTokenizerFast(tokenizer_object=core, eos_token=EOS, pad_token=EOS,
                                   model_max_length=max_length,
                                   model_input_names=["input_ids", "attention_mask"])


def build_model(tok, s: dict):
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config(
        vocab_size=len(tok), n_positions=s["max_length"], n_embd=s["width"], n_layer=s["layers"],
        n_head=s["heads"], bos_token_id=tok.eos_token_id, eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id))


def encode(tok, texts: list[str]) -> list[list[int]]:
    return tok(texts, truncation=True)["input_ids"]


def losses(model, seqs: list[list[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per text: (mean next-token cross-entropy, number of predicted tokens), [B] each. Padded
    on the right, so the real tokens keep their positions."""
    t = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), t), pad)
    mask = torch.zeros(len(seqs), t)
    for i, s in enumerate(seqs):
        ids[i, :len(s)] = torch.tensor(s)
        mask[i, :len(s)] = 1
    logits = model(input_ids=ids, attention_mask=mask.long()).logits                # [B, T, V]
    ce = F.cross_entropy(logits[:, :-1].transpose(1, 2), ids[:, 1:], reduction="none")  # [B, T-1]
    counted = mask[:, 1:]                                                          # token t predicted from t-1
    n = counted.sum(1)
    return (ce * counted).sum(1) / n, n


def train(model, seqs: list[list[int]], steps: int, batch: int, lr: float, seed: int, pad: int):
    """`steps` AdamW steps on the mean per-text loss of batches drawn in seeded epochs."""
    torch.manual_seed(seed)                      # dropout
    order = np.random.default_rng(seed)
    stream: list[int] = []
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    model.train()
    for _ in range(steps):
        while len(stream) < batch:
            stream.extend(order.permutation(len(seqs)).tolist())
        chosen, stream = stream[:batch], stream[batch:]
        loss = losses(model, [seqs[i] for i in chosen], pad)[0].mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model.eval()


@torch.no_grad()
def heldout_loss(model, seqs: list[list[int]], pad: int) -> tuple[float, float]:
    """(mean over texts of each one's mean loss, mean over all predicted tokens)."""
    model.eval()
    per_text, counts = [], []
    for i in range(0, len(seqs), 64):
        loss, n = losses(model, seqs[i:i + 64], pad)
        per_text.append(loss.double())
        counts.append(n.double())
    per_text, counts = torch.cat(per_text), torch.cat(counts)
    return per_text.mean().item(), ((per_text * counts).sum() / counts.sum()).item()


def alcli_score(pool: Path, model_dir: Path, strategy: str, max_length: int, threads: int,
                out: Path, target: Path | None = None) -> subprocess.Popen:
    """`python -m alcli score` of the pool into `out`, started (the strategies run side by side);
    align's target is the held-out texts."""
    aligned = ["--target", str(target)] if strategy == "align" else []
    return subprocess.Popen([sys.executable, "-m", "alcli", "score", str(pool), "-m", str(model_dir),
                             "--task", "causal-lm", "-s", strategy, *aligned, "--max-length", str(max_length),
                             "-b", "32", "-q", "-o", str(out)], cwd=REPO, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": str(threads)})


def ranked_ids(proc: subprocess.Popen, out: Path) -> list[str]:
    """The pool's ids in alcli's ranked order (best score first), once its run has finished."""
    _, err = proc.communicate()
    if proc.returncode:
        sys.exit(f"{' '.join(proc.args[2:])} failed: {err.strip()[-2000:]}")
    with open(out, newline="") as f:
        rows = list(csv.DictReader(f))
    assert all(math.isfinite(float(r["score"])) for r in rows), f"{out}: a score is not finite"
    return [r["id"] for r in rows]


def paired_t(a: list[float], b: list[float]) -> tuple[float, float, float]:
    """Two-sided paired t-test of a vs b over seeds: (mean of a - b, its sd, p); p = 1 when undefined."""
    from scipy import stats
    d = np.array(a) - np.array(b)
    if len(d) < 2 or np.allclose(d, d[0]):
        return float(d.mean()), 0.0, 1.0
    return float(d.mean()), float(d.std(ddof=1)), float(stats.ttest_rel(a, b).pvalue)


def mean_sd(xs: list[float]) -> str:
    return f"{statistics.mean(xs):.4f} ± {statistics.stdev(xs) if len(xs) > 1 else 0.0:.4f}"


def report(r: dict) -> str:
    s, n = r["settings"], r["sizes"]
    k = r["k"]
    lines = [
        f"# python benchmarks/lm_pruning.py{' --quick' if r['quick'] else ''}   ({r['machine']})",
        f"# corpus: the Python {platform.python_version()} reference manual's topics as the standard "
        f"library ships them ({r['corpus_file']}), {n['paragraphs']} paragraphs",
        f"#   (blank-line blocks, whitespace collapsed, >= {MIN_WORDS} words, duplicates dropped), "
        f"split by sha256 of the text: pretrain {n['pretrain']}, pool {n['pool']}, held-out {n['heldout']}",
        f"# tokenizer: byte-level BPE, {r['vocab']} tokens, trained on the pretraining slice; texts cut "
        f"at {s['max_length']} tokens",
        f"# model: GPT-2, {s['layers']} layers, d={s['width']}, {s['heads']} heads, {r['parameters']:,} "
        f"parameters; pretrained {s['pretrain_steps']} steps (batch {s['batch']}, AdamW {s['pretrain_lr']:g}) "
        f"on the pretraining slice ({r['pretrain_s']:.0f} s)",
        f"# scores: python -m alcli score pool.jsonl -m base --task causal-lm -s gradnorm, -s loss and "
        f"-s align --target heldout.jsonl (LESS's choice: the cosine with the held-out texts' mean "
        f"gradient), side by side ({r['alcli_s']:.0f} s, startup included)",
        f"# budget k = {k} ({s['budget']:.0%} of the pool); fine-tuning a copy of the base model: "
        f"{s['steps']} steps, batch {s['batch']}, AdamW {s['lr']:g}, dropout 0.1; {s['seeds']} seeds "
        f"(order, dropout, random's choice)",
        f"# held-out loss: the mean over the {n['heldout']} held-out texts of each one's mean "
        f"next-token cross-entropy (per token: over all their tokens); base model before fine-tuning: "
        f"{r['base'][0]:.4f} (per token {r['base'][1]:.4f})",
        "",
        f"{'selection':20s} {'tokens/text':>11s}  {'held-out loss':>17s}  {'- random':>17s}  "
        f"{'p (paired t)':>12s}  {'per token':>17s}  {'- random':>9s}",
    ]
    for name, runs in r["heldout"].items():
        per_text = [x[0] for x in runs]
        per_token = [x[1] for x in runs]
        d, sd, p = paired_t(per_text, [x[0] for x in r["heldout"]["random"]])
        dt = paired_t(per_token, [x[1] for x in r["heldout"]["random"]])[0]
        vs = "·" if name == "random" else f"{d:+.4f} ± {sd:.4f}"
        pv = "·" if name == "random" else f"{p:.3g}"
        dts = "·" if name == "random" else f"{dt:+.4f}"
        lines.append(f"{r['labels'][name]:20s} {r['tokens'][name]:11.1f}  {mean_sd(per_text):>17s}  "
                     f"{vs:>17s}  {pv:>12s}  {mean_sd(per_token):>17s}  {dts:>9s}")
    lines += ["", "mean ± sample sd over seeds; - random: paired difference (negative: lower "
              "held-out loss than random); tokens/text: mean predicted tokens per chosen text",
              f"top-k overlap: gradnorm and loss share {r['overlap']} of {k}; Spearman's rho of the "
              f"two scores over the pool {r['rho']:.3f}",
              "", "per seed (held-out loss per text):"]
    for name, runs in r["heldout"].items():
        lines.append(f"  {r['labels'][name]:20s} " + "  ".join(f"{x[0]:.4f}" for x in runs))
    lines.append(f"\nwall time {r['wall_s']:.0f} s")
    return "\n".join(lines) + "\n"


def topic_report(r: dict) -> str:
    """--target-topic's table: per selection, how many chosen texts are the topic's, and the loss
    on the topic's test texts and on the other topics' held-out texts, paired against random."""
    s, n, k, sizes = r["settings"], r["sizes"], r["k"], r["eval_sizes"]
    lines = [
        f"# python benchmarks/lm_pruning.py --target-topic {r['group']}{' --quick' if r['quick'] else ''}"
        f"   ({r['machine']})",
        f"# corpus, split, tokenizer and model as benchmarks/lm_pruning.py: {n['paragraphs']} paragraphs "
        f"of {r['corpus_file']}; pretrain {n['pretrain']}, pool {n['pool']}, held-out {n['heldout']}; "
        f"GPT-2 {s['layers']} layers, d={s['width']}, {r['parameters']:,} parameters, pretrained "
        f"{s['pretrain_steps']} steps ({r['pretrain_s']:.0f} s)",
        f"# topic group {r['group']}: the paragraphs of {', '.join(r['topics'])}",
        f"#   in the pool: {r['pool_in_group']} of {n['pool']}; its {sizes['target'] + sizes['topic']} "
        f"held-out paragraphs cut alternately into the target ({sizes['target']}, align's --target "
        f"topic_target.jsonl) and the topic's test texts ({sizes['topic']}); general: the "
        f"{sizes['general']} held-out paragraphs of the other topics",
        f"# scores: python -m alcli score pool.jsonl -m base --task causal-lm -s gradnorm, -s loss and "
        f"-s align --target topic_target.jsonl, side by side ({r['alcli_s']:.0f} s, startup included)",
        f"# budget k = {k} ({s['budget']:.0%} of the pool); fine-tuning a copy of the base model: "
        f"{s['steps']} steps, batch {s['batch']}, AdamW {s['lr']:g}, dropout 0.1; {s['seeds']} seeds "
        f"(order, dropout, random's and topic's choice)",
        f"# loss: the mean over texts of each one's mean next-token cross-entropy; base model: topic "
        f"{r['base_by_eval']['topic'][0]:.4f}, general {r['base_by_eval']['general'][0]:.4f}",
        "",
        f"{'selection':20s} {'tokens/text':>11s} {'topic texts':>11s}  {'topic loss':>15s}  "
        f"{'- random':>17s}  {'p':>8s}  {'general loss':>15s}  {'- random':>17s}  {'p':>8s}",
    ]
    for name in r["labels"]:
        row = f"{r['labels'][name]:20s} {r['tokens'][name]:11.1f} {r['in_topic'][name]:11.1f}"
        for e in ("topic", "general"):
            mine = [x[0] for x in r[e][name]]
            d, sd, p = paired_t(mine, [x[0] for x in r[e]["random"]])
            vs, pv = ("·", "·") if name == "random" else (f"{d:+.4f} ± {sd:.4f}", f"{p:.3g}")
            row += f"  {mean_sd(mine):>15s}  {vs:>17s}  {pv:>8s}"
        lines.append(row)
    lines += ["", "mean ± sample sd over seeds; - random: paired difference (negative: lower loss "
              "than random), p: paired t-test; tokens/text: mean predicted tokens per chosen text; "
              "topic texts: how many of the chosen texts are the group's (mean over seeds)",
              "", "per seed (topic loss per text):"]
    for name in r["labels"]:
        lines.append(f"  {r['labels'][name]:20s} " + "  ".join(f"{x[0]:.4f}" for x in r["topic"][name]))
    lines.append(f"\nwall time {r['wall_s']:.0f} s")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="tiny sizes, < 60 s")
    ap.add_argument("--out", help="the table (and OUT.json); default: a temp dir under --quick, "
                    "else benchmarks/results/lm-pruning-cpu-2core.txt (lm-pruning-topic-GROUP-"
                    "cpu-2core.txt with --target-topic)")
    ap.add_argument("--work", help="folder for the model, pools and CSVs [default: a temp dir]")
    ap.add_argument("--seeds", type=int)
    ap.add_argument("--steps", type=int)
    ap.add_argument("--budget", type=float, help="k as a fraction of the pool")
    ap.add_argument("--target-topic", choices=sorted(GROUPS), help="align toward one family of "
                    "topics (its held-out half as the target), evaluated on that topic")
    ap.add_argument("--threads", type=int, default=1, help="torch threads, here and in alcli "
                    "(OMP_NUM_THREADS); on a shared 2-core machine 2 threads ran 15x slower than 1")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from transformers.utils import logging
    logging.disable_progress_bar()
    s = dict(QUICK if args.quick else FULL)
    s.update({key: getattr(args, key) for key in ("seeds", "steps", "budget") if getattr(args, key)})
    group = args.target_topic
    start = time.perf_counter()
    work = Path(args.work or tempfile.mkdtemp(prefix="lm_pruning_"))
    work.mkdir(parents=True, exist_ok=True)
    name = f"lm-pruning-topic-{group}-cpu-2core.txt" if group else "lm-pruning-cpu-2core.txt"
    out = Path(args.out or (work / name if args.quick else REPO / "benchmarks" / "results" / name))

    paragraphs, topic_of, corpus_file = corpus()
    slices = split(paragraphs, s["pretrain"], s["heldout"], s["limit"])
    # the texts each fine-tuned copy is evaluated on, and align's target
    evals = topic_split(slices["heldout"], topic_of, group) if group else {"heldout": slices["heldout"]}
    target_texts = evals.pop("target") if group else slices["heldout"]
    tok = train_tokenizer(slices["pretrain"], s["vocab"], s["max_length"])
    pad = tok.pad_token_id
    seqs = {name: encode(tok, texts) for name, texts in {**slices, **evals}.items()}
    base = build_model(tok, s)
    t0 = time.perf_counter()
    train(base, seqs["pretrain"], s["pretrain_steps"], s["batch"], s["pretrain_lr"], 0, pad)
    pretrain_s = time.perf_counter() - t0
    base.save_pretrained(work / "base")
    tok.save_pretrained(work / "base")

    ids = [f"pool-{i:04d}" for i in range(len(slices["pool"]))]
    index = {i: n for n, i in enumerate(ids)}
    with open(work / "pool.jsonl", "w") as f:
        f.writelines(json.dumps({"id": i, "text": t}) + "\n" for i, t in zip(ids, slices["pool"]))
    target = work / ("topic_target.jsonl" if group else "heldout.jsonl")
    with open(target, "w") as f:
        f.writelines(json.dumps({"text": t}) + "\n" for t in target_texts)
    t0 = time.perf_counter()
    runs = {strategy: alcli_score(work / "pool.jsonl", work / "base", strategy, s["max_length"],
                                  args.threads, work / f"{strategy}.csv", target)
            for strategy in STRATEGIES}
    ranked = {strategy: ranked_ids(proc, work / f"{strategy}.csv") for strategy, proc in runs.items()}
    alcli_s = time.perf_counter() - t0
    k = max(1, round(len(ids) * s["budget"]))
    in_group = [i for i, t in zip(ids, slices["pool"]) if group and topic_of[t] in GROUPS[group]]
    fixed = {"gradnorm": ranked["gradnorm"][:k], "loss": ranked["loss"][:k],
             "align": ranked["align"][:k], "gradnorm-bottom": ranked["gradnorm"][-k:], "all": ids}
    labels = {"gradnorm": "gradnorm top-k", "loss": "loss top-k", "align": "align top-k",
              "gradnorm-bottom": "gradnorm bottom-k", "random": "random", "all": "all pool (reference)"}
    drawn = {"random": ids}
    if group:  # the topic's own pool texts, drawn at random: a selector that knows the topic
        del labels["gradnorm-bottom"]
        labels = {**labels, "topic": "topic texts (oracle)"}
        drawn["topic"] = in_group
    chosen = {name: [fixed[name]] * s["seeds"] if name in fixed else
              [sorted(np.random.default_rng(seed).choice(drawn[name], min(k, len(drawn[name])),
                                                         replace=False).tolist())
               for seed in range(s["seeds"])] for name in labels}

    scores = {e: {name: [] for name in labels} for e in evals}
    for seed in range(s["seeds"]):
        for name in labels:
            texts = [seqs["pool"][index[i]] for i in chosen[name][seed]]
            model = train(copy.deepcopy(base), texts, s["steps"], s["batch"], s["lr"], seed, pad)
            for e in evals:
                scores[e][name].append(heldout_loss(model, seqs[e], pad))
            print(f"seed {seed} {name:16s} " + " ".join(f"{e} {scores[e][name][-1][0]:.4f}" for e in evals),
                  file=sys.stderr, flush=True)

    from scipy.stats import spearmanr
    by_id = {}
    for strategy in STRATEGIES:
        with open(work / f"{strategy}.csv", newline="") as f:
            by_id[strategy] = {row["id"]: float(row["score"]) for row in csv.DictReader(f)}
    result = {
        "quick": args.quick, "settings": s, "corpus_file": corpus_file, "work": str(work), "k": k,
        "machine": f"{torch.get_num_threads()} torch thread(s), torch {torch.__version__}, "
                   f"transformers {__import__('transformers').__version__}, python {platform.python_version()}",
        "sizes": {"paragraphs": len(paragraphs), **{n: len(t) for n, t in slices.items()}},
        "vocab": len(tok), "parameters": sum(p.numel() for p in base.parameters()),
        "pretrain_s": pretrain_s, "alcli_s": alcli_s,
        "base": heldout_loss(base, seqs["heldout"], pad),
        "labels": labels, "chosen": chosen, **scores,
        "tokens": {name: statistics.mean(len(seqs["pool"][index[i]]) - 1 for sel in chosen[name] for i in sel)
                   for name in labels},
        "overlap": len(set(fixed["gradnorm"]) & set(fixed["loss"])),
        "rho": float(spearmanr([by_id["gradnorm"][i] for i in ids], [by_id["loss"][i] for i in ids])[0]),
    }
    if group:
        result.update(group=group, topics=GROUPS[group], pool_in_group=len(in_group),
                      eval_sizes={"target": len(target_texts), **{e: len(t) for e, t in evals.items()}},
                      base_by_eval={e: heldout_loss(base, seqs[e], pad) for e in evals},
                      in_topic={name: statistics.mean(len(set(sel) & set(in_group)) for sel in chosen[name])
                                for name in labels})
    result["wall_s"] = time.perf_counter() - start
    text = topic_report(result) if group else report(result)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    Path(f"{out}.json").write_text(json.dumps(result, indent=1))
    print(text)


if __name__ == "__main__":
    main()
