"""The CPU's load: said at the start of a run, and torch kept to one thread while other work
keeps the cores busy.

Why: on a 2-core machine where other programs held the load average at 6 to 8, SmolLM2-135M
wrote 8 greedy answers of 32 tokens in 125-130 s with torch's default two threads, and in
9-13 s with one (BENCHMARKS.md, "A busy CPU"). torch's threads meet at the end of each
operation, and when the scheduler has taken one of them off its core, the other waits for
it; a step has thousands of such meetings. One thread waits for no other. On such a machine
a lesson's 4-answer step took 12-13 minutes instead of 20-32 s.

`fit_threads()` decides at the start of each run on a CPU: as many threads as the cores
that other work leaves free (the cores minus those other programs keep busy, measured over
half a second at the start, at least one, at most torch's own count), so torch's own count
again on a calm machine. At load 2.6-3.2 on the same machine two threads took 24-27 s and
one 6.1-6.2 s: one busy core is enough to make a second thread cost. `OMP_NUM_THREADS` in
the environment is the user's choice and is left alone.
"""

from __future__ import annotations

import os
import time

import torch

_torch_default: int | None = None  # torch's count before labkit first lowered it


def cpu_cores() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def current_load(window_s: float = 0.5) -> float | None:
    """How many cores other programs keep busy now: the machine's busy CPU time over a short
    window (Linux's /proc/stat), else the last minute's load average; None where there is
    neither (Windows). The average lags: right after a long install it still says a core is
    taken that is free again."""
    try:
        average = os.getloadavg()[0]
    except (AttributeError, OSError):
        average = None
    busy = busy_cores(window_s)
    if busy is None:
        return average
    if average is not None and busy > (os.cpu_count() or 1) - 0.5:
        return max(busy, average)  # every core taken: the average says how many more wait
    return busy


def busy_cores(window_s: float = 0.5, read=None) -> float | None:
    """Cores busy over the next `window_s` seconds, from two readings of /proc/stat's first
    line (`read()` returns it; for tests). This process sleeps meanwhile, so what is busy is
    other work. None where /proc/stat cannot be read."""
    read = read or _proc_stat_line
    try:
        first = _cpu_times(read())
        time.sleep(window_s)
        second = _cpu_times(read())
    except (OSError, ValueError, IndexError):
        return None
    busy, total = second[0] - first[0], second[1] - first[1]
    if total <= 0:
        return None
    return busy / total * (os.cpu_count() or 1)


def _proc_stat_line() -> str:
    with open("/proc/stat") as f:
        return f.readline()


def _cpu_times(line: str) -> tuple[int, int]:
    """(busy, total) jiffies of the aggregate `cpu` line: idle and iowait are not busy."""
    fields = line.split()
    if fields[0] != "cpu":
        raise ValueError(line)
    ticks = [int(x) for x in fields[1:9]]  # user nice system idle iowait irq softirq steal
    idle = ticks[3] + ticks[4]
    return sum(ticks) - idle, sum(ticks)


def fit_threads(load: float | None = None, cores: int | None = None,
                env: dict | None = None) -> str | None:
    """Set torch's threads for a run on the CPU to the cores other work leaves free (`cores`
    minus the `load` of current_load(), at least one, at most torch's own count). Returns the
    line to say when that lowers them, or when the machine is busier than its cores; else None."""
    global _torch_default
    env = os.environ if env is None else env
    load = current_load() if load is None else load
    cores = cores or cpu_cores()
    if load is None:
        return None
    own = _torch_default or torch.get_num_threads()
    fit = own if "OMP_NUM_THREADS" in env else max(1, min(own, int(cores - load + 0.5)))
    where = f"load {load:.1f} on {cores} core{'s' if cores != 1 else ''}"
    if fit < torch.get_num_threads():
        _torch_default = own
        torch.set_num_threads(fit)
        return (f"labkit: other programs share this CPU ({where}): torch computes on {fit} "
                f"thread{'s' if fit != 1 else ''} instead of {own}, several times faster while "
                f"they do (OMP_NUM_THREADS={own} keeps {own})"
                + ("; steps may still take longer than on an idle machine" if load > cores else ""))
    if fit > torch.get_num_threads() and _torch_default is not None:
        torch.set_num_threads(fit)  # calmer than at the last run of this process
        if fit == _torch_default:
            _torch_default = None
    if load > cores:
        return (f"labkit: this machine is busy ({where}): other programs share the CPU, and each "
                f"step may take several times as long as on an idle machine")
    return None
