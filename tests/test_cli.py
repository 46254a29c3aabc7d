"""The real CLI (Typer's CliRunner, and real subprocesses) on real files; scores checked against
an independent float64 per-example loop."""
from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from typer.testing import CliRunner

from alcli.cli import app
from cli_errors import assert_one_error
from conftest import CLASSES, oracle_grad_norm, parse_csv

REPO = Path(__file__).resolve().parents[1]
runner = CliRunner()


def score(ws, *args, input=None, ok=True):
    result = runner.invoke(app, ["score", *map(str, args), "-c", str(ws.config), "-q"], input=input)
    if ok:
        assert result.exit_code == 0, result.stderr + result.stdout
    return result


def rows_of(result) -> list[dict]:
    return parse_csv(result.stdout)


def check_ranked(rows):
    assert [int(r["rank"]) for r in rows] == list(range(1, len(rows) + 1))
    keys = [(-float(r["score"]), r["id"]) for r in rows]
    assert keys == sorted(keys)


# --- each input kind --------------------------------------------------------------------------

def test_image_folder_recursive_ids_and_header(in_ws):
    rows = rows_of(score(in_ws, "pool", "-m", "model.pt", "-s", "entropy"))
    assert list(rows[0]) == ["rank", "id", "score", "pred", "confidence", "loss", "path"]
    assert {r["id"] for r in rows} == set(in_ws.images)  # .png .jpg .bmp, nested, not notes.txt
    assert all(r["path"] == f"pool/{r['id']}" for r in rows)  # the file, as the pool named it
    check_ranked(rows)


def test_manifest_csv_and_jsonl_with_labels(in_ws, tmp_path):
    rows = rows_of(score(in_ws, "manifest.csv", "-m", "model.pt", "-s", "loss"))
    assert list(rows[0])[:7] == ["rank", "id", "score", "pred", "confidence", "label", "loss"]
    assert {r["id"]: int(r["label"]) for r in rows} == {k: v[1] for k, v in in_ws.images.items()}
    assert all(Path(r["path"]).samefile(in_ws.images[r["id"]][0]) for r in rows)
    jsonl = tmp_path / "m.jsonl"
    jsonl.write_text("".join(f'{{"path": "{p}", "label": {lab}}}\n' for p, lab in in_ws.images.values()))
    rows2 = rows_of(score(in_ws, jsonl, "-m", "model.pt", "-s", "loss"))
    by_path = {r["id"]: r["score"] for r in rows2}  # no id column: the path is the id
    assert sorted(by_path.values()) == sorted(r["score"] for r in rows)


def test_stdin_paths(in_ws):
    paths = [str(p) for p, _ in in_ws.images.values()][:6]
    rows = rows_of(score(in_ws, "-", "-m", "model.pt", "-s", "margin", input="\n".join(paths) + "\n"))
    assert sorted(r["id"] for r in rows) == sorted(paths)
    assert "margin" in rows[0]


def test_tensor_pool_pt_npy_npz_match_the_images(in_ws, tmp_path):
    from_images = {r["id"]: float(r["score"]) for r in rows_of(score(in_ws, "manifest.csv", "-m", "model.pt",
                                                                        "-s", "loss"))}
    from_pt = rows_of(score(in_ws, "pool.pt", "-m", "model.pt", "-s", "loss"))
    assert {r["id"] for r in from_pt} == set(from_images)
    for r in from_pt:
        assert float(r["score"]) == pytest.approx(from_images[r["id"]], rel=1e-5)
    data = torch.load(in_ws.tensors)
    np.save(tmp_path / "x.npy", data["x"].numpy())
    np.savez(tmp_path / "p.npz", x=data["x"].numpy(), y=data["y"].numpy(), ids=np.array(data["ids"]))
    rows_npy = rows_of(score(in_ws, tmp_path / "x.npy", "-m", "model.pt", "-s", "entropy"))
    assert sorted(int(r["id"]) for r in rows_npy) == list(range(len(data["ids"])))
    rows_npz = rows_of(score(in_ws, tmp_path / "p.npz", "-m", "model.pt", "-s", "loss"))
    assert {r["id"]: float(r["score"]) for r in rows_npz} == pytest.approx(
        {r["id"]: float(r["score"]) for r in from_pt})


