"""The GRPO loop: rollout, reward, advantages, update, weight sync, log; one line per step.

`train(cfg)` reads top to bottom like the recipe: each step samples n answers for each of
P prompts, scores them, turns rewards into group-relative advantages, takes
prompts x answers / global-batch optimizer steps, hands the new weights to the engine and
appends the step's metrics to the run log. Each phase runs inside a timer that becomes a
`perf/<phase>_time` metric. The loop stops cleanly between steps on a time limit or a
signal, and saves what --resume needs (labkit.checkpoint), so a run that dies loses at most
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
import traceback
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import torch

from labkit import data as datamod
from labkit.actor import compute_logprobs, make_optimizer, pack_rollout, train_on_rollout
from labkit.checkpoint import (CheckpointWriteFailed, SavePolicy, latest_checkpoint, load_checkpoint,
                               remove_auto_checkpoints, save_checkpoint, sweep_temp_files)
from labkit.config import RunConfig
from labkit.engines import keep, make_engine, resolve_engine
from labkit.engines.base import Completion, Engine, Sampling
from labkit.evaluation import eval_name, evaluate
from labkit.grpo import compute_advantages
from labkit.heat import HeatGuard, is_clean, make_guard, pause_seconds_within
from labkit.metrics import STEP
from labkit.reward import load_reward, score
from labkit.errors import LabkitError, one_line
from labkit.runlog import Run, RunLog, RunLogError, open_run_folder
from labkit.stopping import SecondSignal, StopController
from labkit.models import (context_length, default_device, load_policy, load_tokenizer,
                           pick_dtype, resolve_model, stop_token_ids)


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


@dataclass
class Session:
    """Everything a run holds while it trains."""

    cfg: RunConfig
    log: RunLog
    policy: torch.nn.Module
    tokenizer: object
    engine: Engine
    optimizer: torch.optim.Optimizer
    problems: list
    eval_problems: list
    reward_fn: object
    guard: HeatGuard
    autocast: object = contextlib.nullcontext
    ref: torch.nn.Module | None = None
    stop_ids: tuple[int, ...] = ()
    prompt_cache: dict = field(default_factory=dict)
    stopper: StopController | None = None
    phase: str = "setup"  # rollout, train, logged: where a failure leaves the policy
    owns_engine: bool = True  # made by the trainer, so closed by it (a notebook runs several)
    first_step: int = 0  # where this launch starts (after a resumed checkpoint)
    startup: dict = field(default_factory=dict)  # perf/startup_* of this process's first step
    prefetched: dict = field(default_factory=dict)  # --overlap-rollout: step -> its rollout
    policy_key: tuple = ()  # what the kept policy is (its starting-point results are cached)
    train_stream: object = None  # --overlap-rollout on a GPU: the update's CUDA stream


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
            s = _start(cfg, log, resume, first_step, engine=engine, guard=guard)
        except BaseException:
            log.abandon() if resume is None else log.release()
            raise
        s.stopper, first_step = stopper, s.first_step
        saves = SavePolicy(cfg.save_interval)
        reason, message, last = "completed", "", first_step - 1
        bar = _progress(s, first_step)
        with s.guard:
            try:
                if first_step == 0:
                    log_evaluation(s, trained_steps=0, bar=bar)
                for step in range(first_step, cfg.num_rollout):
                    why = stopper.should_stop()
                    if why:
                        reason, message = (part.strip() for part in why.split(":", 1))
                        break
                    s.engine.begin_step(step)  # e.g. client.jsonl names the trainer's step
                    t0 = time.time()
                    metrics = run_step(s, step)
                    metrics["perf/step_time"] = time.time() - t0
                    metrics["time/start"], metrics["time/end"] = t0, time.time()
                    metrics.update(s.startup)  # the first step this process ran: where start-up went
                    s.startup = {}
                    log.append_step(metrics)
                    log.append_heat(p.to_dict() for p in s.guard.take_new_pauses())
                    s.phase, last = "logged", step
                    saved_s = _save_between_steps(s, saves, step)  # counts toward the next estimate
                    stopper.record_step(metrics["perf/step_time"] + saved_s)
                    _advance(bar, metrics)
                    if step + 1 == cfg.num_rollout or (cfg.eval_interval
                                                       and (step + 1) % cfg.eval_interval == 0):
                        log_evaluation(s, trained_steps=step + 1, bar=bar)
            except BaseException as e:  # an engine that died, a second signal, a bug
                reason, message = _failure(e, stopper)
                _finish(s, reason, last, message, bar, saves, error=e)
                raise
            _finish(s, reason, last, message, bar, saves)
    return Run(run_dir)


def run_step(s: Session, step: int) -> dict:
    """One GRPO step: rollout, reward, advantages, update, weight sync. Returns its metrics."""
    cfg, timers = s.cfg, {}
    s.phase = "rollout"
    with _timer(timers, "rollout"):  # with --overlap-rollout, written during the last update
        rollout = s.prefetched.pop(step, None) or generate_rollout(s, step)
    if not cfg.overlap_rollout:
        s.engine.sleep()  # colocated: give the KV cache's memory to the optimizer step
    with _timer(timers, "reward"):
        rewards = score_rollout(s, rollout)
    adv = compute_advantages(rewards, normalize_std=not cfg.disable_grpo_std_normalization)
    s.phase = "train"  # from here until the log line, the policy is ahead of the log
    if cfg.overlap_rollout and step + 1 < cfg.num_rollout and not _stopping(s):
        train_stats, batch, timers["actor_train"], timers["overlap"] = \
            update_while_generating(s, rollout, adv.values, step)
    else:
        with _timer(timers, "actor_train"):
            train_stats, batch = update_policy(s, rollout, adv.values, step)
    if torch.cuda.is_available():
        torch.cuda.empty_cache()  # hand the optimizer's cached blocks back before vLLM wakes
    with _timer(timers, "update_weights"):  # new weights first, then the KV cache comes back
        s.engine.update_weights(s.policy)
        s.engine.wake()
    metrics = summarize_step(s, step, rollout, rewards, adv.zero_std, batch)
    metrics.update(train_stats)
    metrics.update({f"perf/{k}_time": v for k, v in timers.items()})
    metrics["perf/rollout_time"] = rollout.seconds
    metrics["perf/tokens_per_s"] = metrics["rollout/tokens"] / max(rollout.seconds, 1e-9)
    if torch.cuda.is_available():
        metrics["perf/max_gpu_memory_gb"] = torch.cuda.max_memory_allocated() / 2**30
        torch.cuda.reset_peak_memory_stats()
    metrics.update(s.engine.step_metrics())  # client/ for rollouts over HTTP
    log_samples(s, step, rollout, rewards)
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
              autocast=s.autocast)
    if cfg.overlap_rollout:  # one step off-policy: the engine's log-probs are the old policy
        batch.old_logprobs = batch.engine_logprobs
    elif cfg.steps_per_rollout > 1:  # else the training pass gives them (see labkit.actor)
        batch.old_logprobs = compute_logprobs(s.policy, batch, **kw)
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
    """The rollout half of a step's metrics (names from labkit.metrics)."""
    comps = [c for g in rollout.completions for c in g]
    lengths = torch.tensor([len(c.token_ids) for c in comps], dtype=torch.float32)
    all_zero = (rewards == 0).all(dim=1).float().mean()
    all_one = (rewards == 1).all(dim=1).float().mean()
    return {
        STEP: step,
        "rollout/raw_reward": float(rewards.mean()),
        "rollout/raw_reward_std": float(rewards.flatten().std()) if rewards.numel() > 1 else 0.0,
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


def log_evaluation(s: Session, trained_steps: int, bar=None) -> dict | None:
    """Evaluate the policy after `trained_steps` steps on the held-out problems (none: skip)
    and append the row to eval.jsonl. The starting model's result is computed once per
    process for the same model and problems (a rerun in a notebook need not wait for it)."""
    if not s.eval_problems:
        return None
    if bar is not None:
        bar.evaluating(len(s.eval_problems))
    ids = [encode_prompt(s, p) for p in s.eval_problems]

    def run() -> dict:
        return evaluate(s.engine, ids, s.eval_problems, max_tokens=s.cfg.rollout_max_response_len,
                        stop_token_ids=s.stop_ids, autocast=s.autocast)

    reused = False
    if trained_steps == 0:
        key = ("eval", s.policy_key, s.engine.name, tuple(p.id for p in s.eval_problems),
               s.cfg.rollout_max_response_len, s.cfg.dtype)
        row, reused = keep.starting_result(key, run)
    else:
        row = run()
    row = {**row, "eval/trained_steps": trained_steps, "eval/reused": reused, "time/end": time.time()}
    s.log.append_eval(row)
    name = eval_name(s.eval_problems)
    line = (f"labkit: held-out accuracy after {trained_steps} steps: {row[name]:.3f} "
            f"({name}, {row[name + '_n']} problems, "
            + ("same start model as before in this process)" if reused
               else f"{row['perf/eval_time']:.1f} s)"))
    bar.say(line) if bar is not None else print(line, flush=True)
    return row


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


def encode_prompt(s: Session, problem) -> list[int]:
    """Token ids of the chat prompt for a problem (cached by problem id), within the context
    (a longer one is refused or cut before any engine sees it: labkit.data.fit_prompt)."""
    ids = s.prompt_cache.get(problem.id)
    if ids is None:
        ids = datamod.prompt_token_ids(s.tokenizer, problem.question)
        ids = s.prompt_cache[problem.id] = datamod.fit_prompt(
            s.tokenizer, problem, ids, context_length(s.policy, s.engine),
            s.cfg.rollout_max_response_len, truncate=s.cfg.long_prompts == "truncate")
    return ids




# ----------------------------------------------------------------------------- setup
def setup(cfg: RunConfig, log: RunLog, *, engine: Engine | None = None,
          guard: HeatGuard | None = None) -> Session:
    """Load data, reward, model, optimizer, engine and heat guard for a run; time each
    start-up phase (perf/startup_*)."""
    torch.manual_seed(cfg.seed)
    timers: dict = {}
    with _timer(timers, "startup_data"):
        # The problem set is the same for every seed (seed 0); cfg.seed only orders it.
        problems = datamod.load_problems(cfg.data, "train", seed=0,
                                         synthetic_steps=cfg.synthetic_steps)
        eval_problems = []
        if cfg.eval_split_size:
            eval_problems = datamod.split_eval(cfg.data, cfg.eval_split_size,
                                               synthetic_steps=cfg.synthetic_steps)
    reward_fn = load_reward(cfg.rm_type, cfg.custom_rm_path)
    device = default_device()
    with _timer(timers, "startup_model"):
        path = resolve_model(cfg.model)
        tokenizer = load_tokenizer(path)
        policy_key = (path, str(device), cfg.gradient_checkpointing)
        policy, policy_reused = keep.take_policy(policy_key, lambda: _load_policy(cfg, path, device))
    compute = pick_dtype(cfg.dtype, device)
    autocast = contextlib.nullcontext
    if compute != torch.float32:
        autocast = lambda: torch.autocast(device.type, dtype=compute)  # noqa: E731
    ref = None
    if cfg.kl_loss_coef > 0:
        ref = load_policy(path, compute, device).eval().requires_grad_(False)
    with _timer(timers, "startup_engine"):
        owns_engine, engine_reused = engine is None, False
        if engine is None:
            engine, owns_engine, engine_reused = start_engine(cfg, path, policy, tokenizer)
    engine.log_to(log.dir)  # e.g. the HTTP client's failed attempts, in client.jsonl
    guard = guard or make_guard(cfg.heat_pause_c, cfg.heat_resume_c)
    log.add_to_config(heat_guard=guard.state)  # "off: no GPU" is said nowhere else
    startup = {f"perf/{k}_time": v for k, v in timers.items()}
    startup.update({f"perf/{k.replace('_seconds', '_time')}": v
                    for k, v in getattr(engine, "stats", {}).items()
                    if k.startswith("startup_") and not engine_reused})
    startup["perf/startup_reused"] = int(policy_reused) + int(engine_reused)
    _say_startup(startup, policy_reused, engine_reused)
    return Session(cfg, log, policy, tokenizer, engine, make_optimizer(policy, cfg), problems,
                   eval_problems, reward_fn, guard, autocast, ref, stop_token_ids(tokenizer, policy),
                   owns_engine=owns_engine, startup=startup, policy_key=policy_key)


def _load_policy(cfg: RunConfig, path: str, device) -> torch.nn.Module:
    # Master weights stay float32 (a 1e-6 step vanishes in bfloat16); bf16 is for compute.
    policy = load_policy(path, torch.float32, device)
    if cfg.gradient_checkpointing:
        policy.gradient_checkpointing_enable()
        policy.config.use_cache = False
    return policy


def start_engine(cfg: RunConfig, path: str, policy, tokenizer) -> tuple[Engine, bool, bool]:
    """The run's engine: a colocated vLLM engine is kept between runs of this process and
    taken back when the model and engine settings match (labkit.engines.keep); the others
    are cheap to make. Returns (engine, the run owns it, it was taken back)."""
    name = resolve_engine(cfg)
    if cfg.rollout_mode == "colocate" and name == "vllm":
        key = ("vllm", path, cfg.dtype, cfg.rollout_gpu_memory_fraction, cfg.rollout_kv_cache_gb,
               cfg.rollout_sleep and not cfg.overlap_rollout, cfg.rollout_max_response_len)
        engine, reused = keep.take_engine(key, lambda: make_engine(cfg, path, policy, tokenizer))
        return engine, False, reused
    return make_engine(cfg, path, policy, tokenizer), True, False


def _say_startup(startup: dict, policy_reused: bool, engine_reused: bool) -> None:
    """One line: where the start-up time went, or what was taken back from the last run."""
    total = sum(v for k, v in startup.items() if k in
                ("perf/startup_data_time", "perf/startup_model_time", "perf/startup_engine_time"))
    parts = [f"data {startup['perf/startup_data_time']:.1f} s",
             f"model {startup['perf/startup_model_time']:.1f} s" + (" (kept)" if policy_reused else ""),
             f"engine {startup['perf/startup_engine_time']:.1f} s" + (" (kept)" if engine_reused else "")]
    inner = [f"{label} {startup[key]:.1f} s" for label, key in
             (("compile", "perf/startup_compile_time"), ("CUDA graphs", "perf/startup_cuda_graph_time"))
             if key in startup]
    if inner:
        parts[-1] += f": {', '.join(inner)}"
    print(f"labkit: ready in {total:.1f} s ({'; '.join(parts)})", flush=True)


def _start(cfg: RunConfig, log: RunLog, resume, first_step: int, **kw) -> Session:
    """Everything before the first step: what a resume needs is checked before anything
    loads, then setup, then the checkpoint. Returns the session (first_step set)."""
    _sweep_temp_files(log.dir)
    found = _check_resumable(log, cfg, first_step) if resume is not None else None
    s = setup(cfg, log, **kw)
    s.first_step = restore(s, found) if resume is not None else 0
    return s


def _check_resumable(log: RunLog, cfg: RunConfig, logged_next: int):
    """The checkpoint to resume from, or None when no step was logged (start at step 0).
    Refuses (RunLogError naming what is missing) a run with logged steps and no checkpoint,
    and a completed run with no steps left to run."""
    found = latest_checkpoint(log.dir)
    status = log.status() or {}
    if found is not None and found[0] + 1 >= cfg.num_rollout:
        raise RunLogError(
            f"--resume {log.dir}: nothing to run, the checkpoint is after step {found[0]} and "
            f"--num-rollout is {cfg.num_rollout}; pass a larger --num-rollout to train further")
    if found is None and logged_next > 0:
        why = ("it was started with --save-interval -1 (no checkpoints)" if cfg.save_interval < 0
               else "it completed, and a completed run keeps none unless --save-interval K"
               if status.get("reason") == "completed"
               else "it was killed (SIGKILL, out of memory) before it wrote one")
        raise RunLogError(
            f"--resume {log.dir}: no checkpoint in {log.dir / 'checkpoint'} to continue from "
            f"(steps 0-{logged_next - 1} are logged; {why}), so resuming would redo them; "
            f"start a new run, with --save-interval K to keep a checkpoint every K steps")
    return found


def restore(s: Session, found) -> int:
    """Load the checkpoint `found` = (step, file) into the session, set aside what was logged
    after it; return the step to continue from (0 when `found` is None)."""
    if found is None:  # samples of a step killed before its metrics line go aside too
        s.log.set_aside_steps_after(-1)
        print(f"labkit: resuming {s.log.dir} from step 0 (no step was logged)", flush=True)
        return 0
    step, path = found
    load_checkpoint(path, s.policy, s.optimizer)
    s.engine.update_weights(s.policy)
    redo = s.log.set_aside_steps_after(step)
    again = (f"; steps {step + 1}-{step + redo} run again (their old lines: *.after-checkpoint)"
             if redo else "")
    print(f"labkit: resuming {s.log.dir} after step {step}{again}", flush=True)
    return step + 1


def _sweep_temp_files(run_dir: Path) -> None:
    files, size = sweep_temp_files(run_dir)
    if files:
        print(f"labkit: removed {files} temporary file(s) ({size / 2**20:,.0f} MB) that a killed "
              f"run left in {run_dir}", flush=True)


def _save_between_steps(s: Session, saves: SavePolicy, step: int) -> float:
    """A checkpoint after `step` when the policy asks for one; returns the seconds it took."""
    why = saves.after_step(step)
    if why is None:
        return 0.0
    t = time.time()
    save_checkpoint(s.log.dir, step, s.policy, s.optimizer, why=why)
    saves.saved(step)
    return time.time() - t


def _failure(e: BaseException, stopper: StopController) -> tuple[str, str]:
    """(reason, message) for the status of a run that an exception ended."""
    if isinstance(e, SecondSignal):
        return "signal", f"{stopper.signal_name}, then a second one interrupted the step"
    if isinstance(e, KeyboardInterrupt):
        return "interrupted", "KeyboardInterrupt"
    if isinstance(e, LabkitError):
        return "error", one_line(e)
    return "error", f"{e.__class__.__name__}: {one_line(e)}"


def _finish(s: Session, reason: str, last: int, message: str, bar, saves: SavePolicy,
            error: BaseException | None = None) -> None:
    """Checkpoint what a resume needs, say why the run stopped (status.json), close the engine.

    After a failure in the middle of the optimizer steps the policy is ahead of the log, so
    no checkpoint is written then: the previous one (if any) stays the one to resume from. A
    second signal may cut the checkpoint short; the status is written whatever happens.
    """
    try:
        if bar is not None:
            bar.close()
        s.log.append_heat(p.to_dict() for p in s.guard.take_new_pauses())
        note = _final_checkpoint(s, reason, last, saves)
        if s.stopper is not None:
            s.stopper.finishing()  # from here a signal is noted, never raised
        extra = {}
        if reason == "signal" and s.stopper is not None:
            extra["signal"] = s.stopper.signal_name
        if error is not None and reason == "error":
            extra["traceback"] = "".join(traceback.format_exception(type(error), error,
                                                                    error.__traceback__))
            error.labkit_run_dir = s.log.dir  # the command line names the status file
        try:
            s.log.write_status(reason, last, message + note, **extra)
        except OSError as e:
            print(f"labkit: could not write {s.log.dir / 'status.json'} ({e.strerror or e})",
                  flush=True)
        if s.owns_engine:
            s.engine.close()
        elif error is not None and keep.is_kept(s.engine):
            keep.drop_engine()  # stopped mid-call, it may still hold requests: not for the next run
        s.prefetched.clear()
        print(f"labkit: run stopped ({reason}{': ' + message if message else ''}{note}) after "
              f"step {last}; log in {s.log.dir}", flush=True)
    finally:
        s.log.release()  # the next trainer may take the folder


def _final_checkpoint(s: Session, reason: str, last: int, saves: SavePolicy) -> str:
    """Write the checkpoint a stop needs (labkit.checkpoint.SavePolicy), or remove the default
    policy's when the run completed. Returns a note for the status ('' when all went well)."""
    if s.phase == "train":
        return ("; the failure came during the optimizer step, so the policy was not saved: "
                + _resume_note(s.log.dir))
    why = saves.at_end(last, completed=reason == "completed")
    try:
        if why is not None:
            save_checkpoint(s.log.dir, last, s.policy, s.optimizer, why=why)
            saves.saved(last)
        elif reason == "completed" and s.cfg.save_interval == 0:
            remove_auto_checkpoints(s.log.dir)
    except CheckpointWriteFailed as e:
        return f"; {e}; {_resume_note(s.log.dir)}"
    except KeyboardInterrupt:
        return f"; a second signal cut the checkpoint of step {last} short: {_resume_note(s.log.dir)}"
    return ""


def _resume_note(run_dir: Path) -> str:
    try:
        found = latest_checkpoint(run_dir)
    except RunLogError:
        found = None
    if found is None:
        return "there is no checkpoint, so --resume is refused"
    return f"--resume continues after step {found[0]}, the last checkpoint"


# ----------------------------------------------------------------------------- helpers
@contextlib.contextmanager
def _timer(timers: dict, name: str):
    t = time.perf_counter()
    try:
        yield
    finally:
        timers[name] = time.perf_counter() - t


def _progress(s: Session, first: int):
    """The bar over the steps, which also shows the rollout's answers and the update's
    micro-batches of the step in progress (labkit.progress); None with --no-progress."""
    if not s.cfg.progress:
        return None
    from labkit.progress import StepProgress

    return StepProgress(s.cfg.num_rollout, first, engine=s.engine, policy=s.policy,
                        samples=s.cfg.samples_per_rollout)


def _advance(bar, metrics: dict) -> None:
    if bar is not None:
        bar.advance(metrics)
