"""The actor update: turn a scored rollout into optimizer steps on the policy.

Each optimizer step takes one global batch, split into micro-batches whose gradients
accumulate; the loss is normalised by the token count of the whole global batch, so the
micro-batch split changes memory and speed, not the gradient. How the samples sit in a
micro-batch (a row each, or a group's answers after one copy of their prompt with
`--share-prompt`) is labkit.packing's.

Old log-probs. When a rollout gives several optimizer steps, the PPO ratio needs the
policy's log-probs from before the first step, so they are taken in a separate pass. With
exactly one step per rollout (the recipe) the policy that sampled is the policy being
trained, so the old log-probs are the training pass's own, detached: the ratio is 1, the
gradient is advantage x grad log-prob, and one forward pass over the rollout is saved.

Answers that teach nothing. A group whose answers all got one reward has advantage 0 for
each of them, and without a KL or entropy term an answer of advantage 0 has a loss and a
gradient of exactly 0 (the clipped surrogate is ratio x 0). So such answers take no pass
(`samples_that_train`, `--skip-zero-advantage`, on by default): the token-mean's denominator
still counts their tokens, and the optimizer still steps when a whole global batch is of them
(zero gradients: AdamW's momentum and weight decay move the weights as they would have). The
step is the same, to float rounding, for less work: in the group-size study a third of the
answers at 16 a prompt, three fifths at 4, had advantage 0.
"""

from __future__ import annotations

import contextlib

import torch

from labkit.errors import ConfigError
from labkit.grpo import policy_loss, token_entropy, token_logprobs
from labkit.logprobs import chunked_logprobs, lm_head_weight
from labkit.models import layers_compiled
from labkit.packing import RolloutBatch, Rows, longest_first, passes, varlen_kwargs


def _attention_mask(model, mb: Rows):
    """The shared-prompt layout's mask in the form the model's attention takes (sdpa: True
    where a token may look; eager: 0 there and the dtype's lowest elsewhere), or None."""
    if mb.mask is None:
        return None
    kind = getattr(model.config, "_attn_implementation", "sdpa")
    if kind == "sdpa":
        return mb.mask
    if kind == "eager":
        low = torch.finfo(torch.float32).min
        return torch.zeros(mb.mask.shape, device=mb.mask.device).masked_fill_(~mb.mask, low)
    raise ConfigError(f"--share-prompt needs sdpa or eager attention; this model runs {kind!r} "
                      f"(leave --share-prompt off)")


def _forward_logprobs(model, mb: Rows, temperature, autocast, entropy=None):
    """Log-probs [S, r] of the answer tokens of each sample, and entropies if asked.

    `entropy`: None (skip), "stat" (measured without gradient), "loss" (with gradient).
    With a plain LM head (labkit.logprobs.lm_head_weight) only the answers' hidden states go
    through it, a chunk at a time: no [tokens x vocabulary] logits are ever whole. Otherwise
    the model's full logits are taken (the reference path the tests compare against).
    """
    weight = lm_head_weight(model)
    inputs = dict(input_ids=mb.ids, position_ids=mb.positions, attention_mask=_attention_mask(model, mb),
                  use_cache=False,  # a KV cache is for generation: here it would only hold K and V
                  **varlen_kwargs(model, mb))  # packed rows' samples, where the varlen kernel runs
    if mb.ids.shape[0] == 1 and "cu_seq_lens_q" not in inputs and layers_compiled(model):
        inputs = _two_rows(inputs)
    with autocast():
        if weight is not None:
            hidden = model.base_model(**inputs).last_hidden_state
            lp, ent = chunked_logprobs(hidden[mb.row, mb.at], weight, mb.targets, temperature)
        else:
            logits = model(**inputs).logits[mb.row, mb.at]
            lp = token_logprobs(logits, mb.targets, temperature)
            ent = token_entropy(logits, temperature) if entropy else None
    if entropy == "stat" and ent is not None:
        ent = ent.detach()
    return mb.spread(lp), (mb.spread(ent) if entropy and ent is not None else None)


