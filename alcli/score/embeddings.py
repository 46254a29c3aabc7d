"""Capture BADGE embeddings while scoring: the penultimate features h and the probabilities p.

The model's final classification layer is found by shape: the last nn.Linear (in module order)
whose out_features equals the number of classes the model outputs. A forward hook on it records its
input h [B, D] during the runner's plain no-grad forward only (the gradient engine's own forwards
run outside that window), and p = softmax(model output). The factors (p − onehot(ŷ), h) are kept;
the C·D outer product never is (see alcli.selection.diverse).

    rec = EmbeddingRecorder()
    with record(rec, model, ids):        # around the runner's forward
        logits = model(inputs)
    emb = rec.result()                   # Embeddings(ids, a [N, C], b [N, D])
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
from torch import nn

from ..tasks import TASKS, exact_dtype
from ..tasks.common import head_outputs
from ..errors import RunError
from ..gradnorm import logits_of


@dataclass
class Embeddings:
    """BADGE factors of scored examples, in scoring order: a [N, C] = p − onehot(ŷ), b [N, D] = h."""

    ids: list[str]
    a: torch.Tensor
    b: torch.Tensor


def find_head(model: nn.Module, classes: int, task: str = "classification") -> tuple[str, nn.Linear]:
    """(name, module) of the last nn.Linear (segmentation: or Conv2d) with `classes` outputs; a
    RunError if there is none."""
    found = [(name, m) for name, m in model.named_modules()
             if isinstance(m, TASKS[task].head_types) and head_outputs(m) == classes]
    if not found:
        kind = "a TorchScript model" if isinstance(model, torch.jit.ScriptModule) else "the model"
        raise RunError(f"--embeddings needs the model's final classification layer, an nn.Linear "
                       f"with {classes} outputs (one per class), and {kind} has none")
    return found[-1]


class EmbeddingRecorder:
    """Collects (ids, a, b) batch by batch; the head is found at the first batch.

    `optional` (embeddings recorded by default, not asked for): a model they cannot be taken
    from stops the recording instead of the run, and `skipped` says why."""

    def __init__(self, optional: bool = False) -> None:
        self.optional = optional
        self.skipped: str | None = None
        self.head: tuple[str, nn.Linear] | None = None
        self._ids: list[str] = []
        # the batch just recorded, still on the device: (ids, a, b); kept by `keep` once the
        # batch is scored (a batch retried after out of memory replaces it: recorded once)
        self._current: tuple | None = None
        self._a: list[torch.Tensor] = []
        self._b: list[torch.Tensor] = []

    @contextlib.contextmanager
    def capture(self, model: nn.Module, ids: list[str], task: str = "classification", inputs=None,
                words=None):
        """Around one plain forward of `model` on the batch `ids`: record its factors. Errors of
        the forward itself pass through untouched; the recording's own may be skipped (optional).
        The task's factors (Task.badge; `inputs` for the attention mask; `words`, each token's
        word, to leave special tokens out)."""
        seen: dict = {"task": task, "model_inputs": inputs, "words": words}
        handles = [] if self.skipped is not None else self._optional(self._hooks, model, seen)
        try:
            yield
        finally:
            for h in handles or []:
                h.remove()
        if handles:
            self._optional(self._add, model, ids, seen)

    def _optional(self, step, *args):
        """`step(*args)`; a RunError stops an optional recording instead of the run."""
        try:
            return step(*args)
        except RunError as err:
            if not self.optional:
                raise
            self.skipped = str(err)
            return None

    def _hooks(self, model: nn.Module, seen: dict) -> list:
        """Forward hooks that put the model's logits and its head candidates' inputs in `seen`."""
        def on_output(module, args, output):  # the model's own output: the logits [B, C]
            try:
                seen["logits"] = logits_of(output)  # also in a Hugging Face output's .logits
            except TypeError:
                pass  # the runner reports a bad model output itself

        def on_input(name):
            def hook(module, args, output):
                seen.setdefault("inputs", {})[name] = args[0] if args else None
            return hook

        heads = ([self.head] if self.head is not None else
                 [(n, m) for n, m in model.named_modules() if isinstance(m, TASKS[seen["task"]].head_types)])
        try:
            handles = [model.register_forward_hook(on_output)]
            handles += [m.register_forward_hook(on_input(n)) for n, m in heads]
        except RuntimeError as err:  # TorchScript modules take no Python hooks
            raise RunError(f"--embeddings cannot hook into this model ({str(err).splitlines()[0]}); "
                           f"it needs a plain PyTorch model (not TorchScript)") from None
        return handles

    def _add(self, model: nn.Module, ids: list[str], seen: dict) -> None:
        """The batch's factors (the task's `badge`), its head found by its number of outputs (the
        classes; regression: D) at the first batch."""
        logits, spec = seen.get("logits"), TASKS[seen["task"]]
        if not isinstance(logits, torch.Tensor) or not spec.fits(logits):
            return  # the runner reports a bad model output itself
        outputs = spec.classes(logits) or logits.reshape(logits.shape[0], -1).shape[1]
        if self.head is None:
            self.head = find_head(model, outputs, spec.name)
        name, _ = self.head
        h = seen.get("inputs", {}).get(name)
        spec.check_head_input(name, h, logits, ids)
        dtype = h.dtype if h.dtype in (torch.float32, torch.float64) else torch.float32
        valid = (spec.badge_over or spec.valid)(logits, seen["model_inputs"], seen["words"])
        a, b = spec.badge(logits.to(exact_dtype(logits)), h.to(dtype), valid)
        if self._current is not None and not set(self._current[0]) & set(ids):
            self.keep([t.cpu() for t in self.pending()])  # an earlier batch nobody kept
        self._current = (list(ids), a.to(dtype), b.to(dtype))  # a retried batch replaces its try

    def pending(self) -> list[torch.Tensor]:
        """The current batch's factors [a, b], on the device, for the runner's one copy home."""
        return [] if self._current is None else list(self._current[1:])

    def keep(self, host: list[torch.Tensor]) -> None:
        """Keep the current batch, given its factors copied home (`pending()`'s, in order)."""
        if self._current is not None:
            self._ids.extend(self._current[0])
            self._a.append(host[0])
            self._b.append(host[1])
            self._current = None

    def take(self) -> Embeddings:
        """The factors kept since the last `take`, handed over and forgotten (a run writing a
        table streams them into its partial file with the rows, batch by batch)."""
        taken = Embeddings(self._ids, torch.cat(self._a) if self._a else torch.zeros(0, 0),
                           torch.cat(self._b) if self._b else torch.zeros(0, 0))
        self._ids, self._a, self._b = [], [], []
        return taken

    def result(self) -> Embeddings | None:
        """The embeddings recorded, or None when an optional recording was skipped."""
        if self.skipped is not None:
            return None
        self.keep([t.cpu() for t in self.pending()])  # recorded outside the runner (tests)
        if not self._ids:
            return Embeddings([], torch.zeros(0, 0), torch.zeros(0, 0))
        return Embeddings(list(self._ids), torch.cat(self._a), torch.cat(self._b))


def record(recorder: EmbeddingRecorder | None, model: nn.Module, ids: list[str],
           task: str = "classification", inputs=None, words=None):
    """`recorder.capture(model, ids, task, inputs, words)`, or a no-op context when no embeddings are wanted."""
    return contextlib.nullcontext() if recorder is None else recorder.capture(model, ids, task, inputs, words)
