"""A zoo of small models for the gradient-norm engine's tests, and the tests' own float64 oracle.

Every case builds a model (float32, deterministic weights), a batch of inputs and targets. The
oracle here is independent of alcli: a deep copy of the model in float64, one forward and one
`torch.autograd.grad` per example, exactly the seed's method 1.
"""
from __future__ import annotations

import copy
import functools
from dataclasses import dataclass
from typing import Callable

import pytest
import torch
import torch.nn.functional as F
from torch import nn

VOCAB = 20
PAD = 0


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """These models are tiny: one intra-op thread is faster, and far faster on a shared CPU where
    OpenMP threads wait on each other. Import this fixture into a test module to use it."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# ----------------------------------------------------------------------------------------- models
class SimpleModel(nn.Module):
    """The seed's model: input 3x10x10."""

    def __init__(self, num_classes=10):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 10, kernel_size=3, padding=1, bias=False)  # 10x10x10
        self.conv2 = nn.Conv2d(10, 20, kernel_size=3, stride=2, padding=1, bias=False)  # 20x5x5
        self.fc = nn.Linear(20 * 5 * 5, num_classes, bias=False)

    def forward(self, x):
        x = self.conv1(x)
        x = self.conv2(x)
        x = x.view(x.shape[0], -1)
        return self.fc(x)


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(12, 16), nn.ReLU(), nn.Linear(16, 8), nn.Tanh(),
                                 nn.Linear(8, 5))

    def forward(self, x):
        return self.net(x)


class BNResCNN(nn.Module):
    """Conv + BatchNorm (eval, non-trivial stats) + in-place ReLU + a residual add."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(8)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(8)
        self.pool = nn.AdaptiveAvgPool2d(2)
        self.bn3 = nn.BatchNorm1d(32)
        self.drop = nn.Dropout(0.5)
        self.fc = nn.Linear(32, 6)

    def forward(self, x):
        h = self.relu(self.bn1(self.conv1(x)))
        r = self.bn2(self.conv2(h))
        r += h  # residual add, in place
        h = self.relu(r)
        h = self.pool(h).flatten(1)
        return self.fc(self.drop(self.bn3(h)))


class TextTransformer(nn.Module):
    """Embedding + TransformerEncoder(batch_first) + LayerNorm + masked mean pool + Linear head."""

    def __init__(self, d=16, classes=4):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, d)
        layer = nn.TransformerEncoderLayer(d_model=d, nhead=2, dim_feedforward=32, dropout=0.1,
                                           batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, classes)

    def forward(self, tokens):  # [B, T]
        pad = tokens == PAD
        h = self.encoder(self.emb(tokens), src_key_padding_mask=pad)  # [B, T, d]
        h = self.norm(h)
        keep = (~pad).unsqueeze(-1).to(h.dtype)
        return self.head((h * keep).sum(1) / keep.sum(1))


class SeqFirstTransformer(nn.Module):
    """The default nn.TransformerEncoder layout, batch_first=False: every layer sees [T, B, d].

    Built with T == B so an engine that takes dim 0 for the batch gets no shape error to warn it.
    """

    def __init__(self, d=8, classes=4):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, d)
        layer = nn.TransformerEncoderLayer(d_model=d, nhead=2, dim_feedforward=16, dropout=0.1)
        self.encoder = nn.TransformerEncoder(layer, num_layers=1, enable_nested_tensor=False)
        self.head = nn.Linear(d, classes)

    def forward(self, tokens):  # [B, T]
        pad = tokens == PAD
        h = self.encoder(self.emb(tokens).transpose(0, 1), src_key_padding_mask=pad)  # [T, B, d]
        keep = (~pad).t().unsqueeze(-1).to(h.dtype)
        return self.head((h * keep).sum(0) / keep.sum(0))


class LSTMClassifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, 8)
        self.lstm = nn.LSTM(8, 12, num_layers=2, batch_first=True)
        self.head = nn.Linear(12, 5)

    def forward(self, tokens):
        out, _ = self.lstm(self.emb(tokens))  # [B, T, 12]
        return self.head(out[:, -1])


class GRUSeqFirst(nn.Module):
    """nn.GRU seq-first ([T, B, d]), 2 layers, bidirectional, its initial state computed from the
    input; logits from the outputs and the final states."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, 6)
        self.init = nn.Linear(6, 4 * 5)
        self.gru = nn.GRU(6, 5, num_layers=2, bidirectional=True)
        self.head = nn.Linear(10, 4)

    def forward(self, tokens):
        x = self.emb(tokens)  # [B, T, 6]
        h0 = torch.tanh(self.init(x.mean(1))).view(-1, 4, 5).transpose(0, 1).contiguous()  # [4, B, 5]
        out, h = self.gru(x.transpose(0, 1), h0)  # [T, B, 10], [4, B, 5]
        return self.head(out.mean(0) + h[-2:].transpose(0, 1).flatten(1))


class PackedLSTM(nn.Module):
    """The usual text classifier: pack_padded_sequence(enforce_sorted=False) into an LSTM."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, 6)
        self.lstm = nn.LSTM(6, 7, batch_first=True)
        self.head = nn.Linear(7, 4)

    def forward(self, tokens):
        lengths = (tokens != PAD).sum(1)
        packed = nn.utils.rnn.pack_padded_sequence(self.emb(tokens), lengths.cpu(), batch_first=True,
                                                   enforce_sorted=False)
        _, (h, _) = self.lstm(packed)
        return self.head(h[-1])


class SortedPackedGRU(nn.Module):
    """pack_padded_sequence(enforce_sorted=True): the batch must come longest first, so the
    model crashes on the same examples in another order."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, 5)
        self.gru = nn.GRU(5, 6, batch_first=True)
        self.head = nn.Linear(6, 3)

    def forward(self, tokens):
        lengths = (tokens != PAD).sum(1)
        packed = nn.utils.rnn.pack_padded_sequence(self.emb(tokens), lengths.cpu(), batch_first=True)
        _, h = self.gru(packed)
        return self.head(h[-1])


