"""A second run in one process takes back the policy and the vLLM engine the first one left up:
no new engine, the starting model's weights at its first rollout; other settings start afresh."""

from __future__ import annotations

import re

import pytest
import torch
from fixtures_engines import Served

import labkit
from labkit.engines import keep


def test_a_rerun_takes_the_engine_back_with_the_starting_weights(tiny_cfg, served, capsys):
    cfg = tiny_cfg.replace(engine="vllm", num_rollout=2)
    first = labkit.launch(cfg.replace(run_name="first"))
    (engine,) = served
    start = engine.events[0][1]  # the weights of the first rollout: the starting model
    trained = engine.events[-1][1]
    assert trained != start
    engine.events.clear()
    second = labkit.launch(cfg.replace(run_name="second", n_samples_per_prompt=2, global_batch_size=4))
    assert len(served) == 1, "the second run built another engine"
    assert engine.events[0] == ("update", start)  # handed the starting weights back...
    assert engine.events[1] == ("generate", start)  # ...before its first rollout
    assert second.metrics["perf/startup_reused"].iloc[0] == 2
    assert first.metrics["perf/startup_reused"].iloc[0] == 0
    assert "(kept)" in capsys.readouterr().out


def test_the_kept_policy_is_reset_to_the_start(tiny_cfg, served):
    from transformers import AutoModelForCausalLM

    cfg = tiny_cfg.replace(engine="vllm", num_rollout=1)
    labkit.launch(cfg.replace(run_name="a"))
    policy = keep._kept.policy
    fresh = AutoModelForCausalLM.from_pretrained(cfg.model).state_dict()
    assert any(not torch.equal(p.detach(), fresh[n]) for n, p in policy.named_parameters())
    keep.take_policy(keep._kept.policy_key, lambda: pytest.fail("loaded again"))
    assert all(torch.equal(p.detach(), fresh[n]) for n, p in policy.named_parameters())


def test_other_settings_or_close_start_afresh(tiny_cfg, served):
    cfg = tiny_cfg.replace(engine="vllm", num_rollout=1)
    labkit.launch(cfg.replace(run_name="a"))
    labkit.launch(cfg.replace(run_name="b", rollout_gpu_memory_fraction=0.3))  # another engine
    assert len(served) == 2
    labkit.close()
    assert keep._kept is None
    labkit.launch(cfg.replace(run_name="c", rollout_gpu_memory_fraction=0.3))
    assert len(served) == 3


def test_an_engine_that_failed_is_not_kept(tiny_cfg, served, monkeypatch):
    cfg = tiny_cfg.replace(engine="vllm", num_rollout=1)
    labkit.launch(cfg.replace(run_name="a"))
    monkeypatch.setattr(Served, "generate", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("boom")))
    with pytest.raises(RuntimeError, match="boom"):
        labkit.launch(cfg.replace(run_name="b"))
    assert keep._kept.engine is None  # dropped: the next run starts a new one


def test_close_says_what_it_released_and_the_memory_the_process_holds(tiny_cfg, capsys):
    labkit.launch(tiny_cfg.replace(num_rollout=1))
    assert keep._kept is not None
    capsys.readouterr()
    labkit.close()
    assert keep._kept is None
    line = capsys.readouterr().out
    assert re.fullmatch(r"labkit: released the kept model \(and engine\); this process holds "
                        r"\d+\.\d GB of memory \(was \d+\.\d GB\)\n", line), line
    labkit.close()
    assert capsys.readouterr().out.startswith("labkit: nothing was kept; this process holds")
