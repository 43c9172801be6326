"""The GRPO loop end to end with a tiny random model: the log, the update, stop and resume."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import labkit
from labkit.checkpoint import latest_checkpoint
from labkit.heat import HeatGuard, ScriptedSensor
from labkit.metrics import METRICS, STEP
from labkit.runlog import Run
from labkit.runlog import RunLogError
from labkit.stopping import StopController
from labkit.trainer import train

REQUIRED = [
    STEP, "rollout/raw_reward", "rollout/raw_reward_std", "rollout/zero_std/frac_groups",
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

    run = labkit.launch(tiny_cfg)
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
    import labkit.trainer as trainer

    monkeypatch.setattr(trainer, "load_reward", lambda *a: (lambda resp, label: float(len(resp) % 2)))
    run = train(tiny_cfg.replace(num_rollout=1))
    row = run.metrics.iloc[0]
    assert row["rollout/zero_std/frac_groups"] < 1.0
    assert row["train/grad_norm"] > 0


def test_several_optimizer_steps_per_rollout(tiny_cfg):
    run = train(tiny_cfg.replace(global_batch_size=4, num_rollout=1))
    assert run.metrics.iloc[0]["train/steps"] == 2


def test_resume_equals_an_uninterrupted_run(tiny_cfg, tmp_path):
    full = train(tiny_cfg.replace(num_rollout=4, run_name="full"))
    part = train(tiny_cfg.replace(num_rollout=2, run_name="part"))
    assert part.status["reason"] == "completed"
    resumed = train(tiny_cfg.replace(num_rollout=4, run_name="part"), resume=part.dir)
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
    import labkit.trainer as trainer
    from labkit.engines.hf import HFEngine

    monkeypatch.setattr(trainer, "make_engine", lambda cfg, path, policy, tok: HFEngine(policy, tok, max_batch=4))
    run = train(tiny_cfg, guard=guard)
    assert run.metrics["heat/clean"].tolist() == [False, True]
    assert run.metrics["heat/pause_time"].iloc[0] > 0
    pauses = [json.loads(l) for l in (run.dir / "heat.jsonl").read_text().splitlines()]
    assert len(pauses) == 1 and pauses[0]["step"] == 0 and pauses[0]["peak_c"] == 95


def test_heat_pause_before_the_rollout_keeps_the_step_clean(tiny_cfg):
    readings = iter([95, 70] + [50] * 100)
    guard = _UnthreadedGuard(ScriptedSensor(lambda t: next(readings)), 85, 75, interval=0.01,
                             sleep=lambda s: time.sleep(0.01))
    run = train(tiny_cfg, guard=guard)
    assert run.metrics["heat/clean"].tolist() == [True, True]
    assert len((run.dir / "heat.jsonl").read_text().splitlines()) == 1


def test_truncated_log_line_is_kept_and_repaired_on_resume(tiny_cfg):
    run = train(tiny_cfg)
    with open(run.dir / "metrics.jsonl", "a") as f:
        f.write('{"rollout/step": 2, "rollout/raw_rew')  # a line cut by a crash
    resumed = train(tiny_cfg.replace(num_rollout=3), resume=run.dir)
    assert (run.dir / "metrics.jsonl.truncated").read_text().startswith('{"rollout/step": 2')
    assert resumed.metrics[STEP].tolist() == [0, 1, 2]


def test_half_written_checkpoint_is_detected(tiny_cfg):
    run = train(tiny_cfg)
    step, path = latest_checkpoint(run.dir)
    path.write_bytes(path.read_bytes()[:100])
    with pytest.raises(RunLogError, match="not a readable checkpoint"):
        train(tiny_cfg.replace(num_rollout=3), resume=run.dir)
    assert len(Run(run.dir).metrics) == 2  # nothing already written was lost


SCRIPT = """
import sys, time
import labkit.trainer as trainer
from labkit.config import RunConfig
orig = trainer.run_step
def slow_step(s, step):
    out = orig(s, step)
    print(f"step {step} done", flush=True)
    time.sleep(1.5)            # a long step: the signal lands inside it
    return out
trainer.run_step = slow_step
cfg = RunConfig(**__CFG__)
if __name__ == "__main__":
    run = trainer.train(cfg, resume=sys.argv[1] if len(sys.argv) > 1 else None)
    print("status", run.status["reason"], flush=True)
"""


def test_sigterm_mid_step_then_resume_matches_uninterrupted(tiny_cfg, tmp_path):
    cfg = tiny_cfg.replace(num_rollout=4)
    full = train(cfg.replace(run_name="full"))
    script = tmp_path / "run.py"
    script.write_text(SCRIPT.replace("__CFG__", repr(cfg.replace(run_name="killed").to_dict())))
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True, env=env)
    deadline = time.time() + 120
    for line in proc.stdout:  # wait until step 0 is done, then signal during its sleep
        if line.startswith("step 0 done") or time.time() > deadline:
            proc.send_signal(signal.SIGTERM)
            break
    out = proc.communicate(timeout=120)[0]
    assert proc.returncode == 0, out
    assert "status signal" in out
    killed = Run(Path(cfg.output_dir) / "killed")
    assert killed.status["reason"] == "signal" and killed.status["last_step"] == 0
    resumed = train(cfg.replace(run_name="killed"), resume=killed.dir)
    assert _steps(resumed) == _steps(full)
    a, b = _weights(full.dir), _weights(resumed.dir)
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_no_checkpoint_when_asked(tiny_cfg):
    run = train(tiny_cfg.replace(num_rollout=1, save_interval=-1))
    assert run.status["reason"] == "completed"
    assert latest_checkpoint(run.dir) is None
