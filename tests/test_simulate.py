"""`alcli simulate`: learning curves with a training command the test writes (a logistic regression
in torch), on a 3-class vector table; the label files, the curve rows and the selections checked
against the test's own float64 computations, and the bad inputs as one sentence."""
from __future__ import annotations

import csv
import sys
import tracemalloc

import numpy as np
import pytest
import torch
from sklearn.metrics import cohen_kappa_score
from shell import PYTHON, completed_in

TOY = """import torch.nn as nn


def Net():
    return nn.Linear(4, 3)  # logistic regression: the features b are the inputs
"""

# trains on labeled.csv only; keeps a copy of each checkpoint and its own test accuracy (float64)
TRAIN = """import csv, shutil, sys
import torch
from toy import Net

labeled, out, keep = sys.argv[1:4]
pool = torch.load("pool.pt")
test = torch.load("test.pt")
index = {i: n for n, i in enumerate(pool["ids"])}
rows = list(csv.DictReader(open(labeled)))
x = pool["x"][[index[r["id"]] for r in rows]]
y = torch.tensor([int(r["label"]) for r in rows])
torch.manual_seed(0)
net = Net()
opt = torch.optim.SGD(net.parameters(), lr=0.5)
for _ in range(30):
    opt.zero_grad()
    torch.nn.functional.cross_entropy(net(x), y).backward()
    opt.step()
torch.save(net.state_dict(), out)
shutil.copy(out, keep + ".pt")
w, b = net.weight.detach().double(), net.bias.detach().double()
acc = ((test["x"].double() @ w.T + b).argmax(1) == test["y"]).double().mean().item()
open(keep + ".acc", "w").write(repr(acc))
"""


def toy_table(n, seed):
    """3 classes of 4-d vectors around separated centers, some overlap."""
    g = torch.Generator().manual_seed(seed)
    y = torch.arange(n) % 3
    centers = torch.tensor([[2.0, 0, 0, 0], [0, 2.0, 0, 0], [0, 0, 2.0, 0]])
    return {"x": centers[y] + 1.2 * torch.randn(n, 4, generator=g), "y": y,
            "ids": [f"r{i:02d}" for i in range(n)]}


@pytest.fixture()
def folder(tmp_path):
    torch.save(toy_table(60, 0), tmp_path / "pool.pt")
    torch.save(toy_table(30, 1), tmp_path / "test.pt")
    (tmp_path / "toy.py").write_text(TOY)
    (tmp_path / "train.py").write_text(TRAIN)
    return tmp_path


def alcli(*args, cwd):
    return completed_in(cwd, *args)  # in this process: the rounds' training runs are the processes


TRAIN_CMD = PYTHON + " train.py {labeled} {model} {workdir}/keep-{strategy}-{seed}-{round}"


def read(path):
    with open(path) as f:
        return list(csv.DictReader(f))


def test_simulate_curves_labels_and_picks(folder):
    """Real training: the label files, the accuracy against the script's own, margin's picks by
    hand. (Starts shared by the strategies, random's picks: the split-by-seed test.)"""
    out = alcli("simulate", "pool.pt", "--eval", "test.pt", "--arch", "toy:Net", "--trust-checkpoint", "--train",
                TRAIN_CMD, "--init", 6, "-n", 5, "--rounds", 1, "--strategies", "margin",
                "--seeds", 1, "-o", "curves.csv", "--workdir", "runs", cwd=folder)
    assert out.returncode == 0, out.stderr
    pool = torch.load(folder / "pool.pt")
    truth = dict(zip(pool["ids"], pool["y"].tolist()))
    curves = read(folder / "curves.csv")
    assert [(r["strategy"], r["round"], r["labels"]) for r in curves] == \
        [("margin", str(r), str(6 + 5 * r)) for r in range(2)]
    for r in curves:  # alcli's accuracy = the training script's own float64 accuracy
        acc = float((folder / f"runs/keep-{r['strategy']}-0-{r['round']}.acc").read_text())
        assert float(r["accuracy"]) == pytest.approx(acc, abs=1e-6)
    labeled = [read(folder / f"runs/margin/seed0/round{r}/labeled.csv") for r in range(2)]
    for rows in labeled:  # only labeled ids, each with its true label
        assert all(int(row["label"]) == truth[row["id"]] for row in rows)
    before, now = ([row["id"] for row in rows] for rows in labeled)
    assert len(before) == 6 and now[:6] == before and len(now) == 11
    # margin's picks: the 5 smallest margins p1 - p2 among the unlabeled (float64, by hand)
    state = torch.load(folder / "runs/keep-margin-0-0.pt")
    p = torch.softmax(pool["x"].double() @ state["weight"].double().T + state["bias"].double(), 1)
    top = p.topk(2, 1).values
    gap = dict(zip(pool["ids"], (top[:, 0] - top[:, 1]).tolist()))
    want = sorted((i for i in pool["ids"] if i not in before), key=lambda i: gap[i])[:5]
    assert set(now[6:]) == set(want)
    assert "margin: AULC" in out.stderr
    # the stopping rule's record: round 1's kappa = sklearn's over the two checkpoints' float64
    # predictions on the eval pool (the stop set); one kappa is no mean of 3: no stop
    test = torch.load(folder / "test.pt")
    preds = [(test["x"].double() @ s["weight"].double().T + s["bias"].double()).argmax(1).tolist()
             for s in (torch.load(folder / f"runs/keep-margin-0-{r}.pt") for r in range(2))]
    assert curves[0]["kappa"] == "" and float(curves[1]["kappa"]) == pytest.approx(
        cohen_kappa_score(*preds) if preds[0] != preds[1] else 1.0, abs=1e-6)
    assert [r["stop"] for r in curves] == ["0", "0"]


