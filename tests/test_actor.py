"""The actor update: micro-batch splits and the one-pass old log-probs change speed, not the step."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from labkit.actor import compute_logprobs, make_optimizer, train_on_rollout
from labkit.packing import micro_batches, pack_rollout


def _rollout(seed: int = 0, samples: int = 8):
    """Made-up token ids: prompts of 3-9 tokens, answers of 1-15, one advantage each."""
    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(3, 90, (int(torch.randint(3, 10, (1,), generator=g)),), generator=g).tolist()
               for _ in range(samples)]
    answers = [torch.randint(3, 90, (int(torch.randint(1, 16, (1,), generator=g)),), generator=g).tolist()
               for _ in range(samples)]
    adv = torch.randn(samples, generator=g)
    return pack_rollout(prompts, answers, adv, [None] * samples, pad_id=0)


def _update(model_dir, cfg, *, separate_old: bool):
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    batch = _rollout()
    if separate_old:
        batch.old_logprobs = compute_logprobs(model, batch, micro_batch_size=3, temperature=1.0)
    stats = train_on_rollout(model, make_optimizer(model, cfg), batch, cfg,
                             generator=torch.Generator().manual_seed(1))
    return model, batch, stats


def _max_weight_diff(a, b) -> float:
    return max(float((p - q).detach().abs().max()) for p, q in zip(a.parameters(), b.parameters()))


def test_fixed_micro_batches_take_micro_batch_size_samples():
    batch = _rollout()
    parts = micro_batches(batch, torch.arange(8), max_samples=3)
    assert [len(p) for p in parts] == [3, 3, 2]
    assert torch.cat(parts).tolist() == list(range(8))


def test_dynamic_micro_batches_stay_within_the_token_budget():
    batch = _rollout(samples=32)
    length = batch.attention_mask.sum(1)  # prompt + answer: a row's width
    order = torch.argsort(length, descending=True)
    parts = micro_batches(batch, order, max_samples=1, max_tokens=60)
    assert torch.cat(parts).tolist() == order.tolist()  # every sample once, order kept
    assert len(parts) < 32  # max_samples is ignored: short answers share a pass
    for p in parts:
        assert len(p) == 1 or len(p) * int(length[p].max()) <= 60


def test_one_sample_longer_than_the_budget_goes_alone():
    batch = pack_rollout([[5] * 4, [6] * 4], [[7] * 30, [8] * 2], torch.zeros(2), [None, None], 0)
    parts = micro_batches(batch, torch.arange(2), max_samples=8, max_tokens=10)
    assert [p.tolist() for p in parts] == [[0], [1]]


def test_one_pass_old_logprobs_give_the_same_step_as_a_separate_pass(tiny_cfg, tiny_model_dir):
    cfg = tiny_cfg.replace(global_batch_size=8, micro_batch_size=3, use_dynamic_batch_size=False)
    fused, fused_batch, fused_stats = _update(tiny_model_dir, cfg, separate_old=False)
    apart, apart_batch, apart_stats = _update(tiny_model_dir, cfg, separate_old=True)
    before = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    assert _max_weight_diff(fused, before) > 1e-4  # the step moved the weights
    assert _max_weight_diff(fused, apart) < 1e-6  # ... and both ways moved them alike
    # the training pass stored the old log-probs the engine is compared with
    assert torch.allclose(fused_batch.old_logprobs, apart_batch.old_logprobs, atol=1e-5)
    assert fused_stats["train/pg_clipfrac"] == 0.0 and abs(fused_stats["train/ppo_kl"]) < 1e-7
    assert fused_stats["train/entropy"] == pytest.approx(apart_stats["train/entropy"], rel=1e-5)


def test_dynamic_and_fixed_micro_batches_give_the_same_step(tiny_cfg, tiny_model_dir):
    fixed, _, s1 = _update(tiny_model_dir, tiny_cfg.replace(micro_batch_size=1, use_dynamic_batch_size=False),
                           separate_old=False)
    dynamic, _, s2 = _update(tiny_model_dir, tiny_cfg.replace(use_dynamic_batch_size=True, max_tokens_per_gpu=40),
                             separate_old=False)
    assert s1["train/micro_batches"] == 8 and 1 < s2["train/micro_batches"] < 8
    assert _max_weight_diff(fixed, dynamic) < 1e-6
    assert s1["train/loss"] == pytest.approx(s2["train/loss"], rel=1e-5, abs=1e-7)


def test_several_steps_per_rollout_need_old_logprobs(tiny_cfg, tiny_model_dir):
    cfg = tiny_cfg.replace(global_batch_size=4)  # 8 samples: 2 optimizer steps
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    with pytest.raises(ValueError, match="several optimizer steps"):
        train_on_rollout(model, make_optimizer(model, cfg), _rollout(), cfg,
                         generator=torch.Generator().manual_seed(1))
