"""labkit.analysis.gains: the gain of each run and group size, the bootstrap, the seed range."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from fixtures_runs import small_run, write_run

from labkit.analysis.gains import bootstrap_gain, group_gains, inside_one_range, run_gains
from labkit.analysis.runframe import AnalysisError, load_runs


def test_run_gains_match_construction(runs):
    gains = run_gains(runs).set_index("run").gain
    expected = {"n4-seed1234": 0.071, "n8-seed1234": 0.061, "n8-seed1": 0.038,
                "n8-seed2": 0.098, "n16-seed1234": 0.097}
    for name, gain in expected.items():
        assert gains[name] == pytest.approx(gain, abs=1e-12)


def test_group_gains_spread(runs):
    groups = group_gains(runs).set_index("group_size")
    assert list(groups.index) == [4, 8, 16]
    eight = groups.loc[8]
    assert eight.seeds == 3
    assert eight.spread_low == pytest.approx(0.038) and eight.spread_high == pytest.approx(0.098)
    assert eight.mean_gain == pytest.approx((0.038 + 0.061 + 0.098) / 3)
    assert sorted(eight.seed_values) == [1, 2, 1234]


def test_gain_windows_are_parameters(runs):
    gains = run_gains(runs, early=(0, 3), late=(20, 23)).set_index("run").gain
    assert gains["n8-seed2"] == pytest.approx(0.098)  # both windows sit on the flat parts


def test_bootstrap_is_deterministic_and_collapses_without_noise(tmp_path):
    noisy = list(np.random.default_rng(0).uniform(0.2, 0.5, 24))
    runs = load_runs(write_run(tmp_path, "noisy", group_size=8, seed=1, rewards=noisy,
                                        times=[1.0] * 24))
    a = run_gains(runs, seed=3)
    pd.testing.assert_frame_equal(a, run_gains(runs, seed=3))
    assert a.ci_low.iat[0] != run_gains(runs, seed=4).ci_low.iat[0]
    assert a.ci_low.iat[0] < a.gain.iat[0] < a.ci_high.iat[0]
    flat = write_run(tmp_path, "flat", group_size=8, seed=1, times=[1.0] * 24,
                     rewards=[0.2] * 8 + [0.3] * 16)
    g = run_gains(load_runs(flat)).iloc[0]
    assert g.ci_low == pytest.approx(0.1) and g.ci_high == pytest.approx(0.1)


def test_bootstrap_width_matches_standard_error():
    rng = np.random.default_rng(0)
    early, late = rng.normal(0.3, 0.05, 8), rng.normal(0.4, 0.05, 8)
    low, high = bootstrap_gain([(early, late)], np.random.default_rng(1), n_boot=20000)
    # the plug-in standard error of a difference of two means of 8 steps
    se = np.sqrt(early.var() / 8 + late.var() / 8)
    assert (high - low) == pytest.approx(2 * 1.96 * se, rel=0.1)
    assert low < late.mean() - early.mean() < high


def test_inside_one_range_course_numbers(runs):
    verdict = inside_one_range(run_gains(runs))
    assert verdict.inside is True
    assert (verdict.low, verdict.high) == (pytest.approx(0.038), pytest.approx(0.098))
    assert "Inside one range" in verdict.text and "+0.038 to +0.098" in verdict.text
    assert "+0.097" in verdict.text
    assert inside_one_range(runs).inside is True  # runs work as well as gains


def test_outside_one_range(tmp_path, course_dir):
    small_run(tmp_path, "n16-seed7", group_size=16, seed=7, gain=0.2)
    verdict = inside_one_range(load_runs([course_dir, tmp_path / "n16-seed7"]))
    assert verdict.inside is False
    assert verdict.outside == ["n16-seed7"]
    assert "Not inside one range" in verdict.text and "n16-seed7 (16 answers) +0.200" in verdict.text


def test_range_needs_the_reference_and_two_seeds(runs):
    with pytest.raises(AnalysisError, match=r"no run has 2 answers.*group sizes here: 4, 8, 16"):
        inside_one_range(runs, reference=2)
    verdict = inside_one_range(runs, reference=4)
    assert verdict.inside is None and "one seed" in verdict.text


def test_too_short_run_is_refused(tmp_path):
    run = small_run(tmp_path, "short", n_steps=12)
    with pytest.raises(AnalysisError, match=r"run short has steps 0 to 11, too short for the window 16-23"):
        run_gains(load_runs(run))


def test_missing_step_in_window_is_refused(tmp_path):
    run = small_run(tmp_path, "gap")
    lines = (run / "metrics.jsonl").read_text().splitlines()
    (run / "metrics.jsonl").write_text("\n".join(lines[:18] + lines[19:]) + "\n")
    with pytest.raises(AnalysisError, match=r"run gap has no reward for step\(s\) 18 of the window 16-23"):
        run_gains(load_runs(run))


def test_bad_window(runs):
    with pytest.raises(AnalysisError, match=r"late=\(23, 16\)"):
        run_gains(runs, late=(23, 16))


# ====================================================================== one setting
REPO_RUNS = Path(__file__).resolve().parents[1] / "data" / "runs"


def test_runs_of_other_prompts_are_not_seeds(tmp_path, course_dir):
    small_run(tmp_path, "p16-n8-seed1", group_size=8, seed=1, prompts=16, gain=-0.2)
    runs = load_runs([course_dir, tmp_path / "p16-n8-seed1"])
    refusal = r"differ in prompts.*prompts 16: p16-n8-seed1; prompts 32: "
    with pytest.raises(AnalysisError, match=refusal):
        group_gains(runs)
    with pytest.raises(AnalysisError, match=refusal):
        inside_one_range(runs)
    with pytest.raises(AnalysisError, match=refusal):
        inside_one_range(run_gains(runs))  # gains carry the runs' settings
    gains = run_gains(runs).set_index("run")
    assert gains.loc["p16-n8-seed1", "prompts"] == 16 and gains.loc["n8-seed1", "lr"] == 1e-6
    assert group_gains(runs, mixed=True).set_index("group_size").loc[8].seeds == 4


def test_constructed_runs_are_not_mixed_with_real_ones(tmp_path, course_dir, capsys):
    small_run(tmp_path, "constructed-n8-heat", group_size=8, seed=5)
    runs = load_runs([course_dir, tmp_path])
    assert "constructed-n8-heat" not in set(runs.run)
    assert ("left out: constructed run constructed-n8-heat (made up, not measured; "
            "load_runs(..., constructed=True) reads it)") in capsys.readouterr().err
    both = load_runs([course_dir, tmp_path], constructed=True)
    with pytest.raises(AnalysisError, match=r"constructed-n8-heat is constructed \(made up, not "
                       r"measured\) and the others are real runs.*~runs\.run\.str\.contains"):
        inside_one_range(both)
    alone = load_runs(tmp_path, constructed=True)
    assert run_gains(alone).gain.iat[0] == pytest.approx(0.05)  # among themselves, fine
    with pytest.raises(AnalysisError, match="but constructed ones; pass constructed=True"):
        load_runs(tmp_path)


@pytest.mark.skipif(not REPO_RUNS.is_dir(), reason="no data/runs")
def test_the_batch_size_sweep_is_not_read_as_seeds_of_the_recipe():
    """Lesson 1.3 once took every finished run at lr 1e-6 as seeds: 5 at 8 answers, two of
    them the 16- and 64-prompt sweep runs. Now that selection is refused, the right one is not."""
    from labkit.analysis.table import drop_unfinished

    finished = drop_unfinished(load_runs(REPO_RUNS))
    first_plan = finished[finished.run.str.match(r"^[np]\d+-")]  # the runs the lesson read then
    by_lr = first_plan[first_plan.lr == 1e-6]
    with pytest.raises(AnalysisError, match=r"prompts 16: p16-n8-lr1e-6-s1; prompts 32: .*"
                                            r"prompts 64: p64-n8-lr1e-6-s1"):
        inside_one_range(by_lr)
    recipe = by_lr[by_lr.prompts == 32]
    verdict = inside_one_range(recipe)
    assert "the 3 seeds at 8 answers span +0.048 to +0.070" in verdict.text


def test_reward_rise_reads_a_short_run_by_step_and_by_minute(tmp_path):
    from labkit.analysis import reward_rise

    rewards = [0.2, 0.2, 0.2, 0.4, 0.4, 0.4, 0.6, 0.6, 0.6]  # thirds: 0.2, 0.4, 0.6
    small_run(tmp_path, "r", n_steps=9, gain=0.0)
    metrics = tmp_path / "r" / "metrics.jsonl"
    rows = [json.loads(x) for x in metrics.read_text().splitlines()]
    for row, reward in zip(rows, rewards):
        row["rollout/raw_reward"], row["perf/step_time"] = reward, 20.0
    metrics.write_text("".join(json.dumps(r) + "\n" for r in rows))
    (row,) = reward_rise(load_runs(tmp_path)).to_dict("records")
    assert row["start"] == pytest.approx(0.2) and row["end"] == pytest.approx(0.6)
    assert row["rise"] == pytest.approx(0.4) and row["minutes"] == pytest.approx(3.0)
    assert row["rise_per_step"] == pytest.approx(0.4 / 6)  # from the first third's middle to the last's
    assert row["rise_per_minute"] == pytest.approx(0.4 / 3.0)


def test_the_launchers_thirds_and_the_windows_its_plot_shades():
    from labkit.analysis.gains import end_windows, reward_at_ends

    steps = pd.DataFrame({"rollout/step": [3, 0, 1, 2, 4, 5, 6],  # out of order, one unscored
                          "rollout/raw_reward": [0.3, 0.0, 0.1, None, 0.4, 0.5, 0.6]})
    assert reward_at_ends(steps) == pytest.approx((0.05, 0.55, 2))
    assert end_windows(steps) == ((0, 1), (5, 6))
    with pytest.raises(AnalysisError, match="no rollout/raw_reward"):
        reward_at_ends(pd.DataFrame({"rollout/step": [0]}))


def test_reward_parts_take_the_format_credit_apart_from_the_right_answers():
    from labkit.analysis import reward_parts

    # math_format: 1 for a right answer, 0.1 for a wrong number in the asked format
    steps = pd.DataFrame({"rollout/step": range(6),
                          "rollout/right_frac": [0.0, 0.25, 0.25, 0.25, 0.5, 0.5],
                          "rollout/raw_reward": [0.05, 0.3, 0.3, 0.3, 0.55, 0.525]})
    parts = reward_parts(steps)
    assert list(parts.index) == ["first 2 steps (0-1)", "last 2 steps (4-5)"]
    assert parts["mean reward"].tolist() == pytest.approx([0.175, 0.5375])
    assert parts["answers right"].tolist() == pytest.approx([0.125, 0.5])
    assert parts["format credit"].tolist() == pytest.approx([0.05, 0.0375])
    with pytest.raises(AnalysisError, match="logs no rollout/right_frac"):
        reward_parts(steps.drop(columns="rollout/right_frac"))


def test_reward_rise_says_how_much_of_the_rise_is_right_answers(tmp_path):
    from labkit.analysis import reward_rise

    small_run(tmp_path, "r", n_steps=6, gain=0.0)
    metrics = tmp_path / "r" / "metrics.jsonl"
    rows = [json.loads(x) for x in metrics.read_text().splitlines()]
    for row, right in zip(rows, [0.0, 0.0, 0.1, 0.1, 0.2, 0.3]):
        row["rollout/right_frac"] = right
    metrics.write_text("".join(json.dumps(r) + "\n" for r in rows))
    (row,) = reward_rise(load_runs(tmp_path)).to_dict("records")
    assert row["right_rise"] == pytest.approx(0.25)


def rerun_pair(root: Path) -> pd.DataFrame:
    """Lesson 1.3's CPU rerun after one stop: 2 answers complete (12 steps), 8 answers
    launched for 12 steps and stopped after step 1."""
    write_run(root, "rerun-n2", group_size=2, seed=7, rewards=[0.1] * 4 + [0.2] * 4 + [0.4] * 4,
              times=[10.0] * 12)
    stopped = write_run(root, "rerun-n8", group_size=8, seed=7, rewards=[0.5, 0.9],
                        times=[20.0] * 2, status="signal")
    config = json.loads((stopped / "config.json").read_text())
    (stopped / "config.json").write_text(json.dumps({**config, "num_rollout": 12}))
    return load_runs(root)


def test_a_stopped_run_has_no_rise_over_other_windows_than_the_complete_runs(tmp_path):
    from labkit.analysis import reward_rise, rise_windows

    runs = rerun_pair(tmp_path)
    assert rise_windows(runs) == ((0, 3), (8, 11))  # the thirds of the 12 steps launched
    rise = reward_rise(runs).set_index("run")
    assert rise.loc["rerun-n2", "status"] == "completed" and rise.loc["rerun-n2", "note"] == ""
    assert rise.loc["rerun-n2", "rise"] == pytest.approx(0.3)
    assert rise.loc["rerun-n2", "rise_per_step"] == pytest.approx(0.3 / 8)
    stopped = rise.loc["rerun-n8"]
    assert stopped.status == "stopped after step 1" and stopped.steps == 2
    assert np.isnan(stopped.rise) and np.isnan(stopped.end) and np.isnan(stopped.rise_per_minute)
    assert stopped.note == "no rise: it has 2 steps (0-1), the windows are steps 0-3 and 8-11"


def test_a_run_stopped_at_its_time_limit_or_failed_says_so(tmp_path):
    from labkit.analysis import is_stopped, status_text

    for seed, (name, status) in enumerate([("a", "time_limit"), ("b", "error"),
                                           ("c", "completed")]):
        write_run(tmp_path, name, group_size=4, seed=seed, rewards=[0.1] * 3, times=[1.0] * 3,
                  status=status)
    (tmp_path / "d").mkdir()
    write_run(tmp_path / "d", "d", group_size=4, seed=3, rewards=[0.1] * 3, times=[1.0] * 3)
    (tmp_path / "d" / "d" / "status.json").unlink()  # still running, or killed
    runs = {name: run for name, run in load_runs(tmp_path).groupby("run")}
    assert [status_text(runs[n]) for n in "abcd"] == [
        "stopped after step 2 (time limit)", "failed after step 2", "completed",
        "no status after step 2"]
    # all 3 steps they were launched for are logged: a stop after the last step is no gap
    assert not any(is_stopped(runs[n]) for n in "abcd")
    short = runs["a"].assign(planned_steps=12)
    assert is_stopped(short) and is_stopped(runs["b"].assign(planned_steps=None))
