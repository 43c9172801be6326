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
    with pytest.warns(UserWarning, match=r"eval.jsonl: 1 of 3 lines are not readable evaluations"):
        evals = read_evaluations(run)
    assert list(evals.trained_steps) == [0, 24]  # the cut last line is left out, and said
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
    evaluated(small_run(tmp_path, "b", seed=1, response_len=150.0), 0.25, 0.31)  # not a copy
    with pytest.raises(AnalysisError, match="32 x 8 seed 1: a, b"):
        group_heldout(load_runs(tmp_path))


def test_no_evaluations_is_said(tmp_path):
    small_run(tmp_path, "a")
    with pytest.raises(AnalysisError, match="no run has held-out accuracy"):
        group_heldout(load_runs(tmp_path))


def test_the_table_by_setting_reads_held_out_and_refuses_nothing_it_should_not(tmp_path):
    """Splits of one budget (64 x 4, 32 x 8) are rows of one table; the held-out columns and
    verdict come from eval.jsonl, with the standard error of one evaluation."""
    from labkit.analysis import compare, heldout_plot

    for seed, after in [(1, 0.30), (2, 0.34)]:
        evaluated(small_run(tmp_path, f"p32-s{seed}", seed=seed, gain=0.05), 0.25, after)
    for seed, after in [(1, 0.31), (2, 0.33)]:
        evaluated(small_run(tmp_path, f"p64-s{seed}", seed=seed, prompts=64, group_size=4,
                            gain=0.06), 0.25, after)
    runs = load_runs(tmp_path)
    with pytest.raises(AnalysisError, match="differ in prompts"):
        compare(runs)  # by group size, other prompts are not seeds
    table = compare(runs, by="setting")
    rows = table.set_index("prompts x answers")
    assert list(rows.index) == ["64 x 4", "32 x 8"]
    assert rows.loc["32 x 8", "held-out before -> after"] == "0.250 -> 0.300 to 0.340"
    change = rows.loc["64 x 4", "held-out change"]  # no outcomes kept: two evaluations' errors
    assert change.startswith("+0.070 (+0.0") and change.endswith(", unpaired)")
    assert rows.loc["32 x 8", "vs 32 x 8"] == "" and rows.loc["64 x 4", "vs 32 x 8"].startswith("+0.000 (-0.")
    verdict = table.attrs["heldout_verdict"]
    assert verdict.startswith("Held-out: training moved it") and "Inside one range" in verdict
    assert "Unpaired" in verdict
    fig = heldout_plot(runs)
    labels = [t.get_text() for t in fig.axes[0].get_xticklabels()]
    assert labels == ["64 x 4\n(2 seeds)", "32 x 8\n(2 seeds)"]


def test_a_setting_whose_difference_excludes_zero_is_named():
    import pandas as pd

    from labkit.analysis.heldout import heldout_verdict

    nan = float("nan")
    table = pd.DataFrame([
        dict(setting="32 x 8", group_size=8, seeds=3, before=0.25, change=0.06, ci_low=0.05,
             ci_high=0.07, paired=True, vs_reference=nan, vs_low=nan, vs_high=nan),
        dict(setting="64 x 4", group_size=4, seeds=3, before=0.25, change=0.015, ci_low=-0.01,
             ci_high=0.03, paired=True, vs_reference=-0.045, vs_low=-0.06, vs_high=-0.03)])
    text = heldout_verdict(table, "32 x 8")
    assert "moved it in some settings only" in text
    assert "Not inside one range: against 32 x 8, the change differs for 64 x 4 -0.045 (-0.060 to -0.030)" in text


@pytest.mark.parametrize("content", [b"\xff\xfe not text", b"[1, 2]\n{\"eval/gsm8k_test\": \"x\"}\n"],
                         ids=["not-utf8", "not-evaluations"])
def test_an_unreadable_eval_file_is_said_not_read_as_never_evaluated(tmp_path, capsys, content):
    from labkit.cli import main

    for seed in (1, 2):
        evaluated(small_run(tmp_path, f"s{seed}", seed=seed), 0.25, 0.30)
    (tmp_path / "s2" / "eval.jsonl").write_bytes(content)
    with pytest.warns(UserWarning, match=r"s2/eval.jsonl"):
        gains = heldout_gains(load_runs(tmp_path))
    assert list(gains.run) == ["s1"]
    assert main(["compare", str(tmp_path), "--early", "0-7", "--late", "16-23",
                 "--out", str(tmp_path / "out")]) == 0
    err = capsys.readouterr().err
    said = [line for line in err.splitlines() if "s2/eval.jsonl" in line]
    assert len(said) == 1 and said[0].startswith("warning: ") and "left out" in said[0]
