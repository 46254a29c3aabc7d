"""`alcli simulate` against hostile inputs (shared/hostile-inputs-3.md R3-6, R3-13, R3-14, R3-21):
outputs that would replace an input or each other, a damaged work folder, a --plot name that is no
image format, a placeholder inside the user's own quotes. Each through the real CLI, in this process
(tests/shell.py's invoke_in: no torch import per run), on a 60-row tensor pool and a "training"
that copies a fixed nn.Linear checkpoint."""
from __future__ import annotations

import json
import os
import shutil

import pytest
import torch
from cli_errors import assert_one_error
from shell import invoke_in

ARGS = ("--eval", "eval.pt", "--arch", "torch.nn:Linear", "--arch-kwargs",
        '{"in_features":4,"out_features":3}', "--init", 10, "-n", 5, "--seeds", 1,
        "--strategies", "margin", "-q")
TRAIN = "cp lin.pt {model}"


def run(folder, *extra, train=TRAIN, rounds=1):
    return invoke_in(folder, "simulate", "pool.pt", *ARGS, "--rounds", rounds, "--train", train,
                     *extra)


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """pool.pt (60 rows, 3 classes), eval.pt, lin.pt and a finished 2-round run in base.csv.runs."""
    root = tmp_path_factory.mktemp("hostile-simulate")
    torch.manual_seed(0)
    x, y = torch.randn(60, 4), torch.randint(0, 3, (60,))
    torch.save({"x": x, "y": y}, root / "pool.pt")
    torch.save({"x": x[:20], "y": y[:20]}, root / "eval.pt")
    torch.save(torch.nn.Linear(4, 3).state_dict(), root / "lin.pt")
    result = run(root, "-o", "base.csv", rounds=2)
    assert result.exit_code == 0, result.stderr
    return root


@pytest.fixture()
def folder(base, tmp_path):
    for name in ("pool.pt", "eval.pt", "lin.pt", "base.csv"):
        shutil.copy(base / name, tmp_path / name)
    shutil.copytree(base / "base.csv.runs", tmp_path / "base.csv.runs")
    return tmp_path


def contents(folder):
    return {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}


# R3-6: -o, --report, --plot and --workdir never replace POOL, --eval, the config file nor another
# output; refused before the first round
@pytest.mark.parametrize("extra, culprit", [
    (("-o", "pool.pt"), "option --output pool.pt is also the pool"),
    (("-o", "c.csv", "--report", "eval.pt"), "option --report eval.pt is also the eval pool"),
    (("-o", "c.csv", "--report", "c.csv"), "option --report c.csv is also the curves CSV"),
    (("-o", "c.png", "--plot", "c.png"), "option --plot c.png is also the curves CSV"),
    (("-c", "conf.yaml", "-o", "c.csv", "--report", "conf.yaml"),
     "option --report conf.yaml is also the config file"),
    (("-o", "eval.pt.meta.json"), "option --output eval.pt.meta.json is eval.pt.meta.json"),
    (("-o", "c.csv", "--workdir", "eval.pt"), "option --workdir eval.pt is also the eval pool"),
])
def test_outputs_never_replace_inputs(folder, extra, culprit):
    (folder / "conf.yaml").write_text("batch_size: 8\n")
    before = contents(folder)
    result = run(folder, *extra)
    assert_one_error(result, culprit, extra)
    assert contents(folder) == before  # nothing written: no round ran
    assert not (folder / "c.csv.runs").exists() and not (folder / "pool.pt.runs").exists()


def test_an_input_inside_the_run_folders_is_refused(folder):
    """--workdir . would write ./plan.json and ./margin/seed0/round0/labeled.csv, the eval pool."""
    (folder / "margin/seed0/round0").mkdir(parents=True)
    shutil.copy(folder / "eval.pt", folder / "margin/seed0/round0/labeled.csv")
    before = (folder / "margin/seed0/round0/labeled.csv").read_bytes()
    result = invoke_in(folder, "simulate", "pool.pt", *ARGS, "--rounds", 1, "--train", TRAIN,
                       "--eval", "margin/seed0/round0/labeled.csv", "-o", "c.csv",
                       "--workdir", ".")
    assert_one_error(result, "option --workdir . would write", "run folders")
    assert (folder / "margin/seed0/round0/labeled.csv").read_bytes() == before
    assert not (folder / "plan.json").exists()


# R3-13: a damaged work folder: the damaged round is rerun with a warning naming its file, and the
# curves come out as the undamaged run's; a damaged plan.json is one sentence naming it
def _truncate(path):
    path.write_bytes(path.read_bytes()[:10])


def _link_outside(path):
    (path.parents[4] / "secret.txt").write_text("root:x:0:0:root:/root:/bin/bash\n")
    path.unlink()
    path.symlink_to(path.parents[4] / "secret.txt")


