"""launch_many: several runs from one call, one after another on a CPU or a process each.

Stops are driven by events: a reward function that signals its own process at a given step,
or that waits (for a file the test writes) until the test has stopped the sweep.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest
from conftest import folder_with_a_labkit

from labkit import sweep
from labkit.config import ConfigError
from labkit.machine import memory, placement
from labkit.run.log import RunLogError, read_jsonl

REWARD = '''
import os, signal, sys, time
from pathlib import Path

HERE = Path(__file__).parent
calls = 0

def _step(samples):
    global calls
    calls += 1
    return (calls - 1) // samples

def killed_at_step_1(response, label):
    if _step(8) == 1:  # as the kernel's out-of-memory killer would
        (HERE / f"killed-{os.getpid()}").write_text("")
        os.kill(os.getpid(), signal.SIGKILL)
    return float(len(response) % 2)

def stops_once_at_step_0(response, label):
    flag = HERE / "stop-once"
    if flag.exists():
        flag.unlink()
        os.kill(os.getpid(), signal.SIGINT)  # as a notebook's stop button would
    return float(len(response) % 2)

def exits_at_step_0(response, label):
    sys.exit(3)  # a reward that ends its process

def stops_in_the_last_step(response, label):
    if _step(8) == 1 and calls % 8 == 1:  # step 1 of 2: the run completes, the sweep stops
        os.kill(os.getpid(), signal.SIGINT)
    return float(len(response) % 2)

def waits_at_step_1(response, label):
    step = _step(8)
    if step == 1 and calls % 8 == 1:  # the first answer of step 1: say so, wait for the go
        (HERE / f"reached-{os.getpid()}").write_text("")
        end = time.monotonic() + 600  # a test that never says go: the run goes on
        while not (HERE / "go").exists() and time.monotonic() < end:
            time.sleep(0.05)
    return float(len(response) % 2)
'''

DEADLINE_S = 600.0  # a bound for a broken test, not the expected time


def _wait_until(condition, what: str) -> None:
    """Wait for `condition()` (polled); AssertionError at the deadline."""
    end = time.monotonic() + DEADLINE_S
    while not condition():
        if time.monotonic() > end:
            raise AssertionError(f"{what}: not within {DEADLINE_S:.0f} s")
        time.sleep(0.05)


@pytest.fixture()
def rewards(tmp_path) -> Path:
    path = tmp_path / "rewards.py"
    path.write_text(REWARD)
    return path


def _steps(run) -> list[int]:
    rows, _ = read_jsonl(run.dir / "metrics.jsonl")
    return [r["rollout/step"] for r in rows]


def test_without_a_gpu_the_runs_go_one_after_another(tiny_cfg):
    cfgs = [tiny_cfg.replace(run_name=f"n{n}", n_samples_per_prompt=n, global_batch_size=2 * n)
            for n in (2, 4)]
    runs = sweep.launch_many(cfgs)
    assert [r.dir.name for r in runs] == ["n2", "n4"]
    assert all(r.status["reason"] == "completed" and _steps(r) == [0, 1] for r in runs)


def test_a_failing_run_does_not_stop_the_others(tiny_cfg, monkeypatch, capsys):
    from labkit import trainer

    real = trainer.update_policy

    def update(s, rollout, adv, step):
        if s.cfg.run_name == "bad" and step == 1:
            raise RuntimeError("CUDA out of memory (made up)")
        return real(s, rollout, adv, step)

    monkeypatch.setattr(trainer, "update_policy", update)
    runs = sweep.launch_many([tiny_cfg.replace(run_name="bad"), tiny_cfg.replace(run_name="good")])
    assert [r.dir.name for r in runs] == ["bad", "good"]
    assert runs[0].status["reason"] == "error" and _steps(runs[0]) == [0]
    assert runs[1].status["reason"] == "completed" and _steps(runs[1]) == [0, 1]
    captured = capsys.readouterr()
    assert "run bad failed: RuntimeError: CUDA out of memory (made up)" in captured.err
    assert "1 failed (bad (RuntimeError: CUDA out of memory (made up)))" in captured.out


def test_one_stop_ends_the_sweep_and_resume_finishes_it(tiny_cfg, rewards, capsys):
    (rewards.parent / "stop-once").write_text("")
    cfgs = [tiny_cfg.replace(run_name=name, custom_rm_path=f"{rewards}:stops_once_at_step_0")
            for name in ("first", "second")]
    runs = sweep.launch_many(cfgs)
    assert [r.dir.name for r in runs] == ["first"]  # the second never started
    assert runs[0].status["reason"] == "signal" and _steps(runs[0]) == [0]
    out = capsys.readouterr().out
    assert "1 stopped (first)" in out and "1 not started (second)" in out and "resume=True" in out

    runs = sweep.launch_many(cfgs, resume=True)
    assert [r.dir.name for r in runs] == ["first", "second"]
    assert [_steps(r) for r in runs] == [[0, 1], [0, 1]]  # each step logged once
    assert all(r.status["reason"] == "completed" for r in runs)
    again = sweep.launch_many(cfgs, resume=True)  # nothing left to do: returned as they are
    assert [_steps(r) for r in again] == [[0, 1], [0, 1]]


def test_side_by_side_runs_fail_alone_and_stop_together(tiny_cfg, rewards, capsys):
    """A process per run (as on a GPU): one failing run leaves the other; one stop, sent
    while both wait inside step 1, stops both after that step; resume finishes both."""
    base = tiny_cfg.replace(num_rollout=3, save_interval=0)
    cfgs = [base.replace(run_name=f"r{i}", custom_rm_path=f"{rewards}:waits_at_step_1") for i in (1, 2)]
    bad = base.replace(run_name="bad", custom_rm_path=f"{rewards}:killed_at_step_1")
    folder = rewards.parent

    failed = []

    def stop_when_both_wait():  # ... and the bad run has reached its step 1, however slowly
        try:
            _wait_until(lambda: len(list(folder.glob("reached-*"))) >= 2
                        and list(folder.glob("killed-*")), "the runs in step 1, the bad one killed")
            os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C on the sweep
            _wait_until(lambda: any("stopping every run" in line for line in _said),
                        "the sweep saying it stops every run")
        except AssertionError as e:  # the runs are let go all the same: the test fails, not hangs
            failed.append(str(e))
        (folder / "go").write_text("")

    _said.clear()
    watcher = threading.Thread(target=stop_when_both_wait, daemon=True)
    watcher.start()
    runs = sweep.launch_many([*cfgs, bad], side_by_side=True)
    watcher.join(timeout=60)
    assert not failed, failed
    by = {r.dir.name: r for r in runs}
    assert by["r1"].status["reason"] == by["r2"].status["reason"] == "signal"
    assert _steps(by["r1"]) == _steps(by["r2"]) == [0, 1]
    assert _steps(by["bad"]) == [0]  # killed in step 1: no status, and the sweep says so
    assert "run bad failed: killed by SIGKILL" in capsys.readouterr().err

    runs = sweep.launch_many(cfgs, resume=True, side_by_side=True)
    assert [(r.dir.name, _steps(r), r.status["reason"]) for r in runs] == [
        ("r1", [0, 1, 2], "completed"), ("r2", [0, 1, 2], "completed")]


_said: list[str] = []


@pytest.fixture(autouse=True)
def _listen(monkeypatch):
    """Keep what the sweep's board says, so a test can wait for it."""
    real = sweep._Board.say

    def say(self, line):
        _said.append(line)
        real(self, line)

    monkeypatch.setattr(sweep._Board, "say", say)


