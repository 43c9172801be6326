"""Rollout engines behind one interface (`base.Engine`): transformers, vLLM, a router over HTTP."""

from labkit.engines.base import Completion, Engine, Sampling

__all__ = ["Completion", "Engine", "Sampling"]