def _unknown_id(path):
    record = json.loads(path.read_text())
    path.write_text(json.dumps({**record, "picked": ["nope"] + record["picked"][1:]}))


def _no_id_column(path):
    path.write_text("x,y\n1,2\n")


@pytest.mark.parametrize("name, damage", [
    ("round1/done.json", _truncate),
    ("round1/done.json", lambda p: p.write_text("[1, 2]")),
    ("round1/done.json", lambda p: p.write_text('{"labels": 15, "accuracy": "high"}')),
    ("round1/done.json", _link_outside),
    ("round0/done.json", _unknown_id),
    ("round1/labeled.csv", _no_id_column),
    ("round1/labeled.csv", lambda p: p.write_bytes(b"\xff\xfe\x00id\n")),
])
def test_a_damaged_round_is_rerun_with_a_warning(base, folder, name, damage):
    path = folder / "base.csv.runs/margin/seed0" / name
    damage(path)
    secret = folder / "secret.txt"
    secret_before = secret.read_bytes() if secret.exists() else None
    result = run(folder, "-o", "base.csv", rounds=2)
    assert result.exit_code == 0 and result.exception is None, result.stderr
    assert "Traceback" not in result.stderr
    warnings = [line for line in result.stderr.splitlines() if line.startswith("alcli: warning:")]
    assert len(warnings) == 1 and str(path.relative_to(folder)) in warnings[0], result.stderr
    assert "rerun" in warnings[0]
    # the round rerun: the same checkpoint, so the same accuracy and picks as the undamaged run
    assert (folder / "base.csv").read_text() == (base / "base.csv").read_text()
    done = path.parent / "done.json"
    assert not done.is_symlink() and isinstance(json.loads(done.read_text())["picked"], list)
    if secret_before is not None:
        assert secret.read_bytes() == secret_before  # the link replaced, not the file it named


@pytest.mark.parametrize("damage", [_truncate, lambda p: p.write_text("[1, 2]"), _link_outside])
def test_a_damaged_plan_is_one_sentence_naming_it(folder, damage):
    damage(folder / "base.csv.runs/plan.json")
    before = contents(folder)
    result = run(folder, "-o", "base.csv", rounds=2)
    assert_one_error(result, os.path.join("base.csv.runs", "plan.json"), "plan.json")
    assert contents(folder) == before


# R3-14: a --plot name matplotlib cannot write, refused before the first round
@pytest.mark.parametrize("name", ["out.pt", "curves.csv", "-"])
def test_plot_format_is_checked_first(folder, name):
    before = contents(folder)
    result = run(folder, "-o", "c.csv", "--plot", name)
    assert_one_error(result, f"option --plot {name}", name)
    assert contents(folder) == before and not (folder / "c.csv.runs").exists()


# R3-21: a placeholder inside the user's own quotes is refused (its value would be quoted twice)
@pytest.mark.parametrize("train", ['cp lin.pt "{model}"', "cp lin.pt '{model}'",
                                   'cp lin.pt "dir/{model}"', "cp lin.pt \\{model}",
                                   'sh -c "cp lin.pt {model}"'])
def test_a_quoted_placeholder_is_refused(folder, train):
    before = contents(folder)
    result = run(folder, "-o", "d$(touch PWNED2).csv", train=train)
    assert_one_error(result, "option --train", train)
    assert "{model}" in result.stderr and "quot" in result.stderr
    assert not (folder / "PWNED2").exists() and contents(folder) == before


def test_placeholders_outside_quotes_are_accepted():
    from alcli.simulate import check_train

    for command in ('./t.sh --n "$(wc -l < {labeled})" --out={model}',
                    "./t.sh '--flag' {labeled} \"$HOME\" {model} # '{model}' in a comment",
                    'echo "`cat {labeled}`" ${model} "${seed}" && cp a {workdir}/x'):
        check_train(command)


def test_the_shells_braced_variables_are_left_alone(tmp_path):
    """${workdir} is the shell's variable (unset here), not {workdir} after a $."""
    from alcli.simulate import Plan, train

    command = 'echo "[${workdir}]" > seen.txt && touch {model}'
    plan = Plan("pool.pt", "test.pt", command, ["margin"], [3], 2, 1, 0, tmp_path / "w")
    old = os.getcwd()
    os.chdir(tmp_path)
    try:
        env = os.environ.pop("workdir", None)
        train(plan, tmp_path / "w" / "r", ["a"], ["a"], [0], None, "margin", 3, 0)
    finally:
        os.chdir(old)
        if env is not None:
            os.environ["workdir"] = env
    assert (tmp_path / "seen.txt").read_text() == "[]\n"