QWEN05 = memory.ModelShape(params=494_032_768, vocab=151_936, layers=24, hidden=896)


def test_runs_that_do_not_fit_at_once_wait_and_one_that_never_fits_is_refused(tiny_cfg, monkeypatch,
                                                                               capsys):
    """One GPU with 60 GiB free: four runs at 16,384 tokens a pass fit two at once (checkpointed),
    so two start and two wait (no refusal, as when the plan wanted all four at once); a run that
    does not fit even alone (a plain update at 65,536 tokens) is refused in one line, nothing
    started."""
    monkeypatch.setattr(sweep, "_on_gpu", lambda cfg: True)
    monkeypatch.setattr(memory, "gpu_count", lambda: 1)
    monkeypatch.setattr(memory, "gpu_free_gib", lambda index=0: 60.0)
    monkeypatch.setattr(memory.ModelShape, "of", classmethod(lambda cls, path: QWEN05))
    monkeypatch.setattr("labkit.models.resolve_model", lambda model: model)
    cfgs = [tiny_cfg.replace(run_name=f"r{i}", max_tokens_per_gpu=16384) for i in range(4)]
    plan = sweep.prepare_sweep(cfgs, side_by_side=True).plan
    assert [g.seats for g in plan.gpus] == [2]
    assert "4 runs: at most 2 at once, the others wait for a place" in capsys.readouterr().out
    started = []
    monkeypatch.setattr(sweep, "_start", lambda *a: started.append(a))
    huge = [c.replace(max_tokens_per_gpu=65536, gradient_checkpointing=False) for c in cfgs]
    with pytest.raises(memory.GPUMemoryError) as e:
        sweep.launch_many(huge)
    message = str(e.value)
    assert "\n" not in message and message.startswith("one run needs ")
    assert "60.0 GiB free" in message and "nothing was started" in message
    assert started == [] and not Path(tiny_cfg.output_dir).exists()