def _sorted_tokens(gen, batch, length):
    """Tokens with strictly decreasing lengths (length, length-1, ...)."""
    t = torch.randint(1, VOCAB, (batch, length), generator=gen)
    for i in range(batch):
        t[i, length - i:] = PAD
    return t


class TiedLM(nn.Module):
    """Output Linear's weight IS the embedding weight; predicts a token from a context."""

    def __init__(self, d=8):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, d)
        self.mix = nn.Linear(d, d)
        self.head = nn.Linear(d, VOCAB, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, tokens):
        h = torch.tanh(self.mix(self.emb(tokens))).mean(1)  # [B, d]
        return self.head(h)  # [B, VOCAB]


class TiedLongLM(TiedLM):
    """The output layer's weight IS the embedding's, applied at every position and to the mean
    over positions, and the embedding is looked up twice (the tokens, and the tokens reversed).
    At T = 6 the per-position output layer's per-example gradient [V, d] holds fewer numbers than
    its factors (T (V + d) > V d): it is summed dense, while the other three uses stay factors
    (dense rows, one-hot rows), and the cross terms mix all three kinds."""

    def __init__(self, d=5):
        super().__init__(d)

    def forward(self, tokens):
        h = torch.tanh(self.mix(self.emb(tokens) + self.emb(tokens.flip(1))))  # [B, T, d]
        return self.head(h).mean(1) + self.head(h.mean(1))  # [B, VOCAB]


class LinearTwice(nn.Module):
    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(6, 8)
        self.shared = nn.Linear(8, 8)
        self.head = nn.Linear(8, 4)

    def forward(self, x):
        h = torch.tanh(self.inp(x))
        h = torch.tanh(self.shared(h))
        h = torch.tanh(self.shared(h))  # the same Linear again
        return self.head(h)


class Affine(nn.Module):
    """A module the engine has no rule for: owns parameters used in elementwise math."""

    def __init__(self, d):
        super().__init__()
        self.w = nn.Parameter(torch.randn(d) * 0.5 + 1)
        self.b = nn.Parameter(torch.randn(d) * 0.1)

    def forward(self, x):
        return x * self.w + self.b


class BareParam(nn.Module):
    """Parameters used directly in the parent's forward: a cls token and a learned scale."""

    def __init__(self, d=8):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, d)
        self.cls = nn.Parameter(torch.randn(1, 1, d))
        self.scale = nn.Parameter(torch.tensor(1.5))
        self.affine = Affine(d)
        self.mix = nn.Linear(d, d)
        self.head = nn.Linear(d, 5)

    def forward(self, tokens):
        h = self.emb(tokens)  # [B, T, d]
        h = torch.cat([self.cls.expand(h.shape[0], -1, -1), h], dim=1) * self.scale  # [B, 1+T, d]
        h = torch.tanh(self.mix(self.affine(h)))
        return self.head(h[:, 0] + h[:, 1:].mean(1))


class Conv1dNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv1d(4, 8, 3, stride=2, padding=1)  # [8, 8]
        self.c2 = nn.Conv1d(8, 8, 3, padding="same", dilation=2, groups=2)  # [8, 8]
        self.c3 = nn.Conv1d(8, 8, 5, padding=2, groups=8)  # depthwise
        self.c4 = nn.Conv1d(8, 16, 3, stride=2, dilation=2, groups=8, bias=False)  # depthwise x2 [16, 2]
        self.fc = nn.Linear(32, 5)

    def forward(self, x):  # [B, 4, 16]
        h = torch.tanh(self.c1(x))
        h = torch.tanh(self.c2(h))
        h = torch.tanh(self.c3(h))
        return self.fc(self.c4(h).flatten(1))


class Conv2dVariants(nn.Module):
    """Asymmetric kernels/strides/dilations, groups, circular padding, a transposed conv."""

    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(3, 6, (3, 2), stride=(2, 1), dilation=(1, 2), padding=(1, 1))
        self.c2 = nn.Conv2d(6, 6, 3, padding=1, groups=3, padding_mode="circular")
        self.c3 = nn.Conv2d(6, 12, 3, padding="same", groups=6)  # depthwise, multiplier 2
        self.up = nn.ConvTranspose2d(12, 4, 2, stride=2)
        self.fc = nn.Linear(4, 5)

    def forward(self, x):  # [B, 3, 8, 8]
        h = torch.relu(self.c1(x))
        h = torch.relu(self.c2(h))
        h = torch.relu(self.c3(h))
        return self.fc(self.up(h).mean((2, 3)))


class ConvTwice(nn.Module):
    """One grouped Conv2d applied twice: its weight and bias get per-example gradients from each
    call, summed before the norm (the conv rule's per-example-gradient side)."""

    def __init__(self):
        super().__init__()
        self.inp = nn.Conv2d(3, 4, 3, padding=1)
        self.shared = nn.Conv2d(4, 4, 3, padding=1, groups=2)
        self.fc = nn.Linear(4, 5)

    def forward(self, x):  # [B, 3, 6, 6]
        h = torch.tanh(self.inp(x))
        h = torch.tanh(self.shared(h))
        h = torch.tanh(self.shared(h))  # the same Conv2d again
        return self.fc(h.mean((2, 3)))


