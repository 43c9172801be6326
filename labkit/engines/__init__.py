"""Rollout engines behind one interface (`base.Engine`): transformers (`hf`) and vLLM (`vllm`)."""

from labkit.engines.base import Completion, Engine, Sampling

__all__ = ["Completion", "Engine", "Sampling"]