def test_the_default_token_budget_is_fitted_to_the_share_of_the_gpu(tiny_cfg):
    cfg = tiny_cfg.replace(max_tokens_per_gpu=12288, gradient_checkpointing=False)
    shared = placement.shared_gpu(cfg, QWEN05, runs=4, free=139.0)
    assert shared.rollout_kv_cache_gb == memory.DEFAULT_KV_CACHE_GIB and not shared.rollout_sleep
    assert 0 < shared.max_tokens_per_gpu < 12288
    assert sum(memory.run_memory(shared, QWEN05).total for _ in range(4)) <= 139.0 * memory.HEADROOM
    mine = placement.shared_gpu(cfg.replace(max_tokens_per_gpu=4096), QWEN05, runs=4, free=139.0)
    assert mine.max_tokens_per_gpu == 4096  # a budget the user chose is kept (and checked)
    assert memory.fit_max_tokens(cfg, QWEN05, 1, 139.0) > memory.fit_max_tokens(cfg, QWEN05, 4, 139.0)


def test_the_memory_plan_holds_the_update_as_measured_on_an_h200(tiny_cfg):
    """BENCHMARKS.md, "The update's memory, alone and side by side": an update-only process of
    the recipe's model held 42.6 GiB (nvidia-smi) at 12,288 tokens, and torch reserved 68.1 GiB
    at 24,576; four processes at 12,288 did not fit on the card, so the plan refuses them."""
    def trainer_side(tokens):
        m = memory.run_memory(tiny_cfg.replace(max_tokens_per_gpu=tokens, use_dynamic_batch_size=True),
                              QWEN05)
        return m.context + m.trainer + m.update

    assert trainer_side(12288) == pytest.approx(42.59, rel=0.03)
    assert trainer_side(24576) == pytest.approx(68.07 + 0.74, rel=0.03)
    four = [tiny_cfg.replace(run_name=f"r{i}", max_tokens_per_gpu=12288, use_dynamic_batch_size=True)
            for i in range(4)]
    with pytest.raises(memory.GPUMemoryError):
        memory.plan_runs(four, QWEN05, free_gib=139.8)