def test_torchvision_state_dict(in_ws, tmp_path):
    import torchvision
    torch.manual_seed(0)
    net = torchvision.models.resnet18(weights=None, num_classes=3)
    torch.save(net.state_dict(), tmp_path / "r18.pt")
    cfg = tmp_path / "r18.yaml"
    cfg.write_text("arch: torchvision:resnet18\narch_kwargs: {num_classes: 3}\n"
                   "transform: {resize: 40, center_crop: 32}\n")
    result = runner.invoke(app, ["score", "pool", "-m", str(tmp_path / "r18.pt"), "-c", str(cfg),
                                 "-s", "gradnorm", "--layers", "fc", "-q"])
    assert result.exit_code == 0, result.stderr
    rows = rows_of(result)
    assert len(rows) == len(in_ws.images)
    assert all(float(r["score"]) > 0 for r in rows)


def test_nested_lightning_and_ddp_dicts(in_ws, tmp_path):
    sd = torch.load(in_ws.model)
    reference = rows_of(score(in_ws, "pool", "-m", "model.pt", "-s", "entropy"))
    lightning = {"epoch": 3, "global_step": 10, "state_dict": {f"model.{k}": v for k, v in sd.items()},
                 "optimizer_states": [], "hyper_parameters": {"lr": 0.1}}
    torch.save(lightning, tmp_path / "l.ckpt")
    torch.save({"model": {f"module.{k}": v for k, v in sd.items()}}, tmp_path / "ddp.pt")
    for ckpt in ("l.ckpt", "ddp.pt"):
        assert rows_of(score(in_ws, "pool", "-m", tmp_path / ckpt, "-s", "entropy")) == reference


def test_pickled_model_refused_then_trusted(in_ws, tmp_path):
    net = in_ws.net(torch.float32)
    torch.save(net, tmp_path / "whole.pt")
    refused = score(in_ws, "pool", "-m", tmp_path / "whole.pt", ok=False)
    assert refused.exit_code == 1
    assert "--trust-checkpoint" in refused.stderr and "whole.pt" in refused.stderr
    assert refused.stdout == ""
    trusted = score(in_ws, "pool", "-m", tmp_path / "whole.pt", "--trust-checkpoint", "-s", "entropy")
    assert rows_of(trusted) == rows_of(score(in_ws, "pool", "-m", "model.pt", "-s", "entropy"))


# --- scores against their definitions ---------------------------------------------------------

def test_gradnorm_equals_the_seed_loop_in_float64(in_ws):
    rows = rows_of(score(in_ws, "pool", "-m", "model.pt", "--labels-from-folders", "-s", "gradnorm"))
    model = in_ws.net()
    assert len(rows) == len(in_ws.images)
    for r in rows:
        label = in_ws.images[r["id"]][1]
        assert r["label"] == CLASSES[label]  # class folders name the classes
        expected = oracle_grad_norm(model, in_ws.image_input(r["id"]), label)
        assert float(r["score"]) == pytest.approx(expected, rel=1e-4)
        logits = model(in_ws.image_input(r["id"])[None])[0].detach()
        assert float(r["loss"]) == pytest.approx(float(F.cross_entropy(logits, torch.tensor(label))), rel=1e-4)


def test_gradnorm_without_labels_uses_the_prediction(in_ws):
    rows = rows_of(score(in_ws, "pool", "-m", "model.pt", "-s", "gradnorm", "--method", "loop"))
    model = in_ws.net()
    for r in rows[:5]:
        x = in_ws.image_input(r["id"])
        pred = int(model(x[None]).argmax())
        assert int(r["pred"]) == pred
        assert float(r["score"]) == pytest.approx(oracle_grad_norm(model, x, pred), rel=1e-4)


def test_egl_equals_its_definition_and_top_classes(in_ws):
    model = in_ws.net()
    full = rows_of(score(in_ws, "pool", "-m", "model.pt", "-s", "egl"))
    top2 = {r["id"]: r for r in rows_of(score(in_ws, "pool", "-m", "model.pt", "-s", "egl",
                                                "--top-classes", "2"))}
    for r in full:
        x = in_ws.image_input(r["id"])
        with torch.no_grad():
            p = torch.softmax(model(x[None])[0], 0)
        norms = [oracle_grad_norm(model, x, c) for c in range(3)]
        assert float(r["score"]) == pytest.approx(sum(float(p[c]) * norms[c] for c in range(3)), rel=1e-4)
        best = torch.argsort(p, descending=True)[:2].tolist()
        assert float(top2[r["id"]]["score"]) == pytest.approx(sum(float(p[c]) * norms[c] for c in best),
                                                              rel=1e-4)
        assert float(top2[r["id"]]["mass_left"]) == pytest.approx(1 - float(p[best].sum()), abs=1e-6)
        assert float(r["confidence"]) == pytest.approx(float(p.max()), rel=1e-6)
        assert int(r["pred"]) == int(p.argmax())


