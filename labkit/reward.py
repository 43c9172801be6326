"""Rewards: `--rm-type` picks a function that scores one response against its label.

A reward is a plain function `(response, label) -> float`, as in miles' `rm_hub`: the
registry `REWARDS` maps each `--rm-type` to one, and `--custom-rm-path module:function`
(or `path/to/file.py:function`) loads a user's own.

The `math` reward reads the response's final answer and gives 1.0 when it equals the label.
Which text is the final answer, rule by rule (each rule comes from answers seen scored wrong):

1. The last marker wins, a `#### <answer>` line or a balanced `\\boxed{...}`, whichever comes
   later: a model that guesses `#### 26` early, or copies the prompt's `#### 42` example, and
   ends with the right `\\boxed{}` is right; `#### 623` early and `#### 440` last is 440.
2. A `####` line may lead in with words that say it is the answer: `#### The final answer
   is: 440`, `#### **Answer:** 440`, `#### Final Answer` with the number on the next line,
   `#### x = 5`.
3. A `####` line that is a heading is not an answer: one with no digit (`\\(#### \\)` quoted
   from the instructions), `#### Step 2`, a numbered heading (`#### 2. Compute`, `#### 3)
   Check`, `#### 4 - Verify`), a section number and a title with more text after it
   (`\\boxed{42}`, then `#### 3 Verification` and a check: 42), and `##### 3` (a deeper
   heading).
4. A marker inside code (a fenced block, an inline `span`) is not the answer: `\\boxed{7}`,
   then a block that runs `print('#### 5')`, is 7. Only when no marker stands outside code
   does one inside count (a model that puts its `#### 42` in a block).
5. A unit or words after the number leave the number: `#### 60 km/h`,
   `\\boxed{42\\text{ cm}^2}`, `#### 42 apples`, `$5/day`, `42^\\circ`. Text with another
   digit after the number (`5 x 3`, `60 or 70`) is not one number.

Most answers are plain numbers, so an exact path decides them in microseconds with
`fractions.Fraction` (commas, `$`, `%`, `42.0`, `3/4`, `\\frac{3}{4}`, units). Only what that
path cannot read (`\\sqrt{16}`, `16 + 8`) goes to math-verify, in a worker process under our
own timeout (labkit.verifier: a check that runs too long is killed, for real, and the next
one gets a fresh worker). A pre-check keeps inputs that could make sympy hang (towers of
powers, factorials, huge or deeply nested answers, polynomials to expand: nine nested calls
in 55 characters ran for over 100 s, `(a+b+c+d+e+f+g+h)^{99}` for minutes) from reaching it
at all. An answer we cannot judge scores 0.0, never an exception.
"""

from __future__ import annotations

import bisect
import concurrent.futures
import importlib
import importlib.util
import math
import re
import warnings
from fractions import Fraction
from pathlib import Path
from typing import Callable, Optional

from labkit import verifier

RewardFn = Callable[[str, str], float]

MAX_ANSWER_CHARS = 200  # a longer "final answer" is not a number a GSM8K problem asks for
MATH_VERIFY_TIMEOUT_S = 2.0  # per fallback call; typical calls take 1-20 ms
MAX_NESTING = 4  # brackets deeper than this never reach sympy

# ------------------------------------------------------------------ final answer
# `####` (not part of a deeper `#####` heading), then an optional lead-in ("The final answer
# is:", "**Answer:**" with the number on the same or the next line, or `x =`), then an
# answer-like start, so a markdown heading such as "#### Step 2" is not one.
_HASH_RE = re.compile(
    r"(?<!#)####(?!#)[ \t]*"
    r"(?:\**[ \t]*(?:the[ \t]+)?(?:final[ \t]+)?answer(?:[ \t]+is)?[ \t]*:?[ \t]*\**[ \t]*:?[ \t]*\n?[ \t]*"
    r"|[A-Za-z][A-Za-z_]*[ \t]*=[ \t]*)?"
    r"([-+\u2212$\\.*(\d`][^\n]*)", re.IGNORECASE)
# a heading: "#### 2. Compute the total", "#### 3) Check", "#### 4 - Verify", and (when more
# text follows it) "#### 3 Verification", a section number then a title
_HEADING_RE = re.compile(r"\d+(?:[.):]|[ \t]+[-\u2013\u2014])[ \t]+[A-Za-z]")
_TITLE_RE = re.compile(r"\d{1,2}[ \t]+[A-Z][A-Za-z]*(?:[ \t]+[A-Za-z]+)*[ \t]*:?")
_BOXED_OR_BRACE_RE = re.compile(r"\\boxed\s*\{|\{|\}")
# code: a fenced block (``` or ~~~, to its closing fence or the end) or an inline `span`
# (an info string holds no ` or ~, which also keeps a line of 100k backticks linear)
_CODE_RE = re.compile(r"^[ \t]*(`{3,}|~{3,})[^`~\n]*\n.*?(?:^[ \t]*\1[`~]*[ \t]*$|\Z)|`[^`\n]+`",
                      re.MULTILINE | re.DOTALL)
