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
from labkit.run.checkpoint import latest_checkpoint

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


def press_once_logged(monkeypatch, step: int) -> list:
    """Send SIGINT (what ■ sends) once the first run has logged `step`, from the log's own
    write: an event, not a poll that a fast run can outpace (the tiny model's 4 steps take
    less than a poll's period once warm). Returns the list the press is recorded in."""
    from labkit.run.log import RunLog

    pressed, append = [], RunLog.append_step

    def append_then_press(self, metrics):
        append(self, metrics)
        if not pressed and metrics["rollout/step"] == step:
            pressed.append(self.dir.name)
            os.kill(os.getpid(), signal.SIGINT)

    monkeypatch.setattr(RunLog, "append_step", append_then_press)
    return pressed


def test_one_stop_ends_the_rerun_cell_and_the_cells_below_run(tiny_profile, capsys, monkeypatch):
    launch, rise, plot = lesson_cells("c08", "rerun-rise", "rerun-plot")
    assert "labkit.launch_many(" in launch and "resume=True" in launch
    namespace = {"labkit": labkit, "PROFILE": "cpu"}
    pressed = press_once_logged(monkeypatch, 0)  # ■, once: later steps log as they are
    run_cell(launch, namespace)  # returns normally: no KeyboardInterrupt
    assert pressed == ["rerun-cpu-n2"]
    said = capsys.readouterr().out
    assert "labkit: 2 runs: 1 stopped (rerun-cpu-n2); 1 not started (rerun-cpu-n4)" in said
    (stopped,) = namespace["reruns"]  # the run not started has no folder
    assert stopped.dir == tiny_profile / "rerun-cpu-n2" and stopped.status["reason"] == "signal"
    assert latest_checkpoint(stopped.dir)[0] == stopped.status["last_step"]  # resumable
    assert not (tiny_profile / "rerun-cpu-n4").exists()

    run_cell(rise, namespace)  # the cells below read what finished
    run_cell(plot, namespace)
    assert namespace["rerun_frame"].run.unique().tolist() == ["rerun-cpu-n2"]
    (row,) = namespace["rise"].itertuples()  # marked stopped, with no rise of its own few steps
    assert row.status == "stopped after step 0" and row.rise != row.rise  # NaN
    assert row.note == "no rise: it has step 0, the windows are steps 0-0 and 3-3"

    run_cell(launch, namespace)  # the cell again: the stopped run goes on, the other starts
    assert "labkit: 2 runs: 2 completed (rerun-cpu-n2, rerun-cpu-n4)" in capsys.readouterr().out
    for run in namespace["reruns"]:
        assert run.status["reason"] == "completed"
        assert run.metrics["rollout/step"].tolist() == [0, 1, 2, 3]  # no step twice
    run_cell(rise, namespace)
    run_cell(plot, namespace)
    table = labkit.analysis.reward_rise(namespace["rerun_frame"])
    assert table.group_size.tolist() == [2, 4] and table.steps.tolist() == [4, 4]
