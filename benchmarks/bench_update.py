"""Time the actor update (labkit.actor) on one rollout of the recipe's shape, several ways.

Why: to see where the update's time goes, and what it costs to spend memory instead
of time. Every variant trains the same model (float32 master weights, bf16 autocast on a
GPU, as labkit.trainer does) on the same made-up rollout, whose token ids are random but
whose lengths follow our GSM8K runs (prompts 110-260 tokens, answers ~290 on average, a
few at the 1024 cap), so the work per variant is what a real step does:

* `before`: what the first H200 runs did: a separate no-grad pass for the old log-probs,
  then micro-batches of 8 samples;
* `one_pass`: micro-batches of 8, old log-probs taken from the training pass (one step
  per rollout makes them equal);
* `dynamic_<T>`: one pass, micro-batches filled up to T padded tokens
  (`--use-dynamic-batch-size --max-tokens-per-gpu T`).

Each variant: one warm-up update, then --repeats timed ones (synchronised), and the peak
GPU memory of its updates.

    python benchmarks/bench_update.py --model PATH --samples 256 --out bench_update.json
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time

import torch

from labkit.actor import compute_logprobs, make_optimizer, pack_rollout, train_on_rollout
from labkit.config import RunConfig
from labkit.models import load_policy, resolve_model


def made_up_rollout(samples: int, vocab: int, max_len: int, seed: int):
    """Random token ids with GSM8K-like prompt and answer lengths, random advantages."""
    g = torch.Generator().manual_seed(seed)
    prompt_len = torch.randint(110, 261, (samples,), generator=g)
    answer_len = torch.distributions.Gamma(3.0, 3.0 / 290).sample((samples,)).long()
    answer_len = answer_len.clamp(20, max_len)
    answer_len[torch.randperm(samples, generator=g)[: max(1, samples // 100)]] = max_len
    prompts = [torch.randint(0, vocab, (int(n),), generator=g).tolist() for n in prompt_len]
    answers = [torch.randint(0, vocab, (int(n),), generator=g).tolist() for n in answer_len]
    adv = torch.randn(samples, generator=g)
    return pack_rollout(prompts, answers, adv, [None] * samples, pad_id=0)


def time_variant(model, optimizer, cfg, batch, *, separate_old: bool, autocast, repeats: int):
    seconds, micro = [], 0
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
        if k:
            seconds.append(time.perf_counter() - start)
        micro = stats["train/micro_batches"]
    peak = reserved = None
    if torch.cuda.is_available():  # allocated by tensors; reserved by torch's caching allocator
        peak = torch.cuda.max_memory_allocated() / 2**30
        reserved = torch.cuda.max_memory_reserved() / 2**30
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    return {"median_s": statistics.median(seconds), "runs_s": [round(s, 3) for s in seconds],
            "micro_batches": micro, "peak_gpu_gib": peak, "peak_reserved_gib": reserved}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", required=True, help="local HF folder, GGUF file, or 'smollm2'")
    p.add_argument("--samples", type=int, default=256, help="prompts x answers (the global batch)")
    p.add_argument("--max-len", type=int, default=1024)
    p.add_argument("--budgets", default="8192,16384", help="token budgets of the dynamic variants")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--dynamic-only", action="store_true",
                   help="only the token-budget variants (the memory/time curve)")
    p.add_argument("--out", default=None)
    a = p.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = load_policy(resolve_model(a.model), torch.float32, device)
    autocast = (lambda: torch.autocast("cuda", dtype=torch.bfloat16)) if device.type == "cuda" else None
    import contextlib

    autocast = autocast or contextlib.nullcontext
    optimizer = make_optimizer(model, RunConfig())
    batch = made_up_rollout(a.samples, model.config.vocab_size, a.max_len, seed=0)
    tokens = int(batch.response_mask.sum())
    base = RunConfig(rollout_batch_size=a.samples // 8, n_samples_per_prompt=8, global_batch_size=a.samples,
                     micro_batch_size=8)
    variants = {} if a.dynamic_only else {
        "before": (base.replace(use_dynamic_batch_size=False), True),
        "one_pass": (base.replace(use_dynamic_batch_size=False), False)}
    for t in a.budgets.split(","):
        variants[f"dynamic_{t}"] = (base.replace(max_tokens_per_gpu=int(t)), False)
    result = {"machine": {"python": platform.python_version(), "torch": torch.__version__,
                          "device": torch.cuda.get_device_name(0) if device.type == "cuda" else "cpu"},
              "samples": a.samples, "answer_tokens": tokens, "variants": {},
              "card_gib": (torch.cuda.get_device_properties(0).total_memory / 2**30
                           if device.type == "cuda" else None)}
    for name, (cfg, separate) in variants.items():
        r = time_variant(model, optimizer, cfg, batch, separate_old=separate, autocast=autocast,
                         repeats=a.repeats)
        r["answer_tokens_per_s"] = tokens / r["median_s"]
        result["variants"][name] = r
        print(name, json.dumps(r), flush=True)
    if a.out:
        with open(a.out, "w") as f:
            json.dump(result, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
