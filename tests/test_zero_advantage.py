"""Answers of advantage 0 take no pass in the update, and the step is the one that computing
them gives: the same weights, the same optimizer state, fewer passes."""

from __future__ import annotations

import torch
from transformers import AutoModelForCausalLM

from labkit.actor import compute_logprobs, make_optimizer, samples_that_train, train_on_rollout
from labkit.packing import pack_rollout


def _rollout(advantages, seed: int = 0, logprob_rows=()):
    """Made-up token ids, one sample per advantage; engine log-probs on `logprob_rows`."""
    g = torch.Generator().manual_seed(seed)
    n = len(advantages)
    prompts = [torch.randint(3, 90, (int(torch.randint(3, 10, (1,), generator=g)),), generator=g).tolist()
               for _ in range(n)]
    answers = [torch.randint(3, 90, (int(torch.randint(1, 16, (1,), generator=g)),), generator=g).tolist()
               for _ in range(n)]
    engine = [[-1.0] * len(a) if i in logprob_rows else None for i, a in enumerate(answers)]
    return pack_rollout(prompts, answers, torch.tensor(advantages, dtype=torch.float32), engine, pad_id=0)


# half the groups (of 2) got one reward everywhere
HALF = [0.7, -0.7, 0.0, 0.0, 1.1, -1.1, 0.0, 0.0]


def _train(model_dir, cfg, rollouts, separate_old: bool = False):
    """The tiny model after one update per rollout, one optimizer for all; each update's stats."""
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    optimizer = make_optimizer(model, cfg)
    stats = []
    for k, adv in enumerate(rollouts):
        batch = _rollout(adv, seed=k)
        if separate_old:
            batch.old_logprobs = compute_logprobs(model, batch, micro_batch_size=3, temperature=1.0,
                                                  only=samples_that_train(batch, cfg))
        stats.append(train_on_rollout(model, optimizer, batch, cfg,
                                      generator=torch.Generator().manual_seed(1)))
    return model, stats


def _max_weight_diff(a, b) -> float:
    return max(float((p - q).detach().abs().max()) for p, q in zip(a.parameters(), b.parameters()))


def test_answers_of_advantage_zero_take_no_pass_and_the_step_is_the_same(tiny_cfg, tiny_model_dir):
    cfg = tiny_cfg.replace(global_batch_size=8, micro_batch_size=2, use_dynamic_batch_size=False)
    skipped, s1 = _train(tiny_model_dir, cfg, [HALF])
    computed, s2 = _train(tiny_model_dir, cfg.replace(skip_zero_advantage=False), [HALF])
    before = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    assert _max_weight_diff(skipped, before) > 1e-4  # the step moved the weights
    assert _max_weight_diff(skipped, computed) < 1e-6  # ... as computing every answer does
    assert s1[0]["train/skipped_frac"] == 0.5 and s2[0]["train/skipped_frac"] == 0.0
    assert s1[0]["train/micro_batches"] == 2 and s2[0]["train/micro_batches"] == 4
    assert abs(s1[0]["train/loss"] - s2[0]["train/loss"]) < 1e-6  # the denominator counts them all


def test_a_global_batch_all_of_advantage_zero_still_steps(tiny_cfg, tiny_model_dir):
    """No pass at all, and AdamW's momentum and weight decay move the weights as a pass of zero
    gradients would."""
    cfg = tiny_cfg.replace(global_batch_size=8, micro_batch_size=4, use_dynamic_batch_size=False)
    rollouts = [HALF, [0.0] * 8]
    skipped, s1 = _train(tiny_model_dir, cfg, rollouts)
    computed, _ = _train(tiny_model_dir, cfg.replace(skip_zero_advantage=False), rollouts)
    after_one, _ = _train(tiny_model_dir, cfg, rollouts[:1])
    assert s1[1]["train/micro_batches"] == 0 and s1[1]["train/skipped_frac"] == 1.0
    assert _max_weight_diff(skipped, after_one) > 1e-5  # the second step moved the weights ...
    assert _max_weight_diff(skipped, computed) < 1e-6  # ... as computing its answers does


def test_several_steps_per_rollout_skip_them_in_the_old_pass_too(tiny_cfg, tiny_model_dir):
    cfg = tiny_cfg.replace(global_batch_size=4, micro_batch_size=2, use_dynamic_batch_size=False)
    skipped, s1 = _train(tiny_model_dir, cfg, [HALF], separate_old=True)
    computed, _ = _train(tiny_model_dir, cfg.replace(skip_zero_advantage=False), [HALF], separate_old=True)
    assert s1[0]["train/steps"] == 2
    # the weights move ~2e-3; the second step's Adam ratio spreads float rounding to ~1e-6
    # (every answer computed in passes of 1 instead of 2 differs by ~7e-6 here)
    assert _max_weight_diff(skipped, computed) < 1e-5


def test_what_keeps_every_answer_in_the_update(tiny_cfg):
    batch = _rollout(HALF, logprob_rows=(2,))
    keep = samples_that_train(batch, tiny_cfg)
    # advantage 0 skipped, except a sample whose engine log-probs the training pass is checked against
    assert keep.tolist() == [True, True, True, False, True, True, False, False]
    assert samples_that_train(batch, tiny_cfg.replace(overlap_rollout=True)).tolist()[2] is False
    for terms in (dict(entropy_coef=0.01), dict(kl_loss_coef=0.1), dict(skip_zero_advantage=False)):
        assert samples_that_train(batch, tiny_cfg.replace(**terms)) is None  # their loss is not 0
