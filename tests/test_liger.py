"""--use-liger-kernel: liger-kernel's RMSNorm, SwiGLU and rotary kernels in the policy give
the update the loss and gradients of transformers' own layers (to bf16 rounding), on a GPU;
where they cannot run (no GPU, liger-kernel missing) the run is refused in one line before
a model loads."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from labkit.actor import train_on_rollout
from labkit.config import RunConfig
from labkit.errors import ConfigError
from labkit.models import disable_dropout, enable_checkpointing, liger_patches, use_liger_kernels
from labkit.packing import pack_rollout


def test_a_run_without_a_gpu_is_refused_before_its_model_loads(tiny_cfg, monkeypatch):
    import labkit.session

    loaded = []
    monkeypatch.setattr(labkit.session, "_load_policy", lambda *a: loaded.append(a))
    monkeypatch.setattr(labkit.session, "default_device", lambda: torch.device("cpu"))
    with pytest.raises(ConfigError, match="--use-liger-kernel needs a CUDA GPU"):
        labkit.launch(tiny_cfg.replace(use_liger_kernel=True))
    assert loaded == []
    assert not (Path(tiny_cfg.output_dir) / tiny_cfg.run_name).exists()


def test_without_liger_kernel_installed_the_line_says_how_to_get_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "liger_kernel.transformers.monkey_patch", None)  # import fails
    with pytest.raises(ConfigError, match="pip install liger-kernel"):
        liger_patches(torch.device("cuda"))


def test_the_flag_reaches_the_config_and_auto_is_the_default():
    from labkit.config import config_from_args

    assert config_from_args(["--use-liger-kernel"], env={}).use_liger_kernel is True
    assert config_from_args(["--no-use-liger-kernel"], env={}).use_liger_kernel is False
    assert RunConfig().use_liger_kernel is None


@pytest.mark.parametrize(("flag", "checkpointed", "on"), [
    (None, True, True), (None, False, False), (None, None, False), (False, True, False), (True, False, True)])
def test_auto_takes_the_kernels_where_the_update_checkpoints(flag, checkpointed, on, monkeypatch):
    import labkit.session

    monkeypatch.setattr(labkit.session, "liger_patches", lambda device: {"qwen2": None})  # as if they could run
    monkeypatch.setattr(labkit.session, "liger_family", lambda path, patches: "qwen2" in patches)
    cfg = RunConfig(use_liger_kernel=flag, gradient_checkpointing=checkpointed)
    assert labkit.session.liger_kernels(cfg, torch.device("cuda"), "a-qwen2-folder") is on


def test_auto_leaves_out_a_model_family_liger_kernel_has_no_kernels_for(tiny_model_dir, monkeypatch):
    import labkit.session

    monkeypatch.setattr(labkit.session, "liger_patches", lambda device: {"qwen2": None})
    cfg = RunConfig(gradient_checkpointing=True)
    assert labkit.session.liger_kernels(cfg, torch.device("cuda"), str(tiny_model_dir)) is False  # a llama


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CPU machine: auto finds no GPU")
def test_auto_without_a_gpu_runs_without_them_and_the_folder_says_so(tiny_cfg):
    import labkit

    run = labkit.launch(tiny_cfg.replace(gradient_checkpointing=True, num_rollout=1))
    labkit.close()
    assert run.status["reason"] == "completed"
    assert run.config["use_liger_kernel"] is False and run.config["gradient_checkpointing"] is True


def _liger_ready() -> bool:
    if not torch.cuda.is_available():
        return False
    try:
        liger_patches(torch.device("cuda"))
    except ConfigError:
        return False
    return True


def _qwen2(seed: int):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen2Config(vocab_size=1024, hidden_size=128, intermediate_size=352, num_hidden_layers=3,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                      rope_theta=1_000_000.0, rms_norm_eps=1e-6, tie_word_embeddings=True)
    with torch.device("cuda"):
        return disable_dropout(Qwen2ForCausalLM(cfg).float())


def _rollout(seed: int = 1):
    """8 made-up prompts of 20-60 tokens with 4 answers of 1-120 tokens each."""
    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(1, 1024, (int(torch.randint(20, 61, (1,), generator=g)),), generator=g).tolist()
               for _ in range(8)]
    flat = [p for p in prompts for _ in range(4)]
    answers = [torch.randint(1, 1024, (int(torch.randint(1, 121, (1,), generator=g)),), generator=g).tolist()
               for _ in flat]
    return pack_rollout(flat, answers, torch.randn(len(flat), generator=g), [None] * len(flat), pad_id=0)


def _update(model, cfg):
    """The update's loss, entropy and each parameter's gradient (an optimizer of lr 0 keeps
    the weights, and the gradients stay on the parameters after its step)."""
    stats = train_on_rollout(model, torch.optim.SGD(model.parameters(), lr=0.0), _rollout(), cfg,
                             generator=torch.Generator().manual_seed(0),
                             autocast=lambda: torch.autocast("cuda", dtype=torch.bfloat16))
    return stats, {k: p.grad.detach().float().clone() for k, p in model.named_parameters()}


@pytest.mark.skipif(not _liger_ready(), reason="needs a CUDA GPU and liger-kernel")
@pytest.mark.parametrize("checkpointed", [False, True])
def test_the_update_with_liger_kernels_is_the_update_without(checkpointed, monkeypatch):
    from transformers.models.qwen2 import modeling_qwen2

    for name in ("apply_rotary_pos_emb", "Qwen2RMSNorm", "Qwen2MLP"):  # liger swaps them process-wide
        monkeypatch.setattr(modeling_qwen2, name, getattr(modeling_qwen2, name))
    cfg = RunConfig(rollout_batch_size=8, n_samples_per_prompt=4, global_batch_size=32,
                    max_tokens_per_gpu=1024, rollout_temperature=1.0, entropy_coef=0.01)
    model = _qwen2(seed=3)
    if checkpointed:
        enable_checkpointing(model)
    ref_stats, ref_grads = _update(model, cfg)
    use_liger_kernels(model)
    assert model.model.layers[0].mlp._get_name() == "LigerSwiGLUMLP"  # the kernels are in
    stats, grads = _update(model, cfg)
    assert stats["train/micro_batches"] == ref_stats["train/micro_batches"] > 1
    for key in ("train/loss", "train/entropy", "train/grad_norm"):
        assert stats[key] == pytest.approx(ref_stats[key], rel=2e-2, abs=1e-4), key
    for k, ref in ref_grads.items():
        got = grads[k]
        cos = torch.nn.functional.cosine_similarity(got.flatten(), ref.flatten(), dim=0)
        assert cos > 0.995, (k, float(cos))
        assert float(got.norm()) == pytest.approx(float(ref.norm()), rel=3e-2), k