_TEXT_RE = re.compile(r"\S")


def extract_final_answer(text: str) -> Optional[str]:
    """The final answer of a response: of the last `#### <answer>` line and the last balanced
    `\\boxed{...}`, the one that comes later; None when there is neither. A `####` line that
    is a heading, or holds no digit (`\\(#### \\)` quoted from the instructions), is not an
    answer; a marker inside code counts only when there is none outside code."""
    found = final_answer_and_form(text)
    return None if found is None else found[1]


def final_answer_and_form(text: str) -> Optional[tuple[str, str]]:
    """(form, answer) of the final answer: form "####" or "boxed" (see extract_final_answer)."""
    if not isinstance(text, str):
        return None
    code = [m.span() for m in _CODE_RE.finditer(text)]
    found = _final_answer_outside(text, code)
    return found if found is not None or not code else _final_answer_outside(text, [])


def _final_answer_outside(text: str, code: list[tuple[int, int]]) -> Optional[tuple[str, str]]:
    """(form, answer) of the last marker that does not start inside one of the `code` spans."""
    starts = [s for s, _ in code]
    hashed = None
    for m in _HASH_RE.finditer(text):
        answer = m.group(1).strip()
        if (any(c.isdigit() for c in answer) and not _HEADING_RE.match(answer)
                and not (_TITLE_RE.fullmatch(answer) and _TEXT_RE.search(text, m.end()))
                and not _inside(m.start(), code, starts)):
            hashed = (m.start(), answer)
    boxed = _last_boxed_span(text, code, starts)
    if boxed is not None and (hashed is None or boxed[0] > hashed[0]):
        return "boxed", text[boxed[1]:boxed[2]].strip()
    return None if hashed is None else ("####", hashed[1])


def _inside(position: int, spans: list[tuple[int, int]], starts: list[int]) -> bool:
    """True when `position` falls in one of the sorted, disjoint `spans` (starts: their starts)."""
    i = bisect.bisect_right(starts, position) - 1
    return i >= 0 and position < spans[i][1]


def _last_boxed(text: str) -> Optional[str]:
    """Content of the last `\\boxed{...}` whose braces balance, in one pass (O(len))."""
    span = _last_boxed_span(text)
    return None if span is None else text[span[1]:span[2]].strip()


def _last_boxed_span(text: str, code: list[tuple[int, int]] = (),
                     starts: list[int] = ()) -> Optional[tuple[int, int, int]]:
    """(where `\\boxed` starts, content start, content end) of the last balanced one; braces
    inside the `code` spans are not read."""
    stack: list[Optional[tuple[int, int]]] = []  # per open brace: (start, content) of a \boxed
    best: Optional[tuple[int, int, int]] = None
    for m in _BOXED_OR_BRACE_RE.finditer(text):
        if code and _inside(m.start(), code, starts):
            continue
        token = m.group()
        if token == "}":
            if not stack:
                continue
            opened = stack.pop()
            if opened is not None and (best is None or opened[1] > best[1]):
                best = (opened[0], opened[1], m.start())
        else:
            stack.append((m.start(), m.end()) if token != "{" else None)
    return best


# ------------------------------------------------------------------ exact path
_LATEX_TEXT_RE = re.compile(r"\\(?:text|textbf|mathrm|mbox|operatorname)\s*\{([^{}]*)\}")
_THOUSANDS_RE = re.compile(r"(?<=\d),(?=\d{3}(?:\D|$))")
_NUM = r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)"
_NUMBER_RE = re.compile(rf"({_NUM})")
_RATIO_RE = re.compile(r"([-+]?\d+)/(\d+)")
_FRAC_RE = re.compile(r"([-+]?)\\frac\{([-+]?\d+(?:\.\d+)?)\}\{([-+]?\d+(?:\.\d+)?)\}")
# a unit or words after the number: "42 apples", "60 km/h", "60km/h", "$5/day", "42 cm^2",
# "42°F"; no digit may follow (so "5 x 3" and "60 or 70" are not read as a number)
_UNIT = r"[A-Za-z\u00b0][A-Za-z\u00b0.'/ -]*(?:\^\s*\{?\s*[23]\s*\}?[A-Za-z\u00b0.'/ -]*)?"
_NUMBER_THEN_WORDS_RE = re.compile(rf"({_NUM})(?:\s+|\s*/\s*|(?=\u00b0|[A-Za-z]{{2}})){_UNIT}")
_DEGREES_RE = re.compile(r"\^\s*\{?\s*\\circ\s*\}?")


