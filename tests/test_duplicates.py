"""Near-duplicates (alcli/selection/duplicates.py): the groups against a brute-force float64
all-pairs oracle (exact blocks and faiss), select's batch with and without the pass over them on a
table with planted copies, against --exclude and a labeled table, `alcli duplicates`' groups file,
and bad input in one sentence."""
from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from alcli.cli import app
from alcli.files.embeddings import load_embeddings, open_features, save_embeddings
from alcli.selection import duplicates as dup
from cli_errors import assert_one_error
from conftest import parse_csv

runner = CliRunner()
T = 0.9  # the threshold of the oracle tests: every planted cosine is far from it


# --- the oracle ---------------------------------------------------------------------------------

def cosines(x, y) -> np.ndarray:
    """All cosines [N, M] in float64."""
    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
    return (x / np.linalg.norm(x, axis=1, keepdims=True)) @ (y / np.linalg.norm(y, axis=1, keepdims=True)).T


def oracle(x, t, keys, ref=None, ref_keys=()):
    """The groups by the rule, row by row in float64: a labeled row's duplicate joins the most
    similar labeled row; else the group of an earlier row with its key; else the most similar
    earlier first member at or above t; else it starts a group."""
    n = len(x)
    cos = cosines(x, x)
    cref = cosines(x, ref) if ref is not None else np.zeros((n, 0))
    first, sim, exact = list(range(n)), [1.0] * n, [False] * n
    key_first = {k: n + r for r, k in enumerate(ref_keys) if k is not None}

    def cos_to(row, f):
        return cos[row, f] if f < n else cref[row, f - n]
    for row in range(n):
        if cref.shape[1] and cref[row].max() >= t:
            first[row] = n + int(cref[row].argmax())
        elif keys[row] is not None and keys[row] in key_first:
            earlier = key_first[keys[row]]
            first[row] = earlier if earlier >= n else first[earlier]
        else:
            leaders = [j for j in range(row) if first[j] == j and cos[row, j] >= t]
            if leaders:
                first[row] = max(leaders, key=lambda j: cos[row, j])
        if first[row] != row:
            sim[row] = cos_to(row, first[row])
            lead_key = keys[first[row]] if first[row] < n else ref_keys[first[row] - n]
            exact[row] = keys[row] is not None and keys[row] == lead_key
        if keys[row] is not None:
            key_first.setdefault(keys[row], row)
    return np.array(first), np.array(sim), np.array(exact)


