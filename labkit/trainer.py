"""The GRPO loop: rollout, reward, advantages, update, weight sync, log; one line per step.

`train(cfg)` reads top to bottom like the recipe: each step samples n answers for each of
P prompts, scores them, turns rewards into group-relative advantages, takes
prompts x answers / global-batch optimizer steps, hands the new weights to the engine and
appends the step's metrics to the run log. Each phase runs inside a timer that becomes a
`perf/<phase>_time` metric. The loop stops cleanly between steps on a time limit or a
signal, and saves what --resume needs (labkit.run.checkpoint), so a run that dies loses at most
the step in progress; a resumed run logs no step twice, and a start that fails leaves nothing.

Held-out accuracy (labkit.evaluation) is measured before the first step and after the
last, outside the steps' clocks. With `--overlap-rollout` the engine writes rollout k+1
while the policy trains on rollout k (miles' asynchronous training): rollout k+1 then
comes from the weights before step k, one step behind, and its PPO ratio is taken
against the engine's own log-probs of its answers. A second run in the same process with
the same model and engine settings takes back the policy and the vLLM engine the first
one left up (labkit.engines.keep) instead of loading them again.
"""

from __future__ import annotations

import contextlib
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import torch

from labkit import data as datamod
from labkit.actor import compute_logprobs, samples_that_train, train_on_rollout
from labkit.config import RunConfig
from labkit.data import encode_prompt
from labkit.engines.base import Completion, Engine, Sampling
from labkit.evaluation import EvaluationStopped, evaluation_due, log_evaluation
from labkit.grpo import compute_advantages
from labkit.lifecycle import (
    evaluation_owed,
    failure_status,
    finish_run,
    log_unsynced_step,
    save_between_steps,
    start_run,
)
from labkit.machine.heat import HeatGuard, is_clean, pause_seconds_within
from labkit.packing import pack_rollout
from labkit.reward import score
from labkit.run.checkpoint import SavePolicy
from labkit.run.log import Run, open_run_folder
from labkit.run.metrics import STEP
from labkit.run.stopping import StopController
from labkit.session import Session, timed

CHECKPOINT_RESERVE_S = 30.0  # time kept for the final checkpoint under --time-limit


@dataclass
class Rollout:
    """One rollout: the problems, their prompt ids, and n completions for each."""

    problems: list
    prompt_ids: list[list[int]]
    completions: list[list[Completion]]
    seconds: float = 0.0
    pause_seconds: float = 0.0
    clean: bool = True


# ----------------------------------------------------------------------------- the loop
def train(cfg: RunConfig, *, resume: str | Path | None = None, engine: Engine | None = None,
          guard: HeatGuard | None = None, stopper: StopController | None = None) -> Run:
    """Run GRPO for cfg.num_rollout steps (or continue `resume`); return the Run.

    A start that fails (data, model, engines) leaves no new run folder behind; a run folder
    has one trainer at a time (its lock); a resumed run continues from a checkpoint or is
    refused, so no step is logged twice.
    """
    cfg.check()
    # The time limit counts from here: a run queue's limit counts loading too. The reserve
    # keeps time for the final checkpoint (the course's run was stopped while shutting down).
    stopper = stopper or StopController(cfg.time_limit_seconds, reserve_s=CHECKPOINT_RESERVE_S)
    with stopper:  # signals are caught from here, while loading too, until the status is written
        run_dir, log, first_step = open_run_folder(cfg, resume)
        try:
            s = start_run(cfg, log, resume, first_step, engine=engine, guard=guard)
        except BaseException:
            log.abandon() if resume is None else log.release()
            raise
        s.stopper, first_step = stopper, s.first_step
        saves = SavePolicy(cfg.save_interval)
        if first_step > 0:
            saves.saved(first_step - 1)  # the checkpoint it resumed from: not written again
        reason, message, last = "completed", "", first_step - 1
        bar = _progress(s, first_step)
        with s.guard:
            try:
                stop = None  # why the run stops early ("<kind>: <detail>")
                if evaluation_owed(log, s.cfg, first_step):  # the start's, or one a stop cut short
                    stop = held_out(s, first_step, bar)
                elif first_step > 0 and evaluation_owed(log, s.cfg, 0):  # another run's, not read yet
                    s.start_owed = True
                for step in range(first_step, cfg.num_rollout):
                    stop = stop or stopper.should_stop()
                    if stop:
                        break
                    s.engine.begin_step(step)  # e.g. client.jsonl names the trainer's step
                    t0 = time.time()
                    metrics = run_step(s, step)
                    metrics["perf/step_time"] = time.time() - t0
                    metrics["time/start"], metrics["time/end"] = t0, time.time()
                    metrics.update(s.startup)  # the first step this process ran: where start-up went
                    s.startup = {}
                    log.append_step(metrics)
                    s.phase, last = "logged", step
                    log.append_heat(p.to_dict() for p in s.guard.take_new_pauses())
                    saved_s = save_between_steps(s, saves, step)  # counts toward the next estimate
                    stopper.record_step(metrics["perf/step_time"] + saved_s)
                    _advance(bar, metrics)
                    if evaluation_due(s.cfg, step + 1):  # one a stop cuts short stops the run
                        stop = held_out(s, step + 1, bar)
                if stop:
                    reason, message = (part.strip() for part in stop.split(":", 1))
            except BaseException as e:  # an engine that died, a second signal, a full disk, a bug
                reason, message = failure_status(e, stopper)
                last, message = log_unsynced_step(s, e, last, message)
                finish_run(s, reason, last, message, bar, saves, error=e)
                raise
            finish_run(s, reason, last, message, bar, saves)
    return Run(run_dir)


