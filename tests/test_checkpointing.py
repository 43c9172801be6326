"""--gradient-checkpointing checkpoints: the update runs in train mode, where transformers
recomputes each layer's activations in the backward pass instead of saving them.

The check goes through the public API: every tensor autograd saves for the backward pass
during a whole `labkit.launch` is counted by a saved-tensors hook, with and without the flag.
"""

from __future__ import annotations

import torch
from conftest import build_tiny_model

import labkit
from labkit.actor import mode
from labkit.models import disable_dropout


def _saved_bytes(cfg) -> int:
    """Bytes of the tensors autograd saved during the run (a pack hook sees each one)."""
    total = 0

    def pack(t: torch.Tensor):
        nonlocal total
        total += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        run = labkit.launch(cfg)
    labkit.close()
    assert run.status["reason"] == "completed"
    return total


def test_the_flag_cuts_what_the_update_saves_for_its_backward_pass(tiny_cfg, tmp_path):
    model = build_tiny_model(tmp_path / "model", layers=4, hidden=64)
    cfg = tiny_cfg.replace(model=str(model), num_rollout=1, micro_batch_size=8)
    plain = _saved_bytes(cfg.replace(run_name="plain", gradient_checkpointing=False))
    checkpointed = _saved_bytes(cfg.replace(run_name="checkpointed", gradient_checkpointing=True))
    # 4 layers: the layers' inputs are kept, what is inside them is recomputed (6.6% measured).
    assert checkpointed < 0.25 * plain, (checkpointed, plain)


def test_the_update_trains_in_train_mode_and_gives_the_mode_back(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    assert not model.training  # from_pretrained's mode: transformers would not checkpoint
    with mode(model, training=True):
        assert all(m.training for m in model.modules())
    assert not any(m.training for m in model.modules())


def test_dropout_is_off_so_train_mode_changes_no_log_prob(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, attention_dropout=0.5)
    ids = torch.arange(3, 40)[None]
    with mode(model, training=True), torch.no_grad():
        noisy = model(input_ids=ids).logits
    assert not torch.allclose(noisy, model(input_ids=ids).logits)  # dropout on: masks sampled
    disable_dropout(model)
    with torch.no_grad():
        want = model(input_ids=ids).logits
        with mode(model, training=True):
            assert torch.equal(model(input_ids=ids).logits, want)


def test_a_run_alone_records_auto_checkpointing_as_off(tiny_cfg):
    run = labkit.launch(tiny_cfg.replace(num_rollout=1))
    assert tiny_cfg.gradient_checkpointing is None  # the default: auto
    assert run.config["gradient_checkpointing"] is False
