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
                           f"{right[0]:.3f} -> {right[-1]:.3f} (mean of the first and of "
                           f"the last 1 of 3 steps); plot: ")
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
