"""One door for outputs (alcli/files/outputs.py): every path option of every command, read from
the Typer app itself, is pointed at a file the command reads (its victim). The victim must come
out byte for byte the same and still a regular file, with no traceback; an option that writes
must also be refused: exit 1, one `alcli: error:` sentence from the door (naming the victim and
asking for another output), not from some other check that happens to run first.

The options: `typer.main.get_command(app).commands` gives each command's click parameters, each
classified by its metavar: PATH_METAVARS name files or folders, NOT_PATHS name values that are
no paths (a flag has none). An option whose metavar is in neither fails
test_every_option_is_classified, so a new path option cannot hide behind a new metavar, and a
command missing from BASE (its smallest working invocation and its victim) fails
test_every_command_has_an_invocation. Each path option then gets its own case in
test_no_path_option_replaces_an_input, with no list to update.

Which options are outputs is found, not listed: an option is an output when the command, run
with it at a fresh path, makes that path (a file or a folder). The finding is checked against
OUTPUTS both ways: an option that writes and is not listed (a new output) fails, and so does a
listed one that no longer writes (its base invocation gone stale: the door check would then pass
without being tried). test_each_base_invocation_runs shows the bases still get as far as reading
their victims. An option that wants a name of its kind (PNG, XML) gets a victim of that name (a
config file, conf.png), so that a check of the suffix cannot stand in for the door.

Outputs that no option names (pull's masks folder, COCO file and default skipped file; a table's
sidecars and lock; simulate's default work folder) are pointed at an input through the option
they derive from (test_derived_outputs_spare_the_inputs).

Everything runs in this process (Typer's CliRunner), in a fresh copy of a small folder per case:
a tensor pool and torch.nn:Linear for score, merge, select, simulate (whose training command
copies a checkpoint) and inspect, and the fake Label Studio of tests/fake_label_studio.py for push
and pull (push reads its table, then the server refuses the import).
"""
from __future__ import annotations

import os
import re
import shutil
import stat
from pathlib import Path

import numpy as np
import pytest
import torch
import typer.main
from PIL import Image
from typer.testing import CliRunner

from alcli.cli import app
from alcli.files.table import SIDECARS
from fake_label_studio import serve

PATH_METAVARS = {"FILE", "DIR", "PNG", "XML", "POOL", "SCORES", "PART"}
NOT_PATHS = {None, "N", "NAME", "URL", "TOKEN", "TITLE|ID", "SPEC", "JSON", "TASK", "FORMAT",
             "COMMAND", "LIST", "SEEDS", "MODE", "M", "B", "K", "P", "T", "PATTERN", "DEVICE",
             "SECONDS", "S|pseudo", "mean|max|top:Q", "N|HxW", "MEAN/STD", "fp32|bf16|fp16",
             "cpu|gpu", "N|TIME", "K/N", "text|json", "badge|cluster-margin", "top|power|softmax",
             "TOTAL"}

SUFFIXED = {"PNG": ".png", "XML": ".xml"}  # options that want a name of their own kind
DOOR = r"(choose|give) another"  # the refusal's request, in every door's sentence

# what a fresh path of each metavar ends with: a name the option accepts as the kind it writes
FRESH_SUFFIX = {"FILE": ".csv", "PNG": ".png", "XML": ".xml", "DIR": "", "POOL": ".pt"}

LINEAR = ["--arch", "torch.nn:Linear", "--arch-kwargs", '{"in_features": 4, "out_features": 3}']
TOKEN = "tok"
URL = "{url}"  # replaced by the fake server's address

