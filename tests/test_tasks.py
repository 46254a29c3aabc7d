"""Tasks beyond one class per example (alcli/tasks/): every task x model x engine method
against a float64 per-example loop of the same loss written with torch's own losses
(tests/task_models.py), the Monte-Carlo EGL against exact enumeration, regression's closed form,
and the per-position utilities against loops over positions."""
import itertools
import math
import warnings

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

import alcli
import task_models as tm
from alcli.errors import AlcliError
from alcli.files.config import TASK_NAMES
from alcli.gradnorm import UnsupportedModel, auto_choice, grad_norms_per_target
from alcli.gradnorm.model_io import forward_logits
from alcli import tasks
from alcli.score.strategies import STRATEGIES, StrategyInputs

# name: (task, model, inputs)
CASES = {
    "unet": ("segmentation", tm.unet, lambda: tm.images(3, 8)),
    "lraspp_mobilenet_v3_large": ("segmentation", tm.lraspp, lambda: tm.images(2, 16)),
    "fcn_resnet50": ("segmentation", tm.fcn, lambda: tm.images(2, 16)),
    "bert_tokens": ("token-classification", tm.bert_tokens, lambda: tm.tokens(4)),
    "distilbert_tokens": ("token-classification", tm.distilbert_tokens, lambda: tm.tokens(4)),
    "bert_multilabel": ("multilabel", tm.bert_multilabel, lambda: tm.tokens(4)),
    "timm_multilabel": ("multilabel", tm.timm_multilabel, lambda: tm.images(3, 32)),
    "mlp_regression": ("regression", tm.mlp_regression, lambda: tm.features(4)),
    "bert_regression": ("regression", tm.bert_regression, lambda: tm.tokens(4)),
}
# cells that fall back, and why: torch.func cannot vmap Hugging Face BERT-family forwards (their
# attention-mask preparation reads values on the host); every other cell is served exactly
DECLINES = {(name, "vmap") for name in ("bert_tokens", "distilbert_tokens", "bert_multilabel",
                                        "bert_regression")}
METHODS = ("ghost", "vmap", "loop", "auto")
# what auto reads from each model (None: from its output's shape; timm / a plain MLP say nothing,
# so --task multilabel / regression must be given for them)
FROM_MODEL = {"unet": None, "lraspp_mobilenet_v3_large": "segmentation", "fcn_resnet50": "segmentation",
              "bert_tokens": "token-classification", "distilbert_tokens": "token-classification",
              "bert_multilabel": "multilabel", "timm_multilabel": None, "mlp_regression": None,
              "bert_regression": "regression"}

_built: dict = {}


def case(name):
    """(task, model, inputs, targets, oracle norms), built once per test session."""
    if name not in _built:
        task, make, data = CASES[name]
        model, x = make(), data()
        with torch.no_grad():
            z = forward_logits(model, x)
        if task == "regression":
            t = torch.randn(z.reshape(z.shape[0], -1).shape, generator=torch.Generator().manual_seed(5))
        else:  # labels drawn from the model's own predictions, some pixels ignored
            t = tasks.sampled(task, z, tasks.valid_positions(task, z, x), list(range(z.shape[0])), 1, 7)[0]
            if task == "segmentation":
                t[:, 0, :3] = tm.IGNORE
        _built[name] = (task, model, x, t, tm.loop_norms(model, x, task, t))
    return _built[name]


def test_task_names_are_the_registry():  # detection joined the registry (alcli/tasks/detection.py)
    assert TASK_NAMES == ("auto", *tasks.TASKS)


@pytest.mark.parametrize("name,method", list(itertools.product(CASES, METHODS)))
def test_every_task_model_and_method_against_the_float64_loop(name, method):
    task, model, x, t, oracle = case(name)
    loss_fn = tasks.TASKS[task].loss
    if (name, method) in DECLINES:
        with pytest.raises(UnsupportedModel):
            grad_norms_per_target(model, x, [t], method=method, loss_fn=loss_fn)
        return
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # auto must not fall back
        norms, _ = grad_norms_per_target(model, x, [t], method=method, loss_fn=loss_fn)
    torch.testing.assert_close(norms[0].double(), oracle, rtol=2e-5, atol=1e-8)
    if method == "auto":
        assert auto_choice(model, None, loss_fn)[0] == "ghost"


@pytest.mark.parametrize("name", CASES)
def test_auto_reads_the_task_from_the_model_or_its_output(name):
    task, model, x, _, _ = case(name)
    assert tasks.from_model(model) == FROM_MODEL[name]
    with torch.no_grad():
        z = forward_logits(model, x)
    if FROM_MODEL[name] is None and task in ("multilabel", "regression"):
        assert tasks.from_logits(z) == "classification"  # [B, C]: --task must say otherwise
    else:
        assert tasks.resolve("auto", model, lambda: z) == task


