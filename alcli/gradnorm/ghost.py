"""Ghost norms: one batched forward and one backward that stops at the selected layers' outputs.

1. Every module that owns (or whose rule claims) a selected parameter runs its forward through a
   wrapper (a forward hook where the module holds a forward of its own) that records its inputs
   and adds a zero "tap" to its output: out + Z with Z a stride-0 zero leaf. dL/dZ is the
   loss gradient at the output as the module produced it, even if later code modifies the output
   in place, and the backward never runs past the earliest tap.
2. One backward of the summed loss into the taps: row i of dL/dZ is example i's own output
   gradient (examples do not interact in eval mode).
3. As each tap's gradient arrives, the layer rule turns (inputs, output gradient) into per-example
   squared norms, or per-example gradients for parameters used more than once (calls add before
   the norm; cross terms count).
"""
from __future__ import annotations

import contextlib
import functools
import weakref

import torch
from torch import nn
from torch.func import vmap
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils._pytree import tree_flatten, tree_unflatten

from ..errors import first_line
from . import outer
from .compiled import compile_once
from .errors import UnsupportedModel
from .forwards import each_call
from .layout import MERGED, call_layouts, check_batch, checked_in_pass, largest_output
from .loss import cross_entropy, cross_entropy_cotangents
from .model_io import batch_size, forward_logits, tensors
from .params import ParamSelection
from .plan import HookPlan, covering_modules, ghost_plan_for, pass_may_check
from .rules import RuleCall
from .rules.registry import target_vmap
from .uses import UseWatch


class _Call:
    """One call of a hooked module: what its rule will see, and the driver's bookkeeping."""
    __slots__ = ("name", "receiver", "args", "kwargs", "taps", "out_spec", "tapped", "versions", "arrived",
                 "layout", "out_move", "out_blocks", "expanded", "out_rows", "cache", "__weakref__")

    def __init__(self, name: str, receiver: list, args: tuple, kwargs: dict):
        self.name, self.receiver = name, receiver  # receiver[0]: the backward pass its taps' gradients go to
        self.args, self.kwargs = args, kwargs
        self.taps: list = []       # stride-0 zero leaves, one per float output
        self.out_spec = None       # pytree spec of the output (None: a single tensor)
        self.tapped: list = []     # per output leaf: does it carry a tap
        self.versions: list = []   # input tensors' version counters at capture
        self.arrived = None        # output gradients received so far in this pass
        self.layout = None         # layout.Layout: batch dim of every leaf
        self.out_move = 0          # batch dim of the output, moved to 0 for the rule
        self.out_blocks = 0        # k when that dim is [B*k] with the batch outer
        self.expanded = False      # a shared [1, ...] call tapped as [B, ...]
        self.out_rows = False      # rows [B*k, C] handed to the rule as [B, C, k]
        self.cache: dict = {}      # the rule's, across target sets


