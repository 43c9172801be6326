"""labkit.course.live: the rerun cell's reward curves, redrawn from the runs' logs as they grow."""

from __future__ import annotations

import json
import queue
import sys
from pathlib import Path

import pytest

from labkit.course import live

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_rerun_cell import lesson_cells, press_once_logged  # noqa: E402
from waiting import DEADLINE_S  # noqa: E402


def drawn_steps(figure) -> int:
    """The points the figure draws, over all its lines: the steps it shows."""
    return sum(len(line.get_xdata()) for ax in figure.axes for line in ax.get_lines())


def log_steps(folder: Path, steps: range) -> None:
    """Append one metrics line per step to a fake run's log, as a run does after each step."""
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "metrics.jsonl", "a") as f:
        f.write("".join(json.dumps({"rollout/step": s, "rollout/raw_reward": 0.1 * s}) + "\n"
                        for s in steps))


def next_figure(shown: queue.Queue, steps: int):
    """The first figure shown that draws `steps` steps; fails at the deadline."""
    while True:
        figure = shown.get(timeout=DEADLINE_S)  # an event with a deadline, not a sleep
        if drawn_steps(figure) >= steps:
            assert drawn_steps(figure) == steps
            return figure


def test_the_figure_grows_as_the_run_log_grows(tmp_path):
    a, b = tmp_path / "rerun-n2", tmp_path / "rerun-n8"
    shown: queue.Queue = queue.Queue()
    curves = live.LiveCurves([a, b], every_s=0.01, steps=12, show=shown.put)
    with curves:
        first = next_figure(shown, 0)  # drawn at once: nothing logged yet
        assert [t.get_text() for t in first.axes[0].get_legend().get_texts()] == [
            "rerun-n2: no step yet", "rerun-n8: no step yet"]
        log_steps(a, range(0, 1))
        next_figure(shown, 1)
        log_steps(a, range(1, 3))
        log_steps(b, range(0, 2))
        grown = next_figure(shown, 5)
    assert [t.get_text() for t in grown.axes[0].get_legend().get_texts()] == [
        "rerun-n2: 3 steps", "rerun-n8: 2 steps"]
    assert grown.axes[0].get_xlim() == (-0.5, 11.5)  # the 12 steps planned
    assert not curves._thread.is_alive()


def test_an_interrupt_stops_the_thread_and_the_last_figure_has_every_step(tmp_path):
    shown: list = []
    with pytest.raises(KeyboardInterrupt):
        with live.LiveCurves([tmp_path / "r"], every_s=60.0, show=shown.append) as curves:
            log_steps(tmp_path / "r", range(4))  # logged between two redraws
            raise KeyboardInterrupt  # ■, in the main thread
    assert not curves._thread.is_alive()
    assert drawn_steps(shown[-1]) == 4 and curves.drawn_steps == 4


def test_a_redraw_comes_only_when_a_log_grew(tmp_path):
    shown: list = []
    curves = live.LiveCurves([tmp_path / "r"], show=shown.append)
    log_steps(tmp_path / "r", range(2))
    curves.redraw()
    curves.redraw()  # nothing new: no figure
    assert len(shown) == 1


def test_reward_curves_finds_the_rerun_folders_before_they_exist(tiny_cfg):
    configs = [tiny_cfg.replace(n_samples_per_prompt=n, global_batch_size=2 * n,
                                run_name=f"rerun-n{n}") for n in (2, 4)]
    curves = live.reward_curves(configs)
    assert curves.run_dirs == [Path(tiny_cfg.output_dir) / "rerun-n2",
                               Path(tiny_cfg.output_dir) / "rerun-n4"]
    assert curves.planned == tiny_cfg.num_rollout
    assert curves.labels[curves.run_dirs[0]] == "2 answers"
    with pytest.raises(ValueError, match="named runs"):
        live.reward_curves([tiny_cfg.replace(run_name=None)])


