"""The padding-free layout: samples back to back in rows, their positions counting from 0,
give the same log-probs, loss and gradients as one padded row per sample; every sample is in
exactly one pass, and only the rows' ends are padding."""

from __future__ import annotations

import functools

import pytest
import torch
import torch.nn.functional as F

from labkit import packing
from labkit.actor import _forward_logprobs
from labkit.config import RunConfig, check_config
from labkit.errors import ConfigError
from labkit.packing import (
    longest_first,
    packed_micro_batches,
    packed_rows,
    passes,
    sample_lengths,
    sample_rows,
    use_varlen_attention,
    varlen_available,
    varlen_kwargs,
)
from tests.test_packing import NO_AUTOCAST, _groups, _model, assert_same_as_a_row_per_sample


@pytest.mark.parametrize("kind,attn", [("qwen2", "sdpa"), ("qwen2", "eager"), ("llama", "sdpa")])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_packed_rows_give_the_same_loss_and_gradients_as_a_row_per_sample(kind, attn, temperature):
    model, batch = _model(kind, attn), _groups(prompts=3, n=4)
    idx = longest_first(batch, torch.arange(batch.size))
    (rows,) = packed_micro_batches(batch, idx, max_samples=batch.size)
    assert len(rows) < batch.size  # several samples share a row
    packed = packed_rows(batch, rows, "cpu")
    per_sample = assert_same_as_a_row_per_sample(model, batch, idx, packed, torch.cat(rows), temperature)
    # the same tokens through the model, in fewer padded positions
    assert packed.real == per_sample.real == int(sample_lengths(batch).sum())
    assert packed.ids.numel() < per_sample.ids.numel()


def test_a_row_holding_one_sample_and_no_padding_is_a_plain_causal_row():
    model, batch = _model(), _groups(prompts=2, n=3)
    idx = longest_first(batch, torch.arange(batch.size))[:1]
    packed = packed_rows(batch, [idx], "cpu")
    plain = sample_rows(batch, idx, "cpu")
    assert torch.equal(packed.ids, plain.ids) and torch.equal(packed.positions, plain.positions)
    lp, _ = _forward_logprobs(model, packed, 1.0, NO_AUTOCAST)
    want, _ = _forward_logprobs(model, plain, 1.0, NO_AUTOCAST)
    assert torch.allclose(lp, want, atol=1e-6)


@pytest.mark.parametrize("max_tokens", [None, 25, 40, 60, 10_000])
@pytest.mark.parametrize("max_samples", [1, 5, 12])
def test_every_sample_is_in_one_packed_pass_and_only_row_ends_are_padding(max_tokens, max_samples):
    batch = _groups(prompts=4, n=5, seed=3)
    lengths = sample_lengths(batch)
    idx = longest_first(batch, torch.randperm(batch.size, generator=torch.Generator().manual_seed(0)))
    got = packed_micro_batches(batch, idx, max_samples=max_samples, max_tokens=max_tokens)
    seen = torch.cat([torch.cat(p) for p in got])
    assert sorted(seen.tolist()) == sorted(idx.tolist())
    longest = int(lengths.max())
    for p in got:
        rows = packed_rows(batch, p, "cpu")
        room = longest if max_tokens is not None else int(lengths[torch.cat(p)].max())
        used = [int(lengths[row].sum()) for row in p]
        assert rows.ids.shape == (len(p), max(used)) and max(used) <= room
        for b, u in enumerate(used):
            # the padding after the samples is a sequence of its own: positions from 0
            assert rows.positions[b, u:].tolist() == list(range(max(used) - u))
        if max_tokens is None:
            assert len(torch.cat(p)) <= max_samples
        else:
            assert len(p) * room <= max(max_tokens, room)
        # first fit: no two rows of a pass could have been one
        if len(used) > 1:
            assert sorted(used)[0] + sorted(used)[1] > room