# command -> (its smallest working invocation, the victim: a file that invocation reads)
BASE = {
    "score": (["score", "pool.pt", "-m", "lin.pt", *LINEAR, "-s", "margin", "-q", "-o", "-"],
              "lin.pt"),
    "merge": (["merge", "part0.csv", "part1.csv", "-q"], "part0.csv"),
    "select": (["select", "t.csv", "-n", "2", "--class-names", "names.txt", "-q"], "t.csv"),
    "push": (["push", "t.csv", "-p", "P", "--url", URL, "--token", TOKEN,
              "--image-root", "http://x/", "-q"], "t.csv"),
    "pull": (["pull", "-p", "P", "-o", "labels.csv", "--url", URL, "--token", TOKEN,
              "--class-names", "names.txt", "-q"], "names.txt"),
    "simulate": (["simulate", "pool.pt", "--eval", "test.pt", *LINEAR,
                  "--train", "cp lin.pt {model}", "--rounds", "1", "--seeds", "1",
                  "--init", "10", "-n", "5", "--strategies", "margin", "-q"], "pool.pt"),
    "inspect": (["inspect", "-m", "lin.pt", *LINEAR], "lin.pt"),
    "review": (["review", "pool.pt", "-m", "lin.pt", *LINEAR, "-q", "-o", "-"], "lin.pt"),
    "duplicates": (["duplicates", "part0.csv", "-q"], "part0.csv"),
    "stop": (["stop", "t.csv", "t.csv", "--window", "1"], "t.csv"),  # exit 3: too few ids to stop
    "report": (["report", "t.csv", "-q"], "t.csv"),
}

# the (command, option) pairs that write the path they are given
OUTPUTS = {("score", "--output"), ("merge", "--output"), ("select", "--output"),
           ("select", "--contact-sheet"), ("duplicates", "--output"), ("select", "--labelstudio-config"),
           ("pull", "--output"), ("pull", "--skipped"), ("review", "--output"), ("simulate", "--output"),
           ("simulate", "--plot"), ("simulate", "--report"), ("simulate", "--workdir"),
           ("report", "--output")}


def commands() -> dict:
    return typer.main.get_command(app).commands


def path_options() -> list[tuple[str, str, str]]:
    """(command, its option's long name, metavar) for each option that names a path."""
    return [(name, max(p.opts, key=len), p.metavar) for name, cmd in commands().items()
            for p in cmd.params if p.param_type_name == "option" and p.metavar in PATH_METAVARS]


@pytest.fixture(scope="module")
def template(tmp_path_factory):
    """The files every invocation reads: a 24-row tensor pool and a 9-row eval pool, a Linear
    checkpoint, class names, three 8x8 PNG images and a hand-made table t.csv of them (select's
    and push's SCORES), the two shard tables of the pool (merge's PARTs), and config files named
    conf.png and conf.xml (the victims of the PNG and XML options)."""
    root = tmp_path_factory.mktemp("doors")
    g = torch.Generator().manual_seed(0)
    y = torch.arange(24) % 3
    x = torch.randn(24, 4, generator=g) + 2 * torch.eye(4)[y]
    ids = [f"r{i:02d}" for i in range(24)]
    torch.save({"x": x, "y": y, "ids": ids}, root / "pool.pt")
    torch.save({"x": x[:9], "y": y[:9], "ids": ids[:9]}, root / "test.pt")
    with torch.random.fork_rng():  # the tests after these see the generator as it was
        torch.manual_seed(0)
        torch.save(torch.nn.Linear(4, 3).state_dict(), root / "lin.pt")
    (root / "names.txt").write_text("cat\ndog\n")
    for suffix in SUFFIXED.values():
        (root / f"conf{suffix}").write_text("seed: 1\n")  # a config file named like a picture
    rng = np.random.default_rng(0)
    for name in ("a.png", "b.png", "c.png"):
        Image.fromarray(rng.integers(0, 256, (8, 8, 3), dtype=np.uint8), "RGB").save(root / name)
    (root / "t.csv").write_text("id,score,pred\na.png,0.9,cat\nb.png,0.5,dog\nc.png,0.1,cat\n")
    for k in (0, 1):
        run(root, "score", "pool.pt", "-m", "lin.pt", *LINEAR, "-s", "margin", "-q",
            "--shard", f"{k}/2", "-o", f"part{k}.csv", want=0)
    return root


@pytest.fixture
def folder(template, tmp_path):
    """A copy of the template to write into."""
    dest = tmp_path / "w"
    shutil.copytree(template, dest)
    return dest


@pytest.fixture(scope="module")
def label_studio():
    with serve("choices") as (url, _log):
        yield url


