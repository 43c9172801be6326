"""Watchdog: bursts, stalls and policy decisions on hand-made logs with known answers; replay."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from labkit.cli import main as labkit_main
from labkit.course.incidents import BurstSpec, course_scenario, make_scenario, write_scenario
from labkit.serving.replay import read_events, replay
from labkit.serving.watchdog import Policy, Watchdog

INCIDENTS = Path(__file__).parents[1] / "data" / "incidents"


def fail(t, rid, attempt=1, status=503):
    return {"t": t, "event": "fail", "request_id": rid, "attempt": attempt, "status": status,
            "code": "no_available_workers"}


def done(t, rid="x"):
    return {"t": t, "event": "done", "request_id": rid, "attempts": 1}


def feed(dog, events):
    for e in events:
        dog.observe(e)
    dog.finish()
    return dog


def test_bursts_split_on_gaps_longer_than_burst_gap():
    events = [fail(100.0, "a"), fail(101.0, "b"), fail(102.0, "a", 2),  # burst 0
              fail(110.0, "c"), fail(111.5, "c", 2)]  # 8 s later: burst 1
    table = feed(Watchdog(burst_gap=5.0), events).burst_table()
    assert table[["start_s", "end_s", "duration_s", "lines", "requests", "max_attempts"]].values.tolist() == [
        [0.0, 2.0, 2.0, 3, 2, 2], [10.0, 11.5, 1.5, 2, 1, 2]]
    merged = feed(Watchdog(burst_gap=10.0), events).burst_table()
    assert len(merged) == 1 and merged.loc[0, "lines"] == 5 and merged.loc[0, "requests"] == 3


def test_gap_equal_to_burst_gap_keeps_the_burst():
    table = feed(Watchdog(burst_gap=5.0), [fail(0.0, "a"), fail(5.0, "a", 2)]).burst_table()
    assert len(table) == 1 and table.loc[0, "duration_s"] == 5.0


def test_only_503_lines_make_bursts():
    dog = feed(Watchdog(), [fail(0.0, "a", status=None), fail(1.0, "a", 2, status=502), fail(2.0, "b")])
    assert dog.burst_table()["lines"].tolist() == [1]
    assert dog.counts["fail"] == 3


def test_stall_is_flagged_at_last_completion_plus_threshold():
    events = [{"t": 0.0, "event": "step_start", "step": 0}, done(1.0), done(100.0),
              {"t": 101.0, "event": "step_end", "step": 0}]
    dog = feed(Watchdog(stall_s=30.0), events)
    assert dog.stall_table().values.tolist() == [[1.0, 31.0, 100.0, 99.0]]
    assert [(d.t, d.action) for d in dog.decisions] == [(31.0, "stall")]


def test_heat_pause_and_training_time_are_not_stalls():
    events = [{"t": 0.0, "event": "step_start"}, done(1.0),
              {"t": 2.0, "event": "heat_start"}, {"t": 90.0, "event": "heat_end"}, done(100.0),
              {"t": 101.0, "event": "step_end"}, {"t": 300.0, "event": "step_start"}, done(310.0)]
    assert feed(Watchdog(stall_s=30.0), events).stall_table().empty


def test_lower_policy_lowers_during_a_burst_and_restores_after_the_gap():
    dog = Watchdog(burst_gap=5.0, policy=Policy(on_burst="lower", lower_factor=0.25), open_limit=512)
    out = dog.observe(fail(10.0, "a"))
    assert [(d.action, d.limit) for d in out] == [("lower", 128)] and dog.limit == 128
    dog.observe(fail(12.0, "b"))
    assert dog.tick(16.9) == [] and dog.limit == 128  # 4.9 s after the last line: still a burst
    restored = dog.tick(17.5)
    assert [(d.t, d.action, d.limit) for d in restored] == [(17.0, "restore", 512)]
    assert dog.limit == 512


def test_stop_policy_stops_once_when_a_burst_outlasts_its_limit():
    dog = Watchdog(burst_gap=5.0, policy=Policy(stop_burst_s=3.0))
    actions = [d.action for t in range(7) for d in dog.observe(fail(float(t), "a", t + 1))]
    assert actions == ["stop"]
    stop = dog.decisions[0]
    assert stop.t == 4.0 and "Policy.stop_burst_s" in stop.reason


def test_stop_policy_stops_on_a_long_stall():
    dog = Watchdog(stall_s=10.0, policy=Policy(stop_stall_s=20.0))
    dog.observe({"t": 0.0, "event": "step_start"})
    out = dog.tick(25.0)
    assert [(d.t, d.action) for d in out] == [(10.0, "stall"), (20.0, "stop")]


def test_policy_refuses_unknown_action():
    with pytest.raises(ValueError, match="on_burst"):
        Policy(on_burst="panic")


# ------------------------------------------------------------------ replay
def write(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines))
    return path


def test_replay_counts_bad_lines_and_sorts_late_ones(tmp_path):
    good = [fail(0.0, "a"), fail(1.0, "b"), fail(20.0, "c"), done(21.0, "c")]
    clean = write(tmp_path / "clean.jsonl", [json.dumps(e) for e in good])
    messy = write(tmp_path / "messy.jsonl", [
        json.dumps(good[1]), json.dumps(good[0]),  # out of order
        "not json at all", "[1, 2]", json.dumps({"event": "fail"}),  # malformed
        json.dumps({"t": "soon", "event": "done"}), json.dumps({"t": 5.0, "event": "weird"}),
        json.dumps(good[2]), json.dumps(good[3])[:-7],  # truncated last line
    ])
    a, b = replay(clean), replay(messy)
    assert b.summary["bad_lines"] == 5 and b.summary["out_of_order"] == 1 and b.summary["unknown"] == 1
    assert len(b.summary["bad_examples"]) == 3
    assert b.bursts.equals(a.bursts) and len(a.bursts) == 2
    assert "bad lines: 5" in b.report()


def test_replay_of_an_empty_or_missing_log(tmp_path):
    empty = replay(write(tmp_path / "empty.jsonl", []))
    assert empty.bursts.empty and empty.summary["events"] == 0
    with pytest.raises(FileNotFoundError, match="no client log"):
        replay(tmp_path / "absent.jsonl")


def test_replay_is_deterministic_on_the_course_sized_constructed_log(tmp_path):
    path = write_scenario(tmp_path / "course.constructed.jsonl", course_scenario(seed=3))
    policy = Policy(on_burst="lower", stop_burst_s=50.0)
    first, second = replay(path, policy=policy), replay(path, policy=policy)
    pd.testing.assert_frame_equal(first.bursts, second.bursts)
    pd.testing.assert_frame_equal(first.decisions, second.decisions)
    assert first.summary["lines_503"] == 22_357 and first.summary["constructed"]
    assert len(first.bursts) == 12 and first.bursts["duration_s"].max() == 60.0
    assert (first.decisions["action"] == "stop").sum() == 1
    assert "CONSTRUCTED" in first.report()


def test_constructed_scenario_has_the_recipe_it_was_given():
    events = make_scenario([BurstSpec(10.0, 20.0, 5.0), BurstSpec(60.0, 5.0, 4.0)],
                           steps=1, step_s=100.0, requests=64, seed=1)
    assert events[0]["event"] == "meta" and events[0]["constructed"] is True
    dog = Watchdog(burst_gap=5.0)
    table = feed(dog, events).burst_table()
    assert table[["start_s", "duration_s", "lines"]].values.tolist() == [[10.0, 20.0, 100], [60.0, 5.0, 20]]
    assert dog.counts["done"] == 64


def test_write_scenario_refuses_a_name_without_constructed(tmp_path):
    with pytest.raises(ValueError, match="constructed"):
        write_scenario(tmp_path / "incident.jsonl", [])


def test_replay_main_prints_the_table_and_saves_the_plot(tmp_path, capsys):
    path = write_scenario(tmp_path / "small.constructed.jsonl",
                          make_scenario([BurstSpec(5.0, 10.0, 6.0)], step_s=40.0, requests=16))
    assert labkit_main(["replay", str(path), "--burst-gap", "4", "--on-burst", "lower",
                        "--out", str(tmp_path / "o")]) == 0
    out = capsys.readouterr().out
    assert "bursts (gap > 4 s ends one): 1" in out and "lower" in out
    assert (tmp_path / "o" / "small.constructed-timeline.png").stat().st_size > 0
    assert (tmp_path / "o" / "small.constructed-timeline.svg").stat().st_size > 0
    assert labkit_main(["replay", str(tmp_path / "nope.jsonl")]) == 2


# ------------------------------------------------------------------ the recorded incident
def incident_logs() -> list[Path]:
    return sorted(p for p in INCIDENTS.glob("*.jsonl") if "constructed" not in p.name)


@pytest.mark.parametrize("log", incident_logs(), ids=lambda p: p.stem)
def test_recorded_incident_replays_to_its_committed_summary(log):
    expected_path = log.with_suffix(".expected.json")
    assert expected_path.exists(), f"{expected_path.name} is missing: rerun benchmarks/record_incident.py"
    expected = json.loads(expected_path.read_text())
    result = replay(log, burst_gap=expected["burst_gap"], stall_s=expected["stall_s"])
    assert not result.summary["constructed"]
    assert result.summary["lines_503"] == expected["lines_503"]
    assert result.summary["bad_lines"] == expected["bad_lines"]
    assert result.bursts.to_dict(orient="records") == expected["bursts"]
    assert read_events(log).meta.get("machine"), "a recorded incident names its machine"


def test_at_least_one_recorded_incident_is_committed():
    assert incident_logs(), "data/incidents/ holds no recorded incident log"


def test_a_policys_stop_is_its_last_decision(tmp_path):
    """The run stops at the policy's stop: the log after it is still counted (its burst), but
    no decision is taken on it (no lower or restore after the stop)."""
    events = [{"t": 0.0, "event": "step_start", "step": 0, "requests": 8, "open_limit": 64},
              done(1.0), fail(200.0, "a"), fail(201.0, "b"), done(230.0, "a")]
    path = write(tmp_path / "stalled.jsonl", [json.dumps(e) for e in events])
    result = replay(path, policy=Policy(on_burst="lower", stop_stall_s=100.0))
    assert result.decisions["action"].tolist() == ["stall", "stop"]
    assert result.summary["stopped_at_s"] == 101.0 and len(result.bursts) == 1
    assert "stopped the run at 101.0 s" in result.report()


def test_a_file_that_is_not_a_client_log_is_refused_in_one_line(tmp_path, capsys):
    png = tmp_path / "timeline.png"
    png.write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 4)
    metrics = write(tmp_path / "metrics.jsonl", [json.dumps({"rollout/step": 0, "rollout/raw_reward": 0.5})])
    for path in (png, metrics):
        with pytest.raises(ValueError, match="not a client log"):
            replay(path)
    assert labkit_main(["replay", str(png), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"labkit replay: {png}: not a client log") and "\n" not in err
    assert not (tmp_path / "o").exists()


def test_a_stall_the_log_ends_in_says_where_the_recording_stops(tmp_path):
    events = [{"t": 0.0, "event": "meta", "ended": "stopped by hand"},
              {"t": 0.0, "event": "step_start", "step": 0, "requests": 8, "open_limit": 8},
              done(1.0), done(2.0), fail(150.0, "a"), fail(190.0, "b")]
    result = replay(write(tmp_path / "cut.jsonl", [json.dumps(e) for e in events]))
    assert np.isnan(result.stalls.end_s.iat[0])
    assert result.summary["open_step"] == 0 and result.summary["requests"] == 8
    assert ("  the stall from 2.0 s has no end: the recording stops at 190.0 s, in step 0 "
            "(2 of 8 requests answered; stopped by hand)") in result.report().splitlines()


def test_the_recorded_incidents_last_stall_ends_with_the_recording():
    result = replay(INCIDENTS / "vllm-cpu-2x-512open.jsonl")
    assert ("no end: the recording stops at 301.2 s, in step 0 (48 of 512 requests answered; "
            "stopped by hand with SIGTERM)") in result.report()
