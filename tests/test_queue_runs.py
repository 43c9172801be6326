"""The GPU runner's run queue (scripts/gpu/queue_runs.py): flags for how runs share a GPU
reach every run's config, on top of the plan's own, and each run is claimed once."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import SimpleNamespace

import labkit
from labkit.machine.memory import ModelShape

ROOT = Path(__file__).resolve().parents[1]
QWEN05 = ModelShape(params=494_032_768, vocab=151_936, layers=24, hidden=896)  # the recipe's model


def _queue_module(monkeypatch):
    # the script puts the checkout and its own folder on sys.path and imports plans.py:
    # both are undone after the test
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.delitem(sys.modules, "plans", raising=False)
    spec = importlib.util.spec_from_file_location("queue_runs", ROOT / "scripts" / "gpu" / "queue_runs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run(tmp_path, monkeypatch, extra: str, share: int = 0):
    queue = _queue_module(monkeypatch)
    monkeypatch.setattr(queue, "model_shape", lambda model: QWEN05)  # no model file to read
    seen = []

    def fake_launch(cfg):
        seen.append(cfg)
        return SimpleNamespace(status={"reason": "completed"})

    monkeypatch.setattr(labkit, "launch", fake_launch)
    args = SimpleNamespace(plan="smoke-cpu", model="m.gguf", data="gsm8k", runs_dir=str(tmp_path),
                           name="q1", extra=extra, share=share)
    assert queue.run_queue(args) == 0
    return seen


def test_extra_flags_reach_every_run_and_keep_the_plans_own(tmp_path, monkeypatch):
    seen = _run(tmp_path, monkeypatch, "--gradient-checkpointing --max-tokens-per-gpu 24576")
    assert [c.run_name for c in seen] == ["smoke-n2", "smoke-n4", "smoke-overlap"]
    assert all(c.gradient_checkpointing and c.max_tokens_per_gpu == 24576 for c in seen)
    assert [c.n_samples_per_prompt for c in seen] == [2, 4, 2]
    assert [c.overlap_rollout for c in seen] == [False, False, True]
    assert sorted(p.name for p in (tmp_path / ".claims").iterdir()) == ["smoke-n2", "smoke-n4", "smoke-overlap"]


def test_without_extra_flags_a_run_is_the_plans_and_a_claimed_run_is_not_run_again(tmp_path, monkeypatch):
    first = _run(tmp_path, monkeypatch, "")
    assert len(first) == 3 and not any(c.gradient_checkpointing for c in first)
    assert _run(tmp_path, monkeypatch, "") == []  # every run is claimed: a second queue runs none


def test_a_shared_gpu_gives_each_run_what_labkit_sweep_gives_one_of_as_many(tmp_path, monkeypatch):
    seen = _run(tmp_path, monkeypatch, "", share=4)
    assert len(seen) == 3
    for c in seen:
        assert c.gradient_checkpointing is True and c.max_tokens_per_gpu == 2 * labkit.RunConfig().max_tokens_per_gpu
        assert c.rollout_kv_cache_gb is not None and c.rollout_sleep is False  # a fixed cache (the plan sizes it)
        assert c.rollout_gpu_memory_fraction <= 0.5 / 4
    assert [c.n_samples_per_prompt for c in seen] == [2, 4, 2]  # the plan's own flags stay
    kept = _run(tmp_path / "b", monkeypatch, "--max-tokens-per-gpu 8192", share=4)
    assert all(c.max_tokens_per_gpu == 8192 and c.gradient_checkpointing for c in kept)
