"""Attention for the padding-free layout: each sample of a row through torch's varlen kernel.

`--padding-free` lays a pass's samples back to back in rows (labkit.packing.packed_rows).
Left to transformers, the restarts of their positions become a block-diagonal mask, and a
mask costs sdpa its causal fast path: on an H100 the recipe's update alone was 5-30% slower
than with a row per sample (BENCHMARKS.md). torch's `varlen_attn` (torch >= 2.10, a CUDA GPU)
runs flash attention over each sample alone, from where the samples start and end in the
flattened rows (`Rows.segments`), with no mask at all.

`use_varlen_attention` registers that kernel with transformers under `NAME` and makes it the
model's attention; a pass of packed rows hands it the samples' bounds (`varlen_kwargs`), and
any other pass (a row per sample, causal, no mask) runs transformers' sdpa as before.
"""

from __future__ import annotations

import inspect

import torch

NAME = "labkit_varlen"


def available(device) -> bool:
    """Whether torch's varlen attention can run on `device` (a CUDA GPU, torch >= 2.10)."""
    if torch.device(device).type != "cuda":
        return False
    try:
        from torch.nn.attention.varlen import varlen_attn  # noqa: F401
    except ImportError:
        return False
    return True


def use_varlen_attention(model) -> None:
    """Make torch's varlen kernel `model`'s attention for packed rows (sdpa for the rest)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(NAME, attention)
    AttentionMaskInterface.register(NAME, _no_mask)
    model.config._attn_implementation = NAME


def varlen_kwargs(model, rows) -> dict:
    """What a forward pass of `rows` hands the attention: the bounds of its samples in the
    flattened rows (transformers' names for them), where `model` attends with the varlen
    kernel and `rows` is packed; nothing otherwise."""
    if rows.segments is None or getattr(model.config, "_attn_implementation", None) != NAME:
        return {}
    return dict(cu_seq_lens_q=rows.segments, cu_seq_lens_k=rows.segments,
                max_length_q=rows.longest, max_length_k=rows.longest)


def attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None,
              cu_seq_lens_q=None, max_length_q=None, **kwargs):
    """transformers' attention function for `NAME`: query [B, Hq, W, D], key and value
    [B, Hkv, W, D] -> ([B, W, Hq, D], None). Causal within each segment of `cu_seq_lens_q`
    (the flattened rows' sample bounds); without them, transformers' sdpa."""
    if cu_seq_lens_q is None:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                      scaling=scaling, **kwargs)
    b, heads, w, d = query.shape
    q = query.transpose(1, 2).reshape(b * w, heads, d)
    k = key.transpose(1, 2).reshape(b * w, key.shape[1], d)
    v = value.transpose(1, 2).reshape(b * w, value.shape[1], d)
    if k.shape[1] != heads:  # grouped-query attention: head i reads key/value head i // group
        k = k.repeat_interleave(heads // k.shape[1], dim=1)
        v = v.repeat_interleave(heads // v.shape[1], dim=1)
    if torch.is_autocast_enabled(q.device.type):  # a custom op: autocast does not cast for it
        dtype = torch.get_autocast_dtype(q.device.type)
        q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
    scale = scaling if scaling is not None else d**-0.5
    out = causal_varlen(q, k, v, cu_seq_lens_q, int(max_length_q), scale)
    return out.reshape(b, w, heads, d), None


def causal_varlen(q, k, v, bounds: torch.Tensor, longest: int, scale: float) -> torch.Tensor:
    """Causal attention of each segment [bounds[i], bounds[i+1]) of q, k, v [T, H, D] alone:
    torch's varlen kernel, its causal flag by the name this torch gives it."""
    from torch.nn.attention.varlen import varlen_attn

    params = inspect.signature(varlen_attn).parameters
    causal = {"window_size": (-1, 0)} if "window_size" in params else {"is_causal": True}
    extra = {"scale": scale} if "scale" in params else {}
    if not extra and abs(scale - q.shape[-1] ** -0.5) > 1e-12:
        raise RuntimeError("this torch's varlen_attn takes no scale, and the model's is not 1/sqrt(d)")
    return varlen_attn(q, k, v, bounds, bounds, longest, longest, **causal, **extra)


def _no_mask(*args, **kwargs):
    """The mask transformers builds for `NAME`: none (the kernel takes the samples' bounds,
    and a pass without them is causal)."""
    return None
