"""nn.LSTM, nn.GRU and nn.RNN (tanh, relu): any num_layers, bidirectional, with or without bias,
batch_first either way, an initial state, LSTM proj_size. Eval mode, as the engine borrows every
model (borrow.py), so no dropout between layers.

During the ghost forward the module runs this file's `rnn_forward`, the same math as the fused
kernel, one layer and direction at a time. For a layer and direction with input X [B, T, d_in],
hidden size H, G gates (LSTM 4, GRU 3, RNN 1) and h_{-1} the initial state (zeros by default):

    A = X W_ih^T + b_ih                 [B, T, G*H]  one matmul for all steps, tapped once
    LSTM  (b_hh folded into A)  i f g o = A_t + h_{t-1} W_hh^T, through sigmoid (i f o) and tanh (g)
          c_t = f c_{t-1} + i g;  m_t = o tanh(c_t);  h_t = m_t, or W_hr m_t with proj_size
    RNN   (b_hh folded into A)  h_t = tanh or relu(A_t + h_{t-1} W_hh^T)
    GRU   R_t = h_{t-1} W_hh^T + b_hh   [B, 3H]
          r z = sigmoid(A_t + R_t) (first 2H);  n = tanh(A_t + r R_t) (last H);  h_t = n + z (h_{t-1} - n)

The time loop does only the recurrent part, one addmm per step. The LSTM's g goes through the same
sigmoid as i, f, o: tanh(x) = 2 sigmoid(2x) - 1, so g's rows of W_ih, W_hh and the bias are
doubled before the matmuls; the tap's gradient then has g's columns halved, and the rule doubles
them back (tanh, on [B, H], costs several times a sigmoid on [B, 4H] on the CPU).
R (GRU) and the projected h (proj_size) are tapped for all steps at once: a [T, B, k] tensor
(b_hh broadcast, or zeros, plus the tap) unbound over T, each row the addmm bias of its step.
With dA the gradient at A (the gate pre-activation gradient), dR at R, dH at the projected h,
P [B, T, H_out] the h_{t-1} of every step and M [B, T, H] the m_t, per example:

    W_ih grad_i = dA_i^T X_i,   b_ih grad_i = sum_t dA_i
    W_hh grad_i = dA_i^T P_i,   b_hh grad_i = sum_t dA_i    (GRU: dR in place of dA)
    W_hr grad_i = dH_i^T M_i

squared norms in the Gram or materialised form (registry.sq_norm_of_product; W_ih and W_hh share
dA's Gram). Only the layers and directions owning a selected parameter are tapped, so the
backward stops at the earliest of them.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.rnn import PackedSequence

from ..errors import UnsupportedModel
from .registry import register, require_batch_dim, sq_norm_of_product


def rnn_forward(module, args, kwargs, tap):
    """nn.LSTM/GRU/RNN.forward with taps -> (its output, one (suffix, X, P, M) per tapped layer and
    direction, batch-first, for the rule). Taps, per tapped layer and direction: A, then R (GRU)
    or h (proj_size)."""
    x = args[0] if args else kwargs["input"]
    hx = args[1] if len(args) > 1 else kwargs.get("hx")
    if isinstance(x, PackedSequence):
        raise UnsupportedModel("a PackedSequence input: each step holds a different set of examples")
    if x.dim() != 3:
        raise UnsupportedModel("unbatched input")
    lstm, tdim = module.mode == "LSTM", 1 if module.batch_first else 0
    dirs = 2 if module.bidirectional else 1
    if hx is None:
        h0 = x.new_zeros(module.num_layers * dirs, x.shape[1 - tdim], module.proj_size or module.hidden_size)
        c0 = x.new_zeros(module.num_layers * dirs, x.shape[1 - tdim], module.hidden_size) if lstm else None
    else:
        h0, c0 = hx if lstm else (hx, None)
    records, h_n, c_n = [], [], []
    for layer in range(module.num_layers):
        outs = []
        for d in range(dirs):
            sfx = f"_l{layer}_reverse" if d else f"_l{layer}"
            k = layer * dirs + d
            tapped = any(p.requires_grad for p in _params(module, sfx).values())
            hs, h, c, p, m = _layer(module, x, tdim, sfx, h0[k], c0[k] if lstm else None, d == 1,
                                    tap if tapped else (lambda t: t))
            outs.append(torch.stack(hs, tdim))
            h_n.append(h)
            c_n.append(c)
            if tapped:
                records.append((sfx, (x if tdim == 1 else x.transpose(0, 1)).detach(), p, m))
        x = outs[0] if dirs == 1 else torch.cat(outs, -1)
    h_n = torch.stack(h_n)
    return (x, (h_n, torch.stack(c_n)) if lstm else h_n), tuple(records)


def _params(module, sfx) -> dict:
    names = ["weight_ih", "weight_hh"] + (["bias_ih", "bias_hh"] if module.bias else [])
    names += ["weight_hr"] if getattr(module, "proj_size", 0) else []
    return {n: getattr(module, n + sfx) for n in names}


def _layer(module, x, tdim, sfx, h, c, reverse, tap):
    """One layer and direction -> (h_t of every step in time order, h and c after the last step,
    P [B, T, H_out], M [B, T, H] or None)."""
    w = _params(module, sfx)
    mode, hidden, steps = module.mode, module.hidden_size, x.shape[tdim]
    w_ih, w_hh, b_ih = w["weight_ih"], w["weight_hh"], w.get("bias_ih")
    if b_ih is not None and mode != "GRU":  # b_hh folds into the input projection
        b_ih = b_ih + w["bias_hh"]
    scale = _gate_scale(module, x)
    if scale is not None:  # LSTM: g's rows doubled, so one sigmoid serves all four gates
        w_ih, w_hh = w_ih * scale[:, None], w_hh * scale[:, None]
        b_ih = None if b_ih is None else b_ih * scale
    a = tap(F.linear(x, w_ih, b_ih)).unbind(tdim)  # T x [B, G*H]
    w_hh = w_hh.t()
    if mode == "GRU":  # the hidden projection of every step, its bias included: r gates part of it
        base = w.get("bias_hh", x.new_zeros(()))
        rows = tap(base.expand(steps, h.shape[0], 3 * hidden)).unbind(0)
    elif "weight_hr" in w:  # the projected h of every step
        w_hr = w["weight_hr"].t()
        rows = tap(x.new_zeros(()).expand(steps, h.shape[0], w_hr.shape[1])).unbind(0)
    hs, prev, ms = [None] * steps, [], []
    for t in (range(steps - 1, -1, -1) if reverse else range(steps)):
        prev.append(h)
        if mode == "LSTM":
            i, f, g, o = torch.addmm(a[t], h, w_hh).sigmoid().chunk(4, 1)
            c = torch.addcmul(f * c - i, i, g, value=2)  # f c + i (2 g - 1)
            h = o * c.tanh()
            if "weight_hr" in w:
                ms.append(h)
                h = torch.addmm(rows[t], h, w_hr)
        elif mode == "GRU":
            hid = torch.addmm(rows[t], h, w_hh)
            r, z = (a[t][:, :2 * hidden] + hid[:, :2 * hidden]).sigmoid().chunk(2, 1)
            n = torch.addcmul(a[t][:, 2 * hidden:], r, hid[:, 2 * hidden:]).tanh()
            h = torch.addcmul(n, z, h - n)
        else:
            pre = torch.addmm(a[t], h, w_hh)
            h = pre.tanh() if mode == "RNN_TANH" else pre.relu()
        hs[t] = h
    with torch.no_grad():  # the rule's inputs, batch-first, in time order
        order = slice(None, None, -1) if reverse else slice(None)
        p = torch.stack(prev[order], 1)
        m = torch.stack(ms[order], 1) if ms else None
    return hs, h, c, p, m


def _gate_scale(module, like):
    """LSTM: 2 on g's rows, 1 on the others (tanh(x) = 2 sigmoid(2x) - 1); None for GRU and RNN."""
    if module.mode != "LSTM":
        return None
    hidden = module.hidden_size
    scale = torch.ones(4 * hidden, dtype=like.dtype, device=like.device)
    scale[2 * hidden:3 * hidden] = 2
    return scale


