"""Constructed run folders with known answers, for the analysis and plot tests.

`write_course_runs` writes the course's group-size comparison as run folders whose gains,
clean steps and median times are known by construction: seeds at 8 answers gaining +0.038,
+0.061 and +0.098, a 4-answer run clean on 14 steps (median 32.5 s there), an 8-answer run
made before the heat guard (59.1 s on those 14 steps), and a 16-answer run (+0.097) whose
every step overlapped a heat pause (median 188.2 s). The numbers are made up to match the text.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from labkit.config import RunConfig

T0 = 1_700_000_000.0  # unix time of the first step
TRAIN_S = 15.0  # seconds of each step outside the rollout

# step numbers a heat pause touched in the 4-answer run: the other 14 of steps 0-23 are clean
PAUSED_N4 = [2, 5, 6, 11, 12, 13, 17, 18, 21, 22]
CLEAN_N4 = [s for s in range(24) if s not in PAUSED_N4]


def rewards_with_gain(gain: float, n_steps: int = 24, base: float = 0.30,
                      wiggle: float = 0.012) -> list[float]:
    """Rewards whose mean over steps 16-23 minus that over steps 0-7 is `gain` exactly.

    Steps 0-7 sit at `base`, steps from 16 on at `base + gain`, with a ramp between; a
    +wiggle/-wiggle alternation sums to zero in each 8-step window starting at an even step.
    """
    ramp = np.clip((np.arange(n_steps) - 7.5) / 8.0, 0.0, 1.0)
    sign = np.where(np.arange(n_steps) % 2 == 0, 1.0, -1.0)
    return list(base + gain * ramp + wiggle * sign)


def centered(n: int, median: float, spread: float) -> list[float]:
    """`n` values spread evenly over median +- spread, so their median is `median`."""
    return list(median + np.linspace(-spread, spread, n))


def times_with_median(n_steps: int, steps: list[int], median: float, other: float) -> list[float]:
    """Rollout times whose median over `steps` is `median`; the other steps take about `other`."""
    times = [other + 0.7 * (s % 3) for s in range(n_steps)]
    for s, t in zip(steps, centered(len(steps), median, 1.3)):
        times[s] = t
    return times


def write_run(root: Path, name: str, *, group_size: int, seed: int, rewards: list[float],
              times: list[float], clean: list[bool] | None = None,
              pause_s: list[float] | None = None, prompts: int = 32,
              global_batch: int | None = None, response_len: float = 200.0,
              zero_std: float = 0.3, status: str = "completed", lr: float = 1e-6) -> Path:
    """Write one run folder (config.json, metrics.jsonl, heat.jsonl, status.json) under `root`.

    `clean`: heat/clean per step (None: not logged, a run before the heat guard).
    `pause_s`: seconds of heat pause at the start of each step, written to heat.jsonl.
    Returns the run folder.
    """
    run = Path(root) / name
    run.mkdir(parents=True)
    cfg = RunConfig(n_samples_per_prompt=group_size, rollout_batch_size=prompts,
                    global_batch_size=global_batch or prompts * group_size, seed=seed,
                    engine="vllm", run_name=name, num_rollout=len(rewards), lr=lr)
    (run / "config.json").write_text(json.dumps(cfg.to_dict(), indent=2))
    lines, pauses, t = [], [], T0
    for step, (reward, time) in enumerate(zip(rewards, times)):
        pause = pause_s[step] if pause_s else 0.0
        if pause:
            pauses.append(dict(start=t, end=t + pause, seconds=pause, peak_c=88.0, step=step))
        length = response_len + 2.0 * step
        row = {
            "rollout/step": step, "rollout/raw_reward": reward, "perf/rollout_time": time,
            "rollout/response_len/mean": length,
            "rollout/tokens": int(prompts * group_size * length),
            "rollout/zero_std/frac_groups": max(0.0, zero_std - 0.005 * step),
            "rollout/n_samples_per_prompt": group_size, "heat/pause_time": pause,
            "time/start": t, "time/end": t + pause + time + TRAIN_S,
        }
        if clean is not None:
            row["heat/clean"] = bool(clean[step])
        lines.append(json.dumps(row))
        t = row["time/end"]
    (run / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    if pauses:
        (run / "heat.jsonl").write_text("".join(json.dumps(p) + "\n" for p in pauses))
    (run / "status.json").write_text(json.dumps({"reason": status, "last_step": len(rewards) - 1}))
    return run


def write_course_runs(root: Path) -> Path:
    """Write the course's five group-size runs into <root>/runs and return that folder."""
    runs = Path(root) / "runs"
    write_run(runs, "n4-seed1234", group_size=4, seed=1234, rewards=rewards_with_gain(0.071),
              times=times_with_median(24, CLEAN_N4, 32.5, other=41.0),
              clean=[s in CLEAN_N4 for s in range(24)],
              pause_s=[0.0 if s in CLEAN_N4 else 30.0 for s in range(24)],
              response_len=180.0, zero_std=0.45)
    # the default seed ran 48 steps on another day, before the heat guard: no heat/clean
    write_run(runs, "n8-seed1234", group_size=8, seed=1234, rewards=rewards_with_gain(0.061, 48),
              times=times_with_median(48, CLEAN_N4, 59.1, other=61.0), clean=None,
              response_len=190.0, zero_std=0.30)
    write_run(runs, "n8-seed1", group_size=8, seed=1, rewards=rewards_with_gain(0.038),
              times=times_with_median(24, CLEAN_N4, 58.4, other=58.9),
              clean=[True] * 24, response_len=192.0, zero_std=0.31)
    write_run(runs, "n8-seed2", group_size=8, seed=2, rewards=rewards_with_gain(0.098),
              times=times_with_median(24, CLEAN_N4, 60.2, other=66.0),
              clean=[s not in (2, 5) for s in range(24)],
              pause_s=[20.0 if s in (2, 5) else 0.0 for s in range(24)],
              response_len=188.0, zero_std=0.29)
    write_run(runs, "n16-seed1234", group_size=16, seed=1234, rewards=rewards_with_gain(0.097),
              times=centered(24, 188.2, 9.0), clean=[False] * 24, pause_s=[45.0] * 24,
              response_len=195.0, zero_std=0.18, status="time_limit")
    return runs


def small_run(root, name, *, group_size=8, seed=1, gain=0.05, n_steps=24, **kw):
    """A plain clean run with a known gain."""
    kw.setdefault("times", [50.0] * n_steps)
    kw.setdefault("clean", [True] * n_steps)
    return write_run(root, name, group_size=group_size, seed=seed,
                     rewards=rewards_with_gain(gain, n_steps), **kw)
