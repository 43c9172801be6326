"""A run's loaded state: data, reward, policy, engine, optimizer and heat guard, built once.

`setup(cfg, log)` loads what a run needs and times each part (`perf/startup_*`, said in one
line): the problems, the policy (a GGUF is dequantized once per machine), and the engine. A
colocated vLLM engine and the policy are kept for the next run of the process
(labkit.engines.keep): a notebook that reruns a cell with another group size takes them
back in seconds instead of starting vLLM again.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field

import torch

from labkit import data as datamod
from labkit.actor import make_optimizer
from labkit.config import RunConfig
from labkit.engines import check_engine, keep, make_engine, resolve_engine
from labkit.engines.base import Engine
from labkit.errors import ConfigError
from labkit.evaluation import held_out_problems
from labkit.machine.allocator import keep_freed_memory
from labkit.machine.cpuload import fit_threads
from labkit.machine.heat import HeatGuard, make_guard
from labkit.models import (
    compile_layers,
    default_device,
    disable_dropout,
    enable_checkpointing,
    liger_family,
    liger_patches,
    load_policy,
    load_tokenizer,
    pick_dtype,
    resolve_model,
    stop_token_ids,
    use_liger_kernels,
)
from labkit.packing import use_varlen_attention, varlen_available
from labkit.reward import load_reward
from labkit.run.log import RunLog
from labkit.run.stopping import StopController


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
    eval_size_fixed: bool = False  # the held-out problems are cut to the run's size (evaluation)
    start_owed: bool = False  # the starting model's result is another run's, logged later (evaluation)


def setup(cfg: RunConfig, log: RunLog, *, engine: Engine | None = None,
          guard: HeatGuard | None = None) -> Session:
    """Load data, reward, model, optimizer, engine and heat guard for a run; time each
    start-up phase (perf/startup_*). On a busy CPU, say so first, and compute on one thread
    (labkit.machine.cpuload)."""
    torch.manual_seed(cfg.seed)
    device = default_device()
    if device.type == "cpu":
        keep_freed_memory()  # each step's buffers reused, not faulted in again (allocator)
        if busy := fit_threads():
            print(busy, flush=True)  # before anything loads: the load is then other programs'
    timers: dict = {}
    inputs = load_inputs(cfg, timers)
    problems, eval_problems, reward_fn = inputs.problems, inputs.eval_problems, inputs.reward_fn
    path, liger = inputs.model_path, inputs.liger
    with timed(timers, "startup_weights"):
        tokenizer = load_tokenizer(path)
        policy_key = (path, str(device), bool(cfg.gradient_checkpointing), liger, cfg.torch_compile)
        policy, policy_reused = keep.take_policy(policy_key, lambda: _load_policy(cfg, path, device, liger))
    timers["startup_model"] += timers.pop("startup_weights")
    compute = pick_dtype(cfg.dtype, device)
    autocast = contextlib.nullcontext
    if compute != torch.float32:
        autocast = lambda: torch.autocast(device.type, dtype=compute)  # noqa: E731
    ref = None
    if cfg.kl_loss_coef > 0:
        ref = load_policy(path, compute, device).eval().requires_grad_(False)
    with timed(timers, "startup_engine"):
        owns_engine, engine_reused = engine is None, False
        if engine is None:
            engine, owns_engine, engine_reused = start_engine(cfg, path, policy, tokenizer)
    engine.log_to(log.dir)  # e.g. the HTTP client's failed attempts, in client.jsonl
    guard = guard or make_guard(cfg.heat_pause_c, cfg.heat_resume_c)
    log.add_to_config(heat_guard=guard.state)  # "off: no GPU" is said nowhere else
    if cfg.gradient_checkpointing is None:  # auto, for a run alone: off (labkit.machine.memory.share_gpu)
        log.add_to_config(gradient_checkpointing=False)
    if cfg.use_liger_kernel is None:  # auto: what it was resolved to
        log.add_to_config(use_liger_kernel=liger)
    if device.type == "cpu":  # a step's time depends on it (labkit.machine.cpuload)
        log.add_to_config(torch_threads=torch.get_num_threads())
    startup = {f"perf/{k}_time": v for k, v in timers.items()}
    startup.update({f"perf/{k.replace('_seconds', '_time')}": v
                    for k, v in getattr(engine, "stats", {}).items()
                    if k.startswith("startup_") and not engine_reused})
    startup["perf/startup_reused"] = int(policy_reused) + int(engine_reused)
    _say_startup(startup, policy_reused, engine_reused)
    return Session(cfg, log, policy, tokenizer, engine, make_optimizer(policy, cfg), problems,
                   eval_problems, reward_fn, guard, autocast, ref, stop_token_ids(tokenizer, policy),
                   owns_engine=owns_engine, startup=startup, policy_key=policy_key)


@dataclass
class Inputs:
    """What a run reads before its weights load (load_inputs)."""

    problems: list
    eval_problems: list
    reward_fn: object
    model_path: str  # a local folder or a hub id (labkit.models.resolve_model)
    liger: bool  # whether the policy takes liger-kernel's kernels (liger_kernels)


def load_inputs(cfg: RunConfig, timers: dict | None = None) -> Inputs:
    """The run's problems and held-out split, its reward, its model's files (found, not yet
    loaded) and what this machine must have for the config (liger-kernel's kernels, vLLM),
    each refused in one line where it cannot serve. The run reads them here, and a dry run
    or a sweep checks them here before anything starts, so a dry run refuses exactly what the
    run would. `timers` gets perf/startup_data and startup_model (seconds)."""
    timers = {} if timers is None else timers
    with timed(timers, "startup_data"):
        # The problem set is the same for every seed (seed 0); cfg.seed only orders it.
        problems = datamod.load_problems(cfg.data, "train", seed=0,
                                         synthetic_steps=cfg.synthetic_steps)
        eval_problems = held_out_problems(cfg)  # with auto, cut at the first evaluation
    reward_fn = load_reward(cfg.rm_type, cfg.custom_rm_path)
    with timed(timers, "startup_model"):
        path = resolve_model(cfg.model)
        liger = liger_kernels(cfg, default_device(), path)  # refused before the policy loads
    check_engine(cfg)
    return Inputs(problems, eval_problems, reward_fn, path, liger)


def _load_policy(cfg: RunConfig, path: str, device, liger: bool) -> torch.nn.Module:
    # Master weights stay float32 (a 1e-6 step vanishes in bfloat16); bf16 is for compute.
    # The update runs in train mode (labkit.actor), where transformers checkpoints.
    policy = disable_dropout(load_policy(path, torch.float32, device))
    if cfg.gradient_checkpointing:
        enable_checkpointing(policy)
    if liger:
        use_liger_kernels(policy)
    if cfg.padding_free and varlen_available(device):
        use_varlen_attention(policy)  # packed rows without a mask (labkit.packing)
    if cfg.torch_compile:
        compile_layers(policy)
    return policy


def liger_kernels(cfg: RunConfig, device, path: str) -> bool:
    """Whether the policy takes liger-kernel's kernels: --use-liger-kernel (refused in one
    line where they cannot run), or auto: where the update checkpoints, on a CUDA GPU with
    liger-kernel installed, for a model family it has kernels for (measured faster there;
    the plain update was not). auto is off where the layers are compiled (--torch-compile):
    torch.compile cannot trace liger-kernel's RMSNorm."""
    if cfg.use_liger_kernel is False or (cfg.use_liger_kernel is None and
                                          (not cfg.gradient_checkpointing or cfg.torch_compile)):
        return False
    try:
        patches = liger_patches(device)
    except ConfigError:
        if cfg.use_liger_kernel:
            raise
        return False
    return bool(cfg.use_liger_kernel) or liger_family(path, patches)


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
    if "perf/startup_llm_time" in startup:  # vLLM: its import, then its LLM, where the rest is
        inner = [f"import {startup.get('perf/startup_import_time', 0.0):.1f} s",
                 f"LLM {startup['perf/startup_llm_time']:.1f} s" + (f" ({', '.join(inner)})" if inner else "")]
    if inner:
        parts[-1] += f": {', '.join(inner)}"
    print(f"labkit: ready in {total:.1f} s ({'; '.join(parts)})", flush=True)


@contextlib.contextmanager
def timed(timers: dict, name: str):
    """Time the block into timers[name] (seconds); the trainer logs them as perf/<name>_time."""
    t = time.perf_counter()
    try:
        yield
    finally:
        timers[name] = time.perf_counter() - t
