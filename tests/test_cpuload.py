"""labkit.machine.cpuload: torch computes on the cores other work leaves free, and a busy CPU is said."""

from __future__ import annotations

import pytest
import torch

from labkit.machine import cpuload


@pytest.fixture()
def threads(monkeypatch):
    """Set torch's own count for a test (the tests otherwise run on one thread)."""
    monkeypatch.setattr(cpuload, "_torch_default", None)
    before = torch.get_num_threads()
    yield torch.set_num_threads
    torch.set_num_threads(before)


def test_a_busy_machine_gets_one_thread_and_a_calm_one_gets_them_back(threads):
    threads(2)
    line = cpuload.fit_threads(load=6.4, cores=2, env={})
    assert line == ("labkit: other programs share this CPU (load 6.4 on 2 cores): torch computes "
                    "on 1 thread instead of 2, several times faster while they do "
                    "(OMP_NUM_THREADS=2 keeps 2); steps may still take longer than on an idle "
                    "machine")
    assert torch.get_num_threads() == 1
    again = cpuload.fit_threads(load=7.0, cores=2, env={})  # still busy: one thread, said
    assert again.startswith("labkit: this machine is busy (load 7.0 on 2 cores)")
    assert torch.get_num_threads() == 1
    assert cpuload.fit_threads(load=0.2, cores=2, env={}) is None  # the next run, on a calm machine
    assert torch.get_num_threads() == 2


def test_one_busy_core_is_enough_to_take_a_thread_off(threads):
    threads(2)
    line = cpuload.fit_threads(load=1.2, cores=2, env={})
    assert "torch computes on 1 thread instead of 2" in line and "idle machine" not in line
    threads(16)
    cpuload._torch_default = None
    assert "on 12 threads instead of 16" in cpuload.fit_threads(load=4.0, cores=16, env={})
    assert cpuload.fit_threads(load=1.0, cores=16, env={}) is None  # calmer: 15 of the 16
    assert torch.get_num_threads() == 15


def test_omp_num_threads_is_the_users_choice(threads):
    threads(2)
    line = cpuload.fit_threads(load=6.4, cores=2, env={"OMP_NUM_THREADS": "2"})
    assert line == ("labkit: this machine is busy (load 6.4 on 2 cores): other programs share "
                    "the CPU, and each step may take several times as long as on an idle machine")
    assert torch.get_num_threads() == 2
    assert cpuload.fit_threads(load=1.2, cores=2, env={"OMP_NUM_THREADS": "2"}) is None


def test_a_calm_machine_is_not_mentioned(threads):
    threads(2)
    assert cpuload.fit_threads(load=0.4, cores=2, env={}) is None
    assert torch.get_num_threads() == 2
    assert cpuload.cpu_cores() >= 1


def test_the_load_is_what_other_work_keeps_busy_now_not_the_last_minutes_average():
    """Two readings of /proc/stat's cpu line: the busy share of the window, in cores (an
    install that just ended still holds the minute's average near 1, but no core)."""
    import os

    lines = iter(["cpu  100 0 50 800 50 0 0 0 0 0\n",  # busy 150 of 1000
                  "cpu  150 0 75 1500 75 0 0 0 0 0\n"])  # +75 busy of +800
    busy = cpuload.busy_cores(0, read=lambda: next(lines))
    assert busy == pytest.approx(75 / 800 * (os.cpu_count() or 1))
    assert cpuload.busy_cores(0, read=lambda: "intr 1 2 3\n") is None  # not the cpu line
    assert cpuload.busy_cores(0, read=lambda: (_ for _ in ()).throw(OSError("no /proc"))) is None
    assert cpuload.current_load(0.05) is not None  # this machine answers one way or the other
