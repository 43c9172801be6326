"""Metric names: one table, miles' names where miles has one.

Every per-step line of a run log (`metrics.jsonl`) uses these keys, so a run made with
labkit and a run made with miles read the same in the lessons. The step key is
`rollout/step`. Families that only labkit has get their own prefix (`heat/`, `client/`).

How miles' names relate to these (radixark/miles main @ 31f1ca961a94, 2026-08-21;
labkit.miles.log reads them so). Same name, same meaning: rollout/raw_reward,
rollout/zero_std/all_zero_percentage and all_one_percentage (shares of the groups),
rollout/response_len/mean and max, rollout/truncated_ratio, perf/update_weights_time,
train/pg_clipfrac, train/ppo_kl (old - new log-prob), train/kl_loss (k3 with
--kl-loss-type k3), train/grad_norm, train/train_rollout_logprob_abs_diff, and train/loss:
in both the loss minimised, policy term + kl-loss-coef x KL - entropy-coef x entropy
(miles' train/pg_loss is the policy term alone; the two agree when both weights are 0).
The rest differ:

| labkit | miles | how they relate |
|---|---|---|
| rollout/zero_std/frac_groups | zero_std/count_<reward> | sum of the counts / prompts |
| rollout/tokens, n_prompts, n_samples_per_prompt | none | from response_len/mean and the run's flags |
| perf/rollout_time | perf/rollout_time | miles' includes the reward, scored during generation |
| perf/reward_time | none | inside miles' perf/rollout_time |
| perf/actor_train_time | perf/actor_train_time, perf/log_probs_time | miles times its old-log-prob pass apart and runs it every step; labkit runs one only when a rollout gives several optimizer steps and counts it here: the sum then, actor_train_time alone with one step |
| perf/step_time | perf/step_time | miles': train_wait + train, from the end of one update to the end of the next |
| perf/tokens_per_s | none | per run, not per GPU as miles' tokens_per_gpu_per_sec |
| train/entropy | train/entropy_loss | the mean token entropy; miles logs 0 when it does not compute it (--entropy-coef 0 without --observe-training-entropy); labkit's is over the answers that took a pass (train/skipped_frac) |
| train/lr | train/lr-pg_0 | the first parameter group's |
| train/steps | count of `step N` lines | optimizer steps of the rollout |
| eval/accuracy | eval/<name> | miles' mean eval reward; the same for a 0/1 reward |
| rollout/raw_reward_std, rollout/right_frac, perf/max_gpu_memory_gb, train/micro_batches, train/padding_frac, train/skipped_frac, heat/, client/, time/ | none | labkit only |
"""

from __future__ import annotations

STEP = "rollout/step"

