"""Where a sweep's side-by-side runs go: each GPU takes as many as its free memory holds, the rest wait.

Why: one 0.5B run uses a fraction of an H200, and a machine may have eight; the sweep put
every run on GPU 0. Each run's process now sees one GPU (CUDA_VISIBLE_DEVICES), so torch
and vLLM inside it need no device argument. The plan is made once, before anything starts,
from each GPU's free memory as the driver reports it (labkit.machine.memory), and said in a line
per GPU:

* the GPUs are `gpus=` (`labkit sweep --gpus 0,1`), else env LABKIT_GPUS, else the ones
  CUDA_VISIBLE_DEVICES lists, else every GPU the driver counts; numbers are nvidia-smi's;
* a GPU holds the most runs that fit in its free memory with the settings of a shared GPU
  (`shared_gpu`: a fixed KV cache, then checkpointing) and their own token budget (one
  run alone may take a smaller one); one that cannot hold even one run (another program
  fills it) is skipped with one line, and with none that can, nothing starts
  (GPUMemoryError, one line);
* the runs are shared out evenly, each GPU up to what it holds (fewer runs on a card leave
  each more memory: no checkpointing where one fits without); the rest wait, and each
  starts on the GPU where a run ended (completed, stopped or failed). A run's settings
  are those of the GPU it starts on, so on cards with different free memory two runs of a
  sweep may differ in checkpointing or token budget (not in what a step computes).

Runs of different sizes take what each needs (labkit.machine.memory: a KV cache sized to the
rollout), so a GPU's seats count runs, and a waiting run starts only where its planned memory
fits beside the runs there (`Plan.place`): a small run may start where a large one must wait.
The sweep seats the longest runs first (`longest_first`), so the last to finish is not a
large run that waited behind small ones. One GPU is planned the same way: as many runs at
once as fit, the others wait (before, three runs were planned as four, and a fourth beyond
what fitted was refused).
"""

from __future__ import annotations

import math
import os
import sys
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from labkit.config import ConfigError, RunConfig
from labkit.machine import memory

ENV = "LABKIT_GPUS"  # the GPUs a sweep may use, as --gpus takes them: "0,1"
# What shared_gpu sets for runs that share a GPU: memory and display, not what a step
# computes, so a run resumed with the config it was asked with is the same run.
SHARED_GPU_FIELDS = {"rollout_sleep", "progress", "rollout_gpu_memory_fraction",
                     "rollout_kv_cache_gb", "max_tokens_per_gpu"}


@dataclass(frozen=True)
class GPU:
    """One GPU of the plan: its id as CUDA_VISIBLE_DEVICES takes it (None: the GPU the runs
    see, unnamed), how many runs it holds at once, and its free memory when read."""

    id: str | None
    seats: int
    free_gib: float | None = None


