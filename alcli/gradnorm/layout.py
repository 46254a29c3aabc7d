"""Where the batch dimension lives in every tensor a module call sees.

It cannot be read off one shape: a seq-first transformer feeds its Linear layers [T, B, d], and
when T == B no size tells the two apart. So the model is run on its first example and on n =
min(B, 3) distinct examples of the batch (real examples, so data-dependent sizes show), and for
every hooked module call the one dim whose size goes 1 -> n in an input or output is that
tensor's batch dim; a tensor with no changing dim is shared by all examples. A dim that changes
any other way (the batch merged with another dim, [B*T, d] or packed tokens) is recorded as
MERGED, and rules that need the batch refuse it; at the full batch every batch dim must have
size B. Sizes can still coincide (packed tokens with one token in each example), so the n
examples are also run rotated by one and with their first two swapped: a true batch dim holds
the same values, moved the same way. The orders are laid end to end in one forward where that
stays within the batch's rows ([3n, ...] from B = 9: the rotation, the swap, the examples as
they are). Below that, the rows the reorderings are compared with, the examples as they are,
are those of ghost's own pass of the batch (checked_in_pass; a caller without such a pass runs
them as one more probe), so a first call runs two or three probe forwards: the one example's,
then one ([2n, ...] from B = 6, or [3n, ...]) or two. Because the result is cached
per model, hooked modules and example shape, a forward whose shapes depend on the data (an op
such as nonzero or boolean masking) is refused: a later batch could lay out differently.

A call whose first input and output are shared by all examples with a leading dim of 1 (a
position embedding looked up with position ids [1, T]) is marked `broadcast` when expanding its
output to the batch ([1, T, d] -> [B, T, d], as the model's own broadcasting would) leaves the
model's output unchanged: ghost then taps the expanded output, so each example's own gradient
comes back and the layer's rule applies as to any batched call. That each expanded row reaches
its own example alone is checked too, on three examples (two in a batch of two), one forward
per row: changing that row of the expansion must change that example's output, and every other
example's output must come out exactly the same whichever other row is changed.
"""
from __future__ import annotations

import math
import weakref
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from ..errors import first_line
from .errors import UnsupportedModel
from .model_io import (
    batch_size,
    batch_slice,
    call_model,
    example_key,
    first_n,
    logits_of,
    map_batch,
    tensors,
)
from .forwards import each_call
from .uses import ModuleStack, outside_uses

MERGED = -1


@dataclass
class Layout:
    """Batch dims of one module call: per leaf of (args, kwargs) and per leaf of the output."""
    in_dims: list
    out_dims: list
    broadcast: bool = False  # shared [1, ...] input and output that may be expanded to the batch
    # per leaf, for a MERGED dim holding the batch as its outer factor ([B*k, ...], windows of
    # a swin or maxvit): (that dim, k), else None
    in_blocks: list | None = None
    out_blocks: list | None = None


_cache: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def call_layouts(model, inputs: torch.Tensor, modules: dict, deferred: bool = False) -> dict[str, list[Layout]]:
    """module name -> the Layout of each of its calls, in call order. `deferred` (the caller's
    pass will come, and the model's parameters are float32 or float64): the probe's examples as
    they are, which the reordering check compares the other orders against, may be left to the
    caller's own forward of these `inputs` (ghost's pass, under `checked_in_pass`: one probe
    forward fewer); until that forward has run, the layouts are not checked for reordering, and
    a call for other inputs or without `deferred` runs that order itself."""
    key = _layout_key(inputs, modules)
    per_model = _cache.setdefault(model, {})
    if key not in per_model:
        first = _first_runs.pop(model, None)  # (key, shapes) of the use probe's one-example forward
        if first is not None and first[0] == (tuple(modules), example_key(inputs)):
            one = first[1]
        else:
            one = _one_example(model, inputs, modules)[0]
        # the probe: n = min(B, 3) distinct examples of the batch (two copies of a lone one),
        # run in each order of _orders, several orders to a forward (_runs); its shapes against
        # the one example's give the batch dims, its fingerprints along them the reordering check
        rows = torch.arange(2) if batch_size(inputs) == 1 else _distinct_rows(inputs)
        probe = first_n(inputs, 2) if batch_size(inputs) == 1 else map_batch(inputs, lambda t: t[rows.to(t.device)])
        n = batch_size(probe)
        reorders = batch_size(inputs) > 1
        orders = _orders(n) if reorders else [tuple(range(n))]
        # the pass stands for the examples as they are where that saves a probe forward (B < 3n)
        deferred = deferred and reorders and _rows_agree_across_batches(inputs) and \
            len(_runs(orders[:-1], n, batch_size(inputs))) < len(_runs(orders, n, batch_size(inputs)))
        if deferred:
            orders = orders[:-1]  # the examples as they are: the pass's own forward (or _finish)
        runs = _runs(orders, n, batch_size(inputs))
        projections: dict = {}
        run_logits: list = []  # each run's logits, as _logits_print
        first = runs[0]
        seen = _record(model, _in_orders(probe, first), modules,
                       _probe_call(one, n * len(first), _fingerprinter(n * len(first), projections)), run_logits)
        for name in modules:
            if len(one[name]) != len(seen[name]):
                raise UnsupportedModel(f"module '{name}' is called a different number of times for "
                                       "different batch sizes")
        layouts = {name: [layout for _, layout, _ in calls] for name, calls in seen.items()}
        many = {name: [shapes for shapes, _, _ in calls] for name, calls in seen.items()}
        prints = [{name: [p for _, _, p in calls] for name, calls in seen.items()}]
        for orders in runs[1:]:
            prints.append(_record(model, _in_orders(probe, orders), modules,
                                  _reordered_call(layouts, _fingerprinter(n * len(orders), projections)), run_logits))
        if len(per_model) >= CACHED_LAYOUTS:  # text of many lengths: the oldest layout goes
            _pending.get(model, {}).pop(next(iter(per_model)), None)
            del per_model[next(iter(per_model))]
        largest = max((math.prod(shape) for calls in one.values() for _, outs in calls for shape in outs
                       if shape is not None), default=0)
        per_model[key] = layouts, largest
        if deferred:
            _pending.setdefault(model, {})[key] = _Pending(_reference(inputs), rows, probe, n, runs, prints, projections)
            if _broadcast_candidates(modules, layouts, many):  # they need the examples' own logits
                run_logits.append(_finish(model, key, modules))
                runs.append([tuple(range(n))])
        elif reorders:
            _mark_unreversed(modules, layouts, runs, prints, n)
        _mark_broadcast(model, probe, _identity_logits(runs, run_logits, n), modules, layouts, many)
    elif _pending.get(model):
        pending = _pending[model].get(key)
        if pending is not None and (not deferred or pending.inputs() is not inputs):
            _finish(model, key, modules)  # a check left to a pass that will not come
    return per_model[key][0]


