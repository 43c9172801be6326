"""Held-out accuracy per run and per setting, read from eval.jsonl, with its standard error."""

from __future__ import annotations

import json
import math

import pytest

from fixtures_runs import small_run
from labkit.analysis.heldout import group_heldout, heldout_gains, read_evaluations
from labkit.analysis.runframe import AnalysisError, load_runs


def evaluated(run, before, after, n=400, steps=24):
    rows = [{"eval/trained_steps": 0, "eval/gsm8k_test": before, "eval/gsm8k_test_n": n,
             "perf/eval_time": 9.0},
            {"eval/trained_steps": steps, "eval/gsm8k_test": after, "eval/gsm8k_test_n": n,
             "perf/eval_time": 9.5}]
    (run / "eval.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"cut sh')
    return run


def test_a_run_reads_before_after_and_the_standard_error(tmp_path):
    run = evaluated(small_run(tmp_path, "a", seed=1), 0.25, 0.30)
    evals = read_evaluations(run)
    assert list(evals.trained_steps) == [0, 24]  # the cut last line is skipped
    (row,) = heldout_gains(load_runs(tmp_path)).to_dict("records")
    assert row["before"] == 0.25 and row["after"] == 0.30
    assert row["change"] == pytest.approx(0.05) and row["name"] == "eval/gsm8k_test"
    assert row["stderr"] == pytest.approx(math.sqrt(0.3 * 0.7 / 400))


def test_settings_give_seed_ranges(tmp_path):
    for seed, after in [(1, 0.30), (2, 0.34)]:
        evaluated(small_run(tmp_path, f"p32-s{seed}", seed=seed), 0.25, after)
    evaluated(small_run(tmp_path, "p64-s1", seed=1, prompts=64, group_size=4), 0.25, 0.27)
    small_run(tmp_path, "never-evaluated", seed=3)  # no eval.jsonl: left out
    table = group_heldout(load_runs(tmp_path)).set_index(["prompts", "group_size"])
    p32 = table.loc[(32, 8)]
    assert p32.seeds == 2 and p32.after_low == 0.30 and p32.after_high == 0.34
    assert p32.change_low == pytest.approx(0.05) and p32.change_high == pytest.approx(0.09)
    assert table.loc[(64, 4)].seeds == 1


def test_two_runs_of_one_seed_are_not_two_seeds(tmp_path):
    evaluated(small_run(tmp_path, "a", seed=1), 0.25, 0.30)
    evaluated(small_run(tmp_path, "b", seed=1), 0.25, 0.31)
    with pytest.raises(AnalysisError, match="32 x 8 seed 1: a, b"):
        group_heldout(load_runs(tmp_path))


def test_no_evaluations_is_said(tmp_path):
    small_run(tmp_path, "a")
    with pytest.raises(AnalysisError, match="no run has held-out accuracy"):
        group_heldout(load_runs(tmp_path))
