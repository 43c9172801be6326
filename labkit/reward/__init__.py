"""Rewards: `--rm-type` picks a function that scores one response against its label.

A reward is a plain function `(response, label) -> float`, as in miles' `rm_hub`: the
registry `REWARDS` maps each `--rm-type` to one, and `--custom-rm-path module:function`
(or `path/to/file.py:function`) loads a user's own. The work lives in one module per idea;
this package's face re-exports it:

* labkit.reward.math: the `math` reward (1.0 when the final answer equals the label) and
  `math_format` (the same, plus FORMAT_CREDIT for a wrong number in the asked `####`
  format); how debatable answers are read (a decimal comma, a thousands dot, rounding);
  math-verify as the fallback for what is not a plain number, behind a pre-check that keeps
  what could make sympy hang away from it;
* labkit.reward.final_answer: which text is the final answer, rules 1-4 (the last `####`
  line or `\\boxed{}`, headings, markers inside code);
* labkit.reward.number: the one number an answer states, exactly, rules 5-6 (units,
  working in brackets, scale words, one number and no other), thousands by commas or spaces,
  fractions (`2½`), e-notation and powers of ten (`1.5 × 10³`);
* labkit.reward.verifier: math-verify in a reused worker process, killed when a check runs
  past its timeout;
* labkit.reward.custom: a user's function from `--custom-rm-path`, and how messages name it;
* labkit.reward.scoring: `score`, a step's answers in order; a reward that fails on every
  answer, ends with a BaseException or returns inf stops the run (RewardError), in one line.
"""

from __future__ import annotations

from labkit.reward import verifier
from labkit.reward.custom import RewardFn, load_custom, reward_name
from labkit.reward.final_answer import extract_final_answer, final_answer_and_form
from labkit.reward.math import (
    FORMAT_CREDIT,
    MATH_VERIFY_TIMEOUT_S,
    MAX_NESTING,
    answers_match,
    is_safe_for_sympy,
    math_format_reward,
    math_reward,
    verify_with_timeout,
)
from labkit.reward.number import (
    COUNTED_IN,
    MAX_ANSWER_CHARS,
    MAX_EXPONENT,
    SCALES,
    normalize_answer,
    parse_number,
    readings,
)
from labkit.reward.scoring import MAX_REWARD, RewardError, score

REWARDS: dict[str, RewardFn] = {
    "math": math_reward,  # 1 for the right final answer (#### or \boxed{}), else 0
    "math_format": math_format_reward,  # the same, plus 0.1 for a wrong #### <number>
}


def load_reward(rm_type: str, custom_rm_path: str | None = None) -> RewardFn:
    """The reward for `--rm-type` (a key of REWARDS), or the user's function named by
    `--custom-rm-path` ("package.module:function" or "path/to/file.py:function")."""
    if custom_rm_path:
        return load_custom(custom_rm_path)
    if rm_type not in REWARDS:
        raise ValueError(
            f"--rm-type {rm_type!r} is not valid; valid: {', '.join(sorted(REWARDS))} "
            f"(or --custom-rm-path module:function)"
        )
    return REWARDS[rm_type]


__all__ = [
    "COUNTED_IN", "FORMAT_CREDIT", "MATH_VERIFY_TIMEOUT_S", "MAX_ANSWER_CHARS", "MAX_EXPONENT",
    "MAX_NESTING", "MAX_REWARD", "REWARDS", "SCALES", "RewardError", "RewardFn",
    "answers_match", "extract_final_answer", "final_answer_and_form", "is_safe_for_sympy",
    "load_custom", "load_reward", "math_format_reward", "math_reward", "normalize_answer",
    "parse_number", "readings", "reward_name", "score", "verifier", "verify_with_timeout",
]