def held_out(s: Session, trained_steps: int, bar) -> str | None:
    """The held-out evaluation after `trained_steps` steps (labkit.evaluation); None when it
    ran (or there is none), else why a stop cut it short: the run stops there, and keeps what
    --resume needs to evaluate again."""
    try:
        log_evaluation(s, trained_steps=trained_steps, bar=bar)
    except EvaluationStopped as e:
        why = (s.stopper.should_stop() if s.stopper is not None else None) or f"requested: {e}"
        return f"{why} during the held-out evaluation after {trained_steps} steps"
    return None


def run_step(s: Session, step: int) -> dict:
    """One GRPO step: rollout, reward, advantages, update, weight sync. Returns its metrics."""
    cfg, timers, started = s.cfg, {}, time.time()
    s.phase = "rollout"
    with timed(timers, "rollout"):  # with --overlap-rollout, written during the last update
        rollout = s.prefetched.pop(step, None) or generate_rollout(s, step)
    if not cfg.overlap_rollout:
        s.engine.sleep()  # colocated: give the KV cache's memory to the optimizer step
    with timed(timers, "reward"):
        rewards = score_rollout(s, rollout)
    adv = compute_advantages(rewards, normalize_std=not cfg.disable_grpo_std_normalization)
    s.phase = "train"  # from here until the log line, the policy is ahead of the log
    if cfg.overlap_rollout and step + 1 < cfg.num_rollout and not _stopping(s):
        train_stats, batch, timers["actor_train"], timers["overlap"] = \
            update_while_generating(s, rollout, adv.values, step)
    else:
        with timed(timers, "actor_train"):
            train_stats, batch = update_policy(s, rollout, adv.values, step)
    s.phase = "sync"  # trained, not logged: a failure from here (a full disk) leaves it unlogged
    if torch.cuda.is_available():
        torch.cuda.empty_cache()  # hand the optimizer's cached blocks back before vLLM wakes
    metrics = summarize_step(s, step, rollout, rewards, adv.zero_std, batch)
    metrics.update(train_stats)
    log_samples(s, step, rollout, rewards)
    # The step is trained: a failure from here is the engines' (`labkit serve` stopped, say),
    # and the step stands. The loop logs it (the metrics ride on the exception) and checkpoints
    # after it, so a resumed run sends these weights to the engines and goes on with the next.
    try:
        with timed(timers, "update_weights"):  # new weights first, then the KV cache comes back
            s.engine.update_weights(s.policy)
            s.engine.wake()
    except BaseException as e:
        e.labkit_trained_step = {**_step_metrics(s, metrics, timers, rollout),
                                 "perf/step_time": time.time() - started,
                                 "time/start": started, "time/end": time.time()}
        raise
    return _step_metrics(s, metrics, timers, rollout)


def _step_metrics(s: Session, metrics: dict, timers: dict, rollout: Rollout) -> dict:
    """The rest of a step's metrics: its phases' times, memory, the engine's own counts."""
    metrics = {**metrics, **{f"perf/{k}_time": v for k, v in timers.items()}}
    metrics["perf/rollout_time"] = rollout.seconds
    metrics["perf/tokens_per_s"] = metrics["rollout/tokens"] / max(rollout.seconds, 1e-9)
    if torch.cuda.is_available():
        metrics["perf/max_gpu_memory_gb"] = torch.cuda.max_memory_allocated() / 2**30
        torch.cuda.reset_peak_memory_stats()
    metrics.update(s.engine.step_metrics())  # client/ for rollouts over HTTP
    return metrics


