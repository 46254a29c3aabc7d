"""`alcli review` (alcli/review.py): each task's review table against an independent float64
computation (the probabilities' formulas; a per-example loop for the gradient norm at the given
label), confident learning's flags on a case small enough to compute by hand, the Label Studio
hand-off of a review table, and bad input in one sentence."""
from __future__ import annotations

import csv
import json

import numpy as np
import pytest
import torch
from PIL import Image
from torch import nn

from alcli import api
from alcli.errors import AlcliError
from alcli.review import suggestion, thresholds
from cli_errors import assert_one_error
from shell import invoke_in  # noqa: E402

LINEAR = ["--arch", "torch.nn:Linear", "--arch-kwargs", '{"in_features": 4, "out_features": 3}']


run = invoke_in  # alcli ARGS in this process, in cwd


def read(path) -> dict:
    with open(path, newline="") as f:
        return {r["id"]: r for r in csv.DictReader(f)}


@pytest.fixture(scope="module")
def ws(tmp_path_factory):
    """A 30-row tensor pool of 3 classes, a third of them labeled with the wrong class (+1 mod 3),
    and a Linear model over it."""
    root = tmp_path_factory.mktemp("review")
    g = torch.Generator().manual_seed(0)
    true = torch.arange(30) % 3
    x = torch.randn(30, 4, generator=g) + 2.0 * torch.eye(4)[true]
    given = torch.where(torch.arange(30) % 3 == 0, (true + 1) % 3, true)
    ids = [f"r{i:02d}" for i in range(30)]
    torch.save({"x": x, "y": given, "ids": ids}, root / "pool.pt")
    torch.save({"x": x, "ids": ids}, root / "unlabeled.pt")
    torch.save({"x": x, "y": given + 1, "ids": ids}, root / "beyond.pt")
    with torch.random.fork_rng():
        torch.manual_seed(1)
        lin = nn.Linear(4, 3)
        with torch.no_grad():  # a model that mostly knows the true classes
            lin.weight.copy_(1.5 * torch.eye(3, 4) + 0.1 * torch.randn(3, 4))
        torch.save(lin.state_dict(), root / "lin.pt")
    (root / "names.txt").write_text("ant\nbee\ncow\n")
    return root, x.double(), given, ids, lin


def classification_oracle(x, y, lin):
    """float64: probs, and per example the gradient norm of CE at its label (one at a time)."""
    w, b = lin.weight.detach().double(), lin.bias.detach().double()
    p = torch.softmax(x @ w.T + b, 1)
    norms = []
    for i in range(len(x)):
        wi, bi = w.clone().requires_grad_(), b.clone().requires_grad_()
        loss = torch.nn.functional.cross_entropy((x[i] @ wi.T + bi)[None], y[i:i + 1])
        gw, gb = torch.autograd.grad(loss, (wi, bi))
        norms.append(float(torch.sqrt((gw ** 2).sum() + (gb ** 2).sum())))
    return p, norms


def cl_flags(p, y):
    """Confident learning, written out: t_k = mean p_k of the rows labeled k; a row's classes at
    or above their threshold; flagged when the most probable of them is not its label."""
    t = {k: float(p[y == k, k].mean()) for k in range(p.shape[1]) if (y == k).any()}
    flags, suggested = [], []
    for i in range(len(y)):
        above = [k for k in t if p[i, k] >= t[k]]
        best = max(above, key=lambda k: float(p[i, k])) if above else int(p[i].argmax())
        flags.append(bool(above) and best != int(y[i]))
        suggested.append(best)
    return flags, suggested