def test_random_is_seeded_and_batch_independent(in_ws):
    a = rows_of(score(in_ws, "pool", "-m", "model.pt", "-s", "random", "--seed", "3"))
    b = rows_of(score(in_ws, "pool", "-m", "model.pt", "-s", "random", "--seed", "3", "-b", "2"))
    c = rows_of(score(in_ws, "pool", "-m", "model.pt", "-s", "random", "--seed", "4"))
    assert [(r["id"], r["score"]) for r in a] == [(r["id"], r["score"]) for r in b]
    assert [r["id"] for r in a] != [r["id"] for r in c]


def test_same_table_for_any_batch_size_and_workers(in_ws):
    one = rows_of(score(in_ws, "pool", "-m", "model.pt", "-s", "gradnorm", "-b", "64"))
    other = rows_of(score(in_ws, "pool", "-m", "model.pt", "-s", "gradnorm", "-b", "3", "-j", "2"))
    assert [r["id"] for r in one] == [r["id"] for r in other]
    for r, s in zip(one, other):
        assert float(r["score"]) == pytest.approx(float(s["score"]), rel=1e-5)


# --- output, select, inspect --------------------------------------------------------------------

def test_output_file_jsonl_and_summary_on_stderr(in_ws, tmp_path):
    out = tmp_path / "s.jsonl"
    result = runner.invoke(app, ["score", "pool", "-m", "model.pt", "-c", str(in_ws.config),
                                 "-s", "entropy", "-o", str(out), "-f", "jsonl"])
    assert result.exit_code == 0, result.stderr
    assert result.stdout == ""
    assert "examples/s" in result.stderr and "top 5" in result.stderr and "cpu" in result.stderr
    # off a terminal: plain lines (the first progress line, the summary), no bar, no box drawing
    assert not any(ord(c) > 127 for c in result.stderr) and "\r" not in result.stderr
    import json
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["rank"] for r in rows] == list(range(1, len(in_ws.images) + 1))


def test_select_formats_from_file_and_stdin(in_ws, tmp_path):
    table = tmp_path / "scores.csv"
    full = score(in_ws, "pool", "-m", "model.pt", "-s", "least-confidence", "-o", table)
    rows = parse_csv(table.read_text())
    paths = runner.invoke(app, ["select", str(table), "-n", "4", "-f", "paths", "--no-diverse"])
    assert paths.exit_code == 0, paths.stderr
    assert paths.stdout.splitlines() == [r["path"] for r in rows[:4]]
    assert all(os.path.isfile(in_ws.root / p) for p in paths.stdout.splitlines())
    ids = runner.invoke(app, ["select", str(table), "-n", "4", "-f", "ids", "--no-diverse"])
    assert ids.stdout.splitlines() == [r["id"] for r in rows[:4]]
    piped = runner.invoke(app, ["select", "-n", "4"], input=table.read_text())
    assert parse_csv(piped.stdout) == rows[:4]  # its embeddings are not under ./.alcli: the
    assert piped.stderr.splitlines() == [  # plain top N, said in one warning
        "alcli: warning: selected the best scores without --diverse: the table on stdin matches "
        "none of the embeddings `alcli score` keeps under ./.alcli/ for tables it writes to "
        "stdout (the newest 4, in the folder it ran in); pass --embeddings FILE"]
    diverse = runner.invoke(app, ["select", str(table), "-n", "4"])  # embeddings beside the table
    assert diverse.exit_code == 0 and parse_csv(diverse.stdout) != rows[:4]
    assert parse_csv(diverse.stdout) == \
        parse_csv(runner.invoke(app, ["select", str(table), "-n", "4", "--diverse"]).stdout)
    too_many = runner.invoke(app, ["select", str(table), "-n", "100"])
    assert too_many.exit_code == 0 and len(parse_csv(too_many.stdout)) == len(rows)
    assert "warning" in too_many.stderr
    assert full.stdout == ""


def test_select_scores_first_with_pool_and_model(in_ws):
    result = runner.invoke(app, ["select", "-n", "3", "--pool", "pool", "-m", "model.pt",
                                 "-c", str(in_ws.config), "-s", "entropy", "-q", "--no-diverse"])
    assert result.exit_code == 0, result.stderr
    assert parse_csv(result.stdout) == rows_of(score(in_ws, "pool", "-m", "model.pt", "-s", "entropy"))[:3]


