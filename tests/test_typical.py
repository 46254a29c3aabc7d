"""`select --typical` (alcli.selection.typical): TypiClust's cold-start batch, against a brute-force
numpy float64 re-implementation, and through the CLI on a real scored table."""
from __future__ import annotations

import csv

import numpy as np
import pytest
import torch

from alcli.selection import typical as typ
from alcli.selection.typical import kmeans, select_typical, typicality
from shell import completed_in


def oracle_typicality(x: np.ndarray, k: int = 20) -> np.ndarray:
    """1 / mean distance to the min(k, m-1) nearest other rows, one row at a time, float64."""
    x = np.asarray(x, dtype=np.float64)
    out = []
    for i in range(len(x)):
        d = sorted(float(np.sqrt(((x[i] - x[j]) ** 2).sum())) for j in range(len(x)) if j != i)
        near = d[:min(k, len(x) - 1)]
        out.append(1.0 / (sum(near) / len(near)))
    return np.array(out)


def planted(sizes=(30, 25, 20, 15, 12, 8), dim=5, seed=0):
    """Blobs of the given sizes, std 1, centers 60 apart: rows [N, D], the blob of each row."""
    rng = np.random.default_rng(seed)
    centers = rng.normal(size=(len(sizes), dim)) * 60
    x = np.concatenate([c + rng.normal(size=(s, dim)) for c, s in zip(centers, sizes)])
    blob = np.repeat(np.arange(len(sizes)), sizes)
    order = rng.permutation(len(x))  # blobs interleaved in the rows
    return x[order], blob[order]


def oracle_batch(x, blob, labeled_rows, budget):
    """TypiClust on the planted partition: the `budget` largest blobs with no labeled row, the
    most typical candidate of each (brute force), as candidate positions."""
    candidates = [i for i in range(len(x)) if i not in set(labeled_rows)]
    covered = {blob[i] for i in labeled_rows}
    sizes = {b: sum(blob[i] == b for i in candidates) for b in set(blob.tolist())}
    open_ = sorted((b for b in sizes if b not in covered), key=lambda b: -sizes[b])[:budget]
    picks = []
    for b in open_:
        members = [i for i in candidates if blob[i] == b]
        t = oracle_typicality(x[members])
        picks.append(candidates.index(members[int(np.argmax(t))]))
    return picks


def test_typicality_against_a_brute_force_loop():
    x = np.random.default_rng(1).normal(size=(57, 4)) * [1, 2, 3, 0.5] + 100  # far from 0
    got = typicality(torch.tensor(x, dtype=torch.float32), chunk=7).numpy()  # as stored: float32
    x = x.astype(np.float32).astype(np.float64)
    np.testing.assert_allclose(got, oracle_typicality(x), rtol=1e-10)
    small = x[:6]  # fewer rows than K + 1: K = 5 other rows
    np.testing.assert_allclose(typicality(small).numpy(), oracle_typicality(small), rtol=1e-10)


def test_kmeans_recovers_planted_blobs_chunked_or_not():
    x, blob = planted()
    for chunk in (4096, 7):
        labels = kmeans(x, 6, seed=3, chunk=chunk).numpy()
        pairs = set(zip(labels.tolist(), blob.tolist()))
        assert len(pairs) == 6 and len({l for l, _ in pairs}) == 6  # a bijection of the blobs


@pytest.mark.parametrize("labeled_blobs, budget", [((0, 0), 4), ((1, 3), 4), ((), 6), ((2, 2, 5), 3)])
def test_batch_is_the_most_typical_of_the_largest_uncovered_clusters(labeled_blobs, budget):
    x, blob = planted()
    labeled_rows = []
    for b in labeled_blobs:  # the first rows of that blob not taken yet
        labeled_rows.append(next(i for i in range(len(x)) if blob[i] == b and i not in labeled_rows))
    # k = labeled + budget must equal the blob count for the planted partition to be the answer
    assert len(labeled_rows) + budget == 6
    candidates = [i for i in range(len(x)) if i not in labeled_rows]
    got = select_typical(torch.tensor(x[candidates]), torch.tensor(x[labeled_rows]), budget, seed=0)
    want = oracle_batch(x, blob, labeled_rows, budget)
    assert got == want


