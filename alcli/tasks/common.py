"""What every task shares: the Task object each module of alcli/tasks/ defines (one frozen
dataclass, a field per task-specific thing, no subclasses), and the pieces the tasks scored through
the engine have in common: per-position distributions, targets (predicted, sampled), the cheap
utilities and their aggregation.

A task whose output is a distribution per position gives `dists` (probs [B, N, K]: N positions,
K classes; multilabel: N = C labels, K = 2 as [1 - p, p]; classification: N = 1) and `valid`
[B, N]. A position whose target is IGNORE (a padding token; an ignored pixel) counts nowhere; the
cheap utilities are taken per position and aggregated over the valid ones (`aggregate`).
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn

from ..errors import RunError
from ..files.classnames import class_name
from ..gradnorm import grad_norms_per_target

IGNORE = -100  # a position with this target counts in no loss (HF's and PyTorch's ignore_index)
DEFAULT_EGL_SAMPLES = 8


def exact_dtype(t: torch.Tensor) -> torch.dtype:
    """The dtype scores are computed in: float64, or float32 on MPS, which has no float64."""
    return torch.float32 if t.device.type == "mps" else torch.float64


def _nothing(*args) -> list:
    return []


def _nothing_dict(*args) -> dict:
    return {}


def _none(*args) -> None:
    return None


def _never(*args) -> bool:
    return False


def head_ran(name: str, h, logits: torch.Tensor, ids: list) -> None:
    """check_head_input of every task but classification: the head ran on the batch."""
    if not isinstance(h, torch.Tensor) or h.shape[0] != len(ids):
        raise RunError(f"--embeddings: the final layer '{name}' did not run on the batch "
                       f"in the model's forward")


def hf_problem(model: nn.Module) -> str | None:
    """A Hugging Face model's `config.problem_type`; None for a token classifier, whose class
    names its task whatever its config says."""
    if type(model).__name__.endswith("ForTokenClassification"):
        return None
    return getattr(getattr(model, "config", None), "problem_type", None)


@dataclass(frozen=True)
class Task:
    """Everything task-specific, as data and functions. `s` is a batch as the strategies see it
    (alcli.score.strategies.StrategyInputs: logits, labels, given labels, ids, settings; `s.spec`
    is its Task); Columns are a dict of [B] tensors ("score" and extras)."""
    name: str
    shape: str                                    # its output, for messages
    fits: Callable[[torch.Tensor], bool]          # does this output fit the task?
    # --- recognised under --task auto: the model's class or config names it; an output of this rank
    names_model: Callable[[nn.Module], bool] = _never
    from_rank: int | None = None
    # --- scored through the engine: its loss_fn (logits, targets) -> [B], distributions, targets
    loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None
    egl_loss: Callable | None = None  # the loss egl takes gradients of, when not `loss` (regression)
    dists: Callable[[torch.Tensor], torch.Tensor] | None = None     # logits -> probs [B, N, K]
    # position labels [S, B, N] long (valid [B, N]) -> S target sets in the loss's layout [S, B, ...]
    label_targets: Callable | None = None
    valid: Callable | None = None     # (logits, inputs, words) -> [B, N] bool: the positions that count
    classes: Callable[[torch.Tensor], int | None] = _none           # how many classes the output scores
    targets: Callable | None = None   # s -> the given labels where known, else the predicted ones
    needs_targets: bool = False       # gradnorm and loss need given targets (a prediction gives 0)
    unanswered: Callable = _none      # (pool, strategy) -> a sentence naming a row gradnorm and
                                      # loss cannot score (causal-lm: no answer), checked up front
    # --- the utilities it supports: s -> Columns
    egl: Callable | None = None
    uncertainty: Callable | None = None   # (s, "entropy" | "margin" | "least-confidence") -> Columns
    table_loss: Callable | None = None    # s -> the loss column [B], at `targets`
    # alcli review: s -> per example its reviewed units as JSON, [[group, given, [p_0..p_K-1],
    # where], ...] (a unit: one labeled decision; classification: the row; multilabel: each label,
    # K = 2; token classification: each labeled word, `where` its index)
    review_units: Callable | None = None
    review_pred: Callable | None = None   # (units, suggested classes, class names) -> {column: cell}
    review_own: Callable | None = None    # a task without classes (regression): [each labeled
                                          # row's units] -> its columns, instead of the thresholds
                                          # (with a `score` of its own: detection's, by image)
    review_given: Callable | None = None  # a task scoring its own batches (detection): (pool, ids,
                                          # class names) -> each id's given labels, None unlabeled
    # --- what its rows show
    columns: Callable | None = None   # (s, score) -> (pred [B], confidence [B], loss [B] | None, [extras])
    pred_values: Callable | None = None   # (preds, extras, class names) -> the pred column
    extra_columns: Callable = _nothing_dict  # (s, loss [B] | None) -> more [B] columns (perplexity)
    word_preds: bool = False          # rows show each word's prediction (`pred_words`, from `words`)
    class_pred: bool = False          # pred and label are one class: by name, with pred_index
    joins_labels: bool = False        # a row's labels are joined by '|': no class name may hold one
    names_classes: bool = True        # --class-names names the model's classes (keypoints: its keypoints)
    has_confidence: bool = True
    # --- its labels: read as given from the pool (lists, numbers, masks, word labels), or class indices
    given_labels: bool = True
    read_labels: Callable | None = None   # (pool, ids, logits, words) -> (targets, known [B] bool)
    label_shown: Callable | None = None   # (label as given, class names) -> its `label` cell (None: as given)
    check_labels: Callable | None = None  # (logits, labels [B], ids, pool): a RunError for unusable labels
    words: Callable = _none           # (batch, pool, inputs) -> (each token's word [B, T], counts) | None
    # --- BADGE: the head's module types, a check of its input, the factors; or why there are none
    head_types: tuple = (nn.Linear,)
    check_head_input: Callable = head_ran     # (name, h, logits, ids): a RunError for a bad input
    badge: Callable | None = None     # (logits, h, valid) -> (a [B, C], b [B, D])
    badge_over: Callable | None = None  # (logits, inputs, words) -> [B, N] the positions badge
                                        # averages over, when not `valid`'s (causal-lm: a prompt's last)
    no_badge: str | None = None
    # --- alcli inspect: the loss the engine is tried on, and its targets
    probe: Callable | None = None     # (logits, inputs) -> (loss_fn, targets)
    # --- Label Studio: a row's regions, the rows' own sign of the task, the labeling config
    prelabels: Callable = _nothing    # (row, n, tag, class names, data value) -> regions
    row_files: Callable | None = None  # (logits, rows, image paths, folder): writes each row's file
                                       # into folder (segmentation: its pred_mask PNG), names it in the row
    unnamed: Callable = _never        # (row, names): does it predict a class that has no name?
    unnamed_note: str = "predicted classes without a name, left out"
    shown_by_rows: Callable = _never  # row: do its columns say it is of this task?
    control: Callable | None = None   # (names, from_name, to_name) -> the control tag (XML)
    pairs: Callable | None = None     # row -> (prompt, answer1, answer2): select --pairwise's task
    # (an annotation's regions of the control tag, class names) -> the labels file's cells
    # {column: value}; a numpy array is a mask, written as a PNG (alcli pull)
    from_annotation: Callable | None = None
    # --- COCO and YOLO files (select -f coco / yolo): (row, n) -> its instances, each
    # (box [x0, y0, x1, y1] in pixels, class index, score, keypoints [[x, y, score] * K] or None)
    instances: Callable | None = None
    # --- a task scoring its own batches (detectors: a list of images of their own sizes)
    sized_images: bool = False
    model_kind: str | None = None     # the one kind of model it scores ("an object detector")
    needs_model: Callable = _none     # model -> a sentence when it is not of `model_kind`, else None
    normalised_outside: Callable = _never  # model: does it take normalised images?
    model_classes: Callable | None = None  # model -> its class count
    predict: Callable | None = None   # (model, images) -> per image {boxes, labels, scores, ...}
    rows: Callable | None = None      # (model, images, ids, settings, class names) -> rows
    method: Callable | None = None    # (model, --method) -> (the method, why)
    gradient_utilities: tuple = ()    # its strategies that take gradients (`method` says how)
    # --- outputs with positions (pixels, tokens): a loss over none is undefined (NaN, ranked last)
    loss_over_positions: bool = False
    # --- its pool's rows are text, prompt + response, or chat messages (pools/prompts.py)
    reads_prompts: bool = False
    no_position: Callable = _none     # logits -> a sentence when the output has no position to score
    # --- --strategy when none is given: the rule in docs/benchmarks.md ("A default strategy per
    # task") over learning curves; tests/test_defaults.py re-applies it to the recorded evidence
    default_strategy: str = "egl"
    default_aggregate: str = "mean"   # its --aggregate, when neither is given


def all_positions(count: Callable[[torch.Tensor], int]) -> Callable:
    """`valid` of a task whose every position counts: `count(logits)` of them."""
    def valid(logits: torch.Tensor, inputs=None, words=None) -> torch.Tensor:
        return torch.ones(logits.shape[0], count(logits), dtype=torch.bool, device=logits.device)
    return valid


# --- losses and distributions shared by the tasks ------------------------------------------------

def mean_ce(logits: torch.Tensor, targets: torch.Tensor, class_dim: int) -> torch.Tensor:
    """Mean cross-entropy over each example's positions whose target is not IGNORE -> [B]
    (0 for an example with none). Written with gather, so torch.func can vmap it."""
    valid = targets != IGNORE
    logp = torch.log_softmax(logits, dim=class_dim)
    picked = logp.gather(class_dim, targets.clamp_min(0).unsqueeze(class_dim)).squeeze(class_dim)
    ce = -(picked * valid).flatten(1).sum(1)
    return ce / valid.flatten(1).sum(1).clamp_min(1)


def categorical(logits: torch.Tensor, class_dim: int) -> torch.Tensor:
    """[B, C, *positions] or [B, *positions, C] -> softmax probs [B, N, C] in the exact dtype."""
    z = logits.to(exact_dtype(logits)).movedim(class_dim, -1)
    return z.softmax(-1).reshape(z.shape[0], -1, z.shape[-1])


def labels_to_dense(labels: torch.Tensor, valid: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """Position labels [..., B, N] -> targets shaped like the logits without the class dim, IGNORE
    where not valid."""
    return torch.where(valid, labels, torch.full_like(labels, IGNORE))


# --- targets: labels, predictions, samples -----------------------------------------------------

def predicted(spec: Task, logits: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """The most probable label at every position (multilabel: p > 1/2), as one target set in the
    loss's layout: the pseudo-labels gradnorm and loss use where no label is given."""
    labels = spec.dists(logits).argmax(-1)  # [B, N]; a tie goes to the lower index (absent)
    return spec.label_targets(labels.unsqueeze(0), valid, logits)[0]


