"""--torch-compile: each decoder layer of the policy compiled in place (nn.Module.compile,
dynamic shapes) keeps the parameters' names, so the weight sync and checkpoints are unchanged,
and gives the update the loss and gradients of the plain layers (to float rounding; here
on the CPU, where torch's inductor compiles with the C compiler). The transformers engine,
which would generate through the same layers, refuses it in one line."""

from __future__ import annotations

import contextlib
import copy

import pytest
import torch

from labkit.actor import train_on_rollout
from labkit.config import RunConfig, config_from_args
from labkit.models import compile_layers, disable_dropout
from labkit.packing import pack_rollout

VOCAB = 64


@pytest.fixture(autouse=True)
def fresh_dynamo():
    """Each test compiles afresh, and leaves no compiled code (or its guards) to the next."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def test_the_flag_reaches_the_config_and_off_is_the_default():
    assert config_from_args(["--torch-compile"], env={}).torch_compile is True
    assert config_from_args(["--no-torch-compile"], env={}).torch_compile is False
    assert config_from_args([], env={}).torch_compile is False
    assert RunConfig().torch_compile is False


def _llama(seed: int):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=256,
                      pad_token_id=0, tie_word_embeddings=False)
    return disable_dropout(LlamaForCausalLM(cfg).float())


def _rollout(seed: int = 1):
    """4 made-up prompts of 4-12 tokens with 4 answers of 1-16 tokens each."""
    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(1, VOCAB, (int(torch.randint(4, 13, (1,), generator=g)),), generator=g).tolist()
               for _ in range(4)]
    flat = [p for p in prompts for _ in range(4)]
    answers = [torch.randint(1, VOCAB, (int(torch.randint(1, 17, (1,), generator=g)),), generator=g).tolist()
               for _ in flat]
    return pack_rollout(flat, answers, torch.randn(len(flat), generator=g), [None] * len(flat), pad_id=0)


def _update(model, cfg):
    """The update's statistics and each parameter's gradient (an optimizer of lr 0 keeps the
    weights, and the gradients stay on the parameters after its step)."""
    stats = train_on_rollout(model, torch.optim.SGD(model.parameters(), lr=0.0), _rollout(), cfg,
                             generator=torch.Generator().manual_seed(0))
    return stats, {k: p.grad.detach().clone() for k, p in model.named_parameters()}


def test_compiled_layers_keep_the_names_and_give_the_update_of_the_plain_ones():
    cfg = RunConfig(rollout_batch_size=4, n_samples_per_prompt=4, global_batch_size=16,
                    max_tokens_per_gpu=128, rollout_temperature=1.0, entropy_coef=0.01)
    plain = _llama(seed=3)
    compiled = copy.deepcopy(plain)
    compile_layers(compiled)
    assert all(layer._compiled_call_impl is not None for layer in compiled.model.layers)
    assert compiled.lm_head._compiled_call_impl is None  # the head stays labkit's own
    assert [k for k, _ in compiled.named_parameters()] == [k for k, _ in plain.named_parameters()]
    assert compiled.state_dict().keys() == plain.state_dict().keys()
    ref_stats, ref_grads = _update(plain, cfg)
    stats, grads = _update(compiled, cfg)
    assert stats["train/micro_batches"] == ref_stats["train/micro_batches"] > 1  # several shapes
    for key in ("train/loss", "train/entropy", "train/grad_norm"):
        assert stats[key] == pytest.approx(ref_stats[key], rel=1e-4, abs=1e-6), key
    assert grads.keys() == ref_grads.keys()
    for k, ref in ref_grads.items():
        torch.testing.assert_close(grads[k], ref, rtol=1e-4, atol=1e-6, msg=k)


def test_the_transformers_engine_refuses_it_in_one_line_before_anything_loads(tiny_cfg):
    import labkit
    from labkit.config import ConfigError
    from labkit.session import load_inputs

    with pytest.raises(ConfigError, match="--torch-compile .* --engine vllm"):
        load_inputs(tiny_cfg.replace(torch_compile=True))
    with pytest.raises(ConfigError, match="--torch-compile"):
        labkit.launch(tiny_cfg.replace(torch_compile=True))
    load_inputs(tiny_cfg.replace(torch_compile=True, rollout_mode="http", router_url="http://127.0.0.1:9"))


def test_the_policy_is_loaded_with_its_layers_compiled(tiny_model_dir):
    from labkit.session import _load_policy

    cfg = RunConfig(model=str(tiny_model_dir), torch_compile=True)
    policy = _load_policy(cfg, str(tiny_model_dir), torch.device("cpu"), liger=False)
    assert all(layer._compiled_call_impl is not None for layer in policy.base_model.layers)
    plain = _load_policy(cfg.replace(torch_compile=False), str(tiny_model_dir), torch.device("cpu"), liger=False)
    assert all(layer._compiled_call_impl is None for layer in plain.base_model.layers)


def test_liger_kernels_are_refused_beside_it_in_one_line_and_auto_leaves_them_off(monkeypatch):
    """torch.compile cannot trace liger-kernel's RMSNorm (an H100 run failed at its first
    update): asked for together they are refused, and auto does not turn liger on."""
    from labkit import session
    from labkit.config import ConfigError

    with pytest.raises(ConfigError, match="--torch-compile with --use-liger-kernel"):
        config_from_args(["--torch-compile", "--use-liger-kernel"], env={})
    # a machine where liger-kernel would be taken: CUDA, installed, a family it patches
    monkeypatch.setattr(session, "liger_patches", lambda device: {"rms_norm": True})
    monkeypatch.setattr(session, "liger_family", lambda path, patches: True)
    shared = RunConfig(gradient_checkpointing=True)  # as a run that shares a GPU is set
    assert session.liger_kernels(shared, "cuda", "qwen") is True
    assert session.liger_kernels(shared.replace(torch_compile=True), "cuda", "qwen") is False


def test_a_pass_of_one_row_takes_the_compiled_layers_without_compiling_them_again():
    """torch.compile specializes a size of 1, so a step's last pass, when it holds one sample,
    would compile every layer again; it runs as two rows instead, and gives that sample the
    log-probs of the plain layers."""
    from torch._dynamo.utils import counters

    from labkit.actor import _forward_logprobs, mode
    from labkit.models import layers_compiled
    from labkit.packing import sample_rows

    plain = _llama(seed=3)
    compiled = copy.deepcopy(plain)
    compile_layers(compiled)
    assert layers_compiled(compiled) and not layers_compiled(plain)
    batch = _rollout()

    def forward(model, idx):
        with mode(model, training=True):
            rows = sample_rows(batch, torch.tensor(idx), "cpu")
            lp, _ = _forward_logprobs(model, rows, 1.0, contextlib.nullcontext)
        lp.sum().backward()
        return lp.detach()

    def graphs():  # the graphs torch.compile has made so far in this process
        return counters["stats"]["unique_graphs"]

    before = graphs()
    forward(compiled, [0, 5, 9])
    first = graphs()
    assert first > before  # the layers compiled at their first pass
    one = forward(compiled, [7])
    assert graphs() == first  # and not again for one row
    forward(compiled, [2, 3])
    assert graphs() == first
    torch.testing.assert_close(one, forward(plain, [7]), rtol=1e-4, atol=1e-6)
