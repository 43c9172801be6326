"""Rollout speed of labkit's VLLMEngine against raw `vllm.LLM.generate`, plus the weight sync.

Why: VLLMEngine wraps vLLM with processed (temperature-scaled) log-probs of the chosen
tokens, seeds and the conversion to labkit Completions. This measures what each costs on
one rollout of the recipe's shape (32 prompts x 8 answers), on one engine so that weights,
KV cache and batch are the same for every variant:

* `labkit`: VLLMEngine.generate as the trainer calls it by default: the rollout seeded once
  (no seed per answer), the engine's log-probs on the answers of 4 prompts only;
* `labkit_all_lp`: the same with log-probs on every answer (what --overlap-rollout needs);
* `labkit_seeded`: a seed per answer and every log-prob (labkit's rollout before);
* `raw_same_all`: llm.generate with the SamplingParams `labkit_all_lp` sends, outputs left
  as vLLM returns them: the difference is the wrapper's own cost (conversion, decoding);
* `raw_plain`: llm.generate with one SamplingParams, no seed and no log-probs: the fastest
  vLLM rollout, against which `labkit` is read.

The variants take turns (one round = one rollout of each), so drift hits them alike, and
in round k every variant samples with seed + k (labkit resets vLLM's generator to the
rollout's seed; the raw variants get the same reset): all but `labkit_seeded` then write
the very same answers, so their times differ by what they ask of vLLM, not by how long
the answers happened to be (a rollout takes as long as its longest answer).

Then it loads the trainer's copy of the model (float32 master weights, bf16 autocast on a
GPU, as labkit.trainer does), runs the colocated cycle three times (sleep, update_weights,
wake), times each part, and reports the mean |engine - trainer| log-prob of sampled tokens
after the sync (the trainer's `train/train_rollout_logprob_abs_diff`).

Prompts are made-up arithmetic problems (labkit.data.synthetic_problems) in the chat template.

    python benchmarks/bench_vllm_engine.py --model PATH --prompts 32 --n 8 --max-tokens 1024 \\
        --gpu-memory-fraction 0.5 --out bench_vllm.json

vLLM 0.24 on the H200 must run in-process: the script sets VLLM_ENABLE_V1_MULTIPROCESSING=0.
"""

from __future__ import annotations

import os

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # before vllm is imported

import argparse  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import torch  # noqa: E402


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", required=True, help="local HF folder, GGUF file, or 'smollm2'")
    p.add_argument("--prompts", type=int, default=32, help="prompts per rollout")
    p.add_argument("--n", type=int, default=8, help="answers per prompt")
    p.add_argument("--max-tokens", type=int, default=1024, help="most tokens per answer")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--gpu-memory-fraction", type=float, default=0.5)
    p.add_argument("--dtype", default="auto", choices=["auto", "bfloat16", "float32"])
    p.add_argument("--repeats", type=int, default=3, help="timed rollouts per variant")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--no-sync", action="store_true", help="skip the weight-sync measurement")
    p.add_argument("--out", default=None, help="write the JSON result here")
    return p.parse_args(argv)


def make_prompts(tokenizer, n: int, seed: int) -> list[list[int]]:
    """labkit's chat prompts (as the trainer builds them) of n made-up arithmetic problems."""
    from labkit.data import prompt_token_ids, synthetic_problems

    return [prompt_token_ids(tokenizer, p.question) for p in synthetic_problems(n, steps=2, seed=seed)]


def summarize(name: str, seconds: list[float], lengths: list[list[int]]) -> dict:
    """Median time and tokens/s of one variant's timed rollouts; prints one line."""
    med = statistics.median(seconds)
    tokens = [sum(x) for x in lengths]
    longest = [max(x) for x in lengths]
    mean_tokens = statistics.mean(tokens)
    result = {"seconds": seconds, "median_seconds": med, "tokens": tokens, "longest": longest,
              "tokens_per_s": mean_tokens / med}
    print(f"{name:13s} median {med:7.2f} s  {mean_tokens:9.0f} tokens  longest {longest}  "
          f"{result['tokens_per_s']:9.0f} tokens/s  (runs: {', '.join(f'{s:.2f}' for s in seconds)})",
          flush=True)
    return result


def time_rollouts(variants: dict, repeats: int) -> dict:
    """Each variant once untimed (warm-up), then `repeats` rounds of all variants in turn.

    Interleaving puts every variant through the same drift (clocks, temperature, allocator
    state) instead of giving the first one the freshest engine. `run(k)` writes round k's
    rollout and returns the length of each answer.
    """
    for run in variants.values():
        run(-1)
    seconds = {name: [] for name in variants}
    lengths = {name: [] for name in variants}
    for k in range(repeats):
        for name, run in variants.items():
            start = time.perf_counter()
            lengths[name].append(run(k))
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            seconds[name].append(time.perf_counter() - start)
    return {name: summarize(name, seconds[name], lengths[name]) for name in variants}