class Conv3dNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv3d(2, 4, 3, stride=2, padding=1)  # [4, 3, 3, 3]
        self.c2 = nn.Conv3d(4, 4, 3, padding="same", dilation=2, groups=2)
        self.c3 = nn.Conv3d(4, 4, (1, 3, 3), stride=(1, 2, 1), padding=(0, 1, 1), groups=4,
                            bias=False)  # depthwise [4, 3, 2, 3]
        self.fc = nn.Linear(72, 5)

    def forward(self, x):  # [B, 2, 6, 6, 6]
        h = torch.tanh(self.c1(x))
        h = torch.tanh(self.c2(h))
        return self.fc(self.c3(h).flatten(1))


class GroupNormNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.gn1 = nn.GroupNorm(4, 8)
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1)
        self.gn2 = nn.GroupNorm(2, 8)
        self.gn3 = nn.GroupNorm(1, 8, affine=False)
        self.fc = nn.Linear(8, 5)

    def forward(self, x):
        h = F.silu(self.gn1(self.conv1(x)))
        h = self.gn3(F.silu(self.gn2(self.conv2(h))))
        return self.fc(h.mean((2, 3)))


class MHABatchFirst(nn.Module):
    def __init__(self, d=8):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, d)
        self.attn = nn.MultiheadAttention(d, 2, batch_first=True)
        self.head = nn.Linear(d, 4)

    def forward(self, tokens):
        pad = tokens == PAD
        x = self.emb(tokens)
        h, _ = self.attn(x, x, x, key_padding_mask=pad, need_weights=False)
        keep = (~pad).unsqueeze(-1).to(h.dtype)
        return self.head((h * keep).sum(1) / keep.sum(1))


class MHASeqFirst(nn.Module):
    """batch_first=False, separate key/value dims (q/k/v_proj_weight), bias_k/bias_v."""

    def __init__(self, d=8, dkv=6):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, d)
        self.mem = nn.Linear(d, dkv)
        self.attn = nn.MultiheadAttention(d, 2, kdim=dkv, vdim=dkv, add_bias_kv=True)
        self.self_attn = nn.MultiheadAttention(d, 1, bias=False)
        self.head = nn.Linear(d, 4)

    def forward(self, tokens):
        pad = tokens == PAD  # [B, T]
        x = self.emb(tokens).transpose(0, 1)  # [T, B, d]
        m = torch.tanh(self.mem(x))  # [T, B, dkv]
        h, _ = self.attn(x, m, m, key_padding_mask=pad)
        h, _ = self.self_attn(h, h, h, key_padding_mask=pad, need_weights=False)
        keep = (~pad).t().unsqueeze(-1).to(h.dtype)  # [T, B, 1]
        return self.head((h * keep).sum(0) / keep.sum(0))


class Linear3d(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(6, 10)
        self.proj4 = nn.Linear(10, 7)
        self.head = nn.Linear(7, 4)

    def forward(self, x):  # [B, T, 6]
        h = torch.relu(self.proj(x))  # [B, T, 10]
        h = h.view(h.shape[0], 2, -1, 10)  # [B, 2, T/2, 10]
        h = torch.tanh(self.proj4(h))  # Linear on a 4-D input
        return self.head(h.mean((1, 2)))


class EmbeddingPad(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, 6, padding_idx=PAD)
        self.head = nn.Linear(6, 4)

    def forward(self, tokens):
        return self.head(torch.tanh(self.emb(tokens).sum(1)))


class WeightNormNet(nn.Module):
    """torch.nn.utils.parametrizations.weight_norm: the weight is computed from original0/1."""

    def __init__(self):
        super().__init__()
        wn = nn.utils.parametrizations.weight_norm
        self.conv = wn(nn.Conv1d(3, 4, 3, padding=1))
        self.fc = wn(nn.Linear(20, 5))

    def forward(self, x):  # [B, 3, 5]
        return self.fc(torch.tanh(self.conv(x)).flatten(1))


class ManualRNN(nn.Module):
    """A GRUCell unrolled to the longest sequence in the batch, padded steps masked: the cell is
    called a batch-dependent number of times, yet each example's output is its own."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, 4)
        self.cell = nn.GRUCell(4, 5)
        self.head = nn.Linear(5, 3)

    def forward(self, tokens):
        lengths = (tokens != PAD).sum(1)
        x = self.emb(tokens)
        h = x.new_zeros(tokens.shape[0], 5)
        for t in range(int(lengths.max())):
            h = torch.where((t < lengths)[:, None], self.cell(x[:, t], h), h)
        return self.head(h)


class PackedTokens(nn.Module):
    """Runs its Linear on the packed non-padding tokens [N, d] (unpadding, as varlen attention
    does), then scatters back. The batch is merged with the tokens in `lin`'s input."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, 4)
        self.lin = nn.Linear(4, 4)
        self.head = nn.Linear(4, 3)

    def forward(self, tokens):
        mask = tokens != PAD
        x = self.emb(tokens)
        packed = self.lin(x[mask])  # [N, 4]
        out = torch.zeros_like(x).index_put(mask.nonzero(as_tuple=True), packed)
        return self.head(torch.tanh(out).sum(1) + 0.1)


# ------------------------------------------------------------------ aliases: one tensor, many names
class AliasAttr(nn.Module):
    """The Linear's weight registered a second time on the parent (`self.w = self.lin.weight`)."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(6, 5)
        self.w = self.lin.weight
        self.head = nn.Linear(5, 4)

    def forward(self, x):
        return self.head(torch.tanh(self.lin(x)))


class AliasAttrUsed(AliasAttr):
    """As AliasAttr, and the parent also uses its alias directly: two uses, in two modules."""

    def forward(self, x):
        return self.head(torch.tanh(self.lin(x) + 0.5 * x[:, :5] @ self.w[:, :5].T))


class AliasModule(nn.Module):
    """One Linear under two names, called through both."""

    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(6, 6)
        self.shared = nn.Linear(6, 6)
        self.again = self.shared
        self.head = nn.Linear(6, 4)

    def forward(self, x):
        h = torch.tanh(self.shared(torch.tanh(self.inp(x))))
        return self.head(torch.tanh(self.again(h)))


class CellRNN(nn.Module):
    """Opacus' DPRNN layout: cells do the work, and the RNN registers each cell's parameters a
    second time under nn.RNN's names (`weight_ih_l0 is l0.ih.weight`)."""

    def __init__(self, d_in=4, d=5):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, d_in)
        self.l0 = nn.Module()
        self.l0.ih = nn.Linear(d_in, d)
        self.l0.hh = nn.Linear(d, d, bias=False)
        self.weight_ih_l0 = self.l0.ih.weight
        self.bias_ih_l0 = self.l0.ih.bias
        self.weight_hh_l0 = self.l0.hh.weight
        self.head = nn.Linear(d, 3)

    def forward(self, tokens):
        x = self.emb(tokens)  # [B, T, d_in]
        h = x.new_zeros(x.shape[0], self.l0.hh.out_features)
        for t in range(x.shape[1]):
            h = torch.tanh(self.l0.ih(x[:, t]) + self.l0.hh(h))
        return self.head(h)


