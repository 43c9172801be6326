"""The policy and the engine that stay up between runs in one Python process (a notebook kernel).

A lesson reruns one cell with another group size, again and again. Starting vLLM takes
about a minute on an H200 (loading, compiling, capturing CUDA graphs) and loading the
policy a few seconds more, while the run itself may take three. So a run keeps what it
loaded, and the next run in the same process with the same model and engine settings
takes it back instead of starting afresh:

* the policy's weights are reset to the starting model's (a copy kept on the CPU), so
  the new run starts where a fresh load would;
* the engine is handed those weights (which also clears its prefix cache: its entries
  were computed with the old weights), so its first rollout samples from the start model;
* the optimizer, the data order and the run folder are new, as in any run.

A run with another model or other engine settings closes what is kept first: vLLM allows
one sleep-mode engine per process. `labkit.close()` releases everything.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from labkit.engines.base import Engine


@dataclass
class Kept:
    """What one process keeps: the policy (with its starting weights) and maybe an engine."""

    policy_key: Hashable
    policy: torch.nn.Module
    start: dict[str, torch.Tensor]  # the starting weights, on the CPU
    engine_key: Hashable | None = None
    engine: Engine | None = None
    evaluations: dict = field(default_factory=dict)  # the starting model's results, by key


_kept: Kept | None = None


def take_policy(key: Hashable, load: Callable[[], torch.nn.Module]) -> tuple[torch.nn.Module, bool]:
    """The policy for `key`: the kept one reset to its starting weights, or `load()` kept
    from now on. Returns (policy, reused)."""
    global _kept
    if _kept is not None and _kept.policy_key == key:
        with torch.no_grad():
            for name, p in _kept.policy.named_parameters():
                p.copy_(_kept.start[name], non_blocking=True)
                p.grad = None
        return _kept.policy, True
    close()  # another model: what was kept goes first
    policy = load()
    start = {name: p.detach().to("cpu", copy=True) for name, p in policy.named_parameters()}
    _kept = Kept(key, policy, start)
    return policy, False


def take_engine(key: Hashable, build: Callable[[], Engine]) -> tuple[Engine, bool]:
    """The engine for `key`, given the kept policy (take_policy first): the kept engine,
    handed the policy's current (starting) weights, or `build()` kept from now on.
    Returns (engine, reused)."""
    if _kept is None:
        raise RuntimeError("take_policy comes before take_engine")
    if _kept.engine is not None and _kept.engine_key == key:
        _kept.engine.update_weights(_kept.policy)
        return _kept.engine, True
    drop_engine()
    _kept.engine, _kept.engine_key = build(), key
    return _kept.engine, False


def starting_result(key: Hashable, compute: Callable[[], dict]) -> tuple[dict, bool]:
    """A result about the kept policy's starting weights (an evaluation before training),
    computed once per key while the policy is kept. Returns (result, reused)."""
    if _kept is None:
        return compute(), False
    if key in _kept.evaluations:
        return _kept.evaluations[key], True
    result = _kept.evaluations[key] = compute()
    return result, False


def has_result(key: Hashable) -> bool:
    """Whether starting_result has the result under `key` already (the kept policy's)."""
    return _kept is not None and key in _kept.evaluations


def is_kept(engine: Engine) -> bool:
    """Whether `engine` is the kept one (a run must not close it)."""
    return _kept is not None and _kept.engine is engine


def drop_engine() -> None:
    """Close the kept engine (if any); the policy stays."""
    if _kept is not None and _kept.engine is not None:
        engine, _kept.engine, _kept.engine_key = _kept.engine, None, None
        engine.close()


def close() -> bool:
    """Release what this process keeps: the engine (closed) and the policy, and hand the freed
    memory back to the system (without that, a CPU run's 4.6 GB stayed at 3.9 GB after the
    policy went; with it, 0.4 GB). Returns whether anything was kept; with nothing kept
    there is nothing to collect (the tests call it after each one)."""
    global _kept
    if _kept is None:
        return False
    drop_engine()
    _kept = None
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    _trim_heap()
    return True


def _trim_heap() -> None:
    """Return the C heap's free pages to the system (glibc's malloc_trim); elsewhere nothing."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
        if libc is not None and hasattr(libc, "malloc_trim"):
            libc.malloc_trim(0)
    except OSError:  # no C library to load: nothing to trim
        pass


def memory_in_use_gb() -> float | None:
    """This process's resident memory in GB (Linux: /proc/self/status), None where unknown."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 2**20  # kB
    except (OSError, ValueError, IndexError):
        pass
    return None
