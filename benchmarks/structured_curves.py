"""Learning curves for structured tasks (issue 51): regression, segmentation, token classification
and detection, every strategy alcli scores them with, and the per-task default strategy by one
stated rule.

Data that ships inside packages (no download):
- regression: scikit-learn's diabetes (442 rows, 10 features, disease progression) and
  vega_datasets' local cars (392 complete rows, 6 features, miles per gallon); an MLP with
  dropout (10% after each hidden layer), targets standardised; score: test R².
- segmentation: texture mosaics, 24x24 grey images cut from four scikit-image images (brick,
  grass, gravel, moon): a random centre splits each image into four quadrants, each filled with
  a crop of a random texture; the label of a pixel is its quadrant's texture. A tiny FCN (two
  5x5 convs of 8 channels, the second dilated, a 1x1 head); score: test mean IoU (points).
  And digit composites: two of scikit-learn's digits 0-3 pasted on a dim crop of grass, each
  pixel labeled background or its digit (5 classes); the same FCN. And mosaics32: the mosaics
  at 32x32, an FCN of 16 channels, 40 epochs, 10..50 labels (a stronger model, where it fits).
- token classification (constructed: no tagged corpus ships in a package): pytokens, windows of
  24 tokens of the standard library's top-level modules, each tagged by its syntactic role
  (_tag_tokens); a BiLSTM tagger (Tagger); score: test macro F1 (points).
- detection: digit_boxes, one to three of scikit-learn's digits 0-3 pasted without overlap on
  grass, with their boxes; torchvision's FCOS on a 3-conv backbone (tiny_fcos), trained with its
  own loss; score: test mAP@0.5 (mean_ap, points). No +div: a detector's rows carry no BADGE
  factors.

A fixed test split (seed 0); the rest is the pool, its labels hidden from alcli. Per seed, INIT
random pool examples start labeled; each round a model is trained from scratch on the labeled set
(same torch seed for every method at a given label count, so comparisons are paired) and alcli
picks the next batch:

    rows = alcli.select(pool=x_unlabeled, model=net, budget=b, strategy=S, task=T,
                        aggregate=A, diverse=D)

Methods: random; the cheap utilities as alcli aggregates them over pixels (entropy with
aggregate mean and max, margin and least-confidence with the mean); egl and gradnorm, top-N and
`+div` (BADGE k-means++ among the 10 x budget best). gradnorm needs a target value on a
regression task (the prediction as its own target has zero gradient), so regression has no
gradnorm: its cheap peer is MC-dropout variance (`mc-var`: the variance of T = 20 forward passes
with dropout on, what users would otherwise use; alcli has no such strategy, so the benchmark
computes it and alcli.select ranks those rows).

Reports per data set: AULC (the mean score over the evaluated label counts) and the final score,
mean ± sd over seeds; paired two-sided t-tests of the AULC against random and against the best
cheap utility (the non-gradient strategy with the highest mean AULC on that data set), with wins
and losses over seeds; alcli.select's seconds per round. Then DEFAULT_RULE per task, whose inputs
(per-seed AULC and seconds per round of each method) are written to --rule-json; tests/
test_defaults.py rebuilds them from the committed curves (CURVE_FILES), re-applies the rule and
checks each task module's `default_strategy` and `default_aggregate`.

    python benchmarks/structured_curves.py --quick              # smoke run, seconds
    # the committed run, in 3 processes (seeds 0-4 and 5-9 of the segmentation sets apart):
    python benchmarks/structured_curves.py --datasets diabetes,cars --json reg.json
    python benchmarks/structured_curves.py --datasets mosaics --pool-size 150 --seeds 5 \
        --first-seed 0 --json mos-a.json            # and --first-seed 5, digit_composites alike
    python benchmarks/structured_curves.py --datasets pytokens --pool-size 300 --seeds 10 \
        --json tok.json
    python benchmarks/structured_curves.py --datasets digit_boxes --pool-size 100 --test-size 50 \
        --seeds 2 --first-seed 0 --json box-a.json  # 5 processes: --first-seed 0, 2, 4, 6, 8
    # the report and the rule over the committed curves (CURVE_FILES; or --json A,B,...):
    python benchmarks/structured_curves.py --report-only \
        --out benchmarks/results/structured-curves-cpu-2core \
        --rule-json benchmarks/results/structured-curves-defaults.json
"""
from __future__ import annotations

import argparse
import glob
import io
import json
import keyword
import os
import platform
import sys
import tempfile
import time
import tokenize
from collections import Counter, OrderedDict
from dataclasses import dataclass

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # the checkout's alcli, not an installed one

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

import alcli  # noqa: E402

# method -> (alcli strategy, diverse, aggregate); mc-var is scored here, not by alcli
METHODS = {"random": ("random", False, "mean"),
           "mc-var": ("mc-var", False, "mean"),
           "entropy": ("entropy", False, "mean"), "entropy-max": ("entropy", False, "max"),
           "margin": ("margin", False, "mean"), "least-confidence": ("least-confidence", False, "mean"),
           "egl": ("egl", False, "mean"), "egl+div": ("egl", True, "mean"),
           "gradnorm": ("gradnorm", False, "mean"), "gradnorm+div": ("gradnorm", True, "mean")}
GRADIENT = ("egl", "gradnorm")      # the strategies that call the gradient engine
STRUCTURED = ("random", "entropy", "entropy-max", "margin", "least-confidence", "egl", "egl+div",
              "gradnorm", "gradnorm+div")
