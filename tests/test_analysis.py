"""Tests for labkit.analysis: loading, the gain, the seed range, the clean-step cost, the table."""

from __future__ import annotations

import json
import sys
import types
import warnings

import numpy as np
import pandas as pd
from pathlib import Path

import pytest

from fixtures_runs import CLEAN_N4, PAUSED_N4, rewards_with_gain, write_course_runs, write_run
from labkit import analysis
from labkit.analysis import AnalysisError


@pytest.fixture(scope="module")
def course_dir(tmp_path_factory):
    return write_course_runs(tmp_path_factory.mktemp("course"))


@pytest.fixture(scope="module")
def runs(course_dir):
    return analysis.load_runs(course_dir)


def small_run(root, name, *, group_size=8, seed=1, gain=0.05, n_steps=24, **kw):
    """A plain clean run with a known gain."""
    kw.setdefault("times", [50.0] * n_steps)
    kw.setdefault("clean", [True] * n_steps)
    return write_run(root, name, group_size=group_size, seed=seed,
                     rewards=rewards_with_gain(gain, n_steps), **kw)


# ------------------------------------------------------------------ loading
def test_load_runs_tidy_frame(runs):
    assert len(runs) == 24 + 48 + 24 + 24 + 24  # one row per run and step
    per_run = runs.groupby("run").first()
    assert per_run.loc["n4-seed1234", "group_size"] == 4
    assert per_run.loc["n16-seed1234", "global_batch"] == 32 * 16
    assert per_run.loc["n8-seed2", "seed"] == 2
    assert set(per_run.prompts) == {32}
    assert set(per_run.engine) == {"vllm"}
    assert per_run.loc["n16-seed1234", "status"] == "time_limit"
    assert list(runs.group_size.unique()) == [4, 8, 16]  # sorted by group size
    assert not runs.duplicated(["run", "rollout/step"]).any()


def test_load_runs_heat_columns(runs):
    by_run = runs.groupby("run")
    assert by_run.clean.sum()["n4-seed1234"] == 14
    assert by_run.clean.sum()["n16-seed1234"] == 0
    # made before the heat guard: no heat/clean logged, no pause recorded, so every step clean
    assert by_run.clean.sum()["n8-seed1234"] == 48
    assert not by_run.heat_guard.first()["n8-seed1234"]
    # heat.jsonl pauses land in their steps by time
    n4 = runs[runs.run == "n4-seed1234"].set_index("rollout/step")
    assert n4.heat_pause_s[PAUSED_N4].eq(30.0).all()
    assert n4.heat_pause_s[CLEAN_N4].eq(0.0).all()


def test_load_one_run_folder_and_list(course_dir):
    one = analysis.load_runs(course_dir / "n4-seed1234")
    assert set(one.run) == {"n4-seed1234"}
    two = analysis.load_runs([course_dir / "n4-seed1234", str(course_dir / "n8-seed1")])
    assert set(two.run) == {"n4-seed1234", "n8-seed1"}


def test_same_run_twice_is_read_once(course_dir):
    with pytest.warns(UserWarning, match="named twice"):
        both = analysis.load_runs([course_dir, course_dir / "n4-seed1234"])
    assert both.run.nunique() == 5


def test_heat_pause_by_step_without_times(tmp_path):
    run = small_run(tmp_path, "r", n_steps=24, clean=None)
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    for row in lines:
        del row["time/start"], row["time/end"]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    (run / "heat.jsonl").write_text(json.dumps({"seconds": 12.0, "peak_c": 90, "step": 3}) + "\n")
    frame = analysis.load_runs(run).set_index("rollout/step")
    assert frame.heat_pause_s[3] == 12.0 and frame.heat_pause_s.drop(3).eq(0).all()
    assert not frame.clean[3] and frame.clean.drop(3).all()


def test_miles_log_goes_through_read_miles_log(tmp_path, monkeypatch):
    log = tmp_path / "miles-n16.log"
    log.write_text("pretend miles output\n")
    seen = []

    def fake_read(path):
        seen.append(path)
        return pd.DataFrame({"rollout/step": [0, 1, 2], "rollout/raw_reward": [0.1, 0.2, 0.3],
                             "perf/rollout_time": [100.0, 110.0, 120.0],
                             "n_samples_per_prompt": [16] * 3, "rollout_batch_size": [32] * 3})

    monkeypatch.setitem(sys.modules, "labkit.miles",
                        types.SimpleNamespace(read_miles_log=fake_read))
    frame = analysis.load_runs(log)
    assert seen == [log]
    assert set(frame.run) == {"miles-n16"} and set(frame.source) == {"miles"}
    assert frame.group_size.iat[0] == 16 and frame.prompts.iat[0] == 32
    assert frame.clean.all() and not frame.heat_guard.any()