def test_inspect_lists_modules_rules_and_method(in_ws):
    result = runner.invoke(app, ["inspect", "-m", "model.pt", "-c", str(in_ws.config), "--pool", "pool",
                                 "--layers", "fc"])
    assert result.exit_code == 0, result.stderr
    out = result.stdout
    for text in ("conv", "fc", "Linear", "Conv2d", "112", "111 selected", "method:"):
        assert text in out
    assert "input channels: 3" in out


def test_help_shows_real_examples():
    for command in ("score", "select", "inspect"):
        result = runner.invoke(app, [command, "--help"])
        assert result.exit_code == 0
        assert "Examples" in result.stdout and f"alcli {command}" in result.stdout


def test_python_api_matches_the_cli(in_ws):
    import alcli
    cli_rows = rows_of(score(in_ws, "pool", "-m", "model.pt", "-s", "gradnorm", "--labels-from-folders"))
    rows = alcli.score_pool("pool", model="model.pt", config=in_ws.config, strategy="gradnorm",
                            labels_from_folders=True)
    assert [r["id"] for r in rows] == [r["id"] for r in cli_rows]
    assert [repr(r["score"]) for r in rows] == [r["score"] for r in cli_rows]
    batch = alcli.select(rows, 5, diverse=False)
    assert [r["id"] for r in batch] == [r["id"] for r in cli_rows[:5]]
    # in-memory data and an nn.Module work too
    data = torch.load(in_ws.tensors)
    mem = alcli.score_pool((data["x"], data["y"]), in_ws.net(torch.float32), strategy="loss")
    assert len(mem) == len(data["x"]) and mem[0]["rank"] == 1 and "label" in mem[0]


# --- bad input: exit 1, one sentence naming the culprit, no traceback ----------------------------

def _bad_inputs(ws, tmp: Path):
    (tmp / "bad.yaml").write_text("batch_sise: 3\n")
    (tmp / "badtype.yaml").write_text("batch_size: many\n")
    (tmp / "badnest.yaml").write_text("transform: {resize: -3}\n")
    (tmp / "broken.yaml").write_text("model: [unclosed\n")
    (tmp / "nopath.csv").write_text("id,file\nx,a.png\n")
    (tmp / "badlabel.csv").write_text(f"path,label\n{ws.images['a/img00.png'][0]},cat\n")
    (tmp / "corrupt").mkdir()
    (tmp / "corrupt" / "x.png").write_bytes(b"\x89PNG not really")
    (tmp / "sizes").mkdir()
    from PIL import Image
    Image.new("RGB", (6, 6)).save(tmp / "sizes" / "a.png")
    Image.new("RGB", (7, 5)).save(tmp / "sizes" / "b.png")
    (tmp / "empty").mkdir()
    (tmp / "toobig.csv").write_text(f"path,label\n{ws.images['a/img00.png'][0]},7\n")
    (tmp / "noscore.csv").write_text("rank,id\n1,a\n")
    (tmp / "junk.pt").write_bytes(b"junk")
    sd = torch.load(ws.model)
    sd["fc.weight"] = torch.zeros(5, 36)
    torch.save(sd, tmp / "shape.pt")
    torch.save({k: v for k, v in sd.items() if k != "conv.bias"}, tmp / "missing.pt")
    m = ["-m", "model.pt"]
    return [
        (["score", "pool", "-m", "nope.pt"], "nope.pt"),
        (["score", "nopool", *m], "nopool"),
        (["score", "pool", *m, "--arch", "nosuchmod:Net"], "nosuchmod"),
        (["score", "pool", *m, "--arch", "torchvision:notanet"], "notanet"),
        (["score", "pool", "-m", str(tmp / "shape.pt")], "fc.weight"),
        (["score", "pool", "-m", str(tmp / "missing.pt")], "conv.bias"),
        (["score", "pool", "-m", str(tmp / "junk.pt")], "junk.pt"),
        (["score", "pool", *m, "-c", str(tmp / "bad.yaml")], "batch_sise"),
        (["score", "pool", *m, "-c", str(tmp / "badtype.yaml")], "batch_size"),
        (["score", "pool", *m, "-c", str(tmp / "badnest.yaml")], "transform.resize"),
        (["score", "pool", *m, "-c", str(tmp / "broken.yaml")], "broken.yaml"),
        (["score", "pool", *m, "-c", str(tmp / "nothere.yaml")], "nothere.yaml"),
        (["score", str(tmp / "nopath.csv"), *m], "'path'"),
        (["score", str(tmp / "badlabel.csv"), *m], "line 2"),
        (["score", str(tmp / "corrupt"), *m], "x.png"),
        (["score", str(tmp / "sizes"), *m], "transform.resize"),
        (["score", str(tmp / "empty"), *m], "empty"),
        (["score", str(tmp / "toobig.csv"), *m], "label 7"),
        (["score", "pool", *m, "--layers", "nosuchlayer"], "nosuchlayer"),
        (["score", "pool", *m, "-s", "nosuchstrategy"], "--strategy"),
        (["score", "pool", *m, "--device", "tpu"], "--device"),
        (["score", "manifest.csv", *m, "--labels-from-folders"], "--labels-from-folders"),
        (["select", str(tmp / "noscore.csv"), "-n", "2"], "'score'"),
        (["select", str(tmp / "nothere.csv"), "-n", "2"], "nothere.csv"),
        (["select", "manifest.csv"], "--budget"),
    ]