TASK_METHODS = {"regression": ("random", "mc-var", "egl", "egl+div"),
                "segmentation": STRUCTURED, "token-classification": STRUCTURED,
                # a detector's rows carry no BADGE factors: no +div
                "detection": ("random", "entropy", "entropy-max", "least-confidence", "egl",
                              "gradnorm")}
# data set -> (task, test size, start labels, batch, max labels, epochs)
PROTOCOLS = {"diabetes": ("regression", 142, 10, 10, 80, 100),
             "cars": ("regression", 112, 10, 10, 80, 100),
             "mosaics": ("segmentation", 80, 10, 10, 40, 20),
             "digit_composites": ("segmentation", 80, 10, 10, 40, 20),
             "mosaics32": ("segmentation", 100, 10, 10, 50, 40),
             "pytokens": ("token-classification", 150, 10, 10, 50, 30),
             "digit_boxes": ("detection", 100, 10, 10, 30, 20)}
FCN_WIDTH = {"mosaics32": 16}  # channels of the FCN's convs per data set (default 8)
QUICK = {"seeds": 2, "max_labels": 20, "pool": 60, "epochs": 5, "test": 40,
         "methods": "random,mc-var,egl+div,entropy-max,egl,gradnorm+div"}
MC_PASSES = 20
LR = {"detection": 1e-3}  # Adam learning rate per task (default 3e-3; FCOS diverged at it)
TEXTURES = ("brick", "grass", "gravel", "moon")
TOKEN_TAGS = ("keyword", "defined", "called", "attribute", "name", "op", "number", "string")
TOKEN_WINDOW, TOKEN_VOCAB = 24, 400  # tokens per example; the most frequent strings kept (+ OOV)
DIGIT_CLASSES = 4  # digit_composites: digits 0-3 (+ background: 5 pixel classes)
DEFAULT_OUT = os.path.join(ROOT, "benchmarks", "results", "structured-curves-cpu-2core")
# classification's curves (issue 39: 5 data sets, 10 seeds), the rule's inputs for that task
CLASSIFICATION_EVIDENCE = os.path.join(ROOT, "benchmarks", "results", "issue39", "tables.json")
DEFAULT_RULE = ("A task's default is, among alcli's strategy settings (a strategy with its "
                "--aggregate; on each data set its better variant of plain and +div), one that no "
                "measured method, random and the benchmark's peers included, beats significantly "
                "(paired two-sided t on per-seed AULC, p < 0.05) on any of the task's data sets "
                "(when every setting is beaten somewhere: those beaten on the fewest); of those the "
                "cheapest by kind (a forward only, then one gradient per example: gradnorm, then "
                "several: egl; the order of the measured select seconds per round), and of equally "
                "cheap ones the highest mean AULC over the task's data sets.")
# the kinds of cost DEFAULT_RULE orders: gradients per example (0: the forward's outputs only)
GRADIENTS_PER_EXAMPLE = {"gradnorm": 1, "egl": 2}
# the committed curves DEFAULT_RULE reads (merged as --report-only merges them), beside
# CLASSIFICATION_EVIDENCE; tests/test_defaults.py rebuilds the rule's inputs from these
CURVE_FILES = tuple(os.path.join(ROOT, "benchmarks", "results", f"structured-curves-{n}.json")
                    for n in ("regression", "mosaics-a", "mosaics-b", "digits-a", "digits-b",
                              "mosaics32-a", "mosaics32-b", "pytokens", "boxes"))


@dataclass
class Data:
    name: str
    task: str
    x: torch.Tensor       # [N, D] rows or [N, 1, H, W] images
    y: torch.Tensor       # [N] float targets, [N, H, W] or [N, T] long labels, or a list of
                          # detection targets {boxes [K, 4], labels [K]}
    test: np.ndarray
    pool: np.ndarray
    classes: int          # 0 for regression


# ------------------------------------------------------------------------------------------ data
def _diabetes():
    from sklearn.datasets import load_diabetes
    raw = load_diabetes()
    return raw.data, raw.target


def _cars():
    from vega_datasets import local_data
    df = local_data.cars().dropna()
    cols = ["Cylinders", "Displacement", "Horsepower", "Weight_in_lbs", "Acceleration", "Year"]
    return df[cols].to_numpy(dtype=float), df["Miles_per_Gallon"].to_numpy(dtype=float)


def _mosaics(n: int = 700, side: int = 24, seed: int = 0):
    """n images [n, 1, side, side] and pixel labels [n, side, side]: quadrants around a random
    centre, each a random crop of a random texture (rescaled to 128 px on its short side)."""
    import skimage.data
    from skimage.transform import rescale
    from skimage.util import img_as_float
    rng = np.random.default_rng(seed)
    tex = [rescale(img_as_float(getattr(skimage.data, t)()), 128 / min(getattr(skimage.data, t)()
                                                                       .shape[:2]),
                   anti_aliasing=True) for t in TEXTURES]
    xs = np.zeros((n, 1, side, side), np.float32)
    ys = np.zeros((n, side, side), np.int64)
    for i in range(n):
        cy, cx = rng.integers(6, side - 6, 2)
        for rows in (slice(0, cy), slice(cy, side)):
            for cols in (slice(0, cx), slice(cx, side)):
                k = int(rng.integers(len(tex)))
                im = tex[k]
                top, left = rng.integers(0, im.shape[0] - side), rng.integers(0, im.shape[1] - side)
                xs[i, 0, rows, cols] = im[top:top + side, left:left + side][rows, cols]
                ys[i, rows, cols] = k
    return (xs - xs.mean()) / xs.std(), ys