def test_a_cluster_over_the_sample_cap_is_judged_on_a_sample(monkeypatch):
    x, _ = planted(sizes=(40,))
    monkeypatch.setattr(typ, "SAMPLE_CAP", 16)
    got = select_typical(torch.tensor(x), torch.zeros(0, 5), 1, seed=2)  # k = 1: one cluster
    keep = np.sort(np.random.default_rng(2).choice(40, 16, replace=False))
    assert got == [int(keep[int(np.argmax(oracle_typicality(x[keep])))])]
    assert got != [int(np.argmax(oracle_typicality(x)))]  # the sample decided


# --- the CLI ---------------------------------------------------------------------------------------

def alcli(*args, cwd):
    return completed_in(cwd, *args)  # in this process: an interpreter start costs more than the run


def test_cli_score_then_select_typical_matches_the_oracle_on_the_table_embeddings(workspace, tmp_path):
    table = tmp_path / "t.csv"
    done = alcli("score", workspace.pool, "-m", workspace.model, "-c", workspace.config, "-o", table, "--strategy", "margin", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    with open(table) as f:
        rows = list(csv.DictReader(f))
    labeled = [rows[0]["id"], rows[3]["id"]]
    (tmp_path / "labeled.txt").write_text("\n".join(labeled) + "\n")
    out = alcli("select", table, "-n", 5, "--typical", "--exclude", tmp_path / "labeled.txt",
                "--seed", 4, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    got = {r["id"] for r in csv.DictReader(out.stdout.splitlines())}
    with np.load(f"{table}.emb.npz") as z:  # the features b and ids, read without alcli
        ids, b = [str(i) for i in z["ids"]], z["b"]
    ranked = [r["id"] for r in rows]  # the table's order: best score first, ties by id
    cand = [i for i in ranked if i not in labeled]
    picks = select_typical(torch.tensor(b[[ids.index(i) for i in cand]]),
                           torch.tensor(b[[ids.index(i) for i in labeled]]), 5, seed=4)
    assert got == {cand[p] for p in picks}
    assert len(got) == 5 and not got & set(labeled)
    # the same batch in one process, scoring first (labeled rows scored too, then excluded)
    one = alcli("select", "-m", workspace.model, "-c", workspace.config, "-n", 5, "--typical", "--strategy", "margin",
                "--exclude", tmp_path / "labeled.txt", "--seed", 4, "--pool", workspace.pool,
                cwd=tmp_path)
    assert one.returncode == 0, one.stderr
    assert {r["id"] for r in csv.DictReader(one.stdout.splitlines())} == got
    # by the scores with 2 labeled examples: the note that points to --typical (measured rule)
    classes = len({r["pred"] for r in rows})
    plain = alcli("select", table, "-n", 5, "--exclude", tmp_path / "labeled.txt", cwd=tmp_path)
    assert plain.returncode == 0 and classes >= 2
    assert (f"names 2 labeled examples, fewer than 6 per class for the {classes} classes "
            f"predicted") in plain.stderr and "--typical" in plain.stderr
    assert "--typical" not in out.stderr + one.stderr


def test_cli_typical_without_embeddings_or_with_another_mode_is_one_sentence(workspace, tmp_path):
    table = tmp_path / "t.csv"
    done = alcli("score", workspace.pool, "-m", workspace.model, "-c", workspace.config, "-o", table, "--strategy", "margin",
                 "--no-embeddings", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    out = alcli("select", table, "-n", 3, "--typical", cwd=tmp_path)
    assert out.returncode == 1 and "Traceback" not in out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("alcli: error: option --typical needs the ")
    assert "t.csv.emb.npz" in lines[0] and "score with --embeddings" in lines[0]
    both = alcli("select", table, "-n", 3, "--typical", "--sampling", "power", cwd=tmp_path)
    assert both.returncode == 1 and both.stderr.count("\n") == 1
    assert "--typical" in both.stderr and "--sampling" in both.stderr


def test_identical_rows_still_fill_the_budget_in_row_order():
    """Fewer distinct rows than clusters: empty clusters are skipped, the batch is still full."""
    x = torch.ones(6, 3)
    assert select_typical(x, torch.ones(1, 3), 3, seed=0) == [0, 1, 2]


def test_kmeans_ends_at_a_fixed_point_of_lloyd():
    """Each row is nearest (numpy float64) to the mean of its own cluster, on data with no
    planted answer: the seeding alone does not get there."""
    x = np.random.default_rng(5).normal(size=(300, 3))
    labels = kmeans(torch.tensor(x), 7, seed=1, chunk=64).numpy()
    means = np.stack([x[labels == c].mean(0) for c in range(7)])
    d = ((x[:, None, :] - means[None]) ** 2).sum(-1)
    assert (d.argmin(1) == labels).all()
