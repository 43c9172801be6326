"""The actor update: turn a scored rollout into optimizer steps on the policy.

A rollout of P prompts x n answers is packed once into padded tensors (prompts
left-padded, answers right-padded, so every answer starts at the same column and only the
answer part needs logits). Each optimizer step takes one global batch, split into
micro-batches whose gradients accumulate; the loss is normalised by the token count of the
whole global batch, so the micro-batch split changes memory and speed, not the gradient.

Micro-batches are either a fixed number of samples (`--micro-batch-size`) or, with
`--use-dynamic-batch-size`, as many samples as fit in `--max-tokens-per-gpu` padded tokens
(miles' names): short answers then share a pass and the passes are few.

Old log-probs. When a rollout gives several optimizer steps, the PPO ratio needs the
policy's log-probs from before the first step, so they are taken in a separate pass. With
exactly one step per rollout (the recipe) the policy that sampled is the policy being
trained, so the old log-probs are the training pass's own, detached: the ratio is 1, the
gradient is advantage x grad log-prob, and one forward pass over the rollout is saved.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

from labkit.grpo import policy_loss, token_entropy, token_logprobs


@dataclass
class RolloutBatch:
    """A rollout packed for training: [N, P + R] tokens, with the answer part marked."""

    input_ids: torch.Tensor  # [N, P + R]
    attention_mask: torch.Tensor  # [N, P + R]
    response_mask: torch.Tensor  # [N, R] 1 on answer tokens
    prompt_width: int  # P
    advantages: torch.Tensor  # [N]
    engine_logprobs: torch.Tensor | None  # [N, R] the engine's sampling log-probs, if given
    engine_rows: torch.Tensor | None = None  # [N] 1 where a sample has the engine's log-probs
    old_logprobs: torch.Tensor | None = None  # [N, R] the trainer's, before the update
    ref_logprobs: torch.Tensor | None = None  # [N, R] the reference model's (KL loss only)

    @property
    def size(self) -> int:
        return self.input_ids.shape[0]


def pack_rollout(
    prompt_ids: list[list[int]], response_ids: list[list[int]], advantages: torch.Tensor,
    engine_logprobs: list[list[float] | None], pad_id: int,
) -> RolloutBatch:
    """Pack one (prompt, answer) pair per sample into a RolloutBatch.

    `engine_logprobs[i]` may be None for samples the engine gave no log-probs for (it is
    asked for them on a few prompts only); `engine_rows` marks the others."""
    n = len(prompt_ids)
    p_width = max(len(p) for p in prompt_ids)
    r_width = max(1, max(len(r) for r in response_ids))
    ids = torch.full((n, p_width + r_width), pad_id, dtype=torch.long)
    attn = torch.zeros_like(ids)
    rmask = torch.zeros((n, r_width), dtype=torch.float32)
    rows = torch.tensor([lp is not None for lp in engine_logprobs], dtype=torch.float32)
    elp = torch.zeros((n, r_width), dtype=torch.float32) if rows.any() else None
    for i, (p, r) in enumerate(zip(prompt_ids, response_ids)):
        ids[i, p_width - len(p) : p_width] = torch.tensor(p, dtype=torch.long)
        ids[i, p_width : p_width + len(r)] = torch.tensor(r, dtype=torch.long)
        attn[i, p_width - len(p) : p_width + len(r)] = 1
        rmask[i, : len(r)] = 1.0
        if engine_logprobs[i] is not None:
            elp[i, : len(r)] = torch.tensor(engine_logprobs[i], dtype=torch.float32)
    return RolloutBatch(ids, attn, rmask, p_width, advantages.float().reshape(-1), elp,
                        rows if elp is not None else None)


def micro_batches(batch: RolloutBatch, idx: torch.Tensor, *, max_samples: int,
                  max_tokens: int | None = None) -> list[torch.Tensor]:
    """Split the samples `idx` (in order) into micro-batches.

    Fixed: `max_samples` samples each. Dynamic (`max_tokens` given): add samples while the
    padded micro-batch (rows x (longest prompt + longest answer)) stays within `max_tokens`;
    a sample longer than the budget goes alone. Sort `idx` by length first to cut padding.
    """
    if max_tokens is None:
        return [idx[i : i + max_samples] for i in range(0, len(idx), max_samples)]
    prompt_len = batch.attention_mask[:, : batch.prompt_width].sum(dim=1)
    answer_len = batch.response_mask.sum(dim=1).long()
    out, cur, wide_p, wide_r = [], [], 0, 0
    for i in idx.tolist():
        p, r = max(wide_p, int(prompt_len[i])), max(wide_r, int(answer_len[i]))
        if cur and (len(cur) + 1) * (p + r) > max_tokens:
            out.append(torch.tensor(cur, dtype=torch.long))
            cur, p, r = [], int(prompt_len[i]), int(answer_len[i])
        cur.append(i)
        wide_p, wide_r = p, r
    if cur:
        out.append(torch.tensor(cur, dtype=torch.long))
    return out


def _micro_batch(batch: RolloutBatch, idx: torch.Tensor, device):
    """Slice samples `idx`, cut the padding columns they all share, move to `device`."""
    attn = batch.attention_mask[idx]
    rmask = batch.response_mask[idx]
    p = batch.prompt_width
    first = int(attn[:, :p].float().argmax(dim=1).min()) if p else 0  # leftmost prompt token
    r = int(rmask.sum(dim=1).max().clamp(min=1))
    cols = slice(first, p + r)
    ids, attn = batch.input_ids[idx, cols], attn[:, cols]
    pos = (attn.cumsum(dim=1) - 1).clamp(min=0)
    return (ids.to(device), attn.to(device), pos.to(device), rmask[:, :r].to(device), r)


def _forward_logprobs(model, ids, attn, pos, r, temperature, autocast, entropy=None):
    """Log-probs of the last r tokens of each row (the answer), and entropies if asked.

    `entropy`: None (skip), "stat" (measured without gradient), "loss" (with gradient).
    """
    with autocast():
        out = model(input_ids=ids, attention_mask=attn, position_ids=pos, logits_to_keep=r + 1)
    logits = out.logits[:, :-1]  # position t predicts token t + 1
    lp = token_logprobs(logits, ids[:, -r:], temperature)
    ent = None
    if entropy == "loss":
        ent = token_entropy(logits, temperature)
    elif entropy == "stat":
        with torch.no_grad():
            ent = token_entropy(logits.detach(), temperature)
    return lp, ent


@torch.no_grad()
def compute_logprobs(model, batch: RolloutBatch, *, micro_batch_size: int, temperature: float,
                     max_tokens: int | None = None, autocast=contextlib.nullcontext):
    """Per-token log-probs [N, R] of the answers under `model` (old or reference policy)."""
    device = next(model.parameters()).device
    out = torch.zeros_like(batch.response_mask)
    order = _longest_first(batch, torch.arange(batch.size))
    for idx in micro_batches(batch, order, max_samples=micro_batch_size, max_tokens=max_tokens):
        ids, attn, pos, rmask, r = _micro_batch(batch, idx, device)
        lp, _ = _forward_logprobs(model, ids, attn, pos, r, temperature, autocast)
        out[idx, :r] = (lp * rmask).float().cpu()
    return out


def _longest_first(batch: RolloutBatch, idx: torch.Tensor) -> torch.Tensor:
    lengths = batch.response_mask.sum(dim=1)
    return idx[torch.argsort(lengths[idx], descending=True, stable=True)]


def train_on_rollout(model, optimizer, batch: RolloutBatch, cfg, *, generator: torch.Generator,
                     autocast=contextlib.nullcontext) -> dict:
    """Run cfg.steps_per_rollout optimizer steps on `batch`; return the mean statistics.

    With `batch.old_logprobs` unset, one step per rollout is required and the training
    pass's own log-probs (detached) serve as the old ones; they are stored in
    `batch.old_logprobs` afterwards, so the caller can compare them with the engine's.
    Samples are shuffled (seeded) into global batches; inside a global batch they are
    sorted by length so micro-batches carry little padding.
    """
    fused = batch.old_logprobs is None
    if fused and cfg.steps_per_rollout != 1:
        raise ValueError("old log-probs are required when a rollout gives several optimizer steps")
    if fused:
        batch.old_logprobs = torch.zeros_like(batch.response_mask)
    device = next(model.parameters()).device
    order = torch.randperm(batch.size, generator=generator)
    lengths = batch.response_mask.sum(dim=1)
    params = [p for p in model.parameters() if p.requires_grad]
    max_tokens = cfg.max_tokens_per_gpu if cfg.use_dynamic_batch_size else None
    stats = {"loss": 0.0, "clipped": 0.0, "ppo_kl": 0.0, "entropy": 0.0, "kl": 0.0,
             "tokens": 0.0, "grad_norm": 0.0, "micro_batches": 0}
    g = cfg.global_batch_size
    for k in range(cfg.steps_per_rollout):
        idx = _longest_first(batch, order[k * g : (k + 1) * g])
        seq_mean = cfg.loss_agg_mode == "seq-mean"
        denom = float(len(idx)) if seq_mean else float(lengths[idx].sum().clamp(min=1))
        optimizer.zero_grad(set_to_none=True)
        for mb in micro_batches(batch, idx, max_samples=cfg.micro_batch_size, max_tokens=max_tokens):
            ids, attn, pos, rmask, r = _micro_batch(batch, mb, device)
            lp, ent = _forward_logprobs(model, ids, attn, pos, r, cfg.rollout_temperature, autocast,
                                        entropy="loss" if cfg.entropy_coef > 0 else "stat")
            if fused:
                batch.old_logprobs[mb, :r] = (lp.detach() * rmask).float().cpu()
                old = lp.detach()
            else:
                old = batch.old_logprobs[mb, :r].to(device)
            ref = batch.ref_logprobs[mb, :r].to(device) if batch.ref_logprobs is not None else None
            terms = policy_loss(
                lp, old, batch.advantages[mb].to(device), rmask,
                eps_clip=cfg.eps_clip, eps_clip_high=cfg.eps_clip_high, denominator=denom,
                seq_weights=(1.0 / rmask.sum(1).clamp(min=1)) if seq_mean else None,
                entropy=ent, entropy_coef=cfg.entropy_coef,
                ref_logprobs=ref, kl_loss_coef=cfg.kl_loss_coef,
            )
            terms.loss.backward()
            stats["loss"] += float(terms.loss.detach())
            stats["clipped"] += float(terms.pg_clipfrac)
            stats["ppo_kl"] += float(terms.ppo_kl)
            stats["entropy"] += float(terms.entropy)
            stats["kl"] += float(terms.kl)
            stats["tokens"] += float(terms.tokens)
            stats["micro_batches"] += 1
        grad_norm = torch.nn.utils.clip_grad_norm_(params, cfg.clip_grad)
        stats["grad_norm"] += float(grad_norm)
        optimizer.step()
    steps, tokens = cfg.steps_per_rollout, max(stats["tokens"], 1.0)
    return {
        "train/loss": stats["loss"] / steps,
        "train/pg_clipfrac": stats["clipped"] / tokens,
        "train/ppo_kl": stats["ppo_kl"] / tokens,
        "train/entropy": stats["entropy"] / tokens,
        "train/kl_loss": stats["kl"] / tokens if cfg.kl_loss_coef > 0 else None,
        "train/grad_norm": stats["grad_norm"] / steps,
        "train/steps": steps,
        "train/micro_batches": stats["micro_batches"],
    }


def make_optimizer(model, cfg) -> torch.optim.Optimizer:
    """AdamW with the recipe's betas and weight decay (fused on a GPU)."""
    fused = next(model.parameters()).is_cuda
    return torch.optim.AdamW(
        [p for p in model.parameters() if p.requires_grad], lr=cfg.lr,
        betas=(cfg.adam_beta1, cfg.adam_beta2), weight_decay=cfg.weight_decay, eps=1e-8,
        fused=fused or None,
    )
