"""The engine on what Hugging Face and timm models take and give: inputs a tensor or a dict /
tuple of tensors batched in dim 0, outputs a tensor or an object / dict / tuple holding the
logits. Every method against a float64 per-example loop written here (tests/hf_models.py)."""
from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from alcli.gradnorm import METHODS, UnsupportedModel, auto_choice, grad_norms_per_target, per_example_grad_norms
from alcli.gradnorm.model_io import batch_size, batch_slice, call_model, logits_of

import hf_models

TOL = dict(rtol=1e-6, atol=1e-9)


# --- small models with every input and output form, served by every method ---

class Output:
    def __init__(self, logits):
        self.logits, self.hidden = logits, None


class KwargsNet(nn.Module):
    """input_ids + attention_mask as keyword arguments -> an object with .logits."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(20, 6)
        self.fc = nn.Linear(6, 3)

    def forward(self, input_ids, attention_mask):
        h = self.emb(input_ids) * attention_mask.unsqueeze(-1).to(self.emb.weight.dtype)
        return Output(self.fc(h.sum(1)))


class TupleNet(nn.Module):
    """(x, scale) positional -> (logits, features)."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(5, 7)
        self.fc2 = nn.Linear(7, 3)

    def forward(self, x, scale):
        h = torch.tanh(self.fc1(x)) * scale
        return self.fc2(h), h


class DictOutNet(nn.Module):
    """pixel_values -> {"logits": ..., "loss": None}."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.fc = nn.Linear(4, 3)

    def forward(self, pixel_values):
        return {"logits": self.fc(self.conv(pixel_values).mean((2, 3))), "loss": None}


def small_cases():
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1, 20, (5, 6), generator=g)
    mask = torch.ones(5, 6, dtype=torch.long)
    mask[1, 4:] = 0
    return {
        "kwargs->object": (KwargsNet(), {"input_ids": ids * mask, "attention_mask": mask}),
        "tuple->tuple": (TupleNet(), (torch.randn(5, 5, generator=g), torch.rand(5, 1, generator=g) + 0.5)),
        "kwargs->dict": (DictOutNet(), {"pixel_values": torch.randn(5, 3, 6, 6, generator=g)}),
    }


def loop_of(model, inputs, targets):
    """The per-example loop for the small cases, in float64, written out."""
    m = model.double()
    params = list(m.parameters())
    out = []
    for i in range(len(targets)):
        if isinstance(inputs, dict):
            o = m(**{k: v[i:i + 1].double() if v.is_floating_point() else v[i:i + 1] for k, v in inputs.items()})
        else:
            o = m(*[v[i:i + 1].double() for v in inputs])
        logits = o.logits if isinstance(o, Output) else o["logits"] if isinstance(o, dict) else o[0]
        grads = torch.autograd.grad(F.cross_entropy(logits, targets[i:i + 1]), params)
        out.append(torch.sqrt(sum(g.square().sum() for g in grads)))
    return torch.stack(out)


def as_double(inputs):
    if isinstance(inputs, dict):
        return {k: v.double() if v.is_floating_point() else v for k, v in inputs.items()}
    return tuple(v.double() for v in inputs)


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("case", list(small_cases()))
def test_every_method_takes_dict_and_tuple_inputs_and_finds_the_logits(case, method):
    torch.manual_seed(1)
    model, inputs = small_cases()[case]
    model = model.double().eval()
    inputs = as_double(inputs)
    targets = torch.tensor([0, 1, 2, 1, 0])
    expected = loop_of(model, inputs, targets)
    got = per_example_grad_norms(model, inputs, targets, method=method)
    torch.testing.assert_close(got, expected, **TOL)
    norms, logits = grad_norms_per_target(model, inputs, lambda logits: [logits.argmax(1)], method=method)
    assert logits.shape == (5, 3)


@pytest.mark.parametrize("case", list(small_cases()))
def test_an_empty_batch_of_dict_or_tuple_inputs_gives_no_norms(case):
    model, inputs = small_cases()[case]
    empty = batch_slice(inputs, 0, 0)
    assert batch_size(empty) == 0
    norms = per_example_grad_norms(model.eval(), empty, torch.zeros(0, dtype=torch.long))
    assert norms.shape == (0,)


def test_logits_of_refuses_an_output_without_logits():
    assert torch.equal(logits_of({"logits": torch.ones(2, 3)}), torch.ones(2, 3))
    with pytest.raises(TypeError, match="must return the logits, or an object, dict or tuple"):
        logits_of({"scores": torch.ones(2, 3)})
    with pytest.raises(TypeError, match="a dict or tuple of tensors"):
        call_model(nn.Identity(), "text")


# --- Hugging Face models built from configs ---
# which method serves which architecture today: True = matches the loop, False = refused
# (UnsupportedModel); `auto` always matches the loop, with the method it settles on
SERVES = {
    #             ghost  replicate vmap   loop  auto's choice
    "bert":       (True,  False,   False, True, "ghost"),  # replicate: padding_idx; vmap: control flow
    "distilbert": (True,  False,   False, True, "ghost"),  # ghost: shared position embeddings broadcast
    "gpt2":       (True,  False,   False, True, "ghost"),  # replicate: shared position embeddings
    "vit":        (True,  False,   True,  True, "ghost"),  # replicate: nested owners
}


def hf_case(name):
    pytest.importorskip("transformers")
    torch.manual_seed(0)
    model = getattr(hf_models, name)().double().eval()
    g = torch.Generator().manual_seed(1)
    if name == "vit":
        return model, torch.randn(4, 3, 16, 16, generator=g, dtype=torch.float64)
    mask = torch.ones(4, 7, dtype=torch.long)
    mask[1, 5:] = 0
    mask[2, 3:] = 0
    ids = torch.randint(2, 100, (4, 7), generator=g) * mask  # pad id 0
    return model, {"input_ids": ids, "attention_mask": mask}


@pytest.mark.parametrize("method", ["ghost", "replicate", "vmap", "loop", "auto"])
@pytest.mark.parametrize("name", list(SERVES))
def test_hugging_face_models_every_method_matches_the_loop_or_is_refused(name, method):
    model, inputs = hf_case(name)
    targets = torch.tensor([0, 2, 1, 2])
    expected = hf_models.loop_norms(model, inputs, targets)
    serves = dict(zip(["ghost", "replicate", "vmap", "loop"], SERVES[name][:4]))
    if method != "auto" and not serves[method]:
        with pytest.raises(UnsupportedModel):
            per_example_grad_norms(model, inputs, targets, method=method)
        return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # EngineFallback and torch.func performance notes
        got = per_example_grad_norms(model, inputs, targets, method=method)
    torch.testing.assert_close(got, expected, **TOL)
    if method == "auto":
        assert auto_choice(model)[0] == SERVES[name][4]


def test_hugging_face_egl_targets_from_the_engines_own_logits():
    model, inputs = hf_case("bert")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        norms, logits = grad_norms_per_target(model, inputs, lambda lg: [lg.argmax(1), lg.argmin(1)])
    assert norms.shape == (2, 4) and logits.shape == (4, 3)
    torch.testing.assert_close(norms[1], hf_models.loop_norms(model, inputs, logits.argmin(1)), **TOL)


class LastTokenNet(nn.Module):
    """GPT-2's pooling: per-token logits, then each example's last non-pad token picked by an
    integer index (x[arange(B), last]), whose shape follows the indices, not their values."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(20, 6, padding_idx=0)
        self.fc = nn.Linear(6, 3)

    def forward(self, input_ids):
        logits = self.fc(torch.tanh(self.emb(input_ids)))             # [B, T, 3]
        last = (input_ids != 0).long().cumsum(1).argmax(1)           # [B]
        return logits[torch.arange(input_ids.shape[0]), last]


