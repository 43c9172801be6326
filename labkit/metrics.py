"""Metric names: one table, miles' names where miles has one.

Every per-step line of a run log (`metrics.jsonl`) uses these keys, so a run made with
labkit and a run made with miles read the same in the lessons. The step key is
`rollout/step`. Families that only labkit has get their own prefix (`heat/`, `client/`).
"""

from __future__ import annotations

STEP = "rollout/step"

# name -> (unit, meaning). The order is the order of the columns in a step summary.
METRICS: dict[str, tuple[str, str]] = {
    STEP: ("", "rollout index, from 0"),
    # rollout: what the engine wrote and what the reward said
    "rollout/raw_reward": ("", "mean reward over all samples of the rollout"),
    "rollout/raw_reward_std": ("", "standard deviation of the reward over all samples"),
    "rollout/zero_std/frac_groups": ("", "fraction of groups whose rewards are all equal (no GRPO signal)"),
    "rollout/zero_std/all_zero_percentage": ("", "fraction of groups where every answer got 0"),
    "rollout/zero_std/all_one_percentage": ("", "fraction of groups where every answer got 1"),
    "rollout/response_len/mean": ("tokens", "mean response length"),
    "rollout/response_len/max": ("tokens", "longest response"),
    "rollout/truncated_ratio": ("", "fraction of responses cut at --rollout-max-response-len"),
    "rollout/tokens": ("tokens", "tokens generated in the rollout"),
    "rollout/n_prompts": ("", "prompts in the rollout"),
    "rollout/n_samples_per_prompt": ("", "answers per prompt (the group size)"),
    # perf: where the time went
    "perf/rollout_time": ("s", "generation of the whole rollout, wall clock; a heat pause inside it makes the step not clean"),
    "perf/reward_time": ("s", "scoring the rollout"),
    "perf/actor_train_time": ("s", "old log-probs (several steps per rollout only) plus the optimizer steps"),
    "perf/update_weights_time": ("s", "loading the new weights into the engine"),
    "perf/step_time": ("s", "the whole step, wall clock"),
    "perf/tokens_per_s": ("tokens/s", "rollout/tokens / perf/rollout_time"),
    "perf/max_gpu_memory_gb": ("GiB", "peak GPU memory allocated by this process in the step"),
    # train: the optimizer steps of the rollout (means over them)
    "train/loss": ("", "policy loss"),
    "train/pg_clipfrac": ("", "fraction of tokens whose ratio was clipped"),
    "train/ppo_kl": ("", "mean (old log-prob - new log-prob) over tokens"),
    "train/kl_loss": ("", "k3 KL to the reference model (only when --kl-loss-coef > 0)"),
    "train/entropy": ("nats", "mean token entropy of the policy"),
    "train/grad_norm": ("", "gradient norm before clipping"),
    "train/lr": ("", "learning rate"),
    "train/steps": ("", "optimizer steps taken on this rollout"),
    "train/micro_batches": ("", "forward/backward passes in the update (all optimizer steps)"),
    "train/train_rollout_logprob_abs_diff": ("", "mean |trainer - engine| log-prob of the sampled tokens"),
    # eval: greedy accuracy on the held-out split
    "eval/accuracy": ("", "greedy accuracy on the eval split (steps with --eval-interval only)"),
    # heat: the heat guard (labkit only)
    "heat/clean": ("", "true when no heat pause overlapped the rollout"),
    "heat/pause_time": ("s", "seconds of heat pause inside the step"),
    "heat/max_temp_c": ("C", "hottest GPU reading during the step"),
    # client: rollouts over HTTP, --rollout-mode http (labkit only)
    "client/requests": ("", "requests answered in the step (one per answer; evaluation's too)"),
    "client/failed_attempts": ("", "failed attempts (503s, other 5xx, 429, timeouts, connection errors), each retried"),
    "client/503s": ("", "failed attempts answered 503 Service Unavailable (what the watchdog groups into bursts)"),
    "client/retried_requests": ("", "answered requests that needed more than one attempt"),
    "client/max_attempts": ("", "most attempts one request took"),
    "client/stalls": ("", "stalls the watchdog flagged: no request completed for 60 s while the rollout was open"),
    "client/engines_synced": ("", "engines that loaded the new weights after the optimizer step"),
    "client/weights_write_time": ("s", "writing the weights file the engines load (part of perf/update_weights_time)"),
    "client/weights_load_time": ("s", "the engines loading it, in parallel (part of perf/update_weights_time)"),
    # time: wall clock (labkit only)
    "time/start": ("s", "unix time the step started"),
    "time/end": ("s", "unix time the step ended"),
}

# A few loose names people bring from other tools, mapped to ours.
ALIASES: dict[str, str] = {
    "reward": "rollout/raw_reward",
    "step": STEP,
    "rollout_time": "perf/rollout_time",
    "response_length": "rollout/response_len/mean",
    "frac_reward_zero_std": "rollout/zero_std/frac_groups",
}


def describe(name: str) -> str:
    """Return a one-line description of a metric name, with its unit."""
    unit, meaning = METRICS[ALIASES.get(name, name)]
    return f"{meaning} ({unit})" if unit else meaning

