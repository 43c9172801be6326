"""The CPU's load: said at the start of a run, and torch kept to one thread while other work
keeps the cores busy.

Why: on a 2-core machine where other programs held the load average at 6 to 8, SmolLM2-135M
wrote 8 greedy answers of 32 tokens in 125-130 s with torch's default two threads, and in
9-13 s with one (BENCHMARKS.md, "A busy CPU"). torch's threads meet at the end of each
operation, and when the scheduler has taken one of them off its core, the other waits for
it; a step has thousands of such meetings. One thread waits for no other. On such a machine
a lesson's 4-answer step took 12-13 minutes instead of 20-32 s.

`fit_threads()` decides at the start of each run on a CPU: one thread while the last
minute's load average is above the cores this process may use, torch's own count again when
it is not. `OMP_NUM_THREADS` in the environment is the user's choice and is left alone.
"""

from __future__ import annotations

import os

import torch

_torch_default: int | None = None  # torch's count before labkit first lowered it


def cpu_cores() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def current_load() -> float | None:
    """The last minute's load average (None where there is none, as on Windows)."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None


def fit_threads(load: float | None = None, cores: int | None = None,
                env: dict | None = None) -> str | None:
    """Set torch's threads for a run on the CPU: one on a busy machine (`load` above `cores`),
    torch's own count on a calm one if labkit had lowered it. Returns the line that says the
    machine is busy (None when it is not)."""
    global _torch_default
    env = os.environ if env is None else env
    load = current_load() if load is None else load
    cores = cores or cpu_cores()
    if load is None or load <= cores:
        if _torch_default is not None and "OMP_NUM_THREADS" not in env:
            torch.set_num_threads(_torch_default)
            _torch_default = None
        return None
    line = f"labkit: this machine is busy: load {load:.1f} on {cores} core{'s' if cores != 1 else ''}"
    threads = torch.get_num_threads()
    if "OMP_NUM_THREADS" in env or threads == 1:
        return (f"{line}, so other programs share the CPU and each step may take several times "
                f"as long as on an idle machine")
    if _torch_default is None:
        _torch_default = threads
    torch.set_num_threads(1)
    return (f"{line}; torch computes on 1 thread instead of {threads}, which is several times "
            f"faster while other programs share the cores (OMP_NUM_THREADS={threads} keeps "
            f"{threads}); steps may still take longer than on an idle machine")
