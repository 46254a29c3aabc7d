"""Round after round (issue 17, last bullet): `score --exclude` skips what is labeled before
scoring (with --resume, --shard and merge, and `select --exclude` after it), `-o` makes its
folders, warnings not from alcli name their origin, the API's `exclude=` takes ids and
`exclude_files=` files, a pretrained-style model without normalisation gets a warning, and
transforms can be given as flags. All through the real CLI on small real files."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from typer.testing import CliRunner

import alcli
from alcli.cli import app
from alcli.errors import AlcliError
from alcli.files.embeddings import load_embeddings
from alcli.terminal import Reporter
from cli_errors import assert_one_error
from conftest import parse_csv

runner = CliRunner()


pytestmark = pytest.mark.usefixtures("one_thread")  # tables compared byte for byte


def cli(*args, ok=True, input=None):
    result = runner.invoke(app, [str(a) for a in args], input=input)
    if ok:
        assert result.exit_code == 0, result.stderr + result.stdout
    return result


def score(ws, *args, ok=True):
    """`alcli score ... -m model.pt -c config.yaml -b 1`: one example per batch, so that runs
    over different subsets of the pool give the very same numbers."""
    return cli("score", *args, "-m", "model.pt", "-c", ws.config, "-b", "1", ok=ok)


def rows_of(path) -> list[dict]:
    return parse_csv(Path(path).read_text())


def without_rank(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if k != "rank"} for r in rows]


# the examples the exclusion files below name: by id (csv), by file (txt), and one unknown entry
BY_ID = ["a/img00.png", "b/img04.png"]
BY_FILE = "c/img05.jpg"


def exclusion_files(pool: Path, folder: Path) -> list[Path]:
    labeled = folder / "labeled.csv"
    labeled.write_text("id,label\n" + "".join(f"{i},0\n" for i in BY_ID) + "nosuch.png,1\n")
    queued = folder / "queued.txt"
    queued.write_text(f"{pool / BY_FILE}\n")
    return [labeled, queued]


def excludes(files: list[Path]) -> list[str]:
    return [arg for f in files for arg in ("--exclude", str(f))]


# --- score --exclude ------------------------------------------------------------------------------

def test_score_exclude_scores_exactly_the_other_rows_with_the_full_runs_scores(in_ws, tmp_path):
    full, part = tmp_path / "full.csv", tmp_path / "part.csv"
    score(in_ws, "pool", "-o", full, "-q")
    files = exclusion_files(in_ws.pool, tmp_path)
    result = score(in_ws, "pool", *excludes(files), "-o", part)
    left_out = {*BY_ID, BY_FILE}
    expected = [r for r in rows_of(full) if r["id"] not in left_out]
    assert len(expected) == len(in_ws.images) - 3
    assert without_rank(rows_of(part)) == without_rank(expected)  # same rows, scores, order
    assert [r["rank"] for r in rows_of(part)] == [str(n) for n in range(1, len(expected) + 1)]
    err = result.stderr
    assert ("alcli: warning: 1 of the 3 entries of exclusions file "
            f"{files[0]} name no pool example (the first is 'nosuch.png')") in err
    assert "3 excluded by --exclude (not scored)" in err
    assert "(3 examples left out by --exclude)" in err
    meta = json.loads(Path(f"{part}.meta.json").read_text())
    assert sorted(e["id"] for e in meta["excluded"]) == sorted(left_out)
    assert meta["run"]["excluded"].startswith("3:") and meta["rows"] == len(expected)

    # the same table on stdout, and in JSON lines the summary counts them
    piped = score(in_ws, "pool", *excludes(files), "--log-format", "json")
    rows = parse_csv(piped.stdout)  # no embeddings recorded: logits of the engine's forward
    assert [r["id"] for r in rows] == [r["id"] for r in expected]
    assert [float(r["score"]) for r in rows] == pytest.approx([float(r["score"]) for r in expected],
                                                              rel=1e-5)
    summary = [json.loads(line) for line in piped.stderr.splitlines()
               if json.loads(line)["event"] == "summary"]
    assert summary[0]["excluded"] == 3 and summary[0]["examples"] == len(expected)


def test_excluded_examples_are_never_opened(in_ws, tmp_path):
    """An excluded file that cannot be decoded is neither skipped nor listed: it was not read."""
    pool = tmp_path / "pool"
    shutil.copytree(in_ws.pool, pool)
    (pool / "a" / "broken.png").write_bytes(b"\x89PNG no image here")
    (tmp_path / "labeled.txt").write_text("a/broken.png\n")
    out = tmp_path / "t.csv"
    result = score(in_ws, pool, "--exclude", tmp_path / "labeled.txt", "-o", out, "-q")
    assert result.stderr == ""
    assert not Path(f"{out}.errors.csv").exists()
    assert len(rows_of(out)) == len(in_ws.images)
    without = score(in_ws, pool, "-o", tmp_path / "u.csv", "-q")  # scored, it is skipped
    assert "skipped 1 unreadable example" in without.stderr


def test_exclusions_that_match_nothing_or_everything_are_one_sentence(in_ws, tmp_path):
    (tmp_path / "typo.txt").write_text("a/img00.jpeg\nb/nope.png\n")
    (tmp_path / "all.txt").write_text("".join(f"{i}\n" for i in in_ws.images))
    out = tmp_path / "t.csv"
    for name, culprits in (("typo.txt", ["none of the 2 entries", "typo.txt", "a/img00.jpeg"]),
                           ("all.txt", ["excludes every one of the 14 examples", "--exclude"]),
                           ("missing.txt", ["missing.txt", "cannot read"])):
        result = score(in_ws, "pool", "--exclude", tmp_path / name, "-o", out, ok=False)
        for culprit in culprits:
            assert_one_error(result, culprit, f"{name}: {result.stderr!r}")
        assert not out.exists() and not Path(f"{out}.partial").exists()


def test_score_exclude_resumes_only_with_the_same_exclusions(in_ws, tmp_path):
    """A run stopped by an unreadable example (--strict) leaves its finished rows; resuming takes
    them over when the exclusions are the same, and refuses other exclusions in one sentence."""
    pool = tmp_path / "pool"
    shutil.copytree(in_ws.pool, pool)
    last = pool / "c" / "zz.png"
    last.write_bytes(b"not yet an image")
    files = exclusion_files(pool, tmp_path)
    out = tmp_path / "t.csv"
    stopped = score(in_ws, pool, *excludes(files), "--strict", "-o", out, "-q", ok=False)
    assert stopped.exit_code == 1 and "zz.png" in stopped.stderr
    partial = Path(f"{out}.partial")
    assert partial.read_text().count("\n") - 1 == len(in_ws.images) - 3  # all but zz.png

    Image.fromarray(np.full((6, 6, 3), 99, np.uint8), "RGB").save(last)
    other = score(in_ws, pool, "--resume", "-o", out, ok=False)
    assert_one_error(other, "--exclude left out 3 examples, now 0", other.stderr)
    resumed = score(in_ws, pool, *excludes(files), "--resume", "-o", out)
    assert f"resuming: {len(in_ws.images) - 3} examples" in resumed.stderr

    reference = tmp_path / "ref.csv"
    score(in_ws, pool, "-o", reference, "-q")
    expected = [r for r in rows_of(reference) if r["id"] not in {*BY_ID, BY_FILE}]
    assert without_rank(rows_of(out)) == without_rank(expected) and len(expected) == 12
    ids, a, b = load_embeddings(f"{out}.emb.npz")  # the resumed run's embeddings: every row's
    assert sorted(ids) == sorted(r["id"] for r in expected)
    _, a_ref, b_ref = load_embeddings(f"{reference}.emb.npz", ids)
    assert torch.equal(a, a_ref) and torch.equal(b, b_ref)


def test_score_exclude_with_shards_merges_into_the_one_process_table(in_ws, tmp_path):
    files = exclusion_files(in_ws.pool, tmp_path)
    one = tmp_path / "one.csv"
    score(in_ws, "pool", *excludes(files), "-o", one, "-q")
    parts = [tmp_path / f"part{k}.csv" for k in range(3)]
    for k, part in enumerate(parts):
        score(in_ws, "pool", *excludes(files), "--shard", f"{k}/3", "-o", part, "-q")
    merged = tmp_path / "merged.csv"
    cli("merge", *parts, "-o", merged, "-q")
    assert merged.read_bytes() == one.read_bytes()
    meta = json.loads(Path(f"{merged}.meta.json").read_text())
    assert len(meta["excluded"]) == 3 and meta["rows"] == len(in_ws.images) - 3
    # a shard scored without the exclusions is another run
    plain = tmp_path / "plain2.csv"
    score(in_ws, "pool", "--shard", "2/3", "-o", plain, "-q")
    refused = cli("merge", parts[0], parts[1], plain, "-o", tmp_path / "m.csv", ok=False)
    assert_one_error(refused, "different excluded", refused.stderr)


def test_select_after_score_exclude_takes_the_same_exclusion_files(in_ws, tmp_path):
    """Round 2 of a loop: the table has no row for what is labeled, and `select --exclude` with
    the same files finds those examples in the table's meta.json (no error, no warning)."""
    files = exclusion_files(in_ws.pool, tmp_path)
    files[0].write_text("id\n" + "".join(f"{i}\n" for i in BY_ID))  # no unknown entry
    table = tmp_path / "t.csv"
    score(in_ws, "pool", *excludes(files), "-o", table, "-q")
    picked = cli("select", table, "-n", "5", *excludes(files), "-q")
    assert picked.stderr == ""
    ids = [r["id"] for r in parse_csv(picked.stdout)]
    assert len(ids) == 5 and not {*BY_ID, BY_FILE} & set(ids)