def normalize_answer(text: str) -> str:
    """Strip what does not change a number: `$`, `%`, thousands commas, `\\boxed{}`,
    `\\text{}`, `\\[ \\]`, markdown bold, spaces after a sign, a final period. Returns the
    text left."""
    s = text.replace("\u2212", "-").strip().strip("*`").strip()
    for left, right in (("\\[", "\\]"), ("\\(", "\\)"), ("$$", "$")):  # display math
        if s.startswith(left) and s.endswith(right):
            s = s[len(left):len(s) - len(right)].strip()
    while s.startswith("\\boxed{") and s.endswith("}") and _last_boxed(s) == s[7:-1].strip():
        s = s[7:-1].strip()
    s = _LATEX_TEXT_RE.sub(r" \1 ", s)
    s = _DEGREES_RE.sub("\u00b0", s).replace("\\ ", " ").replace("~", " ")
    for junk in ("\\$", "$", "\\%", "%", "\\!", "\\,", "\\;", "\\left", "\\right"):
        s = s.replace(junk, "")
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    s = _THOUSANDS_RE.sub("", s)
    s = re.sub(r"^([-+])\s+", r"\1", s.strip())
    return s.rstrip(". ").strip()


def parse_number(text: str) -> Optional[Fraction]:
    """The exact value of a plain numeric answer (`-1,234.50`, `$18`, `25%`, `3/4`,
    `\\frac{3}{4}`, `42 apples`), or None when it is not one (or is too long to be one)."""
    if not isinstance(text, str):
        return None
    s = normalize_answer(text)
    if not s or len(s) > MAX_ANSWER_CHARS:
        return None
    if m := _NUMBER_RE.fullmatch(s) or _NUMBER_THEN_WORDS_RE.fullmatch(s):
        return Fraction(m.group(1))
    if m := _RATIO_RE.fullmatch(s):
        return Fraction(int(m.group(1)), int(m.group(2))) if int(m.group(2)) else None
    if m := _FRAC_RE.fullmatch(s):
        num, den = Fraction(m.group(2)), Fraction(m.group(3))
        return (-1 if m.group(1) == "-" else 1) * num / den if den else None
    return None


# ------------------------------------------------------------------ math-verify fallback
_UNSAFE_RE = re.compile(r"!|\\(?:sum|prod|int|lim|binom|choose|infty)|\*\*|\d{16}")
# a bracket closed, then a power or another bracket: (a+b)^{99}, (a+b)(c+d), (a+b)\cdot(c+d)
_GROUP_POWER_OR_PRODUCT_RE = re.compile(r"[)\]}]\s*(?:\^|(?:\\cdot|\\times|\*)?\s*[(\[])")
_LATEX_COMMAND_RE = re.compile(r"\\[A-Za-z]+")
_warned: set[str] = set()


def _warn_once(key: str, message: str) -> None:
    if key not in _warned:
        _warned.add(key)
        warnings.warn(message, RuntimeWarning, stacklevel=3)


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


def verify_with_timeout(answer: str, label: str, timeout_s: Optional[float] = None) -> bool:
    """math-verify's judgement of `answer` against `label`, from any thread; False when it
    fails or exceeds `timeout_s` (default MATH_VERIFY_TIMEOUT_S; its worker process is then
    killed and replaced: labkit.verifier)."""
    return verifier.verify(answer, label, MATH_VERIFY_TIMEOUT_S if timeout_s is None else timeout_s)


# ------------------------------------------------------------------ the math reward
def answers_match(answer: str, label: str) -> bool:
    """True when `answer` and `label` are the same number (exactly), or math-verify says
    they are equal for what the exact path cannot read."""
    a, b = normalize_answer(answer), normalize_answer(label)
    if not a or not b or len(a) > MAX_ANSWER_CHARS or len(b) > MAX_ANSWER_CHARS:
        return False
    x, y = parse_number(a), parse_number(b)
    if x is not None and y is not None:
        return x == y
    if a == b:
        return True
    if not (is_safe_for_sympy(a) and is_safe_for_sympy(b)):
        return False
    return verify_with_timeout(a, b)