def _digits_and_grass():
    """scikit-learn's 8x8 digits 0-3 in [0, 1], their classes, and scikit-image's grass as floats:
    what the composites and the digit boxes are pasted from."""
    import skimage.data
    from sklearn.datasets import load_digits
    from skimage.util import img_as_float
    raw = load_digits()
    keep = raw.target < DIGIT_CLASSES
    return raw.images[keep] / 16.0, raw.target[keep], img_as_float(skimage.data.grass())


def _digit_composites(n: int = 700, side: int = 24, seed: int = 0):
    """n images [n, 1, side, side] and pixel labels [n, side, side]: two of scikit-learn's 8x8
    digits 0-3, scaled 2x, pasted at random places (the later on top) over a dim crop of
    scikit-image's grass; a pixel is its digit's class + 1 where the digit's ink > 0.25, else
    0 (background)."""
    digits, labels, grass = _digits_and_grass()
    rng = np.random.default_rng(seed)
    xs = np.zeros((n, 1, side, side), np.float32)
    ys = np.zeros((n, side, side), np.int64)
    for i in range(n):
        top, left = rng.integers(0, grass.shape[0] - side, 2)
        xs[i, 0] = 0.4 * grass[top:top + side, left:left + side]
        for _ in range(2):
            k = int(rng.integers(len(digits)))
            ink = np.kron(digits[k], np.ones((2, 2)))                  # [16, 16]
            r, c = rng.integers(0, side - 16, 2)
            mask = ink > 0.25
            xs[i, 0, r:r + 16, c:c + 16][mask] = ink[mask]
            ys[i, r:r + 16, c:c + 16][mask] = labels[k] + 1
    return (xs - xs.mean()) / xs.std(), ys


def _tag_tokens(source: str) -> list[tuple[str, int]]:
    """(string, tag) of each token of one Python source (tokenize's NAME, OP, NUMBER, STRING; the
    rest skipped); a NAME's tag from its neighbours: a keyword; `defined` after def/class;
    `called` before '('; `attribute` after '.'; else `name` (TOKEN_TAGS' order)."""
    toks = [t for t in tokenize.generate_tokens(io.StringIO(source).readline)
            if t.type in (tokenize.NAME, tokenize.OP, tokenize.NUMBER, tokenize.STRING)]
    out = []
    for i, t in enumerate(toks):
        prev = toks[i - 1].string if i else ""
        nxt = toks[i + 1].string if i + 1 < len(toks) else ""
        if t.type == tokenize.NAME:
            tag = ("keyword" if keyword.iskeyword(t.string) else "defined" if prev in ("def", "class")
                   else "called" if nxt == "(" else "attribute" if prev == "." else "name")
            out.append((t.string, TOKEN_TAGS.index(tag)))
        else:
            kind = {tokenize.OP: "op", tokenize.NUMBER: "number", tokenize.STRING: "string"}[t.type]
            # numbers and strings as one string each: their class is not in their spelling
            out.append((t.string if kind == "op" else f"<{kind}>", TOKEN_TAGS.index(kind)))
    return out


def _pytokens(n: int = 700, seed: int = 0):
    """A constructed token task (no tagged corpus ships in a package; docs/benchmarks.md): n windows
    of TOKEN_WINDOW consecutive tokens [n, T] (ids of the TOKEN_VOCAB most frequent strings, 1 =
    out of vocabulary, 0 unused) from the standard library's top-level modules, each token
    tagged by _tag_tokens [n, T]."""
    files = sorted(glob.glob(os.path.join(os.path.dirname(os.__file__), "*.py")))
    windows = []
    for path in files:
        with open(path, encoding="utf-8") as f:
            try:
                tagged = _tag_tokens(f.read())
            except (SyntaxError, tokenize.TokenError):
                continue
        windows += [tagged[i:i + TOKEN_WINDOW]
                    for i in range(0, len(tagged) - TOKEN_WINDOW + 1, TOKEN_WINDOW)]
    rng = np.random.default_rng(seed)
    chosen = [windows[i] for i in rng.choice(len(windows), n, replace=False)]
    counts = Counter(s for w in chosen for s, _ in w)
    ids = {s: k + 2 for k, (s, _) in enumerate(counts.most_common(TOKEN_VOCAB))}
    xs = np.array([[ids.get(s, 1) for s, _ in w] for w in chosen], np.int64)
    ys = np.array([[t for _, t in w] for w in chosen], np.int64)
    return xs, ys


