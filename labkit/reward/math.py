"""The `math` and `math_format` rewards: 1.0 when the response's final answer equals the label.

labkit.reward.final_answer picks the final answer (the last `####` line or `\\boxed{}`) and
labkit.reward.number reads the one number it states, exactly (`fractions.Fraction`), which
decides most answers in microseconds. Only what that exact path cannot read (`\\sqrt{16}`,
`16 + 8`) goes to math-verify, in a worker process under our own timeout
(labkit.reward.verifier: a check that runs too long is killed, for real, and the next one
gets a fresh worker). An answer in words never goes there: math-verify reads `42 (or 43)` as
43 and `2 6/4` as 2; an expression with a unit goes without the unit (`16 + 8 apples`). A
pre-check keeps inputs that could make sympy hang (towers of powers, factorials, huge or
deeply nested answers, polynomials to expand: nine nested calls in 55 characters ran for over
100 s, `(a+b+c+d+e+f+g+h)^{99}` for minutes) from reaching it at all. An answer we cannot
judge scores 0.0, never an exception.

Debatable answers, and how labkit reads them:

* A decimal comma (`3,5`) is no number: 0 against 3.5 and against 35. In English a comma
  between digits groups thousands (`3,500` is 3500) or separates items (`3,5`: 3 and 5);
  GSM8K's problems and labels are English, and a reward that paid `3,5` as 3.5 could not
  also read `3,500` as 3500.
* A dot is always the decimal point: `1.234` is 1.234, never 1234 (a thousands dot), and
  `1.234.567` is no number, for the same reason.
* Digits grouped by single spaces are one number only in groups of exactly three after a
  first group of one to three (`1 234 567`, as SI and French write thousands): `42 43` and
  `12 34` stay two numbers (rule 6), while `42 430` reads as 42430.
* Rounding is not forgiven: `3.3333` against a label of 3.33 is 0, and so is `3.33` against
  a label of 10/3. Values are compared exactly: any tolerance would pay a wrong answer to some
  problem (a tolerance of 0.01 pays 3.34 for 3.33), and a problem that wants a rounded
  answer says so, and its label is that rounded number.
* `1e3` is 1000 (e-notation, whatever the letter's case), never 1 times Euler's e cubed.
"""

from __future__ import annotations

import re

from labkit.reward import verifier
from labkit.reward.final_answer import extract_final_answer, final_answer_and_form
from labkit.reward.number import (
    ALTERNATIVE_RE,
    MAX_ANSWER_CHARS,
    normalize_answer,
    parse_number,
    readings,
    without_lead_in,
)

MATH_VERIFY_TIMEOUT_S = 2.0  # per fallback call; typical calls take 1-20 ms
MAX_NESTING = 4  # brackets deeper than this never reach sympy
FORMAT_CREDIT = 0.1  # math_format: what a wrong number in the asked format earns

# ------------------------------------------------------------------ math-verify fallback
# factorials, sums, Python's power, a 16-digit number, an exponent of four digits or more
_UNSAFE_RE = re.compile(r"!|\\(?:sum|prod|int|lim|binom|choose|infty)|\*\*|\d{16}|\d[eE][-+]?\d{4}")
# a bracket closed, then a power or another bracket: (a+b)^{99}, (a+b)(c+d), (a+b)\cdot(c+d)
_GROUP_POWER_OR_PRODUCT_RE = re.compile(r"[)\]}]\s*(?:\^|(?:\\cdot|\\times|\*)?\s*[(\[])")
_LATEX_COMMAND_RE = re.compile(r"\\[A-Za-z]+")
# a word (not a LaTeX command, not a function called: `\sqrt`, `sqrt(16)`), and words at the
# end of an expression (its unit: `16 + 8 apples`)
_WORD_RE = re.compile(r"(?<![\\A-Za-z])[A-Za-z]{2,}(?![A-Za-z(])")
_TRAILING_WORDS_RE = re.compile(r"\s+[A-Za-z\u00b0][A-Za-z\u00b0\s.,;:'/-]*\Z")
# two numbers side by side, a space or a long dash between them (`2 6/4`): no expression
_SIDE_BY_SIDE_RE = re.compile(r"\d(?:\s+|\s*[\u2013\u2014]\s*)[.\d]")