def _rows_agree_across_batches(inputs) -> bool:
    """Whether an example's rows in a pass of B examples may stand for its rows in a probe of
    fewer: float32 or float64 arithmetic, which another batch size changes by rounding only
    (about 1e-7, inside the check's rtol 1e-4). Autocast and TF32 (alcli's CUDA sessions turn it
    on, with cuDNN's kernels picked per shape) change them by about 1e-3, as half-precision
    parameters do (the caller's `deferred` says there are none): there the examples as they are
    stay a probe forward, as the other orders are."""
    device = tensors(inputs)[0].device
    if device.type not in ("cpu", "cuda") or torch.is_autocast_enabled(device.type):
        return False
    return torch.get_float32_matmul_precision() == "highest" and not (
        device.type == "cuda" and torch.backends.cudnn.allow_tf32)


@dataclass
class _Pending:
    """A reordering check waiting for the examples as they are: the batch they are rows `rows` of
    (a reference: ghost's pass of these very inputs gives them, `checked_in_pass`), the probe
    holding them, its n, and the other orders' runs and fingerprints."""
    inputs: object = None
    rows: torch.Tensor = None
    probe: object = None
    n: int = 0
    runs: list = None
    prints: list = None
    projections: dict = None


_pending: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # model -> {layout key: _Pending}


def _reference(inputs):
    """() -> `inputs` while they live: a weak reference where they take one (a tensor)."""
    try:
        return weakref.ref(inputs)
    except TypeError:  # a dict or tuple of tensors: held until the check finishes
        return lambda: inputs


def _finish(model, key, modules):
    """Run the pending check's examples as they are in a probe forward of their own and finish
    the check; -> that forward's logits, as _logits_print (None when nothing was pending)."""
    pending = _pending.get(model, {}).get(key)
    if pending is None:
        return None
    logits: list = []
    layouts = _cache[model][key][0]
    prints = _record(model, pending.probe, modules,
                     _reordered_call(layouts, _fingerprinter(pending.n, pending.projections)), logits)
    _mark_unreversed(modules, layouts, [*pending.runs, [tuple(range(pending.n))]], [*pending.prints, prints], pending.n)
    del _pending[model][key]
    return logits[0]


def checked_in_pass(model, inputs, modules: dict):
    """Around the first forward of `inputs` after `call_layouts(..., deferred=True)`: that
    forward's rows of the probe's examples serve as the examples as they are, and the reordering
    check finishes when it returns (not when it raises: the check then waits for the next pass).
    A forward whose calls do not match the probe's in number is left to the pass to refuse.
    A steady call, with no check waiting, gets a context that does nothing."""
    if not _pending.get(model):
        return nullcontext()
    return _checking_in_pass(model, inputs, modules)


@contextmanager
def _checking_in_pass(model, inputs, modules: dict):
    key = _layout_key(inputs, modules)
    pending = _pending[model].get(key)  # checked_in_pass found the model's checks
    if pending is None or pending.inputs() is not inputs:
        yield
        return
    layouts = _cache[model][key][0]
    seen: dict[str, list] = {name: [] for name in modules}
    record = _reordered_call(layouts, _fingerprinter(pending.n, pending.projections,
                                                     (batch_size(inputs), pending.rows)))

    def prints(name, args, kwargs, output):
        seen[name].append(record(name, len(seen[name]), _leaves((args, kwargs)), _leaves(output)))

    with each_call(modules, prints):
        yield
    if all(len(seen[name]) == len(layouts[name]) for name in modules):
        _mark_unreversed(modules, layouts, [*pending.runs, [tuple(range(pending.n))]],
                         [*pending.prints, seen], pending.n)
        del _pending[model][key]