def ghost_norms(model, inputs, targets_for, selection: ParamSelection, loss_fn, compiled: bool = False,
                direction: dict | None = None):
    """-> [K, B] norms and [B, C] logits; `targets_for(logits)` gives the K target sets.
    `compiled`: the rules' arithmetic of a backward runs as one torch.compile'd graph.
    `direction` (parameter id -> V, a tensor of the parameter's shape): [K, 2, B] instead, each
    example's norm and its gradient's inner product with V, g_i·V, from the same backward (the
    rules give per-example gradients, dense or factored, and `outer.dot` takes them, or a rule
    takes the dot itself, `Entry.dot`: convolutions; not compiled)."""
    plan = ghost_plan_for(model, selection, inputs)
    batch = batch_size(inputs)
    receiver: list = [None]  # the _Pass running now, which the taps' hooks hand their gradients to
    calls: dict[str, list[_Call]] = {name: [] for name in plan.modules}
    stack: list[str] = []  # hooked modules running now, for UseWatch
    handles = []

    def pre_hook(name):
        def hook(module, args, kwargs):
            stack.append(name)
        return hook

    def tapper(name):
        """(args, kwargs, output) of a call of module `name` -> its output, tapped."""
        module_calls, shared = calls[name], _broadcast_calls(plan, layouts, name)
        in_place = _output_unsaved(type(plan.modules[name]))

        def tapped(args, kwargs, output):
            call = _new_call(name, receiver, args, kwargs)
            if isinstance(output, torch.Tensor) and output.is_floating_point():  # the common case
                if shared and len(module_calls) in shared and args and isinstance(args[0], torch.Tensor):
                    # a shared [1, ...] call: tapped as the batch sees it, [B, ...]
                    call.args = (args[0].expand(batch, *args[0].shape[1:]), *args[1:])
                    output = output.expand(batch, *output.shape[1:])
                    call.expanded = True
                module_calls.append(call)
                return _tap(call, output, in_place and not call.expanded)
            leaves, call.out_spec = tree_flatten(output)
            leaves = [_tap(call, leaf) if isinstance(leaf, torch.Tensor) and leaf.is_floating_point()
                      else _untapped(call, leaf) for leaf in leaves]
            module_calls.append(call)
            try:
                return tree_unflatten(leaves, call.out_spec)
            except (AssertionError, TypeError, ValueError) as err:  # e.g. a PackedSequence
                raise UnsupportedModel(f"module '{name}' returns a {type(output).__name__}, which "
                                       "cannot carry the taps") from err
        return tapped

    def tapped_after(name, args, kwargs, output):  # each_call's `after`: the output, tapped
        if verify:
            stack.pop()
        return tappers[name](args, kwargs, output)

    def popped(module, args, kwargs, output):
        stack.pop()

    def capturing_forward(name, module):
        """For rules that tap tensors inside the module (q, k, v of attention): the rule's own
        forward, given a fresh call to record its inputs and taps in."""
        capture = plan.rules[name].capture

        def forward(*args, **kwargs):
            call = _new_call(name, receiver, args, kwargs)
            calls[name].append(call)
            try:
                output, call.args = capture(module, args, kwargs, lambda t: _tap(call, t))
            except UnsupportedModel as err:
                raise UnsupportedModel(f"module '{name}' ({type(module).__name__}): {err}") from err
            call.kwargs = {}
            call.out_spec = tree_flatten([None] * len(call.taps))[1]  # grad_out: one per tap
            return output
        return forward

    layouts = call_layouts(model, inputs, plan.modules, pass_may_check(selection))  # checked_in_pass finishes them
    verify = not selection.plans.get("uses checked")
    tappers = {name: tapper(name) for name in plan.modules if plan.rules[name].capture is None}
    patched = []
    try:
        for name, module in plan.modules.items():
            if name in tappers:
                continue
            if verify:  # its capturing forward records the call
                handles.append(module.register_forward_pre_hook(pre_hook(name), with_kwargs=True))
                handles.append(module.register_forward_hook(popped, with_kwargs=True))
            if "forward" not in module.__dict__:
                module.forward = capturing_forward(name, module)
                patched.append(module)
        with each_call({name: plan.modules[name] for name in tappers}, tapped_after,
                       stack.append if verify else None), \
                _attention_for(model, batch * largest_output(model, inputs, plan.modules), tensors(inputs)[0].device), \
                checked_in_pass(model, inputs, plan.modules):
            if verify:
                with UseWatch(covering_modules(plan), stack):
                    logits = forward_logits(model, inputs)
                selection.plans["uses checked"] = True  # a selection is rebuilt when the model changes
            else:
                logits = forward_logits(model, inputs)
    finally:
        for handle in handles:
            handle.remove()
        for module in patched:
            del module.__dict__["forward"]

    _check_unmodified(calls)
    _apply_layouts(plan, calls, layouts, batch)
    uses = _count_uses(plan, calls)
    taps = [tap for module_calls in calls.values() for call in module_calls for tap in call.taps]
    target_sets = targets_for(logits)
    if not taps or not logits.requires_grad:  # no selected parameter affects the loss
        shape = (len(target_sets), batch) if direction is None else (len(target_sets), 2, batch)
        return torch.zeros(shape, dtype=_acc_dtype(logits.device), device=logits.device), logits
    cotangents = _cotangents(logits, target_sets, loss_fn)  # [K, *logits.shape]
    k_batched = len(target_sets) > 1 and _k_mode.get(model) != "per target" and \
        _vmap_chunk(len(target_sets), _largest(taps), logits.device) > 1
    if _k_batched.get(model) is not k_batched:
        _k_batched[model] = k_batched
    with _no_autocast(logits.device):  # the rules square and sum in float32 or better
        if compiled and direction is None:
            return _compiled_backwards(model, plan, uses, calls, taps, logits, cotangents, batch), logits
        return _backwards(model, plan, uses, calls, taps, logits, cotangents, batch, receiver, direction), logits


