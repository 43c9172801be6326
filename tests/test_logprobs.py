"""The lean update's log-probs: the same loss and gradients as the full-logits path.

The reference below is the update as it was before the chunked head: prompts left-padded,
answers right-padded, an attention mask, the model's full logits of the answer part, then
log-softmax and entropy over the whole vocabulary. The new path (right-padded rows, no mask,
only the answers' hidden states through the head, a chunk at a time) must give the same
loss and the same gradient of every weight, in float32, to 1e-5 relative.
"""

from __future__ import annotations

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from labkit.actor import _forward_logprobs
from labkit.grpo import policy_loss, token_entropy, token_logprobs
from labkit.logprobs import chunk_tokens, chunked_logprobs, lm_head_weight
from labkit.packing import pack_rollout, sample_rows


def _model(tied: bool = True, seed: int = 0) -> Qwen2ForCausalLM:
    """A tiny Qwen2 (the recipe's family: tied head, no bias on it), float32."""
    torch.manual_seed(seed)
    cfg = Qwen2Config(vocab_size=211, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                      tie_word_embeddings=tied)
    return Qwen2ForCausalLM(cfg).float().eval()


def _batch(samples: int = 7, seed: int = 1):
    """Prompts of 2-9 tokens; answers of 0-12 tokens (one empty, one of a single token)."""
    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(1, 211, (int(torch.randint(2, 10, (1,), generator=g)),), generator=g).tolist()
               for _ in range(samples)]
    answers = [torch.randint(1, 211, (int(torch.randint(2, 13, (1,), generator=g)),), generator=g).tolist()
               for _ in range(samples)]
    answers[1], answers[3] = [], [7]
    return pack_rollout(prompts, answers, torch.randn(samples, generator=g), [None] * samples, 0)


def _reference(model, batch, idx, temperature):
    """The full-logits path on the packed (left-padded prompt) layout."""
    attn = batch.attention_mask[idx]
    rmask = batch.response_mask[idx]
    p = batch.prompt_width
    first = int(attn[:, :p].float().argmax(dim=1).min())
    r = int(rmask.sum(dim=1).max().clamp(min=1))
    ids, attn = batch.input_ids[idx, first : p + r], attn[:, first : p + r]
    pos = (attn.cumsum(dim=1) - 1).clamp(min=0)
    logits = model(input_ids=ids, attention_mask=attn, position_ids=pos, logits_to_keep=r + 1).logits[:, :-1]
    return token_logprobs(logits, ids[:, -r:], temperature), token_entropy(logits, temperature), rmask[:, :r]


