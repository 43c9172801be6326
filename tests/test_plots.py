"""Tests for labkit.analysis.plots: each figure renders headless, reads right, and saves as PNG and SVG."""

from __future__ import annotations

import matplotlib
import pandas as pd
import pytest
from fixtures_runs import CLEAN_N4, write_course_runs
from matplotlib.collections import PolyCollection

from labkit import analysis
from labkit.analysis import plots


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return analysis.load_runs(write_course_runs(tmp_path_factory.mktemp("course")))


def labelled(fig) -> None:
    """Every axes has both labels, each with a unit in parentheses, and the figure a title."""
    assert fig._suptitle is not None and fig._suptitle.get_text()
    for ax in fig.axes:
        if ax.get_xlabel() or ax is fig.axes[-1]:
            assert "(" in ax.get_xlabel()
        assert "(" in ax.get_ylabel() and ")" in ax.get_ylabel()


def test_headless_backend():
    assert matplotlib.get_backend().lower() == "agg"


def test_reward_curve(runs):
    fig = plots.reward_curve(runs)
    labelled(fig)
    ax = fig.axes[0]
    # the seeds of 8 answers are one min-max band; 4 and 16 answers have one run each
    bands = [c for c in ax.collections if isinstance(c, PolyCollection)
             and "min-max" in str(c.get_label())]
    assert [b.get_label() for b in bands] == ["8 answers: min-max of 3 seeds"]
    labels = [line.get_label() for line in ax.get_lines()]
    assert "8 answers: mean of 3 seeds" in labels
    assert "16 answers (1 run, seed 1234)" in labels
    texts = " ".join(t.get_text() for t in ax.texts)
    assert "steps 0-7" in texts and "steps 16-23" in texts


def test_reward_curve_by_learning_rate(runs):
    probe = runs[runs.group_size == 8].copy()
    probe["lr"] = probe.seed.map({s: lr for s, lr in zip(sorted(probe.seed.unique()), (1e-6, 1e-5, 1e-5))})
    labels = [line.get_label() for line in plots.reward_curve(probe, by="lr").axes[0].get_lines()]
    assert any(label.startswith("lr 1e-06 (1 run") for label in labels)
    assert "lr 1e-05: mean of 2 seeds" in labels


def test_reward_curve_by_prompts_per_rollout(runs):
    sweep = runs[runs.group_size == 8].copy()
    sweep["prompts"] = sweep.seed.map(dict(zip(sorted(sweep.seed.unique()), (16, 32, 64))))
    labels = [line.get_label() for line in plots.reward_curve(sweep, by="prompts").axes[0].get_lines()]
    assert [label.split(" (")[0] for label in labels if "(1 run" in label] == \
        ["16 prompts", "32 prompts", "64 prompts"]


def test_reward_curve_windows_follow_arguments(runs):
    ax = plots.reward_curve(runs, early=(0, 3), late=(20, 23)).axes[0]
    assert "steps 0-3" in " ".join(t.get_text() for t in ax.texts)


def test_a_short_run_fills_its_own_axis(runs):
    """A 1.1-style CPU run: the axis spans its steps, and a window shows once it is reached."""
    short = runs[(runs.run == "n8-seed1") & (runs["rollout/step"] <= 11)]
    fig = plots.reward_curve(short)
    ax = fig.axes[0]
    assert ax.get_xlim() == (-0.5, 11.5)
    texts = " ".join(t.get_text() for t in ax.texts)
    assert "steps 0-7" in texts and "steps 16-23" not in texts
    assert "shaded once reached" in fig._suptitle.get_text()
    one = plots.reward_curve(runs[(runs.run == "n8-seed1") & (runs["rollout/step"] == 0)]).axes[0]
    assert one.get_xlim() == (-0.5, 0.5) and not one.texts
    assert [t for t in one.get_xticks() if -0.5 <= t <= 0.5] == [0]  # one whole-number tick
    assert plots.zero_std_curve(short).axes[0].get_xlim() == (-0.5, 11.5)


