"""`select --diverse-mode cluster-margin` (alcli.selection.cluster_margin): against a numpy float64
re-implementation written from the paper's steps, the round-robin order on given clusters, its
bounded memory (no block larger than chunk x m while clustering), and through the CLI."""
from __future__ import annotations

import csv

import numpy as np
import pytest
import torch
from torch.overrides import TorchFunctionMode

from shell import completed_in

from alcli.selection.cluster_margin import kmeans, round_robin, select_cluster_margin


# --- the oracle: one row and one center at a time, float64 ----------------------------------------

def oracle_kmeans(x, m, seed, iters=10, seed_rows=4096):
    x = np.asarray(x, dtype=np.float64)
    x = x - x.mean(0)
    rng = np.random.default_rng(seed)
    s = max(seed_rows, 2 * m)
    rows = sorted(rng.choice(len(x), s, replace=False)) if s < len(x) else list(range(len(x)))
    chosen = [rows[int(rng.integers(len(rows)))]]
    while len(chosen) < m:  # k-means++ among `rows`: D² to the nearest chosen row, one at a time
        d2 = np.array([min(float(((x[r] - x[c]) ** 2).sum()) for c in chosen) for r in rows])
        u = rng.random() * d2.sum()
        chosen.append(next(r for i, r in enumerate(rows) if d2[:i + 1].sum() > u))
    centers = x[chosen].copy()
    labels = None
    for _ in range(iters):
        new = []
        for row in x:
            d = [float(((row - c) ** 2).sum()) for c in centers]
            new.append(d.index(min(d)))
        if new == labels:
            break
        labels = new
        for c in range(m):
            members = [x[i] for i in range(len(x)) if labels[i] == c]
            if members:
                centers[c] = np.mean(members, axis=0)
    return labels


def oracle_round_robin(labels, budget):
    """Clusters sorted by (size, best position); passes over them, one unpicked row each."""
    clusters = sorted(set(labels), key=lambda c: (labels.count(c), labels.index(c)))
    queues = {c: [p for p, l in enumerate(labels) if l == c] for c in clusters}
    picks = []
    while len(picks) < min(budget, len(labels)):
        for c in clusters:
            if queues[c] and len(picks) < budget:
                picks.append(queues[c].pop(0))
    return picks


def oracle_batch(ids, scores, x, budget, seed, km, m):
    order = sorted(range(len(ids)), key=lambda i: (-scores[i], ids[i]))[:km]
    labels = oracle_kmeans(x[order], m, seed)
    return {ids[order[p]] for p in oracle_round_robin(labels, budget)}


def planted(sizes=(40, 25, 12, 6), dim=4, seed=0):
    """Blobs of the given sizes, std 1, centers 50 apart, interleaved: rows, blob of each."""
    rng = np.random.default_rng(seed)
    centers = rng.normal(size=(len(sizes), dim)) * 50
    x = np.concatenate([c + rng.normal(size=(s, dim)) for c, s in zip(centers, sizes)])
    blob = np.repeat(np.arange(len(sizes)), sizes)
    order = rng.permutation(len(x))
    return x[order], blob[order]


# --- tests -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("budget,km,m,seed", [(6, 83, 4, 0), (10, 60, 3, 1), (5, 50, 5, 2),
                                               (9, 83, 12, 3)])
def test_batch_matches_the_oracle_on_planted_clusters(budget, km, m, seed):
    x, _ = planted()
    n = len(x)
    ids = [f"r{i:03d}" for i in range(n)]
    scores = np.random.default_rng(7).random(n).round(2).tolist()  # ties: broken by id
    got = select_cluster_margin(ids, scores, torch.tensor(x, dtype=torch.float32), budget, seed,
                                candidates=km, clusters=m, chunk=5)
    assert set(got) == oracle_batch(ids, scores, x, budget, seed, km, m)
    assert got == sorted(got, key=lambda i: (-scores[ids.index(i)], i))  # best score first
    # the input order does not matter
    perm = np.random.default_rng(1).permutation(n)
    again = select_cluster_margin([ids[i] for i in perm], [scores[i] for i in perm],
                                  torch.tensor(x[perm], dtype=torch.float32), budget, seed,
                                  candidates=km, clusters=m)
    assert again == got


@pytest.mark.parametrize("m,seed_rows,seed", [(4, 10, 0), (6, 30, 1), (3, 4096, 2)])
def test_kmeans_seeded_on_sampled_rows_matches_the_oracle(m, seed_rows, seed):
    """k-means++ among a seeded sample of the rows (the large-k_m path), then Lloyd on all."""
    x, _ = planted()
    got = kmeans(torch.tensor(x), m, seed, seed_rows=seed_rows, chunk=9).tolist()
    assert got == oracle_kmeans(x, m, seed, seed_rows=seed_rows)