@dataclass(frozen=True)
class Plan:
    """The GPUs a sweep's runs go to, and the model's shape their settings are sized by
    (None: runs keep their configs, as on a CPU)."""

    gpus: tuple[GPU, ...]
    shape: memory.ModelShape | None = None

    @property
    def several(self) -> bool:
        """True when the runs go to more than one GPU (the display names each run's)."""
        return len(self.gpus) > 1

    def seat(self, busy: Mapping[str | None, int]) -> GPU | None:
        """The GPU the next run starts on, given how many run on each (`busy`, by id): of
        those with a free seat, the one that runs fewest (the first of those); None when
        every seat is taken."""
        free = [g for g in self.gpus if busy.get(g.id, 0) < g.seats]
        return min(free, key=lambda g: busy.get(g.id, 0), default=None)

    def settings(self, cfg: RunConfig, gpu: GPU) -> RunConfig:
        """A new run's config for a seat on `gpu` (shared_gpu); a resumed run keeps its own."""
        return cfg if self.shape is None else shared_gpu(cfg, self.shape, gpu.seats, gpu.free_gib,
                                                         shrink=gpu.seats == 1)

    def place(self, cfg: RunConfig, running: Sequence[tuple[str | None, RunConfig]], *,
              resumed: bool = False) -> tuple[GPU, RunConfig] | None:
        """Where a waiting run starts now, and its config there: of the GPUs with a free seat
        (`running`: (GPU id, config) of each run that runs), the one that runs fewest where
        its planned memory fits beside theirs (the free memory read at the plan; a GPU whose
        free memory is unknown takes it by seats alone). None when none has room yet. A
        fresh run gets the GPU's settings (settings); a `resumed` one keeps its config."""
        count = Counter(g for g, _ in running)
        for gpu in sorted((g for g in self.gpus if count[g.id] < g.seats), key=lambda g: count[g.id]):
            mine = cfg if resumed else self.settings(cfg, gpu)
            if self.shape is None or gpu.free_gib is None:
                return gpu, mine
            beside = sum(memory.run_memory(c, self.shape).total for g, c in running if g == gpu.id)
            if beside + memory.run_memory(mine, self.shape).total <= gpu.free_gib * memory.HEADROOM:
                return gpu, mine
        return None


def longest_first(cfgs: Sequence[RunConfig]) -> list[int]:
    """The order in which waiting runs take seats: the most answer tokens a run can write
    first (steps x prompts x answers x the longest answer), ties in the sweep's order. On one
    H200 the 16-answer run of lesson 1.3's sweep took 14.2 s a step to the 4-answer run's
    7.5: started last, a large run would finish long after the rest."""
    def work(c: RunConfig) -> int:
        return c.num_rollout * c.rollout_batch_size * c.n_samples_per_prompt * c.rollout_max_response_len

    return sorted(range(len(cfgs)), key=lambda k: -work(cfgs[k]))


def anywhere(runs: int) -> Plan:
    """Every run at once, with no device chosen and no settings changed (runs on a CPU)."""
    return Plan((GPU(None, runs),))


def plan(fresh: Sequence[RunConfig], resumed: Sequence[RunConfig],
         wanted: list[str] | None = None) -> Plan:
    """Where the runs go: `fresh` runs get a shared GPU's settings, `resumed` ones keep the
    config their folder holds; `wanted`: the GPUs to use (`requested`), None for any. Says
    the plan (a line per GPU) and refuses, in one line, what cannot start."""
    from labkit.models import resolve_model

    ids = gpu_ids(wanted)
    runs = len(fresh) + len(resumed)
    if len(ids) == 1:
        return _one_gpu(ids[0], fresh, resumed, runs)
    shape = memory.ModelShape.of(resolve_model((list(fresh) or list(resumed))[0].model))
    free = [memory.gpu_free_gib(i) for i in ids]
    if None in free:
        unread = ", ".join(i for i, f in zip(ids, free) if f is None)
        print(f"labkit: the free memory of GPU {unread} could not be read; the runs are shared "
              f"out over GPUs {', '.join(ids)} without the check", file=sys.stderr, flush=True)
        return Plan(tuple(GPU(i, math.ceil(runs / len(ids))) for i in ids), shape)
    holds = [_holds(fresh, resumed, shape, f, runs) for f in free]
    if not any(holds) or _largest(fresh, resumed, shape, 1, max(free)).total > max(free) * memory.HEADROOM:
        raise memory.GPUMemoryError(_none_holds_one(fresh, resumed, shape, ids, free))
    for i, f, n in zip(ids, free, holds):
        if n == 0:
            need = _largest(fresh, resumed, shape, 1, f)
            print(f"labkit: GPU {i} is skipped: {f:.1f} GiB free, and one run needs "
                  f"{need.total:.1f} GiB", file=sys.stderr, flush=True)
    seats = share_out(runs, holds)
    chosen = tuple(GPU(i, n, f) for i, n, f in zip(ids, seats, free) if n > 0)
    for line in _describe(chosen, fresh, resumed, shape, runs):
        print(f"labkit: {line}", flush=True)
    return Plan(chosen, shape)


