"""labkit.course.paused_run: the constructed run with heat pauses that exercise 1.3.3 reads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from labkit.analysis import load_runs, run_costs
from labkit.course import paused_run

RUNS = Path(__file__).resolve().parents[1] / "data" / "runs"
pytestmark = pytest.mark.skipif(not (RUNS / paused_run.SOURCE).is_dir(), reason="no data/runs")


def test_the_committed_run_is_what_the_module_writes(tmp_path):
    made = paused_run.write_paused_run(RUNS, tmp_path)
    committed = RUNS / paused_run.NAME
    assert sorted(p.name for p in made.iterdir()) == sorted(p.name for p in committed.iterdir())
    for path in made.iterdir():
        assert path.read_text() == (committed / path.name).read_text(), path.name


def test_it_is_labelled_constructed_everywhere():
    folder = RUNS / paused_run.NAME
    assert "constructed" in folder.name
    assert json.loads((folder / "config.json").read_text())["note"].startswith("CONSTRUCTED")
    assert "CONSTRUCTED, not measured" in (folder / "README.md").read_text()
    assert paused_run.NAME not in set(load_runs(RUNS).run)  # not read unless asked


def test_the_pauses_make_exactly_their_steps_unclean():
    both = load_runs([RUNS / paused_run.NAME, RUNS / paused_run.SOURCE], constructed=True)
    made = both[both.run == paused_run.NAME].set_index("rollout/step")
    real = both[both.run == paused_run.SOURCE].set_index("rollout/step")
    assert sorted(made.index[~made.clean]) == sorted(paused_run.PAUSES)
    assert (made.heat_pause_s[list(paused_run.PAUSES)] == list(paused_run.PAUSES.values())).all()
    assert made["rollout/raw_reward"].equals(real["rollout/raw_reward"])  # only the time changed
    grown = made["perf/rollout_time"] - real["perf/rollout_time"]
    assert grown[list(paused_run.PAUSES)].tolist() == list(paused_run.PAUSES.values())
    costs = run_costs(both).set_index("run")
    assert costs.loc[paused_run.NAME, "common_clean_steps"] == 24 - len(paused_run.PAUSES)
