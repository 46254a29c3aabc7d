"""BADGE selection: factored k-means++ against the explicit C·D embeddings, and planted duplicates."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from alcli.files.embeddings import EmbeddingsError, embeddings_path, load_embeddings, save_embeddings
from alcli.selection.diverse import badge_factors, kmeanspp_dense, kmeanspp_factored, select_diverse


def _random_factors(n, c, d, seed):
    g = torch.Generator().manual_seed(seed)
    probs = torch.softmax(torch.randn(n, c, generator=g, dtype=torch.float64) * 2, dim=1)
    feats = torch.relu(torch.randn(n, d, generator=g, dtype=torch.float64))
    return badge_factors(probs, feats)


def _dense(a, b):
    return torch.einsum("nc,nd->ncd", a, b).reshape(a.shape[0], -1)  # [N, C*D], explicit


def test_badge_factors_are_the_last_layer_gradient():
    # Oracle: autograd of CE(W h, argmax) w.r.t. the last-layer weight W [C, D], per example.
    torch.manual_seed(0)
    n, c, d = 7, 5, 9
    h = torch.randn(n, d, dtype=torch.float64)
    w = torch.randn(c, d, dtype=torch.float64, requires_grad=True)
    logits = h @ w.T
    a, b = badge_factors(torch.softmax(logits, 1).detach(), h)
    for i in range(n):
        loss = F.cross_entropy(logits[i:i + 1], logits[i:i + 1].argmax(1))
        (gw,) = torch.autograd.grad(loss, w, retain_graph=True)
        torch.testing.assert_close(torch.outer(a[i], b[i]), gw, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("seed", [0, 1, 2, 3, 4])
def test_factored_kmeanspp_matches_dense(seed):
    a, b = _random_factors(80, 4, 6, seed=100 + seed)
    emb = _dense(a, b)
    for first in (None, 5):
        fact = kmeanspp_factored(a, b, 20, seed, first=first, chunk=17)  # chunks cross rows
        dense = kmeanspp_dense(emb, 20, seed, first=first)
        assert fact == dense
        assert len(set(fact)) == 20
        assert fact[0] == (5 if first is not None else int(emb.norm(dim=1).argmax()))
    assert kmeanspp_factored(a, b, 1, seed)[0] == int(emb.norm(dim=1).argmax())


def test_kmeanspp_float32_features_match_dense():
    a, b = _random_factors(60, 3, 8, seed=7)
    picks32 = kmeanspp_factored(a.float(), b.float(), 12, 3)
    assert picks32 == kmeanspp_dense(_dense(a, b), 12, 3)


def test_kmeanspp_fewer_distinct_points_than_k():
    # 3 distinct embeddings, each 3 times: after 3 picks every D² is 0 -> lowest unchosen index.
    a, b = _random_factors(3, 3, 4, seed=11)
    a, b = a.repeat(3, 1), b.repeat(3, 1)
    fact = kmeanspp_factored(a, b, 6, 0)
    assert fact == kmeanspp_dense(_dense(a, b), 6, 0)
    assert sorted({i % 3 for i in fact[:3]}) == [0, 1, 2]  # all distinct ones first
    assert len(set(fact)) == 6


def test_seed_determinism():
    a, b = _random_factors(200, 5, 7, seed=3)
    assert kmeanspp_factored(a, b, 30, 42) == kmeanspp_factored(a, b, 30, 42)
    assert kmeanspp_factored(a, b, 30, 42) != kmeanspp_factored(a, b, 30, 43)


def _planted_pool(groups=6, copies=10, singles=140, seed=0):
    """A tiny real model on 8×8 'images': `groups` images each copied `copies` times with 1e-4
    noise (scores 0.90–0.99, best group first), plus distinct images with scores below 0.8."""
    g = torch.Generator().manual_seed(seed)
    model_h = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 32), torch.nn.ReLU())
    model_fc = torch.nn.Linear(32, 10)
    with torch.no_grad():
        for p in list(model_h.parameters()) + list(model_fc.parameters()):
            p.copy_(torch.randn(p.shape, generator=g) * 0.5)
    base = torch.rand(groups, 8, 8, generator=g)
    imgs, ids, scores, group_of = [], [], [], {}
    for k in range(groups):
        for j in range(copies):
            imgs.append(base[k] + 1e-4 * torch.randn(8, 8, generator=g))
            ids.append(f"dup{k}_{j:02d}.png")
            scores.append(0.99 - 0.015 * k + 1e-5 * float(torch.rand(1, generator=g)))
            group_of[ids[-1]] = k
    for j in range(singles):
        imgs.append(torch.rand(8, 8, generator=g))
        ids.append(f"single{j:03d}.png")
        scores.append(0.8 * float(torch.rand(1, generator=g)))
    with torch.no_grad():
        h = model_h(torch.stack(imgs))                    # [N, 32] penultimate features
        probs = torch.softmax(model_fc(h), dim=1)          # [N, 10]
    a, b = badge_factors(probs, h)
    return ids, torch.tensor(scores), a, b, group_of


def test_planted_duplicates_topn_vs_diverse():
    ids, scores, a, b, group_of = _planted_pool()
    budget = 8
    ranked = sorted(range(len(ids)), key=lambda i: (-float(scores[i]), ids[i]))
    top = [ids[i] for i in ranked[:budget]]
    top_groups = [group_of[i] for i in top if i in group_of]
    assert max(top_groups.count(k) for k in set(top_groups)) >= 3  # plain top-N: copies

    best = ids[ranked[0]]
    shortlist = set(ids[i] for i in ranked[:10 * budget])
    for seed in range(5):
        batch = select_diverse(ids, scores, a, b, budget, seed)
        assert len(batch) == len(set(batch)) == budget
        groups = [group_of[i] for i in batch if i in group_of]
        assert len(groups) == len(set(groups)), f"seed {seed}: two copies of one group {batch}"
        assert best in batch                       # the best-scoring example is kept
        assert set(batch) <= shortlist             # everything from the top 10×budget by score
        assert len(groups) >= 3                    # and high-scoring groups are represented
        order = [(-float(scores[ids.index(i)]), i) for i in batch]
        assert order == sorted(order)              # best score first, ties by id
        assert select_diverse(ids, scores, a, b, budget, seed) == batch


def test_select_diverse_ignores_row_order_and_handles_edges():
    ids, scores, a, b, _ = _planted_pool(groups=3, copies=4, singles=30, seed=2)
    batch = select_diverse(ids, scores, a, b, 6, seed=9)
    perm = torch.randperm(len(ids), generator=torch.Generator().manual_seed(1))
    shuffled = select_diverse([ids[i] for i in perm], scores[perm], a[perm], b[perm], 6, seed=9)
    assert shuffled == batch
    assert select_diverse(ids, scores, a, b, 0, seed=9) == []
    assert len(select_diverse(ids, scores, a, b, 10_000, seed=9)) == len(ids)
    whole = select_diverse(ids, scores, a, b, 6, seed=9, candidates=len(ids))
    assert len(whole) == 6
    with pytest.raises(ValueError, match="candidates"):
        select_diverse(ids, scores, a, b, 6, seed=9, candidates=3)
    bad = scores.clone()
    bad[4] = float("nan")
    with pytest.raises(ValueError, match=ids[4]):
        select_diverse(ids, bad, a, b, 6, seed=9)


def test_embeddings_roundtrip_and_errors(tmp_path):
    a, b = _random_factors(5, 3, 4, seed=1)
    ids = [f"img{i}.png" for i in range(5)]
    path = embeddings_path(str(tmp_path / "ranked.csv"))
    assert path.endswith("ranked.csv.emb.npz")
    save_embeddings(path, ids, a, b)
    got_ids, ga, gb = load_embeddings(path)
    assert got_ids == ids
    torch.testing.assert_close(ga, a, rtol=0, atol=0)
    torch.testing.assert_close(gb, b, rtol=0, atol=0)
    sub_ids, sa, sb = load_embeddings(path, ids=["img3.png", "img0.png"])
    assert sub_ids == ["img3.png", "img0.png"]
    torch.testing.assert_close(sa, a[[3, 0]], rtol=0, atol=0)
    torch.testing.assert_close(sb, b[[3, 0]], rtol=0, atol=0)

    with pytest.raises(EmbeddingsError, match="no embedding for id 'nope.png'"):
        load_embeddings(path, ids=["img1.png", "nope.png"])
    with pytest.raises(EmbeddingsError, match="4 ids, 5 rows"):
        save_embeddings(str(tmp_path / "x.npz"), ids[:4], a, b)
    with pytest.raises(EmbeddingsError, match="more than once"):
        save_embeddings(str(tmp_path / "x.npz"), ids[:4] + ["img0.png"], a, b)
    garbage = tmp_path / "garbage.emb.npz"
    garbage.write_text("not a zip")
    with pytest.raises(EmbeddingsError, match="garbage.emb.npz"):
        load_embeddings(str(garbage))
    other = tmp_path / "other.npz"
    np.savez(other, x=np.zeros(3))
    with pytest.raises(EmbeddingsError, match="not an alcli embeddings file"):
        load_embeddings(str(other))
    with pytest.raises(EmbeddingsError, match="missing.npz"):
        load_embeddings(str(tmp_path / "missing.npz"))
    assert isinstance(EmbeddingsError("x"), ValueError)
