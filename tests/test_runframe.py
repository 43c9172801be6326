"""labkit.analysis.runframe: run folders and miles logs into one tidy frame, the heat columns, bad input."""

from __future__ import annotations

import json
import sys
import types

import numpy as np
import pandas as pd
import pytest
from fixtures_runs import CLEAN_N4, PAUSED_N4, rewards_with_gain, small_run

from labkit.analysis.gains import run_gains
from labkit.analysis.runframe import AnalysisError, load_runs


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
    one = load_runs(course_dir / "n4-seed1234")
    assert set(one.run) == {"n4-seed1234"}
    two = load_runs([course_dir / "n4-seed1234", str(course_dir / "n8-seed1")])
    assert set(two.run) == {"n4-seed1234", "n8-seed1"}


def test_same_run_twice_is_read_once(course_dir):
    with pytest.warns(UserWarning, match="named twice"):
        both = load_runs([course_dir, course_dir / "n4-seed1234"])
    assert both.run.nunique() == 5


def test_heat_pause_by_step_without_times(tmp_path):
    run = small_run(tmp_path, "r", n_steps=24, clean=None)
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    for row in lines:
        del row["time/start"], row["time/end"]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    (run / "heat.jsonl").write_text(json.dumps({"seconds": 12.0, "peak_c": 90, "step": 3}) + "\n")
    frame = load_runs(run).set_index("rollout/step")
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

    monkeypatch.setitem(sys.modules, "labkit.miles.log",
                        types.SimpleNamespace(read_miles_log=fake_read))
    frame = load_runs(log)
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

    monkeypatch.setitem(sys.modules, "labkit.miles.log", types.SimpleNamespace(read_miles_log=fake_read))
    frame = load_runs(tmp_path)
    per_run = frame.groupby("run").first()
    assert per_run.loc["miles-n4", "engine"] == "miles"
    assert per_run.loc["miles-n4", "model"] == "Qwen/Qwen2.5-0.5B-Instruct"
    assert per_run.loc["miles-n4", "group_size"] == 4
    assert frame[frame.run == "miles-n4"].clean.all()  # no heat guard: no pause touched it


def test_real_miles_log(tmp_path):
    pytest.importorskip("labkit.miles.log")
    printed = [f"  {k} ........ {v}" for k, v in [("rollout_batch_size", 32), ("seed", 1),
                                                  ("n_samples_per_prompt", 16),
                                                  ("global_batch_size", 512)]]
    lines = [f"rollout {s}: {{'rollout/raw_reward': {r}, 'perf/rollout_time': 180.0}}"
             for s, r in enumerate(rewards_with_gain(0.07))]
    (tmp_path / "n16.log").write_text("\n".join(printed + lines) + "\n")
    frame = load_runs(tmp_path / "n16.log")
    assert frame.group_size.iat[0] == 16 and frame.prompts.iat[0] == 32 and len(frame) == 24
    assert run_gains(frame).gain.iat[0] == pytest.approx(0.07)


def test_empty_folder(tmp_path):
    with pytest.raises(AnalysisError, match=r"holds no run folder"):
        load_runs(tmp_path)


def test_missing_path(tmp_path):
    with pytest.raises(AnalysisError, match=r"does not exist"):
        load_runs(tmp_path / "nope")


def test_run_without_steps(tmp_path):
    run = small_run(tmp_path, "started")
    (run / "metrics.jsonl").write_text("")
    with pytest.raises(AnalysisError, match=r"run started has no finished step"):
        load_runs(run)
    small_run(tmp_path, "done", seed=2)
    with pytest.warns(UserWarning, match=r"run started has no finished step.*skipped"):
        assert set(load_runs(tmp_path).run) == {"done"}


def test_duplicated_steps(tmp_path):
    run = small_run(tmp_path, "dup")
    lines = (run / "metrics.jsonl").read_text().splitlines()
    (run / "metrics.jsonl").write_text("\n".join(lines[:6] + lines[4:]) + "\n")
    with pytest.raises(AnalysisError, match=r"run dup: step\(s\) 4, 5 appear more than once"):
        load_runs(run)


def test_truncated_last_line_warns(tmp_path):
    run = small_run(tmp_path, "cut")
    with open(run / "metrics.jsonl", "a") as f:
        f.write('{"rollout/step": 24, "rollout/raw')
    with pytest.warns(UserWarning, match=r"skipped 1 unreadable line"):
        assert load_runs(run)["rollout/step"].max() == 23


def test_a_file_that_is_not_a_run_is_skipped_with_a_line(tmp_path):
    small_run(tmp_path, "n8-s1")
    (tmp_path / "README.md").write_text("# our runs\n")
    (tmp_path / "figures").mkdir()
    paths = sorted(tmp_path.iterdir())  # what `labkit compare data/runs/*` passes
    with pytest.warns(UserWarning) as caught:
        frame = load_runs(paths)
    assert set(frame.run) == {"n8-s1"}
    messages = [str(w.message) for w in caught]
    assert any(m.startswith(f"skipped {tmp_path / 'README.md'}: not a run folder or a miles log")
               for m in messages)
    assert any(m.startswith(f"skipped {tmp_path / 'figures'} holds no run folder") for m in messages)


def test_a_copied_run_folder_is_one_run_not_two_seeds(tmp_path):
    import shutil

    run = small_run(tmp_path, "n8-s1")
    config = json.loads((run / "config.json").read_text())
    (run / "config.json").write_text(json.dumps({**config, "run_name": None}))  # named by folder
    shutil.copytree(run, tmp_path / "n8-s1-backup")
    small_run(tmp_path, "n8-s2", seed=2)
    with pytest.warns(UserWarning, match=r"n8-s1-backup is a copy of .*n8-s1 \(the same config"):
        frame = load_runs(tmp_path)
    assert sorted(frame.groupby("run").seed.first()) == [1, 2]


def test_with_steps_keeps_the_runs_that_logged_a_step(tmp_path, capsys):
    from labkit.analysis import with_steps
    from labkit.run.log import Run

    small_run(tmp_path, "a", n_steps=3)
    (tmp_path / "b").mkdir()  # a run stopped while its model loaded: a folder, no step
    (tmp_path / "b" / "config.json").write_text("{}")
    small_run(tmp_path, "c", n_steps=2)
    kept = with_steps([Run(tmp_path / "a"), tmp_path / "b", Run(tmp_path / "c")])
    assert kept == [tmp_path / "a", tmp_path / "c"]
    assert "left out: run b has no finished step yet" in capsys.readouterr().err
    assert sorted(load_runs(kept).run.unique()) == ["a", "c"]
    with pytest.raises(AnalysisError, match="no run has a finished step yet"):
        with_steps([tmp_path / "b"])


def test_a_config_that_loops_is_named_by_the_analysis_not_read_as_missing(tmp_path):
    run = small_run(tmp_path, "a", seed=1)
    (run / "config.json").unlink()
    (run / "config.json").symlink_to(run / "config.json")
    with pytest.raises(AnalysisError, match=r"config.json is a symbolic link that loops"):
        load_runs(tmp_path)
