"""The GRPO loop end to end with a tiny random model: the log, the update, stop and resume."""

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from waiting import Lines

import labkit
from labkit.errors import DataError
from labkit.machine.heat import HeatGuard, ScriptedSensor
from labkit.run.checkpoint import latest_checkpoint
from labkit.run.log import Run, RunLogError
from labkit.run.metrics import METRICS, STEP
from labkit.run.stopping import StopController
from labkit.trainer import train

REQUIRED = [
    STEP, "rollout/raw_reward", "rollout/raw_reward_std", "rollout/right_frac",
    "rollout/zero_std/frac_groups",
    "rollout/response_len/mean", "rollout/response_len/max", "rollout/truncated_ratio",
    "perf/rollout_time", "perf/actor_train_time", "perf/step_time", "rollout/tokens",
    "perf/tokens_per_s", "train/loss", "train/grad_norm", "train/pg_clipfrac",
    "train/train_rollout_logprob_abs_diff", "heat/clean", "heat/pause_time",
]
TIMING = {k for k in METRICS if k.startswith(("perf/", "time/"))}


def _weights(run_dir: Path) -> dict:
    step, path = latest_checkpoint(run_dir)
    return torch.load(path, weights_only=False)["model"]


def _steps(run: Run) -> list[dict]:
    return [{k: v for k, v in row.items() if k not in TIMING} for row in run.metrics.to_dict("records")]


def test_two_steps_log_every_field_and_change_the_weights(tiny_cfg, tiny_model_dir):
    from transformers import AutoModelForCausalLM

    run = labkit.launch(tiny_cfg.replace(save_interval=2))  # a checkpoint to read the weights from
    rows = run.metrics.to_dict("records")
    assert [r[STEP] for r in rows] == [0, 1]
    for r in rows:
        missing = [k for k in REQUIRED if k not in r]
        assert not missing, missing
        assert set(r) <= set(METRICS), set(r) - set(METRICS)
        assert r["rollout/n_samples_per_prompt"] == 4 and r["rollout/n_prompts"] == 2
        assert 0 <= r["rollout/raw_reward"] <= 1
        assert r["rollout/response_len/max"] <= tiny_cfg.rollout_max_response_len
        # the engine samples from the policy being trained: its log-probs agree with ours
        assert r["train/train_rollout_logprob_abs_diff"] < 1e-3
    assert run.status["reason"] == "completed" and run.status["last_step"] == 1
    assert run.config["n_samples_per_prompt"] == 4
    samples = run.samples
    assert set(samples["prompt_id"]) <= {f"synthetic/train/{i}" for i in range(10_000)}
    assert "question" not in samples.columns  # prompts are named by id, never copied
    before = AutoModelForCausalLM.from_pretrained(tiny_model_dir).state_dict()
    after = _weights(run.dir)
    changed = [k for k in before if not torch.equal(before[k], after[k].to(before[k].dtype))]
    assert changed, "the optimizer step changed no weight"


def test_rewards_reach_the_loss(tiny_cfg, monkeypatch):
    """A reward that separates answers gives a non-zero loss and gradient."""
    import labkit.session as session

    monkeypatch.setattr(session, "load_reward", lambda *a: (lambda resp, label: float(len(resp) % 2)))
    run = train(tiny_cfg.replace(num_rollout=1))
    row = run.metrics.iloc[0]
    assert row["rollout/zero_std/frac_groups"] < 1.0
    assert row["train/grad_norm"] > 0


def test_several_optimizer_steps_per_rollout(tiny_cfg):
    run = train(tiny_cfg.replace(global_batch_size=4, num_rollout=1))
    assert run.metrics.iloc[0]["train/steps"] == 2


def test_resume_equals_an_uninterrupted_run(tiny_cfg, tmp_path):
    full = train(tiny_cfg.replace(num_rollout=4, run_name="full", save_interval=2))
    part = train(tiny_cfg.replace(num_rollout=2, run_name="part", save_interval=2))
    assert part.status["reason"] == "completed"
    resumed = train(tiny_cfg.replace(num_rollout=4, run_name="part", save_interval=2), resume=part.dir)
    assert _steps(resumed) == _steps(full)
    a, b = _weights(full.dir), _weights(resumed.dir)
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_resume_refuses_another_config(tiny_cfg):
    run = train(tiny_cfg.replace(num_rollout=1))
    with pytest.raises(RunLogError, match="--n-samples-per-prompt: folder has 4, given 2"):
        train(tiny_cfg.replace(n_samples_per_prompt=2, global_batch_size=4), resume=run.dir)


def test_a_run_folder_is_never_overwritten(tiny_cfg):
    train(tiny_cfg.replace(num_rollout=1))
    with pytest.raises(RunLogError, match="already holds a run; pass --resume"):
        train(tiny_cfg.replace(num_rollout=1))


def test_time_limit_stops_between_steps(tiny_cfg):
    clock = iter(range(0, 10_000, 50)).__next__  # 50 s pass between every look at the clock
    stopper = StopController(120, clock=lambda: float(clock()))
    run = train(tiny_cfg.replace(num_rollout=5), stopper=stopper)
    assert run.status["reason"] == "time_limit"
    assert len(run.metrics) < 5 and run.status["last_step"] == len(run.metrics) - 1
    assert latest_checkpoint(run.dir)[0] == run.status["last_step"]