class Symmetric(nn.Module):
    def forward(self, w):
        return w.triu() + w.triu(1).transpose(0, 1)


class ParametrizedAlias(nn.Module):
    """A parametrized weight (symmetric) whose original tensor is also registered on the parent."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(5, 5)
        nn.utils.parametrize.register_parametrization(self.lin, "weight", Symmetric())
        self.orig = self.lin.parametrizations.weight.original
        self.head = nn.Linear(5, 3)

    def forward(self, x):
        return self.head(torch.tanh(self.lin(x)))


def packed_inputs(counts, gen=None):
    """Tokens with the given number of non-padding tokens per example."""
    t = torch.randint(1, VOCAB, (len(counts), max(3, max(counts))), generator=gen)
    for i, n in enumerate(counts):
        t[i, n:] = PAD
    return t


def _packed_inputs(gen, batch):
    """Token counts [1, 1, 0, 2]: examples 0 and 1 have one token each and N == B, so no size
    gives the merged batch away (an example with no tokens is valid input: all padding)."""
    return packed_inputs([1, 1, 0, 2], gen)


# ------------------------------------------------------- positions shared by all examples (BERT, GPT-2)
class SharedPositions(nn.Module):
    """Learned positions looked up with ids [1, T] shared by all examples, then a Linear on the
    shared [1, T, d] positions, added to the tokens by broadcasting."""

    def __init__(self):
        super().__init__()
        self.tok = nn.Embedding(VOCAB, 6)
        self.pos = nn.Embedding(8, 6)
        self.pos_mlp = nn.Linear(6, 6)
        self.fc = nn.Linear(6, 3)
        self.register_buffer("position_ids", torch.arange(8).unsqueeze(0))

    def forward(self, tokens):
        positions = self.pos_mlp(torch.tanh(self.pos(self.position_ids[:, :tokens.shape[1]])))
        return self.fc(torch.tanh(self.tok(tokens) + positions).mean(1))


class SharedPositionsFirstRow(SharedPositions):
    """The shared positions read by row ([0]): expanded to the batch, row 0 would carry every
    example's gradient, so ghost must leave them shared and decline."""

    def forward(self, tokens):
        positions = self.pos(self.position_ids[:, :tokens.shape[1]])[0]  # [T, d]
        return self.fc(torch.tanh(self.tok(tokens) + positions).mean(1))


class SharedPositionsTwoViews(SharedPositions):
    """Two views of each example, [B, 2, T, d], plus the shared positions [1, T, d]: expanded
    to a batch of 2 they would line up with the views, not the examples."""

    def forward(self, tokens):
        views = torch.stack([self.tok(tokens), -0.5 * self.tok(tokens.flip(1))], 1)  # [B, 2, T, d]
        positions = self.pos(self.position_ids[:, :tokens.shape[1]])                 # [1, T, d]
        return self.fc(torch.tanh(views + positions).mean((1, 2)))


class PositionsByKeyword(SharedPositions):
    """The shared position embedding called with a keyword argument, `pos(input=ids)`."""

    def forward(self, tokens):
        positions = self.pos(input=self.position_ids[:, :tokens.shape[1]])
        return self.fc(torch.tanh(self.tok(tokens) + positions).mean(1))


class AttentionInWindows(nn.Module):
    """nn.MultiheadAttention on windows, [B*2, 3, d]: its rule reads the batch from dim 0, where
    the windows are, so ghost declines."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, 6)
        self.mha = nn.MultiheadAttention(6, 2, batch_first=True)
        self.fc = nn.Linear(6, 3)

    def forward(self, tokens):  # [B, 6]
        h = self.emb(tokens).reshape(-1, 3, 6)
        out, _ = self.mha(h, h, h, need_weights=False)
        return self.fc(out.reshape(tokens.shape[0], 6, 6).mean(1))


class CoordinateMLP(nn.Module):
    """A position encoding computed by an MLP (with GELU) from a fixed [1, T, 2] grid, added to
    the tokens: broadcast, though GELU's last bits differ between an expanded and a contiguous input."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, 6)
        self.register_buffer("grid", torch.stack([torch.linspace(-1, 1, 6), torch.linspace(1, 0, 6)], -1)[None])
        self.pos_mlp = nn.Sequential(nn.Linear(2, 6), nn.GELU(), nn.Linear(6, 6))
        self.fc = nn.Linear(6, 3)

    def forward(self, tokens):  # [B, 6]
        return self.fc(torch.tanh(self.emb(tokens) + self.pos_mlp(self.grid)).mean(1))