# ----------------------------------------------------------------------------- phases
def generate_rollout(s: Session, step: int) -> Rollout:
    """Sample n answers for each of this step's prompts, waiting out heat pauses."""
    cfg = s.cfg
    problems = datamod.rollout_problems(s.problems, step, cfg.rollout_batch_size, cfg.seed)
    prompt_ids = [encode_prompt(s, p) for p in problems]
    sampling = Sampling(
        n=cfg.n_samples_per_prompt, temperature=cfg.rollout_temperature, top_p=cfg.rollout_top_p,
        max_tokens=cfg.rollout_max_response_len, seed=cfg.seed * 100_003 + step,
        stop_token_ids=s.stop_ids, seed_each_answer=cfg.rollout_seed_each_answer,
        # the overlap's PPO ratio needs the engine's log-probs of every answer; otherwise
        # they only feed the trainer-vs-engine check, on a few prompts
        logprobs_for=None if cfg.overlap_rollout else cfg.rollout_logprob_prompts,
    )
    s.guard.mark()
    # Cool down before the clock starts: a pause here delays the step but does not touch its
    # rollout. A pause between generation batches does, and makes the step not clean.
    cancel = (lambda: s.stopper.stop_requested) if s.stopper else None
    s.guard.wait_if_hot(step, cancel=cancel)
    start = time.time()
    with s.autocast():
        completions = s.engine.generate(prompt_ids, sampling,
                                        lambda: s.guard.wait_if_hot(step, cancel=cancel))
    end = time.time()
    pauses = s.guard.pauses
    return Rollout(problems, prompt_ids, completions, seconds=end - start,
                   pause_seconds=pause_seconds_within(start, end, pauses),
                   clean=is_clean(start, end, pauses))


def score_rollout(s: Session, rollout: Rollout) -> torch.Tensor:
    """Rewards shaped [prompts, n]."""
    texts = [c.text for group in rollout.completions for c in group]
    labels = [p.label for p, group in zip(rollout.problems, rollout.completions) for _ in group]
    flat = score(texts, labels, s.reward_fn)
    return torch.tensor(flat, dtype=torch.float32).view(len(rollout.problems), -1)


def update_policy(s: Session, rollout: Rollout, advantages: torch.Tensor, step: int):
    """Old (when needed) and reference log-probs, then the optimizer steps. Returns (stats, batch)."""
    cfg = s.cfg
    prompts = [rollout.prompt_ids[i] for i, g in enumerate(rollout.completions) for _ in g]
    comps = [c for g in rollout.completions for c in g]
    batch = pack_rollout(prompts, [c.token_ids for c in comps], advantages,
                         [c.logprobs for c in comps], s.tokenizer.pad_token_id)
    kw = dict(micro_batch_size=cfg.micro_batch_size, temperature=cfg.rollout_temperature,
              max_tokens=cfg.max_tokens_per_gpu if cfg.use_dynamic_batch_size else None,
              autocast=s.autocast, share_prompt=cfg.share_prompt, padding_free=cfg.padding_free)
    if cfg.overlap_rollout:  # one step off-policy: the engine's log-probs are the old policy
        batch.old_logprobs = batch.engine_logprobs
    elif cfg.steps_per_rollout > 1:  # else the training pass gives them (see labkit.actor)
        batch.old_logprobs = compute_logprobs(s.policy, batch, **kw, only=samples_that_train(batch, cfg))
    if s.ref is not None:
        batch.ref_logprobs = compute_logprobs(s.ref, batch, **kw)
    gen = torch.Generator().manual_seed(cfg.seed * 7_919 + step)
    stats = train_on_rollout(s.policy, s.optimizer, batch, cfg, generator=gen, autocast=s.autocast)
    stats["train/lr"] = cfg.lr
    if batch.engine_rows is not None and not cfg.overlap_rollout:  # same weights on both sides
        mask = batch.response_mask * batch.engine_rows[:, None]
        diff = (batch.old_logprobs - batch.engine_logprobs).abs() * mask
        stats["train/train_rollout_logprob_abs_diff"] = float(diff.sum() / mask.sum().clamp(min=1))
    return stats, batch


