"""Per-class quotas, per-class selection and exclusions on crafted pools with known answers."""
import json
from fractions import Fraction

import pytest

from alcli.selection.balance import per_class_quota
from alcli.selection.choose import choose
from alcli.selection.exclusions import ExclusionsError, read_exclusions


def test_proportional_quotas_exact():
    assert per_class_quota({0: 50, 1: 30, 2: 20}, 10) == {0: 5, 1: 3, 2: 2}
    # ideal 3.5, 2.1, 1.4 -> floors 3, 2, 1; the one unit left goes to the largest remainder (0.5)
    assert per_class_quota({0: 50, 1: 30, 2: 20}, 7) == {0: 4, 1: 2, 2: 1}
    # ideal 0.75 each of 4 classes with budget 3: equal remainders -> class order
    assert per_class_quota({"dog": 5, "cat": 5, "ant": 5, "bee": 5}, 3) == \
        {"ant": 1, "bee": 1, "cat": 1, "dog": 0}
    assert per_class_quota({2: 10, 10: 10}, 1) == {2: 1, 10: 0}  # numeric order, not "10" < "2"
    assert per_class_quota({0: 3, 1: 0, 2: 1}, 100) == {0: 3, 1: 0, 2: 1}  # budget > pool
    assert per_class_quota({0: 3, 1: 1}, 0) == {0: 0, 1: 0}


def test_proportional_quota_matches_fraction_oracle():
    # Hamilton's method with exact fractions, written independently.
    counts = {0: 997, 1: 13, 2: 251, 3: 1, 4: 64, 5: 640}
    total = sum(counts.values())
    for budget in (1, 2, 7, 50, 333, 1000, total):
        ideal = {c: Fraction(budget * n, total) for c, n in counts.items()}
        q = {c: int(v) for c, v in ideal.items()}
        rest = sorted(counts, key=lambda c: (-(ideal[c] - q[c]), c))[:budget - sum(q.values())]
        for c in rest:
            q[c] += 1
        assert per_class_quota(counts, budget) == q
        assert sum(q.values()) == budget


def test_equal_quotas_redistribute_what_small_classes_lack():
    assert per_class_quota({0: 100, 1: 100, 2: 100}, 30, "equal") == {0: 10, 1: 10, 2: 10}
    # 31/3 -> 11,10,10; class 1 has only 2 -> the 29 left split over {0, 2} -> 15, 14
    assert per_class_quota({0: 100, 1: 2, 2: 100}, 31, "equal") == {0: 15, 1: 2, 2: 14}
    # two tiny classes saturate in the same round, then the big one takes the rest
    assert per_class_quota({"a": 1, "b": 1, "c": 10}, 9, "equal") == {"a": 1, "b": 1, "c": 7}
    # a class with no examples gets nothing and does not absorb budget
    assert per_class_quota({0: 0, 1: 5, 2: 5}, 4, "equal") == {0: 0, 1: 2, 2: 2}
    with pytest.raises(ValueError, match="unknown per-class mode"):
        per_class_quota({0: 1}, 1, "fair")
    with pytest.raises(ValueError, match="budget"):
        per_class_quota({0: 1}, -1)


def _pool():
    rows = []
    for cls, n in (("cat", 6), ("dog", 3), ("eel", 1)):
        for j in range(n):
            rows.append({"id": f"{cls}{j}", "score": 1.0 - 0.1 * j, "pred": cls})
    rows.append({"id": "cat9", "score": 1.0, "pred": "cat"})  # ties cat0 on score; id breaks it
    return rows


def test_choose_per_class_exact():
    rows = _pool()  # counts: cat 7, dog 3, eel 1
    got = choose(rows, 5, per_class="proportional")   # ideal 3.18, 1.36, 0.45 -> 3, 1, 1
    assert [r["id"] for r in got] == ["cat0", "cat9", "dog0", "eel0", "cat1"]
    got = choose(rows, 6, per_class="equal")           # 2,2,2 -> eel has 1 -> 5 over cat,dog: 3,2
    assert [r["id"] for r in got] == ["cat0", "cat9", "dog0", "eel0", "cat1", "dog1"]
    assert choose(list(reversed(rows)), 6, per_class="equal") == got  # independent of row order
    with pytest.raises(ValueError, match="row 'b' has no 'pred'"):
        choose([{"id": "a", "score": 1, "pred": 0}, {"id": "b", "score": 1}], 1, per_class="equal")


def test_read_exclusions_all_formats(tmp_path):
    (tmp_path / "labeled.csv").write_text("path,id,label\nx/1.png,a.png,cat\nx/2.png, b.png ,dog\n\n")
    (tmp_path / "noid.csv").write_text("path,label\nc.png,cat\n\"d,1.png\",dog\n")
    (tmp_path / "queued.jsonl").write_text('{"id": "e.png", "score": 1}\n\n{"id": 7}\n')
    (tmp_path / "tasks.json").write_text(json.dumps(["f.png", {"id": "g.png"}]))
    (tmp_path / "paths.txt").write_text("h.png\n\n  dir/i.png  \n")
    got = read_exclusions(str(tmp_path / f) for f in
                          ("labeled.csv", "noid.csv", "queued.jsonl", "tasks.json", "paths.txt"))
    assert got == {"a.png", "b.png", "c.png", "d,1.png", "e.png", "7", "f.png", "g.png", "h.png",
                   "dir/i.png"}
    (tmp_path / "empty.csv").write_text("")
    assert read_exclusions([str(tmp_path / "empty.csv")]) == set()


@pytest.mark.parametrize("name,text,message", [
    ("bad.jsonl", '{"id": "a"}\n{"id": \n', r"bad\.jsonl, line 2: not valid JSON"),
    ("noid.jsonl", '{"id": "a"}\n{"path": "b"}\n', r"noid\.jsonl, line 2: expected an object"),
    ("short.csv", "id,label\na,cat\n,dog\n", r"short\.csv, line 3: no value in column 'id'"),
    ("obj.json", '{"id": "a"}', r"obj\.json must hold a JSON array"),
    ("broken.json", "[1, 2", r"broken\.json is not valid JSON"),
])
def test_read_exclusions_errors_name_the_file(tmp_path, name, text, message):
    (tmp_path / name).write_text(text)
    with pytest.raises(ExclusionsError, match=message):
        read_exclusions([str(tmp_path / name)])


def test_read_exclusions_unreadable(tmp_path):
    with pytest.raises(ExclusionsError, match=r"cannot read exclusions file .*gone\.csv"):
        read_exclusions([str(tmp_path / "gone.csv")])
    (tmp_path / "bin.txt").write_bytes(b"\xff\xfe\x00bad")
    with pytest.raises(ExclusionsError, match=r"bin\.txt"):
        read_exclusions([str(tmp_path / "bin.txt")])
    assert issubclass(ExclusionsError, ValueError)


def test_exclusions_then_per_class():
    excluded = {"cat0", "cat9", "eel0", "not-in-pool"}
    kept = [r for r in _pool() if r["id"] not in excluded]
    got = choose(kept, 4, per_class="equal")  # cat 5, dog 3 -> 2, 2
    assert [r["id"] for r in got] == ["dog0", "cat1", "dog1", "cat2"]
