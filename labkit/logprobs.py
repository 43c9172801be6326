"""Log-probs of the answer tokens from the last hidden states, a chunk of tokens at a time.

Why: the update needs one number per answer token, log p(token), but the plain way gets it
from the logits of every token over the whole vocabulary. For the recipe's 0.5B Qwen2.5
a micro-batch of 12,288 tokens x 151,936 words is 3.7 GB of bf16 logits, then a float32
copy (7.5 GB), then their gradient: three runs of the recipe did not fit on one H200
beside each other. Here the LM head is applied to `chunk` tokens at a time: each chunk's
logits live only while its log-probs (and entropies) are taken, and the backward pass
computes them again, chunk by chunk, instead of keeping them. Memory falls from
tokens x vocabulary to chunk x vocabulary; the price is one more LM-head product in the
backward pass (Liger's and Cut Cross-Entropy's fused losses trade the same way).

Only the answer tokens go through the head (the prompt's positions and the padding never
do), and the gradient is the plain one, written out: for z = logits / T, p = softmax(z),

    d log p(y) / dz = onehot(y) - p
    d H / dz        = -p * (log p + H)          (H = -sum p log p, the entropy)

each divided by T for the logits. This is plain PyTorch, the same code on a CPU and a GPU;
tests compare its loss and gradients with the full-logits path.
"""

from __future__ import annotations

import torch

CHUNK_ELEMENTS = 2**27  # logits per chunk (512 MiB in float32): ~880 tokens of a 151,936-word head


def chunk_tokens(vocab: int, elements: int = CHUNK_ELEMENTS) -> int:
    """Tokens per chunk for a vocabulary of `vocab` words (at least 1)."""
    return max(1, elements // max(vocab, 1))


class _ChunkedLogprobs(torch.autograd.Function):
    """(hidden [T, H], weight [V, H]) -> (log p(tokens) [T], entropy [T]), float32."""

    @staticmethod
    def forward(ctx, hidden, weight, tokens, temperature: float, chunk: int):
        # The LM-head products run in autocast's dtype when it is on (bf16 on a GPU), as the
        # model's own head would, in the forward and the backward pass alike; everything
        # after them (softmax, entropy, log-probs) in float32, with autocast off: under it the
        # entropy's batched product ran in bf16 and was off by up to 0.8 nats.
        dtype = _compute_dtype(hidden)
        with _no_autocast(hidden):
            return _ChunkedLogprobs._forward(ctx, hidden, weight, tokens, temperature, chunk, dtype)

    @staticmethod
    def _forward(ctx, hidden, weight, tokens, temperature: float, chunk: int, dtype):
        w = weight.to(dtype)
        n = hidden.shape[0]
        logp, ent, lse = (hidden.new_empty(n, dtype=torch.float32) for _ in range(3))
        for i in range(0, n, chunk):
            z = _scaled_logits(hidden[i : i + chunk].to(dtype), w, temperature)
            lse_c = torch.logsumexp(z, dim=-1)
            p = torch.softmax(z, dim=-1)
            logp[i : i + chunk] = z.gather(1, tokens[i : i + chunk, None]).squeeze(1) - lse_c
            ent[i : i + chunk] = lse_c - _rowdot(p, z)  # -sum p log p, with log p = z - lse
            lse[i : i + chunk] = lse_c
        ctx.save_for_backward(hidden, weight, tokens, lse, ent)
        ctx.temperature, ctx.chunk, ctx.dtype = temperature, chunk, dtype
        ctx.set_materialize_grads(False)  # an output nobody used gets None, not zeros
        return logp, ent

    @staticmethod
    def backward(ctx, g_logp, g_ent):
        with _no_autocast(ctx.saved_tensors[0]):
            return _ChunkedLogprobs._backward(ctx, g_logp, g_ent)

    @staticmethod
    def _backward(ctx, g_logp, g_ent):
        hidden, weight, tokens, lse, ent = ctx.saved_tensors
        t, chunk, dtype = ctx.temperature, ctx.chunk, ctx.dtype
        w = weight.to(dtype)
        grad_h = torch.zeros_like(hidden) if ctx.needs_input_grad[0] else None
        grad_w = torch.zeros_like(weight, dtype=torch.float32) if ctx.needs_input_grad[1] else None
        if g_logp is None and g_ent is None:
            return grad_h, grad_w, None, None, None
        for i in range(0, hidden.shape[0], chunk):
            rows = slice(i, i + chunk)
            h = hidden[rows].to(dtype)
            logp_all = _scaled_logits(h, w, t).sub_(lse[rows, None])  # log p, in place of z
            p = logp_all.exp()
            if g_ent is not None:  # dH/dz = -p (log p + H), built in the logits' buffer
                g = logp_all.add_(ent[rows, None]).mul_(p).mul_(-g_ent[rows, None])
            else:
                g = logp_all.zero_()
            if g_logp is not None:  # d log p(y)/dz = onehot(y) - p
                g.sub_(p.mul_(g_logp[rows, None]))
                g.scatter_add_(1, tokens[rows, None], g_logp[rows, None])
            del p
            if t != 1.0:
                g.div_(t)
            g = g.to(dtype)
            if grad_h is not None:
                grad_h[rows] = g @ w
            if grad_w is not None:
                grad_w.add_(g.t() @ h)
        if grad_w is not None:
            grad_w = grad_w.to(weight.dtype)
        return grad_h, grad_w, None, None, None


def _no_autocast(x: torch.Tensor):
    """Autocast off on `x`'s device: the dtypes below are chosen by hand."""
    return torch.autocast(x.device.type, enabled=False)


def _compute_dtype(x: torch.Tensor) -> torch.dtype:
    kind = x.device.type
    return torch.get_autocast_dtype(kind) if torch.is_autocast_enabled(kind) else x.dtype


def _scaled_logits(h: torch.Tensor, w: torch.Tensor, temperature: float) -> torch.Tensor:
    """float32 logits / T of one chunk (the product in the hidden states' dtype)."""
    z = (h @ w.t()).float()
    return z.div_(temperature) if temperature != 1.0 else z


def _rowdot(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """sum(a * b, -1) without an [rows x vocabulary] product tensor."""
    return torch.bmm(a.unsqueeze(1), b.unsqueeze(2)).view(-1)


def chunked_logprobs(hidden: torch.Tensor, weight: torch.Tensor, tokens: torch.Tensor,
                     temperature: float = 1.0, chunk: int | None = None):
    """Log-probs of `tokens` [T] and the entropies [T] (float32) under the LM head `weight`
    [V, H] applied to `hidden` [T, H], `chunk` tokens at a time (default: 512 MiB of float32 logits).

    Differentiable in `hidden` and `weight`; no [T x V] tensor is kept for the backward pass."""
    chunk = chunk or chunk_tokens(weight.shape[0])
    if hidden.shape[0] == 0:
        empty = hidden.new_zeros(0, dtype=torch.float32) + 0 * weight.sum()  # keeps the graph
        return empty, empty.clone()
    return _ChunkedLogprobs.apply(hidden, weight, tokens, float(temperature), int(chunk))


def lm_head_weight(model) -> torch.Tensor | None:
    """The output projection's weight when the logits are exactly hidden @ weight.T (no bias,
    no soft-capping or scaling of the logits); None for a model where that does not hold,
    which then takes the full-logits path."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if not isinstance(head, torch.nn.Linear) or head.bias is not None:
        return None
    config = getattr(model, "config", None)
    for name in ("final_logit_softcapping", "logit_scale", "output_multiplier_scale"):
        if getattr(config, name, None) not in (None, 1, 1.0):
            return None
    return head.weight