def test_miles_run_folder_found_by_search(tmp_path, monkeypatch):
    small_run(tmp_path, "labkit-n8")
    miles_dir = tmp_path / "miles-n4"
    miles_dir.mkdir()
    (miles_dir / "miles.log").write_text("pretend\n")
    (miles_dir / "labkit_miles.json").write_text(json.dumps(
        {"config": {"model": "Qwen/Qwen2.5-0.5B-Instruct", "lr": 1e-6, "engine": "auto"}}))

    def fake_read(path):
        assert path == miles_dir  # read_miles_log takes a folder holding miles.log
        return pd.DataFrame({"rollout/step": range(24), "rollout/raw_reward": rewards_with_gain(0.05),
                             "heat/clean": np.nan, "n_samples_per_prompt": 4,
                             "rollout_batch_size": 32, "run_name": "miles-n4"})

    monkeypatch.setitem(sys.modules, "labkit.miles", types.SimpleNamespace(read_miles_log=fake_read))
    frame = analysis.load_runs(tmp_path)
    per_run = frame.groupby("run").first()
    assert per_run.loc["miles-n4", "engine"] == "miles"
    assert per_run.loc["miles-n4", "model"] == "Qwen/Qwen2.5-0.5B-Instruct"
    assert per_run.loc["miles-n4", "group_size"] == 4
    assert frame[frame.run == "miles-n4"].clean.all()  # no heat guard: no pause touched it


def test_real_miles_log(tmp_path):
    pytest.importorskip("labkit.miles")
    printed = [f"  {k} ........ {v}" for k, v in [("rollout_batch_size", 32), ("seed", 1),
                                                  ("n_samples_per_prompt", 16),
                                                  ("global_batch_size", 512)]]
    lines = [f"rollout {s}: {{'rollout/raw_reward': {r}, 'perf/rollout_time': 180.0}}"
             for s, r in enumerate(rewards_with_gain(0.07))]
    (tmp_path / "n16.log").write_text("\n".join(printed + lines) + "\n")
    frame = analysis.load_runs(tmp_path / "n16.log")
    assert frame.group_size.iat[0] == 16 and frame.prompts.iat[0] == 32 and len(frame) == 24
    assert analysis.run_gains(frame).gain.iat[0] == pytest.approx(0.07)


# ------------------------------------------------------------------ the gain
def test_run_gains_match_construction(runs):
    gains = analysis.run_gains(runs).set_index("run").gain
    expected = {"n4-seed1234": 0.071, "n8-seed1234": 0.061, "n8-seed1": 0.038,
                "n8-seed2": 0.098, "n16-seed1234": 0.097}
    for name, gain in expected.items():
        assert gains[name] == pytest.approx(gain, abs=1e-12)


def test_group_gains_spread(runs):
    groups = analysis.group_gains(runs).set_index("group_size")
    assert list(groups.index) == [4, 8, 16]
    eight = groups.loc[8]
    assert eight.seeds == 3
    assert eight.spread_low == pytest.approx(0.038) and eight.spread_high == pytest.approx(0.098)
    assert eight.mean_gain == pytest.approx((0.038 + 0.061 + 0.098) / 3)
    assert sorted(eight.seed_values) == [1, 2, 1234]


def test_gain_windows_are_parameters(runs):
    gains = analysis.run_gains(runs, early=(0, 3), late=(20, 23)).set_index("run").gain
    assert gains["n8-seed2"] == pytest.approx(0.098)  # both windows sit on the flat parts


def test_bootstrap_is_deterministic_and_collapses_without_noise(tmp_path):
    noisy = list(np.random.default_rng(0).uniform(0.2, 0.5, 24))
    runs = analysis.load_runs(write_run(tmp_path, "noisy", group_size=8, seed=1, rewards=noisy,
                                        times=[1.0] * 24))
    a = analysis.run_gains(runs, seed=3)
    pd.testing.assert_frame_equal(a, analysis.run_gains(runs, seed=3))
    assert a.ci_low.iat[0] != analysis.run_gains(runs, seed=4).ci_low.iat[0]
    assert a.ci_low.iat[0] < a.gain.iat[0] < a.ci_high.iat[0]
    flat = write_run(tmp_path, "flat", group_size=8, seed=1, times=[1.0] * 24,
                     rewards=[0.2] * 8 + [0.3] * 16)
    g = analysis.run_gains(analysis.load_runs(flat)).iloc[0]
    assert g.ci_low == pytest.approx(0.1) and g.ci_high == pytest.approx(0.1)