class SortedByLength(nn.Module):
    """Sort the examples by length, run a Linear, put them back: which row holds which example
    depends on the data, so ghost declines (found on the first batch, whatever its lengths)."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, 6, padding_idx=PAD)
        self.lin = nn.Linear(6, 6)
        self.fc = nn.Linear(6, 3)

    def forward(self, tokens):
        order = torch.argsort((tokens != PAD).sum(1), descending=True, stable=True)
        h = torch.tanh(self.lin(self.emb(tokens)[order]))[torch.argsort(order)]
        return self.fc(h.mean(1))


class TokenBatchNorm(nn.Module):
    """LeViT's LinearNorm: a Linear, then BatchNorm1d (eval) on the tokens flattened with the
    batch, [B*T, C]: each row alone, so ghost serves it as [B, C, T]."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, 6)
        self.lin = nn.Linear(6, 6)
        self.bn = nn.BatchNorm1d(6)
        self.gn = nn.GroupNorm(2, 6)
        self.fc = nn.Linear(6, 3)

    def forward(self, tokens):
        h = self.lin(self.emb(tokens))
        h = self.bn(h.flatten(0, 1)).reshape_as(h)
        return self.fc(torch.tanh(h).mean(1))


class TokenGroupNorm(TokenBatchNorm):
    """GroupNorm on [B*T, C]: also each row alone, but as [B, C, T] its rule would normalise the
    groups over the T tokens together, so ghost declines the merged rows."""

    def forward(self, tokens):
        h = self.lin(self.emb(tokens))
        h = self.gn(h.flatten(0, 1)).reshape_as(h)
        return self.fc(torch.tanh(h).mean(1))


class FlippedRows(nn.Module):
    """A Linear on [B*T, d] rows taken in reverse order and put back: example 0's rows hold
    example B-1's tokens there, so ghost declines."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, 6)
        self.lin = nn.Linear(6, 6)
        self.fc = nn.Linear(6, 3)

    def forward(self, tokens):
        h = self.emb(tokens)
        rows = self.lin(h.reshape(-1, 6).flip(0)).flip(0).reshape(h.shape)
        return self.fc(torch.tanh(rows).mean(1))


class SharedSecondOutput(nn.Module):
    """A module (the generic rule) returning a per-example output and one shared by all examples."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.linspace(-1, 1, 6))

    def forward(self, x):
        return x * self.w, torch.tanh(self.w).unsqueeze(0)  # [B, 6], [1, 6]


class SharedOutputLeaf(nn.Module):
    def __init__(self):
        super().__init__()
        self.two = SharedSecondOutput()
        self.fc = nn.Linear(6, 3)

    def forward(self, x):
        per_example, shared = self.two(x)
        return self.fc(torch.tanh(per_example) + shared)


class GridEncoding(nn.Module):
    """xcit's position encoding: a Linear on a fixed grid, repeated for the batch; its input is
    the batch size, an int."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(4, 6)
        self.register_buffer("grid", torch.linspace(0, 1, 24).view(1, 6, 4))

    def forward(self, batch: int):
        return torch.tanh(self.proj(self.grid)).repeat(batch, 1, 1)  # [B, 6, 6]


class RepeatedPositions(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok = nn.Embedding(VOCAB, 6)
        self.pos = GridEncoding()
        self.fc = nn.Linear(6, 3)

    def forward(self, tokens):  # [B, 6]
        return self.fc(torch.tanh(self.tok(tokens) + self.pos(tokens.shape[0])).mean(1))


class SharedPositionsSummed(SharedPositions):
    """The shared positions summed over their leading dim: expanded to the batch they would
    count B times, so they stay shared, and no per-example output gradient exists for them."""

    def forward(self, tokens):
        positions = self.pos(self.position_ids[:, :tokens.shape[1]]).sum(0)  # [T, d]
        return self.fc(torch.tanh(self.tok(tokens) + positions).mean(1))


# ------------------------------------------ parameters an ancestor of their module uses (swin's attention)
class WindowAttention(nn.Module):
    """torchvision swin's pattern: the forward calls F.linear with its children's weights and
    never calls the children; `scale` is its own parameter."""

    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(6, 18)
        self.proj = nn.Linear(6, 6)
        self.scale = nn.Parameter(torch.linspace(0.5, 1.5, 6))

    def forward(self, x):  # [B, T, 6]
        q, k, v = F.linear(x, self.qkv.weight, self.qkv.bias).chunk(3, -1)
        a = torch.softmax(q @ k.transpose(1, 2), -1) @ v
        return F.linear(a * self.scale, self.proj.weight, self.proj.bias)


class CalledAndUsed(nn.Module):
    """A child called as a module, and its weight also used directly by the parent."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(6, 6)

    def forward(self, x):
        return torch.tanh(self.lin(x)) + x @ self.lin.weight.T


class AncestorUses(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, 6)
        self.block = nn.Sequential(WindowAttention(), nn.LayerNorm(6), CalledAndUsed())
        self.fc = nn.Linear(6, 3)

    def forward(self, tokens):
        return self.fc(self.block(self.emb(tokens)).mean(1))


