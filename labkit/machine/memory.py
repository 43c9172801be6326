"""What one run holds of a GPU, from its config: the plan that lets several runs share a card.

Why: four recipe runs started on one H200 died of out-of-memory in their first update,
because nothing said beforehand what each would take. A run's GPU memory has four parts,
each set by the config and the model's size:

* `context`: the CUDA context and the libraries' workspaces of one process;
* `trainer`: float32 master weights, their gradients and AdamW's two moments (16 bytes a
  parameter), and autocast's bfloat16 copy of the weights (2 more);
* `update`: one micro-batch's activations, which grow with `--max-tokens-per-gpu` (the
  bytes per token of the model's layers), the LM head's chunks (labkit.logprobs), and what
  torch's caching allocator keeps reserved beside them;
* `engine`: vLLM's bfloat16 weights, its KV cache (`--rollout-kv-cache-gb`; where the
  config gives none, what the run's rollout needs: `kv_cache_gib`), and its own buffers
  (CUDA graphs, sampling).

Runs of different sizes need different shares: a rollout of 32 x 16 answers holds 512
sequences in the KV cache, one of 32 x 4 a quarter of that. A shared GPU's engines get a
KV cache sized to their rollout (every sequence at its longest: 7.5 GiB for 32 x 16 of up
to 1,024 tokens on Qwen2.5-0.5B, 4 for 32 x 8, 2 for 32 x 4) instead of 8 GiB each, so
the small runs leave room for one more. (Larger passes for the larger runs were not worth
their memory: the checkpointed update of 256 answers took 2.28 s at 24,576 tokens a pass
and 2.56 s at 49,152.)

The figures are measured (BENCHMARKS.md, "The update's memory, alone and side by side"):
whole-process memory (nvidia-smi) of the update of the recipe's Qwen2.5-0.5B on an H200,
with torch's caching allocator as a run has it, at several token budgets, with and without
gradient checkpointing; they are scaled by the model's shape for another one. What the
caching allocator keeps reserved counts: at 12,288 tokens it held 41.8 GiB for 28.8 GiB of
tensors, and four such processes did not fit on the card; checkpointed, the process held
13.5 GiB at 12,288 tokens, 14.8 at 24,576 and 20.4 at 49,152. The engine's buffers are an
estimate, set so that the plan of one run set as a shared run (checkpointed at 24,576 tokens,
an 8 GiB KV cache) is 28.4 GiB of the recipe's model, 7% above the 26.6 GiB its whole
process held alone (four such runs held 96.7 GiB of the card together, 24.2 a run); before,
the plan said 29.8 and fitted four runs where five fit.
`share_gpu` picks what lets N runs share a card (checkpointing, then the token budget),
`plan_runs` refuses, in one line, a set of runs that does not fit in the free memory, and
`fit_max_tokens` gives the largest token budget per micro-batch that fits. `gpu_count` and
`gpu_free_gib` ask the driver (NVML, else nvidia-smi) what labkit.machine.placement shares out.
"""

from __future__ import annotations

import math
import shutil
import subprocess
from dataclasses import dataclass

from labkit.errors import LabkitError