def largest_output(model, inputs, modules: dict) -> int:
    """The most elements one example puts in one output of a call of `modules` (from the
    one-example run of call_layouts)."""
    known = _cache.get(model, {}).get(_layout_key(inputs, modules))
    if known is None:
        call_layouts(model, inputs, modules)
        known = _cache[model][_layout_key(inputs, modules)]
    return known[1]


def _layout_key(inputs, modules: dict) -> tuple:
    """What a model's cached layouts are kept by: batches of 2 (or one example as two copies)
    cannot show every reordering, so they are not reused for more."""
    return tuple(modules), example_key(inputs), min(batch_size(inputs), 3)


CACHED_LAYOUTS = 64  # per model: example shapes (text lengths, image sizes) whose layouts are kept


def first_example_uses(model, inputs, modules: dict, covered: dict) -> dict[int, str | None] | None:
    """The parameters the first example's forward uses outside their covering modules
    (`covered`: plan.covering_modules; see uses.outside_uses), from the same forward that
    gives call_layouts its one-example shapes for `modules` (kept for its next call); None when
    that forward fails (call_layouts meets it again and says why)."""
    try:
        one, found = _one_example(model, inputs, modules, covered)
    except torch.OutOfMemoryError:
        raise
    except Exception:
        return None
    _first_runs[model] = ((tuple(modules), example_key(inputs)), one)
    return found


_first_runs: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # model -> (key, shapes)


def _one_example(model, inputs, modules: dict, covered: dict | None = None) -> tuple[dict, dict]:
    """(module name -> [(input shapes, output shapes) per call] for the first example, and with
    `covered`, its outside uses); refuses a forward whose shapes depend on the data. The watches
    run knowing only which hooked modules run; a forward where they find something runs again
    under a ModuleStack (hooks on every module), which names where."""
    one, watch, found = _watched_forward(model, inputs, modules, covered, _HookedNames())
    if watch.op is not None or found:
        with ModuleStack(model) as stack:
            one, watch, found = _watched_forward(model, inputs, modules, covered, stack)
    if watch.op is not None:
        raise UnsupportedModel(f"{watch.where} {watch.what} ({watch.op}), so where the batch lies "
                               "can change from batch to batch")
    return one, found


def _watched_forward(model, inputs, modules, covered, stack):
    """The first example's forward under the watches (one dispatch mode for both), `stack`
    telling which modules run."""
    uses, found = outside_uses(covered, stack.names) if covered is not None else (None, {})
    with _DataDependentShapes(stack, uses) as watch:
        one = _record(model, batch_slice(inputs, 0, 1), modules,
                      lambda name, i, ins, outs: (_shapes(ins), _shapes(outs)),
                      running=stack.names if isinstance(stack, _HookedNames) else None)
    return one, watch, found


class _HookedNames:
    """The hooked modules running now, outermost first (pushed and popped by _record): all the
    use watch needs to tell a use outside the modules covering a parameter (they are hooked)."""

    def __init__(self):
        self.names: list[str] = []

    def where(self) -> str:
        return "the model"  # a ModuleStack's rerun names the module


class _DataDependentShapes(TorchDispatchMode):
    """Notes the first op whose output shape depends on tensor values, or that sorts the examples;
    with `uses` (uses.outside_uses), also every tensor an op takes (the use watch, at the level of
    aten ops: a parameter reaches them as itself, and metadata such as its shape never does)."""

    def __init__(self, stack, uses=None):
        super().__init__()
        self.stack = stack
        self.uses = uses
        self.op = self.where = self.what = None

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # this mode never runs under torch.compile; wrapping it to skip compilation would import
        # torch._dynamo on the first probe (about 3 s of every run's start-up)
        return False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if self.op is None and func not in _SHAPES_FROM_SHAPES:
            if torch.Tag.dynamic_output_shape not in func.tags and func.overloadpacket not in _SORT_DIM_ARG:
                _SHAPES_FROM_SHAPES.add(func)  # never looked at again
            elif torch.Tag.dynamic_output_shape in func.tags and not _integer_indexing(func, args):
                self.what = "has data-dependent shapes"
            elif _sorts_the_batch(func, args, kwargs or {}):
                self.what = "orders the examples by their values"
            if self.what is not None:
                self.op, self.where = str(func.overloadpacket.__name__), self.stack.where()
        if self.uses is not None:
            self.uses(args)
            if kwargs:
                self.uses(tuple(kwargs.values()))
        return func(*args, **(kwargs or {}))