def no_positions(spec: Task, targets: torch.Tensor) -> torch.Tensor:
    """[B] bool: the examples whose targets count at no position (a mask that ignores every
    pixel, a text without a labeled word); their loss, a mean over no position, is undefined."""
    if not spec.loss_over_positions:
        return torch.zeros(targets.shape[0], dtype=torch.bool, device=targets.device)
    return ~(targets != IGNORE).flatten(1).any(1)


def undefined_as_nan(spec: Task, targets: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """[B] values of the loss (or its gradient's norm) at `targets`, NaN where it is undefined
    (ranked last and counted, as other undefined scores)."""
    empty = no_positions(spec, targets).to(values.device)
    return torch.where(empty, torch.full_like(values, float("nan")), values)


def seeded_generator(seed: int, id_) -> torch.Generator:
    """The generator of (seed, example id): an example's draws whatever its batch, order or shard."""
    digest = hashlib.blake2b(f"egl\0{seed}\0{id_}".encode(), digest_size=8).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest, "big") >> 1)


def uniforms(ids: list, positions: int, samples: int, seed: int, device) -> torch.Tensor:
    """[S, B, N] uniforms, fixed by (seed, id): drawn position-major, so an example's first
    positions get the same draws whatever the batch's padding, batch size, order or shard."""
    rows = [torch.rand(positions, samples, generator=seeded_generator(seed, i), dtype=torch.float64)
            for i in ids]
    return torch.stack(rows, dim=1).permute(2, 1, 0).to(device)  # [N, B, S] -> [S, B, N]


