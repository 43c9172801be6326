"""labkit.analysis.table: the group-size table, its checks and the `labkit compare` command."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
from fixtures_runs import CLEAN_N4, small_run

from labkit.analysis.runframe import AnalysisError, load_runs
from labkit.analysis.table import check_comparable, compare, render_table
from labkit.cli import main as labkit_main


def test_compare_table(runs):
    table = compare(runs)
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
    table = compare(runs)
    md = render_table(table)
    assert md.splitlines()[0].startswith("|") and "+0.038, +0.061, +0.098" in md
    text = render_table(table, "text")
    assert "group size" in text and "|" not in text
    with pytest.raises(ValueError, match="use 'markdown' or 'text'"):
        render_table(table, "html")


def test_compare_command(course_dir, tmp_path, capsys, monkeypatch):
    from labkit import analysis

    calls = []  # drawing is tested in test_plots; here: what is printed and where plots go
    monkeypatch.setattr(analysis, "plot_all", lambda runs, out, **kw: calls.append((runs, out)) or [])
    assert labkit_main(["compare", str(course_dir)]) == 0
    printed = capsys.readouterr().out
    assert "group size |" in printed and "Inside one range" in printed
    assert "Common clean steps (14): 0, 1, 3, 4, 7" in printed
    assert "Its median of 188.2 s includes the pauses" in printed
    assert calls[0][1] == Path("compare") and calls[0][0].run.nunique() == 5  # ./compare
    labkit_main(["compare", str(course_dir), "--out", str(tmp_path / "plots")])
    assert calls[1][1] == tmp_path / "plots"


def test_compare_command_reports_errors(tmp_path, capsys):
    assert labkit_main(["compare", str(tmp_path)]) == 2
    assert "holds no run folder" in capsys.readouterr().err


def test_run_without_rewards(tmp_path):
    run = small_run(tmp_path, "norew")
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    (run / "metrics.jsonl").write_text(
        "".join(json.dumps({k: v for k, v in r.items() if k != "rollout/raw_reward"}) + "\n"
                for r in rows))
    with pytest.raises(AnalysisError, match=r"run norew logged no rollout/raw_reward"):
        compare(load_runs(run))


def test_different_prompts_are_refused_or_warned_when_mixed(tmp_path):
    small_run(tmp_path, "p32", seed=1)
    small_run(tmp_path, "p32b", seed=2)
    small_run(tmp_path, "p16", group_size=4, prompts=16)
    runs = load_runs(tmp_path)
    with pytest.raises(AnalysisError, match=r"differ in prompts, so runs of one group size are "
                       r"not seeds of one setting: prompts 16: p16; prompts 32: p32, p32b\. "
                       r"Select runs of one setting \(e\.g\. runs\[\(runs\.prompts == 32\)\]"):
        compare(runs)
    with pytest.warns(UserWarning, match=r"differ in prompts per rollout.*16 in p16.*32 in p32, p32b"):
        compare(runs, mixed=True)


def test_global_batch_not_one_step_warns(tmp_path):
    small_run(tmp_path, "r", prompts=32, global_batch=128)
    with pytest.warns(UserWarning, match=r"--global-batch-size 128 is not 32 prompts x 8 answers = 256"):
        check_comparable(load_runs(tmp_path))


def test_same_config_does_not_warn(runs):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_comparable(runs)


def test_compare_refuses_runs_of_other_learning_rates_and_lists_them(tmp_path, capsys):
    for name, lr, seed in [("a1", 1e-6, 1), ("a2", 1e-6, 2), ("b1", 1e-5, 1)]:
        small_run(tmp_path, name, seed=seed, lr=lr)
    assert labkit_main(["compare", str(tmp_path), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "differ in lr" in err and "lr 1e-06: a1, a2; lr 1e-05: b1" in err
    assert not (tmp_path / "out").exists()  # nothing written for a refused comparison
    assert labkit_main(["compare", str(tmp_path), "--out", str(tmp_path / "out"), "--mixed"]) == 0


def test_two_runs_of_one_seed_are_not_counted_as_two_seeds(tmp_path, capsys):
    small_run(tmp_path, "a", seed=1)
    small_run(tmp_path, "b", seed=1, response_len=150.0)  # a rerun of seed 1, not a copy of a
    small_run(tmp_path, "c", seed=2)
    runs = load_runs(tmp_path)
    with pytest.raises(AnalysisError, match=r"a, b \(group size 8\) share seed 1, so they are one "
                                            r"seed, not 2\. Keep one run of each seed, or pass "
                                            r"mixed=True"):
        compare(runs)
    assert labkit_main(["compare", str(tmp_path), "--out", str(tmp_path / "out")]) == 2
    assert "share seed 1" in capsys.readouterr().err
    with pytest.warns(UserWarning, match="share seed 1.*the table counts each run as a seed"):
        compare(runs, mixed=True)
    small_run(tmp_path / "other", "b", seed=3)  # seeds 1, 2, 3: three seeds
    assert compare(load_runs([tmp_path / "a", tmp_path / "c", tmp_path / "other"]))["seeds"].tolist() == [3]
