"""--overlap-rollout: the next rollout is written from the weights before the update, and the
PPO ratio is taken against the engine's own log-probs (a case small enough to do by hand)."""

from __future__ import annotations

import contextlib
import math
from types import SimpleNamespace

import pytest
import torch

import labkit.trainer as trainer
from labkit.config import ConfigError, RunConfig
from labkit.data import Problem
from labkit.engines.base import Completion


class Uniform(torch.nn.Module):
    """A 'model' whose next-token distribution is uniform over 4 tokens, whatever the input."""

    def __init__(self):
        super().__init__()
        self.bias = torch.nn.Parameter(torch.zeros(4))

    def forward(self, input_ids, attention_mask=None, position_ids=None, logits_to_keep=None, use_cache=None):
        width = logits_to_keep or input_ids.shape[1]  # as transformers: the last positions only
        return SimpleNamespace(logits=self.bias.expand(input_ids.shape[0], width, 4))


def fake_session(overlap: bool):
    cfg = RunConfig(rollout_batch_size=1, n_samples_per_prompt=2, global_batch_size=2,
                    micro_batch_size=2, lr=1e-3, engine="vllm", overlap_rollout=overlap,
                    eps_clip=0.2, eps_clip_high=0.28)
    policy = Uniform()
    return SimpleNamespace(cfg=cfg, policy=policy, optimizer=torch.optim.SGD(policy.parameters(), lr=0.0),
                           tokenizer=SimpleNamespace(pad_token_id=0), ref=None,
                           autocast=contextlib.nullcontext)


def rollout(engine_prob: float):
    """One prompt, two one-token answers that the engine sampled with probability engine_prob."""
    answers = [Completion(0, [1], "a", "stop", [math.log(engine_prob)]),
               Completion(0, [2], "b", "stop", [math.log(engine_prob)])]
    return trainer.Rollout([Problem("x/train/0", "q", "1")], [[3, 3]], [answers])


@pytest.mark.parametrize("engine_prob, loss, clipped", [
    (0.2, -1.25, 0.0),  # ratio 0.25 / 0.2 = 1.25: inside [0.8, 1.28]
    (0.1, -1.28, 1.0),  # ratio 2.5: an advantage of +1 is clipped at 1 + eps-clip-high
])
def test_the_ratio_is_taken_against_the_engine_log_probs(engine_prob, loss, clipped):
    s = fake_session(overlap=True)
    stats, batch = trainer.update_policy(s, rollout(engine_prob), torch.tensor([1.0, 1.0]), step=0)
    assert stats["train/loss"] == pytest.approx(loss, abs=1e-6)
    assert stats["train/pg_clipfrac"] == pytest.approx(clipped)
    # ppo_kl: mean of (old - new) log-prob with old = the engine's
    assert stats["train/ppo_kl"] == pytest.approx(math.log(engine_prob) - math.log(0.25), abs=1e-6)


def test_in_step_the_ratio_is_one():
    s = fake_session(overlap=False)
    stats, _ = trainer.update_policy(s, rollout(0.1), torch.tensor([1.0, 1.0]), step=0)
    assert stats["train/loss"] == pytest.approx(-1.0) and stats["train/pg_clipfrac"] == 0
    # the engine's log-probs only feed the check: |log 0.25 - log 0.1|
    assert stats["train/train_rollout_logprob_abs_diff"] == pytest.approx(math.log(2.5), abs=1e-6)


def test_the_next_rollout_comes_from_the_weights_before_the_update(tiny_cfg, served):
    run = trainer.train(tiny_cfg.replace(engine="vllm", overlap_rollout=True, num_rollout=3))
    (engine,) = served
    kinds = [k for k, _ in engine.events]
    assert kinds == ["generate", "generate", "update", "generate", "update", "update"]
    prints = [f for _, f in engine.events]
    start, after_1, after_2 = prints[0], prints[2], prints[4]
    assert prints[1] == start  # rollout 1 written during step 0's update: from the start weights
    assert prints[3] == after_1 != start  # rollout 2: from the weights after step 0
    assert after_2 != after_1
    rows = run.metrics.to_dict("records")
    assert [r["rollout/step"] for r in rows] == [0, 1, 2]
    assert all(r["perf/overlap_time"] > 0 for r in rows[:2])
    assert math.isnan(rows[2]["perf/overlap_time"])  # the last step has no next rollout to write


def test_overlap_is_refused_where_it_cannot_run():
    with pytest.raises(ConfigError, match="needs --engine vllm"):
        RunConfig(engine="hf", overlap_rollout=True).check()
    with pytest.raises(ConfigError, match="one optimizer step per rollout"):
        RunConfig(engine="vllm", overlap_rollout=True, global_batch_size=128).check()
