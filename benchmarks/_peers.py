"""Peer libraries' per-example gradient norms, each behind one uniform factory.

A factory takes (model, inputs, targets, names) — `names` are the selected parameters' names, the
same selection alcli resolves — and returns a zero-argument callable giving norms `[B]`. `inputs`
is a tensor (the model's one positional argument) or a dict of tensors batched in dim 0 (keyword
arguments, as Hugging Face models take `input_ids` and `attention_mask`); the model may return the
logits or an object holding them in `.logits` (a Hugging Face `ModelOutput`). Every peer calls the
model and reads its logits through `forward_logits`, so that a peer that fails on such a model
fails on the model itself, not on our calling convention. Each peer
works on its own deep copy of the model (they install hooks or change flags in place), with
`requires_grad` on the selected parameters only, so that a peer differentiates only what alcli does.
A missing package raises PeerMissing; anything else a peer raises is its failure, reported as is.
"""
from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn


class PeerMissing(Exception):
    """The peer's package is not installed."""


def call(model: nn.Module, inputs):
    """The model's raw output: `model(**inputs)` for a dict, `model(inputs)` for a tensor."""
    return model(**inputs) if isinstance(inputs, dict) else model(inputs)


def logits_of(output) -> torch.Tensor:
    """The logits: the output itself, or its `.logits` (a Hugging Face ModelOutput)."""
    logits = getattr(output, "logits", None)
    return logits if isinstance(logits, torch.Tensor) else output


def forward_logits(model: nn.Module, inputs) -> torch.Tensor:
    return logits_of(call(model, inputs))


def _copy(model: nn.Module, names: list[str]) -> nn.Module:
    """A deep copy in eval mode whose selected parameters alone require grad."""
    m = copy.deepcopy(model).eval()
    chosen = set(names)
    for name, p in m.named_parameters():
        p.requires_grad_(name in chosen)
    return m


def _opacus_mode(m: nn.Module) -> nn.Module:
    """Opacus records a module only while that module is in training mode: train mode for the
    modules that own trainable parameters themselves (those Opacus hooks), Dropout and BatchNorm
    excepted; every other module stays in eval, so that the function is the same as the eval-mode
    model everyone else sees. (A whole-model train() would also turn on dropout that a container
    applies functionally, as Hugging Face attention does with `dropout_p if self.training`.)"""
    m.eval()
    for mod in m.modules():
        if isinstance(mod, (nn.Dropout, nn.modules.batchnorm._BatchNorm)):
            continue
        if any(p.requires_grad for p in mod.parameters(recurse=False)):
            mod.training = True  # this module alone, not its children
    return m


def _opacus_rnns(m: nn.Module, inputs) -> nn.Module:
    """Opacus serves nn.LSTM/GRU/RNN through its drop-in DPLSTM/DPGRU/DPRNN, which its documented
    `ModuleValidator.fix` swaps in with the same weights; used only when the outputs stay the same."""
    if not any(isinstance(mod, nn.RNNBase) for mod in m.modules()):
        return m
    from opacus.validators import ModuleValidator
    fixed = ModuleValidator.fix(m)
    with torch.no_grad():
        same = torch.allclose(forward_logits(fixed.eval(), inputs), forward_logits(m.eval(), inputs), atol=1e-5)
    return fixed if same else m


def _trainable(m: nn.Module) -> list[nn.Parameter]:
    return [p for p in m.parameters() if p.requires_grad]


def opacus_hooks(model, inputs, targets, names):
    """Opacus GradSampleModule (hooks mode): per-sample gradients in p.grad_sample, then norms."""
    try:
        from opacus import GradSampleModule
    except ImportError as err:
        raise PeerMissing(str(err)) from err
    m = _opacus_mode(_opacus_rnns(_copy(model, names), inputs))
    gsm = GradSampleModule(m, loss_reduction="sum")  # batch_first=True, strict=True (defaults)
    params = [(n, p) for n, p in m.named_parameters() if p.requires_grad]

    def run():
        loss = F.cross_entropy(forward_logits(gsm, inputs), targets, reduction="none").sum()
        loss.backward()
        batch = targets.shape[0]
        for n, p in params:  # e.g. [1, ...] for an embedding whose input all examples share
            rows = p.grad_sample.shape[0]
            if rows != batch:
                gsm.zero_grad(set_to_none=True)
                raise RuntimeError(f"Opacus gave {n} a grad_sample of {rows} row(s), not one per example "
                                   f"({batch})")
        sq = sum(p.grad_sample.flatten(1).pow(2).sum(1) for _, p in params)  # [B]
        gsm.zero_grad(set_to_none=True)  # clears .grad and .grad_sample
        return sq.sqrt()

    return run