class _UnthreadedGuard(HeatGuard):
    """Reads the sensor at each check (no sampler thread), so the readings are in call order."""

    def start(self):
        return self


def test_heat_pause_marks_the_step_not_clean(tiny_cfg, monkeypatch):
    # checks: before step 0, between its two generation batches, before step 1, between its
    # batches. Hot (95 C) at the second check only: a pause inside step 0's rollout.
    readings = iter([50, 95, 70] + [50] * 100)
    guard = _UnthreadedGuard(ScriptedSensor(lambda t: next(readings)), 85, 75, interval=0.01,
                             sleep=lambda s: time.sleep(0.01))
    import labkit.session as session
    from labkit.engines.hf import HFEngine

    monkeypatch.setattr(session, "make_engine", lambda cfg, path, policy, tok: HFEngine(policy, tok, max_batch=4))
    run = train(tiny_cfg, guard=guard)
    assert run.metrics["heat/clean"].tolist() == [False, True]
    assert run.metrics["heat/pause_time"].iloc[0] > 0
    pauses = [json.loads(line) for line in (run.dir / "heat.jsonl").read_text().splitlines()]
    assert len(pauses) == 1 and pauses[0]["step"] == 0 and pauses[0]["peak_c"] == 95


def test_heat_pause_before_the_rollout_keeps_the_step_clean(tiny_cfg):
    readings = iter([95, 70] + [50] * 100)
    guard = _UnthreadedGuard(ScriptedSensor(lambda t: next(readings)), 85, 75, interval=0.01,
                             sleep=lambda s: time.sleep(0.01))
    run = train(tiny_cfg, guard=guard)
    assert run.metrics["heat/clean"].tolist() == [True, True]
    assert len((run.dir / "heat.jsonl").read_text().splitlines()) == 1


def test_truncated_log_line_is_kept_and_repaired_on_resume(tiny_cfg):
    run = train(tiny_cfg.replace(save_interval=1))
    with open(run.dir / "metrics.jsonl", "a") as f:
        f.write('{"rollout/step": 2, "rollout/raw_rew')  # a line cut by a crash
    resumed = train(tiny_cfg.replace(num_rollout=3, save_interval=1), resume=run.dir)
    assert (run.dir / "metrics.jsonl.truncated").read_text().startswith('{"rollout/step": 2')
    assert resumed.metrics[STEP].tolist() == [0, 1, 2]


def test_half_written_checkpoint_is_detected(tiny_cfg):
    run = train(tiny_cfg.replace(save_interval=1))
    step, path = latest_checkpoint(run.dir)
    path.write_bytes(path.read_bytes()[:100])
    with pytest.raises(RunLogError, match="not a readable checkpoint"):
        train(tiny_cfg.replace(num_rollout=3, save_interval=1), resume=run.dir)
    assert len(Run(run.dir).metrics) == 2  # nothing already written was lost


# A child run prints lines the test waits for; at the lines the test names (LABKIT_TEST_HOLD_AT)
# it also waits, until the test lets it go (a file appears). So a signal the test sends "during
# step 0" lands there however slow the machine is, not within a sleep that a busy box outlasts.
HOLD = """
import os, time

def say(line):
    print(line, flush=True)
    if line in os.environ.get("LABKIT_TEST_HOLD_AT", "").split("|"):
        go = os.path.join(os.environ["LABKIT_TEST_HOLD_DIR"], line.replace(" ", "-"))
        end = time.monotonic() + 600  # a test that never lets go: the child gives up
        while not os.path.exists(go):  # a second signal interrupts this wait
            if time.monotonic() > end:
                raise SystemExit(f"held at {line!r} and never let go")
            time.sleep(0.01)
"""


def _hold_env(tmp_path, *lines: str) -> dict:
    """The environment of a child that holds at `lines` until _let_go."""
    return {**os.environ, "PYTHONUNBUFFERED": "1", "LABKIT_TEST_HOLD_DIR": str(tmp_path),
            "LABKIT_TEST_HOLD_AT": "|".join(lines)}


def _let_go(tmp_path, line: str) -> None:
    (tmp_path / line.replace(" ", "-")).touch()


SCRIPT = HOLD + """
import sys
import labkit.trainer as trainer
from labkit.config import RunConfig
orig = trainer.run_step
def held_step(s, step):
    out = orig(s, step)
    say(f"step {step} done")   # held: the signal lands inside the step
    return out
trainer.run_step = held_step
cfg = RunConfig(**__CFG__)
if __name__ == "__main__":
    run = trainer.train(cfg, resume=sys.argv[1] if len(sys.argv) > 1 else None)
    print("status", run.status["reason"], flush=True)
"""


