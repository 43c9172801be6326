"""labkit.course.live: the rerun cell's reward curves, redrawn from the runs' logs as they grow."""

from __future__ import annotations

import json
import queue
import sys
from pathlib import Path

import pytest

from labkit.course import live

sys.path.insert(0, str(Path(__file__).resolve().parent))
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
