"""The transformers engine reads the prefix a batch's prompts share once: the same answers,
the same log-probs, as reading every prompt whole."""

from __future__ import annotations

import pytest
import torch

from labkit import data as datamod
from labkit.engines import hf
from labkit.engines.base import Sampling
from labkit.engines.hf import HFEngine, shared_prefix


def test_the_shared_prefix_leaves_each_prompt_a_token_of_its_own():
    long = list(range(100))
    assert shared_prefix([long + [1, 2], long + [3]]) == 100
    assert shared_prefix([long, long + [7]]) == 99  # the shorter prompt keeps its last token
    assert shared_prefix([long[:20] + [1], long[:20] + [2]]) == 0  # too short to be worth it
    assert shared_prefix([long + [1]]) == 0  # one prompt: nothing to share
    assert shared_prefix([[5] + long, long]) == 0


def test_the_layout_puts_the_padding_after_the_prefix_and_keeps_each_row_s_positions():
    ids, attn = hf._layout([[9, 9, 1, 2, 3], [9, 9, 4]], 2, pad=0)
    assert ids.tolist() == [[9, 9, 1, 2, 3], [9, 9, 0, 0, 4]]
    assert attn.tolist() == [[1, 1, 1, 1, 1], [1, 1, 0, 0, 1]]
    ids, attn = hf._layout([[1, 2, 3], [4]], 0, pad=0)
    assert ids.tolist() == [[1, 2, 3], [0, 0, 4]] and attn.tolist() == [[1, 1, 1], [0, 0, 1]]


@pytest.fixture()
def engine_and_prompts(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    from labkit.models import load_tokenizer

    tok = load_tokenizer(str(tiny_model_dir))
    engine = HFEngine(AutoModelForCausalLM.from_pretrained(tiny_model_dir), tok)
    problems = datamod.synthetic_problems(6, 0, seed=3)
    prompts = [datamod.prompt_token_ids(tok, p.question, 2) for p in problems]
    assert shared_prefix(prompts) > 100  # the instructions and two worked examples
    return engine, prompts


@pytest.mark.parametrize("temperature", [0.0, 1.0], ids=["greedy", "sampled"])
def test_reading_the_shared_prefix_once_changes_no_answer(engine_and_prompts, monkeypatch,
                                                          temperature):
    engine, prompts = engine_and_prompts
    sampling = Sampling(n=2, temperature=temperature, max_tokens=12, seed=11,
                        stop_token_ids=(engine.tokenizer.eos_token_id,))
    once = engine.generate(prompts, sampling)
    monkeypatch.setattr(hf, "SHARED_PREFIX_MIN", 10**9)  # every prompt read whole
    whole = engine.generate(prompts, sampling)
    for a, b in zip((c for g in once for c in g), (c for g in whole for c in g)):
        assert a.token_ids == b.token_ids and a.text == b.text
        if temperature:
            assert torch.allclose(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-4)
