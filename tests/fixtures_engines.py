"""Helpers shared by the engine, serve and HTTP tests: is a router installed, a trainer-like
update, a stand-in for vLLM with weights of its own."""

from __future__ import annotations

import copy

import pytest
import torch

from labkit.engines.hf import HFEngine
from labkit.serving.cluster import router_binary
from labkit.serving.processes import ServeError


def have_router(name: str = "vllm-router") -> bool:
    try:
        router_binary(name)
        return True
    except ServeError:
        return False


needs_router = pytest.mark.skipif(not have_router(), reason="vllm-router is not installed")


@torch.no_grad()
def perturb_like_an_update(model: torch.nn.Module, seed: int = 0, scale: float = 0.02) -> None:
    """Noise on the embedding (tied to the LM head on SmolLM2) and on one block, in place:
    enough to move every log-prob, as a training step would."""
    gen = torch.Generator().manual_seed(seed)
    for name, p in model.named_parameters():
        if "embed_tokens" in name or ".layers.5." in name:
            p.add_(torch.randn(p.shape, generator=gen) * scale)


class Served(HFEngine):
    """A stand-in for vLLM: its own copy of the weights, updated only by update_weights.
    `events` records each call with a fingerprint of the weights the engine holds."""

    name = "vllm"
    built = 0

    def __init__(self, policy, tokenizer):
        super().__init__(copy.deepcopy(policy), tokenizer)
        self.events = []
        Served.built += 1

    def fingerprint(self) -> float:
        return round(float(sum(p.detach().double().sum() for p in self.model.parameters())), 9)

    def generate(self, prompt_ids, sampling, between_batches=None):
        self.events.append(("generate", self.fingerprint()))
        return super().generate(prompt_ids, sampling, between_batches)

    def update_weights(self, model):
        super().update_weights(model)
        self.events.append(("update", self.fingerprint()))


@pytest.fixture()
def served(monkeypatch):
    """Runs get Served engines (made through labkit.session, so they can be kept); returns
    the list of engines made."""
    import labkit.engines
    import labkit.session

    made = []

    def make(cfg, path, policy, tokenizer):
        made.append(Served(policy, tokenizer))
        return made[-1]

    monkeypatch.setattr(labkit.session, "make_engine", make)
    monkeypatch.setattr(labkit.session, "resolve_engine", lambda cfg: "vllm")
    monkeypatch.setattr(labkit.engines, "vllm_installed", lambda: True)  # it stands for one
    return made