def _digit_boxes(n: int = 500, side: int = 48, seed: int = 0):
    """n RGB images [n, 3, side, side] in [0, 1] and their targets: one to three of scikit-learn's
    digits 0-3, scaled 2x, pasted without overlap over a dim crop of scikit-image's grass (grey,
    as 3 channels); a digit's box is its ink's (> 0.25) bounding box, its label the digit + 1."""
    digits, labels, grass = _digits_and_grass()
    rng = np.random.default_rng(seed)
    xs = np.zeros((n, 1, side, side), np.float32)
    targets = []
    for i in range(n):
        top, left = rng.integers(0, grass.shape[0] - side, 2)
        xs[i, 0] = 0.4 * grass[top:top + side, left:left + side]
        taken = np.zeros((side, side), bool)
        boxes, classes = [], []
        for _ in range(int(rng.integers(1, 4))):
            k = int(rng.integers(len(digits)))
            ink = np.kron(digits[k], np.ones((2, 2)))                  # [16, 16]
            for _try in range(20):
                r, c = rng.integers(0, side - 16, 2)
                if not taken[r:r + 16, c:c + 16].any():
                    break
            else:
                continue
            taken[r:r + 16, c:c + 16] = True
            mask = ink > 0.25
            xs[i, 0, r:r + 16, c:c + 16][mask] = ink[mask]
            rows, cols = np.nonzero(mask)
            boxes.append([c + cols.min(), r + rows.min(), c + cols.max() + 1, r + rows.max() + 1])
            classes.append(int(labels[k]) + 1)
        targets.append({"boxes": torch.tensor(boxes, dtype=torch.float32).reshape(-1, 4),
                        "labels": torch.tensor(classes, dtype=torch.int64)})
    return np.repeat(xs, 3, axis=1), targets


def load_data(name: str, pool_size: int | None = None, test_size: int | None = None) -> Data:
    """The data set, its fixed test split (seed 0; `test_size`: its first rows only) and pool
    (`pool_size`: a fixed random subset, seed 1)."""
    task, n_test = PROTOCOLS[name][:2]
    x, y = {"diabetes": _diabetes, "cars": _cars, "mosaics": _mosaics,
            "digit_composites": _digit_composites,
            "mosaics32": lambda: _mosaics(side=32), "pytokens": _pytokens,
            "digit_boxes": _digit_boxes}[name]()
    order = np.random.default_rng(0).permutation(len(x))
    test, pool = np.sort(order[:n_test][:test_size]), np.sort(order[n_test:])
    if pool_size is not None:
        pool = np.sort(np.random.default_rng(1).choice(pool, pool_size, replace=False))
    if task == "regression":  # standardise features and target with the pool's statistics
        x = (x - x[pool].mean(0)) / x[pool].std(0)
        y = (y - y[pool].mean()) / y[pool].std()
        return Data(name, task, torch.tensor(x, dtype=torch.float32),
                    torch.tensor(y, dtype=torch.float32), test, pool, 0)
    if task == "detection":  # y: a list of targets; classes counts torchvision's background 0
        return Data(name, task, torch.tensor(x), y, test, pool, DIGIT_CLASSES + 1)
    classes = len(TOKEN_TAGS) if task == "token-classification" else int(y.max()) + 1
    return Data(name, task, torch.tensor(x), torch.tensor(y), test, pool, classes)


class Tagger(nn.Module):
    """token ids [B, T] -> tag logits [B, T, C]: an embedding of 32, a bidirectional LSTM of 32
    per direction, a linear head."""

    def __init__(self, vocab: int, classes: int):
        super().__init__()
        self.emb = nn.Embedding(vocab, 32)
        self.rnn = nn.LSTM(32, 32, batch_first=True, bidirectional=True)
        self.head = nn.Linear(64, classes)

    def forward(self, x):
        h, _ = self.rnn(self.emb(x))
        return self.head(h)


# ---------------------------------------------------------------------------------------- models
class TinyBackbone(nn.Module):
    """[B, 3, H, W] -> one feature map at stride 4 of 32 channels, as torchvision's detectors take."""

    out_channels = 32

    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(3, 16, 3, 2, 1), nn.ReLU(), nn.Conv2d(16, 32, 3, 2, 1),
                                  nn.ReLU(), nn.Conv2d(32, 32, 3, 1, 1), nn.ReLU())

    def forward(self, x):
        return OrderedDict([("0", self.body(x))])


def tiny_fcos(classes: int) -> nn.Module:
    """torchvision's FCOS on TinyBackbone: one level (stride 4, anchors 16 px), a head of one conv
    per branch, images kept at 48 px, up to 10 boxes per image scoring at least 0.05."""
    from torchvision.models.detection import FCOS
    from torchvision.models.detection.anchor_utils import AnchorGenerator
    from torchvision.models.detection.fcos import FCOSHead
    return FCOS(TinyBackbone(), num_classes=classes, head=FCOSHead(32, 1, classes, num_convs=1),
                anchor_generator=AnchorGenerator(sizes=((16,),), aspect_ratios=((1.0,),)),
                min_size=48, max_size=48, image_mean=[0.5] * 3, image_std=[0.25] * 3,
                score_thresh=0.05, detections_per_img=10, topk_candidates=50)


def make_model(data: Data) -> nn.Module:
    if data.task == "regression":  # [B, D] -> [B, 1]
        d = data.x.shape[1]
        return nn.Sequential(nn.Linear(d, 64), nn.ReLU(), nn.Dropout(0.1), nn.Linear(64, 64),
                             nn.ReLU(), nn.Dropout(0.1), nn.Linear(64, 1))
    if data.task == "token-classification":
        return Tagger(TOKEN_VOCAB + 2, data.classes)
    if data.task == "detection":
        return tiny_fcos(data.classes)
    # [B, 1, H, W] -> [B, classes, H, W]; receptive field 13 px
    width = FCN_WIDTH.get(data.name, 8)
    return nn.Sequential(nn.Conv2d(1, width, 5, padding=2), nn.ReLU(),
                         nn.Conv2d(width, width, 5, padding=4, dilation=2), nn.ReLU(),
                         nn.Conv2d(width, data.classes, 1))


