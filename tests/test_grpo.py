"""GRPO math on hand-computed groups: advantages, the clipped loss, log-probs."""

import math

import pytest
import torch

from labkit.grpo import compute_advantages, policy_loss, token_entropy, token_logprobs


def test_advantages_by_hand():
    r = torch.tensor([[1.0, 0.0, 0.0, 0.0]])
    a = compute_advantages(r)
    # mean 0.25, sample std sqrt(0.25) = 0.5
    std = math.sqrt(((0.75**2) + 3 * (0.25**2)) / 3)
    expected = torch.tensor([[0.75, -0.25, -0.25, -0.25]]) / (std + 1e-6)
    assert torch.allclose(a.values, expected, atol=1e-6)
    assert a.zero_std.tolist() == [False]


def test_all_equal_groups_carry_no_signal():
    r = torch.tensor([[1.0, 1.0, 1.0], [0.0, 0.0, 0.0], [0.0, 1.0, 0.0]])
    a = compute_advantages(r)
    assert a.zero_std.tolist() == [True, True, False]
    assert torch.all(a.values[:2] == 0)


def test_dr_grpo_skips_std():
    r = torch.tensor([[2.0, 0.0]])
    a = compute_advantages(r, normalize_std=False)
    assert a.values.tolist() == [[1.0, -1.0]]


def test_advantages_need_a_group():
    with pytest.raises(ValueError, match="n >= 2"):
        compute_advantages(torch.tensor([[1.0], [0.0]]))


def test_clipped_loss_by_hand():
    # two tokens of one answer, advantage +1: ratio 1.5 is clipped at 1.28, ratio 0.5 is not
    new = torch.log(torch.tensor([[1.5, 0.5]]))
    old = torch.zeros(1, 2)
    t = policy_loss(new, old, torch.tensor([1.0]), torch.ones(1, 2), denominator=2.0)
    assert t.loss.item() == pytest.approx(-(1.28 + 0.5) / 2)
    assert t.pg_clipfrac.item() == 1.0


def test_clipped_loss_negative_advantage():
    # advantage -1: ratio 0.5 is clipped at 0.8 (min of -0.5 and -0.8), ratio 1.5 is not
    new = torch.log(torch.tensor([[0.5, 1.5]]))
    t = policy_loss(new, torch.zeros(1, 2), torch.tensor([-1.0]), torch.ones(1, 2), denominator=2.0)
    assert t.loss.item() == pytest.approx((0.8 + 1.5) / 2)
    assert t.pg_clipfrac.item() == 1.0


def test_mask_and_token_mean_over_micro_batches():
    torch.manual_seed(0)
    lp = torch.randn(4, 5)
    old = lp + 0.1 * torch.randn(4, 5)
    adv = torch.randn(4)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0], [1, 1, 0, 0, 0]]).float()
    whole = policy_loss(lp, old, adv, mask, denominator=mask.sum()).loss
    halves = sum(policy_loss(lp[i:i + 2], old[i:i + 2], adv[i:i + 2], mask[i:i + 2],
                             denominator=mask.sum()).loss for i in (0, 2))
    assert whole.item() == pytest.approx(halves.item(), rel=1e-6)


def test_seq_mean_weighs_answers_equally():
    lp = torch.zeros(2, 3)
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]]).float()
    t = policy_loss(lp, lp, torch.tensor([1.0, 1.0]), mask, denominator=2.0,
                    seq_weights=1 / mask.sum(1))
    assert t.loss.item() == pytest.approx(-1.0)  # each answer's mean is -1, averaged


def test_gradient_direction_raises_good_answers():
    lp = torch.zeros(2, 1, requires_grad=True)
    loss = policy_loss(lp, lp.detach(), torch.tensor([1.0, -1.0]), torch.ones(2, 1), denominator=2.0).loss
    loss.backward()
    assert lp.grad[0, 0] < 0 < lp.grad[1, 0]  # descent raises the log-prob of the +1 answer


def test_kl_k3_is_zero_at_the_reference():
    lp = torch.randn(2, 3)
    t = policy_loss(lp, lp, torch.zeros(2), torch.ones(2, 3), denominator=6.0,
                    ref_logprobs=lp.clone(), kl_loss_coef=0.1)
    assert t.kl.item() == pytest.approx(0.0, abs=1e-7)


def test_token_logprobs_match_log_softmax():
    logits = torch.randn(2, 3, 7)
    tokens = torch.randint(0, 7, (2, 3))
    got = token_logprobs(logits, tokens, temperature=0.7)
    want = torch.log_softmax(logits / 0.7, -1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    assert torch.allclose(got, want, atol=1e-5)
    ent = token_entropy(torch.zeros(1, 1, 4))
    assert ent.item() == pytest.approx(math.log(4))


@pytest.mark.parametrize("value", [0.7, 0.1, 1 / 3, 123.456, -0.3])
@pytest.mark.parametrize("normalize_std", [True, False])
def test_a_group_of_equal_rewards_gets_exactly_zero_advantage(value, normalize_std):
    rewards = torch.tensor([[value] * 8, [0.0, 1.0] * 4])
    adv = compute_advantages(rewards, normalize_std=normalize_std).values
    assert torch.equal(adv[0], torch.zeros(8))  # eight 0.7s used to leak up to 0.06
    assert adv[1].abs().sum() > 0