def planted(n=90, d=16, seed=0):
    """Features with planted copies: near copies (cosine ~0.999), exact copies, chains, and rows
    at cosine ~0.7 to another (below T); every cosine is checked to be at least 0.03 from T."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, d))
    for a, b in [(0, 3), (0, 7), (5, 6), (10, 40), (11, 80), (20, 21), (20, 22), (30, 31)]:
        x[b] = x[a] + 0.03 * rng.normal(size=d)
    x[50] = x[12]            # an exact copy
    x[60] = x[61] + 0.9 * rng.normal(size=d)   # a loose neighbour, below T
    ref = np.stack([x[15] + 0.02 * rng.normal(size=d), rng.normal(size=d), x[0] * 1.5])
    c = np.concatenate([cosines(x, x)[np.triu_indices(n, 1)], cosines(x, ref).ravel()])
    assert not np.any(np.abs(c - T) < 0.03), "a planted cosine too near the threshold"
    return x.astype(np.float32), ref.astype(np.float32)


@pytest.mark.parametrize("method", ["exact", "faiss"])
def test_groups_match_the_float64_oracle(method):
    x, ref = planted()
    keys = dup.feature_keys(x)
    keys[70] = keys[71] = "same text"   # equal keys whatever their features
    keys[2] = "labeled text"
    ref_keys = [None, "labeled text", None]
    got = dup.groups(x, T, keys=keys, ref=ref, ref_keys=ref_keys, method=method)
    first, sim, exact = oracle(x, T, keys, ref, ref_keys)
    assert got.first.tolist() == first.tolist()
    np.testing.assert_allclose(got.similarity, sim, atol=1e-5)
    assert got.exact.tolist() == exact.tolist()
    # the planted structure, as a person would check it
    assert first[[3, 7, 6, 40, 50, 71, 15, 0]].tolist() == [92, 92, 5, 10, 12, 70, 90, 92]
    assert first[2] == 91 and exact[50] and exact[71] and not exact[3]
    assert got.kept().sum() == len(x) - 13  # 0, 3, 7, 2, 15 of labeled rows; 6, 40, 80, 21, 22, 31, 50, 71


@pytest.mark.parametrize("search", [dup.pairs_exact, dup.pairs_faiss])
def test_pairs_across_block_edges_are_every_pair_above_the_threshold(search):
    x, ref = planted()
    i, j, s = search(x, T, block=7)
    cos = cosines(x, x)
    want = {(a, b) for a, b in zip(*np.nonzero(np.triu(cos, 1) >= T))}
    assert set(zip(i.tolist(), j.tolist())) == want and len(i) == len(want)
    np.testing.assert_allclose(s, cos[i, j], atol=1e-5)
    i, j, s = search(x, T, ref, block=7)
    assert set(zip(i.tolist(), j.tolist())) == set(zip(*np.nonzero(cosines(x, ref) >= T)))


def test_the_features_are_read_through_a_memory_map(tmp_path):
    x, _ = planted()
    path = str(tmp_path / "t.csv.emb.npz")
    save_embeddings(path, [f"r{i}" for i in range(len(x))], np.zeros((len(x), 2)), x)
    ids, b = open_features(path)
    assert isinstance(b, np.memmap) and ids == load_embeddings(path)[0]
    np.testing.assert_array_equal(np.asarray(b), x)


# --- select and `alcli duplicates` on a table with planted copies -------------------------------

N, D = 40, 16
# ranked r00 (best) .. r39; copies of better-ranked rows, cosine ~0.99999 (default threshold 0.998)
COPIES = {"r02": "r00", "r03": "r00", "r05": "r01", "r09": "r04", "r30": "r04"}


def table(folder, name="t.csv", copies=COPIES, text=None):
    """t.csv (id, score, pred) and t.csv.emb.npz with the copies planted; features [N, D]."""
    rng = np.random.default_rng(1)
    ids = [f"r{i:02d}" for i in range(N)]
    x = rng.normal(size=(N, D)).astype(np.float32)
    for copy, of in copies.items():
        x[ids.index(copy)] = x[ids.index(of)] + 1e-3 * rng.normal(size=D)
    lines = ["id,score,pred" + (",text" if text else "")]
    lines += [f"{i},{1 - n / 100:.2f},{n % 2}" + (f",{text[n]}" if text else "")
              for n, i in enumerate(ids)]
    (folder / name).write_text("\n".join(lines) + "\n")
    save_embeddings(str(folder / f"{name}.emb.npz"), ids, rng.random((N, 2)), x)
    return ids, x


def select(folder, *args):
    return runner.invoke(app, ["select", str(folder / "t.csv"), *map(str, args)],
                         catch_exceptions=False)


def batch_ids(result) -> list[str]:
    assert result.exit_code == 0, result.stderr
    return [r["id"] for r in parse_csv(result.stdout)]


def pairs_above(ids, all_ids, x, t=dup.THRESHOLD) -> int:
    take = [all_ids.index(i) for i in ids]
    return int((np.triu(cosines(x[take], x[take]), 1) >= t).sum())


def passed_over(result) -> int | None:
    note = [ln for ln in result.stderr.splitlines() if "passed over" in ln]
    assert len(note) <= 1
    return int(note[0].split("passed over ")[1].split()[0]) if note else None


def test_a_top_batch_passes_over_the_copies_and_says_how_many(tmp_path):
    ids, x = table(tmp_path)
    plain = batch_ids(select(tmp_path, "-n", 8, "--no-diverse", "--no-dedup"))
    assert plain == ids[:8] and pairs_above(plain, ids, x) == 4  # r00~r02~r03, r01~r05
    result = select(tmp_path, "-n", 8, "--no-diverse")
    got = batch_ids(result)
    # the oracle: walk down the ranking, skip a row within T of one kept
    first, _, _ = oracle(x, dup.THRESHOLD, dup.feature_keys(x))
    walk = [i for n, i in enumerate(ids) if first[n] == n][:8]
    assert got == walk and pairs_above(got, ids, x) == 0
    last = ids.index(got[-1])
    assert passed_over(result) == sum(first[n] != n for n in range(last)) == 4
    assert "--no-dedup keeps them" in result.stderr
    quiet = select(tmp_path, "-n", 8, "--no-diverse", "-q")  # a summary line: -q drops it
    assert batch_ids(quiet) == walk and quiet.stderr == ""


@pytest.mark.parametrize("how", [[], ["--per-class", "equal"], ["--diverse-mode", "cluster-margin"],
                                 ["--no-diverse", "--sampling", "power", "--seed", "3"]])
def test_no_batch_holds_two_near_duplicates(tmp_path, how):
    ids, x = table(tmp_path)
    for n in (6, 12, 30):
        got = batch_ids(select(tmp_path, "-n", n, *how))
        assert len(got) == n and pairs_above(got, ids, x) == 0, (how, n)


def test_a_near_duplicate_of_an_excluded_row_is_never_picked(tmp_path):
    ids, x = table(tmp_path)
    (tmp_path / "labeled.txt").write_text("r00\nr04\n")
    result = select(tmp_path, "-n", 8, "--no-diverse", "--exclude", tmp_path / "labeled.txt")
    got = batch_ids(result)
    assert not {"r00", "r02", "r03", "r04", "r09", "r30"} & set(got)
    assert got == ["r01", "r06", "r07", "r08", "r10", "r11", "r12", "r13"]
    assert passed_over(result) == 4  # r02, r03, r09 of labeled rows, r05 of r01
    assert "(1 of a better-ranked row, 3 of a labeled or excluded example" in result.stderr


def test_a_labeled_table_with_embeddings_is_compared_by_content(tmp_path):
    ids, x = table(tmp_path)
    labeled = np.stack([x[ids.index("r06")] * 2.0, np.ones(D, np.float32)])  # r06, scaled: cosine 1
    (tmp_path / "lab.csv").write_text("id,score\nL0,1\nL1,1\n")
    save_embeddings(str(tmp_path / "lab.csv.emb.npz"), ["L0", "L1"], np.zeros((2, 2)), labeled)
    result = select(tmp_path, "-n", 8, "--no-diverse", "--exclude", tmp_path / "lab.csv")
    got = batch_ids(result)
    assert "r06" not in got and pairs_above(got, ids, x) == 0
    assert "1 of a labeled or excluded example" in result.stderr
    # without the check the file names no row of the table: the exclusions' own error
    off = select(tmp_path, "-n", 8, "--no-dedup", "--exclude", tmp_path / "lab.csv")
    assert_one_error(off, "lab.csv", "no row named")


def test_the_threshold_is_the_one_given(tmp_path):
    ids, x = table(tmp_path)
    t = 0.5  # random rows in 16 dimensions: a few pairs above it, none near it
    assert not np.any(np.abs(cosines(x, x) - t) < 1e-3)
    loose = batch_ids(select(tmp_path, "-n", 10, "--no-diverse", "--dedup-threshold", t))
    first, _, _ = oracle(x, t, dup.feature_keys(x))
    assert loose == [i for n, i in enumerate(ids) if first[n] == n][:10]
    assert pairs_above(loose, ids, x, t) == 0
    assert loose != batch_ids(select(tmp_path, "-n", 10, "--no-diverse"))


def test_duplicates_lists_the_groups(tmp_path):
    text = [f"text {n}" for n in range(N)]
    text[20], text[21] = "Hello   World", "hello world"  # other features, the same normalized text
    ids, x = table(tmp_path, text=text, copies={**COPIES, "r25": "r07"})
    x_exact = x.copy()
    out = tmp_path / "groups.csv"
    done = runner.invoke(app, ["duplicates", str(tmp_path / "t.csv"), "-o", str(out)])
    assert done.exit_code == 0, done.stderr
    rows = parse_csv(out.read_text())
    keys = [dup.text_key(t) for t in text]
    first, sim, exact = oracle(x_exact, dup.THRESHOLD, keys)
    want = []
    for lead in sorted({int(f) for n, f in enumerate(first) if f != n}):
        want.append((ids[lead], 1.0, "first"))
        want += [(ids[n], round(float(sim[n]), 4), "exact" if exact[n] else "near")
                 for n in range(N) if first[n] == lead and n != lead]
    got = [(r["id"], round(float(r["similarity"]), 4), r["kind"]) for r in rows]
    assert got == want
    assert [r["group"] for r in rows] == ["1", "1", "1", "2", "2", "3", "3", "3", "4", "4", "5", "5"]
    assert ("r21", "exact") in {(r["id"], r["kind"]) for r in rows}
    assert "wrote 5 groups" in done.stderr


def test_duplicates_with_labeled_rows_starts_their_groups(tmp_path):
    table(tmp_path)
    (tmp_path / "labeled.txt").write_text("r04\n")
    done = runner.invoke(app, ["duplicates", str(tmp_path / "t.csv"), "--exclude",
                               str(tmp_path / "labeled.txt")])
    rows = parse_csv(done.stdout)
    group = [(r["id"], r["kind"]) for r in rows if r["group"] == "3"]
    assert group == [("r04", "labeled"), ("r09", "near"), ("r30", "near")]


# --- without embeddings, and bad input ----------------------------------------------------------

def test_a_table_without_embeddings_is_selected_as_before_said_once(tmp_path):
    table(tmp_path)
    (tmp_path / "t.csv.emb.npz").unlink()
    result = select(tmp_path, "-n", 8, "--no-diverse")
    assert batch_ids(result) == [f"r{i:02d}" for i in range(8)]
    notes = [ln for ln in result.stderr.splitlines() if "near-duplicate" in ln]
    assert len(notes) == 1 and "t.csv.emb.npz" in notes[0]
    quiet = select(tmp_path, "-n", 8, "--no-diverse", "--no-dedup")
    assert quiet.stderr == ""
    default = select(tmp_path, "-n", 8)  # the diverse batch's note says the file is missing: once
    assert sum("t.csv.emb.npz" in ln for ln in default.stderr.splitlines()) == 1


def test_bad_input_is_one_sentence(tmp_path):
    ids, x = table(tmp_path)
    t = str(tmp_path / "t.csv")
    emb = tmp_path / "t.csv.emb.npz"
    # a file of another run than the table
    (tmp_path / "t.csv.meta.json").write_text(json.dumps({"run_id": "run-a"}))
    save_embeddings(str(emb), ids, np.zeros((N, 2)), x, run_id="run-b")
    assert_one_error(runner.invoke(app, ["duplicates", t]), "another run", "run ids")
    assert_one_error(select(tmp_path, "-n", 3, "--no-diverse", "--embeddings", emb), "another run",
                     "--embeddings of another run")
    (tmp_path / "t.csv.meta.json").unlink()
    # a row the file lacks
    save_embeddings(str(emb), ids[:-1], np.zeros((N - 1, 2)), x[:-1])
    assert_one_error(runner.invoke(app, ["duplicates", t]), "'r39'", "a row without")
    assert_one_error(select(tmp_path, "-n", 3, "--no-diverse", "--dedup"), "'r39'", "a row without")
    warned = select(tmp_path, "-n", 3, "--no-diverse")  # not asked for: said, and the top rows
    assert batch_ids(warned) == ids[:3] and "'r39' has no embedding" in warned.stderr
    # not an embeddings file; none at all
    emb.write_bytes(b"PK\x03\x04 not a zip")
    assert_one_error(runner.invoke(app, ["duplicates", t]), str(emb), "garbage")
    assert_one_error(select(tmp_path, "-n", 3, "--no-diverse"), str(emb), "garbage")
    emb.unlink()
    assert_one_error(runner.invoke(app, ["duplicates", t]), str(emb), "no file")
    assert_one_error(select(tmp_path, "-n", 3, "--embeddings", tmp_path / "none.npz"),
                     "none.npz", "--embeddings missing")
    # a labeled table of another model (other width)
    save_embeddings(str(emb), ids, np.zeros((N, 2)), x)
    (tmp_path / "lab.csv").write_text("id,score\nL0,1\n")
    save_embeddings(str(tmp_path / "lab.csv.emb.npz"), ["L0"], np.zeros((1, 2)), np.ones((1, 3)))
    assert_one_error(select(tmp_path, "-n", 3, "--exclude", tmp_path / "lab.csv"),
                     "lab.csv.emb.npz", "width")
    assert_one_error(select(tmp_path, "-n", 3, "--dedup-threshold", "1.5"), "dedup", "threshold")
    assert_one_error(runner.invoke(app, ["duplicates", t, "-o", t]), t, "output over the input")


def test_a_pool_with_fewer_distinct_rows_than_asked_fills_the_batch_and_says_so(tmp_path):
    """Features that barely vary (an untrained model's) make most rows near-duplicates: the batch
    still holds -n rows, the distinct ones first and then the best-ranked of those passed over."""
    copies = {f"r{i:02d}": "r00" for i in range(1, N) if i not in (7, 20)}  # 3 distinct rows
    ids, x = table(tmp_path, copies=copies)
    result = select(tmp_path, "-n", 6, "--no-diverse")
    got = batch_ids(result)
    assert got == ["r00", "r01", "r02", "r03", "r07", "r20"]  # rank order: r00, r07, r20 + r01-r03
    said = " ".join(result.stderr.split())
    assert "only 3 rows are not near-duplicates" in said and "takes 3 near-duplicates to reach" in said
