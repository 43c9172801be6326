"""labkit.course.paused_run: the constructed runs with heat pauses that exercise 1.3.3 reads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from labkit.analysis import load_runs, run_costs
from labkit.course import paused_run

RUNS = Path(__file__).resolve().parents[1] / "data" / "runs"
pytestmark = pytest.mark.skipif(not (RUNS / paused_run.SOURCE).is_dir(), reason="no data/runs")


def test_the_committed_runs_are_what_the_module_writes(tmp_path):
    made = paused_run.write_paused_runs(RUNS, tmp_path)
    assert [m.name for m in made] == paused_run.NAMES
    for folder in made:
        committed = RUNS / folder.name
        assert sorted(p.name for p in folder.iterdir()) == sorted(p.name for p in committed.iterdir())
        for path in folder.iterdir():
            assert path.read_text() == (committed / path.name).read_text(), path


def test_they_are_labelled_constructed_everywhere():
    real = set(load_runs(RUNS).run)
    for name in paused_run.NAMES:
        folder = RUNS / name
        assert "constructed" in folder.name
        assert json.loads((folder / "config.json").read_text())["note"].startswith("CONSTRUCTED")
        assert "CONSTRUCTED, not measured" in (folder / "README.md").read_text()
        assert name not in real  # not read unless asked


@pytest.mark.parametrize("source", list(paused_run.PAUSES))
def test_the_pauses_make_exactly_their_steps_unclean(source):
    name, pauses = paused_run.name_of(source), paused_run.PAUSES[source]
    both = load_runs([RUNS / name, RUNS / source], constructed=True)
    made = both[both.run == name].set_index("rollout/step")
    real = both[both.run == source].set_index("rollout/step")
    seconds = [s for s, _ in pauses.values()]
    assert sorted(made.index[~made.clean]) == sorted(pauses)
    assert (made.heat_pause_s[list(pauses)] == seconds).all()
    assert made["rollout/raw_reward"].equals(real["rollout/raw_reward"])  # only the time changed
    grown = made["perf/rollout_time"] - real["perf/rollout_time"]
    assert grown[list(pauses)].tolist() == seconds


def test_the_two_runs_pause_on_steps_that_partly_overlap():
    a, b = (set(p) for p in paused_run.PAUSES.values())
    assert a & b and a - b and b - a  # common, one-run-only steps on both sides
    pair = load_runs([RUNS / name for name in paused_run.NAMES], constructed=True)
    costs = run_costs(pair).set_index("run")
    assert (costs.common_clean_steps == 24 - len(a | b)).all()