def test_simulate_bad_input_is_one_sentence(folder):
    torch.save({"x": torch.randn(20, 4)}, folder / "nolabels.pt")
    args = ("--eval", "test.pt", "--arch", "toy:Net", "--trust-checkpoint", "--init", 4, "-n", 2, "--rounds", 1,
            "--seeds", 1, "-o", "c.csv")
    from PIL import Image
    Image.new("RGB", (32, 24)).save(folder / "a.png")
    (folder / "boxes.csv").write_text('id,path,boxes\na,a.png,"[[1, 2, 10, 12, 1]]"\n')
    cases = [(("nolabels.pt", "--train", TRAIN_CMD), "pool nolabels.pt has no labels"),
             (("boxes.csv", "--train", TRAIN_CMD),
              "the pool boxes.csv holds boxes (a `boxes` column), and simulate reveals, trains on "
              "and evaluates class labels only: detection pools are not simulated"),
             (("pool.pt", "--train", PYTHON + " -c 'import sys; sys.exit(3)' {model}"),
              "the training command exited with code 3 in round 0 (strategy margin, seed 0)"),
             (("pool.pt", "--train", "true {model}"), "the training command wrote no checkpoint"),
             (("pool.pt", "--train", TRAIN_CMD, "--strategies", "margin+kmeans"),
              "option --strategies: 'margin+kmeans' is not NAME or NAME+MODE"),
             (("pool.pt", "--train", TRAIN_CMD + " {foo}"),
              "option --train: {foo} is not a placeholder alcli fills")]
    for extra, says in cases:
        strategies = () if "--strategies" in extra else ("--strategies", "margin")
        out = alcli("simulate", *extra, *args, *strategies, cwd=folder)
        lines = out.stderr.strip().splitlines()
        assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr
        assert lines[-1].startswith("alcli: error: ") and says in lines[-1], out.stderr
        assert len([line for line in lines if "error" in line]) == 1


def test_simulate_placeholders_are_one_shell_word(folder):
    # the reproducer: -o's name reaches {workdir} (OUTPUT.runs) and {labeled}, {model}
    out = alcli("simulate", "pool.pt", "--eval", "test.pt", "--arch", "toy:Net", "--trust-checkpoint",
                "--train", TRAIN_CMD, "--init", 6, "--rounds", 0, "--strategies", "margin",
                "--seeds", 1, "-o", "c$(touch PWNED).csv", cwd=folder)
    assert out.returncode == 0, out.stderr
    assert not (folder / "PWNED").exists()
    assert (folder / "c$(touch PWNED).csv.runs" / "keep-margin-0-0.acc").is_file()


def test_train_gets_each_value_as_one_argument(folder):
    from alcli.simulate import Plan, train

    # a space, $(...), ;, a quote and a placeholder's own name inside the work folder's name
    workdir = folder / "my runs;$(touch PWNED) it's {seed}"
    echo = PYTHON + " -c \"import sys; open(sys.argv[1], 'w').write(repr(sys.argv[2:]))\" {model} {workdir} {strategy}"
    plan = Plan("pool.pt", "test.pt", echo, ["margin"], 1, 2, 1, 0, workdir)
    model = train(plan, workdir / "r", ["a", "b"], ["a", "b"], [0, 1], None, "margin", 7, 0)
    assert model.read_text() == repr([str(workdir), "margin"])
    assert not (folder / "PWNED").exists() and not any(folder.glob("PWNED*"))