def test_planted_blobs_are_found_and_covered_smallest_first():
    """4 blobs as 4 clusters: a batch of 6 takes one row of each blob, then the next rows of the
    two smallest; each blob's rows best score first."""
    x, blob = planted()
    n = len(x)
    ids = [f"r{i:03d}" for i in range(n)]
    scores = np.random.default_rng(3).random(n)
    order = np.argsort(-scores)  # the shortlist's order, which the first centers are drawn from
    labels, blob = kmeans(torch.tensor(x[order]), 4, seed=0).numpy(), blob[order]
    # the clusters are the blobs (one label per blob, four labels)
    assert {(int(b), int(l)) for b, l in zip(blob, labels)} == {(b, int(labels[blob == b][0]))
                                                                   for b in range(4)}
    assert len(set(labels.tolist())) == 4
    got = select_cluster_margin(ids, scores, torch.tensor(x), 6, seed=0, candidates=n, clusters=4)
    want = []
    for b in range(4):  # each blob's best-scoring rows
        rows = order[blob == b]  # best score first
        want += [ids[i] for i in rows[:2 if b >= 2 else 1]]  # blobs 2, 3 are the smallest
    assert set(got) == set(want)


def test_round_robin_order_smallest_cluster_first_one_per_pass():
    # positions 0..9 in score order; clusters: 7 -> {0, 4, 5, 9}, 3 -> {1, 6}, 8 -> {2, 3, 7}, 5 -> {8}
    labels = [7, 3, 8, 8, 7, 7, 3, 8, 5, 7]
    assert round_robin(labels, 10) == [8, 1, 2, 0, 6, 3, 4, 7, 5, 9]
    assert round_robin(labels, 5) == [8, 1, 2, 0, 6]
    # equal sizes: the cluster whose best row ranks first goes first
    assert round_robin([1, 0, 0, 1], 4) == [0, 1, 3, 2]
    for seed in range(5):
        rand = np.random.default_rng(seed).integers(0, 6, size=40).tolist()
        assert round_robin(rand, 23) == oracle_round_robin(rand, 23)


class LargestTensor(TorchFunctionMode):
    """Records the largest tensor any torch function returns (real torch: nothing replaced)."""

    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if isinstance(out, torch.Tensor):
            self.largest = max(self.largest, out.numel())
        return out


def test_clustering_never_holds_a_candidates_x_clusters_block():
    n, d, m, chunk = 3000, 3, 200, 64
    x = torch.randn(n, d, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    with LargestTensor() as seen:
        labels = kmeans(x, m, seed=0, chunk=chunk, max_iters=3)
    assert seen.largest <= max(chunk * m, n * d)  # the [chunk, m] block, or x itself
    assert seen.largest < n * m // 10
    # the chunk changes nothing but memory
    assert torch.equal(labels, kmeans(x, m, seed=0, chunk=n, max_iters=3))


def alcli(*args, cwd):
    return completed_in(cwd, *args)  # in this process: an interpreter start costs more than the run


def test_cli_score_then_select_cluster_margin_matches_the_oracle(workspace, tmp_path):
    table = tmp_path / "t.csv"
    done = alcli("score", workspace.pool, "-m", workspace.model, "-c", workspace.config, "-o",
                 table, "--strategy", "margin", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    rows = list(csv.DictReader(open(table)))
    out = alcli("select", table, "-n", 5, "--diverse-mode", "cluster-margin", "--diverse-clusters", 3,
                "--seed", 2, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    got = {r["id"] for r in csv.DictReader(out.stdout.splitlines())}
    with np.load(f"{table}.emb.npz") as z:  # the features b and ids, read without alcli
        ids, b = [str(i) for i in z["ids"]], z["b"]
    table_ids = [r["id"] for r in rows]
    scores = [float(r["score"]) for r in rows]
    want = oracle_batch(table_ids, scores, b[[ids.index(i) for i in table_ids]].astype(np.float64),
                        5, 2, min(len(rows), 50), 3)
    assert got == want and len(got) == 5
    badge = alcli("select", table, "-n", 5, "--diverse", "--seed", 2, cwd=tmp_path)
    assert badge.returncode == 0, badge.stderr


def test_cli_bad_input_is_one_sentence(workspace, tmp_path):
    table = tmp_path / "t.csv"
    done = alcli("score", workspace.pool, "-m", workspace.model, "-c", workspace.config, "-o",
                 table, "--strategy", "margin", "--no-embeddings", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    cases = [(("--diverse-mode", "cluster-margin"), "option --diverse-mode needs the table's embeddings"),
             (("--diverse-mode", "kmeans"), "option --diverse-mode must be one of badge, cluster-margin"),
             (("--diverse-mode", "cluster-margin", "--no-diverse"), "turns diverse selection off"),
             (("--diverse-clusters", "0"), "option --diverse-clusters"),
             (("--diverse-mode", "cluster-margin", "--sampling", "power"), "picks it by Cluster-Margin")]
    for args, says in cases:
        out = alcli("select", table, "-n", 3, *args, cwd=tmp_path)
        lines = out.stderr.strip().splitlines()
        assert out.returncode == 1 and len(lines) == 1, out.stderr
        assert lines[0].startswith("alcli: error: ") and says in lines[0], lines[0]