GIB = 2**30
# Measured on an H200 (BENCHMARKS.md): one process's CUDA context and workspaces (0.74 GiB);
# what torch reserves per padded token of a micro-batch, per layer and hidden unit (41.85 GiB
# at 12,288 tokens, 68.07 at 24,576: 2.13 MiB a token for Qwen2.5-0.5B; bf16 autocast over
# float32 weights); and what the update reserves beyond the trainer's state at any budget
# (the LM head's chunks, the allocator's cached blocks). With gradient checkpointing the
# whole process held 13.49 GiB at 12,288 tokens, 14.78 at 24,576 and 20.44 at 49,152: the
# steeper of the two slopes (0.236 MiB a token), through the 12,288 point. vLLM's buffers
# beside its weights and KV cache (CUDA graphs, sampling) are what the whole process's
# measured 26.6 GiB leaves, plus a 7% margin (the module's docstring).
CONTEXT_GIB = 0.75
ENGINE_EXTRA_GIB = 0.6
ACTIVATION_BYTES_PER_TOKEN_LAYER_UNIT = 106.6
UPDATE_FIXED_GIB = 7.35
CHECKPOINTED_BYTES_PER_TOKEN_LAYER_UNIT = 11.5
CHECKPOINTED_UPDATE_FIXED_GIB = 1.63
# Checkpointed, the update took 2.28 s at 24,576 tokens a micro-batch, 3.50 s at 12,288 and
# 2.56 s at 49,152 (2.44 s without checkpointing at 12,288): runs that checkpoint to share a GPU get
# this budget where their config kept the default.
CHECKPOINTED_TOKENS_PER_DEFAULT = 2
HEADROOM = 0.95  # share of the free memory a plan may fill (the allocator fragments)
DEFAULT_KV_CACHE_GIB = 8.0  # a shared engine's KV cache when the model's KV size is unknown
PROMPT_TOKENS = 256  # a prompt's share of a sequence in the KV cache (GSM8K's chat prompts: ~150-250)
KV_STEP_GIB = 0.5  # a KV cache by need is rounded up to this, and is at least 1 GiB


class GPUMemoryError(LabkitError, RuntimeError):
    """Runs that do not fit in the GPU's free memory; the message says what would fit."""

    exit_code = 2


@dataclass(frozen=True)
class ModelShape:
    """What sizes a run's memory: parameters, vocabulary, layers, hidden width, and the bytes
    one token takes in the KV cache (bfloat16 keys and values of every layer; None: unknown)."""

    params: int
    vocab: int
    layers: int
    hidden: int
    kv_bytes_per_token: int | None = None

    @classmethod
    def of(cls, model_path: str) -> ModelShape:
        """Read from a model folder's config, counting parameters on the meta device."""
        import torch
        from transformers import AutoConfig, AutoModelForCausalLM

        config = AutoConfig.from_pretrained(model_path)
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config)
        params = sum(p.numel() for p in model.parameters())
        text = getattr(config, "text_config", config)
        heads = text.num_attention_heads
        head_dim = getattr(text, "head_dim", None) or text.hidden_size // heads
        kv_heads = getattr(text, "num_key_value_heads", None) or heads
        return cls(params, text.vocab_size, text.num_hidden_layers, text.hidden_size,
                   kv_bytes_per_token=2 * text.num_hidden_layers * kv_heads * head_dim * 2)


@dataclass(frozen=True)
class RunMemory:
    """GiB one run holds at its peak, by part."""

    context: float
    trainer: float
    update: float
    engine: float

    @property
    def total(self) -> float:
        return self.context + self.trainer + self.update + self.engine

    def describe(self) -> str:
        return (f"{self.total:.1f} GiB (trainer {self.trainer:.1f}, update {self.update:.1f}, "
                f"engine {self.engine:.1f}, context {self.context:.1f})")


def activation_gib(shape: ModelShape, tokens: int, checkpointing: bool = False) -> float:
    """One micro-batch's activations for `tokens` padded tokens."""
    per = CHECKPOINTED_BYTES_PER_TOKEN_LAYER_UNIT if checkpointing else ACTIVATION_BYTES_PER_TOKEN_LAYER_UNIT
    return tokens * shape.layers * shape.hidden * per / GIB


def kv_cache_gib(cfg, shape: ModelShape) -> float:
    """The KV cache a run's rollout needs: every sequence of it (prompts x answers) at its
    longest (PROMPT_TOKENS + --rollout-max-response-len), rounded up to KV_STEP_GIB, at least
    1 GiB; DEFAULT_KV_CACHE_GIB when the model's bytes a token are unknown. vLLM allocates
    the cache in blocks as answers grow, so a rollout never holds more than this at once."""
    if not shape.kv_bytes_per_token:
        return DEFAULT_KV_CACHE_GIB
    sequences = cfg.rollout_batch_size * cfg.n_samples_per_prompt
    need = sequences * (PROMPT_TOKENS + cfg.rollout_max_response_len) * shape.kv_bytes_per_token / GIB
    return max(1.0, math.ceil(need / KV_STEP_GIB) * KV_STEP_GIB)


