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


def test_vllm_only_flags_on_the_hf_engine_are_said_to_be_ignored(capsys, monkeypatch):
    import labkit.engines
    from labkit.cli import main
    from labkit.config import RunConfig
    from labkit.models import resolve_model

    resolve_model(RunConfig.preset("cpu").model)  # a cold cache dequantizes first, with a progress bar
    capsys.readouterr()
    assert main(["launch", "--preset", "cpu", "--dry-run", "--rollout-kv-cache-gb", "8",
                 "--no-rollout-sleep"]) == 0
    err = capsys.readouterr().err.strip()
    assert err == ("labkit launch: warning: --rollout-kv-cache-gb, --no-rollout-sleep only change "
                   "vLLM in the trainer's process; the hf engine this run uses ignores them")
    assert main(["launch", "--preset", "cpu", "--dry-run"]) == 0
    assert capsys.readouterr().err == ""
    monkeypatch.setattr(labkit.engines, "vllm_installed", lambda: True)  # the dry run asks, as the run
    assert main(["launch", "--preset", "cpu", "--dry-run", "--engine", "vllm",
                 "--rollout-kv-cache-gb", "8"]) == 0
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


# ----------------------------------------------------------------------------- the sweep's words
NO_VALUE = ["--use-liger-kernel", "--no-use-liger-kernel", "--gradient-checkpointing", "--no-progress",
            "--share-prompt", "--no-use-dynamic-batch-size", "--rollout-seed-each-answer",
            "--torch-compile"]


@pytest.mark.parametrize("flag", NO_VALUE)
def test_a_flag_that_takes_no_value_never_takes_the_next_list_in_any_order(
        tmp_path, tiny_model_dir, monkeypatch, flag):
    """A boolean flag (of a field that may be auto, or not) before a list of ints, floats or
    choices: every order gives the same eight runs, each with the flag."""
    import labkit.sweep

    started = []
    monkeypatch.setattr(labkit.sweep, "run_sweep", lambda configs, **kw: started.append(configs) or [])
    items = [[flag], ["--seed", "1,2"], ["--lr", "1e-3,2e-3"], ["--loss-agg-mode", "token-mean,seq-mean"]]
    orders = [items[k:] + items[:k] for k in range(len(items))]
    orders += [order[::-1] for order in orders]
    field = flag.removeprefix("--").removeprefix("no-").replace("-", "_")
    for order in orders:
        words = [w for item in order for w in item]
        started.clear()
        assert main(["sweep", *tiny_flags(tiny_model_dir, tmp_path / "runs"), *words]) == 0, words
        (configs,) = started
        assert {(c.seed, c.lr, c.loss_agg_mode) for c in configs} == {
            (s, lr, mode) for s in (1, 2) for lr in (1e-3, 2e-3) for mode in ("token-mean", "seq-mean")}
        assert {getattr(c, field) for c in configs} == {not flag.startswith("--no-")}, words


def test_the_sweeps_own_flags_and_two_booleans_in_a_row_leave_the_lists_whole(
        tmp_path, tiny_model_dir, monkeypatch):
    import labkit.sweep

    started = []
    monkeypatch.setattr(labkit.sweep, "run_sweep", lambda configs, **kw: started.append(configs) or [])
    words = ["--gradient-checkpointing", "--use-liger-kernel", "--seed", "1,2", "--resume",
             "--no-progress", "--save-interval", "-1,1", "--share-prompt", "--lr=1e-3,2e-3"]
    assert main(["sweep", *tiny_flags(tiny_model_dir, tmp_path / "runs"), *words]) == 0
    (configs,) = started
    assert {(c.seed, c.save_interval, c.lr) for c in configs} == {
        (s, k, lr) for s in (1, 2) for k in (-1, 1) for lr in (1e-3, 2e-3)}
    assert all(c.gradient_checkpointing and c.use_liger_kernel and c.share_prompt
               and not c.progress for c in configs)


@pytest.mark.parametrize("listed, alone", [
    (["--n-samples-per-prompt", "0,4"], ["--n-samples-per-prompt", "0"]),
    (["--n-samples-per-prompt", "4,-2"], ["--n-samples-per-prompt", "-2"]),
    (["--rollout-batch-size", "0,2"], ["--rollout-batch-size", "0"]),
    (["--n-samples-per-prompt", "1,4"], ["--n-samples-per-prompt", "1"]),
])
def test_a_sweep_names_a_listed_value_that_cannot_run_as_launch_names_it(
        tmp_path, tiny_model_dir, capsys, listed, alone):
    """The global batch a sweep derives (prompts x answers) from a value that cannot run is
    not the cause: the value is, in launch's words."""
    flags = tiny_flags(tiny_model_dir, tmp_path / "runs")
    i = flags.index("--global-batch-size")
    del flags[i:i + 2]
    flags += ["--micro-batch-size", "2"]
    assert main(["launch", *flags, *alone]) == 2
    launch_err = capsys.readouterr().err.strip()
    assert main(["sweep", *flags, *listed]) == 2
    sweep_err = capsys.readouterr().err.strip()
    assert sweep_err == launch_err.replace("labkit launch: ", "labkit sweep: ", 1)
    assert alone[0] in sweep_err and "--micro-batch-size" not in sweep_err
    assert not (tmp_path / "runs").exists()


