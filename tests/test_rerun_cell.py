"""Lesson 1.3's rerun cell, stopped with one ■: every run it started is resumable, the cells
below it run on what finished, and running the cell again continues where it stopped.

The cells are the lesson's own code, run in one namespace as a kernel would, with the
profile's config swapped for a tiny model (the CPU profile's runs take minutes a step on a
loaded machine). The stop is the signal ■ sends (SIGINT), sent once the first run has logged
a step: an event, not a time.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

import labkit
import labkit.analysis
import labkit.course.live  # noqa: F401  (the rerun cell draws its live figure)
import labkit.course.profiles as profiles
from labkit.checkpoint import latest_checkpoint

LESSON = Path(__file__).resolve().parents[1] / "notebooks" / "03_group_size.ipynb"


def lesson_cells(*ids: str) -> list[str]:
    cells = {c.get("id"): "".join(c["source"]) for c in json.loads(LESSON.read_text())["cells"]}
    return [cells[i] for i in ids]


def run_cell(source: str, namespace: dict) -> None:
    exec(compile(source, "<cell>", "exec"), namespace)


@pytest.fixture()
def tiny_profile(tiny_cfg, monkeypatch):
    """The CPU profile's reruns, made of the tiny model: 2 and 4 answers, 4 steps each."""
    monkeypatch.setattr(profiles, "config", lambda profile, **changes: tiny_cfg.replace(
        num_rollout=4, run_name=None, **changes))
    monkeypatch.setitem(profiles.RERUN_ANSWERS, "cpu", (2, 4))
    return Path(tiny_cfg.output_dir)


def test_one_stop_ends_the_rerun_cell_and_the_cells_below_run(tiny_profile, capsys):
    launch, rise, plot = lesson_cells("c08", "rerun-rise", "rerun-plot")
    assert "labkit.launch_many(" in launch and "resume=True" in launch
    namespace = {"labkit": labkit, "PROFILE": "cpu"}
    first = profiles.rerun_configs("cpu")[0]
    press = profiles.after_step(first, 0, os.kill, os.getpid(), signal.SIGINT)  # ■
    press.start()
    run_cell(launch, namespace)  # returns normally: no KeyboardInterrupt
    press.cancel()
    assert press.called
    said = capsys.readouterr().out
    assert "labkit: 2 runs: 1 stopped (rerun-cpu-n2); 1 not started (rerun-cpu-n4)" in said
    (stopped,) = namespace["reruns"]  # the run not started has no folder
    assert stopped.dir == tiny_profile / "rerun-cpu-n2" and stopped.status["reason"] == "signal"
    assert latest_checkpoint(stopped.dir)[0] == stopped.status["last_step"]  # resumable
    assert not (tiny_profile / "rerun-cpu-n4").exists()

    run_cell(rise, namespace)  # the cells below read what finished
    run_cell(plot, namespace)
    assert namespace["rerun_frame"].run.unique().tolist() == ["rerun-cpu-n2"]

    run_cell(launch, namespace)  # the cell again: the stopped run goes on, the other starts
    assert "labkit: 2 runs: 2 completed (rerun-cpu-n2, rerun-cpu-n4)" in capsys.readouterr().out
    for run in namespace["reruns"]:
        assert run.status["reason"] == "completed"
        assert run.metrics["rollout/step"].tolist() == [0, 1, 2, 3]  # no step twice
    run_cell(rise, namespace)
    run_cell(plot, namespace)
    table = labkit.analysis.reward_rise(namespace["rerun_frame"])
    assert table.group_size.tolist() == [2, 4] and table.steps.tolist() == [4, 4]