def is_safe_for_sympy(text: str) -> bool:
    """False for answers that could make sympy run for seconds or forever: long text, deep
    brackets (more than MAX_NESTING), factorials, sums, more than one power or a power with
    big numbers, and polynomials to expand (a bracket that holds a letter, raised to a power
    or multiplied by another bracket: `(a+b+c+d+e+f+g+h)^{9}` ran for minutes)."""
    if len(text) > MAX_ANSWER_CHARS or _UNSAFE_RE.search(text):
        return False
    depth = deepest = 0
    for ch in text:  # every kind of bracket: nested calls f(g(h(...))) are as slow as braces
        depth += (ch in "{([") - (ch in "})]")
        deepest = max(deepest, depth)
    if deepest > MAX_NESTING or text.count("^") > 1:
        return False
    if (_GROUP_POWER_OR_PRODUCT_RE.search(text)
            and re.search(r"[A-Za-z]", _LATEX_COMMAND_RE.sub("", text))):
        return False
    return "^" not in text or max(map(len, re.findall(r"\d+", text)), default=0) <= 2


def verify_with_timeout(answer: str, label: str, timeout_s: float | None = None) -> bool:
    """math-verify's judgement of `answer` against `label`, from any thread; False when it
    fails or exceeds `timeout_s` (default MATH_VERIFY_TIMEOUT_S; its worker process is then
    killed and replaced: labkit.reward.verifier)."""
    return verifier.verify(answer, label, MATH_VERIFY_TIMEOUT_S if timeout_s is None else timeout_s)


# ------------------------------------------------------------------ the rewards
def answers_match(answer: str, label: str) -> bool:
    """True when `answer` and `label` are the same number (exactly), or math-verify says
    they are equal for what the exact path cannot read."""
    a, b = normalize_answer(answer), normalize_answer(label)
    if not a or not b or len(a) > MAX_ANSWER_CHARS or len(b) > MAX_ANSWER_CHARS:
        return False
    x, y = readings(a), readings(b)
    if x and y:
        return any(p == q for p in x for q in y)
    if a == b:
        return True
    a, b = _expression(a), _expression(b)
    if a is None or b is None or not (is_safe_for_sympy(a) and is_safe_for_sympy(b)):
        return False
    return verify_with_timeout(a, b)


def _expression(s: str) -> str | None:
    """What math-verify may judge of a normalized answer the exact path cannot read: the
    answer without words before it (`The answer is \\sqrt{16}`) or the unit after it (`16 +
    8 apples` -> `16 + 8`); None when other words remain (`42 or 43`, `42 (or 43)`:
    math-verify reads that one as 43) or the words are no unit (`16 + 8 or so`, `2 and a
    half`), so a sentence never reaches it; None also for two numbers side by side (`2 6/4`,
    40 and 50 with an en dash), which math-verify reads as the first."""
    s = without_lead_in(s)
    m = _TRAILING_WORDS_RE.search(s)
    if m is not None and _WORD_RE.search(m.group()):
        if ALTERNATIVE_RE.search(m.group()) or readings(s[:m.start()]):
            return None  # a number the exact path refused with these words
        s = s[:m.start()]
    return None if _WORD_RE.search(s) or _SIDE_BY_SIDE_RE.search(s) else s


def math_reward(response: str, label: str) -> float:
    """1.0 when the response's final answer (`#### 42` or `\\boxed{42}`) equals the label,
    else 0.0 (also for no final answer, an unreadable one, or a non-string response)."""
    answer = extract_final_answer(response)
    if answer is None or not isinstance(label, str):
        return 0.0
    return 1.0 if answers_match(answer, label) else 0.0


def math_format_reward(response: str, label: str) -> float:
    """The math reward, plus FORMAT_CREDIT (0.1) for a final answer in the asked format
    (a `#### <number>` line) whose number is wrong; 0.0 for no readable final answer. The
    number is parse_number's, by the same rules as the math reward's (`#### She has 42
    apples` is 42; `#### 42 or 43` is no number): a right answer never gets the credit
    instead of 1.0, and every wrong one that reads as one number gets it.

    Why: a small model that never writes the asked format scores 0 everywhere and GRPO gets
    no signal (every group all-equal); a little credit for the format, as DeepSeek-R1's
    format rewards give, lets it first learn where the answer goes. The credit is a tenth of
    a right answer, so no fixed string pays: "#### 7" on every problem earns 0.1 plus the
    share of problems whose answer is 7, and a group of identical answers teaches nothing."""
    found = final_answer_and_form(response)
    if found is None or not isinstance(label, str):
        return 0.0
    form, answer = found
    if answers_match(answer, label):
        return 1.0
    return FORMAT_CREDIT if form == "####" and parse_number(answer) is not None else 0.0