def _sorts_the_batch(func, args, kwargs) -> bool:
    """A sort over a dim of size 1 in this one-example run: nothing to sort, unless that dim is
    the batch (sorting examples by length), whose order then depends on the data."""
    where = _SORT_DIM_ARG.get(func.overloadpacket)  # the position of `dim` among the arguments
    if where is None or not args or not isinstance(args[0], torch.Tensor) or args[0].dim() == 0:
        return False
    dim = kwargs.get("dim", args[where] if len(args) > where and isinstance(args[where], int) else -1)
    return args[0].shape[dim] == 1


_SORT_DIM_ARG = {torch.ops.aten.sort: 1, torch.ops.aten.topk: 2, torch.ops.aten.kthvalue: 2}
# ops whose output shapes follow their inputs' shapes and that sort nothing: the watch's fast path
_SHAPES_FROM_SHAPES: set = set()


def _integer_indexing(func, args) -> bool:
    """x[idx] with integer index tensors (a gather: GPT-2's last-token pick, a relative-position
    bias table): its shape follows the indices' shapes, not their values, unlike a boolean mask."""
    if func.overloadpacket is not torch.ops.aten.index or len(args) < 2:
        return False
    indices = [i for i in args[1] if i is not None]
    return bool(indices) and all(not i.is_floating_point() and i.dtype not in (torch.bool, torch.uint8)
                                 for i in indices)


REORDER_EXAMPLES = 3  # the reordering probes' examples (all of a smaller batch)


def _orders(n: int) -> list[tuple]:
    """The probe's n examples rotated by one and with their first two swapped (one order for
    n = 2), then as they are (left to ghost's pass where call_layouts may defer it): a rotation
    and a swap generate every reordering. The reorderings come first, so a model that needs its
    examples in the batch's order (pack_padded_sequence with enforce_sorted=True) fails on them."""
    moved = dict.fromkeys([tuple(torch.arange(n).roll(1).tolist()), (1, 0, *range(2, n))])
    return [*moved, tuple(range(n))]