@pytest.mark.parametrize("ranking", ["margin", "gradnorm"])
def test_classification_table_against_float64(ws, ranking):
    root, x, y, ids, lin = ws
    res = run(root, "review", "pool.pt", "-m", "lin.pt", *LINEAR, "--class-names", "names.txt",
              "--rank", ranking, "-q", "-o", "r.csv")
    assert res.exit_code == 0, res.stderr
    table = read(root / "r.csv")
    p, norms = classification_oracle(x, y, lin)
    flags, suggested = cl_flags(p, y)
    names = ["ant", "bee", "cow"]
    assert len(table) == 30 and sum(flags) > 0
    for i, id_ in enumerate(ids):
        row, yi = table[id_], int(y[i])
        other = max(float(p[i, k]) for k in range(3) if k != yi)
        want = {"self_confidence": float(p[i, yi]), "margin": (float(p[i, yi]) - other + 1) / 2,
                "loss": -float(torch.log(p[i, yi])), "gradnorm": norms[i],
                "confidence": float(p[i, suggested[i]])}
        for key, value in want.items():
            assert float(row[key]) == pytest.approx(value, rel=1e-4, abs=1e-6), (id_, key)
        assert row["label"] == names[yi] and row["pred"] == names[suggested[i]], id_
        assert (row["flagged"] == "True") == flags[i], id_
        badness = 1 - want["margin"] if ranking == "margin" else norms[i]
        assert float(row["score"]) == pytest.approx(badness, rel=1e-4, abs=1e-6)
    order = sorted(table.values(), key=lambda r: int(r["rank"]))
    assert [float(r["score"]) for r in order] == sorted((float(r["score"]) for r in order),
                                                         reverse=True)
    meta = json.loads((root / "r.csv.meta.json").read_text())
    assert meta["task"] == "classification" and meta["class_names"] == names
    assert meta["flagged"] == sum(flags)


def test_confident_learning_by_hand():
    """Two classes. Rows labeled 0: p = [0.9, 0.1], [0.6, 0.4], so t_0 = 0.75; labeled 1:
    [0.2, 0.8], [0.7, 0.3], so t_1 = 0.55. Row [0.7, 0.3] labeled 1 has no class at or above
    its threshold (0.7 < 0.75, 0.3 < 0.55): not flagged, however low p_1 is."""
    units = [(0, 0, [0.9, 0.1]), (0, 0, [0.6, 0.4]), (0, 1, [0.2, 0.8]), (0, 1, [0.7, 0.3])]
    t = thresholds(units)
    assert t == pytest.approx({(0, 0): 0.75, (0, 1): 0.55})
    assert [suggestion(*u, t) for u in units] == [(0, False), (0, False), (1, False), (0, False)]
    # a row labeled 1 with p = [0.76, 0.24] joins: t_1 = (0.8 + 0.3 + 0.24) / 3 = 0.4467; its
    # p_0 = 0.76 >= t_0 = 0.75 and p_1 < t_1: flagged, suggested 0. Row [0.7, 0.3] stays below.
    units.append((0, 1, [0.76, 0.24]))
    t = thresholds(units)
    assert t[(0, 1)] == pytest.approx((0.8 + 0.3 + 0.24) / 3)
    assert suggestion(*units[-1], t) == (0, True)
    assert suggestion(*units[3], t) == (0, False)
    # both classes above their thresholds: the more probable one counts, here the given one
    assert suggestion(0, 0, [0.76, 0.24], {(0, 0): 0.5, (0, 1): 0.2}) == (0, False)
    assert suggestion(0, 1, [0.76, 0.24], {(0, 0): 0.5, (0, 1): 0.2}) == (0, True)
    # a group is its own problem (multilabel: one per label)
    assert thresholds([(0, 1, [0.2, 0.8]), (1, 1, [0.6, 0.4])]) == {(0, 1): 0.8, (1, 1): 0.4}


def binary_pick(given, p, t, j):
    """(suggested value, flagged) of label j: the likelier of the values at or above t, flagged
    when not the given one; else the likelier value."""
    above = [k for k in (0, 1) if p[k] >= t[(j, k)]]
    if not above:
        return int(p[1] > p[0]), False
    best = max(above, key=lambda k: (p[k], k == given))
    return best, best != given


