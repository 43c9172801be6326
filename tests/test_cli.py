"""The command line: a launch that cannot start says so in one line, exits non-zero and leaves
no run folder; --debug shows the traceback; a stopped run's exit code says why it stopped."""

from __future__ import annotations

import json

import pytest

from labkit.cli import main
from labkit.errors import DataError


def tiny_flags(model, out) -> list[str]:
    return ["--model", str(model), "--data", "synthetic", "--engine", "hf",
            "--rollout-batch-size", "2", "--n-samples-per-prompt", "4", "--global-batch-size", "8",
            "--num-rollout", "2", "--rollout-max-response-len", "12", "--lr", "1e-3", "--eval-split-size", "0",
            "--no-progress", "--output-dir", str(out), "--run-name", "tiny"]


def bad_gguf(tmp_path):
    path = tmp_path / "model.gguf"
    path.write_bytes(b"<html>404 Not Found</html>")  # what a failed download leaves
    return ["--model", str(path)], "--model .*model.gguf: not a GGUF model"


def truncated_model(tmp_path, tiny_model_dir):
    folder = tmp_path / "cut"
    folder.mkdir()
    for f in tiny_model_dir.iterdir():
        data = f.read_bytes()
        (folder / f.name).write_bytes(data[:4000] if f.suffix == ".safetensors" else data)
    return ["--model", str(folder)], "--model .*cut: not a Hugging Face model .*truncated"


def file_as_output_dir(tmp_path):
    (tmp_path / "taken").write_text("a file, not a folder")
    return ["--output-dir", str(tmp_path / "taken" / "runs")], "--output-dir .*cannot create the run folder"


CASES = {
    "data path": lambda tmp, model: (["--data", str(tmp / "nowhere")], "--data .*nowhere.*no such file"),
    "bad data": lambda tmp, model: (["--data", str(_bad_jsonl(tmp))],
                                    r"bad.jsonl \(train\): no usable rows of 2: 2 not JSON \(bad.jsonl line 1"),
    "not a model": lambda tmp, model: bad_gguf(tmp),
    "truncated model": lambda tmp, model: truncated_model(tmp, model),
    "output folder": lambda tmp, model: file_as_output_dir(tmp),
    "NaN": lambda tmp, model: (["--lr", "nan"], "--lr must be a finite number, got nan"),
    "negative clip": lambda tmp, model: (["--clip-grad", "-1"], "--clip-grad must be > 0"),
}


def _bad_jsonl(tmp):
    path = tmp / "bad.jsonl"
    path.write_text('{"question": "Q?", "answer": "#### 1"\n{oops}\n')
    return path


@pytest.mark.parametrize("case", list(CASES))
def test_a_launch_that_cannot_start_prints_one_line_and_leaves_no_run_folder(
        case, tmp_path, tiny_model_dir, capsys):
    out = tmp_path / "runs"
    extra, expected = CASES[case](tmp_path, tiny_model_dir)
    flags = tiny_flags(tiny_model_dir, out)
    for i in range(0, len(extra), 2):  # the case's value replaces the default one
        if extra[i] in flags:
            flags[flags.index(extra[i]) + 1] = extra[i + 1]
        else:
            flags += extra[i:i + 2]
    code = main(["launch", *flags])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert len(err) == 1 and "Traceback" not in err[0], err
    assert err[0].startswith("labkit launch: ")
    import re

    assert re.search(expected, err[0]), err[0]
    assert not out.exists() or not any(out.iterdir()), "a failed start left a run folder behind"


def test_a_failed_start_does_not_block_the_retry(tmp_path, tiny_model_dir, capsys):
    out = tmp_path / "runs"
    flags = tiny_flags(tiny_model_dir, out) + ["--num-rollout", "1"]
    assert main(["launch", *flags, "--data", str(tmp_path / "nowhere")]) == 2
    assert main(["launch", *flags]) == 0
    status = json.loads((out / "tiny" / "status.json").read_text())
    assert status["reason"] == "completed"


def test_debug_shows_the_traceback(tmp_path, tiny_model_dir, monkeypatch):
    flags = tiny_flags(tiny_model_dir, tmp_path / "runs") + ["--data", str(tmp_path / "nowhere")]
    with pytest.raises(DataError, match="no such file or folder"):
        main(["--debug", "launch", *flags])
    with pytest.raises(DataError):
        main(["launch", "--debug", *flags])
    monkeypatch.setenv("LABKIT_DEBUG", "1")
    with pytest.raises(DataError):
        main(["launch", *flags])


