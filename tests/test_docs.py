"""The README and the user guide (docs/) say what runs: every shell example either runs here against
the demo files or is marked as needing files the reader brings; links between the pages resolve;
the README stays a front door (at most 300 lines).

Markers, on the line before a fenced shell block:
  <!-- docs-test: run -->               run here (bash -euo pipefail), from a copy of the demo
  <!-- docs-test: yours: WHAT -->       needs WHAT, which the reader brings: not run
  <!-- docs-test: setup -->             the README's two set-up commands (the second is .ci/run's)
and before a table whose second column holds one command a row and whose last column says `demo`
(run here, like a run block) or `yours`:
  <!-- docs-test: table -->

The examples run in one temporary folder holding a copy of configs/ and data/demo/ (its pool cut to
a few images per class, so that each command costs little more than starting Python), in the
order a reader meets them: the README, then the guide pages in the order the README links them.
`alcli` there is this checkout's alcli, run by a process that imported it once and forks each command
(tests/docs_zygote.py; ALCLI_DOCS_PLAIN=1 runs `python -m alcli` each time instead, some 3 s a
command more). An example that already ran (the same text) does not run twice.
"""
from __future__ import annotations

import csv
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
DOCS = REPO / "docs"
# developer documents, not the user guide: their examples are Python and trees, tested elsewhere
NOT_GUIDE = {"architecture.md", "engine.md", "hostile-inputs-4.md"}
SHELL = ("bash", "sh", "shell", "console")
MARKER = re.compile(r"<!-- docs-test: (run|setup|table|yours: [^>]*\S) -->")
FENCE = re.compile(r"^```(\w*)\s*$")
PER_CLASS = 3  # images of each demo class in the copy the examples run on


def guide_pages() -> list[Path]:
    """The guide's pages in the order the README links them (every page must be linked)."""
    linked = [DOCS / m for m in re.findall(r"\]\(docs/([\w.-]+\.md)\)", README.read_text())]
    order = list(dict.fromkeys(p for p in linked if p.name not in NOT_GUIDE))
    missing = sorted(p.name for p in DOCS.glob("*.md") if p.name not in NOT_GUIDE and p not in order)
    assert not missing, f"guide pages the README does not link: {missing}"
    return order


def documents() -> list[Path]:
    return [README, *guide_pages()]


def examples(path: Path) -> list[tuple[int, str, str]]:
    """(line, marker, text) of each marked shell block and each `demo`/`yours` table row; a shell
    block without a marker is reported with marker None."""
    lines = path.read_text().split("\n")
    found = []
    i = 0
    while i < len(lines):
        fence = FENCE.match(lines[i])
        if fence:
            end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
            if fence.group(1) in SHELL:
                before = next((lines[j] for j in range(i - 1, -1, -1) if lines[j].strip()), "")
                m = MARKER.fullmatch(before.strip())
                kind = m.group(1) if m and m.group(1) != "table" else None
                found.append((i + 1, kind, "\n".join(lines[i + 1:end]) + "\n"))
            i = end + 1
            continue
        if lines[i].strip() == "<!-- docs-test: table -->":
            j = i + 3  # past the header and its |---| line
            while j < len(lines) and lines[j].startswith("|"):
                cells = [c.strip() for c in re.split(r"(?<!\\)\|", lines[j])[1:-1]]
                command = re.search(r"`([^`]+)`", cells[1]).group(1).replace("\\|", "|")
                kind = {"demo": "run", "yours": "yours: see the table"}.get(cells[-1])
                found.append((j + 1, kind, command + "\n"))
                j += 1
            i = j
            continue
        i += 1
    return found


def test_every_shell_example_is_marked_run_or_yours():
    unmarked = [f"{p.relative_to(REPO)}:{line}" for p in documents()
                for line, kind, _ in examples(p) if kind is None]
    assert not unmarked, f"shell examples without a docs-test marker: {unmarked}"
    setups = [text for p in documents() for _, kind, text in examples(p) if kind == "setup"]
    assert [p for p in guide_pages() for _, kind, _ in examples(p) if kind == "setup"] == []
    assert len(setups) == 2  # install and run the demo; install and run the tests
    # .ci/run reads its test command out of the README: run its own extraction on this README
    script = (REPO / ".ci" / "run").read_text()
    awk = re.search(r"test_command=\$\(awk '(.*?)' README\.md\)", script, re.S)
    assert awk, ".ci/run no longer takes its test command from the README"
    ci = subprocess.run(["awk", awk.group(1), str(REPO / "README.md")], capture_output=True,
                        text=True, check=True).stdout.strip()
    assert setups[1].strip() == ci, "the README's test command is not what .ci/run runs"


def test_each_guide_page_starts_with_what_it_is_for():
    for page in guide_pages():
        lines = [line for line in page.read_text().split("\n") if line.strip()]
        assert lines[0].startswith("# "), page.name
        assert lines[1].startswith("**What this page is for:**"), page.name


def test_the_readme_is_a_front_door():
    lines = README.read_text().split("\n")
    assert len(lines) <= 300, f"README.md has {len(lines)} lines"