def test_sigterm_mid_step_then_resume_matches_uninterrupted(tiny_cfg, tmp_path):
    cfg = tiny_cfg.replace(num_rollout=4)
    full = train(cfg.replace(run_name="full", save_interval=4))
    script = tmp_path / "run.py"
    script.write_text(SCRIPT.replace("__CFG__", repr(cfg.replace(run_name="killed").to_dict())))
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True,
                            env=_hold_env(tmp_path, "step 0 done"))
    try:
        _wait_for(proc, "step 0 done", [])
        proc.send_signal(signal.SIGTERM)  # while step 0 is held
        _let_go(tmp_path, "step 0 done")
        out = _rest(proc)
    finally:
        proc.kill()
    assert proc.returncode == 0, out
    assert "status signal" in out
    assert "run stopped (signal: SIGTERM)" in out and "signal: signal" not in out
    killed = Run(Path(cfg.output_dir) / "killed")
    assert killed.status["reason"] == "signal" and killed.status["last_step"] == 0
    resumed = train(cfg.replace(run_name="killed", save_interval=4), resume=killed.dir)
    assert _steps(resumed) == _steps(full)
    a, b = _weights(full.dir), _weights(resumed.dir)
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_no_checkpoint_when_asked(tiny_cfg):
    run = train(tiny_cfg.replace(num_rollout=1, save_interval=-1))
    assert run.status["reason"] == "completed"
    assert latest_checkpoint(run.dir) is None


# ----------------------------------------------------------------------------- resume: nothing twice
def test_a_completed_run_keeps_no_checkpoint_by_default(tiny_cfg):
    run = train(tiny_cfg)
    assert run.status["reason"] == "completed"
    assert not (run.dir / "checkpoint").exists()  # 1.6 GB per SmolLM2 run filled the disk


def test_resume_without_a_checkpoint_is_refused_naming_what_is_missing(tiny_cfg):
    run = train(tiny_cfg.replace(save_interval=-1))
    with pytest.raises(RunLogError, match=r"no checkpoint in .*checkpoint to continue from "
                                          r"\(steps 0-1 are logged; it was started with --save-interval -1"):
        train(tiny_cfg.replace(num_rollout=3, save_interval=-1), resume=run.dir)
    assert run.metrics[STEP].tolist() == [0, 1]
    assert run.status["reason"] == "completed"  # the refused resume wrote nothing


def test_resume_without_latest_json_uses_the_newest_step_file_and_sweeps_temp_files(tiny_cfg):
    run = train(tiny_cfg.replace(save_interval=1))
    folder = run.dir / "checkpoint"
    (folder / "latest.json").unlink()
    (folder / ".step-2.pt.tmp999999").write_bytes(b"half a checkpoint")  # a kill mid-write
    (run.dir / ".status.json.x1y2.tmp").write_text("{")
    resumed = train(tiny_cfg.replace(num_rollout=3, save_interval=1), resume=run.dir)
    assert resumed.metrics[STEP].tolist() == [0, 1, 2]
    assert not [p.name for p in [*folder.iterdir(), *run.dir.iterdir()] if ".tmp" in p.name]


def test_resume_sets_aside_metrics_samples_and_heat_logged_after_the_checkpoint(tiny_cfg):
    run = train(tiny_cfg.replace(num_rollout=1, save_interval=1))  # checkpoint of step 0
    # the run went on to log step 1, and was killed before the next checkpoint
    first = json.loads((run.dir / "metrics.jsonl").read_text().splitlines()[0])
    with open(run.dir / "metrics.jsonl", "a") as f:
        f.write(json.dumps({**first, STEP: 1}) + "\n")
    with open(run.dir / "samples.jsonl", "a") as f:
        f.write(json.dumps({STEP: 1, "prompt_id": "synthetic/train/9", "completion": "old"}) + "\n")
    with open(run.dir / "heat.jsonl", "a") as f:
        f.write(json.dumps({"step": 1, "start": 0.0, "end": 1.0, "seconds": 1.0}) + "\n")
    resumed = train(tiny_cfg.replace(num_rollout=2, save_interval=1), resume=run.dir)
    assert resumed.metrics[STEP].tolist() == [0, 1]
    samples = resumed.samples
    assert "old" not in samples["completion"].tolist()
    assert samples.groupby(STEP).size().tolist() == [8, 8]  # 2 prompts x 4 answers, once each
    assert not (run.dir / "heat.jsonl").read_text().strip()
    for name in ("metrics.jsonl", "samples.jsonl", "heat.jsonl"):
        kept = (run.dir / f"{name}.after-checkpoint").read_text().splitlines()
        assert len(kept) == 1, name


def test_a_second_trainer_on_one_run_folder_is_refused(tiny_cfg):
    from labkit.run.log import RunLog

    run = train(tiny_cfg.replace(save_interval=1))
    holder = RunLog.open(run.dir)  # another trainer holds the folder
    try:
        with pytest.raises(RunLogError, match=r"is in use by another trainer \(pid \d+"):
            train(tiny_cfg.replace(num_rollout=3, save_interval=1), resume=run.dir)
    finally:
        holder.release()
    assert run.metrics[STEP].tolist() == [0, 1]
    assert not (run.dir / "lock").exists()