def bench_generation(engine, prompts: list[list[int]], args) -> dict:
    """Time the five variants on the same engine, interleaved."""
    from vllm import SamplingParams

    from labkit.engines.base import Sampling

    base = dict(n=args.n, temperature=args.temperature, max_tokens=args.max_tokens)
    requests = [{"prompt_token_ids": p} for p in prompts]
    all_lp = Sampling(**base)
    same_all = [engine.sampling_params(all_lp, i) for i in range(len(prompts))]
    plain = SamplingParams(n=args.n, temperature=args.temperature, max_tokens=args.max_tokens)

    def labkit_run(k: int, **kw) -> list[int]:
        out = engine.generate(prompts, Sampling(**base, seed=args.seed + k, **kw))
        return [len(c.token_ids) for g in out for c in g]

    def raw(k: int, params) -> list[int]:
        torch.manual_seed(args.seed + k)  # as labkit does before a rollout
        outs = engine.llm.generate(requests, params, use_tqdm=False)
        return [len(c.token_ids) for o in outs for c in o.outputs]

    result = time_rollouts({
        "labkit": lambda k: labkit_run(k, logprobs_for=4),
        "labkit_all_lp": lambda k: labkit_run(k),
        "labkit_seeded": lambda k: labkit_run(k, seed_each_answer=True),
        "raw_same_all": lambda k: raw(k, same_all), "raw_plain": lambda k: raw(k, plain),
    }, args.repeats)
    for a, b in (("labkit", "raw_plain"), ("labkit_all_lp", "raw_same_all"),
                 ("labkit_seeded", "labkit_all_lp"), ("labkit_all_lp", "labkit")):
        ratios = [x / y for x, y in zip(result[a]["seconds"], result[b]["seconds"])]
        result[f"{a}_over_{b}"] = {"per_round": ratios, "median": statistics.median(ratios)}
        print(f"{a} / {b} per round: {', '.join(f'{r:.3f}' for r in ratios)} "
              f"(median {statistics.median(ratios):.3f})", flush=True)
    return result


def bench_sync(engine, path: str, prompts: list[list[int]], args) -> dict:
    """Time update_weights from the trainer's copy, then compare log-probs after it."""
    from labkit.models import default_device, load_policy, pick_dtype

    device = default_device()
    policy = load_policy(path, torch.float32, device).eval()
    seconds, cycle = [], []
    for _ in range(3):  # the trainer's colocated cycle: sleep, (train), sync, wake
        t0 = time.perf_counter()
        engine.sleep()
        t1 = time.perf_counter()
        engine.update_weights(policy)
        t2 = time.perf_counter()
        engine.wake()
        t3 = time.perf_counter()
        seconds.append(engine.stats["sync_seconds"])
        cycle.append({"sleep": t1 - t0, "sync": t2 - t1, "wake": t3 - t2})
    print(f"sync       {', '.join(f'{s:.3f}' for s in seconds)} s "
          f"({engine.stats['sync_tensors']} tensors; sleep mode {engine.sleep_mode}; "
          f"last sleep {cycle[-1]['sleep']:.3f} s, wake {cycle[-1]['wake']:.3f} s)", flush=True)

    from labkit.engines.base import Sampling

    sample = engine.generate(prompts[:4], Sampling(n=2, temperature=args.temperature,
                                                   max_tokens=min(args.max_tokens, 256), seed=7))
    compute = pick_dtype(args.dtype, device)
    diffs = []
    for prompt, group in zip(prompts, sample):
        for c in group:
            ids = torch.tensor([prompt + c.token_ids], device=device)
            with torch.no_grad(), torch.autocast(device.type, dtype=compute,
                                                 enabled=compute != torch.float32):
                logits = policy(ids).logits[0, len(prompt) - 1 : -1].float() / args.temperature
            lp = torch.log_softmax(logits, -1).gather(-1, ids[0, len(prompt):, None])[:, 0]
            diffs.append((lp.cpu() - torch.tensor(c.logprobs)).abs())
    diff = torch.cat(diffs)
    print(f"logprob    |engine - trainer| mean {diff.mean():.2e}, max {diff.max():.2e}", flush=True)
    return {"seconds": seconds, "cycle": cycle, "sleep_mode": engine.sleep_mode,
            "tensors": engine.stats["sync_tensors"],
            "logprob_abs_diff_mean": float(diff.mean()), "logprob_abs_diff_max": float(diff.max())}


def describe_machine() -> dict:
    import vllm

    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    return {"gpu": gpu, "cpu_count": os.cpu_count(), "platform": platform.platform(),
            "python": platform.python_version(), "torch": torch.__version__,
            "vllm": vllm.__version__}


def main(argv=None) -> dict:
    args = parse_args(argv)
    from labkit.engines.vllm import VLLMEngine
    from labkit.models import load_tokenizer, resolve_model

    path = resolve_model(args.model)
    tokenizer = load_tokenizer(path)
    prompts = make_prompts(tokenizer, args.prompts, args.seed)
    longest = max(len(p) for p in prompts) + args.max_tokens
    engine = VLLMEngine(path, dtype=args.dtype, gpu_memory_fraction=args.gpu_memory_fraction,
                        seed=args.seed, max_model_len=longest)
    print(f"engine     start {engine.stats['startup_llm_seconds']:.1f} s on {engine.device}, "
          f"{engine.dtype}; " + ", ".join(f"{k} {v:.1f} s" for k, v in engine.stats.items()
                                          if k.startswith("startup_")), flush=True)
    result = {"machine": describe_machine(), "command": " ".join([sys.executable, *sys.argv]),
              "config": vars(args), "engine_start_seconds": engine.stats["startup_llm_seconds"],
              "engine_stats": dict(engine.stats)}
    result["generation"] = bench_generation(engine, prompts, args)
    if not args.no_sync:
        result["sync"] = bench_sync(engine, path, prompts, args)
    engine.close()
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=2)
        print(f"wrote {args.out}")
    return result


if __name__ == "__main__":
    main()