def slug(heading: str) -> str:
    """A heading's anchor as GitHub makes it: lower case, punctuation dropped, spaces to -."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = re.sub(r"^```.*?^```", "", path.read_text(), flags=re.S | re.M)
    return {slug(h) for h in re.findall(r"^#{1,6} (.+)$", text, re.M)}


def test_links_between_the_readme_and_the_guide_resolve():
    broken = []
    for doc in [*documents(), *(DOCS / n for n in sorted(NOT_GUIDE))]:
        text = re.sub(r"^```.*?^```", "", doc.read_text(), flags=re.S | re.M)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", target):
                continue  # http(s), mailto: not checked here
            file, _, anchor = target.partition("#")
            dest = (doc.parent / file).resolve() if file else doc
            if not dest.exists():
                broken.append(f"{doc.name}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                broken.append(f"{doc.name}: {target} (no such heading)")
    assert not broken, broken


def test_repository_paths_the_pages_name_exist():
    """`benchmarks/results/x.txt`, `tests/test_y.py`, ...: what a page names to read or run."""
    missing = []
    for doc in documents():
        for path in re.findall(r"`((?:alcli|benchmarks|tests|scripts|configs|data)/[^`\s]*)`",
                               doc.read_text()):
            pattern = re.sub(r"\{[^}]*\}", "*", path.rstrip("/"))
            if not list(REPO.glob(pattern)):
                missing.append(f"{doc.name}: {path}")
    assert not missing, missing


def demo_copy(root: Path) -> None:
    """configs/ and data/demo/ under root, the pool cut to PER_CLASS images of each class (the
    manifest to the rows whose image is kept)."""
    shutil.copytree(REPO / "configs", root / "configs")
    demo = root / "data" / "demo"
    demo.mkdir(parents=True)
    for name in ("model.pt", "pool.npz"):
        shutil.copy(REPO / "data" / "demo" / name, demo / name)
    for folder in sorted((REPO / "data" / "demo" / "pool").iterdir()):
        (demo / "pool" / folder.name).mkdir(parents=True)
        for image in sorted(folder.glob("*.png"))[:PER_CLASS]:
            shutil.copy(image, demo / "pool" / folder.name / image.name)
    with open(REPO / "data" / "demo" / "manifest.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    with open(demo / "manifest.csv", "w", newline="") as f:
        w = csv.DictWriter(f, list(rows[0]))
        w.writeheader()
        w.writerows(r for r in rows if (demo / r["path"]).exists())


def test_the_examples_marked_run_run_on_the_demo(tmp_path):
    demo_copy(tmp_path)
    bin_dir = tmp_path / ".bin"
    bin_dir.mkdir()
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
           "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    if os.environ.get("ALCLI_DOCS_PLAIN"):  # each command its own `python -m alcli` (slow)
        (bin_dir / "alcli").write_text(f'#!/bin/sh\nexec "{sys.executable}" -m alcli "$@"\n')
        server = None
    else:  # one process imports alcli once and forks each command (tests/docs_zygote.py)
        sock = Path(tempfile.mkdtemp(prefix="alcli-docs-")) / "s"  # short: AF_UNIX paths <= 107
        zygote = REPO / "tests" / "docs_zygote.py"
        server = subprocess.Popen([sys.executable, str(zygote), str(sock)], env=env,
                                  stdin=subprocess.DEVNULL)
        (bin_dir / "alcli").write_text(
            f'#!/bin/sh\nexec "{sys.executable}" -S "{zygote}" "{sock}" "$@"\n')
        deadline = time.monotonic() + 120
        while not sock.exists():
            assert server.poll() is None and time.monotonic() < deadline, "the zygote did not start"
            time.sleep(0.05)
    (bin_dir / "alcli").chmod(0o755)
    try:
        ran, failed = run_examples(tmp_path, env)
    finally:
        if server:
            sock.unlink()
            server.wait(timeout=30)
            sock.parent.rmdir()
    assert not failed, "\n\n".join(failed)
    assert len(ran) >= 10  # the marker parser found the examples
    # what the examples say they leave behind
    assert len(list((tmp_path / "to-label").glob("*.png"))) >= 10
    assert (tmp_path / "scores.csv.emb.npz").is_file() and (tmp_path / "batch.png").is_file()


def run_examples(root: Path, env: dict) -> tuple[set[str], list[str]]:
    """Each `run` example once, in reading order, from root: (what ran, what failed and how)."""
    ran: set[str] = set()
    failed = []
    for doc in documents():
        for line, kind, text in examples(doc):
            if kind != "run" or text in ran:
                continue
            ran.add(text)
            done = subprocess.run(["bash", "-euo", "pipefail", "-c", text], cwd=root, env=env,
                                  stdin=subprocess.DEVNULL, capture_output=True, text=True,
                                  timeout=300)
            if done.returncode != 0 or "Traceback" in done.stderr:
                failed.append(f"{doc.relative_to(REPO)}:{line} exited {done.returncode}:\n{text}"
                              f"{done.stderr[-2000:]}")
    return ran, failed