def test_one_layout_at_a_time():
    with pytest.raises(ConfigError, match="--share-prompt and --padding-free"):
        check_config(RunConfig(share_prompt=True, padding_free=True))
    batch = _groups()
    with pytest.raises(ValueError, match="one layout at a time"):
        next(passes(batch, torch.arange(batch.size), "cpu", max_samples=4, share_prompt=True,
                    padding_free=True))


def _reference_varlen(calls):
    """What torch's varlen kernel computes (it runs on CUDA only): each segment alone, causal;
    each call's segment count goes into `calls`."""
    def causal_varlen(q, k, v, bounds, longest, scale):
        out = torch.empty_like(q)
        calls.append(len(bounds) - 1)
        for a, b in zip(bounds[:-1].tolist(), bounds[1:].tolist()):
            assert b - a <= longest
            seg = [t[a:b].transpose(0, 1) for t in (q, k, v)]  # [H, n, D]
            out[a:b] = F.scaled_dot_product_attention(*seg, is_causal=True, scale=scale).transpose(0, 1)
        return out
    return causal_varlen


@pytest.mark.parametrize("kind", ["qwen2", "llama"])
def test_packed_rows_through_the_varlen_kernel_give_a_row_per_sample_s_results(kind, monkeypatch):
    calls = []
    monkeypatch.setattr(packing, "causal_varlen", _reference_varlen(calls))
    model, batch = _model(kind), _groups(prompts=3, n=4)  # 4 query heads over 2 key/value heads
    use_varlen_attention(model)
    idx = longest_first(batch, torch.arange(batch.size))
    (rows,) = packed_micro_batches(batch, idx, max_samples=batch.size)
    packed = packed_rows(batch, rows, "cpu")
    lengths, width, want = sample_lengths(batch), packed.ids.shape[1], [0]
    for b, row in enumerate(rows):  # each sample's end in the flattened rows, then the row's
        want += (b * width + torch.cumsum(lengths[row], 0)).tolist()
        if want[-1] < (b + 1) * width:
            want.append((b + 1) * width)
    assert packed.segments.tolist() == want
    assert varlen_kwargs(model, packed)["max_length_q"] == packed.longest == int(lengths.max())
    assert varlen_kwargs(model, sample_rows(batch, idx, "cpu")) == {}  # a row per sample: sdpa
    assert_same_as_a_row_per_sample(model, batch, idx, packed, torch.cat(rows), 1.0)
    assert calls == [len(want) - 1] * model.config.num_hidden_layers  # the packed pass, each layer


def test_the_varlen_kernel_needs_a_cuda_gpu():
    assert not varlen_available("cpu")


@pytest.mark.skipif(not varlen_available("cuda" if torch.cuda.is_available() else "cpu"),
                    reason="torch's varlen kernel runs on a CUDA GPU (torch >= 2.10)")
def test_the_varlen_kernel_on_a_gpu_gives_a_row_per_sample_s_log_probs():
    torch.manual_seed(0)
    from transformers import Qwen2Config, Qwen2ForCausalLM

    model = Qwen2ForCausalLM(Qwen2Config(vocab_size=211, hidden_size=256, intermediate_size=512,
                                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                         tie_word_embeddings=True)).cuda().float()
    batch = _groups(prompts=3, n=4)
    idx = longest_first(batch, torch.arange(batch.size))
    (rows,) = packed_micro_batches(batch, idx, max_samples=batch.size)
    bf16 = functools.partial(torch.autocast, "cuda", dtype=torch.bfloat16)
    plain, _ = _forward_logprobs(model, sample_rows(batch, idx, "cuda"), 1.0, bf16)
    use_varlen_attention(model)
    packed = packed_rows(batch, rows, "cuda")
    lp, _ = _forward_logprobs(model, packed, 1.0, bf16)
    back = torch.argsort(torch.cat(rows))[torch.argsort(torch.argsort(idx))]
    lp = lp[back]
    lp.sum().backward()  # the kernel's backward runs
    assert torch.allclose(lp.float(), plain.float(), atol=0.05), float((lp - plain).abs().max())