def train(data: Data, labeled: np.ndarray, seed: int, epochs: int) -> nn.Module:
    """A fresh model on `labeled`: Adam lr 3e-3, `epochs` passes of mini-batches of 32, seeded by
    (seed, label count) so every method starts from the same weights."""
    torch.manual_seed(seed * 100_003 + len(labeled))
    net = make_model(data)
    opt = torch.optim.Adam(net.parameters(), lr=LR.get(data.task, 3e-3))
    x = data.x[labeled]
    y = [data.y[i] for i in labeled] if data.task == "detection" else data.y[labeled]
    gen = torch.Generator().manual_seed(seed * 100_003 + len(labeled))
    net.train()
    for _ in range(epochs):
        for idx in torch.randperm(len(x), generator=gen).split(32 if data.task != "detection" else 8):
            opt.zero_grad()
            if data.task == "detection":  # the detector's own training loss, summed over its terms
                sum(net(list(x[idx]), [y[i] for i in idx.tolist()]).values()).backward()
                opt.step()
                continue
            out = net(x[idx])
            if data.task == "token-classification":
                out = out.transpose(1, 2)  # [B, C, T], as cross_entropy takes classes
            loss = (F.mse_loss(out.squeeze(1), y[idx]) if data.task == "regression"
                    else F.cross_entropy(out, y[idx]))
            loss.backward()
            opt.step()
    return net.eval()


@torch.no_grad()
def evaluate(net: nn.Module, data: Data) -> float:
    """Regression: test R² (points, 100 = perfect); segmentation: mean IoU over the classes
    present in the test split (points); token classification: macro F1 over the tags present
    in the test split (points)."""
    if data.task == "detection":
        return mean_ap(net(list(data.x[data.test])), [data.y[i] for i in data.test], data.classes)
    out, y = net(data.x[data.test]), data.y[data.test]
    if data.task == "regression":
        return float(100 * (1 - (out.squeeze(1) - y).square().sum() / (y - y.mean()).square().sum()))
    if data.task == "token-classification":
        return macro_f1(out.argmax(-1), y, data.classes)
    pred = out.argmax(1)
    ious = [((pred == c) & (y == c)).sum() / ((pred == c) | (y == c)).sum()
            for c in range(data.classes) if (y == c).any()]
    return float(100 * torch.stack(ious).mean())


def macro_f1(pred: torch.Tensor, y: torch.Tensor, classes: int) -> float:
    """Mean over the classes present in y of F1 = 2 TP / (2 TP + FP + FN), in points."""
    f1 = [2 * ((pred == c) & (y == c)).sum() / ((pred == c).sum() + (y == c).sum())
          for c in range(classes) if (y == c).any()]
    return float(100 * torch.stack(f1).mean())


def average_precision(scores: np.ndarray, hits: np.ndarray, positives: int) -> float:
    """All-point interpolated AP (VOC 2010+): detections in descending score, `hits` whether each
    matched a box; the area under the precision envelope over recall."""
    order = np.argsort(-scores, kind="stable")
    tp = np.cumsum(hits[order])
    recall = np.concatenate([[0.0], tp / positives])
    precision = np.concatenate([[1.0], tp / np.arange(1, len(tp) + 1)])
    envelope = np.maximum.accumulate(precision[::-1])[::-1]  # max precision at recall >= r
    return float(np.sum(np.diff(recall) * envelope[1:]))


def mean_ap(preds: list[dict], truths: list[dict], classes: int, iou: float = 0.5) -> float:
    """mAP@iou in points: per class present, each image's detections in descending score matched
    greedily to the unmatched box of that class with the highest IoU >= iou; the classes' AP
    averaged (average_precision)."""
    from torchvision.ops import box_iou
    aps = []
    for c in range(1, classes):
        positives = sum(int((t["labels"] == c).sum()) for t in truths)
        if positives == 0:
            continue
        scores, hits = [], []
        for p, t in zip(preds, truths):
            mine, theirs = p["labels"] == c, t["boxes"][t["labels"] == c]
            boxes, conf = p["boxes"][mine], p["scores"][mine]
            taken = torch.zeros(len(theirs), dtype=torch.bool)
            overlaps = box_iou(boxes, theirs) if len(theirs) and len(boxes) else None
            for j in torch.argsort(conf, descending=True, stable=True).tolist():
                hit = False
                if overlaps is not None:
                    o = overlaps[j].masked_fill(taken, -1)
                    k = int(o.argmax())
                    hit = bool(o[k] >= iou)
                    taken[k] |= hit
                scores.append(float(conf[j]))
                hits.append(hit)
        aps.append(average_precision(np.array(scores), np.array(hits, float), positives)
                   if scores else 0.0)
    return 100 * float(np.mean(aps))


