"""The ghost rule for nn.LSTM, nn.GRU and nn.RNN (alcli/gradnorm/rules/rnn.py) against a float64
per-example loop written here: every configuration (batch_first, 1-2 layers, bidirectional, bias,
an initial state, LSTM proj_size), parameter selections, a module called twice, K target sets."""
from __future__ import annotations

import copy
import itertools

import pytest
import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence

from alcli.gradnorm import (UnsupportedModel, auto_choice, explain, grad_norms_per_target,
                            per_example_grad_norms)
from alcli.gradnorm.ghost import _k_mode
from alcli.gradnorm.rules import rule_for
from alcli.gradnorm.rules.registry import RULES
from alcli.gradnorm.rules.rnn import rnn_forward

from gradnorm_zoo import one_thread  # noqa: F401  (autouse fixture)

BATCH, STEPS, D_IN, HIDDEN, CLASSES = 3, 5, 4, 5, 3
KINDS = {"lstm": (nn.LSTM, {}), "gru": (nn.GRU, {}), "rnn_tanh": (nn.RNN, {}),
         "rnn_relu": (nn.RNN, {"nonlinearity": "relu"}), "lstm_proj": (nn.LSTM, {"proj_size": 3})}


class Net(nn.Module):
    """Inputs [B, T, D_IN] -> the RNN, in its own layout, with an initial state computed from the
    input when `init` -> logits from the output's last step and mean, h_n (and c_n). `twice`: the
    RNN runs again on a transformed input, from the first call's final state."""

    def __init__(self, kind, batch_first=True, layers=1, bidirectional=False, bias=True, init=False,
                 twice=False):
        super().__init__()
        rnn_type, extra = KINDS[kind]
        self.rnn = rnn_type(D_IN, HIDDEN, num_layers=layers, batch_first=batch_first,
                            bidirectional=bidirectional, bias=bias, **extra)
        self.lstm, self.twice = rnn_type is nn.LSTM, twice
        states = layers * (2 if bidirectional else 1)
        self.h_out = extra.get("proj_size", HIDDEN)
        self.init = nn.Linear(D_IN, states * (self.h_out + HIDDEN * self.lstm)) if init else None
        self.head = nn.Linear(self.h_out * (2 if bidirectional else 1), CLASSES)
        self.state_head = nn.Linear(states * (self.h_out + HIDDEN * self.lstm), CLASSES, bias=False)

    def forward(self, x):
        seq = x if self.rnn.batch_first else x.transpose(0, 1)
        hx = None
        if self.init is not None:  # [L*D, B, H]: the batch in dim 1, whatever batch_first says
            layers = self.rnn.num_layers * (1 + self.rnn.bidirectional)
            states = torch.tanh(self.init(x.mean(1))).view(x.shape[0], layers, -1).transpose(0, 1)
            hx = tuple(s.contiguous() for s in states.split([self.h_out, HIDDEN], -1)) if self.lstm \
                else states.contiguous()
        out, state = self.rnn(seq, hx)
        if self.twice:
            out2, state = self.rnn(torch.tanh(seq) * 0.5, state)
            out = out + out2
        out = out if self.rnn.batch_first else out.transpose(0, 1)
        states = torch.cat(state if self.lstm else (state,), -1).transpose(0, 1).flatten(1)
        return self.head(out[:, -1] + out.mean(1)) + self.state_head(states)


def oracle(model, x, targets, select=lambda name: name.startswith("rnn.")) -> torch.Tensor:
    """Each example alone through a float64 copy, autograd.grad of its loss -> [B] norms."""
    m = copy.deepcopy(model).double().eval()
    params = [p for name, p in m.named_parameters() if select(name)]
    norms = []
    for i in range(x.shape[0]):
        loss = nn.functional.cross_entropy(m(x[i:i + 1].double()), targets[i:i + 1])
        grads = torch.autograd.grad(loss, params, allow_unused=True)
        norms.append(torch.sqrt(sum(g.square().sum() for g in grads if g is not None)))
    return torch.stack(norms)


def case(kind, dtype=torch.float64, seed=0, **config):
    torch.manual_seed(seed)
    model = Net(kind, **config).to(dtype).eval()
    x = torch.randn(BATCH, STEPS, D_IN, dtype=dtype)
    targets = torch.randint(0, CLASSES, (BATCH,))
    return model, x, targets