def test_failed_training_quotes_the_log_tail_reading_a_bounded_part(folder):
    from alcli.errors import RunError
    from alcli.simulate import LOG_TAIL, Plan, train

    size = 32 * LOG_TAIL  # one line of 2 MiB, its end marked, then exit code 3
    command = (PYTHON + f" -c \"import sys; sys.stdout.write('a' * {size} + 'THE-END'); "
               f"sys.exit(3)\" {{model}}")
    plan = Plan("pool.pt", "test.pt", command, ["margin"], 1, 2, 1, 0, folder / "w")
    tracemalloc.start()  # this process's allocations: the log as read, not the child's output
    try:
        with pytest.raises(RunError) as err:
            train(plan, folder / "w", ["a"], ["a"], [0], None, "margin", 0, 0)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert (folder / "w" / "train.log").stat().st_size > size
    assert peak < 8 * LOG_TAIL, peak  # the tail, a few copies of it; not the whole log
    assert "exited with code 3" in str(err.value) and str(err.value).endswith("aaaaTHE-END)")
    assert "its last line: ..." in str(err.value) and len(str(err.value)) < 400


FLAT = """import torch.nn as nn


def Net():
    return nn.Sequential(nn.Flatten(), nn.Linear(48, 2))  # 4x4 RGB images
"""

# ignores the labels: class 1 ("pos") where the mean input is above 0, class 0 ("neg") below
FIXED = """import sys
import torch
from flat import Net

net = Net()
with torch.no_grad():
    net[1].weight.copy_(torch.stack([-torch.ones(48), torch.ones(48)]) / 48)
    net[1].bias.zero_()
torch.save(net.state_dict(), sys.argv[2])
"""


def test_simulate_scores_with_the_transform_flags(tmp_path):
    """--normalize reaches each round's scoring: images of 0.4 (neg) and 0.9 (pos) are all of
    positive mean as read, so the fixed model calls all pos (accuracy 0.5); normalized around
    0.65 they fall on either side of 0 (accuracy 1)."""
    from PIL import Image
    for split, count in (("pool", 6), ("test", 4)):
        for name, value in (("neg", 102), ("pos", 230)):
            (tmp_path / split / name).mkdir(parents=True)
            for i in range(count):
                Image.new("RGB", (4, 4), (value,) * 3).save(tmp_path / split / name / f"{name}{i}.png")
    (tmp_path / "flat.py").write_text(FLAT)
    (tmp_path / "fixed.py").write_text(FIXED)
    args = ("simulate", "pool", "--eval", "test", "--labels-from-folders", "--arch", "flat:Net",
            "--trust-checkpoint", "--train", PYTHON + " fixed.py {labeled} {model}", "--init", 2, "-n", 2, "--rounds", 1,
            "--strategies", "margin", "--seeds", 1)
    accuracy = {}
    for extra in ((), ("--normalize", "0.65,0.65,0.65/0.1,0.1,0.1")):
        out = alcli(*args, *extra, "-o", f"curves{len(extra)}.csv", cwd=tmp_path)
        assert out.returncode == 0, out.stderr
        accuracy[extra] = [float(r["accuracy"]) for r in read(tmp_path / f"curves{len(extra)}.csv")]
    assert accuracy == {(): [0.5, 0.5], ("--normalize", "0.65,0.65,0.65/0.1,0.1,0.1"): [1.0, 1.0]}


def test_seeds_as_a_count_a_range_or_a_list():
    from alcli.errors import ConfigError
    from alcli.simulate import parse_seeds

    assert parse_seeds("3") == [0, 1, 2] and parse_seeds("5-7") == [5, 6, 7]
    assert parse_seeds("0,3,7") == [0, 3, 7] and parse_seeds("4") == [0, 1, 2, 3]
    for bad in ("3-1", "a", "1,1", "-2", ""):
        with pytest.raises(ConfigError, match="option --seeds"):
            parse_seeds(bad)


def test_t_p_is_student_t_two_sided():
    from alcli.simulate import t_p

    scipy_stats = pytest.importorskip("scipy.stats")
    for df in (1, 2, 3, 4, 7, 10, 29):
        for t in (0.0, 0.3, 1.0, 2.1, -2.1, 4.5):
            assert t_p(t, df) == pytest.approx(2 * scipy_stats.t.sf(abs(t), df), abs=1e-12)


# a stand-in for training, no torch import per round: one of 8 fixed checkpoints next to the pool
# it is given, picked by the checksum of labeled.csv, so a round's accuracy depends on exactly
# which examples (and labels) it has
HASH_TRAIN = ("n=$(( $(cksum < {labeled} | cut -d' ' -f1) % 8 )) && cp {pool}.nets/$n.pt {model}"
              " && echo {pool} {strategy} {seed} {round} >> runs.txt")


