"""Three labeling rounds on every path a table takes (a file, a pipe, shards and merge, --resume,
torchrun): each round's batch is diverse (at most one of each planted near-duplicate group, where
the plain top N takes copies), or the one warning says why it is not; no id is chosen twice."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from alcli.cli import app
from conftest import parse_csv
from test_select_cli import Planted

runner = CliRunner()
ROUNDS, BUDGET = 3, 3
NOT_DIVERSE = "selected the best scores without --diverse"


@pytest.fixture(scope="module")
def planted(workspace, tmp_path_factory):
    return Planted(workspace, tmp_path_factory.mktemp("planted"))


def cli(*args, input=None):
    result = runner.invoke(app, [str(a) for a in args], input=input)
    assert result.exit_code == 0, result.stderr + result.stdout
    return result


def scoring(ws, planted) -> list[str]:
    return [planted.dir, "-m", "model.pt", "-c", ws.config, "-s", "entropy", "-q"]


def select(table, labeled: Path, input=None):
    """`alcli select TABLE -n BUDGET --exclude labeled.csv` (TABLE '-': the table on stdin)."""
    return cli("select", table, "-n", BUDGET, "--exclude", labeled, input=input)


def three_rounds(tmp_path: Path, planted, one_round) -> list[str]:
    """Run `one_round(round, labeled.csv) -> select's result` three times, labeling each batch;
    check every batch is diverse and new. Returns the ids chosen, in order."""
    tmp_path.mkdir(exist_ok=True)
    labeled = tmp_path / "labeled.csv"
    labeled.write_text("id\n")
    chosen: list[str] = []
    for r in range(ROUNDS):
        result = one_round(r, labeled)
        assert NOT_DIVERSE not in result.stderr, f"round {r}: {result.stderr}"
        batch = [row["id"] for row in parse_csv(result.stdout)]
        groups = [planted.group.get(i) for i in batch if planted.group.get(i) is not None]
        assert len(batch) == BUDGET and len(groups) == len(set(groups)), f"round {r}: {batch}"
        assert not set(batch) & set(chosen), f"round {r} chose again: {set(batch) & set(chosen)}"
        chosen += batch
        labeled.write_text("id\n" + "".join(f"{i}\n" for i in chosen))
    return chosen


def test_the_plain_top_n_takes_copies(in_ws, planted, tmp_path):
    """What the rounds below guard against: without embeddings, copies of one group."""
    table = tmp_path / "t.csv"
    cli("score", *scoring(in_ws, planted), "-o", table, "--no-embeddings")
    result = cli("select", table, "-n", BUDGET)
    assert NOT_DIVERSE in result.stderr and result.stderr.count("warning") == 1
    groups = [planted.group[r["id"]] for r in parse_csv(result.stdout)]
    assert len(set(groups)) < len(groups)


def test_three_rounds_from_a_table_file(in_ws, planted, tmp_path):
    def one_round(r, labeled):
        table = tmp_path / f"round{r}.csv"
        cli("score", *scoring(in_ws, planted), "-o", table)
        return select(table, labeled)
    file_batches = three_rounds(tmp_path, planted, one_round)

    def piped(r, labeled):  # alcli score POOL | alcli select -n N
        table = cli("score", *scoring(in_ws, planted)).stdout
        return select("-", labeled, input=table)
    assert three_rounds(tmp_path / "pipe", planted, piped) == file_batches


def test_three_rounds_from_shards_and_merge(in_ws, planted, tmp_path):
    def one_round(r, labeled):
        parts = [tmp_path / f"r{r}-part{k}.csv" for k in range(2)]
        for k, part in enumerate(parts):
            cli("score", *scoring(in_ws, planted), "--shard", f"{k}/2", "-o", part)
        if r == 1:  # merged into a pipe
            return select("-", labeled, input=cli("merge", *parts, "-q").stdout)
        merged = tmp_path / f"r{r}.csv"
        cli("merge", *parts, "-o", merged, "-q")
        assert Path(f"{merged}.emb.npz").is_file()
        return select(merged, labeled)
    three_rounds(tmp_path, planted, one_round)


def test_three_rounds_with_resume(in_ws, planted, tmp_path):
    """--resume, starting fresh or continuing a run stopped by an unreadable example (--strict)."""
    pool = tmp_path / "pool"
    pool.mkdir()
    for name in planted.group:
        (pool / name).write_bytes((planted.dir / name).read_bytes())
    args = [a if a != planted.dir else pool for a in scoring(in_ws, planted)]

    def one_round(r, labeled):
        table = tmp_path / f"round{r}.csv"
        if r == 1:  # stopped part way (after the g*.png files), then resumed
            broken = pool / "m99.png"
            broken.write_bytes(b"not an image yet")
            stopped = runner.invoke(app, ["score", *map(str, args), "-o", str(table), "--strict",
                                          "-b", "4"])
            assert stopped.exit_code == 1 and "m99.png" in stopped.stderr
            assert Path(f"{table}.partial").read_text().count("\n") == 1 + 24  # header, g*.png
            broken.write_bytes((planted.dir / "s00.png").read_bytes())
            cli("score", *args, "-o", table, "--resume", "-b", "4")
        else:
            cli("score", *args, "-o", table, "--resume")
        return select(table, labeled)
    three_rounds(tmp_path, planted, one_round)


def test_three_rounds_under_torchrun(in_ws, planted, tmp_path):
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1"}

    def one_round(r, labeled):
        table = "-" if r == 1 else str(tmp_path / f"round{r}.csv")
        args = [str(a) for a in scoring(in_ws, planted) if a != "-q"]
        done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                               "--nproc-per-node", "2", "-m", "alcli", "score", *args, "-o", table,
                               "--log-format", "json"],
                              cwd=in_ws.root, env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        summary = [json.loads(line) for line in done.stderr.splitlines()
                   if line.startswith('{"event": "summary"')]
        assert len(summary) == 1, done.stderr  # rank 0 speaks for the run: all ranks' rows
        examples, speed, seconds = (summary[0][k] for k in ("examples", "per_second", "seconds"))
        assert examples == len(planted.group) and speed * seconds == pytest.approx(examples)
        return select(table, labeled, input=done.stdout if table == "-" else None)
    three_rounds(tmp_path, planted, one_round)