def test_a_micro_batch_larger_than_the_derived_global_batch_says_where_that_came_from(
        tmp_path, tiny_model_dir, capsys):
    flags = tiny_flags(tiny_model_dir, tmp_path / "runs")
    i = flags.index("--global-batch-size")
    del flags[i:i + 2]
    assert main(["sweep", *flags, "--micro-batch-size", "16", "--n-samples-per-prompt", "2,4"]) == 2
    assert capsys.readouterr().err.strip() == (
        "labkit sweep: --micro-batch-size 16 is larger than --global-batch-size 4; use "
        "--micro-batch-size 4 or less (the sweep's --global-batch-size, where it is not given, is "
        "--rollout-batch-size 2 x --n-samples-per-prompt 2)")


# ----------------------------------------------------------------------------- dry run against run
def _file_in_the_way(tmp):
    (tmp / "a-file").write_text("not a folder")
    return ["--output-dir", str(tmp / "a-file" / "runs")]


def _a_run_there(tmp):
    (tmp / "runs" / "tiny").mkdir(parents=True)
    (tmp / "runs" / "tiny" / "config.json").write_text("{}")
    return []


REFUSED_ALIKE = {  # what a run refuses on a machine without a GPU: (command and flags, env, setup)
    "sweep --gpus 7": (["sweep", "--seed", "1,2", "--gpus", "7"], {}, None),
    "sweep --gpus a": (["sweep", "--seed", "1,2", "--gpus", "a"], {}, None),
    "sweep --gpus ''": (["sweep", "--seed", "1,2", "--gpus", ""], {}, None),
    "LABKIT_GPUS=-1": (["sweep", "--seed", "1,2"], {"LABKIT_GPUS": "-1"}, None),
    "LABKIT_GPUS=0": (["sweep", "--seed", "1,2"], {"LABKIT_GPUS": "0"}, None),
    "one run, --gpus 0": (["sweep", "--gpus", "0"], {}, None),
    "launch --use-liger-kernel": (["launch", "--use-liger-kernel"], {}, None),
    "sweep --use-liger-kernel": (["sweep", "--use-liger-kernel", "--seed", "1,2"], {}, None),
    "launch --engine vllm": (["launch", "--engine", "vllm"], {}, None),
    "sweep --engine vllm": (["sweep", "--seed", "1,2", "--engine", "vllm"], {}, None),
    "launch, a file in --output-dir": (["launch"], {}, _file_in_the_way),
    "sweep, a file in --output-dir": (["sweep", "--seed", "1,2"], {}, _file_in_the_way),
    "launch, a run there": (["launch"], {}, _a_run_there),
    "launch --data nowhere": (["launch", "--data", "NOWHERE"], {}, None),
}


@pytest.mark.parametrize("case", list(REFUSED_ALIKE))
def test_a_dry_run_refuses_exactly_what_the_run_refuses(case, tmp_path, tiny_model_dir, capsys,
                                                        monkeypatch):
    """Each case is refused by the run before it starts, in one line; its --dry-run is refused
    in the same line (before, the dry run passed these, and a sweep trained on the CPU with
    --gpus 7 given)."""
    import torch

    import labkit.engines

    if torch.cuda.is_available():
        pytest.skip("these are a machine without a GPU's refusals")
    monkeypatch.setattr(labkit.engines, "vllm_installed", lambda: False, raising=False)
    words, env, setup = REFUSED_ALIKE[case]
    command, extra = words[0], [str(tmp_path / "nowhere") if w == "NOWHERE" else w for w in words[1:]]
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    flags = tiny_flags(tiny_model_dir, tmp_path / "runs")
    extra += setup(tmp_path) if setup else []
    for i in range(0, len(extra) - 1):  # a value given here replaces tiny_flags' own
        if extra[i] in flags and extra[i].startswith("--") and not extra[i + 1].startswith("--"):
            flags[flags.index(extra[i]) + 1] = extra[i + 1]
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    said = []
    for dry in ([], ["--dry-run"]):
        code = main([command, *flags, *extra, *dry])
        err = capsys.readouterr().err.strip().splitlines()
        said.append((code, err))
        assert code == 2 and len(err) == 1, (dry, code, err)
    assert said[0] == said[1]
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before  # nothing made


