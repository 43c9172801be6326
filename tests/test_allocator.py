"""A CPU run keeps freed memory for reuse (glibc's malloc), gives it back when it ends, and
trains the same either way."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from waiting import DEADLINE_S

from labkit.machine import allocator
from labkit.trainer import train

GLIBC = sys.platform.startswith("linux") and allocator._glibc() is not None


@pytest.mark.skipif(not GLIBC, reason="glibc's malloc only")
def test_on_glibc_it_takes_and_again_changes_nothing():
    assert allocator.keep_freed_memory() is True
    assert allocator.keep_freed_memory() is True
    assert allocator.give_back() is True


def test_without_glibc_nothing_is_called_and_it_says_so(monkeypatch):
    monkeypatch.setattr(allocator, "_libc", None)
    monkeypatch.setattr(allocator, "_kept", False)
    monkeypatch.setattr(allocator.sys, "platform", "darwin")
    assert allocator.keep_freed_memory() is False
    assert allocator.give_back() is False
    assert allocator._libc is False  # looked for once, not found


def test_a_cpu_run_keeps_freed_memory_from_its_start_and_gives_it_back_when_it_ends(
        tiny_cfg, monkeypatch):
    import labkit.session as session

    calls = []
    monkeypatch.setattr(session, "keep_freed_memory", lambda: calls.append("keep") or True)
    monkeypatch.setattr(allocator, "give_back", lambda: calls.append("give back") or True)
    run = train(tiny_cfg)
    assert run.status["reason"] == "completed"
    assert calls == ["keep", "give back"]


# A tiny run in a fresh process, with malloc told to keep freed memory or left as it is.
RUN = """
import json, sys
import labkit.session
from labkit.config import RunConfig
from labkit.trainer import train
if sys.argv[2] == "default":
    labkit.session.keep_freed_memory = lambda: False
run = train(RunConfig(**json.loads(sys.argv[1])))
print(json.dumps(run.metrics[["rollout/raw_reward", "train/loss", "train/grad_norm"]].values.tolist()))
"""


@pytest.mark.skipif(not GLIBC, reason="glibc's malloc only")
def test_memory_kept_for_reuse_trains_exactly_as_the_default(tiny_cfg, tmp_path):
    """Reused memory holds what the last step left in it: a buffer read before it is written
    would show here as a run that differs from one with fresh pages."""
    got = {}
    for how in ("kept", "default"):
        cfg = tiny_cfg.replace(run_name=how, num_rollout=3)
        out = subprocess.run([sys.executable, "-c", RUN, json.dumps(cfg.to_dict()), how],
                             capture_output=True, text=True, timeout=DEADLINE_S,
                             cwd=tmp_path, env={**os.environ,
                                                "PYTHONPATH": str(Path(__file__).parents[1])})
        assert out.returncode == 0, out.stderr[-3000:]
        got[how] = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["kept"] == got["default"]
    assert len(got["kept"]) == 3