def strategy_inputs(model, x, task, **kw):
    with torch.no_grad():
        z = forward_logits(model, x)
    n = z.shape[0]
    return StrategyInputs(model=model, inputs=x, labels=torch.full((n,), -1), logits=z,
                          ids=[f"e{i}" for i in range(n)], task=task, **kw)


@pytest.mark.parametrize("name", ["unet", "bert_tokens", "bert_multilabel"])
def test_gradnorm_without_labels_is_the_norm_at_the_predicted_labels(name):
    task, model, x, _, _ = case(name)
    s = strategy_inputs(model, x, task)
    z = s.logits.double()
    if task == "segmentation":
        t = z.argmax(1)
    elif task == "token-classification":  # padding ignored
        t = torch.where(x["attention_mask"].bool(), z.argmax(-1), torch.full_like(z.argmax(-1), tm.IGNORE))
    else:
        t = (torch.sigmoid(z) > 0.5).long()
    got = STRATEGIES["gradnorm"].fn(s)["score"]
    torch.testing.assert_close(got, tm.loop_norms(model, x, task, t), rtol=2e-5, atol=1e-8)
    pseudo = strategy_inputs(model, x, task, egl_samples="pseudo")
    torch.testing.assert_close(STRATEGIES["egl"].fn(pseudo)["score"], got, rtol=1e-6, atol=1e-10)


# --- Monte-Carlo EGL against the exact expectation ---------------------------------------------------

class TokenTagger(nn.Module):
    """Embedding -> Linear per token: a token classifier small enough to enumerate."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(1)
        self.embed = nn.Embedding(10, 4)
        self.out = nn.Linear(4, 2)

    def forward(self, input_ids, attention_mask):
        return self.out(torch.tanh(self.embed(input_ids)))  # [B, T, 2]


class PixelSegmenter(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(2)
        self.conv = nn.Conv2d(1, 2, 1)

    def forward(self, x):
        return self.conv(x)  # [B, 2, H, W]


def enumerable():
    """(task, model, inputs, per-example list of label-set targets with their probabilities)."""
    torch.manual_seed(0)
    mlp = nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 3)).eval()       # 3 labels: 8 sets
    x_ml = torch.randn(3, 4)
    ids = torch.tensor([[3, 4, 5], [6, 7, 0]])
    tok = {"input_ids": ids, "attention_mask": (ids > 0).long()}                  # 3 and 2 tokens
    x_seg = torch.randn(2, 1, 1, 3)                                               # 3 pixels: 8 sets
    return [("multilabel", mlp, x_ml), ("token-classification", TokenTagger().eval(), tok),
            ("segmentation", PixelSegmenter().eval(), x_seg)]


def exact_egl(task, model, x) -> torch.Tensor:
    """sum over every joint label set y of P(y | x) ||grad loss(x, y)||, per example, float64."""
    with torch.no_grad():
        z = forward_logits(model, x).double()
    n = z.shape[0]
    out = torch.zeros(n, dtype=torch.float64)
    for i in range(n):
        if task == "multilabel":
            p = torch.sigmoid(z[i])                         # [C]
            positions = [torch.stack([1 - p[c], p[c]]) for c in range(p.shape[0])]
        elif task == "token-classification":
            valid = int(x["attention_mask"][i].sum())
            positions = [torch.softmax(z[i, t], 0) for t in range(valid)]
        else:
            positions = [torch.softmax(z[i, :, 0, w], 0) for w in range(z.shape[3])]
        for labels in itertools.product(*[range(len(q)) for q in positions]):
            prob = math.prod(float(q[k]) for q, k in zip(positions, labels))
            if task == "multilabel":
                t = torch.tensor([labels], dtype=torch.float64)
            elif task == "token-classification":
                t = torch.full((1, z.shape[1]), tm.IGNORE)
                t[0, :len(labels)] = torch.tensor(labels)
            else:
                t = torch.tensor(labels).reshape(1, 1, -1)
            one = {k: v[i:i + 1] for k, v in x.items()} if isinstance(x, dict) else x[i:i + 1]
            out[i] += prob * float(tm.loop_norms(model, one, task, t)[0])
    return out


@pytest.mark.parametrize("task,model,x", enumerable(), ids=lambda v: v if isinstance(v, str) else "")
def test_sampled_egl_is_the_exact_expectation_within_its_stated_error(task, model, x):
    exact = exact_egl(task, model, x)
    s = strategy_inputs(model, x, task, egl_samples=400, seed=3)
    cols = STRATEGIES["egl"].fn(s)
    err = (cols["score"] - exact).abs()
    assert (err <= 4 * cols["egl_se"] + 1e-12).all(), (cols["score"], exact, cols["egl_se"])
    assert (cols["egl_se"] > 0).all() and (cols["egl_se"] < 0.1 * exact).all()
    # fixed by (seed, id): the same example scores the same in another batch
    alone = strategy_inputs(model, {k: v[1:2] for k, v in x.items()} if isinstance(x, dict) else x[1:2],
                            task, egl_samples=400, seed=3)
    alone.ids = ["e1"]
    torch.testing.assert_close(STRATEGIES["egl"].fn(alone)["score"], cols["score"][1:2], rtol=1e-6, atol=0)


class BackwardOps(TorchDispatchMode):
    """Counts the convolution backward kernels the dispatcher runs."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten.convolution_backward.default:
            self.count += 1
        return func(*args, **(kwargs or {}))