def _loss_and_grads(model, lp, ent, rmask, adv, entropy_coef):
    terms = policy_loss(lp, lp.detach() - 0.05 * rmask, adv, rmask, denominator=rmask.sum().clamp(min=1),
                        entropy=ent, entropy_coef=entropy_coef)
    model.zero_grad(set_to_none=True)
    terms.loss.backward()
    return terms.loss.detach(), {n: p.grad.detach().clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("temperature,entropy_coef", [(1.0, 0.0), (0.7, 0.0), (1.0, 0.01)])
def test_chunked_path_gives_the_full_logits_loss_and_gradients(temperature, entropy_coef):
    model, batch = _model(), _batch()
    idx = torch.arange(batch.size)
    adv = batch.advantages[idx]

    lp, ent, rmask = _reference(model, batch, idx, temperature)
    want_loss, want = _loss_and_grads(model, lp, ent, rmask, adv, entropy_coef)

    rows = sample_rows(batch, idx, torch.device("cpu"))
    lp2, ent2 = _forward_logprobs(model, rows, temperature, lambda: torch.autocast("cpu", enabled=False),
                                  entropy="loss")
    assert torch.equal(rows.rmask, rmask)
    assert torch.allclose(lp2 * rmask, lp * rmask, rtol=1e-5, atol=1e-6)
    assert torch.allclose(ent2 * rmask, ent * rmask, rtol=1e-5, atol=1e-6)
    got_loss, got = _loss_and_grads(model, lp2, ent2, rows.rmask, adv, entropy_coef)

    assert torch.allclose(got_loss, want_loss, rtol=1e-5, atol=1e-7)
    for name, g in want.items():
        scale = float(g.abs().max()) + 1e-12
        assert float((got[name] - g).abs().max()) / scale <= 1e-5, name


def test_masked_and_empty_answers_get_no_gradient_from_their_padding():
    model, batch = _model(), _batch()
    rows = sample_rows(batch, torch.tensor([1]), torch.device("cpu"))  # the empty answer alone
    lp, _ = _forward_logprobs(model, rows, 1.0, lambda: torch.autocast("cpu", enabled=False))
    assert rows.sample.numel() == 0 and float(lp.detach().abs().sum()) == 0.0
    (lp.sum()).backward()  # a graph with no answer tokens still backpropagates (to zeros)
    assert all(p.grad is None or float(p.grad.abs().sum()) == 0.0 for p in model.parameters())


@pytest.mark.parametrize("chunk", [1, 3, 5, 1000])
def test_any_chunk_size_gives_the_same_values_and_gradients(chunk):
    torch.manual_seed(0)
    hidden = torch.randn(11, 8, requires_grad=True)
    weight = torch.randn(29, 8, requires_grad=True)
    tokens = torch.randint(0, 29, (11,))
    lp, ent = chunked_logprobs(hidden, weight, tokens, temperature=0.8, chunk=chunk)
    logits = hidden @ weight.t()
    want_lp = token_logprobs(logits, tokens, 0.8)
    want_ent = token_entropy(logits, 0.8)
    assert torch.allclose(lp, want_lp, atol=1e-5) and torch.allclose(ent, want_ent, atol=1e-5)
    # the hand-written backward, against autograd on the full logits
    gl, ge = torch.randn(11), torch.randn(11)
    got = torch.autograd.grad((lp * gl).sum() + (ent * ge).sum(), (hidden, weight))
    want = torch.autograd.grad((want_lp * gl).sum() + (want_ent * ge).sum(), (hidden, weight))
    for a, b in zip(got, want):
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-5)


def test_the_head_is_used_only_when_logits_are_hidden_times_weight():
    assert lm_head_weight(_model(tied=True)) is not None
    assert lm_head_weight(_model(tied=False)) is not None
    m = _model()
    m.config.final_logit_softcapping = 30.0  # a soft-capped head: the full-logits path
    assert lm_head_weight(m) is None
    assert chunk_tokens(151_936) == 883 and chunk_tokens(10) >= 1


def test_an_untouched_entropy_output_costs_no_gradient_work():
    hidden = torch.randn(4, 8, requires_grad=True)
    weight = torch.randn(16, 8, requires_grad=True)
    lp, ent = chunked_logprobs(hidden, weight, torch.tensor([1, 2, 3, 4]))
    (gh,) = torch.autograd.grad(lp.sum(), (hidden,))
    logits = hidden @ weight.t()
    (want,) = torch.autograd.grad(token_logprobs(logits, torch.tensor([1, 2, 3, 4])).sum(), (hidden,))
    assert torch.allclose(gh, want, atol=1e-6)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_entropy_and_logprobs_stay_float32_under_bf16_autocast(temperature):
    # A large vocabulary and spread-out logits, as the recipe's 151,936-word head has: under
    # autocast the products after the head (the entropy's sum of p * z) must not run in bf16.
    g = torch.Generator().manual_seed(0)
    vocab, width, n = 32_000, 64, 48
    hidden = torch.randn(n, width, generator=g)
    weight = torch.randn(vocab, width, generator=g) * 0.6
    tokens = torch.randint(0, vocab, (n,), generator=g)
    # The reference: the same bf16 head product, then float32 arithmetic throughout.
    z = (hidden.bfloat16() @ weight.bfloat16().t()).float() / temperature
    want_lp = torch.log_softmax(z, -1).gather(1, tokens[:, None]).squeeze(1)
    want_ent = -(torch.softmax(z, -1) * torch.log_softmax(z, -1)).sum(-1)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        lp, ent = chunked_logprobs(hidden, weight, tokens, temperature, chunk=20)
    assert lp.dtype == ent.dtype == torch.float32
    assert (ent >= 0).all()
    assert torch.allclose(ent, want_ent, atol=1e-3), float((ent - want_ent).abs().max())
    assert torch.allclose(lp, want_lp, atol=1e-3), float((lp - want_lp).abs().max())
