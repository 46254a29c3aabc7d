"""Speed a person can read: below one example a second, seconds per example (summary and
progress) with an ETA; a CPU run estimated past a few minutes announced after its first batch,
with what cuts it."""
from __future__ import annotations

import json

from alcli import terminal
from alcli.score import runner


def test_below_one_example_a_second_the_summary_says_seconds_per_example(capsys):
    r = terminal.Reporter("text")
    r.summary({"examples": 16, "seconds": 1037.0, "per_second": 16 / 1037.0, "device": "cpu",
               "strategy": "egl"}, [])
    err = capsys.readouterr().err
    assert "speed     64.8 s/example" in err and "examples/s" not in err
    r.summary({"examples": 16, "seconds": 8.0, "per_second": 2.0, "device": "cpu"}, [])
    assert "speed     2.0 examples/s" in capsys.readouterr().err


def test_slow_progress_lines_say_seconds_per_example_and_the_eta(capsys):
    lines = terminal._Lines(terminal.Reporter("text"), "scoring")
    lines.start(16)
    lines.done = 1
    lines._line(65.0)
    assert capsys.readouterr().err == "alcli: scoring 1/16 (6%), 65.0 s/ex, eta 16m15s\n"
    lines.done = 15
    lines._line(1.5)
    assert capsys.readouterr().err == "alcli: scoring 15/16 (94%), 10.0 ex/s, eta 0s\n"
    as_json = terminal._Lines(terminal.Reporter("json"), "scoring")
    as_json.start(16)
    as_json.done = 1
    as_json._line(65.0)
    event = json.loads(capsys.readouterr().err)
    assert event["eta_seconds"] == 975.0 and event["per_second"] == round(1 / 65, 2)


def test_a_long_cpu_run_is_announced_with_what_cuts_it():
    note = runner.estimate(65.0, 1, 16, "egl")
    assert note.startswith("on the CPU this run takes about 16 min more (65.0 s per example, 15 examples left)")
    assert "`-s gradnorm`" in note and "`--egl-samples`" in note
    assert "-s loss" in runner.estimate(65.0, 1, 16, "gradnorm")
    assert runner.estimate(11.0, 1, 16, "egl") is None        # 15 x 11 s = 165 s: not long
    assert runner.estimate(65.0, 16, 16, "egl") is None       # nothing left


def test_a_detector_s_first_image_is_timed_alone():
    assert runner.first_alone(8, 3) == [[0], [1, 2, 3], [4, 5, 6], [7]]
    assert runner.first_alone(1, 3) == [[0]] and runner.first_alone(0, 3) == []
