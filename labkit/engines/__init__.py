"""Rollout engines behind one interface (`base.Engine`): transformers, vLLM, a router over HTTP.

`make_engine(cfg, ...)` builds the one a run's config names.
"""

from __future__ import annotations

import torch

from labkit.config import ConfigError, RunConfig
from labkit.engines.base import Completion, Engine, Sampling
from labkit.models import default_device, pick_dtype


def resolve_engine(cfg: RunConfig) -> str:
    """The engine a colocated run uses: cfg.engine, with auto as vLLM on a GPU when it can be
    imported, else transformers ("hf")."""
    if cfg.engine != "auto":
        return cfg.engine
    import importlib.util

    return "vllm" if torch.cuda.is_available() and importlib.util.find_spec("vllm") else "hf"


def vllm_installed() -> bool:
    """Whether the vllm package is there to import (found, not imported: that takes seconds)."""
    import importlib.util

    return importlib.util.find_spec("vllm") is not None


def check_engine(cfg: RunConfig) -> None:
    """Refuse (ConfigError, one line) an engine this machine cannot start before anything
    loads: --engine vllm where vLLM is not installed (the run found out only after loading the
    policy, as an error it did not expect); --torch-compile where the transformers engine
    would generate through the compiled layers."""
    if cfg.rollout_mode == "colocate" and cfg.engine == "vllm" and not vllm_installed():
        from labkit.engines.vllm import INSTALL_HELP

        raise ConfigError(f"--engine vllm: {INSTALL_HELP}")
    if cfg.torch_compile and cfg.rollout_mode == "colocate" and resolve_engine(cfg) == "hf":
        raise ConfigError(
            "--torch-compile compiles the policy's layers for the update, and the transformers "
            "engine generates with those same layers (a recompilation for each new shape): use "
            "it with --engine vllm or --rollout-mode http")


# Flags only vLLM in the trainer's process reads: the transformers engine and the engines
# behind a router have no GPU share, KV cache or sleep mode of labkit's to set, seed the
# rollout once, and return every answer's log-probs.
VLLM_ONLY = ("rollout_gpu_memory_fraction", "rollout_kv_cache_gb", "rollout_sleep",
             "rollout_seed_each_answer", "rollout_logprob_prompts")


def ignored_engine_flags(cfg: RunConfig, explicit: set[str]) -> list[str]:
    """The vLLM-only flags among `explicit` (the fields the user set) that this run's engine
    ignores (transformers, or a router), as written on the command line."""
    given = [name for name in VLLM_ONLY if name in explicit]
    if not given or (cfg.rollout_mode != "http" and resolve_engine(cfg) == "vllm"):
        return []
    return [("--no-" if getattr(cfg, name) is False else "--") + name.replace("_", "-")
            for name in given]


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
            vocab_size=getattr(policy.config, "vocab_size", None),
            sync_check=cfg.http_sync_check)
        engine.update_weights(policy)  # the engines may have started from other weights
        return engine
    name = resolve_engine(cfg)
    if name == "vllm":
        from labkit.engines.vllm import VLLMEngine

        # prompt + answer: GSM8K chat prompts stay well under 1024 tokens
        return VLLMEngine(path, dtype=cfg.dtype, gpu_memory_fraction=cfg.rollout_gpu_memory_fraction,
                          seed=cfg.seed, max_model_len=cfg.rollout_max_response_len + 1024,
                          kv_cache_gb=cfg.rollout_kv_cache_gb,
                          # overlapped, the engine writes while the update runs: no sleep then
                          enable_sleep_mode=None if cfg.rollout_sleep and not cfg.overlap_rollout
                          else False)
    from labkit.engines.hf import HFEngine

    return HFEngine(policy, tokenizer)


__all__ = ["Completion", "Engine", "Sampling", "check_engine", "ignored_engine_flags",
           "make_engine", "resolve_engine", "vllm_installed"]
