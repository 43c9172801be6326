"""labkit.analysis.costs: the common clean steps and the rollout time over them."""

from __future__ import annotations

import pytest
from fixtures_runs import CLEAN_N4, small_run

from labkit.analysis.costs import common_clean_steps, run_costs
from labkit.analysis.runframe import load_runs


def test_common_clean_steps_rule(runs):
    common, left_out = common_clean_steps(runs, last_step=23)
    # 4 answers is clean on 14 steps, the 8-answer runs on supersets of them, and 16 answers
    # on none: it is left out instead of emptying the set for everyone
    assert common == CLEAN_N4 and len(common) == 14
    assert left_out == ["n16-seed1234"]


def test_common_clean_steps_constructed_flags(tmp_path):
    small_run(tmp_path, "a", clean=[s % 2 == 0 for s in range(24)])
    small_run(tmp_path, "b", seed=2, clean=[s < 12 for s in range(24)])
    small_run(tmp_path, "c", seed=3, clean=[False] * 24)
    common, left_out = common_clean_steps(load_runs(tmp_path))
    assert common == [0, 2, 4, 6, 8, 10] and left_out == ["c"]


def test_run_costs_course_times(runs):
    costs = run_costs(runs, last_step=23).set_index("run")
    assert costs.time_s["n4-seed1234"] == pytest.approx(32.5)
    assert costs.time_s["n8-seed1234"] == pytest.approx(59.1)  # on the same 14 step numbers
    assert costs.common_clean_steps["n4-seed1234"] == 14
    assert costs.basis["n16-seed1234"] == "all steps, includes pauses"
    assert costs.time_s["n16-seed1234"] == pytest.approx(188.2)
    assert costs.common_clean_steps["n16-seed1234"] == 0
    assert costs.steps["n8-seed1234"] == 24  # the 48-step run is compared on its first 24
    assert costs.tokens_per_step["n4-seed1234"] == pytest.approx(32 * 4 * (180 + 23), rel=1e-3)


def test_disjoint_clean_steps_fall_back_with_a_warning(tmp_path):
    small_run(tmp_path, "a", clean=[s < 12 for s in range(24)], times=[10.0] * 12 + [99.0] * 12)
    small_run(tmp_path, "b", seed=2, clean=[s >= 12 for s in range(24)], times=[99.0] * 12 + [20.0] * 12)
    with pytest.warns(UserWarning, match="no step number is clean in every run"):
        costs = run_costs(load_runs(tmp_path)).set_index("run")
    assert list(costs.basis) == ["own clean steps"] * 2
    assert costs.time_s.to_dict() == {"a": 10.0, "b": 20.0}