def test_s_sampled_label_sets_cost_one_backward():
    model, x = tm.unet(), tm.images(3, 8)
    counts = {}
    for samples in (1, 8):
        s = strategy_inputs(model, x, "segmentation", egl_samples=samples, method="ghost")
        STRATEGIES["egl"].fn(s)  # the first call per model also probes layouts: not counted
        with BackwardOps() as ops:
            STRATEGIES["egl"].fn(strategy_inputs(model, x, "segmentation", egl_samples=samples, method="ghost"))
        counts[samples] = ops.count
    assert counts[1] == counts[8] > 0


# --- regression: exact, no sampling -------------------------------------------------------------------

@pytest.mark.parametrize("name", ["mlp_regression", "bert_regression"])
def test_regression_egl_is_the_closed_form_from_the_jacobian(name):
    task, model, x, _, _ = case(name)
    s = strategy_inputs(model, x, task)
    got = STRATEGIES["egl"].fn(s)["score"]
    torch.testing.assert_close(got, 2.0 * tm.loop_jacobian_norms(model, x), rtol=2e-5, atol=1e-10)


def test_regression_closed_form_is_the_root_mean_square_over_gaussian_targets():
    """E_y ||grad (f - y)^2||^2 with y ~ N(f, I), by sampling, against 4 ||J||_F^2."""
    model, x = tm.mlp_regression(3), tm.features(2)
    m = model.double()
    params = list(m.parameters())
    g = torch.Generator().manual_seed(0)
    for i in range(2):
        f = m(x[i:i + 1].double())
        jac = [torch.cat([d.reshape(-1) for d in torch.autograd.grad(f[0, k], params, retain_graph=True)])
               for k in range(3)]
        jac = torch.stack(jac)                                   # [D, P]
        eps = torch.randn(20000, 3, generator=g, dtype=torch.float64)
        sq = (2 * eps @ jac).square().sum(1)                     # ||2 J^T (f - y)||^2 per draw
        closed = 4 * jac.square().sum()
        assert float(sq.mean()) == pytest.approx(float(closed), rel=4 * float(sq.std()) / 20000 ** 0.5 / float(closed))


def test_gradnorm_and_utilities_on_regression_are_one_sentence():
    model, x = tm.mlp_regression(), tm.features(3)
    for name in ("gradnorm", "loss", "entropy", "margin", "least-confidence"):
        with pytest.raises(AlcliError) as err:
            STRATEGIES[name].fn(strategy_inputs(model, x, "regression"))
        assert f"--strategy {name}" in str(err.value) and "\n" not in str(err.value)


# --- the cheap utilities per position, aggregated ------------------------------------------------------

def per_position(task, z, mask):
    """Per example: a list of per-position probability vectors (valid positions only), float64."""
    z = z.double()
    out = []
    for i in range(z.shape[0]):
        if task == "multilabel":
            out.append([torch.stack([1 - torch.sigmoid(v), torch.sigmoid(v)]) for v in z[i]])
        elif task == "segmentation":
            out.append([torch.softmax(z[i, :, h, w], 0) for h in range(z.shape[2]) for w in range(z.shape[3])])
        else:
            out.append([torch.softmax(z[i, t], 0) for t in range(z.shape[1]) if mask[i, t]])
    return out


def reference(name, p):
    p = sorted(p.tolist(), reverse=True)
    if name == "entropy":
        return -sum(v * math.log(v) for v in p if v > 0)
    if name == "margin":
        return 1 - (p[0] - p[1])
    return 1 - p[0]


def aggregated(values, how):
    if how == "mean":
        return sum(values) / len(values)
    if how == "max":
        return max(values)
    k = math.ceil(float(how[4:]) * len(values))
    return sum(sorted(values, reverse=True)[:k]) / k


