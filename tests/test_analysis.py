"""labkit.analysis, the lessons' public face for comparing runs: each name it lists is its
home module's, every name the notebooks use is listed, and lesson 3's calls work through it.

The loading, the gain, the cost and the table are tested with their modules: test_runframe,
test_gains, test_costs, test_compare."""

from __future__ import annotations

import pytest
from fixtures_runs import CLEAN_N4, write_course_runs
from public_faces import assert_reexports, names_used_in_notebooks

from labkit import analysis
from labkit.analysis import costs, gains, heldout, paired, plots, runframe, table
from labkit.run import metrics


def test_public_names_are_the_home_modules():
    assert_reexports(analysis, (metrics, runframe, gains, paired, heldout, costs, table, plots))


def test_names_the_notebooks_use_are_listed():
    used = names_used_in_notebooks("labkit.analysis")
    assert {"load_runs", "run_gains", "compare", "STEP", "REWARD"} <= used  # the scan works
    assert used <= set(analysis.__all__)


def test_lesson_three_through_the_public_face(tmp_path):
    """The calls of notebooks/03_group_size.ipynb, in its order, on the course's five runs."""
    runs = analysis.drop_unfinished(analysis.load_runs(write_course_runs(tmp_path)))
    assert runs.run.nunique() == 5 and {analysis.STEP, analysis.REWARD} <= set(runs.columns)
    verdict = analysis.inside_one_range(analysis.run_gains(runs), reference=8)
    assert verdict.inside is True and str(verdict).startswith("Inside one range")
    assert analysis.run_costs(runs, last_step=23).set_index("run").time_s["n4-seed1234"] == \
        pytest.approx(32.5)
    table = analysis.compare(runs)
    assert table.attrs["common_clean_steps"] == CLEAN_N4
    assert "+0.038, +0.061, +0.098" in analysis.render_table(table)