def test_bootstrap_width_matches_standard_error():
    rng = np.random.default_rng(0)
    early, late = rng.normal(0.3, 0.05, 8), rng.normal(0.4, 0.05, 8)
    low, high = analysis.bootstrap_gain([(early, late)], np.random.default_rng(1), n_boot=20000)
    # the plug-in standard error of a difference of two means of 8 steps
    se = np.sqrt(early.var() / 8 + late.var() / 8)
    assert (high - low) == pytest.approx(2 * 1.96 * se, rel=0.1)
    assert low < late.mean() - early.mean() < high


def test_inside_one_range_course_numbers(runs):
    verdict = analysis.inside_one_range(analysis.run_gains(runs))
    assert verdict.inside is True
    assert (verdict.low, verdict.high) == (pytest.approx(0.038), pytest.approx(0.098))
    assert "Inside one range" in verdict.text and "+0.038 to +0.098" in verdict.text
    assert "+0.097" in verdict.text
    assert analysis.inside_one_range(runs).inside is True  # runs work as well as gains


def test_outside_one_range(tmp_path, course_dir):
    small_run(tmp_path, "n16-seed7", group_size=16, seed=7, gain=0.2)
    verdict = analysis.inside_one_range(analysis.load_runs([course_dir, tmp_path / "n16-seed7"]))
    assert verdict.inside is False
    assert verdict.outside == ["n16-seed7"]
    assert "Not inside one range" in verdict.text and "n16-seed7 (16 answers) +0.200" in verdict.text


def test_range_needs_the_reference_and_two_seeds(runs):
    with pytest.raises(AnalysisError, match=r"no run has 2 answers.*group sizes here: 4, 8, 16"):
        analysis.inside_one_range(runs, reference=2)
    verdict = analysis.inside_one_range(runs, reference=4)
    assert verdict.inside is None and "one seed" in verdict.text


def test_too_short_run_is_refused(tmp_path):
    run = small_run(tmp_path, "short", n_steps=12)
    with pytest.raises(AnalysisError, match=r"run short has steps 0 to 11, too short for the window 16-23"):
        analysis.run_gains(analysis.load_runs(run))


def test_missing_step_in_window_is_refused(tmp_path):
    run = small_run(tmp_path, "gap")
    lines = (run / "metrics.jsonl").read_text().splitlines()
    (run / "metrics.jsonl").write_text("\n".join(lines[:18] + lines[19:]) + "\n")
    with pytest.raises(AnalysisError, match=r"run gap has no reward for step\(s\) 18 of the window 16-23"):
        analysis.run_gains(analysis.load_runs(run))


# ------------------------------------------------------------------ the cost
def test_common_clean_steps_rule(runs):
    common, left_out = analysis.common_clean_steps(runs, last_step=23)
    # 4 answers is clean on 14 steps, the 8-answer runs on supersets of them, and 16 answers
    # on none: it is left out instead of emptying the set for everyone
    assert common == CLEAN_N4 and len(common) == 14
    assert left_out == ["n16-seed1234"]


def test_common_clean_steps_constructed_flags(tmp_path):
    small_run(tmp_path, "a", clean=[s % 2 == 0 for s in range(24)])
    small_run(tmp_path, "b", seed=2, clean=[s < 12 for s in range(24)])
    small_run(tmp_path, "c", seed=3, clean=[False] * 24)
    common, left_out = analysis.common_clean_steps(analysis.load_runs(tmp_path))
    assert common == [0, 2, 4, 6, 8, 10] and left_out == ["c"]


def test_run_costs_course_times(runs):
    costs = analysis.run_costs(runs, last_step=23).set_index("run")
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
        costs = analysis.run_costs(analysis.load_runs(tmp_path)).set_index("run")
    assert list(costs.basis) == ["own clean steps"] * 2
    assert costs.time_s.to_dict() == {"a": 10.0, "b": 20.0}


# ------------------------------------------------------------------ the table
def test_compare_table(runs):
    table = analysis.compare(runs)
    assert list(table["group size"]) == [4, 8, 16]
    assert list(table["seeds"]) == [1, 3, 1]
    row = table.set_index("group size")
    assert row.loc[8, "gain per seed"] == "+0.038, +0.061, +0.098"
    assert row.loc[8, "seed spread"] == "+0.038 to +0.098"
    assert row.loc[4, "seed spread"] == "one seed"
    assert row.loc[4, "rollout time (s)"] == "32.5"
    assert row.loc[8, "rollout time (s)"] == "59.1"  # median of the seeds 58.4, 59.1, 60.2
    assert row.loc[16, "rollout time (s)"] == "no clean step; 188.2 includes pauses"
    assert row.loc[4, "time vs 8"] == f"{32.5 / 59.1:.2f}x" and row.loc[16, "time vs 8"] == "n/a"
    assert row.loc[4, "common clean steps"] == 14
    assert row.loc[4, "tokens per step"] == f"{32 * 4 * (180 + 23):,}"
    assert table.attrs["common_clean_steps"] == CLEAN_N4
    assert table.attrs["verdict"].startswith("Inside one range")
    assert any("188.2 s includes the pauses" in n for n in table.attrs["notes"])