@register(nn.LSTM, nn.GRU, nn.RNN, layout="own", capture=rnn_forward)
def rnn_rule(module, call, wanted):
    """Per tapped layer and direction: the weights' squared norms (per-example gradients where
    `wanted`) from dA (dR, dH) and X, P, M; the biases' per-example gradients [B, G*H]."""
    require_batch_dim(call, 0 if module.batch_first else 1)
    grads = iter(call.grad_out)
    out = {}
    for sfx, x, p, m in call.args:
        d_a = next(grads)
        d_a = d_a if module.batch_first else d_a.transpose(0, 1)            # [B, T, G*H]
        scale = _gate_scale(module, d_a)
        if scale is not None:  # the tap saw g's columns doubled, so its gradient has them halved
            d_a = d_a * scale
        d_h = next(grads).transpose(0, 1) if module.mode == "GRU" else d_a  # at h_{t-1} W_hh^T + b_hh
        shared = {} if d_h is d_a else None  # LSTM/RNN: W_ih and W_hh share G, and its Gram
        products = [("weight_ih", x, d_a, shared), ("weight_hh", p, d_h, shared)]
        if m is not None:
            products.append(("weight_hr", m, next(grads).transpose(0, 1), None))
        for name, a, g, g_grams in products:
            path = name + sfx
            if path in wanted:
                out[path] = (g.transpose(1, 2) @ a if wanted[path]
                             else sq_norm_of_product(a, g, call.cache, path, g_grams))
        for name, g in (("bias_ih", d_a), ("bias_hh", d_h)):
            if name + sfx in wanted:  # [B, G*H]: the driver squares small per-example gradients at once
                out[name + sfx] = g.sum(1)
    return out