def test_constructed_runs_are_labelled(runs):
    made_up = runs[runs.run == "n8-seed2"].assign(run="constructed-n8-heat")
    both = pd.concat([runs[runs.run == "n8-seed1"], made_up], ignore_index=True)
    fig = plots.rollout_time_curve(both)
    assert "CONSTRUCTED (made up, not measured): constructed-n8-heat" in fig.axes[0].get_title(loc="left")
    panels = " ".join(t.get_text() for ax in fig.axes for t in ax.texts)
    assert "CONSTRUCTED (made up) constructed-n8-heat" in panels
    assert "CONSTRUCTED" not in plots.reward_curve(runs).axes[0].get_title(loc="left")


def test_rollout_time_curve(runs):
    fig = plots.rollout_time_curve(runs)
    labelled(fig)
    assert len(fig.axes) == runs.run.nunique()  # one panel per run
    panel_text = [ax.texts[0].get_text() for ax in fig.axes]
    assert any("median 32.5 s on the 14 common clean steps" in t for t in panel_text)
    assert any("no clean step: median 188.2 s includes the pauses" in t for t in panel_text)
    n4 = fig.axes[[i for i, t in enumerate(panel_text) if t.startswith("n4-")][0]]
    shaded = [p for p in n4.patches]  # merged spans of paused steps: 2 | 5-6 | 11-13 | 17-18 | 21-22
    assert len(shaded) == 5
    filled = [line for line in n4.get_lines() if line.get_marker() == "o"
              and line.get_markerfacecolor() != "white"][0]
    assert list(filled.get_xdata()) == CLEAN_N4


def test_response_length_and_zero_std(runs):
    for fig in (plots.response_length_curve(runs), plots.zero_std_curve(runs)):
        labelled(fig)
        assert len(fig.axes[0].get_lines()) >= 3


def test_draws_into_a_given_axes(runs):
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2)
    try:
        assert plots.zero_std_curve(runs, ax=right) is fig
        assert right.get_lines() and not left.get_lines()
    finally:
        plt.close(fig)


def test_figures_are_not_left_open_in_pyplot(runs):
    import matplotlib.pyplot as plt

    before = len(plt.get_fignums())
    plots.reward_curve(runs)
    assert len(plt.get_fignums()) == before


def test_missing_metric_says_so(runs):
    fig = plots.zero_std_curve(runs.drop(columns=["rollout/zero_std/frac_groups"]))
    assert "no run logged rollout/zero_std/frac_groups" in fig.axes[0].texts[0].get_text()


def test_save_figure_writes_png_and_svg(runs, tmp_path):
    paths = plots.save_figure(plots.reward_curve(runs), tmp_path / "out", "reward.png")
    assert [p.name for p in paths] == ["reward.png", "reward.svg"]
    assert paths[0].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "<svg" in paths[1].read_text()[:1000]
    assert all(p.stat().st_size > 10_000 for p in paths)


def test_plot_all(runs, tmp_path):
    paths = plots.plot_all(runs, tmp_path)
    assert len(paths) == 8 and all(p.stat().st_size > 0 for p in paths)


def test_a_stopped_run_is_marked_in_the_legend(tmp_path):
    from test_gains import rerun_pair

    fig = analysis.reward_curve(rerun_pair(tmp_path), early=(0, 3), late=(8, 11))
    labels = [t.get_text() for legend in fig.legends for t in legend.get_texts()]
    assert "8 answers (1 run, seed 7; stopped after step 1)" in labels
    assert "2 answers (1 run, seed 7)" in labels


def test_one_cpu_runs_timing_plot_says_nothing_of_pauses_or_common_steps(tmp_path):
    from fixtures_runs import write_run

    run = write_run(tmp_path, "cpu-run", group_size=4, seed=1, rewards=[0.2] * 12,
                    times=[10.0 + s for s in range(12)], clean=[True] * 12)
    fig = plots.rollout_time_curve(run)
    assert fig.texts[0].get_text() == "Rollout time per step"  # a CPU run reads no temperature
    assert fig.axes[0].texts[0].get_text().endswith("median 15.5 s over its 12 steps")
    labels = [t.get_text() for legend in fig.legends for t in legend.get_texts()]
    assert "step touched by a heat pause" not in labels and "median" in labels