def update_while_generating(s: Session, rollout: Rollout, advantages: torch.Tensor, step: int):
    """--overlap-rollout: train on this rollout in a worker thread while this thread has the
    engine write the next one (from the weights before this update, still in the engine).
    Returns (stats, batch, update seconds, seconds the two ran side by side)."""
    def timed_update():
        start = time.perf_counter()
        with _train_stream(s):
            out = update_policy(s, rollout, advantages, step)
        return out, time.perf_counter() - start

    start = time.perf_counter()
    with ThreadPoolExecutor(1, thread_name_prefix="labkit-update") as pool:
        update = pool.submit(timed_update)
        try:
            s.prefetched[step + 1] = generate_rollout(s, step + 1)
        finally:
            (stats, batch), update_s = update.result()  # never leave the update running
    if torch.cuda.is_available():
        torch.cuda.synchronize()  # the update's stream, before its weights go to the engine
    return stats, batch, update_s, time.perf_counter() - start


@contextlib.contextmanager
def _train_stream(s: Session):
    """A CUDA stream of the update's own, so its kernels can run beside vLLM's. One per run:
    torch caches freed memory per stream, so a new stream every step would strand the last
    one's cache (seen on an H200: 37 GiB reserved but unusable, then out of memory at step 22)."""
    if not torch.cuda.is_available():
        yield
        return
    if s.train_stream is None:
        s.train_stream = torch.cuda.Stream()
    with torch.cuda.stream(s.train_stream):
        yield


def _stopping(s: Session) -> bool:
    return bool(s.stopper and s.stopper.stop_requested)


def summarize_step(s: Session, step: int, rollout: Rollout, rewards: torch.Tensor,
                   zero_std: torch.Tensor, batch) -> dict:
    """The rollout half of a step's metrics (names from labkit.run.metrics)."""
    comps = [c for g in rollout.completions for c in g]
    lengths = torch.tensor([len(c.token_ids) for c in comps], dtype=torch.float32)
    all_zero = (rewards == 0).all(dim=1).float().mean()
    all_one = (rewards == 1).all(dim=1).float().mean()
    return {
        STEP: step,
        "rollout/raw_reward": float(rewards.mean()),
        "rollout/raw_reward_std": float(rewards.flatten().std()) if rewards.numel() > 1 else 0.0,
        "rollout/right_frac": float((rewards >= 1).float().mean()),
        "rollout/zero_std/frac_groups": float(zero_std.float().mean()),
        "rollout/zero_std/all_zero_percentage": float(all_zero),
        "rollout/zero_std/all_one_percentage": float(all_one),
        "rollout/response_len/mean": float(lengths.mean()),
        "rollout/response_len/max": int(lengths.max()),
        "rollout/truncated_ratio": sum(c.truncated for c in comps) / len(comps),
        "rollout/tokens": int(lengths.sum()),
        "rollout/n_prompts": len(rollout.problems),
        "rollout/n_samples_per_prompt": s.cfg.n_samples_per_prompt,
        "heat/clean": rollout.clean,
        "heat/pause_time": rollout.pause_seconds,
        "heat/max_temp_c": s.guard.max_temp_c,
    }


def log_samples(s: Session, step: int, rollout: Rollout, rewards: torch.Tensor) -> None:
    """Keep the completions of a few prompts: prompt id and label, never the problem text
    (a restatement of the problem inside a completion is cut out too)."""
    rows = []
    for i, (p, group) in enumerate(zip(rollout.problems, rollout.completions)):
        if i >= s.cfg.n_logged_prompts:
            break
        for j, c in enumerate(group):
            rows.append({STEP: step, "prompt_id": p.id, "label": p.label, "sample": j,
                         "completion": datamod.redact_quotes(c.text, p.question),
                         "reward": float(rewards[i, j]),
                         "finish_reason": c.finish_reason, "tokens": len(c.token_ids)})
    s.log.append_samples(rows)


# ----------------------------------------------------------------------------- setup
# ----------------------------------------------------------------------------- helpers
def _progress(s: Session, first: int):
    """The bar over the steps, which also shows the rollout's answers and the update's
    micro-batches of the step in progress (labkit.run.progress); None with --no-progress."""
    if not s.cfg.progress:
        return None
    from labkit.run.progress import StepProgress

    # the update runs the transformer body (actor._forward_logprobs), not the policy's forward
    body = getattr(s.policy, "base_model", s.policy)
    return StepProgress(s.cfg.num_rollout, first, engine=s.engine, policy=body,
                        samples=s.cfg.samples_per_rollout, max_tokens=s.cfg.rollout_max_response_len)


def _advance(bar, metrics: dict) -> None:
    """Count a finished step: on the bar, or without one (--no-progress: a log file, a sweep's
    run) as its one line."""
    if bar is not None:
        bar.advance(metrics)
    else:
        from labkit.run.progress import step_line

        print(step_line(metrics), flush=True)