def _two_rows(inputs: dict) -> dict:
    """A pass of one row as two: the row and a copy that nothing reads. Compiled layers
    (--torch-compile) take any number of rows but one: torch.compile specializes a size of 1,
    so a one-row pass, which a step's last pass can be, would compile them all again."""
    return {k: v.repeat(2, *[1] * (v.dim() - 1)) if isinstance(v, torch.Tensor) else v
            for k, v in inputs.items()}


def samples_that_train(batch: RolloutBatch, cfg) -> torch.Tensor | None:
    """[N] bool: the samples that take a pass in the update, or None for all of them.

    With --skip-zero-advantage and no KL or entropy term, the samples of advantage 0 take
    none (see the module's docstring), except those whose engine log-probs the training
    pass is checked against (train/train_rollout_logprob_abs_diff)."""
    if not getattr(cfg, "skip_zero_advantage", False) or cfg.kl_loss_coef > 0 or cfg.entropy_coef != 0:
        return None
    keep = batch.advantages != 0
    if batch.engine_rows is not None and not cfg.overlap_rollout:
        keep |= batch.engine_rows.bool()
    return keep


@torch.no_grad()
def compute_logprobs(model, batch: RolloutBatch, *, micro_batch_size: int, temperature: float,
                     max_tokens: int | None = None, autocast=contextlib.nullcontext,
                     share_prompt: bool = False, padding_free: bool = False,
                     only: torch.Tensor | None = None):
    """Per-token log-probs [N, R] of the answers under `model` (old or reference policy); of
    the samples `only` marks where given (the others' stay 0)."""
    device = next(model.parameters()).device
    out = torch.zeros_like(batch.response_mask)
    everyone = torch.arange(batch.size)
    order = longest_first(batch, everyone if only is None else everyone[only])
    with mode(model, training=False):
        for idx, mb in passes(batch, order, device, max_samples=micro_batch_size,
                              max_tokens=max_tokens, share_prompt=share_prompt,
                              padding_free=padding_free):
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
                           "micro_batches", "padded", "real", "skipped"), 0.0)
    g = cfg.global_batch_size
    trains = samples_that_train(batch, cfg)
    with mode(model, training=True):
        for k in range(cfg.steps_per_rollout):
            idx = longest_first(batch, order[k * g : (k + 1) * g])
            _optimizer_step(model, optimizer, batch, idx, cfg, fused, autocast, stats, trains)
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
        "train/skipped_frac": stats["skipped"] / max(batch.size * steps, 1),
    }


def _optimizer_step(model, optimizer, batch: RolloutBatch, idx: torch.Tensor, cfg, fused: bool,
                    autocast, stats: dict, trains: torch.Tensor | None = None) -> None:
    """One optimizer step on the samples `idx` (one global batch), micro-batch by
    micro-batch, the passes over those `trains` marks (all where None); adds its statistics
    to `stats`."""
    device = next(model.parameters()).device
    lengths = batch.response_mask.sum(dim=1)
    seq_mean = cfg.loss_agg_mode == "seq-mean"
    denom = float(len(idx)) if seq_mean else float(lengths[idx].sum().clamp(min=1))  # every sample's
    max_tokens = cfg.max_tokens_per_gpu if cfg.use_dynamic_batch_size else None
    optimizer.zero_grad(set_to_none=True)
    params = [p for p in model.parameters() if p.requires_grad]
    if trains is not None:
        stats["skipped"] += float((~trains[idx]).sum())
        idx = idx[trains[idx]]
    for mb, rows in passes(batch, idx, device, max_samples=cfg.micro_batch_size,
                           max_tokens=max_tokens, share_prompt=cfg.share_prompt,
                           padding_free=getattr(cfg, "padding_free", False)):
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
        stats["real"] += rows.real  # ... and what was tokens
    for p in params:  # no pass ran (every answer of advantage 0): the gradient is 0, not absent
        if p.grad is None:
            p.grad = torch.zeros_like(p)
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
