"""The random draws as docs/scores.md ("The random draws") defines them, re-implemented here with
hashlib and torch alone, against what alcli draws: EGL's sampled label sets (classification,
token classification, multi-label), detection's sampled box sets and the `random` strategy."""
import hashlib

import torch

from alcli.score.strategies import StrategyInputs, random as random_strategy
from alcli.tasks import sampled
from alcli.tasks.detection import image_seed, sampled_targets


def _h(data: str) -> int:
    return int.from_bytes(hashlib.blake2b(data.encode("utf-8"), digest_size=8).digest(), "big")


def _uniforms(seed: int, id_, positions: int, samples: int) -> torch.Tensor:
    """[N, S]: the documented generator, position-major."""
    g = torch.Generator().manual_seed(_h(f"egl\0{seed}\0{id_}") >> 1)
    return torch.rand(positions, samples, generator=g, dtype=torch.float64)


def _inverse_cdf(p: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """p [N, K] float64, u [N] -> [N]: the number of k < K - 1 with u >= p_0 + ... + p_k."""
    cum = p.cumsum(-1)[:, :-1]
    return (u[:, None] >= cum).sum(-1)


IDS = ["a", "img/0001.png", "ünï cödé", "42"]


def test_random_strategy_is_the_documented_uniform():
    for seed in (0, 7):
        s = StrategyInputs(model=None, inputs=torch.zeros(4, 1), labels=torch.full((4,), -1),
                           logits=torch.zeros(4, 3), ids=IDS, seed=seed)
        got = random_strategy(s)["score"]
        want = torch.tensor([_h(f"{seed}\0{i}") / 2.0 ** 64 for i in IDS], dtype=torch.float64)
        assert got.dtype == torch.float64
        assert torch.equal(got, want)


def test_egl_classification_label_sets():
    torch.manual_seed(0)
    logits = torch.randn(4, 5) * 2
    for seed, samples in ((0, 8), (3, 5)):
        sets = sampled("classification", logits, torch.ones(4, 1, dtype=torch.bool), IDS, samples, seed)
        p = logits.double().softmax(-1)
        for b, id_ in enumerate(IDS):
            u = _uniforms(seed, id_, 1, samples)[0]                     # [S]
            want = _inverse_cdf(p[b].expand(samples, -1), u)
            assert torch.equal(torch.stack([t[b] for t in sets]), want), (seed, id_)


def test_egl_token_classification_label_sets_are_position_major():
    torch.manual_seed(1)
    b, t, k, samples, seed = 4, 6, 4, 3, 11
    logits = torch.randn(b, t, k)
    valid = torch.ones(b, t, dtype=torch.bool)
    sets = sampled("token-classification", logits, valid, IDS, samples, seed)
    p = logits.double().softmax(-1)
    for i, id_ in enumerate(IDS):
        u = _uniforms(seed, id_, t, samples)                             # [N, S]
        for s in range(samples):
            assert torch.equal(sets[s][i].long(), _inverse_cdf(p[i], u[:, s])), (id_, s)


def test_egl_multilabel_label_sets():
    torch.manual_seed(2)
    logits = torch.randn(4, 7)
    samples, seed = 6, 5
    sets = sampled("multilabel", logits, torch.ones(4, 7, dtype=torch.bool), IDS, samples, seed)
    p = torch.sigmoid(logits.double())
    for i, id_ in enumerate(IDS):
        u = _uniforms(seed, id_, 7, samples)
        dist = torch.stack([1 - p[i], p[i]], -1)
        for s in range(samples):
            assert torch.equal(sets[s][i].long(), _inverse_cdf(dist, u[:, s])), (id_, s)


def test_detection_box_sets_and_loss_seed():
    boxes = torch.tensor([[0., 0, 5, 5], [1, 1, 4, 9], [2, 2, 2, 8], [0, 0, 3, 3], [4, 4, 9, 9]])
    scores = torch.tensor([0.9, 0.5, 0.7, 0.2, 0.6])
    found = {"boxes": boxes, "labels": torch.tensor([1, 2, 3, 1, 2]), "scores": scores}
    samples, seed = 7, 4
    for id_ in IDS:
        got = sampled_targets(found, id_, samples, seed)
        u = _uniforms(seed, id_, 5, samples)                             # [K, S]
        proper = (boxes[:, 2] > boxes[:, 0]) & (boxes[:, 3] > boxes[:, 1])
        for s in range(samples):
            keep = (u[:, s] < scores.double()) & proper
            assert torch.equal(got[s]["boxes"], boxes[keep]) and torch.equal(got[s]["labels"], found["labels"][keep])
        assert image_seed(seed, id_) == _h(f"boxes\0{seed}\0{id_}") >> 1
    empty = {"boxes": torch.zeros(0, 4), "labels": torch.zeros(0, dtype=torch.long), "scores": torch.zeros(0)}
    assert all(t["boxes"].shape == (0, 4) for t in sampled_targets(empty, "x", 3, 0))