def test_simulate_split_by_seed_merges_resumes_and_reports(folder):
    """{pool} reaches the command (the pool lives in data/, its checkpoints beside it); one
    process over seeds 0,2 against two processes (0-0, 2-2) sharing a work folder and a third run
    of all the seeds that trains nothing; changed settings refused; the report by hand."""
    import statistics

    (folder / "data").mkdir()
    (folder / "pool.pt").rename(folder / "data" / "pool.pt")
    (folder / "data" / "pool.pt.nets").mkdir()
    pool = torch.load(folder / "data" / "pool.pt")
    torch.manual_seed(0)
    for n in range(8):  # logistic regressions on 3 + n random examples: accuracies that differ
        pick = torch.randperm(60)[:3 + n]
        net = torch.nn.Linear(4, 3)
        opt = torch.optim.SGD(net.parameters(), lr=0.5)
        for _ in range(20):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(net(pool["x"][pick]), pool["y"][pick]).backward()
            opt.step()
        torch.save(net.state_dict(), folder / "data" / "pool.pt.nets" / f"{n}.pt")
    args = ("simulate", "data/pool.pt", "--eval", "test.pt", "--arch", "toy:Net",
            "--trust-checkpoint", "--train", HASH_TRAIN, "--init", 6, "-n", 5, "--rounds", 1,
            "--strategies", "margin,random")

    def runs():
        return (folder / "runs.txt").read_text().splitlines()

    one = alcli(*args, "--seeds", "0,2", "-o", "one.csv", "--workdir", "w1", cwd=folder)
    assert one.returncode == 0, one.stderr
    assert sorted(runs()) == sorted(f"data/pool.pt {s} {seed} {r}" for s in ("margin", "random")
                                    for seed in (0, 2) for r in (0, 1))
    start = {s: read(folder / f"w1/{s}/seed0/round0/labeled.csv") for s in ("margin", "random")}
    assert start["margin"] == start["random"] and len(start["margin"]) == 6  # paired starts
    picked = {s: read(folder / f"w1/{s}/seed0/round1/labeled.csv")[6:] for s in ("margin", "random")}
    assert picked["margin"] != picked["random"]
    for seeds in ("0-0", "2-2"):
        part = alcli(*args, "--seeds", seeds, "-o", f"part{seeds}.csv", "--workdir", "w2", cwd=folder)
        assert part.returncode == 0, part.stderr
    assert len(runs()) == 16
    merged = alcli(*args, "--seeds", "0,2", "-o", "all.csv", "--workdir", "w2",
                   "--report", "report.csv", cwd=folder)
    assert merged.returncode == 0, merged.stderr
    assert len(runs()) == 16  # every round was finished: no training
    assert read(folder / "all.csv") == read(folder / "one.csv")
    assert [r["seed"] for r in read(folder / "all.csv")] == ["0"] * 4 + ["2"] * 4

    other = alcli(*args, "--seeds", "0,2", "--init", 5, "-o", "x.csv", "--workdir", "w2", cwd=folder)
    assert other.returncode == 1 and "Traceback" not in other.stderr
    assert other.stderr.strip().splitlines()[-1].startswith(
        "alcli: error: the work folder w2 holds rounds run with other settings (init: 6, now 5)")
    assert len(runs()) == 16

    # the report by hand: AULC per seed = mean accuracy over the rounds, in points
    table = read(folder / "one.csv")
    per = {s: {seed: 100 * np.mean([float(r["accuracy"]) for r in table
                                    if r["strategy"] == s and r["seed"] == seed])
               for seed in ("0", "2")} for s in ("margin", "random")}
    report = {r["strategy"]: r for r in read(folder / "report.csv")}
    assert set(report) == {"margin", "random"}
    for s, seeds in per.items():
        assert float(report[s]["aulc"]) == pytest.approx(np.mean(list(seeds.values())), abs=1e-3)
        assert float(report[s]["sd"]) == pytest.approx(statistics.stdev(seeds.values()), abs=1e-3)
        assert float(report[s]["score_s_per_round"]) > 0
        assert float(report[s]["aulc_per_score_s"]) == pytest.approx(
            float(report[s]["aulc"]) / float(report[s]["score_s_per_round"]), rel=1e-6)
    d = [per["margin"][k] - per["random"][k] for k in ("0", "2")]
    margin = report["margin"]
    assert float(margin["vs_random"]) == pytest.approx(np.mean(d), abs=1e-3)
    assert int(margin["vs_random_wins"]) == sum(v > 1e-6 for v in d)
    assert int(margin["vs_random_losses"]) == sum(v < -1e-6 for v in d)
    assert report["random"]["vs_random"] == "" and margin["vs_default"] == ""  # egl+badge not run
    assert np.std(d, ddof=1) > 1e-3  # the checkpoints differ enough for the t-test to be defined
    from scipy.stats import ttest_rel
    want = ttest_rel([per["margin"][k] for k in ("0", "2")], [per["random"][k] for k in ("0", "2")])
    assert float(margin["vs_random_p"]) == pytest.approx(want.pvalue, abs=1e-3)
    assert "margin: AULC" in merged.stderr and "(sd " in merged.stderr and "vs random" in merged.stderr
