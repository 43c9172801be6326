"""The shared-prompt layout: a group's answers after one copy of their prompt give the same
log-probs, loss and gradients as one row per sample, in fewer tokens, and every sample is
in exactly one pass; the whole update in either of the other layouts (shared prompts, or
samples back to back: tests/test_padding_free.py) is the update with a row per sample."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from labkit.actor import _forward_logprobs, make_optimizer, train_on_rollout
from labkit.config import RunConfig
from labkit.errors import ConfigError
from labkit.grpo import policy_loss
from labkit.packing import (
    longest_first,
    micro_batches,
    pack_rollout,
    sample_rows,
    shared_micro_batches,
    shared_prompt_rows,
)

NO_AUTOCAST = staticmethod(lambda: torch.autocast("cpu", enabled=False))


def _model(kind: str = "qwen2", attn: str = "sdpa", seed: int = 0):
    """A tiny Qwen2 (the recipe's family) or Llama (SmolLM2's), float32."""
    torch.manual_seed(seed)
    dims = dict(vocab_size=211, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    if kind == "llama":
        model = LlamaForCausalLM(LlamaConfig(**dims, tie_word_embeddings=True))
    else:
        model = Qwen2ForCausalLM(Qwen2Config(**dims, tie_word_embeddings=True))
    model.config._attn_implementation = attn
    return model.float().eval()


def _groups(prompts: int = 3, n: int = 4, seed: int = 1):
    """`prompts` made-up prompts of 5-20 tokens, each with `n` answers of 0-12 tokens (one
    empty, one of a single token), in the trainer's order: a group's answers together."""
    g = torch.Generator().manual_seed(seed)
    ps = [torch.randint(1, 211, (int(torch.randint(5, 21, (1,), generator=g)),), generator=g).tolist()
          for _ in range(prompts)]
    answers = [torch.randint(1, 211, (int(torch.randint(2, 13, (1,), generator=g)),), generator=g).tolist()
               for _ in range(prompts * n)]
    answers[1], answers[n + 2] = [], [7]
    flat = [p for p in ps for _ in range(n)]
    return pack_rollout(flat, answers, torch.randn(prompts * n, generator=g), [None] * len(flat), 0)


def _loss_and_grads(model, lp, ent, rmask, adv):
    terms = policy_loss(lp, lp.detach() - 0.05 * rmask, adv, rmask, denominator=rmask.sum().clamp(min=1),
                        entropy=ent, entropy_coef=0.01)
    model.zero_grad(set_to_none=True)
    terms.loss.backward()
    return terms.loss.detach(), {k: p.grad.detach().clone() for k, p in model.named_parameters()}


def test_a_rollout_s_groups_get_one_prompt_index_each():
    batch = _groups(prompts=3, n=4)
    assert batch.prompt_index.tolist() == [0] * 4 + [1] * 4 + [2] * 4


def assert_same_as_a_row_per_sample(model, batch, idx, layout, order, temperature):
    """The pass `layout` (a Rows of the samples `order`) gives the log-probs, entropies, loss
    and gradients of one row per sample of `idx`; returns that row-per-sample pass."""
    adv = batch.advantages[idx]
    per_sample = sample_rows(batch, idx, "cpu")
    lp, ent = _forward_logprobs(model, per_sample, temperature, NO_AUTOCAST, entropy="loss")
    want_loss, want = _loss_and_grads(model, lp, ent, per_sample.rmask, adv)
    lp2, ent2 = _forward_logprobs(model, layout, temperature, NO_AUTOCAST, entropy="loss")
    back = torch.argsort(order)[torch.argsort(torch.argsort(idx))]  # layout order -> idx order
    lp2, ent2, rmask2 = lp2[back], ent2[back], layout.rmask[back]
    assert torch.equal(rmask2, per_sample.rmask)
    assert torch.allclose(lp2, lp, rtol=1e-5, atol=1e-5)
    assert torch.allclose(ent2, ent, rtol=1e-5, atol=1e-5)
    got_loss, got = _loss_and_grads(model, lp2, ent2, rmask2, adv)
    assert torch.allclose(got_loss, want_loss, rtol=1e-5, atol=1e-7)
    for name, g in want.items():
        scale = float(g.abs().max()) + 1e-12
        assert float((got[name] - g).abs().max()) / scale <= 1e-4, name
    return per_sample


@pytest.mark.parametrize("kind,attn", [("qwen2", "sdpa"), ("qwen2", "eager"), ("llama", "sdpa")])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_shared_prompt_rows_give_the_same_loss_and_gradients_as_a_row_per_sample(kind, attn, temperature):
    model, batch = _model(kind, attn), _groups()
    idx = longest_first(batch, torch.arange(batch.size))
    rows = shared_micro_batches(batch, idx, max_samples=batch.size)
    assert len(rows) == 1 and len(rows[0]) == 3  # one pass, a row per prompt
    shared = shared_prompt_rows(batch, rows[0], "cpu")
    per_sample = assert_same_as_a_row_per_sample(model, batch, idx, shared, torch.cat(rows[0]), temperature)
    # the prompt went through the model once per group, not once per answer
    prompt_tokens = batch.attention_mask[:, : batch.prompt_width].sum(dim=1)
    answer_tokens = int(batch.response_mask.sum())
    assert shared.real == int(prompt_tokens[[0, 4, 8]].sum()) + answer_tokens
    assert per_sample.real == int(prompt_tokens.sum()) + answer_tokens


@pytest.mark.parametrize("max_tokens", [None, 40, 60, 10_000])
@pytest.mark.parametrize("max_samples", [2, 5, 12])
def test_every_sample_is_in_one_shared_pass_within_the_budget(max_tokens, max_samples):
    batch = _groups(prompts=4, n=5, seed=3)
    idx = longest_first(batch, torch.randperm(batch.size, generator=torch.Generator().manual_seed(0)))
    passes = shared_micro_batches(batch, idx, max_samples=max_samples, max_tokens=max_tokens)
    seen = torch.cat([torch.cat(p) for p in passes])
    assert sorted(seen.tolist()) == sorted(idx.tolist())
    for p in passes:
        rows = shared_prompt_rows(batch, p, "cpu")
        for row in p:
            assert len(set(batch.prompt_index[row].tolist())) == 1  # one prompt a row
        if max_tokens is None:
            assert sum(len(r) for r in p) <= max_samples or len(p) == 1
        elif rows.ids.numel() > max_tokens:  # only a row too wide for the budget goes alone
            assert len(p) == 1 and len(p[0]) == 1


@pytest.mark.parametrize("layout", ["share_prompt", "padding_free"])
@pytest.mark.parametrize("dynamic", [True, False])
def test_the_update_in_either_layout_is_the_update_with_a_row_per_sample(layout, dynamic):
    cfg = RunConfig(rollout_batch_size=3, n_samples_per_prompt=4, global_batch_size=12, micro_batch_size=5,
                    use_dynamic_batch_size=dynamic, max_tokens_per_gpu=64, lr=1e-3, rollout_temperature=1.0)
    results = []
    for on in (False, True):
        model, batch = _model(seed=2), _groups()
        stats = train_on_rollout(model, make_optimizer(model, cfg), batch, cfg.replace(**{layout: on}),
                                 generator=torch.Generator().manual_seed(1))
        results.append((model, batch.old_logprobs, stats))
    (a, old_a, sa), (b, old_b, sb) = results
    assert torch.allclose(old_a, old_b, atol=1e-5)
    assert abs(sa["train/loss"] - sb["train/loss"]) < 1e-5
    assert abs(sa["train/grad_norm"] - sb["train/grad_norm"]) < 1e-4 * max(1.0, sa["train/grad_norm"])
    moved = max(float((p - q).detach().abs().max()) for p, q in zip(a.parameters(), _model(seed=2).parameters()))
    diff = max(float((p - q).detach().abs().max()) for p, q in zip(a.parameters(), b.parameters()))
    assert moved > 1e-4 and diff < 1e-3 * moved
    if layout == "share_prompt":
        assert sb["train/micro_batches"] <= sa["train/micro_batches"]
    else:  # a fixed micro-batch holds samples of like lengths, two of which rarely fit one row
        packed, plain = sb["train/padding_frac"], sa["train/padding_frac"]
        assert packed < plain if dynamic else packed <= plain


def test_shared_prompts_need_an_attention_that_takes_a_mask():
    model, batch = _model(attn="flash_attention_2"), _groups()
    rows = shared_prompt_rows(batch, shared_micro_batches(batch, torch.arange(batch.size),
                                                          max_samples=batch.size)[0], "cpu")
    with pytest.raises(ConfigError, match="--share-prompt needs sdpa or eager"):
        _forward_logprobs(model, rows, 1.0, NO_AUTOCAST)


def test_micro_batches_of_a_row_per_sample_are_as_before():
    batch = _groups(prompts=2, n=3)
    lengths = batch.attention_mask.sum(dim=1)
    idx = longest_first(batch, torch.arange(batch.size))
    for mb in micro_batches(batch, idx, max_samples=8, max_tokens=50):
        assert len(mb) == 1 or len(mb) * int(lengths[mb].max()) <= 50