# ------------------------------------------------------------------------------------- selection
def mc_variance(net: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """MC-dropout: the variance over MC_PASSES forwards with dropout on -> [N]."""
    net.train()
    with torch.no_grad():
        outs = torch.stack([net(x).squeeze(1) for _ in range(MC_PASSES)])
    net.eval()
    return outs.var(0)


def select_batch(method: str, net: nn.Module, data: Data, x_unlabeled: torch.Tensor, budget: int,
                 seed: int) -> list[int]:
    """Positions in x_unlabeled of the batch alcli picks (its ids are the positions)."""
    strategy, diverse, aggregate = METHODS[method]
    if strategy == "mc-var":
        rows = [{"id": i, "score": float(v)} for i, v in enumerate(mc_variance(net, x_unlabeled))]
        return [int(r["id"]) for r in alcli.select(rows, budget, diverse=False, dedup=False, quiet=True)]
    # dedup=False: these pools hold no copies, and the committed curves were measured before
    # select's near-duplicate pass (issue 48), which a small net's features can trip
    rows = alcli.select(pool=x_unlabeled, model=net, budget=budget, strategy=strategy,
                        diverse=diverse, aggregate=aggregate, task=data.task, batch_size=256,
                        device="cpu", seed=seed, quiet=True, dedup=False)
    return [int(r["id"]) for r in rows]


_FIRST: dict = {}  # (data set, seed) -> the first round's weights and score, which every method shares


def first_model(data: Data, labeled: np.ndarray, seed: int, epochs: int) -> tuple[nn.Module, float]:
    """The model of the seed's first round and its score: trained once, the same for every method
    (train's seed depends on (seed, label count) only)."""
    key = (data.name, seed, epochs, tuple(labeled.tolist()))
    if key not in _FIRST:
        net = train(data, labeled, seed, epochs)
        _FIRST[key] = ({k: v.clone() for k, v in net.state_dict().items()}, evaluate(net, data))
    weights, score = _FIRST[key]
    net = make_model(data)
    net.load_state_dict(weights)
    return net.eval(), score


def run_curve(data: Data, method: str, seed: int, args) -> dict:
    _, _, init, batch, max_labels, epochs = protocol(data.name, args)
    labeled = np.sort(np.random.default_rng(seed).choice(data.pool, init, replace=False))
    net, first = first_model(data, labeled, seed, epochs)
    curve = {"labels": [len(labeled)], "score": [first], "t_select": []}
    while len(labeled) < max_labels:
        k = min(batch, max_labels - len(labeled))
        unlabeled = np.setdiff1d(data.pool, labeled)
        t0 = time.perf_counter()
        chosen = unlabeled[select_batch(method, net, data, data.x[unlabeled], k,
                                        seed * 1000 + len(labeled))]
        curve["t_select"].append(time.perf_counter() - t0)
        assert len(set(chosen.tolist()) - set(labeled.tolist())) == k
        labeled = np.sort(np.concatenate([labeled, chosen]))
        net = train(data, labeled, seed, epochs)
        curve["labels"].append(len(labeled))
        curve["score"].append(evaluate(net, data))
    return curve


def protocol(name: str, args):
    task, n_test, init, batch, max_labels, epochs = PROTOCOLS[name]
    return (task, n_test, init, batch, args.max_labels or max_labels, args.epochs or epochs)


# -------------------------------------------------------------------------------------- analysis
def paired_t(a: np.ndarray, b: np.ndarray) -> tuple[float, float]:
    """Two-sided paired t-test (seeds): (mean difference, p); p = 1 when undefined."""
    from scipy import stats
    d = np.asarray(a) - np.asarray(b)
    if len(d) < 2 or np.allclose(d, d[0]):
        return float(d.mean()), 1.0
    return float(d.mean()), float(stats.ttest_rel(a, b).pvalue)


def rule_inputs(results: dict) -> dict:
    """What DEFAULT_RULE reads: task -> data set -> method -> {aulc: [per seed], seconds}."""
    out: dict = {}
    for name, per_method in results["curves"].items():
        task = PROTOCOLS[name][0]
        out.setdefault(task, {})[name] = {
            m: {"aulc": [float(np.mean(c["score"])) for c in cs],
                "seconds": float(np.mean([t for c in cs for t in c["t_select"]]))}
            for m, cs in per_method.items()}
    return out


def setting(method: str) -> tuple[str, str] | None:
    """The (strategy, aggregate) a method runs that a task's default could name, else None:
    random, benchmark-side peers (mc-var; classification's bait, badge-gn, typical) and other
    selections (+power). +div is select's diverse option, not part of the setting."""
    from alcli.score.strategies import STRATEGIES
    if method in METHODS:
        strategy, _, aggregate = METHODS[method]
    else:  # classification's names (benchmarks/learning_curves.py): STRATEGY[+div]
        strategy, _, suffix = method.partition("+")
        aggregate = "mean" if suffix in ("", "div") else None
    ok = strategy in STRATEGIES and strategy != "random" and aggregate is not None
    return (strategy, aggregate) if ok else None


def best_variant(data: dict, chosen: tuple[str, str]) -> str:
    """The setting's method (plain or +div) with the highest mean AULC on one data set."""
    own = [m for m in data if setting(m) == chosen]
    return max(own, key=lambda m: np.mean(data[m]["aulc"]))


def cost(per_data: dict, chosen: tuple[str, str]) -> float:
    """Mean select seconds per round of the setting's methods over the task's data sets."""
    return float(np.mean([d[m]["seconds"] for d in per_data.values() for m in d
                          if setting(m) == chosen]))


def beaten_on(per_data: dict, chosen: tuple[str, str], alpha: float = 0.05) -> list[str]:
    """The data sets where some measured method's AULC is significantly above the setting's
    better variant (paired t, p < alpha)."""
    out = []
    for name, data in per_data.items():
        mine = data[best_variant(data, chosen)]["aulc"]
        for m in data:
            diff, p = paired_t(data[m]["aulc"], mine)
            if diff > 0 and p < alpha:
                out.append(name)
                break
    return out


def mean_aulc(per_data: dict, chosen: tuple[str, str]) -> float:
    """The setting's better variant's mean AULC, averaged over the task's data sets."""
    return float(np.mean([np.mean(d[best_variant(d, chosen)]["aulc"]) for d in per_data.values()]))


def pick_default(per_data: dict, alpha: float = 0.05) -> tuple[str, str]:
    """DEFAULT_RULE on one task's rule inputs (data set -> method -> {aulc, seconds}):
    (strategy, aggregate)."""
    everywhere = set.intersection(*({setting(m) for m in d} for d in per_data.values())) - {None}
    return min(sorted(everywhere),
               key=lambda s: (len(beaten_on(per_data, s, alpha)), GRADIENTS_PER_EXAMPLE.get(s[0], 0),
                              -mean_aulc(per_data, s)))


def shown(chosen: tuple[str, str]) -> str:
    strategy, aggregate = chosen
    return strategy if aggregate == "mean" else f"{strategy} --aggregate {aggregate}"


def all_inputs(results: dict) -> dict:
    """rule_inputs, plus classification's from CLASSIFICATION_EVIDENCE when it is there."""
    inputs = rule_inputs(results)
    if os.path.exists(CLASSIFICATION_EVIDENCE):
        inputs["classification"] = classification_inputs(CLASSIFICATION_EVIDENCE)
    return inputs


def classification_inputs(path: str) -> dict:
    """DEFAULT_RULE's inputs from benchmarks/learning_curves.py's saved curves (--json): data set
    setting -> method -> {aulc: per seed mean accuracy in points, seconds: select per round}."""
    with open(path) as f:
        curves = json.load(f)["curves"]
    return {setting: {m: {"aulc": [100 * float(np.mean(c["acc"])) for c in cs],
                          "seconds": float(np.mean([t for c in cs for t in c["t_score"]]))}
                      for m, cs in per_method.items()}
            for setting, per_method in curves.items()}


def sizes(name: str, meta: dict) -> str:
    """'pool N, test M' of the run that made the data set's curves."""
    a = meta.get("data_args", {}).get(name, meta["args"])
    data = load_data(name, a.get("pool_size"), a.get("test_size"))
    return f"pool {len(data.pool)}, test {len(data.test)}"


def data_table(name: str, per_method: dict, meta: dict) -> list[str]:
    aulc = {m: np.array([np.mean(c["score"]) for c in cs]) for m, cs in per_method.items()}
    final = {m: np.array([c["score"][-1] for c in cs]) for m, cs in per_method.items()}
    cheap = [m for m in aulc if METHODS[m][0] not in GRADIENT + ("random",)]
    best_cheap = max(cheap, key=lambda m: aulc[m].mean()) if cheap else None
    cs0 = next(iter(per_method.values()))
    metric = {"regression": "R² (points)", "token-classification": "macro F1 (points)",
              "detection": "mAP@0.5 (points)"}.get(
        PROTOCOLS[name][0], "mean IoU (points)")
    lines = [f"### {name} ({PROTOCOLS[name][0]}; {sizes(name, meta)}; {len(cs0)} seeds, "
             f"{cs0[0]['labels'][0]}..{cs0[0]['labels'][-1]} labels, batch "
             f"{cs0[0]['labels'][1] - cs0[0]['labels'][0]}, {PROTOCOLS[name][5]} epochs; test "
             f"{metric}; best cheap utility: {best_cheap})", "",
             "| method | AULC mean ± sd | final mean ± sd | vs random: Δ, p, W/L | "
             f"vs {best_cheap}: Δ, p, W/L | select s/round |", "|---|---|---|---|---|---|"]

    def versus(m: str, other: str | None) -> str:
        if other is None or other == m:
            return "—"
        d, p = paired_t(aulc[m], aulc[other])
        return (f"{d:+.2f}, {p:.3f}, {int((aulc[m] > aulc[other]).sum())}/"
                f"{int((aulc[m] < aulc[other]).sum())}")

    for m in per_method:
        secs = np.mean([t for c in per_method[m] for t in c["t_select"]])
        lines.append(f"| {m} | {aulc[m].mean():.2f} ± {aulc[m].std(ddof=1) if len(aulc[m]) > 1 else 0:.2f} "
                     f"| {final[m].mean():.2f} ± {final[m].std(ddof=1) if len(final[m]) > 1 else 0:.2f} "
                     f"| {versus(m, 'random')} | {versus(m, best_cheap)} | {secs:.3f} |")
    return lines


def report(results: dict) -> str:
    meta = results["meta"]
    lines = ["# Learning curves for structured tasks (benchmarks/structured_curves.py)", "",
             f"torch {meta['torch']}, python {meta['python']}, {meta['machine']}, 1 thread, "
             f"wall time {meta.get('seconds', 0) / 60:.1f} min (summed over the runs merged). "
             "AULC = mean test score over the "
             "evaluated label counts. p: paired two-sided t-test on per-seed AULC; W/L: seeds "
             "where the method's AULC is above/below the other's.", ""]
    for name, per_method in results["curves"].items():
        lines += data_table(name, per_method, meta) + [""]
    lines += ["## Default per task", "", DEFAULT_RULE, ""]
    for task, per_data in all_inputs(results).items():
        lines.append(f"- {task}: {shown(pick_default(per_data))} (data sets: "
                     f"{', '.join(per_data)})")
        everywhere = set.intersection(*({setting(m) for m in d} for d in per_data.values()))
        for s in sorted(everywhere - {None}, key=lambda s: cost(per_data, s)):
            lines.append(f"  - {shown(s)}: {cost(per_data, s):.3f} s/round, mean AULC "
                         f"{mean_aulc(per_data, s):.2f}, beaten on "
                         f"{', '.join(beaten_on(per_data, s)) or 'none'}")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------- main
def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smoke run: 2 seeds, a 60-example pool, "
                    "40 test examples, 20 labels, 5 epochs, the methods in QUICK")
    ap.add_argument("--datasets", default="diabetes,cars,mosaics",
                    help="comma list of " + ",".join(PROTOCOLS))
    ap.add_argument("--methods", help="comma list (default: each task's, see TASK_METHODS)")
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--first-seed", type=int, default=0, help="seeds FIRST.. (to split a run over "
                    "processes; --report-only merges their --json files)")
    ap.add_argument("--max-labels", type=int)
    ap.add_argument("--epochs", type=int)
    ap.add_argument("--pool-size", type=int)
    ap.add_argument("--test-size", type=int, help="evaluate on the first N of the test split")
    ap.add_argument("--out", help="output prefix (.txt); default benchmarks/results/"
                    "structured-curves-cpu-2core, quick: a temp dir")
    ap.add_argument("--json", help="save every curve here (as the run goes); with --report-only "
                    "a comma list of such files, merged")
    ap.add_argument("--rule-json", help="write the default rule's inputs and picks here")
    ap.add_argument("--report-only", action="store_true", help="the report (and --rule-json) of "
                    "the --json files, or, without --json, of the committed curves (CURVE_FILES)")
    args = ap.parse_args(argv)
    if args.quick:
        args.seeds = QUICK["seeds"]
        args.max_labels = args.max_labels or QUICK["max_labels"]
        args.pool_size = args.pool_size or QUICK["pool"]
        args.epochs = args.epochs or QUICK["epochs"]
        args.test_size = args.test_size or QUICK["test"]
        args.methods = args.methods or QUICK["methods"]
    args.datasets = args.datasets.split(",")
    for name in args.datasets:
        if name not in PROTOCOLS:
            ap.error(f"unknown data set {name!r}; choose from {', '.join(PROTOCOLS)}")
    args.methods = args.methods.split(",") if args.methods else None
    if args.out is None:
        args.out = (os.path.join(tempfile.gettempdir(), "structured-curves-quick") if args.quick
                    else DEFAULT_OUT)
    return args


