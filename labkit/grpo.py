"""GRPO: group-relative advantages and the clipped policy loss, as pure tensor functions.

GRPO (Shao et al., 2024, arXiv:2402.03300) drops PPO's value model: the baseline of an
answer is the mean reward of the other answers to the same prompt (its group). A group
whose answers all get the same reward has zero advantage everywhere and teaches nothing,
which is why the group size matters. The loss is PPO's clipped surrogate with DAPO's
asymmetric clip (arXiv:2503.14476): the ratio may rise to 1 + eps_clip_high but fall only
to 1 - eps_clip. Dr. GRPO (arXiv:2503.20783) argues against dividing by the group std; the
`normalize_std` switch turns it off.

Nothing here does I/O or knows about models: tensors in, tensors out.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Advantages:
    """Per-sample advantages and which groups carried no signal."""

    values: torch.Tensor  # [prompts, n]
    zero_std: torch.Tensor  # [prompts] bool: every answer of the group got the same reward


def compute_advantages(
    rewards: torch.Tensor, *, normalize_std: bool = True, eps: float = 1e-6
) -> Advantages:
    """Group-relative advantages from rewards shaped [prompts, n].

    advantage = (r - mean(group)) / (std(group) + eps), or r - mean(group) when
    `normalize_std` is off. The std is the sample std (n - 1), as in TRL and miles. A group
    whose rewards are all equal gets exactly zero: float rounding of its mean (eight 0.7s
    average to 0.70000005) divided by std + eps leaked up to 0.06.
    """
    if rewards.dim() != 2 or rewards.shape[1] < 2:
        raise ValueError(f"rewards must be [prompts, n] with n >= 2, got {tuple(rewards.shape)}")
    rewards = rewards.float()
    mean = rewards.mean(dim=1, keepdim=True)
    std = rewards.std(dim=1, keepdim=True)
    zero_std = (rewards == rewards[:, :1]).all(dim=1)
    adv = rewards - mean
    if normalize_std:
        adv = adv / (std + eps)
    adv = torch.where(zero_std.unsqueeze(1), torch.zeros_like(adv), adv)
    return Advantages(values=adv, zero_std=zero_std)


@dataclass
class LossTerms:
    """The loss of one micro-batch and the statistics we log about it."""

    loss: torch.Tensor  # scalar, already divided by the aggregation denominator
    pg_clipfrac: torch.Tensor  # clipped tokens in this micro-batch (sum, for later division)
    ppo_kl: torch.Tensor  # sum over tokens of old - new log-prob
    entropy: torch.Tensor  # sum over tokens of the entropy (0 when not computed)
    kl: torch.Tensor  # sum over tokens of the k3 KL to the reference (0 when not used)
    tokens: torch.Tensor  # tokens in this micro-batch


def policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    eps_clip: float = 0.2,
    eps_clip_high: float = 0.28,
    denominator: torch.Tensor | float,
    seq_weights: torch.Tensor | None = None,
    entropy: torch.Tensor | None = None,
    entropy_coef: float = 0.0,
    ref_logprobs: torch.Tensor | None = None,
    kl_loss_coef: float = 0.0,
) -> LossTerms:
    """Clipped policy-gradient loss of one micro-batch.

    Inputs are [batch, tokens] (advantages [batch]); `mask` marks response tokens.
    Token-mean aggregation over the whole global batch divides the summed token losses by
    `denominator` = the number of response tokens in the global batch, so micro-batching
    with gradient accumulation gives the same gradient as one big batch. For seq-mean,
    pass `seq_weights` = 1 / (tokens of each answer) and `denominator` = answers in the
    global batch.
    """
    mask = mask.to(logprobs.dtype)
    log_ratio = logprobs - old_logprobs
    ratio = torch.exp(log_ratio)
    adv = advantages.unsqueeze(1)
    surr = ratio * adv
    surr_clipped = torch.clamp(ratio, 1.0 - eps_clip, 1.0 + eps_clip_high) * adv
    token_loss = -torch.minimum(surr, surr_clipped)
    clipped = (surr_clipped < surr).to(logprobs.dtype)  # min picked the clipped branch
    zero = logprobs.new_zeros(())
    kl = zero
    if ref_logprobs is not None and kl_loss_coef > 0:
        # k3 estimator of KL(policy || ref): exp(ref - new) - (ref - new) - 1, always >= 0
        d = ref_logprobs - logprobs
        k3 = torch.exp(d) - d - 1.0
        token_loss = token_loss + kl_loss_coef * k3
        kl = (k3 * mask).sum()
    ent = zero
    if entropy is not None:
        if entropy_coef:
            token_loss = token_loss - entropy_coef * entropy
        ent = (entropy * mask).sum()
    weights = mask if seq_weights is None else mask * seq_weights.unsqueeze(1)
    loss = (token_loss * weights).sum() / denominator
    return LossTerms(
        loss=loss,
        pg_clipfrac=(clipped * mask).sum().detach(),
        ppo_kl=(-log_ratio * mask).sum().detach(),
        entropy=ent.detach(),
        kl=kl.detach(),
        tokens=mask.sum().detach(),
    )


def token_logprobs(logits: torch.Tensor, tokens: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Log-probs of `tokens` under `logits / temperature`, shaped like `tokens`.

    Uses logsumexp instead of a full log-softmax so no second vocabulary-sized tensor is
    kept; the math is done in float32 for bf16 logits.
    """
    logits = logits.float()
    if temperature != 1.0:
        logits = logits / temperature
    picked = logits.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    return picked - torch.logsumexp(logits, dim=-1)


def token_entropy(logits: torch.Tensor, temperature: float = 1.0, chunk: int = 2048) -> torch.Tensor:
    """Entropy of the sampling distribution at each position, shaped like logits[..., 0].

    Works through `chunk` positions at a time, so the float32 copies of a 150k-word
    vocabulary stay small however many tokens the micro-batch holds.
    """
    flat = logits.reshape(-1, logits.shape[-1])
    parts = []
    for i in range(0, flat.shape[0], chunk):
        x = flat[i : i + chunk].float()
        if temperature != 1.0:
            x = x / temperature
        logp = torch.log_softmax(x, dim=-1)
        parts.append(-(logp.exp() * logp).sum(-1))
    return torch.cat(parts).view(logits.shape[:-1]) if parts else logits.new_zeros(logits.shape[:-1]).float()