def test_every_bad_input_is_one_sentence_and_exit_1(in_ws, tmp_path):
    for args, culprit in _bad_inputs(in_ws, tmp_path):
        if args[0] == "score" and "-c" not in args:
            args = [*args, "-c", str(in_ws.config)]
        result = runner.invoke(app, args)
        assert_one_error(result, culprit, f"{args} -> {result.exit_code} {result.stderr!r}")


def test_usage_error_exits_2():
    result = runner.invoke(app, ["score", "--batch-size", "lots"])
    assert result.exit_code == 2


# --- real subprocesses --------------------------------------------------------------------------

def _env():
    return {**os.environ, "PYTHONWARNINGS": "ignore", "COLUMNS": "100"}


def test_two_stage_pipe_prints_the_top_ids(in_ws, tmp_path):
    full = tmp_path / "full.csv"
    py = sys.executable
    pipe = subprocess.run(f"{py} -m alcli score pool -m model.pt -c config.yaml -s gradnorm -q"
                          f" | tee {full} | {py} -m alcli select -n 10 --format paths --no-diverse",
                          shell=True, capture_output=True, text=True, env=_env())
    assert pipe.returncode == 0, pipe.stderr
    table = parse_csv(full.read_text())
    assert len(table) == len(in_ws.images) > 10
    check_ranked(table)
    assert pipe.stdout.splitlines() == [r["path"] for r in table[:10]]
    # by default the pipe's batch is diverse: select finds the embeddings score kept in ./.alcli
    diverse = subprocess.run(f"{py} -m alcli select -n 10 --format paths < {full}", shell=True,
                             capture_output=True, text=True, env=_env())
    assert diverse.returncode == 0 and diverse.stderr == "", diverse.stderr
    assert sorted(diverse.stdout.splitlines()) != sorted(pipe.stdout.splitlines())


def test_on_a_terminal_progress_shows_and_the_table_goes_to_scores_csv(in_ws):
    import pty
    master, slave = pty.openpty()
    # read the terminal while alcli runs: a full pty buffer would block its progress bar
    proc = subprocess.Popen([sys.executable, "-m", "alcli", "score", "pool", "-m", "model.pt", "-c",
                             "config.yaml", "-s", "entropy"], stdout=slave, stderr=slave, env=_env())
    os.close(slave)
    seen = b""
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:
            break
        if not chunk:
            break
        seen += chunk
    os.close(master)
    proc.wait(timeout=120)
    text = seen.decode(errors="replace")
    assert proc.returncode == 0, text
    assert "scoring" in text and "wrote 14 rows to scores.csv" in text
    rows = parse_csv((in_ws.root / "scores.csv").read_text())
    (in_ws.root / "scores.csv").unlink()
    assert len(rows) == 14


def test_no_arguments_scores_the_demo(demo_run):
    result = demo_run  # `python -m alcli score` in the checkout (conftest)
    assert result.returncode == 0, result.stderr
    rows = parse_csv(result.stdout)
    demo_images = list((REPO / "data" / "demo" / "pool").rglob("*.png"))
    assert len(rows) == len(demo_images) >= 100
    check_ranked(rows)
    assert all(math.isfinite(float(r["score"])) for r in rows)
    assert "examples/s" in result.stderr


def test_demo_files_are_small():
    total = sum(p.stat().st_size for p in (REPO / "data" / "demo").rglob("*") if p.is_file())
    assert total < 2 * 1024 * 1024
