"""Capturing BADGE factors while scoring: which layer is the head, what is recorded, clear refusals."""
import pytest
import torch
from torch import nn

from alcli.files.config import Settings
from alcli.score.embeddings import EmbeddingRecorder, find_head, record
from alcli.errors import RunError
from alcli.pools.tensors import tensor_pool
from alcli.score.runner import forward, run


class TwoHeads(nn.Module):
    """Two Linear layers with 3 outputs: the later one (`out`) is the classifier."""

    def __init__(self):
        super().__init__()
        self.hidden = nn.Linear(5, 3)
        self.out = nn.Linear(3, 3)

    def forward(self, x):
        return self.out(torch.tanh(self.hidden(x)))


class PerToken(nn.Module):
    """The classifier runs on every token, then the tokens are averaged."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 2)

    def forward(self, x):  # [B, T, 4]
        return self.fc(x).mean(dim=1)


class Unused(nn.Module):
    """Has a Linear with 2 outputs, but the forward uses its weight functionally."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 2)

    def forward(self, x):
        return nn.functional.linear(x, self.fc.weight)


def test_the_last_linear_with_one_output_per_class_is_the_head():
    torch.manual_seed(0)
    net = TwoHeads().double().eval()
    assert find_head(net, 3)[0] == "out"
    x = torch.randn(6, 5, dtype=torch.float64)
    rec = EmbeddingRecorder()
    for lo in (0, 4):  # two batches
        with record(rec, net, [f"e{i}" for i in range(lo, min(lo + 4, 6))]):
            logits = forward(net, x[lo:lo + 4], "pool")
    got = rec.result()
    h = torch.tanh(net.hidden(x)).detach()
    p = torch.softmax(net(x), dim=1).detach()
    assert got.ids == [f"e{i}" for i in range(6)]
    torch.testing.assert_close(got.b, h)
    torch.testing.assert_close(got.a, p - nn.functional.one_hot(p.argmax(1), 3))
    assert not net.out._forward_hooks and not net._forward_hooks and not net.hidden._forward_hooks
    assert logits.shape == (2, 3)


def test_gradient_strategies_do_not_add_records():
    # egl runs the engine's own forwards after the plain one: only the plain one is recorded
    torch.manual_seed(0)
    net = TwoHeads().eval()
    pool = tensor_pool(torch.randn(10, 5))
    recs = {}
    for strategy in ("egl", "entropy"):
        recs[strategy] = EmbeddingRecorder()
        run(net, pool, Settings(strategy=strategy, batch_size=4), torch.device("cpu"),
            lambda rows, errors: None, embeddings=recs[strategy])
    egl, ent = recs["egl"].result(), recs["entropy"].result()
    assert egl.ids == ent.ids == [str(i) for i in range(10)]
    torch.testing.assert_close(egl.a, ent.a)
    torch.testing.assert_close(egl.b, ent.b)


def test_layers_after_the_head_are_fine():
    net = nn.Sequential(nn.Linear(8, 5), nn.ReLU(), nn.Linear(5, 4), nn.LogSoftmax(1)).eval()
    rec = EmbeddingRecorder()
    x = torch.randn(3, 8)
    with record(rec, net, ["a", "b", "c"]):
        forward(net, x, "pool")
    got = rec.result()
    assert rec.head[0] == "2"
    torch.testing.assert_close(got.b, net[1](net[0](x)).detach())
    p = torch.softmax(net(x), 1).detach()  # softmax of log-probabilities = the probabilities
    torch.testing.assert_close(got.a, p - nn.functional.one_hot(p.argmax(1), 4))


@pytest.mark.parametrize("net, x, text", [
    (PerToken(), torch.randn(2, 3, 4), "[2, 3, 4]"),
    (Unused(), torch.randn(2, 4), "did not run"),
])
def test_refusals_name_the_reason(net, x, text):
    rec = EmbeddingRecorder()
    with pytest.raises(RunError, match=r"--embeddings") as err:
        with record(rec, net, ["a", "b"]):
            forward(net, x, "pool")
    assert text in str(err.value)
    assert all(not m._forward_hooks for m in net.modules())


def test_no_linear_head_at_all():
    net = nn.Sequential(nn.Conv1d(1, 3, 1), nn.Flatten(), nn.Identity()).eval()
    rec = EmbeddingRecorder()
    with pytest.raises(RunError, match="nn.Linear with 3 outputs"):
        with record(rec, net, ["a", "b"]):
            forward(net, torch.randn(2, 1, 1), "pool")


@pytest.mark.filterwarnings("ignore::FutureWarning")  # torch.jit.script is deprecated
def test_torchscript_is_refused():
    net = torch.jit.script(nn.Sequential(nn.Linear(4, 2)))
    with pytest.raises(RunError, match="TorchScript"):
        with record(EmbeddingRecorder(), net, ["a"]):
            forward(net, torch.randn(1, 4), "pool")


def test_loading_some_rows_reads_those_rows_not_the_whole_file(tmp_path):
    """select's BADGE factors for its eligible rows: the members are memory maps, so asking for
    10 of 20,000 rows allocates 10 rows (two whole copies of a million rows' features were
    1.4 GB of select's peak); the rows are the ones saved, in the order asked."""
    import tracemalloc
    from alcli.files.embeddings import load_embeddings, save_embeddings
    g = torch.Generator().manual_seed(0)
    n, a, b = 20_000, torch.randn(20_000, 4, generator=g), torch.randn(20_000, 256, generator=g)
    ids = [f"r{i}" for i in range(n)]
    path = str(tmp_path / "t.csv.emb.npz")
    save_embeddings(path, ids, a, b)
    want = [ids[i] for i in (19_999, 3, 7_000)] + ids[100:107]
    tracemalloc.start()
    try:
        got_ids, got_a, got_b = load_embeddings(path, want)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    # the finite check's block and the ids' index, not a copy of b (20 MB)
    assert peak < b.numel() * 4 // 2, peak
    rows = [ids.index(i) for i in want]
    assert got_ids == want and torch.equal(got_a, a[rows]) and torch.equal(got_b, b[rows])
    all_ids, all_a, all_b = load_embeddings(path)
    assert all_ids == ids and torch.equal(all_a, a) and torch.equal(all_b, b)