class AncestorUsesLeaked(AncestorUses):
    """The attention's proj is also called from the root: moved to the attention's rule, that
    call would go uncounted, so ghost declines."""

    def forward(self, tokens):
        h = self.block(self.emb(tokens))
        return self.fc(self.block[0].proj(h).mean(1))


# ------------------------------------------------- the batch merged with windows ([B*nW, N, C]: timm swin)
class WindowBias(nn.Module):
    """Attention within each window, with a learned bias per window position (its own
    parameter: the generic rule), on [B*nW, N, C] with a mask shared by all examples."""

    def __init__(self, n=3, c=6):
        super().__init__()
        self.bias = nn.Parameter(torch.linspace(-0.3, 0.3, n * n).view(n, n))
        self.qk = nn.Linear(c, 2 * c)

    def forward(self, x, mask):  # x [B*nW, N, C], mask [nW, N, N]
        q, k = self.qk(x).chunk(2, -1)
        scores = (q @ k.transpose(1, 2)).unflatten(0, (-1, mask.shape[0])) + mask + self.bias
        return scores.flatten(0, 1).softmax(-1) @ x


class Windowed(nn.Module):
    """Tokens cut into windows of 3 with the batch outside: [B, 2*3, C] -> [B*2, 3, C]."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, 6)
        self.norm = nn.LayerNorm(6)
        self.attn = WindowBias()
        self.fc = nn.Linear(6, 3)
        self.register_buffer("mask", torch.tensor([0.0, -1.0]).view(2, 1, 1).expand(2, 3, 3).clone())

    def forward(self, tokens):  # [B, 6]
        h = self.emb(tokens).reshape(-1, 3, 6)  # [B*2, 3, 6]
        h = self.attn(self.norm(h), self.mask)
        return self.fc(torch.tanh(h).reshape(tokens.shape[0], 6, 6).mean(1))


class WindowedBatchInside(Windowed):
    """The same layers on [2*B, 3, C], windows outside the batch: no example owns a block of
    rows, so ghost declines."""

    def forward(self, tokens):
        h = self.emb(tokens).reshape(-1, 2, 3, 6).transpose(0, 1).reshape(-1, 3, 6)  # [2*B, 3, 6]
        h = self.norm(h)
        h = h.reshape(2, -1, 3, 6).transpose(0, 1).reshape(-1, 6, 6)
        return self.fc(torch.tanh(h).mean(1))


# ------------------------------------------------------------------------------------------ cases
def randomize_batchnorm(model: nn.Module, gen: torch.Generator) -> nn.Module:
    """Non-trivial running stats and affine parameters for every BatchNorm."""
    for m in model.modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm):
            with torch.no_grad():
                m.running_mean.copy_(torch.randn(m.running_mean.shape, generator=gen) * 0.3)
                m.running_var.copy_(torch.rand(m.running_var.shape, generator=gen) * 1.5 + 0.5)
                if m.affine:
                    m.weight.copy_(torch.rand(m.weight.shape, generator=gen) + 0.5)
                    m.bias.copy_(torch.randn(m.bias.shape, generator=gen) * 0.2)
    return model


def _tokens(gen, batch, length):
    t = torch.randint(1, VOCAB, (batch, length), generator=gen)
    for i in range(batch):  # trailing padding of varying length; the first token is never padding
        n_pad = i % max(1, length // 2)
        if n_pad:
            t[i, length - n_pad:] = PAD
    return t


def _targets(gen, model, inputs):
    """Random targets, avoiding the argmax so no example's gradient is vanishingly small."""
    with torch.no_grad():
        logits = model.eval()(inputs)
    classes = logits.shape[1]
    t = torch.randint(0, classes, (inputs.shape[0],), generator=gen)
    top = logits.argmax(1)
    return torch.where(t == top, (t + 1) % classes, t)


def _resnet18():
    import torchvision
    return torchvision.models.resnet18(weights=None, num_classes=10)


def _mobilenet():
    import torchvision
    return torchvision.models.mobilenet_v3_small(weights=None, num_classes=10)