def _one_gpu(gpu_id: str | None, fresh: Sequence[RunConfig], resumed: Sequence[RunConfig],
             runs: int) -> Plan:
    """The runs on one GPU: as many at once as fit in its free memory with a shared GPU's
    settings (_holds), the others waiting for a place; none fitting is refused in one line.
    With no fresh run there is nothing to size and no check."""
    from labkit.models import resolve_model

    if not fresh:
        return Plan((GPU(gpu_id, runs),))
    shape = memory.ModelShape.of(resolve_model(fresh[0].model))  # a GGUF is dequantized once
    free = memory.gpu_free_gib(0 if gpu_id is None else gpu_id)
    if free is None:
        print("labkit: the GPU's free memory could not be read; starting without the check",
              file=sys.stderr, flush=True)
        return Plan((GPU(gpu_id, runs, free),), shape)
    seats = _holds(fresh, resumed, shape, free, runs)
    need = _largest(fresh, resumed, shape, 1, free)
    if seats == 0 or need.total > free * memory.HEADROOM:
        raise memory.GPUMemoryError(
            f"one run needs {need.describe()}, and the GPU has {free:.1f} GiB free "
            f"({memory.HEADROOM:.0%} usable); free the GPU, or lower --max-tokens-per-gpu or "
            f"--rollout-kv-cache-gb; nothing was started")
    gpu = GPU(gpu_id, seats, free)
    print(f"labkit: {_describe_one(gpu, fresh, resumed, shape, runs)}", flush=True)
    return Plan((gpu,), shape)


def _describe_one(gpu: GPU, fresh, resumed, shape, runs: int) -> str:
    """One GPU's plan in one line: how many at once and wait, the shared settings, and what
    each size of run is planned to hold (its KV cache by need)."""
    cfgs = _configs(fresh, resumed, shape, gpu.seats, gpu.free_gib)
    sizes = {}
    for c in cfgs:
        sizes.setdefault(f"{c.rollout_batch_size} x {c.n_samples_per_prompt}", (c, memory.run_memory(c, shape)))
    if len(sizes) == 1:
        (c, need), = sizes.values()
        line = memory.describe_plan(c, need, min(gpu.seats, runs), gpu.free_gib)
    else:
        c = cfgs[0]
        batches = (f"{c.max_tokens_per_gpu:,} tokens a micro-batch" if c.use_dynamic_batch_size
                   else f"{c.micro_batch_size} samples a micro-batch")
        ckpt = "with" if c.gradient_checkpointing else "without"
        each = ", ".join(f"{k} {m.total:.1f} GiB (KV cache {c.rollout_kv_cache_gb:g})"
                         for k, (c, m) in sizes.items())
        line = (f"{min(gpu.seats, runs)} runs share the GPU ({gpu.free_gib:.0f} GiB free): each "
                f"{ckpt} gradient checkpointing, {batches}; planned a run: {each}")
    if runs > gpu.seats:
        line += (f"; {runs} runs: at most {gpu.seats} at once, the others wait for a place "
                 f"(the longest first)")
    return line


def _holds(fresh, resumed, shape, free_gib: float, most: int) -> int:
    """How many of the sweep's runs a GPU with `free_gib` free holds at once: the largest n
    (up to `most`) for which the n smallest runs, with the settings for n, fit together and
    keep their token budget per micro-batch; else 1 where one fits with a smaller one. Runs
    of one size are n of that run; of several sizes, which n run at once is decided as they
    start (Plan.place). Runs can wait here, so a smaller budget is no price worth paying for
    one more at once: on an H200 four runs with micro-batches cut to fit did 0.99x the steps
    of one alone, checkpointed at the default budget 1.91x (labkit.machine.memory.share_gpu)."""
    def fit(n: int, smaller_budget: bool) -> bool:
        shared = [(shared_gpu(c, shape, n, free_gib, shrink=smaller_budget), c) for c in fresh]
        needs = sorted(memory.run_memory(c, shape).total for c in [*(s for s, _ in shared), *resumed])
        return (sum(needs[:n]) <= free_gib * memory.HEADROOM
                and (smaller_budget or all(s.max_tokens_per_gpu >= c.max_tokens_per_gpu
                                           for s, c in shared)))

    n = 0
    while n < most and fit(n + 1, smaller_budget=False):
        n += 1
    return n or int(fit(1, smaller_budget=True))