def check(norms, expected, rtol=1e-6):
    torch.testing.assert_close(norms.double(), expected, rtol=rtol, atol=rtol * 1e-3 * float(expected.abs().max()))


CONFIGS = list(itertools.product(["lstm", "gru", "rnn_tanh", "rnn_relu"], [True, False], [1, 2],
                                 [False, True], [True, False], [False, True]))


@pytest.mark.parametrize("kind, batch_first, layers, bidirectional, bias, init", CONFIGS,
                         ids=["-".join(map(str, c)) for c in CONFIGS])
def test_every_configuration_matches_the_loop(kind, batch_first, layers, bidirectional, bias, init):
    model, x, targets = case(kind, batch_first=batch_first, layers=layers, bidirectional=bidirectional,
                             bias=bias, init=init)
    norms = per_example_grad_norms(model, x, targets, params=["rnn"], method="ghost")
    check(norms, oracle(model, x, targets))


@pytest.mark.parametrize("batch_first, bidirectional, init",
                         list(itertools.product([True, False], [False, True], [False, True])))
def test_lstm_proj_size(batch_first, bidirectional, init):
    model, x, targets = case("lstm_proj", batch_first=batch_first, layers=2, bidirectional=bidirectional,
                             init=init)
    assert rule_for(model.rnn).name == "rnn"
    check(per_example_grad_norms(model, x, targets, params=["rnn"], method="ghost"), oracle(model, x, targets))


@pytest.mark.parametrize("kind", list(KINDS))
def test_float32(kind):
    model, x, targets = case(kind, torch.float32, layers=2, bidirectional=True, init=True)
    norms = per_example_grad_norms(model, x, targets, method="ghost")
    assert norms.dtype == torch.float32
    check(norms, oracle(model, x, targets, lambda name: True), rtol=1e-3)


SELECTIONS = [  # (kind, params given to the engine, the oracle's reading of it)
    ("lstm", ["rnn.weight_hh_l1"], lambda n: n == "rnn.weight_hh_l1"),
    ("gru", ["rnn.weight_hh_l1"], lambda n: n == "rnn.weight_hh_l1"),
    ("gru", ["rnn.bias_hh_l0_reverse", "head"], lambda n: n == "rnn.bias_hh_l0_reverse" or n.startswith("head.")),
    ("rnn_tanh", ["rnn.weight_ih_l0", "rnn.bias_ih_l1_reverse"],
     lambda n: n in ("rnn.weight_ih_l0", "rnn.bias_ih_l1_reverse")),
    ("lstm_proj", ["rnn.weight_hr_l0_reverse"], lambda n: n == "rnn.weight_hr_l0_reverse"),
    # the initial state's Linear, before the RNN: its gradient flows through untapped layers
    ("gru", ["init", "rnn.weight_ih_l1"], lambda n: n.startswith("init.") or n == "rnn.weight_ih_l1"),
    ("lstm", ["init"], lambda n: n.startswith("init.")),
    ("lstm", None, lambda n: True),
]


@pytest.mark.parametrize("sel", range(len(SELECTIONS)), ids=[f"{k}{p}" for k, p, _ in SELECTIONS])
def test_a_selection_of_parameters(sel):
    kind, params, select = SELECTIONS[sel]
    model, x, targets = case(kind, batch_first=False, layers=2, bidirectional=True, init=True)
    check(per_example_grad_norms(model, x, targets, params=params, method="ghost"),
          oracle(model, x, targets, select))


@pytest.mark.parametrize("twice", [False, True])
@pytest.mark.parametrize("kind", ["lstm", "gru", "rnn_relu", "lstm_proj"])
def test_a_module_called_twice_adds_per_example_gradients(kind, twice, monkeypatch):
    """Called twice, the rule is asked for per-example gradients (wanted True), which the driver
    adds across the calls before the norm; called once, squared norms."""
    rnn_type = KINDS[kind][0]
    entry, asked = RULES[rnn_type], []

    def spy(module, call, wanted):
        asked.append(dict(wanted))
        return entry.rule(module, call, wanted)

    monkeypatch.setitem(RULES, rnn_type, entry._replace(rule=spy))
    model, x, targets = case(kind, batch_first=True, layers=2, bidirectional=True, init=True, twice=twice)
    check(per_example_grad_norms(model, x, targets, params=["rnn"], method="ghost"), oracle(model, x, targets))
    assert len(asked) == 1 + twice
    assert all(all(w.values()) if twice else not any(w.values()) for w in asked), asked


