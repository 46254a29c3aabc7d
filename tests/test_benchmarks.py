"""The benchmark scripts run: their quick modes, on the CPU (timings are never asserted)."""
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import benchmark_scripts

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


def in_process(name: str, *args) -> int:
    """benchmarks/NAME.py's main(ARGS) in this process (no interpreter start: each script's command
    line itself runs in a process of its own in one test below), the global RNG and the thread
    count left as they were."""
    threads = torch.get_num_threads()
    try:
        with torch.random.fork_rng(devices=[]):
            return benchmark_scripts.load(name).main([str(a) for a in args])
    finally:
        torch.set_num_threads(threads)


def test_learning_curves_quick(tmp_path):
    pytest.importorskip("sklearn")
    out = tmp_path / "lc"
    # --quick's settings (2 seeds, batch 50, cnn, 5 methods) on a 200-example pool, 2 rounds, 5
    # epochs: every step of the loop and the report, at a fifth of the quick run's time
    proc = subprocess.run([sys.executable, str(BENCH / "learning_curves.py"), "--quick",
                           "--pool-size", "200", "--max-labels", "120", "--epochs", "5",
                           "--out", str(out)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    text = Path(f"{out}.txt").read_text()
    assert "AUC" in text and "random" in text and "egl+div" in text
    assert "a fixed subset of 200 pool examples" in text and "Win matrix (BADGE" in text
    auc = {}
    table = text.split("## AUC (mean test accuracy", 1)[1].split("\n\n")[1]  # after its title
    for line in table.splitlines()[1:]:  # method, per-setting columns, mean, - random, - egl
        parts = line.split()
        auc[parts[0]] = parts[1:]
    assert set(auc) == {"egl", "egl+div", "margin+div", "typical", "random"}
    assert "Cold start: accuracy(typical) - accuracy(X)" in text and "behind from" in text
    assert auc["egl"] != auc["egl+div"]  # the two variants really differ (diverse is explicit)
    assert "egl = egl+div" not in text


def _learning_curves_module():
    return benchmark_scripts.load("learning_curves")


def test_learning_curves_packaged_datasets_quick(tmp_path):
    """Two of the data sets shipped in packages (lfw_subset, seattle-weather), power sampling and
    the markdown decision table, at a few seconds' cost."""
    for package in ("sklearn", "skimage", "vega_datasets", "scipy"):
        pytest.importorskip(package)
    out, md = tmp_path / "lc", tmp_path / "table.md"
    assert in_process("learning_curves", "--datasets", "lfw,seattle_weather", "--models", "mlp",
                      "--seeds", "2", "--batch-sizes", "10", "--max-labels", "30", "--epochs", "3",
                      "--strategies", "egl,egl+div,margin+power,random", "--out", out,
                      "--markdown", md, "--default-md", tmp_path / "default.md") == 0
    default = (tmp_path / "default.md").read_text()
    assert "| seattle_weather/mlp/b10 (2 seeds) | egl+div |" in default
    assert "Default rule (issue 39): keep egl+div only if" in default and "=> " in default
    rows = [line.split("|")[1:-1] for line in md.read_text().splitlines()
            if line.startswith("| lfw/") or line.startswith("| seattle_weather/")]
    cells = {(r[0].split()[0], r[1].strip()): r for r in rows}
    assert set(cells) == {(s, m) for s in ("lfw/mlp/b10", "seattle_weather/mlp/b10")
                          for m in ("egl", "egl+div", "margin+power", "random")}
    assert cells[("lfw/mlp/b10", "random")][4].strip() == "·"      # random vs itself
    assert cells[("lfw/mlp/b10", "egl+div")][5].strip() == "·"     # the default vs itself
    assert "lfw/mlp/b10: 2 seeds, 10..30 labels" in Path(f"{out}.txt").read_text()


def test_learning_curves_metrics_and_data(tmp_path):
    """accuracy() and balanced accuracy against scikit-learn's; the packaged data sets' labels
    against their sources."""
    pytest.importorskip("sklearn")
    from sklearn.metrics import accuracy_score, balanced_accuracy_score
    import numpy as np
    import torch
    lc = _learning_curves_module()
    gen = torch.Generator().manual_seed(0)
    y = torch.tensor([0] * 30 + [1] * 6 + [2] * 4)           # imbalanced: the two differ
    data = lc.Data("t", torch.randn(40, 5, generator=gen), y, np.arange(40), np.arange(0),
                   3, False)
    net = torch.nn.Linear(5, 3)
    torch.nn.init.normal_(net.weight, generator=gen)
    acc, bacc = lc.accuracy(net, data)
    pred = net(data.x).argmax(1).numpy()
    assert acc == pytest.approx(accuracy_score(y.numpy(), pred))
    assert bacc == pytest.approx(balanced_accuracy_score(y.numpy(), pred))
    assert abs(acc - bacc) > 1e-3
    pytest.importorskip("skimage")
    lfw = lc.load_data("lfw")
    assert lfw.y[:100].tolist() == [1] * 100 and lfw.y[100:].tolist() == [0] * 100
    assert len(lfw.test) == 60 and len(np.intersect1d(lfw.test, lfw.pool)) == 0
    pytest.importorskip("vega_datasets")
    from vega_datasets import local_data
    counts = local_data.seattle_weather()["weather"].value_counts().sort_index().tolist()
    weather = lc.load_data("seattle_weather")
    assert np.bincount(weather.y.numpy()).tolist() == counts and weather.x.shape == (1461, 6)


def test_learning_curves_bait_and_badge_gn_against_oracles():
    """bait: the Woodbury-updated greedy choice equals forward-then-backward selection on the
    trace tr(M_S⁻¹ F) computed directly (float64); badge-gn: alcli's gradient norms behind its
    embedding lengths equal the per-example loop's. The two image sets: their class counts."""
    import numpy as np
    import torch
    lc = _learning_curves_module()
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(5, 12), torch.nn.ReLU(), torch.nn.Linear(12, 3)).eval()
    x = torch.randn(40, 5)
    labeled, unlabeled = np.arange(8), np.arange(8, 40)
    chosen = lc.select_bait(net, x, labeled, unlabeled, 3)
    _, a, b = lc.pool_gradients(net, x)
    v = lc.fisher_factors(a, b, lc.BAIT_RANK)
    fisher = torch.einsum("nck,ncl->kl", v, v) / len(v)

    def trace(picked):  # tr((λI + Σ_{L∪S} I(x) / (n_L + budget))⁻¹ F)
        rows = np.concatenate([labeled, unlabeled[list(picked)]])
        m = lc.BAIT_LAMBDA * torch.eye(v.shape[2], dtype=v.dtype) + torch.einsum(
            "nck,ncl->kl", v[rows], v[rows]) / (len(labeled) + 3)
        return torch.trace(torch.linalg.solve(m, fisher)).item()

    want: list[int] = []
    for _ in range(6):
        want.append(min((i for i in range(32) if i not in want), key=lambda i: trace(want + [i])))
    while len(want) > 3:
        want.pop(min(range(len(want)), key=lambda j: trace(want[:j] + want[j + 1:])))
    assert chosen == want
    norms, _, _ = lc.pool_gradients(net, x)
    import copy
    net64 = copy.deepcopy(net).double()
    for i in range(len(x)):  # the oracle: one example at a time, float64
        out = net64(x[i:i + 1].double())
        grads = torch.autograd.grad(torch.nn.functional.cross_entropy(out, out.argmax(1)),
                                    list(net64.parameters()))
        assert norms[i] == pytest.approx(torch.sqrt(sum((g ** 2).sum() for g in grads)).item(),
                                         rel=1e-4)
    from alcli.selection.diverse import kmeanspp_dense
    picks = lc.select_badge_gn(net, x[unlabeled], 4, 0)
    _, a, b = lc.pool_gradients(net, x[unlabeled])
    u = (a[:, :, None] * b[:, None, :]).flatten(1)               # explicit u_i = a_i ⊗ b_i [U, C·D]
    u = u * torch.from_numpy(norms[unlabeled])[:, None] / u.norm(dim=1, keepdim=True)
    assert picks == kmeanspp_dense(u, 4, 0) and picks[0] == int(np.argmax(norms[unlabeled]))
    pytest.importorskip("skimage")
    textures = lc.load_data("textures")
    assert np.bincount(textures.y.numpy()).tolist() == [300, 222, 164, 122, 90, 67, 49, 37, 27, 20]
    assert textures.x.shape[1:] == (1, 28, 28)


def test_lm_pruning_quick(tmp_path):
    """benchmarks/lm_pruning.py --quick end to end (alcli score in subprocesses, fine-tuning, the
    table); its selections against a float64 loop over the pool texts, each alone (top-k by
    gradient norm and by loss, gradnorm's bottom-k), its base held-out loss against the same loop."""
    pytest.importorskip("transformers")
    pytest.importorskip("scipy")
    import json
    import math
    import torch
    import torch.nn.functional as F
    from transformers import AutoTokenizer, GPT2LMHeadModel
    out, work = tmp_path / "lm.txt", tmp_path / "work"
    proc = subprocess.run([sys.executable, str(BENCH / "lm_pruning.py"), "--quick", "--out", str(out),
                           "--work", str(work)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(Path(f"{out}.json").read_text())
    text = out.read_text()
    names = ["gradnorm", "loss", "align", "gradnorm-bottom", "random", "all"]
    assert list(result["heldout"]) == names
    for name in names:
        line = next(line for line in text.splitlines() if line.startswith(result["labels"][name] + " "))
        assert ("±" in line) and (line.count("·") == 3) == (name == "random"), line
        assert len(result["heldout"][name]) == 2 and all(math.isfinite(x) for r in result["heldout"][name] for x in r)
    assert "p (paired t)" in text and "pydoc_data/topics.py" in text

    pool = [json.loads(line) for line in (work / "pool.jsonl").read_text().splitlines()]
    heldout = [json.loads(line)["text"] for line in (work / "heldout.jsonl").read_text().splitlines()]
    assert not {r["text"] for r in pool} & set(heldout)
    k, ids = result["k"], [r["id"] for r in pool]
    chosen = result["chosen"]
    assert k == round(len(pool) * 0.2) and chosen["all"][0] == ids
    assert all(len(c) == k and len(set(c)) == k and set(c) <= set(ids) for c in chosen["random"])
    assert chosen["random"][0] != chosen["random"][1]

    tok = AutoTokenizer.from_pretrained(work / "base")
    model = GPT2LMHeadModel.from_pretrained(work / "base").double().eval()
    params = list(model.parameters())

    def loss_of(text):  # mean next-token cross-entropy of one text alone, float64
        ids_ = torch.tensor([tok(text, truncation=True)["input_ids"]])
        logits = model(input_ids=ids_).logits[0]                     # [T, V]
        return F.cross_entropy(logits[:-1], ids_[0, 1:])

    def flat(text):
        return torch.cat([g.reshape(-1) for g in torch.autograd.grad(loss_of(text), params)])

    gbar = torch.stack([flat(t) for t in heldout]).mean(0)  # align's target: the held-out texts
    loss, norm, cosine = {}, {}, {}
    for row in pool:
        value = loss_of(row["text"])
        grads = torch.cat([g.reshape(-1) for g in torch.autograd.grad(value, params)])
        loss[row["id"]] = value.item()
        norm[row["id"]] = grads.norm().item()
        cosine[row["id"]] = (grads @ gbar / (grads.norm() * gbar.norm())).item()

    def top(scores, picked):  # every picked score at least every other one's (ties to 1e-6)
        best_rest = max(scores[i] for i in ids if i not in picked)
        return min(scores[i] for i in picked) >= best_rest - 1e-6 * abs(best_rest)

    assert top(norm, chosen["gradnorm"][0]) and top(loss, chosen["loss"][0])
    assert top(cosine, chosen["align"][0])
    assert top({i: -v for i, v in norm.items()}, chosen["gradnorm-bottom"][0])
    with torch.no_grad():
        base = sum(loss_of(t).item() for t in heldout) / len(heldout)
    assert result["base"][0] == pytest.approx(base, rel=1e-5)


def test_lm_pruning_topic_split():
    """--target-topic's texts: the group's held-out paragraphs cut alternately into the target and
    the topic's test texts, the other topics' held-out ones the general test; each paragraph's
    topic found here, from pydoc_data.topics itself, as the first topic (by name) holding it."""
    import re
    from pydoc_data import topics
    bench = benchmark_scripts.load("lm_pruning")
    paragraphs, topic_of, _ = bench.corpus()
    slices = bench.split(paragraphs, 0.3, 0.2, 0)
    parts = bench.topic_split(slices["heldout"], topic_of, "data-model")
    group = set(bench.GROUPS["data-model"])
    first = {}
    for name in sorted(topics.topics):
        for block in re.split(r"\n\s*\n", topics.topics[name]):
            first.setdefault(" ".join(block.split()), name)
    topical = [t for t in slices["heldout"] if first[t] in group]
    assert parts["target"] + parts["topic"] != [] and len(parts["target"]) - len(parts["topic"]) in (0, 1)
    assert parts["target"] == topical[::2] and parts["topic"] == topical[1::2]
    assert parts["general"] == [t for t in slices["heldout"] if first[t] not in group]
    assert not set(parts["target"] + parts["topic"]) & set(slices["pool"] + slices["pretrain"])
    assert sum(first[t] in group for t in slices["pool"]) > len(slices["pool"]) * 0.1


def test_roi_pool_quick():
    """benchmarks/roi_pool.py at a few rows: its table, and the two pools equal in float64."""
    proc = subprocess.run([sys.executable, str(BENCH / "roi_pool.py"), "--rows", "64", "--rounds", "1"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    first = proc.stdout.splitlines()[0]
    assert first.startswith("float64: largest difference")
    assert all(float(v.rstrip(",")) < 1e-10 for v in first.split()[-3::2]), first
    assert proc.stdout.count("| alcli |") == 2 and proc.stdout.count("| torchvision |") == 2


def test_structured_curves_quick(tmp_path):
    """benchmarks/structured_curves.py --quick: regression and segmentation curves, their tables
    and the default rule's inputs, in seconds."""
    for package in ("sklearn", "skimage", "vega_datasets", "scipy"):
        pytest.importorskip(package)
    out, rule = tmp_path / "sc", tmp_path / "rule.json"
    proc = subprocess.run([sys.executable, str(BENCH / "structured_curves.py"), "--quick",
                           "--epochs", "2", "--datasets", "diabetes,mosaics", "--out", str(out),
                           "--rule-json", str(rule)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    text = Path(f"{out}.txt").read_text()
    for name, methods in (("diabetes", ("mc-var", "egl+div")),
                          ("mosaics", ("entropy-max", "gradnorm+div"))):
        table = text.split(f"### {name} ", 1)[1].split("\n\n", 2)[1]
        rows = {line.split("|")[1].strip() for line in table.splitlines()[2:]}
        assert {"random", "egl", *methods} <= rows, rows
    recorded = json.loads(rule.read_text())
    assert set(recorded["inputs"]) == {"regression", "segmentation", "classification"}
    seeds = recorded["inputs"]["segmentation"]["mosaics"]["egl"]["aulc"]
    assert len(seeds) == 2 and all(0 <= s <= 100 for s in seeds)  # mean IoU in points
    assert {strategy for strategy, _ in recorded["defaults"].values()} <= {
        "egl", "entropy", "margin", "least-confidence", "gradnorm"}
    assert {aggregate for _, aggregate in recorded["defaults"].values()} <= {"mean", "max"}


def test_structured_curves_quick_tokens_and_boxes(tmp_path):
    """--quick on the constructed token task (a BiLSTM tagger) and the digit boxes (a tiny FCOS):
    their tables, scored by macro F1 and mAP@0.5 in points."""
    for package in ("sklearn", "skimage", "scipy"):
        pytest.importorskip(package)
    out = tmp_path / "sc"
    assert in_process("structured_curves", "--quick", "--epochs", "2", "--datasets", "pytokens,digit_boxes",
                      "--methods", "random,egl,entropy-max", "--out", out) == 0
    text = Path(f"{out}.txt").read_text()
    for name, metric in (("pytokens", "macro F1"), ("digit_boxes", "mAP@0.5")):
        head, table = text.split(f"### {name} ", 1)[1].split("\n\n", 2)[:2]
        assert metric in head
        rows = {line.split("|")[1].strip(): line for line in table.splitlines()[2:]}
        assert set(rows) == {"random", "egl", "entropy-max"}, rows
        assert all(0 <= float(line.split("|")[2].split("±")[0]) <= 100 for line in rows.values())