# name -> (model factory, input factory(gen, batch), batch size)
_BUILDERS: dict[str, tuple[Callable[[], nn.Module], Callable, int]] = {
    "simple": (SimpleModel, lambda g, b: torch.rand(b, 3, 10, 10, generator=g), 5),
    "mlp": (MLP, lambda g, b: torch.randn(b, 12, generator=g), 6),
    "bn_res_cnn": (BNResCNN, lambda g, b: torch.randn(b, 3, 8, 8, generator=g), 4),
    "resnet18": (_resnet18, lambda g, b: torch.randn(b, 3, 32, 32, generator=g), 2),
    "mobilenet_v3_small": (_mobilenet, lambda g, b: torch.randn(b, 3, 32, 32, generator=g), 2),
    "transformer": (TextTransformer, lambda g, b: _tokens(g, b, 7), 4),
    "transformer_seq_first": (SeqFirstTransformer, lambda g, b: _tokens(g, b, 4), 4),
    "lstm": (LSTMClassifier, lambda g, b: _tokens(g, b, 6), 4),
    "gru_seq_first": (GRUSeqFirst, lambda g, b: _tokens(g, b, 5), 4),
    "packed_lstm": (PackedLSTM, lambda g, b: _tokens(g, b, 6), 4),
    "packed_gru_sorted": (SortedPackedGRU, lambda g, b: _sorted_tokens(g, b, 6), 4),
    "tied": (TiedLM, lambda g, b: _tokens(g, b, 5), 4),
    "tied_long": (TiedLongLM, lambda g, b: _tokens(g, b, 6), 4),
    "linear_twice": (LinearTwice, lambda g, b: torch.randn(b, 6, generator=g), 5),
    "bare_param": (BareParam, lambda g, b: _tokens(g, b, 5), 4),
    "conv1d": (Conv1dNet, lambda g, b: torch.randn(b, 4, 16, generator=g), 4),
    "conv2d_variants": (Conv2dVariants, lambda g, b: torch.randn(b, 3, 8, 8, generator=g), 4),
    "conv_twice": (ConvTwice, lambda g, b: torch.randn(b, 3, 6, 6, generator=g), 4),
    "conv3d": (Conv3dNet, lambda g, b: torch.randn(b, 2, 6, 6, 6, generator=g), 3),
    "groupnorm": (GroupNormNet, lambda g, b: torch.randn(b, 3, 6, 6, generator=g), 4),
    "mha_batch_first": (MHABatchFirst, lambda g, b: _tokens(g, b, 6), 4),
    "mha_seq_first": (MHASeqFirst, lambda g, b: _tokens(g, b, 6), 4),
    "linear_3d": (Linear3d, lambda g, b: torch.randn(b, 4, 6, generator=g), 4),
    # long sequence, small layers: T^2 > d_in * d_out, the per-example-gradient side of the rule
    "linear_3d_long": (Linear3d, lambda g, b: torch.randn(b, 24, 6, generator=g), 3),
    "embedding_padding_idx": (EmbeddingPad, lambda g, b: _tokens(g, b, 6), 4),
    "manual_rnn": (ManualRNN, lambda g, b: _tokens(g, b, 5), 4),
    "packed_tokens": (PackedTokens, _packed_inputs, 4),
    "weight_norm": (WeightNormNet, lambda g, b: torch.randn(b, 3, 5, generator=g), 4),
    "alias_attr": (AliasAttr, lambda g, b: torch.randn(b, 6, generator=g), 4),
    "alias_attr_used": (AliasAttrUsed, lambda g, b: torch.randn(b, 6, generator=g), 4),
    "alias_module": (AliasModule, lambda g, b: torch.randn(b, 6, generator=g), 4),
    "cell_rnn": (CellRNN, lambda g, b: _tokens(g, b, 4), 4),
    "parametrized_alias": (ParametrizedAlias, lambda g, b: torch.randn(b, 5, generator=g), 4),
    "ancestor_uses": (AncestorUses, lambda g, b: _tokens(g, b, 5), 4),
    "ancestor_uses_leaked": (AncestorUsesLeaked, lambda g, b: _tokens(g, b, 5), 4),
    "windowed": (Windowed, lambda g, b: _tokens(g, b, 6), 4),
    "windowed_batch_inside": (WindowedBatchInside, lambda g, b: _tokens(g, b, 6), 4),
    "shared_positions_first_row": (SharedPositionsFirstRow, lambda g, b: _tokens(g, b, 6), 4),
    "shared_positions_two_views": (SharedPositionsTwoViews, lambda g, b: _tokens(g, b, 6), 4),
    "positions_by_keyword": (PositionsByKeyword, lambda g, b: _tokens(g, b, 6), 4),
    "attention_in_windows": (AttentionInWindows, lambda g, b: _tokens(g, b, 6), 4),
    "coordinate_mlp": (CoordinateMLP, lambda g, b: _tokens(g, b, 6), 4),
    "sorted_by_length": (SortedByLength, lambda g, b: _tokens(g, b, 6), 4),
    "token_batchnorm": (TokenBatchNorm, lambda g, b: _tokens(g, b, 5), 4),
    "token_groupnorm": (TokenGroupNorm, lambda g, b: _tokens(g, b, 5), 4),
    "flipped_rows": (FlippedRows, lambda g, b: _tokens(g, b, 5), 4),
    "shared_output_leaf": (SharedOutputLeaf, lambda g, b: torch.randn(b, 6, generator=g), 4),
    "repeated_positions": (RepeatedPositions, lambda g, b: _tokens(g, b, 6), 4),
    "shared_positions": (SharedPositions, lambda g, b: _tokens(g, b, 6), 4),
    "shared_positions_summed": (SharedPositionsSummed, lambda g, b: _tokens(g, b, 6), 4),
}