def run(cwd, *args, want=None):
    """`alcli ARGS` in this process with `cwd` as the working directory."""
    old = os.getcwd()
    os.chdir(cwd)
    try:
        result = CliRunner().invoke(app, [str(a) for a in args],
                                    env={"LABEL_STUDIO_URL": None, "LABEL_STUDIO_API_KEY": None})
    finally:
        os.chdir(old)
    if want is not None:
        assert result.exit_code == want, result.stderr + result.stdout
    return result


def base(command: str, url: str) -> tuple[list[str], str]:
    args, victim = BASE[command]
    return [url if a == URL else a for a in args], victim


def no_traceback(result, where: str) -> None:
    error = result.exception
    clean = error is None or isinstance(error, SystemExit)  # (a bare bool: no repr of `error`)
    assert clean, f"{where}: {type(error).__name__}: {str(error)[:200]}"
    assert "Traceback" not in result.stdout + result.stderr, where


def refused(result, victim: str, where: str) -> None:
    """Exit 1 and one `alcli: error:` sentence from the door (it names the input and asks for
    another output: outputs.py's and simulate's wording), not from some other check."""
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == 1, f"{where}: exit {result.exit_code}: {result.stderr}"
    assert len(lines) == 1 and lines[0].startswith("alcli: error: "), f"{where}: {result.stderr}"
    assert victim in lines[0] and re.search(DOOR, lines[0]), f"{where}: {lines[0]}"


def untouched(path: Path, before: bytes, where: str) -> None:
    """`path` still the regular file it was, byte for byte (bare bools: no byte diffs shown)."""
    there = os.path.lexists(path)
    assert there, f"{where}: {path.name} was removed"
    regular = stat.S_ISREG(os.lstat(path).st_mode)
    assert regular, f"{where}: {path.name} is no longer a regular file"
    same = path.read_bytes() == before
    assert same, f"{where}: {path.name} was rewritten"


# --- the enumeration ------------------------------------------------------------------------------

def test_every_option_is_classified():
    unknown = [(name, p.name, p.metavar) for name, cmd in commands().items() for p in cmd.params
               if p.metavar not in PATH_METAVARS | NOT_PATHS]
    assert not unknown, (f"options with a metavar this file does not know: {unknown}; add it "
                         f"to PATH_METAVARS (a path: its doors are tested) or NOT_PATHS")


def test_every_command_has_an_invocation():
    assert set(commands()) == set(BASE), "each command needs its base invocation in BASE"


def test_the_known_outputs_are_path_options():
    found = {(c, o) for c, o, _ in path_options()}
    assert OUTPUTS <= found, OUTPUTS - found


@pytest.mark.parametrize("command", sorted(BASE))
def test_each_base_invocation_runs(folder, label_studio, command):
    """Each base gets as far as reading its victim: exit 0, but push, whose import the fake
    server refuses (it answers no POST) after the table was read, and stop, whose rule says go
    on (exit 3: a table of 3 rows is no stop set)."""
    args, victim = base(command, label_studio)
    result = run(folder, *args)
    no_traceback(result, command)
    if command == "push":
        assert result.exit_code == 1 and "POST /api/projects/1/import" in result.stderr, \
            result.stderr
    elif command == "stop":
        assert result.exit_code == 3 and "go on: " in result.stdout, result.stderr + result.stdout
    else:
        assert result.exit_code == 0, result.stderr + result.stdout
    assert (folder / victim).is_file()


# --- the doors ------------------------------------------------------------------------------------

def victim_for(command: str, metavar: str, url: str) -> tuple[list[str], str]:
    """The base invocation and its victim; for an option that wants a file name of its own kind
    (a .png, a .xml), the victim is a config file of that name (given with -c), so that the
    name's suffix is not what refuses it."""
    args, victim = base(command, url)
    if metavar in SUFFIXED:
        assert "--config" in {o for p in commands()[command].params for o in p.opts}, \
            f"{command} has a {metavar} option and no --config: give it a {metavar} victim"
        victim = f"conf{SUFFIXED[metavar]}"
        args = [*args, "--config", victim]
    return args, victim


@pytest.mark.parametrize("command, option, metavar", path_options(),
                         ids=[f"{c} {o}" for c, o, _ in path_options()])
