"""Selection through the real CLI on real files: BADGE on a pool with planted near-duplicate groups,
per-class quotas and exclusions on a crafted table, Label Studio tasks, the contact sheet, errors."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from typer.testing import CliRunner

import alcli
from alcli.cli import app
from alcli.selection.export import PAD, sheet_layout
from cli_errors import assert_one_error
from conftest import MEAN, STD, parse_csv
from test_export import assert_labelstudio_import

runner = CliRunner()
GROUPS, COPIES, SINGLES = 4, 6, 24


def _input(arr: np.ndarray) -> torch.Tensor:
    """An RGB uint8 image [6, 6, 3] as the model sees it, computed here: [3, 6, 6] float64."""
    return (torch.from_numpy(arr / 255.0).permute(2, 0, 1) - MEAN) / STD


class Planted:
    """`planted/`: GROUPS images of high entropy, each COPIES times with ±1 on two pixel values
    (ids g{k}_{j}.png), and SINGLES distinct images of lower entropy (s{j}.png)."""

    def __init__(self, ws, root: Path):
        net = ws.net()
        rng = np.random.default_rng(5)
        cands = rng.integers(0, 256, (300, 6, 6, 3), dtype=np.uint8)
        with torch.no_grad():
            p = torch.softmax(net(torch.stack([_input(a) for a in cands])), dim=1)
        order = np.argsort((p * p.log()).sum(1).numpy())  # highest entropy first
        self.dir = root / "planted"
        self.dir.mkdir()
        self.group: dict[str, int | None] = {}
        self.arrays: dict[str, np.ndarray] = {}
        for k in range(GROUPS):
            for j in range(COPIES):
                x = cands[order[k]].astype(int)
                for _ in range(2):
                    r, c, ch = rng.integers(0, 6), rng.integers(0, 6), rng.integers(0, 3)
                    x[r, c, ch] = np.clip(x[r, c, ch] + rng.choice([-1, 1]), 0, 255)
                self._save(f"g{k}_{j}.png", x.astype(np.uint8), k)
        for j in range(SINGLES):
            self._save(f"s{j:02d}.png", cands[order[100 + j]], None)

    def _save(self, name, arr, group):
        Image.fromarray(arr, "RGB").save(self.dir / name)
        self.group[name], self.arrays[name] = group, arr


@pytest.fixture(scope="module")
def planted(workspace, tmp_path_factory):
    return Planted(workspace, tmp_path_factory.mktemp("planted"))


@pytest.fixture
def table(in_ws, planted, tmp_path):
    """The planted pool scored by entropy, with its embeddings beside the table."""
    out = tmp_path / "s.csv"
    result = runner.invoke(app, ["score", str(planted.dir), "-m", "model.pt", "-c", "config.yaml",
                                 "-s", "entropy", "--embeddings", "-o", str(out)])
    assert result.exit_code == 0, result.stderr
    assert f"wrote their embeddings to {out}.emb.npz" in result.stderr
    return out


def select(*args, input=None, ok=True):
    result = runner.invoke(app, ["select", *map(str, args)], input=input)
    if ok:
        assert result.exit_code == 0, result.stderr + result.stdout
    return result


def ids_of(result) -> list[str]:
    return [r["id"] for r in parse_csv(result.stdout)]


# --- embeddings -----------------------------------------------------------------------------------

def test_score_embeddings_are_the_last_layer_factors(in_ws, planted, table):
    with np.load(f"{table}.emb.npz") as z:
        ids, a, b = [str(i) for i in z["ids"]], z["a"], z["b"]
    assert sorted(ids) == sorted(planted.group)
    net = in_ws.net()
    x = torch.stack([_input(planted.arrays[i]) for i in ids])
    with torch.no_grad():  # independently: h = the input of fc, p = softmax of the output
        h = net.pool(torch.relu(net.conv(x))).flatten(1)
        p = torch.softmax(net.fc(h), dim=1)
    onehot = torch.nn.functional.one_hot(p.argmax(1), 3)
    assert b.shape == (len(ids), 36) and a.shape == (len(ids), 3)
    np.testing.assert_allclose(b, h.numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(a, (p - onehot).numpy(), rtol=1e-4, atol=1e-5)


# --- BADGE on planted near-duplicates ----------------------------------------------------------------

def test_diverse_takes_one_per_group_and_same_seed_same_batch(in_ws, planted, table):
    budget = 6
    top = ids_of(select(table, "-n", budget, "--no-diverse", "--no-dedup"))
    groups = [planted.group[i] for i in top]
    assert max(groups.count(k) for k in set(groups) - {None}) >= 3  # plain top-N: copies
    ranked = [r["id"] for r in parse_csv(table.read_text())]
    for seed in (0, 1, 2):
        batch = ids_of(select(table, "-n", budget, "--diverse", "--seed", seed))
        assert len(batch) == len(set(batch)) == budget
        picked = [planted.group[i] for i in batch if planted.group[i] is not None]
        assert len(picked) == len(set(picked)), f"seed {seed}: two copies of a group: {batch}"
        assert ranked[0] in batch                      # the best-scoring example is kept
        assert batch == sorted(batch, key=ranked.index)  # best score first
        assert ids_of(select(table, "-n", budget, "--diverse", "--seed", seed)) == batch
    # the embeddings may also be named, e.g. for a table piped in
    piped = select("-n", budget, "--diverse", "--seed", 1, "--embeddings", f"{table}.emb.npz",
                   input=table.read_text())
    assert ids_of(piped) == ids_of(select(table, "-n", budget, "--diverse", "--seed", 1))


def test_diverse_in_one_process_and_python_api_match_the_files(in_ws, planted, table):
    from_files = ids_of(select(table, "-n", 5, "--diverse", "--seed", 3))
    one_process = select("--pool", planted.dir, "-m", "model.pt", "-c", "config.yaml",
                         "-s", "entropy", "-n", 5, "--diverse", "--seed", 3, "-q")
    assert ids_of(one_process) == from_files
    api = alcli.select(str(table), 5, diverse=True, seed=3)
    assert [r["id"] for r in api] == from_files
    api_scored = alcli.select(pool=str(planted.dir), model="model.pt", config="config.yaml",
                              strategy="entropy", budget=5, diverse=True, seed=3)
    assert [r["id"] for r in api_scored] == from_files


def test_diverse_per_class_and_candidates(in_ws, planted, table):
    from collections import Counter
    rows = parse_csv(table.read_text())
    batch = parse_csv(select(table, "-n", 6, "--diverse", "--per-class", "equal").stdout)
    plain = parse_csv(select(table, "-n", 6, "--per-class", "equal").stdout)
    assert Counter(r["pred"] for r in batch) == Counter(r["pred"] for r in plain)  # same quotas
    assert len(batch) == 6
    picked = [planted.group[r["id"]] for r in batch if planted.group[r["id"]] is not None]
    assert len(picked) == len(set(picked))
    # --diverse-candidates M: every pick among the M best scores
    top8 = {r["id"] for r in rows[:8]}
    assert set(ids_of(select(table, "-n", 4, "--diverse", "--diverse-candidates", 8,
                             "--no-dedup"))) <= top8


# --- per-class and exclusions on a crafted table ---------------------------------------------------

CRAFTED = [("a0", .95, 0), ("a1", .9, 0), ("a2", .6, 0), ("a3", .5, 0), ("a4", .3, 0), ("a5", .1, 0),
           ("b0", .99, 1), ("b1", .4, 1), ("b2", .2, 1), ("c0", .05, 2)]


@pytest.fixture
def crafted(tmp_path):
    path = tmp_path / "crafted.csv"
    path.write_text("id,score,pred\n" + "".join(f"{i},{s},{c}\n" for i, s, c in CRAFTED))
    return path


def test_per_class_quotas_exactly(crafted):
    # proportional 5 over counts 6:3:1 -> 3, 1.5, 0.5 -> 3, 1, 0 + the tie of remainders to class 1
    assert ids_of(select(crafted, "-n", 5, "--per-class", "proportional")) == \
        ["b0", "a0", "a1", "a2", "b1"]
    # equal: 5 over 3 classes -> 2, 2, 1
    assert ids_of(select(crafted, "-n", 5, "--per-class=equal")) == ["b0", "a0", "a1", "b1", "c0"]
    # rank is the place in the whole table
    ranks = [int(r["rank"]) for r in parse_csv(select(crafted, "-n", 5, "--per-class", "equal").stdout)]
    assert ranks == [1, 2, 3, 6, 10]


def test_scoring_options_given_with_a_table_are_named_as_having_no_effect(crafted):
    plain = select(crafted, "-n", 2, "--no-diverse", "--no-dedup")
    assert plain.stderr == ""
    told = select(crafted, "-n", 2, "--no-diverse", "--no-dedup", "--strategy", "entropy", "-b", "8")
    assert ids_of(told) == ids_of(plain)
    assert told.stderr.strip() == (f"alcli: warning: --strategy (and 1 more scoring options) has no effect: "
                                   f"the scores are read from {crafted}; pass --pool POOL to score first")


def test_exclusions_from_csv_jsonl_and_lines(crafted, tmp_path):
    (tmp_path / "labeled.csv").write_text("path,id\nx.png,a0\n")
    (tmp_path / "queued.jsonl").write_text('{"id": "b0"}\n\n')
    (tmp_path / "more.txt").write_text("a1\n")
    ex = ["--exclude", tmp_path / "labeled.csv", "--exclude", tmp_path / "queued.jsonl",
          "--exclude", tmp_path / "more.txt"]
    assert ids_of(select(crafted, "-n", 3, *ex)) == ["a2", "a3", "b1"]
    # exclusions first, then quotas over what is left: 4:2:1 -> 2.86, 1.43, .71 -> 3, 1, 1
    assert ids_of(select(crafted, "-n", 5, *ex, "--per-class", "proportional")) == \
        ["a2", "a3", "b1", "a4", "c0"]
    # the same from a config file
    cfg = tmp_path / "sel.yaml"
    cfg.write_text(f"exclude: [{tmp_path / 'labeled.csv'}, {tmp_path / 'queued.jsonl'}, "
                   f"{tmp_path / 'more.txt'}]\nper_class: proportional\nbudget: 5\n")
    assert ids_of(select(crafted, "-c", cfg)) == ["a2", "a3", "b1", "a4", "c0"]
    few = select(crafted, "-n", 9, *ex)
    assert len(ids_of(few)) == 7 and "only 7 rows" in few.stderr


# --- hand-offs ---------------------------------------------------------------------------------------

def test_labelstudio_tasks(in_ws, table, tmp_path):
    out = tmp_path / "tasks.json"
    select(table, "-n", 4, "-m", "model.pt", "-f", "labelstudio", "--no-diverse", "--no-dedup", "--image-root",
           "https://files.example.com/pool", "-o", out)
    tasks = json.loads(out.read_text())
    assert_labelstudio_import(tasks)
    rows = parse_csv(table.read_text())[:4]
    assert [t["data"]["image"] for t in tasks] == \
        [f"https://files.example.com/pool/{r['id']}" for r in rows]
    assert [t["predictions"][0]["score"] for t in tasks] == [float(r["score"]) for r in rows]
    assert {t["predictions"][0]["model_version"] for t in tasks} == {"model.pt"}
    stdout = select(table, "-n", 2, "-f", "labelstudio", "-c", "config.yaml", "--no-diverse",
                    "--no-dedup")
    assert [t["data"]["image"] for t in json.loads(stdout.stdout)] == [r["id"] for r in rows[:2]]
    lines = select(table, "-n", 3, "--diverse", "-f", "jsonl").stdout.splitlines()
    objs = [json.loads(line) for line in lines]
    assert [o["id"] for o in objs] == ids_of(select(table, "-n", 3, "--diverse"))
    assert all(isinstance(o["score"], float) and isinstance(o["rank"], int) for o in objs)


def _tiles(sheet: Path, n: int):
    cols, nrows, cell_w, cell_h = sheet_layout(n)
    with Image.open(sheet) as im:
        assert im.format == "PNG" and im.size == (cols * cell_w, nrows * cell_h)
        pixels = np.asarray(im.convert("RGB"))
    for i in range(n):
        x0, y0 = (i % cols) * cell_w + PAD, (i // cols) * cell_h + PAD
        yield pixels[y0:y0 + 160, x0:x0 + 160]


def test_contact_sheet_one_tile_per_selected_image(in_ws, planted, table, tmp_path):
    sheet = tmp_path / "sheet.png"
    # ids resolve against the configured pool folder (here given by --image-dir)
    result = select(table, "-n", 5, "--diverse", "--contact-sheet", sheet, "--image-dir", planted.dir)
    batch = ids_of(result)
    assert f"wrote a contact sheet of 5 images to {sheet}" in result.stderr
    for name, tile in zip(batch, _tiles(sheet, len(batch))):
        expected = Image.fromarray(planted.arrays[name]).resize((160, 160), Image.Resampling.NEAREST)
        assert np.array_equal(tile, np.asarray(expected)), name
    # scored in one process: the pool maps ids to files; the config's pool key works too
    sheet2 = tmp_path / "sheet2.png"
    select("--pool", planted.dir, "-m", "model.pt", "-c", "config.yaml", "-s", "entropy", "-n", 5,
           "--diverse", "--contact-sheet", sheet2, "-q")
    assert sheet2.read_bytes() == sheet.read_bytes()
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"pool: {planted.dir}\ncontact_sheet: {tmp_path / 'sheet3.png'}\n")
    select(table, "-n", 5, "--diverse", "-c", cfg)
    assert (tmp_path / "sheet3.png").read_bytes() == sheet.read_bytes()


# --- bad input: exit 1, one sentence naming the culprit --------------------------------------------

HEADLESS = '''
import torch
from torch import nn

class Headless(nn.Module):
    """Class scores from a 1x1 convolution averaged over space: no final nn.Linear."""
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 3, 1)

    def forward(self, x):
        return self.conv(x).mean(dim=(2, 3))
'''


def test_bad_selection_input_is_one_sentence_and_exit_1(in_ws, planted, table, crafted, tmp_path):
    (in_ws.root / "headless.py").write_text(HEADLESS)
    torch.manual_seed(0)
    sys.path.insert(0, str(in_ws.root))
    try:
        from headless import Headless
    finally:
        sys.path.remove(str(in_ws.root))
    torch.save(Headless().state_dict(), tmp_path / "headless.pt")
    (tmp_path / "bad.jsonl").write_text('{"id": "a0"}\n{oops\n')
    (tmp_path / "partial.csv").write_text("id,score,pred\nnot-in-embeddings,1.0,0\n")
    shutil.copy(f"{table}.emb.npz", tmp_path / "partial.csv.emb.npz")
    (tmp_path / "nopred.csv").write_text("id,score\nx,1.0\n")
    cases = [
        (["select", str(crafted), "-n", "2", "--diverse"], "crafted.csv.emb.npz"),
        (["select", "-n", "2", "--diverse"], "--embeddings"),
        (["select", str(crafted), "-n", "2", "--per-class", "most"], "--per-class"),
        (["select", str(crafted), "-n", "2", "--exclude", "nothere.txt"], "nothere.txt"),
        (["select", str(crafted), "-n", "2", "--exclude", str(tmp_path / "bad.jsonl")], "line 2"),
        (["select", str(crafted), "-n", "2", "--exclude", str(crafted)], "--exclude"),
        (["select", str(table), "-n", "4", "--diverse", "--diverse-candidates", "2"],
         "--diverse-candidates"),
        (["select", str(tmp_path / "partial.csv"), "-n", "1", "--diverse"], "not-in-embeddings"),
        (["select", str(tmp_path / "nopred.csv"), "-n", "1", "--per-class", "equal"], "pred"),
        (["select", str(table), "-n", "2", "--contact-sheet", str(tmp_path / "s.png"),
          "--image-dir", str(tmp_path)], "--image-dir"),
        (["select", str(table), "-n", "2", "--contact-sheet", str(table / "no" / "s.png")],
         "--contact-sheet"),
        (["select", str(crafted), "-n", "2", "-f", "tsv"], "--format"),
        (["score", str(planted.dir), "-m", str(tmp_path / "headless.pt"), "--arch", "headless:Headless",
          "--trust-checkpoint", "--embeddings", "-o", str(tmp_path / "h.csv"), "-s", "entropy"], "nn.Linear with 3 outputs"),
        (["score", str(planted.dir), "-m", "model.pt", "-c", "config.yaml", "-f", "labelstudio"],
         "labelstudio"),
    ]
    for args, culprit in cases:
        result = runner.invoke(app, args, input="id,score\nx,1\n")
        assert_one_error(result, culprit, f"{args} -> {result.exit_code} {result.stderr!r}")
    assert not (tmp_path / "h.csv").exists()


# --- a real subprocess pipeline ----------------------------------------------------------------------

def test_subprocess_score_embeddings_then_diverse_select(in_ws, planted, table, tmp_path):
    py, out, sheet = sys.executable, tmp_path / "p.csv", tmp_path / "p.png"
    cmd = (f"{py} -m alcli score {planted.dir} -m model.pt -c config.yaml -s entropy -q "
           f"--embeddings -o {out} && {py} -m alcli select {out} -n 5 --diverse --seed 3 "
           f"--contact-sheet {sheet} --image-dir {planted.dir} -f ids")
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "COLUMNS": "100"}
    proc = subprocess.run(cmd, shell=True, capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ids_of(select(table, "-n", 5, "--diverse", "--seed", 3))
    assert len(list(_tiles(sheet, 5))) == 5


def test_paths_from_another_working_directory_open_in_a_shell(tmp_path):
    """`score POOL | select -n 3 -f paths | xargs ls` works where the pool is not under the cwd."""
    repo = Path(__file__).resolve().parents[1]
    pool, model = repo / "data" / "demo" / "pool", repo / "data" / "demo" / "model.pt"
    py = sys.executable
    cmd = (f"{py} -m alcli score {pool} -m {model} --arch alcli.demo:DigitsCNN -s entropy -q "
           f"| {py} -m alcli select -n 3 -f paths | xargs ls")
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    proc = subprocess.run(cmd, shell=True, capture_output=True, text=True, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    listed = proc.stdout.split()
    assert len(listed) == 3 and all(Path(p).is_file() and Path(p).is_relative_to(pool) for p in listed)