def test_compare_renders_markdown_and_text(runs):
    table = analysis.compare(runs)
    md = analysis.render_table(table)
    assert md.splitlines()[0].startswith("|") and "+0.038, +0.061, +0.098" in md
    text = analysis.render_table(table, "text")
    assert "group size" in text and "|" not in text
    with pytest.raises(ValueError, match="use 'markdown' or 'text'"):
        analysis.render_table(table, "html")


def test_compare_main(course_dir, tmp_path, capsys, monkeypatch):
    from labkit import plots

    calls = []  # drawing is tested in test_plots; here: what is printed and where plots go
    monkeypatch.setattr(plots, "plot_all", lambda runs, out, **kw: calls.append((runs, out)) or [])
    assert analysis.compare_main([str(course_dir)], None) == 0
    printed = capsys.readouterr().out
    assert "group size |" in printed and "Inside one range" in printed
    assert "Common clean steps (14): 0, 1, 3, 4, 7" in printed
    assert "Its median of 188.2 s includes the pauses" in printed
    assert calls[0][1] == Path("compare") and calls[0][0].run.nunique() == 5  # ./compare
    analysis.compare_main([str(course_dir)], str(tmp_path / "plots"))
    assert calls[1][1] == tmp_path / "plots"


def test_compare_main_reports_errors(tmp_path, capsys):
    assert analysis.compare_main([str(tmp_path)], None) == 2
    assert "holds no run folder" in capsys.readouterr().err


# ------------------------------------------------------------------ bad input
def test_empty_folder(tmp_path):
    with pytest.raises(AnalysisError, match=r"holds no run folder"):
        analysis.load_runs(tmp_path)


def test_missing_path(tmp_path):
    with pytest.raises(AnalysisError, match=r"does not exist"):
        analysis.load_runs(tmp_path / "nope")


def test_run_without_steps(tmp_path):
    run = small_run(tmp_path, "started")
    (run / "metrics.jsonl").write_text("")
    with pytest.raises(AnalysisError, match=r"run started has no finished step"):
        analysis.load_runs(run)
    small_run(tmp_path, "done", seed=2)
    with pytest.warns(UserWarning, match=r"run started has no finished step.*skipped"):
        assert set(analysis.load_runs(tmp_path).run) == {"done"}


def test_run_without_rewards(tmp_path):
    run = small_run(tmp_path, "norew")
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    (run / "metrics.jsonl").write_text(
        "".join(json.dumps({k: v for k, v in r.items() if k != "rollout/raw_reward"}) + "\n"
                for r in rows))
    with pytest.raises(AnalysisError, match=r"run norew logged no rollout/raw_reward"):
        analysis.compare(analysis.load_runs(run))


def test_duplicated_steps(tmp_path):
    run = small_run(tmp_path, "dup")
    lines = (run / "metrics.jsonl").read_text().splitlines()
    (run / "metrics.jsonl").write_text("\n".join(lines[:6] + lines[4:]) + "\n")
    with pytest.raises(AnalysisError, match=r"run dup: step\(s\) 4, 5 appear more than once"):
        analysis.load_runs(run)


def test_truncated_last_line_warns(tmp_path):
    run = small_run(tmp_path, "cut")
    with open(run / "metrics.jsonl", "a") as f:
        f.write('{"rollout/step": 24, "rollout/raw')
    with pytest.warns(UserWarning, match=r"skipped 1 unreadable line"):
        assert analysis.load_runs(run)["rollout/step"].max() == 23


def test_different_prompts_warn(tmp_path):
    small_run(tmp_path, "p32", seed=1)
    small_run(tmp_path, "p32b", seed=2)
    small_run(tmp_path, "p16", group_size=4, prompts=16)
    with pytest.warns(UserWarning, match=r"differ in prompts per rollout.*16 in p16.*32 in p32, p32b"):
        analysis.compare(analysis.load_runs(tmp_path))


def test_global_batch_not_one_step_warns(tmp_path):
    small_run(tmp_path, "r", prompts=32, global_batch=128)
    with pytest.warns(UserWarning, match=r"--global-batch-size 128 is not 32 prompts x 8 answers = 256"):
        analysis.check_comparable(analysis.load_runs(tmp_path))


def test_same_config_does_not_warn(runs):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        analysis.check_comparable(runs)


def test_bad_window(runs):
    with pytest.raises(AnalysisError, match=r"late=\(23, 16\)"):
        analysis.run_gains(runs, late=(23, 16))
