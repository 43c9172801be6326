"""Greedy GSM8K test accuracy and sampled training reward of a model, through labkit's vLLM engine.

    python benchmarks/eval_model.py --model M.gguf --data gsm8k-folder --out result.json

Greedy: every test problem, max 1024 tokens, labkit's prompt and math reward. Sampled: the
first rollout's prompts (32 x 8 at T=1, as the recipe's step 0 with --seed 1), with the
fraction of groups whose answers all got the same reward.
"""

from __future__ import annotations

import argparse
import json
import time

import torch


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--data", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--max-tokens", type=int, default=1024)
    p.add_argument("--prompts", type=int, default=32)
    p.add_argument("--n", type=int, default=8)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--memory-fraction", type=float, default=0.5)
    a = p.parse_args()
    from labkit.data import load_problems, prompt_token_ids, rollout_problems
    from labkit.engines.base import Sampling
    from labkit.engines.vllm import VLLMEngine
    from labkit.grpo import compute_advantages
    from labkit.models import load_tokenizer, resolve_model, stop_token_ids
    from labkit.reward import load_reward, score

    path = resolve_model(a.model)
    tok = load_tokenizer(path)
    stop = stop_token_ids(tok)
    t = time.perf_counter()
    engine = VLLMEngine(path, gpu_memory_fraction=a.memory_fraction, seed=a.seed,
                        max_model_len=a.max_tokens + 1024)
    result = {"model": a.model, "engine_start_s": time.perf_counter() - t}
    reward = load_reward("math")
    test = load_problems(a.data, "test")
    ids = [prompt_token_ids(tok, q.question) for q in test]
    t = time.perf_counter()
    outs = engine.generate(ids, Sampling(n=1, temperature=0.0, max_tokens=a.max_tokens, stop_token_ids=stop))
    result["greedy_seconds"] = time.perf_counter() - t
    r = score([o[0].text for o in outs], [q.label for q in test], reward)
    result.update(greedy_test_accuracy=sum(r) / len(r), test_problems=len(test))
    train = rollout_problems(load_problems(a.data, "train"), 0, a.prompts, a.seed)
    ids = [prompt_token_ids(tok, q.question) for q in train]
    for rep in range(3):
        t = time.perf_counter()
        outs = engine.generate(ids, Sampling(n=a.n, temperature=1.0, max_tokens=a.max_tokens,
                                             seed=1000 * rep, stop_token_ids=stop))
        secs = time.perf_counter() - t
        texts = [c.text for g in outs for c in g]
        labels = [q.label for q, g in zip(train, outs) for _ in g]
        rw = torch.tensor(score(texts, labels, reward)).view(len(train), -1)
        tokens = sum(len(c.token_ids) for g in outs for c in g)
        result.setdefault("sampled", []).append({
            "reward": float(rw.mean()), "all_equal_groups": float(compute_advantages(rw).zero_std.float().mean()),
            "seconds": secs, "tokens": tokens, "tokens_per_s": tokens / secs})
    print(json.dumps(result, indent=2), flush=True)
    with open(a.out, "w") as f:
        json.dump(result, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