def _backwards(model, plan, uses, calls, taps, logits, cotangents, batch, receiver, direction=None) -> torch.Tensor:
    """[K, B] norms ([K, 2, B] norms and inner products with a `direction`): the K output
    cotangents through ONE backward (vmapped over K) when the model's backward and rules can be
    vmapped, else one backward per target set."""
    k = cotangents.shape[0]

    def backward(cotangent, last):
        return _backward(plan, uses, calls, taps, logits, cotangent, batch, last, receiver, direction)

    if k == 1:
        return backward(cotangents[0], last=True).unsqueeze(0)
    chunk = _vmap_chunk(k, _largest(taps), cotangents.device)
    if _k_mode.get(model) != "per target" and chunk > 1:
        try:
            # the graph and the captured inputs are kept, for one backward per target set if a
            # backward op or rule cannot be vmapped (the generic rule's per-example pullback)
            with target_vmap():
                norms = torch.cat([vmap(lambda g: backward(g, last=False))(cotangents[i:i + chunk])
                                   for i in range(0, k, chunk)])
            _k_mode[model] = "batched"
            return norms
        except torch.OutOfMemoryError:
            raise
        except (RuntimeError, NotImplementedError) as err:
            _k_mode[model] = "per target"
            _k_reasons[model] = first_line(err)
    return torch.stack([backward(cotangents[i], last=i + 1 == k) for i in range(k)])


def _compiled_backwards(model, plan, uses, calls, taps, logits, cotangents, batch) -> torch.Tensor:
    """[K, B] norms (`--compile`): the backward hands every tap's gradient back at once (the K
    target sets batched through it where they fit, as in `_backwards`), then all rules and the
    sum over layers run as one compiled graph."""
    scale = FP16_SCALE if logits.dtype == torch.float16 else 1.0
    cotangents = (cotangents * scale if scale != 1.0 else cotangents).to(logits.dtype)
    chunk = _vmap_chunk(cotangents.shape[0], _largest(taps), cotangents.device) if _k_mode.get(model) != "per target" else 1
    try:
        norms = _compiled_chunks(plan, uses, calls, taps, logits, cotangents, batch, chunk)
    except torch.OutOfMemoryError:
        raise
    except (RuntimeError, NotImplementedError) as err:  # a backward op or rule vmap cannot batch
        if chunk == 1:
            raise
        _k_mode[model], _k_reasons[model] = "per target", first_line(err)
        norms = _compiled_chunks(plan, uses, calls, taps, logits, cotangents, batch, 1)
    return norms / scale if scale != 1.0 else norms


def _compiled_chunks(plan, uses, calls, taps, logits, cotangents, batch, chunk: int) -> torch.Tensor:
    """[K, B] norms, `chunk` target sets per backward (1: [*tap.shape] gradients, no vmap)."""
    rules = compile_once(_rules_of_pass, logits.device)
    k, norms = cotangents.shape[0], []
    for i in range(0, k, chunk):
        if chunk == 1:
            grads = torch.autograd.grad(logits, taps, cotangents[i], retain_graph=i + 1 < k, allow_unused=True)
        else:  # the graph is kept, for one backward per target set if this one cannot be batched
            grads = torch.autograd.grad(logits, taps, cotangents[i:i + chunk], retain_graph=True,
                                        allow_unused=True, is_grads_batched=True)  # [chunk, *tap.shape]
        norms.append(rules(plan, uses, calls, list(grads), batch, logits.device, chunk > 1))
    return torch.cat(norms)