@pytest.mark.parametrize("name", ["unet", "bert_tokens", "timm_multilabel"])
@pytest.mark.parametrize("strategy", ["entropy", "margin", "least-confidence"])
@pytest.mark.parametrize("how", ["mean", "max", "top:0.3"])
def test_utilities_per_position_aggregated(name, strategy, how):
    task, model, x, _, _ = case(name)
    s = strategy_inputs(model, x, task, aggregate=how)
    got = STRATEGIES[strategy].fn(s)["score"]
    mask = x["attention_mask"] if isinstance(x, dict) else None
    for i, positions in enumerate(per_position(task, s.logits, mask)):
        expected = aggregated([reference(strategy, p) for p in positions], how)
        assert float(got[i]) == pytest.approx(expected, rel=1e-9, abs=1e-12)


def test_pred_and_confidence_per_task():
    task, model, x, _, _ = case("bert_tokens")
    rows = alcli.score_pool((x["input_ids"],), strategy="entropy", model=TokensOnly(model),
                            task="token-classification", batch_size=8)
    with torch.no_grad():
        z = model(input_ids=x["input_ids"]).logits.double()
    for row in rows:
        i = row["id"]
        expected = sorted(set(z[i].argmax(-1).tolist()))
        assert row["pred"] == "|".join(map(str, expected))
        assert row["confidence"] == pytest.approx(float(torch.softmax(z[i], -1).max(-1).values.mean()), rel=1e-9)
    ml_task, ml, xi, _, _ = case("timm_multilabel")
    rows = alcli.score_pool(xi, ml, task="multilabel", strategy="entropy")
    with torch.no_grad():
        p = torch.sigmoid(ml(xi).double())
    for row in rows:
        i = row["id"]
        assert row["pred"] == "|".join(str(c) for c in range(3) if p[i, c] > 0.5)
        assert row["confidence"] == pytest.approx(float(torch.maximum(p[i], 1 - p[i]).mean()), rel=1e-9)
    reg, xr = tm.mlp_regression(1), tm.features(3)
    rows = alcli.score_pool(xr, reg, task="regression")
    for row in rows:
        assert row["pred"] == pytest.approx(float(reg(xr[row["id"]:row["id"] + 1])[0, 0]), rel=1e-6)
        assert row["confidence"] is None and "loss" not in row


class TokensOnly(nn.Module):
    """A token classifier called with input_ids alone (a tensor pool holds one tensor)."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, input_ids):
        return self.inner(input_ids=input_ids).logits


# --- errors ------------------------------------------------------------------------------------------

def test_a_task_that_does_not_fit_the_output_is_one_sentence():
    model, x = tm.unet(), tm.images(2, 8)
    with pytest.raises(AlcliError) as err:
        alcli.score_pool(x, model, task="classification", strategy="entropy")
    msg = str(err.value)
    assert "--task classification" in msg and "[1, 3, 8, 8]" in msg and "\n" not in msg
    with pytest.raises(AlcliError) as err:
        alcli.score_pool(tm.features(3), nn.Sequential(nn.Linear(5, 1), nn.Flatten(0)), strategy="entropy")
    assert "pass --task" in str(err.value)


class NoPixels(nn.Module):
    """A segmenter whose output has no pixel: [B, 3, 0, 0]."""

    def __init__(self):
        super().__init__()
        self.head = nn.Conv2d(3, 3, 1)

    def forward(self, x):
        return self.head(x)[:, :, :0, :0]


def test_a_segmentation_output_without_pixels_is_one_sentence(tmp_path):
    """No pixel: every score undefined (not 0.0 for all), so the run stops, as for an output that
    fits no task."""
    torch.manual_seed(0)
    model, x = NoPixels().eval(), tm.images(2, 8)
    for task, strategy in itertools.product(("auto", "segmentation"), ("entropy", "gradnorm", "egl")):
        with pytest.raises(AlcliError) as err:
            alcli.score_pool(x, model, task=task, strategy=strategy)
        msg = str(err.value)
        assert "[1, 3, 0, 0]" in msg and "no pixel to score" in msg and "\n" not in msg, (task, strategy)
    from typer.testing import CliRunner
    from cli_errors import assert_one_error
    from alcli.cli import app
    torch.save(model.state_dict(), tmp_path / "m.pt")
    torch.save({"x": x, "ids": ["a", "b"]}, tmp_path / "pool.pt")
    out = CliRunner().invoke(app, ["score", str(tmp_path / "pool.pt"), "-m", str(tmp_path / "m.pt"),
                                   "--arch", "test_tasks:NoPixels", "-s", "entropy",
                                   "-o", str(tmp_path / "o.csv")])
    assert_one_error(out, "no pixel to score", "a 0-pixel output")