def _runs(orders: list, n: int, batch: int) -> list[list[tuple]]:
    """The orders grouped into forwards: a forward takes the probe in several orders one after
    the other ([2n, ...] for two), as many as keep it within the batch's rows: a device with
    room for the batch and no more (the out-of-memory split's micro-batches) runs the probes."""
    per_run = max(1, min(len(orders), batch // n))
    return [orders[i:i + per_run] for i in range(0, len(orders), per_run)]


def _in_orders(probe, orders: list):
    """The probe's examples in each of `orders`, one after the other along the batch."""
    index = torch.tensor([i for order in orders for i in order])
    return map_batch(probe, lambda t: t[index.to(t.device)])


def _identity_logits(runs, run_logits, n: int):
    """The logits of the probe in its own order (as _logits_print) out of the run holding it."""
    for orders, logits in zip(runs, run_logits):
        if tuple(range(n)) in orders and logits is not None:
            at = orders.index(tuple(range(n)))
            shape, rows = logits
            if rows is None or shape[:1] != (n * len(orders),):
                return None
            return (n, *shape[1:]), rows[at * n:(at + 1) * n]
    return None


def _mark_unreversed(modules, layouts, runs, prints, n: int):
    """A batch dim whose rows are not the examples' own becomes MERGED (blocks: None): where the
    probe's n examples go in another order (`runs`: the orders of each forward; `prints`: its
    fingerprints per call), its rows (blocks of k rows) must move the same way, each unchanged.
    A rotation and a swap generate every reordering, so a model that reorders the examples
    inside cannot pass (for n >= 3; a pair's one reordering commutes with itself, and a pair's
    layout serves only pairs).

    The probe holds n = min(B, 3) distinct examples of the batch (copies would hide a
    reordering): which rows a fixed reordering moves does not depend on the batch size, and
    reorderings that depend on the values (sorts) were refused by the one-example run.
    Values are compared through a fingerprint per batch row (a fixed random projection of the
    row) along the dims that may hold the batch, so the check holds a few numbers per tensor,
    not the activations."""
    moves = _Moves.of(runs, n)
    checks = []  # (dims or blocks, leaf index, MERGED or None, (d, k), per run: {dim: fingerprint})
    for name in modules:
        for run in prints[1:]:
            if len(run[name]) != len(prints[0][name]):
                raise UnsupportedModel(f"module '{name}' is called a different number of times for "
                                       "the same examples in another order")
        for i, layout in enumerate(layouts[name]):
            for side, dims, blocks in ((0, layout.in_dims, layout.in_blocks), (1, layout.out_dims, layout.out_blocks)):
                leaves = [run[name][i][side] for run in prints]  # per run: per leaf {dim: fingerprint}
                for j, d in enumerate(dims):
                    if (d is None or d == MERGED) and blocks[j] is None:
                        continue  # no dim that may hold the batch
                    per_run = [None if run is None else run[j] for run in leaves]
                    if d is not None and d != MERGED:
                        checks.append((dims, j, MERGED, (d, 1), per_run))
                    if blocks[j] is not None:
                        checks.append((blocks, j, None, blocks[j], per_run))
    follow = _rows_follow([(block, per_run) for *_, block, per_run in checks], moves)
    for (where, j, failed, _, _), ok in zip(checks, follow):
        if not ok:
            where[j] = failed


def _rows_follow(checks: list, moves) -> list[bool]:
    """Per (block, prints) of a leaf (see _moved_rows): do its rows move as the runs moved the
    examples? A tensor several calls see holds one fingerprint per run, checked once; plain
    batch dims on one device are checked all at once (a few ops for the lot)."""
    unique: dict = {}  # (k, the runs' fingerprints' ids) -> the runs' fingerprints
    keys = []
    for (d, k), prints in checks:
        found = [None if run is None else run.get(d) for run in prints]
        if any(f is None for f in found) or [f.shape[0] for f in found] != [rows * k for rows in moves.rows]:
            keys.append(None)  # a run without the dim: not the examples' own rows
            continue
        keys.append((k, *map(id, found)))
        unique.setdefault(keys[-1], found)
    plain = [key for key, found in unique.items() if key[0] == 1 and found[0].device == moves.index.device]
    others = list(unique.keys() - set(plain))
    pairs = [_moved_rows((0, key[0]), moves, [{0: f} for f in unique[key]]) for key in others]
    if plain:
        got = torch.cat([torch.stack([unique[key][r] for key in plain]) for r in range(len(moves.rows))], 1)
        expected = got[:, moves.own:moves.own + moves.n][:, moves.index]  # [checks, all rows]
        pairs += list(zip(expected.unbind(0), got.unbind(0)))
    same = dict(zip(others + plain, _same_each(pairs)))
    return [key is not None and same[key] for key in keys]


def _same_each(pairs: list):
    """_same of every (a, b) pair of 1-D float fingerprints, as an iterator of bools: computed
    for all pairs at once (one comparison where all are equal to the bit, a dozen ops where not)."""
    if not pairs or len({a.device for a, _ in pairs}) > 1:
        return iter([_same(a, b) for a, b in pairs])
    a, b = torch.cat([a for a, _ in pairs]), torch.cat([b for _, b in pairs])
    if torch.equal(a, b):
        return iter([True] * len(pairs))
    lengths = torch.tensor([len(x) for x, _ in pairs], device=a.device)
    # _same's tolerance, per pair: rtol 1e-4, atol 1e-6 * (1 + the largest finite |a| of the pair)
    scale = torch.segment_reduce(torch.nan_to_num(a, nan=0.0, posinf=0.0, neginf=0.0).abs(), "max", lengths=lengths)
    atol = (1e-6 * (1 + scale)).repeat_interleave(lengths)
    close = ((a - b).abs() <= atol + 1e-4 * b.abs()) | (a == b) | (a.isnan() & b.isnan())
    return iter(torch.segment_reduce(close.double(), "min", lengths=lengths).bool().tolist())


def _distinct_rows(inputs) -> torch.Tensor:
    """Indices of the first min(B, 3) examples whose inputs differ (the first ones where fewer
    differ)."""
    batch = batch_size(inputs)
    n = min(batch, REORDER_EXAMPLES)
    firsts = [torch.nan_to_num(t[:n]) if t.is_floating_point() else t[:n] for t in tensors(inputs)]
    if all(any(not torch.equal(t[i], t[j]) for t in firsts) for i in range(n) for j in range(i)):
        return torch.arange(n)  # the common case: the first n differ
    prints = torch.stack([_fingerprint(t, 0) for t in tensors(inputs)], 1).cpu()  # [B, tensors]
    chosen = []
    for row in range(batch):
        if all(not torch.equal(prints[row], prints[c]) for c in chosen):
            chosen.append(row)
            if len(chosen) == n:
                return torch.tensor(chosen)
    return torch.arange(n)


def _moved_rows(block, moves, prints):
    """(expected, got) fingerprints of dim d, of size n*k per order with the examples as its outer
    factor (k = 1: a plain batch dim): the blocks of k rows of the examples as they are, moved as
    each order moves them, and what the runs hold; None where a run has no such dim. `prints`:
    per run, {dim: fingerprint of the rows along it} of one leaf; `moves`: _Moves of the runs."""
    d, k = block
    found = [None if run is None else run.get(d) for run in prints]
    if any(f is None for f in found) or [f.shape[0] for f in found] != [rows * k for rows in moves.rows]:
        return None
    got = torch.cat(found) if len(found) > 1 else found[0]         # [all rows * k]
    own = got.view(-1, k)[moves.own:moves.own + moves.n]           # [n, k]: the examples as they are
    return own[moves.index.to(own.device)].reshape(-1), got


@dataclass
class _Moves:
    """The probe's runs laid end to end: n examples, each run's rows, where the examples as they
    are start, and for every row the example it holds."""
    n: int
    rows: list
    own: int
    index: torch.Tensor

    @classmethod
    def of(cls, runs: list, n: int) -> "_Moves":
        orders = [order for run in runs for order in run]
        return cls(n, [n * len(run) for run in runs], n * orders.index(tuple(range(n))),
                   torch.tensor([i for order in orders for i in order]))


def _probe_call(one: dict, n: int, prints):
    """The probe's record of a call: (its shapes, its Layout against the one example's call,
    its fingerprints along the dims that Layout may hold the batch in)."""
    known: dict = {}  # (one example's shapes, the probe's) -> (dims, blocks): calls repeat shapes

    def batch_dims(a: list, b: list) -> tuple[list, list]:
        key = (tuple(a), tuple(b))
        if key not in known:
            known[key] = _dims(a, b, n), _blocks(a, b, n)
        dims, blocks = known[key]
        return list(dims), list(blocks)  # each Layout's own lists (the reordering check marks them)

    def record(name, i, ins, outs):
        shapes = (_shapes(ins), _shapes(outs))
        if i >= len(one[name]):  # called more often than for one example: refused after the run
            return shapes, None, None
        (a_in, a_out), (b_in, b_out) = one[name][i], shapes
        (in_dims, in_blocks), (out_dims, out_blocks) = batch_dims(a_in, b_in), batch_dims(a_out, b_out)
        layout = Layout(in_dims, out_dims, in_blocks=in_blocks, out_blocks=out_blocks)
        return shapes, layout, prints(layout, ins, outs)
    return record


def _reordered_call(layouts: dict, prints):
    """A reordered run's record of a call: its fingerprints along the dims its Layout holds the
    batch in (None for a call the probe did not see)."""
    def record(name, i, ins, outs):
        if i >= len(layouts[name]):
            return None
        return prints(layouts[name][i], ins, outs)
    return record


def _fingerprinter(n: int, projections: dict, select: tuple | None = None):
    """One run's (Layout, input leaves, output leaves) of a call -> (input prints, output prints):
    per leaf {dim: fingerprint of the rows along it} for the dims the Layout may hold the batch
    in (a batch dim of size n, or the outer factor of n blocks), None for a leaf with none. A
    tensor several calls see is fingerprinted once; none is kept alive for it (a weak reference
    tells it is still the same tensor). `select` = (B, rows): the run is a batch of B examples
    of which the n at `rows` are fingerprinted (a dim of size B, or of B blocks of k rows)."""
    done: dict = {}  # (id of a tensor, dim) -> (weak reference to it, fingerprint)
    if select is not None and select[1].tolist() == list(range(n)):
        select = (select[0], None)  # the common case: the batch's first n examples

    def prints(leaves, dims, blocks) -> list:
        out = []
        for leaf, d, block in zip(leaves, dims, blocks):
            wanted = ((d, 1),) if d is not None and d != MERGED else ()
            if block is not None:
                wanted += (block,)
            if leaf is None or not wanted:
                out.append(None)
                continue
            found = {}
            for x, k in wanted:
                hit = done.get((id(leaf), x))
                if hit is None or hit[0]() is not leaf:
                    rows = _rows(leaf, x, k, n, select)
                    if rows is None:
                        continue
                    hit = done[id(leaf), x] = (weakref.ref(leaf), _fingerprint(rows, x, projections))
                found[x] = hit[1]
            out.append(found)
        return out

    return lambda layout, ins, outs: (prints(ins, layout.in_dims, layout.in_blocks),
                                      prints(outs, layout.out_dims, layout.out_blocks))


def _rows(leaf, d: int, k: int, n: int, select):
    """`leaf` if its dim d holds n examples (n * k rows), or with `select` = (B, rows) the rows of
    the examples `rows` out of B (blocks of k; rows None: the first n); None where dim d is not
    that size."""
    if d >= leaf.dim():
        return None
    if select is None:
        return leaf if leaf.shape[d] and leaf.shape[d] % n == 0 else None
    batch, rows = select
    if leaf.shape[d] != batch * k:
        return None
    if rows is None:
        return leaf.narrow(d, 0, n * k)  # the batch's first n examples
    index = (rows.to(leaf.device)[:, None] * k + torch.arange(k, device=leaf.device)).reshape(-1)
    return leaf.index_select(d, index)


def _mark_broadcast(model, probe, plain, modules, layouts, shapes):
    """Mark the shared [1, ...] calls (see the module docstring) called with a tensor as their
    first positional input, when expanding their outputs to the probe's examples (three, or two
    in a batch of two, which may be all that fits in memory; `plain`: the probe's logits, as
    _logits_print) keeps the model's output, and each expanded row reaches its own example alone:
    changing one row (by random signs) changes that example's output, and every other example's
    output is exactly the same whichever other row is changed. Outputs are compared through each
    example's fingerprint, so no run's logits are kept ([n, T, V] each for a language model)."""
    candidates = _broadcast_candidates(modules, layouts, shapes)
    if not candidates:
        return
    rows = batch_size(probe)
    if plain is None or plain[0][:1] != (rows,):
        return
    # run r: every candidate output expanded to the probe's examples, its row r changed (with
    # fewer than three rows, also a run with none changed: each row must be unchanged in two)
    changed, calls = [], candidates
    for row in [*range(rows), *([None] if rows < 3 else [])]:
        logits, calls = _expanded_logits(model, probe, modules, calls, row)
        if not calls or logits is None or logits[0] != plain[0]:
            return
        changed.append(logits[1])  # [n] fingerprints
    for row in range(rows):
        kept = [prints[row] for r, prints in enumerate(changed) if r != row]
        if not (_same(plain[1][row], kept[0]) and all(torch.equal(kept[0], k) for k in kept[1:])
                and not torch.equal(changed[row][row], kept[0])):
            return
    for name, i in calls:
        layouts[name][i].broadcast = True


def _broadcast_candidates(modules, layouts, shapes) -> set:
    """(name, call index) of the calls whose first input and only output are shared by all
    examples with a leading 1 (`shapes`: the probe's, per call)."""
    return {(name, i) for name in modules for i, (layout, (ins, out)) in
            enumerate(zip(layouts[name], shapes[name]))
            if layout.in_dims[:1] == [None] and layout.out_dims == [None]
            and ins and ins[0] and ins[0][0] == 1 and out[0] and out[0][0] == 1}


def _expanded_logits(model, probe, modules, candidates, row):
    """(the logits, as _logits_print, with every candidate call's output expanded to the probe's
    examples, contiguous as ghost's tapped output is, and, given `row`, that row of each changed;
    or None when the model cannot take it, and the calls expanded: those with a positional tensor
    input, which ghost can expand)."""
    seen: dict[str, int] = {}
    expanded: set = set()
    rows = batch_size(probe)
    handles = []
    signs = torch.Generator().manual_seed(row or 0)  # each row its own signs (the rows start equal)

    def hook(name):
        def expand(module, args, output):
            i = seen[name] = seen.get(name, -1) + 1
            if (name, i) not in candidates or not args or not isinstance(args[0], torch.Tensor):
                return None
            expanded.add((name, i))
            out = output.expand(rows, *output.shape[1:]).contiguous()
            if row is not None:
                sign = torch.randint(0, 2, output.shape[1:], generator=signs).to(out.device, out.dtype) * 2 - 1
                out[row] = out[row] + sign * (1 + output[0].detach().abs())
            return out
        return expand

    try:
        for name in {name for name, _ in candidates}:
            handles.append(modules[name].register_forward_hook(hook(name)))
        try:
            logits = logits_of(_forward(model, probe))
        except _SavedTensorsDropped:
            expanded.clear()
            seen.clear()
            logits = logits_of(call_model(model, probe))
        return _logits_print(logits), expanded
    except Exception:  # the model's own code, given a [3, ...] where it had [1, ...]
        return None, expanded
    finally:
        for handle in handles:
            handle.remove()


def _fingerprint(x: torch.Tensor, d: int, projections: dict | None = None) -> torch.Tensor:
    """[rows along d]: each row projected on fixed random weights, seeded by the row's length (the
    same weights for every order of the examples), in float64. Short rows' weights are kept in
    `projections` for the next rows (making them costs more than using them); long rows' are
    not (they would hold megabytes, and the projection itself costs as much), and long rows go
    PRINT_BLOCK columns at a time, so neither their weights nor a float64 copy of them is ever
    whole (a language model's logits: [n, T * V], hundreds of millions of columns)."""
    x = x.detach()
    rows = (x.movedim(d, 0) if d else x).reshape(x.shape[d], -1)
    width = rows.shape[1]
    if width > KEPT_PROJECTION:
        total = torch.zeros(rows.shape[0], dtype=torch.float64, device=rows.device)
        for block, start in enumerate(range(0, width, PRINT_BLOCK)):
            part = torch.nan_to_num(rows[:, start:start + PRINT_BLOCK].double())
            gen = torch.Generator(device=rows.device).manual_seed((width << 20) + block)
            total += part @ torch.rand(part.shape[1], generator=gen, dtype=torch.float64, device=rows.device)
        return total
    # a fresh float64 copy is cleaned in place; float64 rows are the model's own, left as they are
    rows = rows.double().nan_to_num_() if rows.dtype != torch.float64 else torch.nan_to_num(rows)
    key = (width, rows.device)
    weights = None if projections is None else projections.get(key)
    if weights is None:
        gen = torch.Generator(device=rows.device).manual_seed(width)
        weights = torch.rand(width, generator=gen, dtype=torch.float64, device=rows.device)
        if projections is not None:
            projections[key] = weights
    return rows @ weights  # [B]


KEPT_PROJECTION = 2 ** 16  # the longest row whose projection weights a call keeps (512 KB)
PRINT_BLOCK = 2 ** 18  # columns of a long row projected at once


def _same(a, b) -> bool:
    if a.shape != b.shape:
        return False
    if torch.equal(a, b):
        return True
    if not a.is_floating_point():
        return False
    scale = float(torch.nan_to_num(a, nan=0.0, posinf=0.0, neginf=0.0).abs().max()) if a.numel() else 0.0
    return bool(torch.allclose(a, b, rtol=1e-4, atol=1e-6 * (1 + scale), equal_nan=True))


def _record(model, inputs, modules, what, logits: list | None = None, running: list | None = None) -> dict[str, list]:
    """module name -> [what(name, index of the call, input leaves, output leaves) per call] for
    one forward of `inputs` (leaves of (args, kwargs) and of the output, a tensor or None each;
    `what` keeps what it needs, so the activations go as the forward frees them); the model's
    logits' _logits_print (None if its output holds none) appended to `logits` if given.

    `inputs` is a part of the batch, or the batch in another order: a model that cannot take
    that (pack_padded_sequence with enforce_sorted=True) is refused, naming where it failed.
    `running`, if given, holds the names of the hooked modules running, outermost first."""
    seen: dict[str, list] = {name: [] for name in modules}

    def record(name, args, kwargs, output):
        if running is not None:
            running.pop()
        seen[name].append(what(name, len(seen[name]), _leaves((args, kwargs)), _leaves(output)))

    with each_call(modules, record, running.append if running is not None else None):
        try:
            try:
                output = _forward(model, inputs)
            except _SavedTensorsDropped:  # the forward runs a backward itself: again, with its graph
                for calls in seen.values():
                    calls.clear()
                if running is not None:
                    running.clear()
                output = call_model(model, inputs)
        except (torch.OutOfMemoryError, UnsupportedModel):
            raise
        except Exception as err:  # the model's own forward, on data it was not given
            raise UnsupportedModel(f"{_where_it_fails(model, inputs)} fails on part of the batch or the "
                                   f"batch in another order, which finding the batch dims needs "
                                   f"({first_line(err)})") from err
    if logits is not None:
        found = _logits_or_none(output)
        logits.append(_logits_print(found) if found is not None else None)
    return seen


class _SavedTensorsDropped(RuntimeError):
    """A probe forward differentiated what it had not kept (see _forward)."""


def _dropped(tensor):
    return None


def _unpack_dropped(packed):
    raise _SavedTensorsDropped("a tensor saved for the backward was not kept")


def _forward(model, inputs):
    """The model's output on `inputs`, with grad enabled (so modules take the code paths of the
    real pass: MultiheadAttention's fast path runs only without grad), but without keeping what its
    graph saves for a backward, which no probe runs: a probe holds an inference forward's memory,
    not a training forward's (GPT-2 small at T = 2048: gigabytes of activations).
    _SavedTensorsDropped when the forward itself differentiates."""
    with torch.autograd.graph.saved_tensors_hooks(_dropped, _unpack_dropped):
        return call_model(model, inputs)


def _leaves(tree) -> list:
    """The leaves of `tree` (a call's (args, kwargs), or its output): a tensor or None each."""
    return [leaf if isinstance(leaf, torch.Tensor) else None for leaf in _flat(tree)]


def _flat(tree) -> list:
    """tree_flatten(tree)'s leaves, without its cost for a tensor and for (tensor args, no kwargs)."""
    if isinstance(tree, torch.Tensor):
        return [tree]
    if (type(tree) is tuple and len(tree) == 2 and type(tree[0]) is tuple and type(tree[1]) is dict
            and not tree[1] and all(isinstance(a, torch.Tensor) for a in tree[0])):
        return list(tree[0])
    return tree_flatten(tree)[0]


def _where_it_fails(model, inputs) -> str:
    """The module a forward of `inputs` fails in, found by running it again under a ModuleStack
    (which every forward would pay for, while few fail)."""
    with ModuleStack(model) as stack:
        try:
            call_model(model, inputs)
        except Exception:
            return stack.where()
    return "the model"


def _logits_or_none(output):
    try:
        return logits_of(output).detach()
    except Exception:  # no logits in it: the real forward says so
        return None


def _logits_print(logits: torch.Tensor) -> tuple:
    """(shape, [B] fingerprints of the examples' logits; None for a 0-dim output)."""
    return tuple(logits.shape), _fingerprint(logits, 0) if logits.dim() else None


def _shapes(leaves: list) -> list:
    return [tuple(leaf.shape) if leaf is not None else None for leaf in leaves]


def _dims(one: list, many: list, n: int) -> list:
    """Per leaf, the one dim whose size goes 1 -> n from one example to n, None when no dim
    changes, MERGED when it changes any other way."""
    dims = []
    for a, b in zip(one, many):
        if a is None or b is None:
            dims.append(None)
            continue
        changed = [d for d in range(len(a)) if len(a) != len(b) or a[d] != b[d]]
        if not changed:
            dims.append(None)
        elif len(a) == len(b) and len(changed) == 1 and a[changed[0]] == 1 and b[changed[0]] == n:
            dims.append(changed[0])
        else:
            dims.append(MERGED)
    return dims


def _blocks(one: list, many: list, n: int) -> list:
    """Per leaf, (d, k) when only dim d changed, from k > 1 to n*k: the batch may be its outer
    factor (confirmed on the examples reordered); else None."""
    blocks = []
    for a, b in zip(one, many):
        changed = [] if a is None or b is None or len(a) != len(b) else [d for d in range(len(a)) if a[d] != b[d]]
        ok = len(changed) == 1 and a[changed[0]] > 1 and b[changed[0]] == n * a[changed[0]]
        blocks.append((changed[0], a[changed[0]]) if ok else None)
    return blocks


def check_batch(dims: list, leaves: list, batch: int, what: str):
    """Every batched leaf must carry the whole batch in its batch dim."""
    for d, leaf in zip(dims, leaves):
        if d == MERGED or (d is not None and leaf.shape[d] != batch):
            raise UnsupportedModel(f"its {what} merges the batch with another dimension")