def run_memory(cfg, shape: ModelShape) -> RunMemory:
    """What a run of `cfg` holds of its GPU at its peak (a colocated vLLM engine with a fixed
    KV cache, the config's or kv_cache_gib; the engine asleep gives its share back, but a
    shared GPU cannot count on that)."""
    kv = cfg.rollout_kv_cache_gb if cfg.rollout_kv_cache_gb is not None else kv_cache_gib(cfg, shape)
    trainer = shape.params * (16 + 2) / GIB
    tokens = cfg.max_tokens_per_gpu if cfg.use_dynamic_batch_size else \
        cfg.micro_batch_size * (cfg.rollout_max_response_len + 512)
    checkpointed = bool(cfg.gradient_checkpointing)
    update = activation_gib(shape, tokens, checkpointed) + \
        (CHECKPOINTED_UPDATE_FIXED_GIB if checkpointed else UPDATE_FIXED_GIB)
    engine = shape.params * 2 / GIB + kv + ENGINE_EXTRA_GIB
    return RunMemory(CONTEXT_GIB, trainer, update, engine)


def fits(cfg, shape: ModelShape, runs: int, free_gib: float) -> bool:
    """True when `runs` runs like `cfg` fit in `free_gib` (HEADROOM of it)."""
    return runs * run_memory(cfg, shape).total <= free_gib * HEADROOM


def share_gpu(cfg, shape: ModelShape, runs: int, free_gib: float | None, *, default_tokens: int,
              shrink: bool = True):
    """`cfg` as one of `runs` runs that share a GPU with `free_gib` free.

    In order: as it is, if that fits (`--gradient-checkpointing auto` stays off); with
    checkpointing, where it is auto, and twice the default token budget where the config
    kept it (on an H200 four recipe runs that checkpointed at the default budget had 1.91x
    the throughput of one run alone, against 0.99x with micro-batches cut to fit; the
    update alone was faster still at twice the budget: CHECKPOINTED_TOKENS_PER_DEFAULT);
    then checkpointed at the config's own budget, and with the largest `--max-tokens-per-gpu`
    that fits, where the config kept the default budget (`default_tokens`). Those two smaller
    passes only where `shrink` allows: a plan whose runs can wait seats fewer at once rather
    than shrink them (it does for a run alone). What still does not fit is left for the plan
    to refuse or seat. With the free memory unknown, auto checkpointing is on (runs that share
    a GPU)."""
    auto = cfg.gradient_checkpointing is None
    keeps_default = cfg.use_dynamic_batch_size and cfg.max_tokens_per_gpu == default_tokens
    checkpointed = cfg.replace(gradient_checkpointing=True)
    if auto and keeps_default:
        checkpointed = checkpointed.replace(max_tokens_per_gpu=default_tokens * CHECKPOINTED_TOKENS_PER_DEFAULT)
    if free_gib is None:
        return checkpointed if auto else cfg
    plain = cfg.replace(gradient_checkpointing=False) if auto else cfg
    if fits(plain, shape, runs, free_gib):
        return plain
    best = checkpointed if auto else plain
    if fits(best, shape, runs, free_gib) or not shrink:
        return best
    best = best.replace(max_tokens_per_gpu=cfg.max_tokens_per_gpu)
    if fits(best, shape, runs, free_gib):
        return best
    if keeps_default:
        tokens = fit_max_tokens(best, shape, runs, free_gib)
        if 0 < tokens < default_tokens:
            return best.replace(max_tokens_per_gpu=tokens)
    return best