# --- -o makes its folders -------------------------------------------------------------------------

def test_outputs_create_missing_folders(in_ws, tmp_path):
    table = tmp_path / "new" / "dir" / "t.csv"
    score(in_ws, "pool", "-o", table, "-q", "-s", "entropy")
    assert len(rows_of(table)) == len(in_ws.images)
    batch, sheet = tmp_path / "b" / "c" / "batch.csv", tmp_path / "s" / "sheet.png"
    cli("select", table, "-n", "3", "-o", batch, "--contact-sheet", sheet, "-q")
    assert len(rows_of(batch)) == 3 and Image.open(sheet).size[0] > 0
    parts = [tmp_path / "parts" / f"p{k}.csv" for k in range(2)]
    for k, part in enumerate(parts):
        score(in_ws, "pool", "--shard", f"{k}/2", "-o", part, "-q", "-s", "entropy")
    merged = tmp_path / "m1" / "m2" / "merged.csv"
    cli("merge", *parts, "-o", merged, "-q")
    assert merged.read_text() == table.read_text()


def test_an_output_folder_that_cannot_be_made_is_one_sentence(in_ws, tmp_path):
    (tmp_path / "afile").write_text("x\n")
    table = tmp_path / "t.csv"
    score(in_ws, "pool", "-o", table, "-q", "-s", "entropy")
    blocked = tmp_path / "afile" / "sub"
    cases = [(["score", "pool", "-m", "model.pt", "-c", in_ws.config, "-o", blocked / "t.csv"],
              f"cannot create the folder {blocked}"),
             (["select", table, "-n", "2", "-o", blocked / "b.csv"], f"{blocked}"),
             (["select", table, "-n", "2", "--contact-sheet", blocked / "s.png"], f"{blocked}")]
    if os.path.isdir("/sys"):  # not even root can make a folder there
        cases.append((["score", "pool", "-m", "model.pt", "-c", in_ws.config, "-o",
                       "/sys/alcli-new/t.csv"], "cannot create the folder /sys/alcli-new"))
    for args, culprit in cases:
        result = cli(*args, ok=False)
        assert_one_error(result, culprit, f"{args}: {result.stderr!r}")