def opacus_ghost(model, inputs, targets, names):
    """Opacus ghost clipping (GradSampleModuleFastGradientClipping): the per-sample norms its
    backward hooks leave in p._norm_sample, combined by get_norm_sample() (the first of the two
    backward passes DPLossFastGradientClipping would run; the clipped second pass is not needed)."""
    try:
        from opacus.grad_sample import GradSampleModuleFastGradientClipping
    except ImportError as err:
        raise PeerMissing(str(err)) from err
    m = _opacus_mode(_opacus_rnns(_copy(model, names), inputs))
    gsm = GradSampleModuleFastGradientClipping(m, loss_reduction="sum", max_grad_norm=1.0,
                                               use_ghost_clipping=True)
    params = _trainable(m)

    def run():
        loss = F.cross_entropy(forward_logits(gsm, inputs), targets, reduction="none").sum()
        loss.backward()
        norms = gsm.get_norm_sample()  # [B]
        for p in params:
            p.grad = None
        return norms

    return run


def backpack_l2(model, inputs, targets, names):
    """BackPACK BatchL2Grad: per-parameter squared per-example norms (p.batch_l2), summed, sqrt.

    Plain `extend(model)` first; if that cannot run the model (in-place residual adds, as in
    torchvision's ResNet), BackPACK's documented converter, `extend(model, use_converter=True)`.
    """
    try:
        from backpack import backpack, extend
        from backpack.extensions import BatchL2Grad
    except ImportError as err:
        raise PeerMissing(str(err)) from err
    lossf = extend(nn.CrossEntropyLoss(reduction="sum"))  # sum: batch_l2 is each example's own

    def build(use_converter: bool):
        m = extend(_copy(model, names), use_converter=use_converter)
        params = [(n, p) for n, p in m.named_parameters() if p.requires_grad]

        def run():
            loss = lossf(forward_logits(m, inputs), targets)
            with backpack(BatchL2Grad()):
                loss.backward()
            missing = [n for n, p in params if not hasattr(p, "batch_l2")]
            if missing:
                for _, p in params:
                    p.grad = None
                raise RuntimeError(f"BackPACK computed no batch_l2 for {len(missing)} of {len(params)} "
                                   f"parameters (first: {missing[0]})")
            sq = sum(p.batch_l2 for _, p in params)  # [B]
            for _, p in params:
                p.grad = None
                del p.batch_l2
            return sq.sqrt()
        return run

    run = build(False)
    try:
        run()  # a trial call: does plain extend serve this model?
    except Exception as plain_err:
        try:
            run = build(True)
            run()
        except Exception as conv_err:
            if _first(conv_err) == _first(plain_err):
                raise
            raise type(conv_err)(f"{_first(conv_err)} [plain extend: {_first(plain_err)}]") from conv_err
        run.note = f"extend(use_converter=True); plain extend failed: {_first(plain_err)}"
    return run


def _first(err: BaseException) -> str:
    lines = str(err).strip().splitlines()
    return f"{type(err).__name__}: {lines[0][:120] if lines else ''}"


def torch_func(model, inputs, targets, names):
    """Plain torch.func: functional_call + vmap(grad(loss of one example)) over the whole batch.
    A dict of inputs is vmapped over its leaves (in_dims 0 applies to every tensor in it) and
    passed as keyword arguments."""
    from torch.func import functional_call, grad, vmap
    m = _copy(model, names)
    params = {n: p.detach() for n, p in m.named_parameters() if p.requires_grad}

    def loss_of_one(p, x, t):
        if isinstance(x, dict):
            out = functional_call(m, p, (), {k: v.unsqueeze(0) for k, v in x.items()})
        else:
            out = functional_call(m, p, (x.unsqueeze(0),))
        return F.cross_entropy(logits_of(out), t.unsqueeze(0))

    per_example = vmap(grad(loss_of_one), in_dims=(None, 0, 0))

    def run():
        grads = per_example(params, inputs, targets)  # {name: [B, *shape]}
        return sum(g.flatten(1).pow(2).sum(1) for g in grads.values()).sqrt()

    return run


PEERS = {
    "opacus:hooks": opacus_hooks,
    "opacus:ghost": opacus_ghost,
    "backpack:BatchL2Grad": backpack_l2,
    "torch.func:vmap": torch_func,
}