def test_a_run_stopped_by_its_time_limit_exits_124(tmp_path, tiny_model_dir, monkeypatch):
    import functools

    import labkit.trainer as trainer

    # The run's clock moves 1 s each time the loop reads it (before each step), however long
    # loading and the steps take on a busy machine: a 2 s limit allows one step.
    ticks = iter(range(10_000)).__next__
    monkeypatch.setattr(trainer, "StopController", functools.partial(
        trainer.StopController, clock=lambda: float(ticks())))
    out = tmp_path / "runs"
    flags = tiny_flags(tiny_model_dir, out)
    flags[flags.index("--num-rollout") + 1] = "1000"  # far more than 2 s allow
    code = main(["launch", *flags, "--time-limit", "2"])
    status = json.loads((out / "tiny" / "status.json").read_text())
    assert status["reason"] == "time_limit" and code == 124
    assert status["last_step"] >= 0  # the 30 s checkpoint reserve no longer eats a short limit


def test_resume_of_a_folder_that_is_not_a_run_is_one_line(tmp_path, capsys):
    assert main(["launch", "--resume", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"labkit launch: --resume {tmp_path}: not a labkit run folder (no config.json); "
                   f"name a folder under runs/"]


def test_compare_takes_the_gain_windows_as_flags(tmp_path, capsys):
    from fixtures_runs import small_run

    for group, seed in [(4, 1), (8, 1), (8, 2)]:
        small_run(tmp_path / "runs", f"n{group}-s{seed}", group_size=group, seed=seed, n_steps=3)
    (tmp_path / "runs" / "README.md").write_text("three-step CPU runs\n")
    runs = sorted(str(p) for p in (tmp_path / "runs").iterdir())
    assert main(["compare", *runs, "--out", str(tmp_path / "plots")]) == 2
    assert "--early 0-1 --late 2-2" in capsys.readouterr().err  # the default 16-23 is too late
    assert main(["compare", *runs, "--early", "0-0", "--late", "2-2",
                 "--out", str(tmp_path / "plots")]) == 0
    captured = capsys.readouterr()
    assert "group size" in captured.out and "skipped" in captured.err


def test_a_launch_ends_with_the_reward_at_the_start_and_the_end_and_its_plot(tmp_path, tiny_model_dir, capsys):
    out = tmp_path / "runs"
    flags = tiny_flags(tiny_model_dir, out)
    flags[flags.index("--num-rollout") + 1] = "3"
    assert main(["launch", *flags]) == 0
    printed = capsys.readouterr().out
    steps = [json.loads(x) for x in (out / "tiny" / "metrics.jsonl").read_text().splitlines()]
    rewards = [s["rollout/raw_reward"] for s in steps]
    right = [s["rollout/right_frac"] for s in steps]
    line = next(x for x in printed.splitlines() if x.startswith("reward "))
    assert line.startswith(f"reward {rewards[0]:.3f} -> {rewards[-1]:.3f}, answers right "
                           f"{right[0]:.3f} -> {right[-1]:.3f} (the first and the last of 3 "
                           f"steps); plot: ")
    assert (out / "tiny" / "reward.png").stat().st_size > 0


def test_vllm_only_flags_on_the_hf_engine_are_said_to_be_ignored(capsys):
    from labkit.cli import main

    assert main(["launch", "--preset", "cpu", "--dry-run", "--rollout-kv-cache-gb", "8",
                 "--no-rollout-sleep"]) == 0
    err = capsys.readouterr().err.strip()
    assert err == ("labkit launch: warning: --rollout-kv-cache-gb, --no-rollout-sleep only change "
                   "vLLM in the trainer's process; the hf engine this run uses ignores them")
    assert main(["launch", "--preset", "cpu", "--dry-run"]) == 0
    assert capsys.readouterr().err == ""
    assert main(["launch", "--dry-run", "--engine", "vllm", "--rollout-kv-cache-gb", "8"]) == 0
    assert capsys.readouterr().err == ""


def test_a_path_that_cannot_be_written_is_one_line_naming_the_flag(tmp_path, capsys, course_dir):
    blocked = tmp_path / "a-file"
    blocked.write_text("not a folder")
    out = blocked / "out"
    assert main(["compare", str(course_dir), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith(f"labkit compare: --out {out}: cannot write the plots there (Not a directory)")
    notebooks = tmp_path / "notebooks"
    notebooks.mkdir()
    (notebooks / "01.ipynb").write_text('{"cells": [], "metadata": {}, "nbformat": 4, '
                                        '"nbformat_minor": 5}')
    assert main(["students", str(notebooks), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("labkit students: cannot write ") and "--out a folder you can write to" in err


@pytest.mark.parametrize("error, said", [
    (OSError(28, "No space left on device", "/data/x.png"), "No space left on device: /data/x.png"),
    (OverflowError("Python int too large to convert to C long"), "Python int too large"),
])
def test_an_os_or_overflow_error_is_one_line_not_an_unexpected_error(capsys, error, said):
    from labkit.cli import _guarded

    def command(_):
        raise error

    assert _guarded("compare", command, None) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"labkit compare: {said}") and "did not expect" not in err
    assert "\n" not in err


def test_without_a_progress_bar_each_finished_step_is_one_line(tmp_path, tiny_model_dir, capsys):
    """--no-progress (a log file, a sweep's run): a line per step, so a run is seen to move."""
    assert main(["launch", *tiny_flags(tiny_model_dir, tmp_path)]) == 0
    out = capsys.readouterr().out
    steps = [line for line in out.splitlines() if line.startswith("step ")]
    assert [line.split(":")[0] for line in steps] == ["step 0", "step 1"]
    assert all(", update " in line and " s, step " in line for line in steps), steps


# ----------------------------------------------------------------------------- labkit sweep
STOP_ONCE = '''
import os, signal
from pathlib import Path

def stops_once(response, label):
    flag = Path(__file__).parent / "stop-once"
    if flag.exists():
        flag.unlink()
        os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C, in the first run's first step
    return float(len(response) % 2)
'''


def test_a_stopped_sweep_says_the_command_that_continues_it(tmp_path, tiny_model_dir, capsys):
    """The exit code is this command's (130: its stop), the summary names the labkit sweep
    command that continues the runs, and that command finishes them (exit 0); the same
    command without --resume is refused in one line, naming it."""
    reward = tmp_path / "rewards.py"
    reward.write_text(STOP_ONCE)
    (tmp_path / "stop-once").write_text("")
    flags = tiny_flags(tiny_model_dir, tmp_path / "runs")
    flags[flags.index("--run-name") + 1] = "cli"
    sweep = ["sweep", *flags, "--seed", "1,2", "--custom-rm-path", f"{reward}:stops_once"]
    assert main(sweep) == 130
    said = capsys.readouterr().out
    assert "2 runs: 1 stopped (cli-p2-n4-s1); 1 not started (cli-p2-n4-s2); `labkit sweep " in said
    assert "--resume` continues them" in said and "launch_many" not in said
    assert main([*sweep, "--resume"]) == 0
    assert "2 runs: 2 completed (cli-p2-n4-s1, cli-p2-n4-s2)" in capsys.readouterr().out
    for seed in (1, 2):
        steps = [json.loads(line)["rollout/step"]
                 for line in (tmp_path / "runs" / f"cli-p2-n4-s{seed}" / "metrics.jsonl").open()]
        assert steps == [0, 1]
    assert main(sweep) == 2  # not 130 from the earlier run's status
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "cli-p2-n4-s2 already hold runs; `labkit sweep " in err[0]
    assert "--resume` continues them, or give these configs another --run-name" in err[0]


def test_a_sweep_splits_numbers_and_choices_never_paths(tmp_path, tiny_model_dir, monkeypatch):
    import labkit.sweep

    started = []
    monkeypatch.setattr(labkit.sweep, "run_sweep", lambda configs, **kw: started.extend(configs) or [])
    out = tmp_path / "a,b" / "runs"
    flags = tiny_flags(tiny_model_dir, out)
    assert main(["sweep", *flags, "--seed=1,2", "--save-interval", "-1,1",
                 "--loss-agg-mode", "token-mean,seq-mean"]) == 0
    assert len(started) == 8 and {c.output_dir for c in started} == {str(out)}
    assert {(c.seed, c.save_interval, c.loss_agg_mode) for c in started} == {
        (seed, save, mode) for seed in (1, 2) for save in (-1, 1) for mode in ("token-mean", "seq-mean")}
    assert len({c.run_name for c in started}) == 8


def test_sweep_gpus_reach_the_sweep_and_a_bad_list_is_one_line(tmp_path, tiny_model_dir, monkeypatch,
                                                               capsys):
    import labkit.sweep

    asked = []
    monkeypatch.setattr(labkit.sweep, "run_sweep", lambda configs, **kw: asked.append(kw["gpus"]) or [])
    flags = [*tiny_flags(tiny_model_dir, tmp_path / "runs"), "--seed", "1,2"]
    assert main(["sweep", *flags, "--gpus", "1,3"]) == 0
    assert main(["sweep", "--gpus=0", *flags]) == 0
    assert main(["sweep", *flags]) == 0  # none given: the sweep reads LABKIT_GPUS, else takes all
    assert asked == [["1", "3"], ["0"], None]
    capsys.readouterr()
    assert main(["sweep", *flags, "--gpus", "0,0"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "labkit sweep: --gpus 0,0: GPU 0 is listed twice; list each GPU once"]
    assert main(["sweep", "--help"]) == 0 and "--gpus 0,1" in capsys.readouterr().out


@pytest.mark.parametrize("lists, said", [
    (["--seed", "1,1"], "--seed 1,1: 1 is listed twice; list each value once"),
    (["--lr", "1e-3,0.001"], "--lr 1e-3,0.001: 0.001 is listed twice (the same value as 1e-3)"),
    (["--seed", "1,x"], "argument --seed: invalid int value: 'x'"),
    (["--seed", "1,2", "--seed", "3"], "--seed: the listed values do not reach the runs"),
    (["--seed", "1,2,3", "--data", "NOWHERE"], "--data 'NOWHERE': no such file or folder"),
    (["--seed", "1,2", "--run-name", "../x"], "--run-name '../x': a run name is one folder"),
    (["--seed", "1,2", "--backend", "miles"], "--backend: the sweep trains with labkit itself"),
])
def test_a_sweep_that_cannot_run_is_one_line_before_anything_starts(tmp_path, tiny_model_dir, capsys,
                                                                     lists, said):
    out = tmp_path / "runs"
    lists = [str(tmp_path / "nowhere") if x == "NOWHERE" else x for x in lists]
    said = said.replace("NOWHERE", str(tmp_path / "nowhere"))
    assert main(["sweep", *tiny_flags(tiny_model_dir, out), *lists]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"labkit sweep: {said}"), err
    assert not out.exists()


def test_sweep_help_lists_only_what_the_sweep_takes(capsys):
    assert main(["sweep", "--help"]) == 0
    out = capsys.readouterr().out
    assert "--resume " in out and "--dry-run" in out and "--time-limit is each run's own" in out
    assert "--backend" not in out and "RUN_DIR" not in out


# ----------------------------------------------------------------------------- causes named
@pytest.mark.parametrize("variable, flag", [("LABKIT_MODEL", "--model"), ("LABKIT_DATA", "--data")])
def test_an_error_in_a_local_copy_variable_names_the_variable(tmp_path, tiny_model_dir, monkeypatch,
                                                             capsys, variable, flag):
    monkeypatch.setenv(variable, str(tmp_path / "nowhere"))
    flags = [x for x in tiny_flags(tiny_model_dir, tmp_path / "runs")]
    i = flags.index(flag)
    del flags[i:i + 2]  # the default comes from the variable
    assert main(["launch", *flags]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"labkit launch: {variable}=") and "no such file or folder" in err
    assert f"{flag} " not in err.split(":", 2)[1]


def test_a_custom_reward_that_fails_at_import_is_one_line_naming_the_file(tmp_path, tiny_model_dir,
                                                                          capsys):
    bad = tmp_path / "broken_reward.py"
    bad.write_text("def reward(response, label)\n    return 1.0\n")
    flags = tiny_flags(tiny_model_dir, tmp_path / "runs") + ["--custom-rm-path", f"{bad}:reward"]
    assert main(["launch", *flags]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and f"importing {bad} failed (SyntaxError" in err
    assert "did not expect" not in err


def test_a_binary_file_in_a_run_folder_is_one_line_naming_it(tmp_path, capsys):
    run = tmp_path / "r"
    run.mkdir()
    (run / "metrics.jsonl").write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(range(256)))
    assert main(["compare", str(run), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"labkit compare: {run / 'metrics.jsonl'} is not text") and "\n" not in err
    assert "did not expect" not in err


def test_a_run_that_stopped_before_its_first_step_names_no_log_it_lacks(tmp_path, tiny_model_dir,
                                                                        capsys):
    out = tmp_path / "runs"
    assert main(["launch", *tiny_flags(tiny_model_dir, out), "--time-limit", "0.001"]) == 124
    said = capsys.readouterr().out
    assert not (out / "tiny" / "metrics.jsonl").exists() and "run log:" not in said
    assert f"run folder: {out / 'tiny'} (no step finished" in said