def _configs(fresh, resumed, shape, runs: int, free_gib: float | None) -> list[RunConfig]:
    return [*(shared_gpu(c, shape, runs, free_gib, shrink=runs == 1) for c in fresh), *resumed]


def _largest(fresh, resumed, shape, runs: int, free_gib: float) -> memory.RunMemory:
    return max((memory.run_memory(c, shape) for c in _configs(fresh, resumed, shape, runs, free_gib)),
               key=lambda m: m.total)


def share_out(runs: int, holds: Sequence[int]) -> list[int]:
    """How many of `runs` each GPU takes at once: one at a time to the GPU with the fewest so
    far (the first of those), none beyond what it holds. share_out(6, [2, 2]) == [2, 2];
    share_out(4, [4, 4]) == [2, 2]; share_out(4, [1, 4]) == [1, 3]."""
    seats = [0] * len(holds)
    for _ in range(runs):
        open_ = [k for k in range(len(holds)) if seats[k] < holds[k]]
        if not open_:
            break
        seats[min(open_, key=lambda k: seats[k])] += 1
    return seats


def _none_holds_one(fresh, resumed, shape, ids, free) -> str:
    best = max(range(len(ids)), key=lambda k: free[k])
    need = _largest(fresh, resumed, shape, 1, free[best])
    return (f"no GPU can hold one run: one needs {need.describe()}, and the most free is "
            f"{free[best]:.1f} GiB (GPU {ids[best]}; {memory.HEADROOM:.0%} usable); free a GPU, or "
            f"lower --max-tokens-per-gpu or --rollout-kv-cache-gb; nothing was started")


def _describe(chosen: Sequence[GPU], fresh, resumed, shape, runs: int) -> list[str]:
    """The plan in lines: how many start at once and wait, then each GPU's share (GPUs whose
    share reads the same are one line)."""
    at_once = sum(g.seats for g in chosen)
    waiting = f", {runs - at_once} wait for a place" if runs > at_once else ""
    lines = {}
    for g in chosen:
        cfg = _configs(fresh, resumed, shape, g.seats, g.free_gib)[0]
        lines.setdefault(memory.describe_plan(cfg, memory.run_memory(cfg, shape), g.seats,
                                              g.free_gib), []).append(g.id)
    on = f"GPU{'s' if len(chosen) > 1 else ''} {', '.join(g.id for g in chosen)}"
    head = f"{runs} runs on {on}: {at_once} at once{waiting}"
    return [head, *(f"GPU{'s' if len(ids) > 1 else ''} {', '.join(ids)}"
                    f"{' (each)' if len(ids) > 1 else ''}: {line}" for line, ids in lines.items())]


