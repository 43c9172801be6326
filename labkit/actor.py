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
from labkit.logprobs import chunked_logprobs, lm_head_weight


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
    padded micro-batch (rows x its longest prompt + answer) stays within `max_tokens`;
    a sample longer than the budget goes alone. Sort `idx` by length first to cut padding.
    """
    if max_tokens is None:
        return [idx[i : i + max_samples] for i in range(0, len(idx), max_samples)]
    lengths = sample_lengths(batch)
    out, cur, width = [], [], 0
    for i in idx.tolist():
        wide = max(width, int(lengths[i]))
        if cur and (len(cur) + 1) * wide > max_tokens:
            out.append(torch.tensor(cur, dtype=torch.long))
            cur, wide = [], int(lengths[i])
        cur.append(i)
        width = wide
    if cur:
        out.append(torch.tensor(cur, dtype=torch.long))
    return out


def _micro_batch(batch: RolloutBatch, idx: torch.Tensor, device) -> _Rows:
    """Samples `idx` as right-padded rows of prompt + answer, on `device`.

    A row holds its prompt and its answer back to back and padding only at its end, so the
    width is the longest prompt + answer of the micro-batch (the packed batch's layout pads
    to the longest prompt plus the longest answer), and a causal model needs no attention
    mask: no real token ever looks at a later (padding) position."""
    p = batch.prompt_width
    prompt_len = batch.attention_mask[idx, :p].sum(dim=1)
    answer_len = batch.response_mask[idx].sum(dim=1).long()
    r = int(answer_len.max().clamp(min=1))
    width = int((prompt_len + answer_len).max())
    cols = torch.arange(width)
    src = (p - prompt_len)[:, None] + cols[None, :]  # the packed column of each row's token
    real = cols[None, :] < (prompt_len + answer_len)[:, None]
    ids = batch.input_ids[idx].gather(1, src.clamp(max=batch.input_ids.shape[1] - 1))
    ids = torch.where(real, ids, torch.zeros_like(ids))
    rmask = batch.response_mask[idx, :r]
    rows, k = rmask.nonzero(as_tuple=True)  # answer token k of row `rows`...
    at = prompt_len[rows] + k - 1  # ...is predicted by the hidden state just before it
    return _Rows(ids.to(device), cols.expand(len(idx), -1).to(device), rmask.to(device), r,
                 rows.to(device), k.to(device), at.to(device))


@dataclass
class _Rows:
    """One micro-batch as the model sees it, and where its answer tokens are."""

    ids: torch.Tensor  # [B, W] prompt + answer, right-padded
    positions: torch.Tensor  # [B, W]
    rmask: torch.Tensor  # [B, r] 1 on answer tokens
    r: int  # the longest answer
    rows: torch.Tensor  # [T] the row of each answer token
    col: torch.Tensor  # [T] its place in the answer
    at: torch.Tensor  # [T] the position whose hidden state predicts it

    def targets(self) -> torch.Tensor:
        return self.ids[self.rows, self.at + 1]

    def spread(self, flat: torch.Tensor) -> torch.Tensor:
        """[T] per answer token -> [B, r], zeros off the answers."""
        return flat.new_zeros(self.rmask.shape).index_put((self.rows, self.col), flat)


def _forward_logprobs(model, mb: _Rows, temperature, autocast, entropy=None):
    """Log-probs [B, r] of the answer tokens of each row, and entropies if asked.

    `entropy`: None (skip), "stat" (measured without gradient), "loss" (with gradient).
    With a plain LM head (labkit.logprobs.lm_head_weight) only the answers' hidden states go
    through it, a chunk at a time: no [tokens x vocabulary] logits are ever whole. Otherwise
    the model's full logits are taken (the reference path the tests compare against).
    """
    weight = lm_head_weight(model)
    with autocast():
        if weight is not None:
            hidden = model.base_model(input_ids=mb.ids, position_ids=mb.positions).last_hidden_state
            lp, ent = chunked_logprobs(hidden[mb.rows, mb.at], weight, mb.targets(), temperature)
        else:
            logits = model(input_ids=mb.ids, position_ids=mb.positions).logits[mb.rows, mb.at]
            lp = token_logprobs(logits, mb.targets(), temperature)
            ent = token_entropy(logits, temperature) if entropy else None
    if entropy == "stat" and ent is not None:
        ent = ent.detach()
    return mb.spread(lp), (mb.spread(ent) if entropy and ent is not None else None)


@torch.no_grad()
def compute_logprobs(model, batch: RolloutBatch, *, micro_batch_size: int, temperature: float,
                     max_tokens: int | None = None, autocast=contextlib.nullcontext):
    """Per-token log-probs [N, R] of the answers under `model` (old or reference policy)."""
    device = next(model.parameters()).device
    out = torch.zeros_like(batch.response_mask)
    order = _longest_first(batch, torch.arange(batch.size))
    with mode(model, training=False):
        for idx in micro_batches(batch, order, max_samples=micro_batch_size, max_tokens=max_tokens):
            mb = _micro_batch(batch, idx, device)
            lp, _ = _forward_logprobs(model, mb, temperature, autocast)
            out[idx, : mb.r] = lp.float().cpu()
    return out


@contextlib.contextmanager
def mode(model, *, training: bool):
    """`model` in train (or eval) mode inside the block, its own mode again after.

    The update runs in train mode: transformers checkpoints activations only there
    (`--gradient-checkpointing`), and `from_pretrained` returns eval mode. The policy's
    dropout is off (labkit.models.disable_dropout), so the mode changes nothing else."""
    was = model.training
    model.train(training)
    try:
        yield model
    finally:
        model.train(was)


def sample_lengths(batch: RolloutBatch) -> torch.Tensor:
    """Tokens of each sample, prompt and answer: its width in a micro-batch."""
    return batch.attention_mask.sum(dim=1)


def _longest_first(batch: RolloutBatch, idx: torch.Tensor) -> torch.Tensor:
    lengths = sample_lengths(batch)
    return idx[torch.argsort(lengths[idx], descending=True, stable=True)]


def train_on_rollout(model, optimizer, batch: RolloutBatch, cfg, *, generator: torch.Generator,
                     autocast=contextlib.nullcontext) -> dict:
    """Run cfg.steps_per_rollout optimizer steps on `batch`; return the mean statistics.

    With `batch.old_logprobs` unset, one step per rollout is required and the training
    pass's own log-probs (detached) serve as the old ones; they are stored in
    `batch.old_logprobs` afterwards, so the caller can compare them with the engine's.
    Samples are shuffled (seeded) into global batches; inside a global batch they are
    sorted by length so micro-batches carry little padding. The model is in train mode
    for the update (so `--gradient-checkpointing` checkpoints) and back in its own after.
    """
    fused = batch.old_logprobs is None
    if fused and cfg.steps_per_rollout != 1:
        raise ValueError("old log-probs are required when a rollout gives several optimizer steps")
    if fused:
        batch.old_logprobs = torch.zeros_like(batch.response_mask)
    order = torch.randperm(batch.size, generator=generator)
    stats = dict.fromkeys(("loss", "clipped", "ppo_kl", "entropy", "kl", "tokens", "grad_norm",
                           "micro_batches", "padded", "real"), 0.0)
    g = cfg.global_batch_size
    with mode(model, training=True):
        for k in range(cfg.steps_per_rollout):
            idx = _longest_first(batch, order[k * g : (k + 1) * g])
            _optimizer_step(model, optimizer, batch, idx, cfg, fused, autocast, stats)
    steps, tokens = cfg.steps_per_rollout, max(stats["tokens"], 1.0)
    return {
        "train/loss": stats["loss"] / steps,
        "train/pg_clipfrac": stats["clipped"] / tokens,
        "train/ppo_kl": stats["ppo_kl"] / tokens,
        "train/entropy": stats["entropy"] / tokens,
        "train/kl_loss": stats["kl"] / tokens if cfg.kl_loss_coef > 0 else None,
        "train/grad_norm": stats["grad_norm"] / steps,
        "train/steps": steps,
        "train/micro_batches": int(stats["micro_batches"]),
        "train/padding_frac": 1.0 - stats["real"] / max(stats["padded"], 1.0),
    }


def _optimizer_step(model, optimizer, batch: RolloutBatch, idx: torch.Tensor, cfg, fused: bool,
                    autocast, stats: dict) -> None:
    """One optimizer step on the samples `idx` (one global batch), micro-batch by
    micro-batch; adds its statistics to `stats`."""
    device = next(model.parameters()).device
    lengths = batch.response_mask.sum(dim=1)
    seq_mean = cfg.loss_agg_mode == "seq-mean"
    denom = float(len(idx)) if seq_mean else float(lengths[idx].sum().clamp(min=1))
    max_tokens = cfg.max_tokens_per_gpu if cfg.use_dynamic_batch_size else None
    optimizer.zero_grad(set_to_none=True)
    for mb in micro_batches(batch, idx, max_samples=cfg.micro_batch_size, max_tokens=max_tokens):
        rows = _micro_batch(batch, mb, device)
        rmask, r = rows.rmask, rows.r
        lp, ent = _forward_logprobs(model, rows, cfg.rollout_temperature, autocast,
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
        stats["padded"] += rows.ids.numel()  # what the passes computed on ...
        stats["real"] += int(sample_lengths(batch)[mb].sum())  # ... and what was tokens
    params = [p for p in model.parameters() if p.requires_grad]
    stats["grad_norm"] += float(torch.nn.utils.clip_grad_norm_(params, cfg.clip_grad))
    optimizer.step()


def make_optimizer(model, cfg) -> torch.optim.Optimizer:
    """AdamW with the recipe's betas and weight decay (fused on a GPU)."""
    fused = next(model.parameters()).is_cuda
    return torch.optim.AdamW(
        [p for p in model.parameters() if p.requires_grad], lr=cfg.lr,
        betas=(cfg.adam_beta1, cfg.adam_beta2), weight_decay=cfg.weight_decay, eps=1e-8,
        fused=fused or None,
    )
