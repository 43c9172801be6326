"""labkit.cpuload: a busy CPU is said, and torch computes on one thread while it lasts."""

from __future__ import annotations

import pytest
import torch

from labkit import cpuload


@pytest.fixture()
def two_threads(monkeypatch):
    """torch on two threads, as by default on a 2-core machine (the tests run on one)."""
    monkeypatch.setattr(cpuload, "_torch_default", None)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def test_a_busy_machine_gets_one_thread_and_a_calm_one_gets_them_back(two_threads):
    line = cpuload.fit_threads(load=6.4, cores=2, env={})
    assert line.startswith("labkit: this machine is busy: load 6.4 on 2 cores; torch computes on "
                           "1 thread instead of 2")
    assert "OMP_NUM_THREADS=2 keeps 2" in line
    assert torch.get_num_threads() == 1
    again = cpuload.fit_threads(load=7.0, cores=2, env={})  # still busy: one thread, said
    assert again.startswith("labkit: this machine is busy: load 7.0 on 2 cores, so other programs")
    assert torch.get_num_threads() == 1
    assert cpuload.fit_threads(load=1.2, cores=2, env={}) is None  # the next run, on a calm machine
    assert torch.get_num_threads() == 2


def test_omp_num_threads_is_the_users_choice(two_threads):
    line = cpuload.fit_threads(load=6.4, cores=2, env={"OMP_NUM_THREADS": "2"})
    assert line == ("labkit: this machine is busy: load 6.4 on 2 cores, so other programs share "
                    "the CPU and each step may take several times as long as on an idle machine")
    assert torch.get_num_threads() == 2


def test_a_calm_machine_is_not_mentioned(two_threads):
    assert cpuload.fit_threads(load=2.0, cores=2, env={}) is None
    assert torch.get_num_threads() == 2
    assert cpuload.cpu_cores() >= 1