def write_status(folder: Path, **status) -> None:
    """A run folder's config.json (empty: enough to be a run) and status.json, as a run ends."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text("{}")
    (folder / "status.json").write_text(json.dumps(status))


def legend(figure) -> list[str]:
    return [t.get_text() for t in figure.axes[0].get_legend().get_texts()]


def test_the_last_figure_is_final_and_says_how_each_run_ended(tmp_path):
    """Once the cell's runs are over the figure no longer says "live ... so far": its title
    says it is what was logged when the cell ended, and each run's legend how it ended."""
    done, stopped, later = tmp_path / "n2", tmp_path / "n8", tmp_path / "n16"
    shown: list = []
    with live.LiveCurves([done, stopped, later], every_s=60.0, show=shown.append):
        log_steps(done, range(4))
        write_status(done, reason="completed", last_step=3)
        log_steps(stopped, range(2))
        write_status(stopped, reason="signal", last_step=1)
    title = shown[-1].axes[0].get_title(loc="left")
    assert title == "Reward per step: the 6 steps logged when the cell ended"
    assert "live" not in title and "so far" not in title
    assert legend(shown[-1]) == ["n2: 4 steps, completed", "n8: 2 steps, stopped after step 1",
                                 "n16: no step, not started"]
    assert all("live" in f.axes[0].get_title(loc="left") for f in shown[:-1])


@pytest.fixture()
def tiny_reruns(tiny_cfg, monkeypatch):
    """The cpu profile's reruns made of the tiny model: 2 and 4 answers, 4 steps each."""
    import labkit.course.profiles as profiles

    monkeypatch.setattr(profiles, "config", lambda profile, **changes: tiny_cfg.replace(
        num_rollout=4, run_name=None, **changes))
    monkeypatch.setitem(profiles.RERUN_ANSWERS, "cpu", (2, 4))


def test_a_refused_rerun_is_one_line_with_the_way_in_the_cell_and_no_old_figure(
        tiny_reruns, monkeypatch):
    """The rerun cell with another seed, where its folders hold runs of the old one: the
    refusal is one line that says how to run them from the cell, and the figure drawn of
    the old runs is taken away. rerun_configs(PROFILE, seed=...) then names runs of their own."""
    import labkit
    import labkit.course.profiles as profiles

    for old in profiles.rerun_configs("cpu"):  # the runs of the last launch, of seed 7
        log_steps(Path(old.output_dir) / old.run_name, range(2))
        (Path(old.output_dir) / old.run_name / "config.json").write_text(json.dumps(old.to_dict()))
    shown: list = []
    monkeypatch.setattr(live, "_display_handle", lambda: shown.append)
    (cell,) = lesson_cells("c08")  # the rerun cell, as a student edits it for another seed
    cell = cell.replace("configs = labkit.course.profiles.rerun_configs(PROFILE)", "configs = [c.replace("
                        "seed=2) for c in labkit.course.profiles.rerun_configs(PROFILE)]")
    assert "c.replace(seed=2)" in cell
    namespace = {"labkit": labkit, "PROFILE": "cpu", "reruns": "the last launch's"}
    with pytest.raises(live.RerunRefused) as refused:
        exec(compile(cell, "<cell>", "exec"), namespace)
    (line,) = refused.value._render_traceback_()
    assert "\n" not in line and line.startswith("RerunRefused: ")
    assert "rerun-cpu-n2 holds a run of another config (--seed: folder has 7, given 2)" in line
    assert ("configs = labkit.course.profiles.rerun_configs(PROFILE, seed=2) runs them under names "
            "of their own (rerun-cpu-n2-seed2, ...)") in line
    assert "the cells below read the runs it launched last" in line
    assert drawn_steps(shown[0]) == 4 and shown[-1] is None  # the old runs' figure, taken away
    assert namespace["reruns"] == "the last launch's"
    renamed = profiles.rerun_configs("cpu", seed=2)
    assert [c.run_name for c in renamed] == ["rerun-cpu-n2-seed2", "rerun-cpu-n4-seed2"]
    assert [c.seed for c in renamed] == [2, 2]


def test_a_stop_in_the_rerun_cell_says_how_the_cell_resumes_not_a_cfg_it_lacks(
        tiny_reruns, capsys, monkeypatch):
    """■ during the rerun cell, in a notebook: the stop line and the bar name the resume of
    launch_many, the cell's own call, not labkit.launch(cfg, ...): lesson 1.3 has no `cfg`."""
    import labkit
    import labkit.run.progress

    monkeypatch.setattr(labkit.run.progress, "in_notebook", lambda: True)
    (launch,) = lesson_cells("c08")
    pressed = press_once_logged(monkeypatch, 0)
    exec(compile(launch, "<cell>", "exec"), {"labkit": labkit, "PROFILE": "cpu"})
    assert pressed == ["rerun-cpu-n2"]
    said = capsys.readouterr().out
    kept = next(line for line in said.splitlines() if "checkpoint after step 0 kept in" in line)
    assert "launch_many(..., resume=True) continues the run" in kept, kept
    assert "labkit.launch(cfg" not in said and "resume=run.dir" not in said
    assert labkit.run.progress.RESUME_HOW.get() is None  # labkit.launch's words again after