# name -> (unit, meaning). The order is the order of the columns in a step summary.
METRICS: dict[str, tuple[str, str]] = {
    STEP: ("", "rollout index, from 0"),
    # rollout: what the engine wrote and what the reward said
    "rollout/raw_reward": ("", "mean reward over all samples of the rollout"),
    "rollout/raw_reward_std": ("", "standard deviation of the reward over all samples"),
    "rollout/right_frac": ("", "fraction of samples that got the full reward, 1: the right answers with --rm-type math or math_format (the rest of math_format's mean reward is its 0.1 format credit)"),
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
    "perf/overlap_time": ("s", "--overlap-rollout: the update and the next rollout, side by side"),
    # perf/startup_*: where the start-up went, in the first step a process runs
    "perf/startup_data_time": ("s", "loading the problems"),
    "perf/startup_model_time": ("s", "finding, dequantizing (GGUF, once per machine) and loading the policy"),
    "perf/startup_engine_time": ("s", "starting the rollout engine (vLLM: load, compile, CUDA graphs, KV cache)"),
    "perf/startup_import_time": ("s", "importing vLLM (part of perf/startup_engine_time)"),
    "perf/startup_llm_time": ("s", "making vLLM's LLM: load, compile, CUDA graphs, KV cache (part of perf/startup_engine_time)"),
    "perf/startup_load_time": ("s", "vLLM's own model load (part of perf/startup_engine_time)"),
    "perf/startup_compile_time": ("s", "vLLM's torch.compile (part of perf/startup_engine_time)"),
    "perf/startup_cuda_graph_time": ("s", "vLLM's CUDA graph capture (part of perf/startup_engine_time)"),
    "perf/startup_engine_init_time": ("s", "vLLM's profile, KV cache and warm-up (part of perf/startup_engine_time)"),
    "perf/startup_reused": ("", "what was taken back from an earlier run in this process: 0, 1 (policy), 2 (policy and engine)"),
    # train: the optimizer steps of the rollout (means over them)
    "train/loss": ("", "the loss minimised: policy term + kl-loss-coef x KL - entropy-coef x entropy"),
    "train/pg_clipfrac": ("", "fraction of tokens whose ratio was clipped"),
    "train/ppo_kl": ("", "mean (old log-prob - new log-prob) over tokens"),
    "train/kl_loss": ("", "k3 KL to the reference model (only when --kl-loss-coef > 0)"),
    "train/entropy": ("nats", "mean token entropy of the policy"),
    "train/grad_norm": ("", "gradient norm before clipping"),
    "train/lr": ("", "learning rate"),
    "train/steps": ("", "optimizer steps taken on this rollout"),
    "train/micro_batches": ("", "forward/backward passes in the update (all optimizer steps)"),
    "train/padding_frac": ("", "share of the update's padded tokens (rows x longest) that are padding"),
    "train/skipped_frac": ("", "share of the answers that took no pass: advantage 0 (--skip-zero-advantage)"),
    "train/train_rollout_logprob_abs_diff": ("", "mean |trainer - engine| log-prob of the sampled tokens"),
    # eval: a miles log's evaluation (labkit's own runs write eval.jsonl: EVAL_METRICS)
    "eval/accuracy": ("", "greedy accuracy on the held-out problems, as a miles log reports it"),
    # heat: the heat guard (labkit only)
    "heat/clean": ("", "true when no heat pause overlapped the rollout"),
    "heat/pause_time": ("s", "seconds of heat pause inside the step"),
    "heat/max_temp_c": ("C", "hottest GPU reading during the step"),
    # client: rollouts over HTTP, --rollout-mode http (labkit only)
    "client/requests": ("", "requests answered in the step (one per answer; evaluation's too)"),
    "client/failed_attempts": ("", "failed attempts (503s, other 5xx, 408, 429, timeouts, connection errors), each retried"),
    "client/503s": ("", "failed attempts answered 503 Service Unavailable (what the watchdog groups into bursts)"),
    "client/retried_requests": ("", "answered requests that needed more than one attempt"),
    "client/max_attempts": ("", "most attempts one request took"),
    "client/stalls": ("", "stalls the watchdog flagged: no request completed for 60 s while the rollout was open"),
    "client/engines_synced": ("", "engines that loaded the new weights after the optimizer step"),
    "client/weights_write_time": ("s", "writing the weights file the engines load (part of perf/update_weights_time)"),
    "client/weights_gather_time": ("s", "the parameters to CPU memory in the sync dtype: device copies, one synchronize (part of client/weights_write_time)"),
    "client/weights_file_time": ("s", "the file itself: header, data, rename (part of client/weights_write_time)"),
    "client/weights_bytes": ("bytes", "size of the weights file"),
    "client/weights_in_memory": ("", "1 when the weights file went through memory (tmpfs: /dev/shm), 0 through a disk"),
    "client/weights_load_time": ("s", "the engines loading it, in parallel (part of perf/update_weights_time)"),
    "client/weights_engine_time": ("s", "the slowest engine's own time in its load (part of client/weights_load_time; the rest is HTTP and the prefix-cache reset)"),
    "client/weights_engine_read_time": ("s", "the slowest engine's time taking the tensors from the file to its device (part of client/weights_engine_time)"),
    # client/sync_check_*: --http-sync-check, each engine's log-probs of a fixed answer after the sync
    "client/sync_check_abs_diff": ("", "largest over the engines of the mean |trainer - engine| log-prob of the fixed answer, after the sync"),
    "client/sync_check_engines_changed": ("", "engines whose log-probs of the fixed answer differ from their last sync's (all of them, when the trainer's moved)"),
    "client/sync_check_engine_change": ("", "smallest over the engines of the mean |now - last sync| of its log-probs of the fixed answer"),
    "client/sync_check_trainer_change": ("", "mean |now - last sync| of the trainer's log-probs of the fixed answer: how far each engine should have moved"),
    "client/sync_check_time": ("s", "the check: the trainer's pass and one request per engine (part of perf/update_weights_time)"),
    # time: wall clock (labkit only)
    "time/start": ("s", "unix time the step started"),
    "time/end": ("s", "unix time the step ended"),
}

# One line of eval.jsonl per evaluation (labkit.evaluation); <source>_<split> is the data's,
# e.g. eval/gsm8k_test.
EVAL_METRICS: dict[str, tuple[str, str]] = {
    "eval/trained_steps": ("", "optimizer steps taken before the evaluation (0: the starting model)"),
    "eval/<source>_<split>": ("", "greedy accuracy: share of the held-out problems the math reward scores 1"),
    "eval/<source>_<split>_stderr": ("", "binomial standard error of that accuracy, sqrt(p (1 - p) / n)"),
    "eval/<source>_<split>_n": ("", "held-out problems evaluated"),
    "eval/response_len/mean": ("tokens", "mean length of the greedy answers"),
    "eval/truncated_ratio": ("", "fraction of greedy answers cut at --rollout-max-response-len"),
    "eval/reused": ("", "true when the starting model's result came from an earlier run in this process or another run of the sweep"),
    "perf/eval_time": ("s", "the evaluation, wall clock (never part of perf/step_time)"),
    "time/end": ("s", "unix time the evaluation ended"),
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
    name = ALIASES.get(name, name)
    if name in METRICS:
        unit, meaning = METRICS[name]
    elif name in EVAL_METRICS:
        unit, meaning = EVAL_METRICS[name]
    elif name.startswith("eval/"):  # an accuracy named after its data: eval/gsm8k_test, ...
        suffix = next((s for s in ("_stderr", "_n") if name.endswith(s)), "")
        unit, meaning = EVAL_METRICS["eval/<source>_<split>" + suffix]
    else:
        raise KeyError(f"no metric named {name!r}; the names are labkit.run.metrics.METRICS")
    return f"{meaning} ({unit})" if unit else meaning