def fit_max_tokens(cfg, shape: ModelShape, runs: int, free_gib: float, *, step: int = 1024) -> int:
    """The largest --max-tokens-per-gpu (a multiple of `step`) with which `runs` runs of `cfg`
    fit in `free_gib`; 0 when even `step` tokens do not fit."""
    base = run_memory(cfg.replace(max_tokens_per_gpu=0, use_dynamic_batch_size=True), shape)
    room = free_gib * HEADROOM / runs - base.total
    per_token = activation_gib(shape, 1, bool(cfg.gradient_checkpointing))
    return max(0, int(room / per_token) // step * step)


def gpu_count() -> int | None:
    """How many GPUs the driver counts (all of the machine's, whatever CUDA_VISIBLE_DEVICES
    says): NVML, else nvidia-smi; None when neither answers."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return int(pynvml.nvmlDeviceGetCount())
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # no NVML, no driver: try the command line
        pass
    out = _smi("--query-gpu=index")
    return len(out) if out is not None else None


def gpu_free_gib(index: int | str = 0) -> float | None:
    """Free memory of GPU `index` (nvidia-smi's number, or its UUID) as the driver sees it
    (all processes), without starting a CUDA context in this process: NVML, else
    nvidia-smi; None when neither answers."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            handle = (pynvml.nvmlDeviceGetHandleByIndex(int(index)) if str(index).isdigit()
                      else pynvml.nvmlDeviceGetHandleByUUID(str(index)))
            return pynvml.nvmlDeviceGetMemoryInfo(handle).free / GIB
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # no NVML, no driver: try the command line
        pass
    out = _smi("--query-gpu=memory.free", f"--id={index}")
    try:
        return float(out[0]) * 2**20 / GIB if out else None
    except ValueError:
        return None


def _smi(*query: str) -> list[str] | None:
    """nvidia-smi's answer to a --query-gpu, a line per GPU; None without nvidia-smi or answer."""
    if not shutil.which("nvidia-smi"):
        return None
    try:
        out = subprocess.run(["nvidia-smi", *query, "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = [x.strip() for x in out.stdout.splitlines() if x.strip()]
    return lines if out.returncode == 0 and lines else None


def describe_plan(cfg, need: RunMemory, runs: int, free_gib: float) -> str:
    """One line: how `runs` runs like `cfg` share the GPU."""
    kv = cfg.rollout_kv_cache_gb if cfg.rollout_kv_cache_gb is not None else DEFAULT_KV_CACHE_GIB
    batches = (f"{cfg.max_tokens_per_gpu:,} tokens a micro-batch" if cfg.use_dynamic_batch_size
               else f"{cfg.micro_batch_size} samples a micro-batch")
    ckpt = "with" if cfg.gradient_checkpointing else "without"
    who = (f"{runs} runs share the GPU ({free_gib:.0f} GiB free): each" if runs > 1
           else f"1 run has the GPU ({free_gib:.0f} GiB free):")
    return (f"{who} {ckpt} gradient "
            f"checkpointing, {batches}, a KV cache of {kv:g} GiB; planned {need.describe()} a run")


def plan_runs(cfgs, shape: ModelShape, free_gib: float) -> list[RunMemory]:
    """Each run's memory; refuses in one line when together they do not fit in `free_gib`."""
    need = [run_memory(c, shape) for c in cfgs]
    total = sum(m.total for m in need)
    if total > free_gib * HEADROOM:
        fits = fit_max_tokens(cfgs[0], shape, len(cfgs), free_gib)
        hint = (f"--max-tokens-per-gpu {fits} lets {len(cfgs)} fit" if fits
                else f"run fewer at once (one run needs {need[0].describe()})")
        raise GPUMemoryError(f"{len(cfgs)} runs need {total:.1f} GiB of GPU memory, "
                           f"{free_gib:.1f} GiB are free ({HEADROOM:.0%} usable); {hint}; "
                           f"nothing was started")
    return need
