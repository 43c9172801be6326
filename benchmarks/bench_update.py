"""Time the actor update (labkit.actor) on one rollout of the recipe's shape, several ways.

Why: to see where the update's time goes, and what it costs to spend memory instead
of time. Every variant trains the same model (float32 master weights, bf16 autocast on a
GPU, as labkit.trainer does) on the same made-up rollout, whose token ids are random but
whose lengths follow our GSM8K runs (prompts 110-260 tokens, each with the recipe's 8
answers of ~290 tokens on average, a few at the 1024 cap), so the work per variant is what
a real step does:

* `before`: what the first H200 runs did: a separate no-grad pass for the old log-probs,
  then micro-batches of 8 samples;
* `one_pass`: micro-batches of 8, old log-probs taken from the training pass (one step
  per rollout makes them equal);
* `dynamic_<T>`: one pass, micro-batches filled up to T padded tokens
  (`--use-dynamic-batch-size --max-tokens-per-gpu T`);
* `full_logits_<T>`: as `dynamic_<T>`, but the answers' log-probs taken from the model's
  full logits instead of labkit.logprobs' chunked head (what the chunks save);
* `shared_<T>`: as `dynamic_<T>`, with a group's answers after one copy of their prompt
  (`--share-prompt`, labkit.packing);
* `padding_free_<T>`: as `dynamic_<T>`, with the samples back to back in rows as wide as the
  longest (`--padding-free`, labkit.packing): padding only at the rows' ends;
* `checkpointed_<T>`: as `dynamic_<T>`, with gradient checkpointing (`--gradient-checkpointing`:
  each layer's activations recomputed in the backward pass); `shared_checkpointed_<T>` and
  `padding_free_checkpointed_<T>` with a layout too.

`--attn` sets the model's attention for every variant (sdpa by default; flex_attention
compiles its kernel in the warm-up and keeps packed samples apart with a block mask; varlen
runs packed rows through torch's varlen flash kernel (labkit.packing), and every
other layout through sdpa).

Each variant: one warm-up update (`warmup_s`: with --compile, it pays the compilation for
the variant's shapes), then --repeats timed ones (synchronised), the peak GPU
memory of its updates, and the padded tokens its micro-batches hold. The update's time does
not depend on the weights, so `--model random:qwen2.5-0.5b` builds the recipe's architecture
with random weights (nothing to download or carry). Run it under an older checkout
(PYTHONPATH) to time that checkout's update on the same rollout.

    python benchmarks/bench_update.py --model PATH --samples 256 --out bench_update.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import platform
import statistics
import time

import torch

from labkit import actor
from labkit.actor import compute_logprobs, make_optimizer, train_on_rollout

try:
    from labkit import packing
except ImportError:  # an older checkout (PYTHONPATH): its layout lives in labkit.actor
    packing = None
from labkit.config import RunConfig
from labkit.models import enable_checkpointing, load_policy, resolve_model

# Qwen2.5-0.5B-Instruct's architecture (its config.json), for a model of random weights.
QWEN25_05B = dict(vocab_size=151_936, hidden_size=896, intermediate_size=4_864, num_hidden_layers=24,
                  num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=32_768,
                  rope_theta=1_000_000.0, rms_norm_eps=1e-6, tie_word_embeddings=True)


def load_model(name: str, device):
    """A checkpoint (labkit's --model forms), or `random:qwen2.5-0.5b`: float32 master weights."""
    if name == "random:qwen2.5-0.5b":
        from transformers import Qwen2Config, Qwen2ForCausalLM

        torch.manual_seed(0)
        with torch.device(device):  # built where it runs: no copy of 0.5B weights
            return Qwen2ForCausalLM(Qwen2Config(**QWEN25_05B)).float()
    return load_policy(resolve_model(name), torch.float32, device)


def padded_tokens(batch, cfg) -> int:
    """Tokens the update's passes hold, padding included (this checkout's layout)."""
    max_tokens = cfg.max_tokens_per_gpu if cfg.use_dynamic_batch_size else None
    if packing is None:
        idx = actor._longest_first(batch, torch.arange(batch.size))
        parts = actor.micro_batches(batch, idx, max_samples=cfg.micro_batch_size, max_tokens=max_tokens)
        return sum(int(actor._micro_batch(batch, part, "cpu").ids.numel()) for part in parts)
    idx = packing.longest_first(batch, torch.arange(batch.size))
    return sum(int(rows.ids.numel()) for _, rows in packing.passes(
        batch, idx, "cpu", max_samples=cfg.micro_batch_size, max_tokens=max_tokens,
        **{layout: True for layout in ("share_prompt", "padding_free") if getattr(cfg, layout, False)}))


@contextlib.contextmanager
def full_logits():
    """The answers' log-probs from the model's full logits (labkit.logprobs' head switched off)."""
    try:
        from labkit import logprobs  # noqa: F401 (there or not: which checkout this is)
    except ImportError:  # an older checkout: it has only that path
        yield
        return
    keep = actor.lm_head_weight
    actor.lm_head_weight = lambda model: None
    try:
        yield
    finally:
        actor.lm_head_weight = keep


def made_up_rollout(samples: int, vocab: int, max_len: int, seed: int, group: int = 8):
    """Random token ids with GSM8K-like prompt and answer lengths, `group` answers to a
    prompt, random advantages."""
    g = torch.Generator().manual_seed(seed)
    prompt_len = torch.randint(110, 261, (samples // group,), generator=g).repeat_interleave(group)
    answer_len = torch.distributions.Gamma(3.0, 3.0 / 290).sample((samples,)).long()
    answer_len = answer_len.clamp(20, max_len)
    answer_len[torch.randperm(samples, generator=g)[: max(1, samples // 100)]] = max_len
    prompts = [torch.randint(0, vocab, (int(n),), generator=g).tolist() for n in prompt_len[::group]]
    prompts = [p for p in prompts for _ in range(group)]
    answers = [torch.randint(0, vocab, (int(n),), generator=g).tolist() for n in answer_len]
    adv = torch.randn(samples, generator=g)
    pack = packing.pack_rollout if packing is not None else actor.pack_rollout
    return pack(prompts, answers, adv, [None] * samples, pad_id=0)


def time_variant(model, optimizer, cfg, batch, *, separate_old: bool, autocast, repeats: int,
                 profile: bool = False):
    seconds, spans, micro, padding, first = [], [], 0, None, None
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    for k in range(repeats + 1):  # the first is a warm-up
        batch.old_logprobs = None
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        start = time.perf_counter()
        if separate_old:
            batch.old_logprobs = compute_logprobs(model, batch, micro_batch_size=cfg.micro_batch_size,
                                                  temperature=1.0, autocast=autocast)
        stats = train_on_rollout(model, optimizer, batch, cfg, generator=torch.Generator().manual_seed(k),
                                 autocast=autocast)
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        if not k:
            first = time.perf_counter() - start  # with --compile, the compilation is in it
        else:
            seconds.append(time.perf_counter() - start)
            end = time.time()  # wall clock, to line up the updates of processes side by side
            spans.append((round(end - seconds[-1], 3), round(end, 3)))
        micro, padding = stats["train/micro_batches"], stats.get("train/padding_frac")
    if profile and torch.cuda.is_available():
        from torch.profiler import ProfilerActivity
        from torch.profiler import profile as torch_profile

        batch.old_logprobs = None
        with torch_profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            train_on_rollout(model, optimizer, batch, cfg, generator=torch.Generator().manual_seed(0),
                             autocast=autocast)
            torch.cuda.synchronize()
        print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=18), flush=True)
    peak = reserved = None
    if torch.cuda.is_available():  # allocated by tensors; reserved by torch's caching allocator
        peak = torch.cuda.max_memory_allocated() / 2**30
        reserved = torch.cuda.max_memory_reserved() / 2**30
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    return {"median_s": statistics.median(seconds), "runs_s": [round(s, 3) for s in seconds],
            "warmup_s": round(first, 3),
            "micro_batches": micro, "padding_frac": padding, "peak_gpu_gib": peak, "peak_reserved_gib": reserved,
            "spans": spans}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", required=True,
                   help="local HF folder, GGUF file, 'smollm2', or random:qwen2.5-0.5b")
    p.add_argument("--samples", type=int, default=256, help="prompts x answers (the global batch)")
    p.add_argument("--max-len", type=int, default=1024)
    p.add_argument("--budgets", default="8192,16384", help="token budgets of the dynamic variants")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--dynamic-only", action="store_true",
                   help="only the token-budget variants (the memory/time curve)")
    p.add_argument("--full-logits", default="", help="token budgets of the full-logits variants")
    p.add_argument("--checkpointed", default="", help="token budgets of the checkpointed variants")
    p.add_argument("--shared", default="", help="token budgets of the shared-prompt variants")
    p.add_argument("--shared-checkpointed", default="",
                   help="token budgets of the shared-prompt variants with checkpointing")
    p.add_argument("--padding-free", default="", help="token budgets of the padding-free variants")
    p.add_argument("--padding-free-checkpointed", default="",
                   help="token budgets of the padding-free variants with checkpointing")
    p.add_argument("--attn", default="sdpa", choices=["sdpa", "eager", "flex_attention", "flash_attention_2", "varlen"],
                   help="the model's attention in every variant (varlen: torch's varlen flash kernel "
                        "for packed rows, labkit.packing; sdpa for the rest)")
    p.add_argument("--profile", action="store_true", help="print the top GPU ops of each variant")
    p.add_argument("--liger", action="store_true",
                   help="liger-kernel's kernels (RMSNorm, SwiGLU, RoPE) in the model, as "
                        "--use-liger-kernel gives them (labkit.models.use_liger_kernels); the LM "
                        "head stays labkit's chunked one")
    p.add_argument("--compile", action="store_true",
                   help="each decoder layer compiled by torch.compile (dynamic shapes), a probe: "
                        "the first update of each variant pays the compilation")
    p.add_argument("--out", default=None)
    a = p.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = load_model(a.model, device)
    if a.attn == "varlen":
        from labkit.packing import use_varlen_attention

        use_varlen_attention(model)
    else:
        model.config._attn_implementation = a.attn
    if a.liger:
        from labkit.models import use_liger_kernels

        use_liger_kernels(model)
    if a.compile:
        for layer in model.base_model.layers:
            layer.compile(dynamic=True)
    autocast = (lambda: torch.autocast("cuda", dtype=torch.bfloat16)) if device.type == "cuda" else None
    autocast = autocast or contextlib.nullcontext
    optimizer = make_optimizer(model, RunConfig())
    batch = made_up_rollout(a.samples, model.config.vocab_size, a.max_len, seed=0)
    tokens = int(batch.response_mask.sum())
    base = RunConfig(rollout_batch_size=a.samples // 8, n_samples_per_prompt=8, global_batch_size=a.samples,
                     micro_batch_size=8)
    variants = {} if a.dynamic_only else {
        "before": (base.replace(use_dynamic_batch_size=False), True),
        "one_pass": (base.replace(use_dynamic_batch_size=False), False)}
    for t in filter(None, a.budgets.split(",")):
        variants[f"dynamic_{t}"] = (base.replace(max_tokens_per_gpu=int(t)), False)
    for t in filter(None, a.full_logits.split(",")):
        variants[f"full_logits_{t}"] = (base.replace(max_tokens_per_gpu=int(t)), False)
    for t in filter(None, a.shared.split(",")):
        variants[f"shared_{t}"] = (base.replace(max_tokens_per_gpu=int(t), share_prompt=True), False)
    for t in filter(None, a.padding_free.split(",")):
        variants[f"padding_free_{t}"] = (base.replace(max_tokens_per_gpu=int(t), padding_free=True), False)
    for t in filter(None, a.checkpointed.split(",")):
        variants[f"checkpointed_{t}"] = (base.replace(max_tokens_per_gpu=int(t)), False)
    for t in filter(None, a.shared_checkpointed.split(",")):
        variants[f"shared_checkpointed_{t}"] = (
            base.replace(max_tokens_per_gpu=int(t), share_prompt=True), False)
    for t in filter(None, a.padding_free_checkpointed.split(",")):
        variants[f"padding_free_checkpointed_{t}"] = (
            base.replace(max_tokens_per_gpu=int(t), padding_free=True), False)
    result = {"liger": a.liger, "compile": a.compile, "attn": a.attn,
              "machine": {"python": platform.python_version(), "torch": torch.__version__,
                          "device": torch.cuda.get_device_name(0) if device.type == "cuda" else "cpu"},
              "samples": a.samples, "answer_tokens": tokens, "variants": {},
              "card_gib": (torch.cuda.get_device_properties(0).total_memory / 2**30
                           if device.type == "cuda" else None)}
    for name, (cfg, separate) in variants.items():
        if "checkpointed" in name:  # the rest come first: this stays on
            enable_checkpointing(model)
        with full_logits() if name.startswith("full_logits") else contextlib.nullcontext():
            r = time_variant(model, optimizer, cfg, batch, separate_old=separate, autocast=autocast,
                             repeats=a.repeats, profile=a.profile)
        r["answer_tokens_per_s"] = tokens / r["median_s"]
        r["padded_tokens"] = padded_tokens(batch, cfg)
        result["variants"][name] = r
        print(name, json.dumps(r), flush=True)
    if a.out:
        with open(a.out, "w") as f:
            json.dump(result, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