def test_no_path_option_replaces_an_input(folder, label_studio, command, option, metavar):
    args, victim = victim_for(command, metavar, label_studio)
    # an output: the option makes the fresh path it is given
    fresh = f"fresh{FRESH_SUFFIX[metavar]}"
    result = run(folder, *args, option, fresh)
    no_traceback(result, f"alcli {command} {option} {fresh}")
    writes = os.path.lexists(folder / fresh)
    if writes:
        assert (command, option) in OUTPUTS, \
            f"alcli {command} {option} writes the path it is given: add it to OUTPUTS"
    else:
        assert (command, option) not in OUTPUTS, \
            (f"alcli {command} {option} {fresh} wrote nothing (exit {result.exit_code}: "
             f"{result.stderr.strip()}); is its base invocation in BASE stale?")
    # the door: pointed at the victim, the victim is unchanged; an output is refused
    where = f"alcli {command} {option} {victim}"
    before = (folder / victim).read_bytes()
    result = run(folder, *args, option, victim)
    no_traceback(result, where)
    untouched(folder / victim, before, where)
    if writes:
        refused(result, victim, where)


# the outputs no option names, each derived from one that does, pointed at an input: (args with
# URL for the fake server's address, the victim, the file the victim is a copy of)
SIMULATE = ["simulate", "pool.pt", *LINEAR, "--train", "cp lin.pt {model}", "--rounds", "1",
            "--seeds", "1", "--init", "10", "-n", "5", "--strategies", "margin", "-q"]
PULL = ["pull", "-p", "P", "-o", "labels.csv", "--url", URL, "--token", TOKEN, "-q"]
SCORE = ["score", "pool.pt", *LINEAR, "-s", "margin", "-q", "-o", "t.csv"]
DERIVED = {
    "pull COCO file": ([*PULL, "--class-names", "labels.coco.json"], "labels.coco.json",
                       "names.txt"),
    "pull masks folder": ([*PULL, "--class-names", "labels_masks/names.txt"],
                          "labels_masks/names.txt", "names.txt"),
    "pull default skipped": ([*PULL, "--class-names", "labels.skipped.csv"],
                             "labels.skipped.csv", "names.txt"),
    **{f"score OUTPUT.{suffix}": ([*SCORE, "-m", f"t.csv.{suffix}"], f"t.csv.{suffix}", "lin.pt")
       for suffix in ("meta.json", "emb.npz", "errors.csv", "lock")},
    "select OUTPUT.meta.json": (["select", "t.csv", "-n", "2", "-q", "-o", "b.csv",
                                 "--class-names", "b.csv.meta.json"], "b.csv.meta.json",
                                "names.txt"),
    "merge OUTPUT.errors.csv": (["merge", "part0.csv", "out.csv.errors.csv", "-o", "out.csv",
                                 "-q"], "out.csv.errors.csv", "part1.csv"),
    "report default output": (["report", "t.csv", "--batch", "t.html", "-q"], "t.html",
                              "t.csv"),
    "simulate default workdir": ([*SIMULATE, "--eval", "c.csv.runs/margin/test.pt", "-o",
                                  "c.csv"], "c.csv.runs/margin/test.pt", "test.pt"),
}


@pytest.mark.parametrize("case", sorted(DERIVED))
def test_derived_outputs_spare_the_inputs(folder, label_studio, case):
    """A file written beside an output (a sidecar, a COCO file, a masks or work folder) is an
    output too: an input where it would go is refused, not replaced or removed. The victim is a
    working copy of what the command reads there (with the copy's sidecars: a merge part)."""
    args, victim, source = DERIVED[case]
    args = [label_studio if a == URL else a for a in args]
    (folder / victim).parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(folder / source, folder / victim)
    for suffix in SIDECARS:
        if (folder / f"{source}.{suffix}").exists():
            shutil.copy(folder / f"{source}.{suffix}", folder / f"{victim}.{suffix}")
    before = (folder / victim).read_bytes()
    where = f"alcli {' '.join(args)} ({case})"
    result = run(folder, *args)
    no_traceback(result, where)
    untouched(folder / victim, before, where)
    refused(result, victim, where)