def run_all(args) -> dict:
    results = {"meta": {"args": {k: v for k, v in vars(args).items()}, "torch": torch.__version__,
                        "python": platform.python_version(), "machine": platform.machine()},
               "curves": {}}
    t_begin = time.perf_counter()
    for name in args.datasets:
        data = load_data(name, args.pool_size, args.test_size)
        methods = [m for m in TASK_METHODS[data.task] if not args.methods or m in args.methods]
        per_method = results["curves"].setdefault(name, {})
        for seed in range(args.first_seed, args.first_seed + args.seeds):
            for m in methods:
                per_method.setdefault(m, []).append(run_curve(data, m, seed, args))
            print(f"[{time.perf_counter() - t_begin:7.0f}s] {name} seed {seed} done",
                  file=sys.stderr, flush=True)
            if args.json:
                save_json(results, args.json)
    results["meta"]["seconds"] = time.perf_counter() - t_begin
    return results


def save_json(results: dict, path: str) -> None:
    with open(path + ".tmp", "w") as f:
        json.dump(results, f)
    os.replace(path + ".tmp", path)


def merge_json(paths: list[str]) -> dict:
    merged: dict = {}
    for path in paths:
        with open(path) as f:
            results = json.load(f)
        for name in results["curves"]:  # each data set's run arguments (its pool and test sizes)
            results["meta"].setdefault("data_args", {}).setdefault(name, results["meta"]["args"])
        if not merged:
            merged = results
        else:  # another data set, or more seeds of one: the curves side by side
            for name, a in results["meta"]["data_args"].items():
                merged["meta"]["data_args"].setdefault(name, a)
            for name, per_method in results["curves"].items():
                mine = merged["curves"].setdefault(name, {})
                for m, cs in per_method.items():
                    mine.setdefault(m, []).extend(cs)
            merged["meta"]["seconds"] = merged["meta"].get("seconds", 0) + \
                results["meta"].get("seconds", 0)
    return merged


def main(argv=None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(1)
    if args.report_only:  # the --json files given, else the committed curves
        results = merge_json(args.json.split(",") if args.json else list(CURVE_FILES))
    else:
        results = run_all(args)
        if args.json:
            save_json(results, args.json)
    text = report(results)
    print(text)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out + ".txt", "w") as f:
        f.write(text + "\n")
    if args.rule_json:
        inputs = all_inputs(results)
        with open(args.rule_json, "w") as f:
            json.dump({"rule": DEFAULT_RULE,
                       "defaults": {t: list(pick_default(d)) for t, d in inputs.items()},
                       "inputs": inputs}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