def _rules_of_pass(plan, uses, calls, grads, batch: int, device, batched: bool) -> torch.Tensor:
    """[K, B] norms from the taps' gradients, each [K, *tap.shape] when `batched`, else
    [*tap.shape] (K = 1); None where a tap got none. The function `--compile` compiles."""
    def one_set(tap_grads):
        backward_pass = _Pass(plan, uses, last=False)
        at = 0
        for name, module_calls in calls.items():
            for call in module_calls:
                call.arrived = tap_grads[at:at + len(call.taps)]
                at += len(call.taps)
                if all(g is not None for g in call.arrived):
                    backward_pass._run(name, call)
        return backward_pass.finish(calls, batch, device)
    return vmap(one_set)(grads) if batched else one_set(grads).unsqueeze(0)


def _largest(taps) -> int:
    return max(max(t.numel() for t in taps), 1)  # examples without tokens: empty taps


def _vmap_chunk(k: int, largest: int, device) -> int:
    """How many of the K target sets one vmapped backward takes: all K where the K copies of the
    largest tapped output stay small, fewer where they would not (1: one backward per target
    set). Measured on a 2-core CPU (benchmarks/egl_chunks.py), where the backward is bound by
    memory traffic: vmapping 8 label sets of fcn_resnet50 (16x3x128x128) took twice as long as
    8 backwards, while a small conv net's 10 classes took 0.8x."""
    limit = VMAP_ELEMENTS_CUDA if device.type == "cuda" else VMAP_ELEMENTS
    if limit is None:
        return k
    return max(1, min(k, limit // largest))


VMAP_ELEMENTS = 2 ** 21  # K x the largest tapped output's elements per vmapped backward
VMAP_ELEMENTS_CUDA = None  # on CUDA all K at once, until a GPU measures it (benchmarks/gpu.py)


# model -> "batched" | "per target": how its K target sets go through the backward
_k_mode: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
_k_reasons: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
# model -> did its last batch's K target sets go through one vmapped backward (unknown before its
# first call: see _attention_for)
_k_batched: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _attention_for(model, tap_elements: int, device):
    """The forward's attention kernel. The fused kernels' backwards (flash, efficient, cuDNN,
    flash-for-CPU) have no vmap batching rule, so a vmapped backward runs them once per target
    set and torch warns of a "performance drop"; the math kernel (softmax(q k^T / sqrt(d)) v as
    matmuls) is batched by vmap, but keeps each layer's [B, H, T, T] weights for the backward
    (GPT-2 small at T = 2048, B = 2: 4.8 GB). Fused kernels where the backward is not vmapped:
    K = 1, or taps too large for two target sets at once (`_vmap_chunk`), which on the first
    call, before the forward tells K, is judged from the probe's largest output (`tap_elements`)."""
    batched = _k_batched.get(model)
    if batched is None:
        batched = _vmap_chunk(2, max(tap_elements, 1), device) > 1
    return sdpa_kernel(SDPBackend.MATH) if batched else contextlib.nullcontext()


def _backward(plan, uses, calls, taps, logits, cotangent, batch: int, last: bool, receiver, direction=None) -> torch.Tensor:
    """One backward of `cotangent` [*logits.shape] from the logits into the taps -> [B] norms
    ([2, B] norms and inner products with a `direction`)."""
    backward_pass = receiver[0] = _Pass(plan, uses, last, direction)
    # fp16 gradients underflow below 6e-8: the cotangent is scaled up, and the norms back down
    scale = FP16_SCALE if logits.dtype == torch.float16 else 1.0
    try:
        torch.autograd.grad(logits, taps, (cotangent * scale if scale != 1.0 else cotangent).to(logits.dtype),
                            retain_graph=not last, allow_unused=True)
    finally:
        receiver[0] = None
    norms = backward_pass.finish(calls, batch, logits.device)
    return norms / scale if scale != 1.0 else norms


FP16_SCALE = 2.0 ** 10


def _cotangents(logits, target_sets, loss_fn) -> torch.Tensor:
    """d(sum_i loss_fn(logits, t_k)_i)/d(logits) for each target set k -> [K, *logits.shape],
    in float32 or better (bf16/fp16 logits are upcast first)."""
    z = logits.detach()
    if z.dtype in (torch.float16, torch.bfloat16):
        z = z.float()

    if loss_fn is cross_entropy and z.dim() == 2:
        return cross_entropy_cotangents(z, torch.stack(list(target_sets)))
    closed = getattr(loss_fn, "cotangent", None)  # a loss's own closed-form gradient (logits, targets)
    if closed is not None:
        if len(target_sets) == 1:  # no stacked copy of a language model's [B, T, V]
            return closed(z, target_sets[0]).unsqueeze(0)
        return torch.stack([closed(z, t) for t in target_sets])

    def one(targets):
        return torch.func.grad(lambda l: loss_fn(l, targets).sum())(z)

    if len(target_sets) > 1:
        try:
            return vmap(one)(torch.stack(list(target_sets)))
        except (RuntimeError, NotImplementedError, TypeError, ValueError):
            pass  # a loss function torch.func cannot vmap: one target set at a time
    return torch.stack([one(t) for t in target_sets])


def _acc_dtype(device) -> torch.dtype:
    """Squared norms add up in float64 (float32 on MPS, which has no float64)."""
    return torch.float32 if device.type == "mps" else torch.float64


def _no_autocast(device):
    if device.type in ("cuda", "cpu") and torch.is_autocast_enabled(device.type):
        return torch.autocast(device.type, enabled=False)
    return contextlib.nullcontext()


def _new_call(name: str, receiver: list, args: tuple, kwargs: dict) -> _Call:
    """`args` and `kwargs` as the call got them (its own tuple and dict: kept, not copied)."""
    call = _Call(name, receiver, args, kwargs)
    if not kwargs and len(args) == 1 and isinstance(args[0], torch.Tensor):  # the common call
        call.versions = [(args[0], args[0]._version)]
        return call
    leaves = tree_flatten((args, kwargs))[0]
    call.versions = [(t, t._version) for t in leaves if isinstance(t, torch.Tensor)]
    return call


_ZEROS: dict = {}  # (dtype, device) -> a 0-dim zero to expand from


def _zero(dtype, device) -> torch.Tensor:
    key = (dtype, device)
    if key not in _ZEROS:
        _ZEROS[key] = torch.zeros((), dtype=dtype, device=device)
    return _ZEROS[key]


# modules whose backward reads their inputs and weights but never their output (their own
# forward, not a subclass's): that output takes its tap in place (tensor += Z), no copy of it.
# SSDlite's tapped forward at B = 8, 320 px, one thread: 0.28-0.31 s -> 0.22 s (untapped: 0.21 s)
_OUTPUT_UNSAVED = (nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.Linear, nn.modules.batchnorm._BatchNorm)


_UNSAVED_TYPES: dict = {}  # module type -> does its forward run one of _OUTPUT_UNSAVED's own


def _output_unsaved(kind: type) -> bool:
    if kind not in _UNSAVED_TYPES:
        _UNSAVED_TYPES[kind] = any(kind.forward is t.forward for t in _OUTPUT_UNSAVED)
    return _UNSAVED_TYPES[kind]


def _tap(call: _Call, tensor: torch.Tensor, in_place: bool = False) -> torch.Tensor:
    """tensor + Z, with Z a stride-0 zero leaf whose gradient is dL/d(tensor) as it is now; added
    in place (`in_place`) where the tensor is an op's own fresh result, not a view or a leaf."""
    tap = _zero(tensor.dtype, tensor.device).expand(tensor.shape)
    tap.requires_grad_()
    # the hook as Tensor.register_hook stores it, without the handle a fresh leaf never needs (a
    # third of a tap's cost); a weak reference: the call holds its taps, a tap's hook not the call
    tap._backward_hooks = {0: functools.partial(_arrived, call.receiver, weakref.ref(call), len(call.taps))}
    call.taps.append(tap)
    call.tapped.append(True)
    if in_place and not tensor.is_leaf and tensor._base is None:  # is_leaf: no grad_fn object made
        return tensor.add_(tap)
    return tensor + tap


def _arrived(receiver: list, call_ref, i: int, grad):
    """A tap's hook: its gradient to the backward pass running now; with none (the compiled
    path) or no gradient (an output a custom backward left undefined, rcnn._Parts), autograd
    keeps it."""
    backward_pass, call = receiver[0], call_ref()
    if backward_pass is None or call is None or grad is None:
        return None
    return backward_pass.on_grad(call, i, grad)


def _untapped(call: _Call, leaf):
    call.tapped.append(False)
    return leaf


class _Pass:
    """One target set's backward pass. Each call's rule runs as soon as its output gradient has
    arrived, so output gradients (and, on the last pass, captured inputs) are freed as the
    backward proceeds instead of all being held at once."""

    def __init__(self, plan: HookPlan, uses: dict, last: bool, direction: dict | None = None):
        self.plan, self.uses, self.last = plan, uses, last
        self.direction = direction  # parameter id -> V (ghost_norms), or None: the norms alone
        self.dots: list[torch.Tensor] = []   # per-example inner products with V [B], one per parameter
        self.sq: list[torch.Tensor] = []     # per-example squared norms [B], one per parameter and call
        self.small: list[torch.Tensor] = []  # per-example gradients [B, n] of small parameters
        # parameter id -> its uses' per-example gradients so far (outer.add: a dense sum, factors)
        self.summed_grads: dict[int, list] = {}
        self.wanted: dict[str, dict] = {}  # module name -> {path: per-example gradient wanted}

    def on_grad(self, call: _Call, i: int, grad: torch.Tensor) -> torch.Tensor:
        """Tap i of `call` got its gradient; the call's rule runs once all its taps have one."""
        if call.arrived is None:
            call.arrived = [None] * len(call.taps)
        call.arrived[i] = grad
        if all(g is not None for g in call.arrived):
            self._run(call.name, call)
        # autograd.grad keeps what the hook returns: a stride-0 zero, not the gradient
        return _zero(grad.dtype, grad.device).expand(grad.shape)

    def _run(self, name, call):
        arrived, call.arrived = call.arrived, None
        if call.out_spec is None:  # a single tensor output, whose one gradient has arrived
            grad_out = arrived[0]
        else:
            grads = iter(g if g is not None else torch.zeros(t.shape, dtype=t.dtype, device=t.device)
                         for g, t in zip(arrived, call.taps))
            try:
                grad_out = tree_unflatten([next(grads) if has_tap else None for has_tap in call.tapped],
                                          call.out_spec)
            except (AssertionError, TypeError, ValueError) as err:  # e.g. a PackedSequence
                raise UnsupportedModel(f"module '{name}': its output gradient cannot be rebuilt as the "
                                       "structure its output has") from err
        if call.out_move:  # "anywhere" rules get the batch in dim 0
            grad_out = grad_out.movedim(call.out_move, 0)
        if call.out_blocks:  # [B*k, ...] -> [B, k, ...]
            grad_out = grad_out.unflatten(0, (-1, call.out_blocks))
        if call.out_rows:  # [B, k, C] -> [B, C, k]
            grad_out = grad_out.transpose(1, 2)
        module, paths = self.plan.modules[name], self.plan.paths[name]
        entry = self.plan.rules[name]
        wanted = self.wanted.get(name)
        if wanted is None:
            # with a direction, a rule without a dot of its own gives per-example gradients (dense
            # or factored) for the driver to dot
            by_driver = self.direction is not None and entry.dot is None
            wanted = self.wanted[name] = {path: by_driver or self.uses[id(p)] > 1 for path, p in paths.items()}
        # bf16/fp16 (autocast) inputs and gradients: the rules square and sum in float32
        args, kwargs, grad_out = _float32((call.args, call.kwargs, grad_out))
        seen = RuleCall(args, kwargs, grad_out, call.cache, call.layout)
        try:
            result = entry.rule(module, seen, wanted)
            if self.direction is not None and entry.dot is not None:  # the rule's own dot, for
                # parameters used once (their norms come from the rule as without a direction)
                own = {path: self.direction[id(p)] for path, p in paths.items() if not wanted[path]}
                self.dots.extend(entry.dot(module, seen, own).values())
        except UnsupportedModel as err:
            raise UnsupportedModel(f"module '{name}' ({type(module).__name__}): {err}") from err
        for path, value in result.items():
            key = id(paths[path])
            if self.direction is not None and self.uses[key] == 1 and entry.dot is None:  # its whole
                self._norm_and_dot(outer.add([], value), key)                              # gradient: now
            elif wanted[path]:
                self.summed_grads[key] = outer.add(self.summed_grads.get(key, []), value)
            elif value.dim() > 1:  # a small per-example gradient [B, *shape]: squared in finish
                self.small.append(value if value.dim() == 2 else value.reshape(value.shape[0], -1))
            else:
                self.sq.append(value)
        if self.last:
            call.args, call.kwargs, call.cache = None, None, None

    def finish(self, calls, batch: int, device) -> torch.Tensor:
        """Calls whose outputs got only part of their gradient (an unused output) run now with
        zeros for the rest; calls that got none contribute nothing."""
        for name, module_calls in calls.items():
            for call in module_calls:
                if call.arrived is not None and any(g is not None for g in call.arrived):
                    self._run(name, call)
        acc = _acc_dtype(device)
        if self.small:  # one cat, square and sum for all of them: [B, sum n] -> [B]
            self.sq.append(torch.cat(self.small, 1).square().sum(1))
        if self.direction is not None:
            for key, terms in self.summed_grads.items():
                self._norm_and_dot(terms, key)
            return torch.stack([_total(self.sq, batch, acc, device).clamp_min(0).sqrt(),
                                _total(self.dots, batch, acc, device)])
        for terms in self.summed_grads.values():
            self.sq.append(outer.sq_norm(terms, acc))
        if not self.sq:
            return torch.zeros(batch, dtype=acc, device=device)
        # one stack and one sum for the whole pass: [P, B] -> [B], accumulated in float64
        return torch.stack(self.sq).sum(0, dtype=acc).clamp_min_(0).sqrt_()

    def _norm_and_dot(self, terms: list, key: int):
        """A parameter's per-example gradient (its terms) -> its [B] squared norm and g·V."""
        acc = _acc_dtype(self.direction[key].device)
        self.sq.append(outer.sq_norm(terms, acc))
        self.dots.append(outer.dot(terms, self.direction[key], acc))


def _total(parts: list, batch: int, acc, device) -> torch.Tensor:
    """[P, B] -> [B] in `acc` (zeros where there are none)."""
    if not parts:
        return torch.zeros(batch, dtype=acc, device=device)
    return torch.stack([p.to(acc) for p in parts]).sum(0)


_LOW = (torch.float16, torch.bfloat16)


def _float32(tree):
    """Half-precision tensors in a pytree as float32 (the tree itself when there are none)."""
    args, kwargs, grad_out = tree
    if (not kwargs and isinstance(grad_out, torch.Tensor) and grad_out.dtype not in _LOW
            and all(isinstance(a, torch.Tensor) and a.dtype not in _LOW for a in args)):
        return tree  # the common call: tensors in float32 or float64, no pytree walk
    leaves, spec = tree_flatten(tree)
    if not any(isinstance(t, torch.Tensor) and t.dtype in _LOW for t in leaves):
        return tree
    return tree_unflatten([t.float() if isinstance(t, torch.Tensor) and t.dtype in _LOW else t
                           for t in leaves], spec)


def _apply_layouts(plan: HookPlan, calls, layouts, batch: int):
    """Give each call its batch layout and put the batch where its rule expects it."""
    for name, module_calls in calls.items():
        if len(layouts[name]) != len(module_calls):
            raise UnsupportedModel(f"module '{name}' is called a different number of times for "
                                   "different batch sizes")
        kind = plan.rules[name].layout
        where = f"module '{name}' ({type(plan.modules[name]).__name__})"
        for call, layout in zip(module_calls, layouts[name]):
            call.layout = layout
            if kind == "own":
                continue
            if not call.args or not isinstance(call.args[0], torch.Tensor) or not call.taps:
                raise UnsupportedModel(f"{where}: its rule needs a tensor as the first positional "
                                       "input and a floating-point output")
            d_in, d_out = (0, 0) if call.expanded else (layout.in_dims[0], layout.out_dims[0])
            x, out = call.args[0], call.taps[0]  # the tap has the output's shape
            if d_in is None or d_out is None:
                raise UnsupportedModel(f"{where}: its input or output is shared by all examples")
            if (plan.rules[name].rows and x.dim() == 2 and not call.expanded and _in_blocks(layout, x, out, batch)
                    and layout.in_blocks[0][0] == layout.out_blocks[0][0] == 0):
                # [B*k, C] rows of a per-row layer (LeViT's BatchNorm1d on flattened tokens): [B, C, k]
                call.args = (x.unflatten(0, (batch, layout.in_blocks[0][1])).transpose(1, 2), *call.args[1:])
                call.out_blocks, call.out_rows = layout.out_blocks[0][1], True
                continue
            if (plan.rules[name].blocks and not call.expanded and _in_blocks(layout, x, out, batch)
                    and layout.in_blocks[0][0] == layout.out_blocks[0][0] == 0):
                # [B*k, C, ...]: an example's k rows (a Mask R-CNN's mask head on its proposals);
                # the rule sums them, its output gradient as [B, k, ...]
                call.out_blocks = layout.out_blocks[0][1]
                continue
            if kind == "anywhere" and not call.expanded and _in_blocks(layout, x, out, batch):
                # [B*k, ...] with the batch outer (windows): per-row layers see [B, k, ...]
                (d_in, k_in), (d_out, call.out_blocks) = layout.in_blocks[0], layout.out_blocks[0]
                call.args = (x.movedim(d_in, 0).unflatten(0, (batch, k_in)), *call.args[1:])
                call.out_move = d_out
                continue
            if (d_in == MERGED or x.shape[d_in] != batch) or (d_out == MERGED or out.shape[d_out] != batch):
                check_batch([d_in], [x], batch, f"input of {where}")  # says which
                check_batch([d_out], [out], batch, f"output of {where}")
            if kind == "batch_first" and (d_in, d_out) != (0, 0):
                raise UnsupportedModel(f"{where}: expects the batch in dim 0")
            if d_in:
                call.args = (x.movedim(d_in, 0), *call.args[1:])
            call.out_move = d_out


def _in_blocks(layout, x, out, batch: int) -> bool:
    """Are the call's input and output both [B*k, ...] with the batch as the outer factor?"""
    if not layout.in_blocks or not layout.out_blocks:
        return False
    blocks = layout.in_blocks[0], layout.out_blocks[0]
    return (layout.in_dims[0] == MERGED and layout.out_dims[0] == MERGED and None not in blocks
            and x.shape[blocks[0][0]] == batch * blocks[0][1] and out.shape[blocks[1][0]] == batch * blocks[1][1])


def _broadcast_calls(plan: HookPlan, layouts, name: str) -> set:
    """Indices of the calls of `name` that are shared [1, ...] calls whose output ghost expands
    to the batch."""
    if plan.rules[name].layout == "own":
        return set()
    return {i for i, layout in enumerate(layouts[name]) if layout.broadcast}


def _check_unmodified(calls):
    for name, module_calls in calls.items():
        for call in module_calls:
            for tensor, version in call.versions:
                if tensor._version != version:
                    raise UnsupportedModel(f"the input of module '{name}' is modified in place after "
                                           "the module ran")
            call.versions = []


def _count_uses(plan: HookPlan, calls) -> dict[int, int]:
    uses: dict[int, int] = {}
    for name, paths in plan.paths.items():
        for p in paths.values():
            uses[id(p)] = uses.get(id(p), 0) + len(calls[name])
    return uses