def test_a_full_disk_at_the_final_checkpoint_still_writes_the_status(tiny_cfg, monkeypatch):
    import labkit.run.checkpoint as checkpoint

    def disk_full(obj, f):  # what torch raises when the disk fills during torch.save
        f.write(b"\0" * 100)
        raise RuntimeError("[enforce fail at inline_container.cc:672] . PytorchStreamWriter "
                           "failed writing file data/3: file write failed")

    monkeypatch.setattr(checkpoint.torch, "save", disk_full)
    clock = iter(range(0, 10_000, 50)).__next__
    stopper = StopController(120, clock=lambda: float(clock()))
    run = train(tiny_cfg.replace(num_rollout=5), stopper=stopper)
    assert run.status["reason"] == "time_limit"
    message = run.status["message"]
    assert "the disk is full" in message and "inline_container" not in message
    assert "no checkpoint, so --resume is refused" in message
    assert not [p for p in (run.dir / "checkpoint").iterdir() if ".tmp" in p.name]


def test_a_checkpoint_that_fills_the_disk_ends_the_run_with_a_status_and_is_not_retried(
        tiny_cfg, monkeypatch):
    import errno

    import labkit.run.checkpoint as checkpoint

    calls = []

    def disk_full(obj, f):
        calls.append(f)
        f.write(b"\0" * 100)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(checkpoint.torch, "save", disk_full)
    with pytest.raises(checkpoint.CheckpointWriteFailed, match="the disk is full"):
        train(tiny_cfg.replace(num_rollout=3, save_interval=1))  # a checkpoint after step 0
    run = Run(Path(tiny_cfg.output_dir) / tiny_cfg.run_name)
    assert run.status["reason"] == "error" and run.status["last_step"] == 0
    assert "could not write the checkpoint of step 0" in run.status["message"]
    assert "the disk is full" in run.status["message"]
    assert "there is no checkpoint, so --resume is refused" in run.status["message"]
    assert len(calls) == 1  # the stop did not fill the disk again with the same checkpoint
    assert all(f.closed for f in calls)  # the space of the removed file is given back
    assert not [p for p in (run.dir / "checkpoint").iterdir() if ".tmp" in p.name]


def test_the_resume_refusal_says_how_the_run_stopped_when_its_status_does(tiny_cfg, monkeypatch):
    import errno

    import labkit.run.checkpoint as checkpoint
    import labkit.trainer as trainer

    def no_room(obj, f):
        raise OSError(errno.ENOSPC, "No space left on device")

    real_step = trainer.run_step

    def step_then_sigterm(s, step):  # a SIGTERM lands during step 0
        out = real_step(s, step)
        os.kill(os.getpid(), signal.SIGTERM)
        return out

    monkeypatch.setattr(checkpoint.torch, "save", no_room)  # ... and its checkpoint fails
    monkeypatch.setattr(trainer, "run_step", step_then_sigterm)
    run = train(tiny_cfg.replace(num_rollout=3))
    assert run.status["reason"] == "signal" and run.status["last_step"] == 0
    monkeypatch.undo()
    with pytest.raises(RunLogError) as refused:
        train(tiny_cfg.replace(num_rollout=3), resume=run.dir)
    message = str(refused.value)
    assert "(steps 0-0 are logged; it stopped on SIGTERM and wrote none then (status.json: " \
           "SIGTERM; could not write the checkpoint of step 0" in message
    assert "SIGKILL" not in message


FULL_DISK = """
import sys
import labkit.run.checkpoint as checkpoint
from labkit.config import RunConfig
from labkit.trainer import train

checkpoint.AUTO_SAVE_S = 0.0  # a rolling checkpoint after every step: it does not fit
try:
    train(RunConfig(**__CFG__))
except checkpoint.CheckpointWriteFailed as e:
    print("failed:", e, flush=True)
"""