class MaskedMeanNet(LastTokenNet):
    """A boolean mask selects tokens: the shape depends on the values, which ghost refuses."""

    def forward(self, input_ids):
        h = torch.tanh(self.emb(input_ids))
        return torch.stack([self.fc(h[i][input_ids[i] != 0].mean(0)) for i in range(h.shape[0])])


def test_integer_index_lookups_are_not_data_dependent_shapes_but_boolean_masks_are():
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(1, 20, (5, 6), generator=g)
    ids[1, 3:] = 0
    ids[3, 5:] = 0
    targets = torch.tensor([0, 1, 2, 1, 0])
    model = LastTokenNet().double().eval()
    expected = per_example_grad_norms(model, ids, targets, method="loop")
    torch.testing.assert_close(per_example_grad_norms(model, ids, targets, method="ghost"), expected, **TOL)
    with pytest.raises(UnsupportedModel, match="data-dependent shapes"):
        per_example_grad_norms(MaskedMeanNet().double().eval(), ids, targets, method="ghost")


def test_hugging_face_conv1d_gets_the_linear_rule_with_its_weight_transposed():
    pytest.importorskip("transformers")
    from transformers.pytorch_utils import Conv1D

    from alcli.gradnorm.params import select_params
    from alcli.gradnorm.plan import describe

    class TiedConv1D(nn.Module):
        """A Conv1D ([d_in, d_out] weight) whose weight an nn.Linear ([d_out, d_in]) also uses:
        the per-example gradients of the two calls add only in one layout."""

        def __init__(self):
            super().__init__()
            self.proj = Conv1D(5, 5)
            self.lin = nn.Linear(5, 5)
            self.lin.weight = self.proj.weight
            self.head = Conv1D(3, 5)

        def forward(self, x):  # [B, T, 5]
            return self.head(torch.tanh(self.lin(torch.tanh(self.proj(x))))).mean(1)

    torch.manual_seed(2)
    model = TiedConv1D().double().eval()
    x = torch.randn(4, 3, 5, dtype=torch.float64)
    targets = torch.tensor([0, 1, 2, 1])
    expected = hf_models.loop_norms(model, x, targets)
    torch.testing.assert_close(per_example_grad_norms(model, x, targets, method="ghost"), expected, **TOL)
    assert {rule for _, _, rule, _ in describe(model, select_params(model, None))} == {"linear"}