@pytest.mark.parametrize("kind", ["lstm", "gru", "rnn_tanh", "lstm_proj"])
def test_target_sets_in_one_backward(kind):
    model, x, targets = case(kind, layers=2, bidirectional=True, init=True, twice=kind == "gru")
    sets = [targets, (targets + 1) % CLASSES, torch.zeros_like(targets)]
    norms, _ = grad_norms_per_target(model, x, sets, method="ghost")
    check(norms, torch.stack([oracle(model, x, t, lambda n: True) for t in sets]))
    assert _k_mode[model] == "batched"  # the rule and the backward vmap over the K cotangents


@pytest.mark.parametrize("kind", list(KINDS))
def test_auto_picks_ghost_with_the_rnn_rule(kind):
    model, x, targets = case(kind, layers=2)
    assert rule_for(model.rnn).name == "rnn"
    rules = {name: rule for name, _, rule, _ in explain(model)["rules"]}
    assert rules["rnn"] == "rnn"
    norms = per_example_grad_norms(model, x, targets, method="auto")
    check(norms, oracle(model, x, targets, lambda n: True))
    assert auto_choice(model) == ("ghost", "ghost: a layer rule serves every selected module")


def test_the_capturing_forward_is_the_modules_forward():
    """Same outputs and output structure as the fused kernel, including with an initial state."""
    for kind, batch_first, bidirectional in itertools.product(KINDS, [True, False], [False, True]):
        model, x, _ = case(kind, batch_first=batch_first, layers=2, bidirectional=bidirectional)
        rnn = model.rnn
        seq = x if batch_first else x.transpose(0, 1).contiguous()
        mine, _ = rnn_forward(rnn, (seq,), {}, lambda t: t)
        theirs = rnn(seq)
        torch.testing.assert_close(mine, theirs, rtol=1e-12, atol=1e-12)
        _, state = theirs
        torch.testing.assert_close(rnn_forward(rnn, (seq * 0.5,), {"hx": state}, lambda t: t)[0],
                                   rnn(seq * 0.5, state), rtol=1e-12, atol=1e-12)


class Packed(nn.Module):
    def __init__(self):
        super().__init__()
        self.rnn = nn.GRU(D_IN, HIDDEN, batch_first=True)
        self.head = nn.Linear(HIDDEN, CLASSES)

    def forward(self, x):
        packed = pack_padded_sequence(x, torch.full((x.shape[0],), x.shape[1]), batch_first=True)
        return self.head(self.rnn(packed)[1][-1])


def test_packed_sequences_and_unbatched_inputs_are_refused():
    model = Packed().double()
    x = torch.randn(BATCH, STEPS, D_IN, dtype=torch.float64)
    targets = torch.randint(0, CLASSES, (BATCH,))
    with pytest.raises(UnsupportedModel, match="'rnn' .*PackedSequence"):
        per_example_grad_norms(model, x, targets, method="ghost")
    check(per_example_grad_norms(model, x, targets, method="auto"), oracle(model, x, targets, lambda n: True))
    with pytest.raises(UnsupportedModel, match="unbatched"):
        rnn_forward(model.rnn, (x[0],), {}, lambda t: t)


class OwnForwardLSTM(nn.LSTM):
    """A subclass with a forward of its own: the registered rule does not serve it."""

    def forward(self, x, hx=None):
        return super().forward(x, hx)


def test_a_subclass_with_its_own_forward_keeps_the_generic_rule():
    """...which pulls nn.LSTM (float64: no vmap rule) back one example at a time, so the K target
    sets go through one backward each: ghost's fallback for a backward it cannot vmap."""
    model, x, targets = case("lstm", layers=2, bidirectional=True)  # no initial state: no vmap rule
    model.rnn = OwnForwardLSTM(D_IN, HIDDEN, num_layers=2, batch_first=True, bidirectional=True).double()
    assert rule_for(model.rnn).name == "generic"
    sets = [targets, (targets + 1) % CLASSES]
    norms, _ = grad_norms_per_target(model, x, sets, method="ghost")
    check(norms, torch.stack([oracle(model, x, t, lambda n: True) for t in sets]))
    assert _k_mode[model] == "per target"
