"""Rollout engines behind one interface (`base.Engine`): transformers, vLLM, a router over HTTP.

`make_engine(cfg, ...)` builds the one a run's config names.
"""

from __future__ import annotations

import torch

from labkit.config import RunConfig
from labkit.engines.base import Completion, Engine, Sampling
from labkit.models import default_device, pick_dtype


def make_engine(cfg: RunConfig, path: str, policy, tokenizer) -> Engine:
    """The engine cfg.engine names (auto: vLLM on a GPU when importable, else transformers),
    or with --rollout-mode http the engines behind --router-url, given the policy's weights."""
    if cfg.rollout_mode == "http":
        from labkit.engines.http import HttpEngine
        from labkit.serving.client import RetryPolicy
        from labkit.serving.watchdog import Watchdog

        retry = RetryPolicy(deadline_s=min(RetryPolicy.deadline_s, cfg.request_timeout),
                            request_timeout_s=cfg.request_timeout)
        engine = HttpEngine(
            cfg.router_url, max_open_requests=cfg.max_open_requests, tokenizer=tokenizer,
            watchdog=Watchdog(open_limit=cfg.max_open_requests),  # reports bursts, keeps going
            sync_dtype=pick_dtype(cfg.dtype, default_device()), retry=retry,
            vocab_size=getattr(policy.config, "vocab_size", None))
        engine.update_weights(policy)  # the engines may have started from other weights
        return engine
    name = cfg.engine
    if name == "auto":
        import importlib.util

        name = "vllm" if torch.cuda.is_available() and importlib.util.find_spec("vllm") else "hf"
    if name == "vllm":
        from labkit.engines.vllm import VLLMEngine

        # prompt + answer: GSM8K chat prompts stay well under 1024 tokens
        return VLLMEngine(path, dtype=cfg.dtype, gpu_memory_fraction=cfg.rollout_gpu_memory_fraction,
                          seed=cfg.seed, max_model_len=cfg.rollout_max_response_len + 1024,
                          kv_cache_gb=cfg.rollout_kv_cache_gb,
                          enable_sleep_mode=None if cfg.rollout_sleep else False)
    from labkit.engines.hf import HFEngine

    return HFEngine(policy, tokenizer)


__all__ = ["Completion", "Engine", "Sampling", "make_engine"]