def test_a_dry_run_of_a_resume_starts_nothing_and_refuses_what_the_resume_refuses(
        tmp_path, tiny_model_dir, capsys):
    out = tmp_path / "runs"
    flags = tiny_flags(tiny_model_dir, out) + ["--save-interval", "1"]
    assert main(["launch", *flags]) == 0
    run = out / "tiny"
    before = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()}
    capsys.readouterr()
    assert main(["launch", "--resume", str(run), "--num-rollout", "3", "--dry-run"]) == 0
    said = capsys.readouterr().out
    assert f"resume: {run} would go on after step 1 (its checkpoint) to step 2; nothing started" in said
    assert {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()} == before  # not trained
    for dry in ([], ["--dry-run"]):  # nothing left to run: both refuse, in the same line
        assert main(["launch", "--resume", str(run), *dry]) == 2
        assert "nothing to run, the checkpoint is after step 1" in capsys.readouterr().err
    assert main(["launch", "--resume", str(run), "--seed", "8", "--dry-run"]) == 2
    assert "the config does not match the run folder" in capsys.readouterr().err
    from labkit.run.log import RunLog

    holder = RunLog.open(run)  # a trainer holds the folder
    try:
        said = []
        for dry in ([], ["--dry-run"]):
            assert main(["launch", "--resume", str(run), "--num-rollout", "3", *dry]) == 2
            said.append(capsys.readouterr().err.strip())
        assert said[0] == said[1] and "is in use by another trainer" in said[0], said
    finally:
        holder.release()


# ----------------------------------------------------------------------------- files a command reads
def _lesson(cells: int = 3) -> str:
    """A made-up lesson notebook, as Jupyter writes it."""
    return json.dumps({"cells": [{"cell_type": "code", "execution_count": None, "id": f"c{i}",
                                  "metadata": {}, "outputs": [], "source": [f"x{i} = {i}\n"]}
                                 for i in range(cells)],
                       "metadata": {}, "nbformat": 4, "nbformat_minor": 5}, indent=1)


@pytest.mark.parametrize("damage, said", [
    (lambda text: text[:len(text) // 2], r"not a notebook, damaged at line \d+, column \d+ \("),
    (lambda text: text.replace('"x1 = 1', '"x1 = 1\x00\\'), r"not a notebook, damaged at line 2\d, column"),
    (lambda text: "[1, 2]", r"not a notebook \(no list of cells in it\)"),
    (lambda text: json.dumps({**json.loads(text), "cells": [{"source": ["x = 1\n"]}]}),
     r"not a notebook as Jupyter writes it \(KeyError: 'cell_type'\)"),
])
def test_students_names_the_damaged_source_notebook_and_leaves_the_copies(tmp_path, capsys, damage,
                                                                          said):
    import re

    src = tmp_path / "notebooks"
    src.mkdir()
    (src / "01_good.ipynb").write_text(_lesson())
    (src / "02_damaged.ipynb").write_text(_lesson())
    assert main(["students", str(src)]) == 0
    copies = {p.name: p.read_bytes() for p in (src / "students").iterdir()}
    (src / "02_damaged.ipynb").write_text(damage(_lesson()))
    capsys.readouterr()
    assert main(["students", str(src)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith(f"labkit students: {src / '02_damaged.ipynb'}: "), err
    assert re.search(said, err), err
    assert {p.name: p.read_bytes() for p in (src / "students").iterdir()} == copies


def test_a_disk_that_fills_before_the_reward_plot_is_one_line_naming_it(tmp_path, tiny_model_dir,
                                                                         capsys, monkeypatch):
    """The run's files are all written (status.json: completed); the plot after it finds the
    disk full: one line names the plot and the status, nothing half written stays, and the
    command exits as the run ended (it completed)."""
    import errno

    from matplotlib.figure import Figure

    def no_room(self, fname, *a, **k):  # what matplotlib raises when the disk is full
        with open(fname, "wb") as f:
            f.write(b"\x89PNG half")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(Figure, "savefig", no_room)
    out = tmp_path / "runs"
    assert main(["launch", *tiny_flags(tiny_model_dir, out)]) == 0
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("labkit")]
    run = out / "tiny"
    assert len(err) == 1 and err[0].startswith(
        f"labkit: could not write the reward plot {run / 'reward.png'} (and .svg): the disk is full ("), err
    assert err[0].endswith(f"free some space; the run itself is written whole (its status: "
                           f"{run / 'status.json'})"), err
    assert json.loads((run / "status.json").read_text())["reason"] == "completed"
    assert not (run / "reward.png").exists() and not (run / "reward.svg").exists()