def test_sweep_help_names_the_sweep_and_takes_launchs_flags(capsys):
    from labkit.cli import main

    assert main(["sweep", "--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("labkit sweep: launch's flags, where a comma-separated value")
    assert "usage: labkit sweep" in out and "--n-samples-per-prompt" in out


# ----------------------------------------------------------------------------- what was asked
def test_resume_returns_a_completed_run_only_for_the_config_it_ran(tiny_cfg, capsys):
    """A completed run is returned as it is only for its own config (bookkeeping aside): one
    of another seed, lr or number of steps is refused in one line, nothing started; a longer
    one goes on where the run kept a checkpoint after its last step (--save-interval)."""
    plain, kept = tiny_cfg.replace(run_name="plain"), tiny_cfg.replace(run_name="kept", save_interval=1)
    sweep.launch_many([plain, kept], resume=True)
    refusals = {"seed": (dict(seed=8), "--seed: folder has 7, given 8"),
                "lr": (dict(lr=2e-3), "--lr: folder has 0.001, given 0.002"),
                "fewer steps": (dict(num_rollout=1), "completed 2 steps and 1 were asked"),
                "more steps": (dict(num_rollout=3), "keeps no checkpoint to go on to 3 from")}
    for what, (change, said) in refusals.items():
        with pytest.raises(RunLogError) as e:
            sweep.launch_many([plain.replace(**change)], resume=True)
        assert said in str(e.value) and "\n" not in str(e.value), what
        assert "nothing was started" in str(e.value) and "another run_name" in str(e.value), what
    again = sweep.launch_many([plain.replace(progress=True, time_limit="1h")], resume=True)
    assert [(r.dir.name, _steps(r)) for r in again] == [("plain", [0, 1])]  # bookkeeping: the same run
    (longer,) = sweep.launch_many([kept.replace(num_rollout=3)], resume=True)
    assert _steps(longer) == [0, 1, 2] and longer.status["reason"] == "completed"


def test_one_folder_spelled_two_ways_is_two_runs_not_one_twice(tiny_cfg, capsys):
    a = tiny_cfg.replace(output_dir=tiny_cfg.output_dir)
    b = tiny_cfg.replace(output_dir=tiny_cfg.output_dir + "/")
    named = sweep._named([a, b])
    assert [c.run_name for c in named] == ["tiny", "tiny-2"]
    assert "this one runs as tiny-2" in capsys.readouterr().err


def test_configs_may_be_dicts_of_fields_and_anything_else_is_one_line(tiny_cfg):
    (run,) = sweep.launch_many([{**tiny_cfg.to_dict(), "run_name": "from-a-dict"}])
    assert run.dir.name == "from-a-dict" and run.status["reason"] == "completed"
    with pytest.raises(ConfigError, match="unknown field 'sede'"):
        sweep.launch_many([{"sede": 1}])
    for wrong in (tiny_cfg, "runs", [tiny_cfg, 3]):
        with pytest.raises(ConfigError) as e:
            sweep.launch_many(wrong)
        assert "\n" not in str(e.value) and "RunConfig" in str(e.value)


def test_a_run_that_calls_sys_exit_fails_alone(tiny_cfg, rewards, capsys):
    cfgs = [tiny_cfg.replace(run_name="exits", custom_rm_path=f"{rewards}:exits_at_step_0"),
            tiny_cfg.replace(run_name="good")]
    runs = sweep.launch_many(cfgs)
    assert [(r.dir.name, r.status["reason"]) for r in runs] == [("exits", "error"), ("good", "completed")]
    captured = capsys.readouterr()
    assert f"run exits failed: SystemExit: sys.exit(3) was called in {rewards}" in captured.err
    assert "labkit: 2 runs: 1 failed (exits (SystemExit" in captured.out and "1 completed (good)" in captured.out


def test_a_stop_in_a_runs_last_step_starts_no_further_run(tiny_cfg, rewards, capsys):
    cfgs = [tiny_cfg.replace(run_name=name, custom_rm_path=f"{rewards}:stops_in_the_last_step")
            for name in ("first", "second")]
    slots = sweep.run_sweep(cfgs)
    assert [s.outcome for s in slots] == ["completed", "not started"]
    assert sweep.sweep_exit_code(slots) == 130  # the stop (SIGINT), not the completed run
    assert "1 completed (first); 1 not started (second); launch_many(..., resume=True)" in \
        capsys.readouterr().out


def test_a_runs_time_limit_stops_that_run_and_the_sweep_goes_on(tiny_cfg, capsys):
    cfgs = [tiny_cfg.replace(run_name=name, time_limit="0.001") for name in ("a", "b")]
    slots = sweep.run_sweep(cfgs)  # each stops at its limit before its first step
    assert [s.outcome for s in slots] == ["time limit", "time limit"]
    assert sweep.sweep_exit_code(slots) == 124
    assert "2 runs: 2 stopped at its --time-limit (a, b)" in capsys.readouterr().out


def test_bad_data_for_every_run_is_one_refusal_before_anything_starts(tiny_cfg, tmp_path, capsys):
    from labkit.errors import DataError

    cfgs = [tiny_cfg.replace(run_name=f"s{seed}", seed=seed, data=str(tmp_path / "nowhere"))
            for seed in (1, 2, 3)]
    with pytest.raises(DataError, match="nowhere.*no such file or folder"):
        sweep.launch_many(cfgs)
    assert not Path(tiny_cfg.output_dir).exists() and "failed" not in capsys.readouterr().err


def test_a_side_by_side_run_that_ran_out_of_gpu_memory_is_said_so(tiny_cfg):
    """What the summary says of a run whose status says CUDA ran out of memory."""
    import subprocess
    import sys

    from labkit.run.log import RunLog

    slot = sweep._Slot(tiny_cfg.replace(run_name="oom"))
    log = RunLog.create(slot.dir, tiny_cfg.to_dict())
    log.write_status("error", 0, "OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB")
    log.release()
    slot.proc = subprocess.Popen([sys.executable, "-c", "raise SystemExit(1)"])
    slot.proc.wait(timeout=DEADLINE_S)
    sweep._said_how_it_ended(slot)
    assert slot.outcome.startswith("failed: ran out of GPU memory: the memory plan let it start, "
                                   "which it should not have")
    assert sweep.out_of_gpu_memory({"reason": "error", "message": "ValueError: bad"}, "") is None


@pytest.mark.parametrize("shadow", ["checkout", "package"])
def test_side_by_side_runs_start_from_a_folder_that_holds_something_named_labkit(
        tiny_cfg, tmp_path, monkeypatch, shadow):
    """The sweep runs from the folder that holds the checkout (`labkit/`, a namespace package
    to Python), or beside a package named labkit: each run's process still imports the labkit
    that started it."""
    monkeypatch.chdir(folder_with_a_labkit(tmp_path, shadow))
    runs = sweep.launch_many([tiny_cfg.replace(num_rollout=1)], side_by_side=True)
    assert [(r.dir.name, r.status["reason"]) for r in runs] == [("tiny", "completed")]


def test_resume_with_a_config_json_cut_short_is_one_line(tiny_cfg):
    folder = Path(tiny_cfg.output_dir) / "tiny"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text('{"seed": 7, ')
    with pytest.raises(RunLogError) as e:
        sweep.launch_many([tiny_cfg], resume=True)
    assert f"{folder / 'config.json'} cannot be read" in str(e.value) and "\n" not in str(e.value)
    assert "nothing was started" in str(e.value)


def test_runs_that_share_a_gpu_get_expandable_segments_unless_the_user_chose(tiny_cfg, monkeypatch):
    monkeypatch.setattr(sweep, "_on_gpu", lambda cfg: True)
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)
    shared = tiny_cfg.replace(rollout_sleep=False)
    assert sweep._allocator(shared) == {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}
    assert sweep._allocator(shared.replace(rollout_sleep=True)) == {}  # vLLM's sleep pool
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:False")
    assert sweep._allocator(shared) == {}
    monkeypatch.setattr(sweep, "_on_gpu", lambda cfg: False)
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF")
    assert sweep._allocator(shared) == {}


def test_the_board_redraws_a_bar_only_when_its_words_change():
    """The board asks every second: a run waiting for a GPU for an hour would otherwise be
    3,600 redraws, each a message a grader (nbval) holds until the cell ends."""
    import io

    from tqdm import tqdm

    bar = tqdm(total=3, file=io.StringIO())
    said = []
    real = bar.set_postfix_str
    bar.set_postfix_str = lambda text, refresh=True: (said.append(text), real(text, refresh))
    for _ in range(5):
        sweep._say_on(bar, "waiting for a GPU")
    sweep._say_on(bar, "reward 0.250")
    assert said == ["waiting for a GPU", "reward 0.250"]
    bar.close()


def test_after_a_second_stop_in_an_update_the_summary_advises_only_what_will_run(
        tiny_cfg, monkeypatch, capsys):
    """Two Ctrl-C in the first run's update of step 1: that run keeps no checkpoint (its
    policy was ahead of its log), so a resume would refuse its folder, and with it the whole
    sweep. The summary names that folder and the way on first; following it finishes both."""
    from labkit import trainer

    real = trainer.update_policy
    once = Path(tiny_cfg.output_dir).parent / "stopped-once"

    def update(s, rollout, adv, step):
        if s.cfg.run_name == "first" and step == 1 and not once.exists():
            once.write_text("")
            os.kill(os.getpid(), signal.SIGINT)  # after its step, ...
            os.kill(os.getpid(), signal.SIGINT)  # ... and now: interrupted inside the update
        return real(s, rollout, adv, step)

    monkeypatch.setattr(trainer, "update_policy", update)
    cfgs = [tiny_cfg.replace(run_name=name, num_rollout=3) for name in ("first", "second")]
    slots = sweep.run_sweep(cfgs)
    assert [s.outcome for s in slots] == ["stopped", "not started"]
    first = slots[0].dir
    assert "--resume is refused" in slots[0].run().status["message"]
    said = capsys.readouterr().out
    assert (f"; {first} keeps no checkpoint to go on from (steps 0-0 are logged; its status.json "
            f"says how it stopped), so a resume would refuse it: move it away to run it afresh, "
            f"then launch_many(..., resume=True) continues them") in said, said
    with pytest.raises(RunLogError, match="nothing was started"):  # as said: not as it is
        sweep.launch_many(cfgs, resume=True)
    first.rename(first.with_name("first-moved-away"))
    runs = sweep.launch_many(cfgs, resume=True)
    assert [(r.dir.name, _steps(r), r.status["reason"]) for r in runs] == [
        ("first", [0, 1, 2], "completed"), ("second", [0, 1, 2], "completed")]


def test_side_by_side_runs_evaluate_their_starting_model_once(tiny_cfg, capsys):
    """Two runs as processes: the one with fewer answers a step evaluates the start, the other
    reads its result (the same problems, the same answers), each evaluates its own after."""
    base = tiny_cfg.replace(num_rollout=1, eval_split_size=3, save_interval=0)
    runs = sweep.launch_many([base.replace(run_name="a", seed=1),
                              base.replace(run_name="b", seed=2, n_samples_per_prompt=2, global_batch_size=4)],
                             side_by_side=True)
    starts, afters = [], []
    for run in runs:
        rows = {row["eval/trained_steps"]: row for row in read_jsonl(run.dir / "eval.jsonl")[0]}
        starts.append(rows[0])
        afters.append(rows[1])
    assert sorted(row["eval/reused"] for row in starts) == [False, True]
    assert starts[0]["eval/synthetic_test"] == starts[1]["eval/synthetic_test"]
    assert not any(row["eval/reused"] for row in afters)
    outcomes = [read_jsonl(run.dir / "eval_outcomes.jsonl")[0][0] for run in runs]
    assert outcomes[0]["right"] == outcomes[1]["right"] and outcomes[0]["ids"] == outcomes[1]["ids"]
    reader = [run for run, row in zip(runs, starts) if row["eval/reused"]][0]
    assert reader.dir.name == "a"
    assert "already evaluated by run b" in (reader.dir.parent / "a.log").read_text()


def test_of_runs_started_together_the_fewest_answers_a_step_evaluate_the_start(tiny_cfg):
    slot = lambda name, n, resume=None: sweep._Slot(  # noqa: E731
        tiny_cfg.replace(run_name=name, n_samples_per_prompt=n, global_batch_size=2 * n), resume_dir=resume)
    assert sweep.start_evaluator([slot("n16", 16), slot("n4", 4), slot("n8", 8)]) == "n4"
    assert sweep.start_evaluator([slot("s1", 8), slot("s2", 8)]) == "s2"
    assert sweep.start_evaluator([slot("n4", 4, resume="runs/n4"), slot("n8", 8)]) == "n8"
    assert sweep.start_evaluator([slot("n4", 4, resume="runs/n4")]) is None
    assert sweep.start_evaluator([]) is None