def sampled(spec: Task, logits: torch.Tensor, valid: torch.Tensor, ids: list, samples: int,
            seed: int) -> list[torch.Tensor]:
    """S label sets drawn from the model's own predictive distribution, independently per
    position (categorical) or label (Bernoulli) -> S target sets in the loss's layout."""
    probs = spec.dists(logits)                                       # [B, N, K]
    u = uniforms(ids, probs.shape[1], samples, seed, probs.device)   # [S, B, N]
    cum = probs.cumsum(-1)[..., :-1]                                 # [B, N, K-1]
    labels = (u.unsqueeze(-1).to(cum.dtype) >= cum).sum(-1)          # inverse CDF -> [S, B, N]
    return list(spec.label_targets(labels, valid, logits).unbind(0))


def given_or_predicted(s) -> torch.Tensor:
    """Its given labels (`s.given`) where known, else the predicted labels."""
    given, known = s.given_targets() or (None, None)
    pred = predicted(s.spec, s.logits, s.valid)
    if known is None:
        return pred
    return torch.where(known.view(-1, *[1] * (pred.dim() - 1)), given.to(pred.dtype), pred)


def seeded_uniform(seed: int, id_: str) -> float:
    """A number in [0, 1) fixed by (seed, id): independent of batch size, order and sharding."""
    digest = hashlib.blake2b(f"{seed}\0{id_}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2.0 ** 64


# --- the engine's norms, for the gradient utilities ----------------------------------------------

def engine_loss(spec: Task | None, strategy: str) -> Callable | None:
    """The loss whose per-example gradients a gradient strategy of this task takes (None: the
    engine's default, cross-entropy): what `auto` settled its method for."""
    if spec is None:
        return None
    return spec.egl_loss if strategy == "egl" and spec.egl_loss is not None else spec.loss


def grad_norms(s, choose: Callable, loss_fn=None) -> torch.Tensor:
    """[K, B] float64 norms of each example's loss gradient at each target set `choose(s)` picks
    (the task's loss unless `loss_fn` is given).

    One forward: when `s.logits` is not known yet, the engine's forward provides it before the
    targets are chosen."""
    norms, _ = grad_norms_per_target(s.model, s.inputs, engine_targets(s, choose), params=s.layers,
                                     method=s.method, loss_fn=loss_fn or s.spec.loss, compile=s.compile)
    return norms.detach().to(s.logits.device, exact_dtype(s.logits))


def engine_targets(s, choose: Callable) -> Callable:
    """The engine's `target_sets(logits)` for the sets `choose(s)` picks; it sets `s.logits` from
    the engine's forward when they are not known yet."""
    def target_sets(logits: torch.Tensor) -> list[torch.Tensor]:
        # a batch of one runs as two copies (the engine's ONE_EXAMPLE_BUG): s keeps its own one
        copies = logits.shape[0] // max(len(s.ids), 1)
        if s.logits is None:
            if s.check_logits is not None:
                s.check_logits(logits[:len(s.ids)])
            s.logits = logits[:len(s.ids)]
        sets = choose(s)
        return sets if copies == 1 else [t.repeat(copies, *[1] * (t.dim() - 1)) for t in sets]
    return target_sets


def egl_sampled(s) -> dict:
    """Multilabel, segmentation, token classification: E_y ||grad loss(x, y)|| over the model's
    own joint predictive distribution (independent per label / position) is intractable; its
    Monte-Carlo estimate from S label sets drawn per example (seeded by id), all S through one
    backward, with `egl_se`, the estimate's standard error (sample std / sqrt S). `pseudo`: the
    norm at the predicted labels."""
    if s.egl_samples == "pseudo":
        norms = grad_norms(s, lambda s: [s.targets])[0]  # first: its forward sets s.logits
        return {"score": undefined_as_nan(s.spec, s.targets, norms)}
    norms = grad_norms(s, lambda s: sampled(s.spec, s.logits, s.valid, s.ids,
                                            s.egl_samples, s.seed))  # [S, B]
    cols = {"score": norms.mean(0)}
    if norms.shape[0] > 1:
        cols["egl_se"] = norms.std(0) / norms.shape[0] ** 0.5
    return cols


# --- cheap utilities per position, aggregated per example --------------------------------------

def entropy(p: torch.Tensor) -> torch.Tensor:
    return -torch.special.xlogy(p, p).sum(-1)


def margin(p: torch.Tensor) -> torch.Tensor:
    """1 - (p(best) - p(second best)) per position: large where the two best are close."""
    top = p.topk(min(2, p.shape[-1]), dim=-1).values
    return 1.0 - (top[..., 0] - top[..., 1] if top.shape[-1] > 1 else top[..., 0])


def least_confidence(p: torch.Tensor) -> torch.Tensor:
    return 1.0 - p.max(-1).values


def aggregate(values: torch.Tensor, valid: torch.Tensor, how: str) -> torch.Tensor:
    """[B, N] per-position values -> [B] over each example's valid positions: their mean, their
    max, or (top:Q) the mean of the ceil(Q n) largest of its n; 0 for an example with none."""
    count = valid.sum(1)
    if how == "mean":
        return (values * valid).sum(1) / count.clamp_min(1)
    low = torch.finfo(values.dtype).min
    kept = torch.where(valid, values, torch.full_like(values, low))
    if how == "max":
        return torch.where(count > 0, kept.max(1).values, torch.zeros_like(kept[:, 0]))
    q = float(how.split(":")[1])
    k = torch.ceil(q * count.to(values.dtype)).clamp_min(1)           # [B]
    top = kept.sort(dim=1, descending=True).values                    # [B, N]
    ranks = torch.arange(values.shape[1], device=values.device)
    take = (ranks.unsqueeze(0) < k.unsqueeze(1)) & (top > low)
    return torch.where(take, top, torch.zeros_like(top)).sum(1) / k


UTILITIES = {"entropy": entropy, "margin": margin, "least-confidence": least_confidence}


def utility(spec: Task, name: str, logits: torch.Tensor, valid: torch.Tensor, how: str) -> torch.Tensor:
    """A cheap utility of the task's outputs per example [B], higher = more uncertain, aggregated
    over the valid positions. A RunError in one sentence for a task without it."""
    if spec.dists is None:
        raise RunError(f"--strategy {name} needs a predicted distribution, and a {spec.name} model "
                       f"predicts values; use --strategy egl (exact for regression)")
    return aggregate(UTILITIES[name](spec.dists(logits)), valid, how)


def per_position(s, name: str) -> dict:
    """entropy, margin or least-confidence per position (binary per label), aggregated."""
    score = utility(s.spec, name, s.logits, s.valid, s.aggregate)
    return {"score": score, "margin": 1.0 - score} if name == "margin" else {"score": score}


def position_loss(s) -> torch.Tensor:
    """The task's per-example loss at `s.targets` -> [B] float64; NaN where undefined."""
    return undefined_as_nan(s.spec, s.targets, s.spec.loss(s.logits.to(exact_dtype(s.logits)), s.targets))


# --- the table's pred and confidence ---------------------------------------------------------------

def predicted_classes(spec: Task, logits: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """[B, C] bool: the classes predicted at any valid position (segmentation, token
    classification)."""
    probs = spec.dists(logits)
    labels = probs.argmax(-1)  # [B, N]
    hits = torch.zeros(labels.shape[0], probs.shape[-1], dtype=probs.dtype, device=probs.device)
    return hits.scatter_add_(1, labels, valid.to(probs.dtype)) > 0


def confidence(spec: Task, logits: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """[B]: the mean over valid positions (labels) of the probability of what is predicted there."""
    return aggregate(spec.dists(logits).max(-1).values, valid, "mean")


def set_columns(predicted_set: Callable = predicted_classes) -> Callable:
    """`columns` of a task whose pred is a set (multilabel: its labels; segmentation and token
    classification: the classes at its positions): the set as a [B, C] extra, the mean
    per-position probability of the prediction, the loss at the targets."""
    def columns(s, score: torch.Tensor):
        nothing = torch.zeros_like(score)
        valid = s.valid
        return (nothing, confidence(s.spec, s.logits, valid), s.spec.table_loss(s),
                [predicted_set(s.spec, s.logits, valid)])
    return columns


def named_set(preds: list, extras: list[torch.Tensor], names) -> list[str]:
    """pred_values of a set: the predicted labels / classes joined by | (by name where named)."""
    return ["|".join(str(class_name(c, names)) for c, hit in enumerate(r) if hit) for r in extras[0].tolist()]


def refuse_single_labels(task: str):
    """check_labels of a task whose labels are read as given: a single-class label is an error."""
    def check(logits, labels: torch.Tensor, ids: list[str], pool) -> None:
        if bool((labels >= 0).any()):
            i = int((labels >= 0).nonzero()[0])
            raise RunError(f"example {ids[i]} of {pool.name} has the single-class label {int(labels[i])}, "
                           f"which a {task} task cannot use; pass --task {task} so the pool's labels "
                           f"are read as its labels (lists, numbers, mask files)")
    return check


def head_outputs(module: nn.Module) -> int | None:
    return getattr(module, "out_features", getattr(module, "out_channels", None))


def position_badge(dists: Callable, tokens: bool = False):
    """BADGE factors of a task with positions (segmentation, token classification): the mean over
    valid positions of p - onehot(argmax), and the head's input averaged over its positions
    (`tokens`: valid ones), a rank-one stand-in for the sum over positions."""
    def badge(logits: torch.Tensor, h: torch.Tensor, valid: torch.Tensor):
        b = h.detach()
        if tokens and b.dim() == 3:                                # [B, T, D], padding left out
            m = valid.to(b.dtype).unsqueeze(-1)
            b = (b * m).sum(1) / m.sum(1).clamp_min(1)
        elif b.dim() > 2:                                          # [B, D, *positions]
            b = b.flatten(2).mean(2)
        probs = dists(logits.detach())                             # [B, N, K]
        onehot = torch.zeros_like(probs).scatter_(-1, probs.argmax(-1, keepdim=True), 1.0)
        a = probs - onehot
        m = valid.to(a.dtype).unsqueeze(-1)
        return (a * m).sum(1) / m.sum(1).clamp_min(1), b
    return badge


def predicted_probe(spec: Task):
    """probe of a task with a distribution: its loss at the predicted labels."""
    def probe(logits: torch.Tensor, inputs):
        return spec.loss, predicted(spec, logits, spec.valid(logits, inputs))
    return probe