def test_multilabel_table_per_label(tmp_path):
    """Per label j a binary decision: self-confidence p(given y_j), flagged per label; a row's
    columns are its worst label's; gradnorm of the BCE summed over labels, float64 per example."""
    rng = np.random.default_rng(0)
    imgs = rng.integers(0, 256, (12, 3, 3), dtype=np.uint8)
    labels = [sorted({i % 3, (i // 3) % 3}) for i in range(12)]
    with open(tmp_path / "m.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["id", "path", "label"])
        for i in range(12):
            Image.fromarray(imgs[i], "L").save(tmp_path / f"{i}.png")
            w.writerow([f"e{i}", f"{i}.png", "|".join(map(str, labels[i]))])
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(9, 3)).eval()
    settings = api.settings_for(pool=str(tmp_path / "m.csv"), task="multilabel",
                                transform={"grayscale": True},
                                batch_size=5)
    reviewed, run_ = api.review_to_table(settings, str(tmp_path / "r.csv"), "self-confidence",
                                         model=model)
    table = read(tmp_path / "r.csv")
    x = torch.tensor(imgs, dtype=torch.float64).reshape(12, 9) / 255.0
    w, b = model[1].weight.detach().double(), model[1].bias.detach().double()
    p = torch.sigmoid(x @ w.T + b)                                              # [N, C]
    y = torch.tensor([[float(c in labels[i]) for c in range(3)] for i in range(12)], dtype=torch.float64)
    q = torch.where(y == 1, p, 1 - p)                                           # p(given) per label
    t = {(j, v): float(torch.where(y[:, j] == 1, p[:, j], 1 - p[:, j])[y[:, j] == v].mean())
         for j in range(3) for v in (0, 1)}
    for i in range(12):
        wi, bi = w.clone().requires_grad_(), b.clone().requires_grad_()
        bce = torch.nn.functional.binary_cross_entropy_with_logits(x[i] @ wi.T + bi, y[i],
                                                                   reduction="sum")
        gw, gb = torch.autograd.grad(bce, (wi, bi))
        row = table[f"e{i}"]
        assert float(row["gradnorm"]) == pytest.approx(
            float(torch.sqrt((gw ** 2).sum() + (gb ** 2).sum())), rel=1e-4)
        assert float(row["self_confidence"]) == pytest.approx(float(q[i].min()), rel=1e-5)
        assert float(row["margin"]) == pytest.approx(float(q[i].min()), rel=1e-5)  # binary: the same
        assert float(row["score"]) == pytest.approx(1 - float(q[i].min()), rel=1e-5)
        assert float(row["loss"]) == pytest.approx(-float(torch.log(q[i]).sum()), rel=1e-5)
        picks = [binary_pick(int(y[i, j]), [1 - float(p[i, j]), float(p[i, j])], t, j)
                 for j in range(3)]
        assert (row["flagged"] == "True") == any(f for _, f in picks), i
        assert row["pred"] == "|".join(str(j) for j, (k, _) in enumerate(picks) if k == 1), i
        assert row["label"] == "|".join(map(str, labels[i]))
    assert reviewed.flagged == sum(r["flagged"] == "True" for r in table.values()) > 0
    # the hand-off: the given set to verify, the suggested set as the prediction
    (tmp_path / "names.txt").write_text("ant\nbee\ncow\n")
    res = run(tmp_path, "select", "r.csv", "-n", "12", "-f", "labelstudio", "--class-names",
              "names.txt", "-q", "-o", "t.json")
    assert res.exit_code == 0, res.stderr
    named = lambda cell: sorted("ant bee cow".split()[int(j)] for j in cell.split("|") if j not in ("[]", ""))
    for task in json.loads((tmp_path / "t.json").read_text()):
        row = table[task["data"]["alcli_id"]]
        chosen = lambda regions: sorted(c for r in regions for c in r["value"]["choices"])
        assert chosen(task["annotations"][0]["result"]) == named(row["label"])
        assert chosen(task["predictions"][0]["result"]) == named(row["pred"])


def test_review_table_goes_to_label_studio_with_the_given_label_to_verify(ws):
    root, x, y, ids, lin = ws
    assert run(root, "review", "pool.pt", "-m", "lin.pt", *LINEAR, "--class-names", "names.txt",
               "-q", "-o", "h.csv").exit_code == 0
    top = min(read(root / "h.csv").values(), key=lambda r: int(r["rank"]))
    res = run(root, "select", "h.csv", "-n", "2", "-f", "labelstudio", "-q", "-o", "t.json")
    assert res.exit_code == 0, res.stderr
    tasks = json.loads((root / "t.json").read_text())
    assert len(tasks) == 2 and tasks[0]["data"]["alcli_id"] == top["id"]
    choice = lambda regions: [r["value"]["choices"] for r in regions]
    assert choice(tasks[0]["annotations"][0]["result"]) == [[top["label"]]]
    assert choice(tasks[0]["predictions"][0]["result"]) == [[top["pred"]]]
    assert top["label"] != top["pred"]  # the most likely wrong label: the model suggests another
    # a score table of the same labeled pool stays a plain batch: no annotations
    assert run(root, "score", "pool.pt", "-m", "lin.pt", *LINEAR, "--class-names", "names.txt",
               "-s", "loss", "-q", "-o", "s.csv").exit_code == 0
    run(root, "select", "s.csv", "-n", "2", "-f", "labelstudio", "-q", "-o", "u.json")
    assert all("annotations" not in t for t in json.loads((root / "u.json").read_text()))


def test_rows_without_a_label_are_left_out_and_counted(ws):
    root, x, y, ids, lin = ws
    part = y.clone()
    part[[3, 7]] = -1  # unknown
    torch.save({"x": x.float(), "y": part, "ids": ids}, root / "part.pt")
    res = run(root, "review", "part.pt", "-m", "lin.pt", *LINEAR, "-o", "p.csv")
    assert res.exit_code == 0, res.stderr
    table = read(root / "p.csv")
    assert len(table) == 28 and "r03" not in table and "r07" not in table
    assert "left out 2 examples without a label" in res.stderr
    assert json.loads((root / "p.csv.meta.json").read_text())["unlabeled"] == 2


def test_the_command_offers_the_rankings_review_has():
    from alcli import review
    from alcli.commands import review as command
    assert command.RANKINGS[0] == review.DEFAULT_RANKING  # the command's default
    assert set(command.RANKINGS) == set(review.RANKINGS)


def test_bad_input_is_one_sentence(ws, tmp_path):
    root = ws[0]
    res = run(root, "review", "unlabeled.pt", "-m", "lin.pt", *LINEAR, "-q", "-o", "x.csv")
    assert_one_error(res, "has no labels", "unlabeled pool")
    res = run(root, "review", "beyond.pt", "-m", "lin.pt", *LINEAR, "-q", "-o", "x.csv")
    assert_one_error(res, "but the model has 3 classes", "a label the model does not have")
    (tmp_path / "m.csv").write_text("id,path,label\na,a.png,ant\nb,b.png,wolf\n")
    for name in ("a", "b"):
        Image.fromarray(np.zeros((2, 2), np.uint8), "L").save(tmp_path / f"{name}.png")
    res = run(tmp_path, "review", "m.csv", "-m", root / "lin.pt", *LINEAR, "--grayscale",
              "--class-names", root / "names.txt", "-q", "-o", "x.csv")
    assert_one_error(res, "label 'wolf' is not one of the 3 class names", "a label name")
    res = run(root, "review", "pool.pt", "-m", "lin.pt", *LINEAR, "--rank", "entropy", "-q")
    assert_one_error(res, "--rank entropy", "a ranking")
    assert not (root / "x.csv").exists()


def test_token_classification_per_labeled_word(tmp_path):
    """Per labeled word a decision at its first token (here its only one: [CLS] w0 w1 ... [SEP]):
    the probabilities from a float64 copy of the model; the row's gradnorm and loss (mean CE over
    the labeled words) by a float64 loop; pred_words / label_words, and the hand-off's spans."""
    pytest.importorskip("transformers")
    import hf_models
    import task_models as tm
    from transformers import AutoModelForTokenClassification
    model = tm.bert_tokens()
    model.resize_token_embeddings(len(hf_models.VOCAB))
    model.save_pretrained(tmp_path / "ner")
    hf_models.tokenizer(tmp_path / "ner").save_pretrained(tmp_path / "ner")
    words = hf_models.WORDS
    texts = [" ".join(words[(i * 7 + k * 3) % len(words)] for k in range(2 + i % 4)) for i in range(8)]
    label_of = lambda i, n: [(i + k) % tm.CLASSES for k in range(n)] if i != 5 else None
    with open(tmp_path / "ner.jsonl", "w") as f:
        for i, text in enumerate(texts):
            label = label_of(i, len(text.split()))
            f.write(json.dumps({"id": f"t{i}", "text": text,
                                **({"label": label} if label else {})}) + "\n")
    (tmp_path / "tags.txt").write_text("O\nPER\nLOC\n")
    res = run(tmp_path, "review", "ner.jsonl", "--model", "ner", "--class-names", "tags.txt",
              "-b", "3", "-o", "r.csv")
    assert res.exit_code == 0, res.stderr
    assert "left out 1 example without a label" in res.stderr
    table = read(tmp_path / "r.csv")
    enc = hf_models.tokenizer(tmp_path / "tok")(texts, padding="longest", return_tensors="pt")
    x = {k: enc[k] for k in ("input_ids", "token_type_ids", "attention_mask")}
    m = AutoModelForTokenClassification.from_pretrained(tmp_path / "ner").eval()
    with torch.no_grad():
        z = m.double()(**x).logits                                       # [N, T, C] float64
    labeled = [i for i in range(8) if i != 5]
    units = [(i, k, y) for i in labeled for k, y in enumerate(label_of(i, len(texts[i].split())))]
    p = {(i, k): torch.softmax(z[i, k + 1], -1) for i, k, _ in units}    # word k: token k + 1
    t = {c: float(np.mean([float(p[(i, k)][c]) for i, k, y in units if y == c]))
         for c in range(tm.CLASSES)}
    targets = torch.full(x["input_ids"].shape, tm.IGNORE)
    for i, k, y in units:
        targets[i, k + 1] = y
    model = AutoModelForTokenClassification.from_pretrained(tmp_path / "ner").eval()
    norms = tm.loop_norms(model, {k: v[labeled] for k, v in x.items()}, "token-classification",
                          targets[labeled])
    names = ["O", "PER", "LOC"]
    for n, i in enumerate(labeled):
        row, given = table[f"t{i}"], label_of(i, len(texts[i].split()))
        q = [p[(i, k)] for k in range(len(given))]
        conf = [float(q[k][y]) for k, y in enumerate(given)]
        picks = []
        for k, y in enumerate(given):
            above = [c for c in range(tm.CLASSES) if float(q[k][c]) >= t[c]]
            best = max(above, key=lambda c: (float(q[k][c]), c == y)) if above else int(q[k].argmax())
            picks.append((best, bool(above) and best != y))
        assert float(row["self_confidence"]) == pytest.approx(min(conf), rel=1e-5), i
        assert float(row["score"]) == pytest.approx(1 - min(conf), rel=1e-5), i
        loss = -float(np.mean([np.log(c) for c in conf]))
        assert float(row["loss"]) == pytest.approx(loss, rel=1e-5), i
        assert float(row["gradnorm"]) == pytest.approx(float(norms[n]), rel=2e-5), i
        assert (row["flagged"] == "True") == any(f for _, f in picks), i
        assert json.loads(row["pred_words"]) == [names[c] for c, _ in picks], i
        assert json.loads(row["label_words"]) == [names[y] for y in given], i
    assert "t5" not in table and any(r["flagged"] == "True" for r in table.values())
    # the hand-off: spans of the given words to verify, of the suggested ones as the prediction
    res = run(tmp_path, "select", "r.csv", "-n", "3", "-f", "labelstudio", "--class-names",
              "tags.txt", "-q", "-o", "t.json")
    assert res.exit_code == 0, res.stderr
    for task in json.loads((tmp_path / "t.json").read_text()):
        row = table[task["data"]["alcli_id"]]
        spans = lambda regions: [(r["value"]["text"], r["value"]["labels"]) for r in regions]
        assert task["data"]["text"] == row["text"]
        assert spans(task["annotations"][0]["result"]) == spans_of(row["text"], json.loads(row["label_words"]))
        assert spans(task["predictions"][0]["result"]) == spans_of(row["text"], json.loads(row["pred_words"]))


def spans_of(text: str, tags: list) -> list:
    """Consecutive words of one tag (other than O) as one span: (its text, [tag])."""
    words, out, k = text.split(), [], 0
    while k < len(words):
        j = k
        while j + 1 < len(words) and tags[j + 1] == tags[k]:
            j += 1
        if tags[k] != "O":
            out.append((" ".join(words[k:j + 1]), [tags[k]]))
        k = j + 1
    return out


def test_regression_residuals_scaled_by_the_models_spread(tmp_path):
    """Regression: r = target - output, s = 1.4826 median |r| over the pool, z = |r| / s;
    self-confidence the normal tail erfc(z / sqrt 2), flagged beyond 3 spreads; gradnorm of the
    squared error by a float64 loop; the hand-off's numbers."""
    import math
    rng = np.random.default_rng(1)
    imgs = rng.integers(0, 256, (16, 2, 2), dtype=np.uint8)
    x = torch.tensor(imgs, dtype=torch.float64).reshape(16, 4) / 255.0
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(4, 1)).eval()
    w, b = model[1].weight.detach().double(), model[1].bias.detach().double()
    y = (x @ w.T + b)[:, 0] + torch.tensor(rng.normal(0, 0.1, 16))
    y[[2, 9]] += torch.tensor([2.0, -3.0])  # two wrong targets
    with open(tmp_path / "m.csv", "w", newline="") as f:
        out = csv.writer(f)
        out.writerow(["id", "path", "label"])
        for i in range(16):
            Image.fromarray(imgs[i], "L").save(tmp_path / f"{i}.png")
            out.writerow([f"e{i}", f"{i}.png", repr(float(y[i]))])
    settings = api.settings_for(pool=str(tmp_path / "m.csv"), task="regression",
                                transform={"grayscale": True}, batch_size=6)
    api.review_to_table(settings, str(tmp_path / "r.csv"), "self-confidence", model=model)
    table = read(tmp_path / "r.csv")
    f = (x @ w.T + b)[:, 0]
    r = (y - f).numpy()
    z = np.abs(r) / (1.4826 * np.median(np.abs(r)))
    for i in range(16):
        row = table[f"e{i}"]
        tail = math.erfc(z[i] / math.sqrt(2))
        assert float(row["residual_z"]) == pytest.approx(z[i], rel=1e-5), i
        assert float(row["self_confidence"]) == pytest.approx(tail, rel=1e-4, abs=1e-12), i
        assert (row["flagged"] == "True") == (z[i] > 3), i
        assert float(row["pred"]) == pytest.approx(float(f[i]), rel=1e-5, abs=1e-7)
        assert float(row["loss"]) == pytest.approx(r[i] ** 2, rel=1e-5)
        wi, bi = w.clone().requires_grad_(), b.clone().requires_grad_()
        gw, gb = torch.autograd.grad(((x[i] @ wi.T + bi)[0] - y[i]) ** 2, (wi, bi))
        norm = float(torch.sqrt((gw ** 2).sum() + (gb ** 2).sum()))
        assert float(row["gradnorm"]) == pytest.approx(norm, rel=1e-4), i
    order = sorted(table.values(), key=lambda row: int(row["rank"]))
    assert {order[0]["id"], order[1]["id"]} == {"e2", "e9"}
    assert order[0]["flagged"] == order[1]["flagged"] == "True"
    res = run(tmp_path, "select", "r.csv", "-n", "2", "-f", "labelstudio", "-q", "-o", "t.json")
    assert res.exit_code == 0, res.stderr
    for task in json.loads((tmp_path / "t.json").read_text()):
        row = table[task["data"]["alcli_id"]]
        number = lambda regions: [reg["value"]["number"] for reg in regions]
        assert number(task["annotations"][0]["result"]) == pytest.approx([float(row["label"])])
        assert number(task["predictions"][0]["result"]) == pytest.approx([float(row["pred"])])


def test_a_task_not_reviewed_is_one_sentence(tmp_path):
    for i in range(2):
        Image.fromarray(np.zeros((2, 2), np.uint8), "L").save(tmp_path / f"{i}.png")
    torch.manual_seed(0)
    settings = api.settings_for(pool=str(tmp_path), task="segmentation", transform={"grayscale": True})
    with pytest.raises(AlcliError, match=r"^alcli review reviews the labels of classification, "
                       r"multilabel, token-classification, regression models, and this is a "
                       r"segmentation model$"):
        api.review_to_table(settings, str(tmp_path / "r.csv"), "self-confidence",
                            model=nn.Conv2d(1, 3, 1).eval())
    assert not (tmp_path / "r.csv").exists()