# ----------------------------------------------------------------------------- the GPUs
def parse_gpus(value, given_as: str) -> list[str] | None:
    """GPU ids from `value`: "0,1", or a list of numbers (or of ids as CUDA_VISIBLE_DEVICES
    takes them); None for None. A ConfigError, starting with `given_as`, for an empty or
    repeated one."""
    if value is None:
        return None
    items = value.split(",") if isinstance(value, str) else list(value)
    ids = [str(v).strip() for v in items]
    shown = value if isinstance(value, str) else ",".join(ids)
    if not ids or "" in ids or any(i.startswith("-") for i in ids):
        raise ConfigError(f"{given_as} {shown!r}: list GPU numbers (as nvidia-smi numbers them) "
                          f"between commas, e.g. 0,1")
    for i in ids:  # a number, or a GPU's UUID as CUDA_VISIBLE_DEVICES takes it (GPU-..., MIG-...)
        if not (i.isdigit() or i.startswith(("GPU-", "MIG-"))):
            raise ConfigError(f"{given_as} {shown!r}: {i!r} is not a GPU; list GPU numbers (as "
                              f"nvidia-smi numbers them) between commas, e.g. 0,1")
    for k, i in enumerate(ids):
        if i in ids[:k]:
            raise ConfigError(f"{given_as} {shown}: GPU {i} is listed twice; list each GPU once")
    return ids


def requested(gpus=None) -> list[str] | None:
    """The GPUs asked for: `gpus` (parse_gpus), else env LABKIT_GPUS, else None (any)."""
    if gpus is not None:
        return parse_gpus(gpus, "gpus")
    return parse_gpus(os.environ.get(ENV) or None, ENV)


def gpu_ids(wanted: list[str] | None) -> list[str | None]:
    """The GPUs the runs may use, as CUDA_VISIBLE_DEVICES names them: `wanted` (a number the
    driver does not count is a ConfigError), else CUDA_VISIBLE_DEVICES's list, else each GPU
    the driver counts; [None] (the GPU the runs see, unnamed) when the driver does not say."""
    count = memory.gpu_count()
    if wanted:
        missing = [i for i in wanted if count is not None and i.isdigit() and int(i) >= count]
        if missing:
            raise ConfigError(f"GPU {missing[0]} is not on this machine (its GPUs are 0-{count - 1}, "
                              f"as nvidia-smi numbers them); nothing was started")
        return list(wanted)
    visible = [i.strip() for i in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if i.strip()]
    if visible:
        return visible
    return [str(i) for i in range(count)] if count else [None]


def device_env(gpu: str | None) -> dict:
    """The environment a run's process gets so that it sees only `gpu` (nothing for None).
    CUDA numbers GPUs fastest first unless told otherwise; the driver (nvidia-smi, NVML) by
    bus: PCI_BUS_ID makes the two agree, unless the user chose an order."""
    if gpu is None:
        return {}
    return {"CUDA_VISIBLE_DEVICES": gpu,
            "CUDA_DEVICE_ORDER": os.environ.get("CUDA_DEVICE_ORDER", "PCI_BUS_ID")}


# ----------------------------------------------------------------------------- one run's settings
def shared_gpu(cfg: RunConfig, shape, runs: int, free: float | None, *,
               shrink: bool = True) -> RunConfig:
    """A run's settings for a GPU it shares with `runs` runs: a fixed KV cache (what its
    rollout needs), no sleep mode (vLLM's memory checks measure the whole GPU), no progress
    bar of its own, and what lets `runs` such runs fit: gradient checkpointing (where auto),
    else, with `shrink`, a smaller token budget per micro-batch (where the config kept the
    default budget): labkit.machine.memory.share_gpu. A sweep's plan shrinks for a run alone
    only; others wait for a place instead."""
    # vLLM still checks at start that the free memory covers its fraction of the whole GPU
    # (with a fixed KV cache the fraction sizes nothing else): keep it within one share.
    changes = dict(rollout_sleep=False, progress=False,
                   rollout_gpu_memory_fraction=min(cfg.rollout_gpu_memory_fraction, 0.5 / runs))
    if cfg.rollout_kv_cache_gb is None:  # what its rollout needs (labkit.machine.memory)
        changes["rollout_kv_cache_gb"] = memory.kv_cache_gib(cfg, shape) if shape else memory.DEFAULT_KV_CACHE_GIB
    cfg = cfg.replace(**changes)
    return memory.share_gpu(cfg, shape, runs, free, default_tokens=RunConfig().max_tokens_per_gpu,
                            shrink=shrink)