def _small_disk_works(folder: Path) -> bool:
    folder.mkdir()
    try:
        return subprocess.run(["unshare", "-rm", "sh", "-c",
                               f"mount -t tmpfs -o size=64k tmpfs {folder}"],
                              capture_output=True, timeout=60).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def test_a_real_full_disk_during_a_checkpoint_still_leaves_the_status(tiny_cfg, tmp_path):
    """On a 64 KiB file system (a tmpfs in a user namespace of its own) the checkpoint of
    the tiny model (350 KB) fills the disk; the status must still be written after it."""
    disk = tmp_path / "disk"
    if not _small_disk_works(disk):
        pytest.skip("cannot mount a small tmpfs here (unshare -rm needs user namespaces)")
    cfg = tiny_cfg.replace(num_rollout=3, output_dir=str(disk))
    script = tmp_path / "full.py"
    script.write_text(FULL_DISK.replace("__CFG__", repr(cfg.to_dict())))
    out = subprocess.run(["unshare", "-rm", "sh", "-c", f"mount -t tmpfs -o size=64k tmpfs {disk} "
                          f"&& {sys.executable} {script} && cat {disk}/tiny/status.json"],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "failed: could not write the checkpoint of step 0" in out.stdout, out.stdout + out.stderr
    status = json.loads(out.stdout[out.stdout.index("{"):])
    assert status["reason"] == "error" and status["last_step"] == 0, status
    assert "the disk is full" in status["message"]


STOPPABLE = HOLD + """
import sys
import torch
import labkit.run.checkpoint as checkpoint
import labkit.lifecycle as lifecycle
import labkit.trainer as trainer
from labkit.cli import main

torch.set_num_threads(1)  # as the tests' own process: the same sums, bit for bit
checkpoint.AUTO_SAVE_S = float(sys.argv[1])  # 0: a rolling checkpoint after every step
slow = sys.argv[2]  # slow-save, slow-setup or -
orig_step, orig_save, real_torch_save = trainer.run_step, lifecycle.save_checkpoint, checkpoint.torch.save
orig_setup = lifecycle.setup

def slow_setup(*a, **k):       # a model that takes long to load: signals land in here
    say("loading")
    return orig_setup(*a, **k)

def held_step(s, step):
    out = orig_step(s, step)
    say(f"step {step} done")   # signals land inside the step
    return out

def save(run_dir, step, *a, **k):
    path = orig_save(run_dir, step, *a, **k)
    say(f"saved {step}")
    return path

def torch_save(obj, f):        # a checkpoint that takes long to write
    f.write(b"half a checkpoint")
    f.flush()
    say("saving")
    real_torch_save(obj, f)

trainer.run_step, lifecycle.save_checkpoint = held_step, save
if slow == "slow-save":
    checkpoint.torch.save = torch_save
if slow == "slow-setup":
    lifecycle.setup = slow_setup
sys.exit(main(["launch", *sys.argv[3:]]))
"""


def _flags(cfg) -> list[str]:
    return ["--model", cfg.model, "--data", "synthetic", "--engine", "hf", "--rollout-batch-size", "2",
            "--n-samples-per-prompt", "4", "--global-batch-size", "8", "--micro-batch-size", "4",
            "--num-rollout", str(cfg.num_rollout), "--rollout-max-response-len", "12",
            "--lr", "1e-3", "--seed", "7", "--no-progress", "--eval-split-size", "0",
            "--output-dir", cfg.output_dir,
            "--run-name", cfg.run_name]


def _start(tmp_path, cfg, auto_save_s: float, slow: str = "-", hold=()) -> subprocess.Popen:
    """The run in a child (STOPPABLE), holding at the lines `hold` until _let_go."""
    script = tmp_path / "stoppable.py"
    script.write_text(STOPPABLE)
    return subprocess.Popen([sys.executable, str(script), str(auto_save_s),
                             slow, *_flags(cfg)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env=_hold_env(tmp_path, *hold))


def _wait_for(proc, prefix: str, seen: list) -> None:
    """Read the child's lines until one starts with `prefix` (the child ending first, or the
    deadline, is an error)."""
    seen += _lines(proc).until(prefix)


def _rest(proc) -> str:
    """What the child writes until it exits (waited for with a deadline)."""
    return _lines(proc).rest()


def _lines(proc) -> Lines:
    if not hasattr(proc, "lines"):
        proc.lines = Lines(proc)
    return proc.lines


def test_sigkill_after_a_rolling_checkpoint_resumes_like_an_uninterrupted_run(tiny_cfg, tmp_path, capsys):
    cfg = tiny_cfg.replace(num_rollout=4)
    full = train(cfg.replace(run_name="full", save_interval=4))
    proc = _start(tmp_path, cfg.replace(run_name="killed"), auto_save_s=0.0, hold=["saved 1"])
    seen = []
    try:
        _wait_for(proc, "saved 1", seen)  # the rolling checkpoint after step 1; held there
        proc.kill()  # SIGKILL: no handler, no status, no final checkpoint
        _rest(proc)
    finally:
        proc.kill()
    killed = Path(cfg.output_dir) / "killed"
    assert not (killed / "status.json").exists() and (killed / "lock").exists()
    resumed = train(cfg.replace(run_name="killed", save_interval=4), resume=killed)
    assert "pid" in capsys.readouterr().out  # the dead trainer's lock was taken over
    assert _steps(resumed) == _steps(full)
    assert resumed.samples.groupby(STEP).size().tolist() == [8, 8, 8, 8]
    a, b = _weights(full.dir), _weights(resumed.dir)
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_second_sigterm_during_the_final_checkpoint_still_writes_the_status(tiny_cfg, tmp_path):
    cfg = tiny_cfg.replace(num_rollout=3, run_name="twice")
    proc = _start(tmp_path, cfg, auto_save_s=1e9, slow="slow-save", hold=["step 0 done", "saving"])
    seen = []
    try:
        _wait_for(proc, "step 0 done", seen)
        proc.send_signal(signal.SIGTERM)  # stop after this step ...
        _let_go(tmp_path, "step 0 done")
        _wait_for(proc, "saving", seen)   # held in the final checkpoint until ...
        proc.send_signal(signal.SIGTERM)  # ... no, now: during the final checkpoint
        out = _rest(proc)
    finally:
        proc.kill()
    out = "".join(seen) + out
    assert proc.returncode == 128 + signal.SIGTERM, out
    run = Run(Path(cfg.output_dir) / "twice")
    assert run.status["reason"] == "signal" and run.status["signal"] == "SIGTERM"
    assert run.status["last_step"] == 0
    assert "a second signal cut the checkpoint of step 0 short" in run.status["message"]
    assert not [p for p in (run.dir / "checkpoint").iterdir() if ".tmp" in p.name]
    assert "signal: signal" not in out


def test_a_second_signal_inside_the_checkpoints_writer_is_said_as_that_signal(tiny_cfg, monkeypatch):
    """torch writes a checkpoint through the file's own write(); a second SIGTERM that lands
    in there comes out of torch.save as "unexpected pos ...", which read as a failed write."""
    import builtins

    import labkit.run.checkpoint as checkpoint
    import labkit.trainer as trainer

    real_step, sent = trainer.run_step, []

    def step_then_sigterm(s, step):  # stop after this step ...
        out = real_step(s, step)
        os.kill(os.getpid(), signal.SIGTERM)
        return out

    class SecondSigtermInAWrite:  # ... no, now: the checkpoint's file, as torch writes it
        def __init__(self, f):
            self.f = f

        def write(self, data):
            sent.append(len(data))
            if len(sent) == 3:  # inside the archive (at the first write torch passes it on as is)
                os.kill(os.getpid(), signal.SIGTERM)
            return self.f.write(data)

        def __getattr__(self, name):
            return getattr(self.f, name)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

    monkeypatch.setattr(trainer, "run_step", step_then_sigterm)
    monkeypatch.setattr(checkpoint, "open", lambda *a, **k: SecondSigtermInAWrite(builtins.open(*a, **k)),
                        raising=False)
    run = train(tiny_cfg.replace(num_rollout=3))
    assert len(sent) >= 3, "the checkpoint was never written"
    assert run.status["reason"] == "signal" and run.status["signal"] == "SIGTERM"
    message = run.status["message"]
    assert "a second signal cut the checkpoint of step 0 short" in message, message
    assert "could not write" not in message and "unexpected pos" not in message
    assert not (run.dir / "checkpoint").exists() or not [
        p for p in (run.dir / "checkpoint").iterdir() if ".tmp" in p.name]


def _full_disk_for(monkeypatch, name: str) -> None:
    """fsync fails on the file `name` as on a full disk (the line reached the page cache and
    no further: a delayed allocation that found no room)."""
    import errno

    real = os.fsync

    def fsync(fd):
        if os.readlink(f"/proc/self/fd/{fd}").endswith(f"/{name}"):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(fd)

    monkeypatch.setattr(os, "fsync", fsync)


def test_a_full_disk_when_a_step_is_logged_ends_in_one_line_with_the_status(tiny_cfg, monkeypatch,
                                                                            capsys):
    from labkit.cli import main

    cfg = tiny_cfg.replace(num_rollout=3, run_name="full")
    run_dir = Path(cfg.output_dir) / "full"
    _full_disk_for(monkeypatch, "metrics.jsonl")
    assert main(["launch", *_flags(cfg)]) == 1
    err = capsys.readouterr().err
    said = [line for line in err.splitlines() if line.startswith("labkit launch")]
    assert said == [f"labkit launch: could not write {run_dir / 'metrics.jsonl'}: the disk is full "
                    + said[0].split("the disk is full ", 1)[-1]], said
    assert "MB free); free some space (status and traceback: " in said[0]
    status = Run(run_dir).status
    assert status["reason"] == "error" and status["last_step"] == -1
    assert "the disk is full" in status["message"]
    assert "--resume starts it again" in status["message"]
    assert not (run_dir / "metrics.jsonl").exists() or (run_dir / "metrics.jsonl").read_text() == ""
    assert not [p.name for p in run_dir.iterdir() if ".tmp" in p.name]  # the kept space is freed


FILL_AT_STEP_0 = """
import os, sys
import labkit.trainer as trainer
from labkit.cli import main

real_step = trainer.run_step

def step_on_a_disk_that_fills(s, step):
    out = real_step(s, step)
    fd = os.open(os.path.join(s.log.dir.parent, "filler"), os.O_WRONLY | os.O_CREAT)
    try:
        while True:  # another program takes the rest of the disk
            os.write(fd, b"\\0" * 4096)
    except OSError:
        os.close(fd)
    return out

trainer.run_step = step_on_a_disk_that_fills
sys.exit(main(["launch", *sys.argv[1:]]))
"""


def test_a_real_full_disk_when_a_step_is_logged_leaves_the_status(tiny_cfg, tmp_path):
    """On a 256 KiB file system filled up during step 0, the step's line finds no room: one
    line says so, and the status is written on the room the run kept aside for it."""
    disk = tmp_path / "disk"
    if not _small_disk_works(disk):
        pytest.skip("cannot mount a small tmpfs here (unshare -rm needs user namespaces)")
    cfg = tiny_cfg.replace(num_rollout=3, output_dir=str(disk), run_name="full", save_interval=-1)
    script = tmp_path / "fill.py"
    script.write_text(FILL_AT_STEP_0)
    flags = " ".join(_flags(cfg)) + " --save-interval -1"
    out = subprocess.run(["unshare", "-rm", "sh", "-c", f"mount -t tmpfs -o size=256k tmpfs {disk} "
                          f"&& {sys.executable} {script} {flags}; echo exit $?; "
                          f"cat {disk}/full/status.json; wc -c < {disk}/full/metrics.jsonl"],
                         capture_output=True, text=True, timeout=600)
    said = [line for line in out.stderr.splitlines() if line.startswith("labkit launch")]
    assert len(said) == 1 and "Traceback" not in out.stderr, out.stderr
    assert said[0].startswith(f"labkit launch: could not write {disk}/full/metrics.jsonl: the disk "
                              f"is full"), said
    assert "exit 1" in out.stdout, out.stdout
    status = json.loads(out.stdout[out.stdout.index("{"):out.stdout.rindex("}") + 1])
    assert status["reason"] == "error" and status["last_step"] == -1
    assert "the disk is full" in status["message"]
    assert out.stdout.split()[-1] == "0"  # no half line of step 0


# ----------------------------------------------------------------------------- prompts too long
def _data_with_a_long_question(tmp_path, chars: int) -> Path:
    rows = [{"question": f"Ann has {k} pens and buys 2 more. How many pens?", "answer": f"#### {k + 2}"}
            for k in range(6)]
    rows[3]["question"] = "Count the pens. " + "pen " * (chars // 4) + "How many pens?"
    path = tmp_path / "long.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_a_prompt_longer_than_the_context_is_refused_before_the_rollout(tiny_cfg, tmp_path):
    data = _data_with_a_long_question(tmp_path, 6000)  # the tiny model's context is 2,048
    cfg = tiny_cfg.replace(data=str(data), rollout_batch_size=6, global_batch_size=24, num_rollout=1)
    with pytest.raises(DataError, match=r"prompt long/train/3 is [\d,]+ tokens, and the model's "
                                        r"context of 2,048 leaves 2,036 .*--long-prompts truncate"):
        train(cfg)
    run = Run(Path(cfg.output_dir) / cfg.run_name)
    assert run.status["reason"] == "error" and "prompt long/train/3" in run.status["message"]
    assert len(run.metrics) == 0


def test_long_prompts_truncate_cuts_the_question(tiny_cfg, tmp_path, capsys):
    data = _data_with_a_long_question(tmp_path, 6000)
    cfg = tiny_cfg.replace(data=str(data), rollout_batch_size=6, global_batch_size=24,
                           num_rollout=1, long_prompts="truncate")
    run = train(cfg)
    assert run.status["reason"] == "completed"
    assert re.search(r"prompt long/train/3 cut from [\d,]+ to 2,03[0-6] tokens", capsys.readouterr().out)


def test_sigterm_while_loading_stops_before_the_first_step_with_a_status(tiny_cfg, tmp_path):
    cfg = tiny_cfg.replace(num_rollout=3, run_name="early")
    proc = _start(tmp_path, cfg, auto_save_s=1e9, slow="slow-setup", hold=["loading"])
    seen = []
    try:
        _wait_for(proc, "loading", seen)
        proc.send_signal(signal.SIGTERM)  # while the model loads (once, this killed the run)
        _let_go(tmp_path, "loading")
        out = _rest(proc)
    finally:
        proc.kill()
    assert proc.returncode == 128 + signal.SIGTERM, "".join(seen) + out
    run = Run(Path(cfg.output_dir) / "early")
    assert run.status["reason"] == "signal" and run.status["last_step"] == -1
    assert not (run.dir / "lock").exists()


def test_a_run_killed_in_its_first_step_resumes_from_step_0_logging_each_sample_once(tiny_cfg):
    from labkit.run.log import open_run_folder

    run_dir, log, _ = open_run_folder(tiny_cfg, None)  # started, then killed in step 0
    log.append_samples([{STEP: 0, "prompt_id": "synthetic/train/1", "completion": "old"}])
    log.release()
    resumed = train(tiny_cfg, resume=run_dir)
    assert resumed.metrics[STEP].tolist() == [0, 1]
    assert resumed.samples.groupby(STEP).size().tolist() == [8, 8]


def test_a_stop_before_the_first_step_says_so_not_after_step_minus_one(tiny_cfg, capsys):
    from labkit.run.stopping import StopController

    stopper = StopController(None)
    stopper.request_stop("SIGINT", kind="signal")  # a press of ■ while the model loads
    run = train(tiny_cfg.replace(run_name="stopped-early"), stopper=stopper)
    assert run.status["reason"] == "signal" and run.status["last_step"] == -1
    out = capsys.readouterr().out
    assert "run stopped (signal: SIGINT) before its first step; log in" in out
    assert "step -1" not in out


def test_the_share_of_right_answers_counts_the_full_rewards_only(tiny_cfg, tmp_path):
    reward = tmp_path / "half_credit.py"  # 1 for an answer of odd length, else format credit
    reward.write_text("def reward(response, label):\n    return 1.0 if len(response) % 2 else 0.1\n")
    run = train(tiny_cfg.replace(custom_rm_path=f"{reward}:reward", n_logged_prompts=2))
    samples = run.samples  # every answer of both prompts of each step
    assert len(samples) == 2 * tiny_cfg.samples_per_rollout
    right = samples.groupby(STEP)["reward"].apply(lambda r: (r == 1.0).mean())
    assert run.metrics["rollout/right_frac"].tolist() == pytest.approx(right.tolist())
    assert run.metrics["rollout/raw_reward"].tolist() == pytest.approx(
        samples.groupby(STEP)["reward"].mean().tolist())


class StopAfterFirstStep:
    """A StopController that asks the run to stop once its first step has run, as ■ would."""

    def __new__(cls):
        from labkit.run.stopping import StopController

        class After(StopController):
            checks = 0

            def should_stop(self):
                self.checks += 1
                if self.checks == 2:  # checked before step 0, then before step 1
                    self.request_stop("SIGINT", kind="signal")
                return super().should_stop()

        return After(None)


@pytest.mark.parametrize("notebook", [False, True])
def test_the_stop_line_says_the_checkpoint_kept_its_size_and_how_to_resume(
        tiny_cfg, capsys, monkeypatch, notebook):
    import labkit.run.progress

    monkeypatch.setattr(labkit.run.progress, "in_notebook", lambda: notebook)
    run = train(tiny_cfg.replace(num_rollout=3), stopper=StopAfterFirstStep())
    assert run.status["reason"] == "signal" and run.status["last_step"] == 0
    lines = capsys.readouterr().out.splitlines()
    stop = next(i for i, line in enumerate(lines) if "run stopped (signal: SIGINT) after step 0" in line)
    kept = lines[stop + 1]
    size = sum(f.stat().st_size for f in (run.dir / "checkpoint").rglob("*") if f.is_file())
    assert kept.startswith(f"labkit: checkpoint after step 0 kept in {run.dir / 'checkpoint'} (")
    number, unit = re.search(r"\(([\d.]+) (kB|MB|GB)\)", kept).groups()
    assert float(number) * {"kB": 1e3, "MB": 1e6, "GB": 1e9}[unit] == pytest.approx(size, rel=0.1)
    how = (f"labkit.launch(cfg, resume={str(run.dir)!r})" if notebook
           else f"labkit launch --resume {run.dir}")
    assert f"): {how} continues the run; delete that folder to free the space" in kept


def test_a_completed_run_says_no_checkpoint(tiny_cfg, capsys):
    train(tiny_cfg)
    assert "checkpoint after step" not in capsys.readouterr().out


FILL_AFTER_STEP_0 = """
import os, sys
import labkit.run.log as runlog
from labkit.cli import main

real_append = runlog.RunLog.append_step

def append_then_fill(self, metrics):
    real_append(self, metrics)
    if metrics["rollout/step"] == 0:  # step 0 is logged: another program takes the rest of the disk
        fd = os.open(os.path.join(self.dir.parent, "filler"), os.O_WRONLY | os.O_CREAT)
        try:
            while True:
                os.write(fd, b"\\\\0" * 4096)
        except OSError:
            os.close(fd)

runlog.RunLog.append_step = append_then_fill
sys.exit(main(["launch", *sys.argv[1:]]))
"""


@pytest.mark.parametrize("save_interval", ["0", "1", "-1"])
def test_a_real_disk_that_fills_right_after_step_0_is_logged_ends_in_one_line(tiny_cfg, tmp_path,
                                                                              save_interval):
    """On a 256 KiB file system filled up right after step 0's line: whichever write then
    finds no room (a checkpoint, a later line, the reward plot after the run) is named in one
    line, never a bare errno, and status.json is there."""
    disk = tmp_path / "disk"
    if not _small_disk_works(disk):
        pytest.skip("cannot mount a small tmpfs here (unshare -rm needs user namespaces)")
    cfg = tiny_cfg.replace(num_rollout=3, output_dir=str(disk), run_name="full")
    script = tmp_path / "fill.py"
    script.write_text(FILL_AFTER_STEP_0)
    flags = " ".join(_flags(cfg)) + f" --save-interval {save_interval}"
    out = subprocess.run(["unshare", "-rm", "sh", "-c", f"mount -t tmpfs -o size=256k tmpfs {disk} "
                          f"&& {sys.executable} {script} {flags}; echo exit $?; "
                          f"cat {disk}/full/status.json"],
                         capture_output=True, text=True, timeout=600)
    said = [line for line in out.stderr.splitlines() if line.startswith("labkit")]
    assert len(said) == 1 and "Traceback" not in out.stderr, out.stderr
    assert "Errno" not in said[0] and "check the paths" not in said[0], said
    assert f"{disk}/full/" in said[0] and "the disk is full" in said[0], said
    assert "status" in said[0], said
    status = json.loads(out.stdout[out.stdout.index("{"):out.stdout.rindex("}") + 1])
    assert status["last_step"] >= 0, status


def test_a_checkpoint_folder_the_full_disk_refuses_is_said_as_a_checkpoint_not_written(
        tmp_path, monkeypatch, tiny_model_dir):
    """The first checkpoint of a run makes its folder: on a full disk that fails too, and is
    said as the checkpoint it is (with how much room is left), not as a bare errno."""
    import errno

    import labkit.run.checkpoint as checkpoint
    from labkit.models import load_policy

    real = Path.mkdir

    def mkdir(self, *a, **k):
        if self.name == "checkpoint":
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(self, *a, **k)

    monkeypatch.setattr(Path, "mkdir", mkdir)
    policy = load_policy(str(tiny_model_dir), torch.float32, torch.device("cpu"))
    optimizer = torch.optim.AdamW(policy.parameters())
    with pytest.raises(checkpoint.CheckpointWriteFailed,
                       match=r"could not write the checkpoint of step 0 to .*checkpoint: the disk is full"):
        checkpoint.save_checkpoint(tmp_path, 0, policy, optimizer)