# Which methods decline (UnsupportedModel) which zoo case; every other method must serve it, so an
# engine change that makes a method decline a model it served fails the tests.
ALL_BUT_LOOP = frozenset({"ghost", "vmap", "replicate"})
DECLINES: dict[str, frozenset] = {
    "lstm": frozenset({"replicate", "vmap"}),       # no vmap rule for the fused LSTM kernel (vmap: in float64)
    "gru_seq_first": frozenset({"replicate"}),      # no vmap rule for the fused GRU with per-example weights
    "packed_lstm": ALL_BUT_LOOP,                    # PackedSequence output; sizes vary per example
    "packed_gru_sorted": ALL_BUT_LOOP,              # cannot run its batch in another order
    "bare_param": frozenset({"replicate"}),         # root and child both own selected parameters
    "embedding_padding_idx": frozenset({"replicate"}),  # vmap's embedding rule ignores padding_idx
    "manual_rnn": frozenset({"vmap"}),              # data-dependent loop length
    "packed_tokens": ALL_BUT_LOOP,                  # the batch merged with the tokens
    "weight_norm": frozenset({"ghost", "replicate"}),   # a parametrization computes the weight
    "alias_attr_used": frozenset({"ghost", "replicate"}),  # the parent uses its alias directly
    "parametrized_alias": frozenset({"ghost", "replicate"}),
    "ancestor_uses": frozenset({"replicate"}),      # nested owners
    "ancestor_uses_leaked": frozenset({"ghost", "replicate"}),  # a moved parameter used outside its new module
    "windowed": frozenset({"replicate"}),           # nested owners
    "windowed_batch_inside": frozenset({"ghost", "replicate"}),  # no example owns a block of rows
    "repeated_positions": frozenset({"replicate"}),  # an output shared by all examples
    # expanded to the batch, their rows would not each reach one example: left shared
    "shared_positions_first_row": frozenset({"ghost", "replicate"}),
    "shared_positions_two_views": frozenset({"ghost", "replicate"}),
    "flipped_rows": frozenset({"ghost", "replicate"}),     # example 0's rows hold another example
    "token_batchnorm": frozenset({"replicate"}),            # the batch merged with the tokens
    "token_groupnorm": frozenset({"ghost", "replicate"}),
    "positions_by_keyword": frozenset({"ghost", "replicate"}),  # the rule needs a positional input
    "coordinate_mlp": frozenset({"replicate"}),      # an output shared by all examples
    "sorted_by_length": frozenset({"ghost", "replicate"}),  # the examples' order depends on the data
    "attention_in_windows": frozenset({"ghost", "replicate"}),  # its rule reads the batch from dim 0
    "shared_output_leaf": frozenset({"ghost", "replicate"}),  # that output's gradient is the batch's
    "shared_positions": frozenset({"replicate"}),   # an output shared by all examples
    "shared_positions_summed": frozenset({"ghost", "replicate"}),  # and ghost cannot broadcast it
}
# What `auto` settles on, where it is not ghost.
AUTO_CHOICE: dict[str, str] = {
    "packed_lstm": "loop", "packed_gru_sorted": "loop", "packed_tokens": "loop",
    "weight_norm": "vmap", "alias_attr_used": "vmap", "parametrized_alias": "vmap",
    "shared_positions_summed": "vmap", "ancestor_uses_leaked": "vmap", "windowed_batch_inside": "vmap",
    "shared_positions_first_row": "vmap", "shared_positions_two_views": "vmap", "flipped_rows": "vmap",
    "shared_output_leaf": "vmap", "attention_in_windows": "vmap", "sorted_by_length": "vmap",
    "positions_by_keyword": "vmap", "token_groupnorm": "vmap",
}


@functools.lru_cache(maxsize=None)
def _built(name: str):
    factory, make_inputs, batch = _BUILDERS[name]
    torch.manual_seed(1000 + sorted(_BUILDERS).index(name))
    gen = torch.Generator().manual_seed(7 + sorted(_BUILDERS).index(name))
    model = randomize_batchnorm(factory(), gen).eval()
    inputs = make_inputs(gen, batch)
    targets = _targets(gen, model, inputs)
    return model, inputs, targets


def build(name: str):
    """A fresh float32 copy of case `name`: (model in eval mode, inputs, targets)."""
    model, inputs, targets = _built(name)
    return copy.deepcopy(model), inputs.clone(), targets.clone()


def model_names() -> list[str]:
    return list(_BUILDERS)


@dataclass(frozen=True)
class Case:
    """A model, and which parameters are selected: `params` goes to the engine, `select` (a test
    of a parameter's name, any of its names when it is tied) is the oracle's own reading of it."""

    id: str
    model: str
    params: tuple[str, ...] | None = None
    select: Callable[[str], bool] | None = None


def _under(*prefixes):
    return lambda name: any(name.startswith(p + ".") or name == p for p in prefixes)


CASES = [Case(name, name) for name in _BUILDERS] + [
    Case("simple[conv2]", "simple", ("conv2",), _under("conv2")),
    Case("resnet18[layer4.*]", "resnet18", ("layer4.*",), _under("layer4")),
    Case("linear_twice[shared]", "linear_twice", ("shared",), _under("shared")),
    Case("tied[head]", "tied", ("head",), lambda n: n == "head.weight"),  # selects the shared weight
    Case("bare_param[cls,scale]", "bare_param", ("cls", "scale"), lambda n: n in ("cls", "scale")),
    # an alias selected by its second name selects the one tensor
    Case("alias_attr[w]", "alias_attr", ("w",), lambda n: n == "lin.weight"),
    Case("alias_module[again]", "alias_module", ("again",), _under("shared")),
    Case("cell_rnn[weight_ih_l0]", "cell_rnn", ("weight_ih_l0",), lambda n: n == "l0.ih.weight"),
]
CASE_BY_ID = {c.id: c for c in CASES}


# ----------------------------------------------------------------------------------------- oracle
def default_loss(logits, targets):
    return F.cross_entropy(logits, targets, reduction="none")


def as_dtype(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return x.to(dtype) if x.is_floating_point() else x


def oracle_norms(model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor,
                 select: Callable[[str], bool] | None = None, loss_fn=None) -> torch.Tensor:
    """The seed's per-example loop, in float64 on a deep copy in eval mode -> [B] float64."""
    loss_fn = loss_fn or default_loss
    m = copy.deepcopy(model).double().eval()
    chosen: dict[int, nn.Parameter] = {}
    for name, p in m.named_parameters(remove_duplicate=False):
        if (p.requires_grad if select is None else select(name)) and id(p) not in chosen:
            chosen[id(p)] = p
    params = list(chosen.values())
    assert params, "the oracle selected no parameter"
    x = as_dtype(inputs, torch.float64)
    out = torch.empty(x.shape[0], dtype=torch.float64)
    for i in range(x.shape[0]):
        loss = loss_fn(m(x[i:i + 1]), targets[i:i + 1]).sum()
        grads = torch.autograd.grad(loss, params, allow_unused=True)
        out[i] = torch.sqrt(sum((g.pow(2).sum() for g in grads if g is not None),
                                torch.zeros((), dtype=torch.float64)))
    return out
