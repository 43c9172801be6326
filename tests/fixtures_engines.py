"""Helpers shared by the engine, serve and HTTP tests: is a router installed, a trainer-like update."""

from __future__ import annotations

import pytest
import torch

from labkit.serving.processes import ServeError
from labkit.serving.cluster import router_binary


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