def math_reward(response: str, label: str) -> float:
    """1.0 when the response's final answer (`#### 42` or `\\boxed{42}`) equals the label,
    else 0.0 (also for no final answer, an unreadable one, or a non-string response)."""
    answer = extract_final_answer(response)
    if answer is None or not isinstance(label, str):
        return 0.0
    return 1.0 if answers_match(answer, label) else 0.0


FORMAT_CREDIT = 0.1  # math_format: what a wrong number in the asked format earns


def math_format_reward(response: str, label: str) -> float:
    """The math reward, plus FORMAT_CREDIT (0.1) for a final answer in the asked format
    (a `#### <number>` line) whose number is wrong; 0.0 for no readable final answer.

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


REWARDS: dict[str, RewardFn] = {
    "math": math_reward,  # 1 for the right final answer (#### or \boxed{}), else 0
    "math_format": math_format_reward,  # the same, plus 0.1 for a wrong #### <number>
}


# ------------------------------------------------------------------ registry and scoring
def load_reward(rm_type: str, custom_rm_path: Optional[str] = None) -> RewardFn:
    """The reward for `--rm-type` (a key of REWARDS), or the user's function named by
    `--custom-rm-path` ("package.module:function" or "path/to/file.py:function")."""
    if custom_rm_path:
        return _load_custom(custom_rm_path)
    if rm_type not in REWARDS:
        raise ValueError(
            f"--rm-type {rm_type!r} is not valid; valid: {', '.join(sorted(REWARDS))} "
            f"(or --custom-rm-path module:function)"
        )
    return REWARDS[rm_type]


def _load_custom(path: str) -> RewardFn:
    """Import "module:function" or "file.py:function" and return the function. A file or
    module that fails to import (a syntax error, a missing package, an exit at import) is a
    ConfigError naming it and the first line of why: it is the user's file, not labkit's."""
    from labkit.config import ConfigError

    where, sep, name = path.rpartition(":")
    if not sep or not where or not name:
        raise ConfigError(f"--custom-rm-path {path!r}: use package.module:function "
                          f"or path/to/file.py:function")
    file = None
    if where.endswith(".py") or "/" in where or "\\" in where:
        file = Path(where).expanduser()
        if not file.is_file():
            raise FileNotFoundError(f"--custom-rm-path {path!r}: no file {file}")
    try:
        if file is not None:
            spec = importlib.util.spec_from_file_location(f"labkit_custom_rm_{file.stem}", file)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
        else:
            module = importlib.import_module(where)
    except (Exception, SystemExit) as e:  # noqa: BLE001 - whatever the user's file raises
        why = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise ConfigError(f"--custom-rm-path {path!r}: importing {where} failed "
                          f"({e.__class__.__name__}{': ' + why[:200] if why else ''}); fix "
                          f"{where} and try again") from e
    fn = getattr(module, name, None)
    if not callable(fn):
        raise ConfigError(f"--custom-rm-path {path!r}: {where} has no function {name!r}")
    return fn


def _score_one(fn: RewardFn, response: str, label: str) -> float:
    """fn(response, label) as a finite float; 0.0 (and one warning per fn) if it fails."""
    key = f"{getattr(fn, '__module__', '')}.{getattr(fn, '__qualname__', repr(fn))}"
    try:
        value = float(fn(response, label))
    except Exception as e:  # noqa: BLE001 - one bad response must not stop the run
        _warn_once(f"raise:{key}", f"reward {key} raised {type(e).__name__}: {e}; "
                                   f"scoring such responses 0.0 (warned once)")
        return 0.0
    if not math.isfinite(value):
        _warn_once(f"nan:{key}", f"reward {key} returned {value}; scoring it 0.0 (warned once)")
        return 0.0
    return value


def score(responses: list[str], labels: list[str], fn: RewardFn, *, max_workers: int = 1) -> list[float]:
    """Rewards of `responses[i]` against `labels[i]`, in order; `max_workers` > 1 uses a
    thread pool (helps rewards that wait on I/O; the math reward is CPU-bound and fast)."""
    if len(responses) != len(labels):
        raise ValueError(f"score: {len(responses)} responses but {len(labels)} labels; "
                         f"repeat each label n-samples-per-prompt times")
    if max_workers <= 1 or len(responses) < 2:
        return [_score_one(fn, r, y) for r, y in zip(responses, labels)]
    with concurrent.futures.ThreadPoolExecutor(max_workers) as pool:
        return list(pool.map(lambda ry: _score_one(fn, *ry), zip(responses, labels)))
