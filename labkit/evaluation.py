"""Held-out accuracy: greedy answers to the test split, through the run's own engine.

The training reward says how the model does on the prompts it is trained on; whether it
got better at GSM8K is a question for problems it never trains on. A run evaluates its
first `--eval-split-size` test problems greedily (one answer each, temperature 0) before
its first step and after its last (and every `--eval-interval` steps if asked), scoring
them with the math reward: the share scored 1 is the accuracy, logged as
`eval/<source>_<split>` (`eval/gsm8k_test`, miles' style of name) in `eval.jsonl`, one
line per evaluation, with its own `perf/eval_time`: an evaluation is never part of a
step's `perf/step_time`, so rollout-time comparisons do not see it.

One evaluation of n problems has a binomial standard error of sqrt(p (1 - p) / n): 0.012
for p = 0.25 on all 1,319 GSM8K test problems. pass@k for k > 1 would need k sampled
answers per problem, k times the work of this greedy pass; it is not computed.
"""

from __future__ import annotations

import math
import time

from labkit.engines import keep
from labkit.engines.base import Engine, Sampling
from labkit.reward import math_reward, score


def eval_name(problems) -> str:
    """`eval/<source>_<split>` from the problems' ids ("gsm8k/test/12" -> eval/gsm8k_test)."""
    source, split = problems[0].id.split("/")[:2] if problems else ("heldout", "test")
    return f"eval/{source}_{split}"


def evaluate(engine: Engine, prompt_ids: list[list[int]], problems, *, max_tokens: int,
             stop_token_ids=(), autocast=None) -> dict:
    """Greedy accuracy of `engine` on `problems` (prompts given as token ids).

    Returns the eval row: the accuracy under eval_name(problems), its standard error, the
    problem count, the mean answer length, the share cut at `max_tokens`, and
    perf/eval_time (seconds)."""
    start = time.perf_counter()
    greedy = Sampling(n=1, temperature=0.0, max_tokens=max_tokens,
                      stop_token_ids=tuple(stop_token_ids), logprobs_for=0)
    if autocast is not None:
        with autocast():
            outs = engine.generate(prompt_ids, greedy)
    else:
        outs = engine.generate(prompt_ids, greedy)
    answers = [group[0] for group in outs]
    rewards = score([a.text for a in answers], [p.label for p in problems], math_reward)
    n = max(len(rewards), 1)
    accuracy = sum(r == 1.0 for r in rewards) / n
    name = eval_name(problems)
    return {
        name: accuracy,
        f"{name}_stderr": math.sqrt(accuracy * (1 - accuracy) / n),
        f"{name}_n": len(rewards),
        "eval/response_len/mean": sum(len(a.token_ids) for a in answers) / n,
        "eval/truncated_ratio": sum(a.truncated for a in answers) / n,
        "perf/eval_time": time.perf_counter() - start,
    }


def log_evaluation(s, trained_steps: int, bar=None) -> dict | None:
    """Evaluate the session's policy (labkit.session.Session) after `trained_steps` steps on its
    held-out problems (none: skip) and append the row to eval.jsonl. The starting model's result is computed once per
    process for the same model and problems (a rerun in a notebook need not wait for it)."""
    if not s.eval_problems:
        return None
    if bar is not None:
        bar.evaluating(len(s.eval_problems))
    from labkit.session import encode_prompt  # the session imports this module's users

    ids = [encode_prompt(s, p) for p in s.eval_problems]

    def run() -> dict:
        return evaluate(s.engine, ids, s.eval_problems, max_tokens=s.cfg.rollout_max_response_len,
                        stop_token_ids=s.stop_ids, autocast=s.autocast)

    reused = False
    try:
        if trained_steps == 0:
            key = ("eval", s.policy_key, s.engine.name, tuple(p.id for p in s.eval_problems),
                   s.cfg.rollout_max_response_len, s.cfg.dtype)
            row, reused = keep.starting_result(key, run)
        else:
            row = run()
    finally:
        if bar is not None:
            bar.evaluated()
    row = {**row, "eval/trained_steps": trained_steps, "eval/reused": reused, "time/end": time.time()}
    s.log.append_eval(row)
    name = eval_name(s.eval_problems)
    line = (f"labkit: held-out accuracy after {trained_steps} steps: {row[name]:.3f} "
            f"({name}, {row[name + '_n']} problems, "
            + ("same start model as before in this process)" if reused
               else f"{row['perf/eval_time']:.1f} s)"))
    bar.say(line) if bar is not None else print(line, flush=True)
    return row