# --- warnings keep their origin -------------------------------------------------------------------

WARNING_NET = textwrap.dedent('''
    import warnings
    from tinynet import TinyNet
    warnings.warn("warnpkg.net is old, use warnpkg.new", UserWarning)
''')


def test_warnings_not_from_alcli_name_their_origin(in_ws, tmp_path):
    """A warning raised by the code of --arch prints as `warning (warnpkg/net.py:4): ...`; the
    normalisation warning alcli raises itself keeps `alcli: warning:` (a real subprocess)."""
    (in_ws.root / "warnpkg").mkdir(exist_ok=True)
    (in_ws.root / "warnpkg" / "__init__.py").write_text("")
    (in_ws.root / "warnpkg" / "net.py").write_text(WARNING_NET)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONWARNINGS"}  # Python's defaults
    base = [sys.executable, "-m", "alcli", "score", "pool", "-m", "model.pt", "-c", "config.yaml",
            "-q", "-s", "entropy"]
    run = subprocess.run([*base, "--arch", "warnpkg.net:TinyNet", "--trust-checkpoint"], cwd=in_ws.root, env=env,
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    lines = run.stderr.splitlines()
    assert "warning (warnpkg/net.py:4): warnpkg.net is old, use warnpkg.new" in lines, lines
    assert not [line for line in lines if line.startswith("alcli: warning:")], lines


def test_warnings_in_json_lines_carry_their_origin(capsys):
    reporter = Reporter("json")
    reporter.warn("old", "torch/x.py:3")
    reporter.warn("ours")
    assert [json.loads(line) for line in capsys.readouterr().err.splitlines()] == [
        {"event": "warning", "message": "old", "origin": "torch/x.py:3"},
        {"event": "warning", "message": "ours"}]


def test_warning_origin_of_files():
    from alcli import session
    from alcli.gradnorm.api import EngineFallback
    from alcli.terminal import warning_origin
    torch_file = torch.serialization.__file__
    assert warning_origin(UserWarning, torch_file, 12) == "torch/serialization.py:12"
    assert warning_origin(UserWarning, session.__file__, 3) is None
    assert warning_origin(EngineFallback, torch_file, 3) is None


# --- the Python API: exclude= ids, exclude_files= files -------------------------------------------

@pytest.fixture(scope="module")
def scored():
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    return alcli.score_pool((torch.rand(12, 4), None, [f"r{i}" for i in range(12)]), model,
                            strategy="margin")


def test_api_exclude_takes_any_iterable_of_ids(scored, tmp_path):
    everything = [r["id"] for r in alcli.select(scored, 12)]
    expected = [i for i in everything if i not in ("r1", "r5")]
    for ids in ({"r1", "r5"}, ["r1", "r5"], ("r1", "r5"), (f"r{n}" for n in (1, 5)),
                {"r1": 0, "r5": 0}.keys(), frozenset({"r1", "r5"})):
        assert [r["id"] for r in alcli.select(scored, 12, exclude=ids)] == expected, ids
    (tmp_path / "labeled.txt").write_text("r1\nr5\n")
    for files in (tmp_path / "labeled.txt", str(tmp_path / "labeled.txt"),
                  [tmp_path / "labeled.txt"]):
        assert [r["id"] for r in alcli.select(scored, 12, exclude_files=files)] == expected
    both = alcli.select(scored, 12, exclude={"r2"}, exclude_files=tmp_path / "labeled.txt")
    assert [r["id"] for r in both] == [i for i in expected if i != "r2"]


def test_api_exclude_refusals_are_one_sentence(scored, tmp_path):
    with pytest.raises(AlcliError, match=r"^exclude= takes ids \(.*exclude_files='labeled.csv'"):
        alcli.select(scored, 3, exclude="labeled.csv")
    with pytest.raises(AlcliError, match=r"^exclude= takes ids .*exclude_files="):
        alcli.select(scored, 3, exclude=tmp_path / "labeled.csv")
    for bad in (5, 1.5, b"r1"):
        with pytest.raises(AlcliError, match=r"^exclude= takes ids: a set, list, tuple"):
            alcli.select(scored, 3, exclude=bad)
    for bad in (5, [5], []):
        with pytest.raises(AlcliError, match=r"^exclude_files= takes an exclusion file"):
            alcli.select(scored, 3, exclude_files=bad)
    with pytest.raises(AlcliError, match=r"^argument exclude_files=: .*nope.txt"):
        alcli.select(scored, 3, exclude_files=tmp_path / "nope.txt")


# --- the normalisation warning --------------------------------------------------------------------

@pytest.fixture(scope="module")
def resnet(tmp_path_factory):
    import torchvision
    folder = tmp_path_factory.mktemp("resnet")
    torch.manual_seed(0)
    torch.save(torchvision.models.resnet18(weights=None, num_classes=3).state_dict(),
               folder / "r18.pt")
    (folder / "r18.yaml").write_text("arch: torchvision:resnet18\narch_kwargs: {num_classes: 3}\n"
                                     "strategy: entropy\n")
    return folder


NORMALISE_WARNING = ("alcli: warning: the model is torchvision:resnet18, usually trained on "
                     "normalised images, but no transform.normalize is configured, so it gets "
                     "pixels in 0..1; pass --normalize imagenet (or MEAN/STD) or set "
                     "transform.normalize in the config")


def test_a_torchvision_model_without_normalisation_gets_one_warning(in_ws, resnet):
    r18 = ["-m", resnet / "r18.pt", "-c", resnet / "r18.yaml", "-q"]
    bare = cli("score", "pool", *r18)
    assert bare.stderr.splitlines() == [NORMALISE_WARNING]
    assert cli("score", "pool", *r18, "--normalize", "imagenet").stderr == ""
    assert cli("score", in_ws.tensors, *r18).stderr == ""  # tensors: model inputs as they are
    # a model that is no torchvision/timm/Hugging Face one, and the demo-like config: no warning
    assert cli("score", "pool", "-m", "model.pt", "-c", in_ws.config, "-q").stderr == ""
    (in_ws.root / "plain.yaml").write_text("arch: tinynet:TinyNet\n")
    assert cli("score", "pool", "-m", "model.pt", "-c", "plain.yaml", "-q").stderr == ""


def test_the_api_warns_with_the_keyword_to_set(in_ws, resnet):
    with pytest.warns(UserWarning, match=r"torchvision:resnet18.*transform=\{'normalize'"):
        alcli.score_pool("pool", str(resnet / "r18.pt"), config=str(resnet / "r18.yaml"))


# --- transforms as flags --------------------------------------------------------------------------

def test_transform_flags_equal_the_config_keys_they_override(in_ws, tmp_path):
    def run(config_transform: str, *flags):
        cfg = tmp_path / "cfg.yaml"
        cfg.write_text(f"arch: tinynet:TinyNet\nbatch_size: 5\nstrategy: gradnorm\n"
                       f"transform: {config_transform}\n")
        return cli("score", "pool", "-m", "model.pt", "-c", cfg, "-q", *flags).stdout

    half = "{mean: [0.5, 0.5, 0.5], std: [0.25, 0.25, 0.25]}"
    imagenet = "{mean: [0.485, 0.456, 0.406], std: [0.229, 0.224, 0.225]}"
    cases = [
        ("{}", ["--resize", "8", "--center-crop", "6", "--normalize", "0.5,0.5,0.5/0.25,0.25,0.25"],
         f"{{resize: 8, center_crop: 6, normalize: {half}}}"),
        ("{resize: 8, center_crop: 6}", ["--resize", "12x9"],  # center_crop kept from the config
         "{resize: [12, 9], center_crop: 6}"),
        (f"{{normalize: {half}}}", ["--normalize", "imagenet"], f"{{normalize: {imagenet}}}"),
        (f"{{normalize: {half}}}", ["--normalize", "none", "--grayscale"], "{grayscale: true}"),
        ("{grayscale: true}", ["--no-grayscale", "--resize", "9", "--center-crop", "6x6"],
         "{resize: 9, center_crop: [6, 6]}"),
    ]
    for config_transform, flags, same_as in cases:
        with_flags = run(config_transform, *flags)
        assert with_flags == run(same_as), (config_transform, flags)
        assert with_flags != run(config_transform), (config_transform, flags)  # they changed it


def test_transform_flags_in_select_and_bad_values(in_ws, tmp_path):
    table = tmp_path / "t.csv"
    score(in_ws, "pool", "-o", table, "-q", "-s", "entropy")
    picked = cli("select", "-n", "3", "--pool", "pool", "-m", "model.pt", "-c", in_ws.config,
                 "--normalize", "0.5,0.5,0.5/0.25,0.25,0.25", "-s", "entropy", "--no-diverse", "-q")
    assert [r["id"] for r in parse_csv(picked.stdout)] == [r["id"] for r in rows_of(table)[:3]]
    unused = cli("select", table, "-n", "3", "--resize", "8")
    assert "--resize has no effect" in unused.stderr
    for flag, value, needle in (("--resize", "0", "N or HxW"), ("--resize", "big", "N or HxW"),
                                ("--center-crop", "3x", "N or HxW"),
                                ("--normalize", "imagenett", "imagenet, none, or MEAN/STD"),
                                ("--normalize", "0.5,0.5/0.2", "as many mean values as std"),
                                ("--normalize", "0.5/0", "positive std"),
                                ("--normalize", "0.5/nan", "MEAN/STD")):
        result = cli("score", "pool", "-m", "model.pt", "-c", in_ws.config, flag, value, ok=False)
        assert_one_error(result, f"option {flag} ", f"{flag} {value}: {result.stderr!r}")
        assert needle in result.stderr and repr(value) in result.stderr
