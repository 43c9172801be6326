"""Rewards: `--rm-type` picks a function that scores one response against its label.

A reward is a plain function `(response, label) -> float`, as in miles' `rm_hub`: the
registry `REWARDS` maps each `--rm-type` to one, and `--custom-rm-path module:function`
(or `path/to/file.py:function`) loads a user's own.

The `math` reward reads the response's final answer and gives 1.0 when it equals the label.
Which text is the final answer, rule by rule (each rule comes from answers seen scored wrong):

1. The last marker wins, a `#### <answer>` line or a balanced `\\boxed{...}`, whichever comes
   later: a model that guesses `#### 26` early, or copies the prompt's `#### 42` example, and
   ends with the right `\\boxed{}` is right; `#### 623` early and `#### 440` last is 440.
2. A `####` line may open with words before the number: words that say it is the answer
   (`#### The final answer is: 440`, `#### **Answer:** 440`, `#### Final Answer` with the
   number on the next line), or any phrase on the line (`#### She has 42 apples left`,
   `#### Total: $42`, `#### In all, Maya read 57 pages.`). After an `=` the answer is its
   last side: `#### x = 5`, `#### 6 x 7 = 42 apples`.
3. A `####` line that is a heading is not an answer: one with no digit (`\\(#### \\)` quoted
   from the instructions), a numbered heading (`#### 2. Compute`, `#### 3) Check`, `#### 4 -
   Verify`, also after a capitalized label: `#### Part 3: Check`), and `##### 3` (a deeper
   heading). With more text after it, so is a section number and a title (`\\boxed{42}`,
   then `#### 3 Verification` and a check: 42) and a label and a number (`#### Step 2`);
   as the last line, `#### Total 42` is an answer. A phrase is no label: `#### total 42`,
   `#### Total: 42`, `#### In 2 weeks she saves 42` (rule 6 reads that one).
4. A marker inside code (a fenced block, an inline `span`) is not the answer: `\\boxed{7}`,
   then a block that runs `print('#### 5')`, is 7. Only when no marker stands outside code
   does one inside count (a model that puts its `#### 42` in a block).
5. What follows the number leaves the number: a unit or words (`#### 60 km/h`,
   `\\boxed{42\\text{ cm}^2}`, `#### 42 apples, all told`, `$5/day`, `42^\\circ`), also after a
   fraction or mixed number (`3/4 cup`, `1/2 of the pizza`, `2 1/2 hours` is 2.5), and
   working in brackets (`#### 42 (6 x 7 = 42)`, `#### 18 (3 * 6)`: its numbers are not the
   answer). A scale word multiplies it: `2 million` is 2000000, `1.5 thousand` 1500; `3
   dozen` is 36 or 3, whichever the label is (problems ask for eggs and for dozens of eggs
   alike, and a label is a plain number).
6. An answer is one number. A second one outside brackets, wherever it stands, makes the
   answer wrong: `#### 42 or 43`, `#### between 40 and 50`, `#### 40-50 minutes`, `#### In 2
   weeks she saves 42` (words cannot say which number is meant: "she saves 42 in 2 weeks"
   puts it first; a number in words is no number, so `In two weeks she saves 42` is 42). So
   do `or` after the number (`42 (or 43)`, `42 or so`), words that add to it (`2 and a half`)
   and an operator (`42 + x`). Such an answer never goes to math-verify, which reads `42 (or
   43)` as 43 and `2 6/4` as 2; an expression with a unit goes without the unit (`16 + 8
   apples`).

Most answers are plain numbers, so an exact path decides them in microseconds with
`fractions.Fraction` (commas, `$`, `%`, `42.0`, `3/4`, `\\frac{3}{4}`, rules 5 and 6).
Only what that path cannot read (`\\sqrt{16}`, `16 + 8`) goes to math-verify, in a worker
process under our own timeout (labkit.reward.verifier: a check that runs too long is killed, for
real, and the next one gets a fresh worker). A pre-check keeps inputs that could make sympy
hang (towers of powers, factorials, huge or deeply nested answers, polynomials to expand:
nine nested calls in 55 characters ran for over 100 s, `(a+b+c+d+e+f+g+h)^{99}` for
minutes) from reaching it at all. An answer we cannot judge scores 0.0, never an exception.
"""

from __future__ import annotations

import bisect
import concurrent.futures
import importlib
import importlib.util
import math
import re
import warnings
from collections.abc import Callable
from fractions import Fraction
from pathlib import Path

from labkit.reward import verifier

RewardFn = Callable[[str, str], float]

MAX_ANSWER_CHARS = 200  # a longer "final answer" is not a number a GSM8K problem asks for
MATH_VERIFY_TIMEOUT_S = 2.0  # per fallback call; typical calls take 1-20 ms
MAX_NESTING = 4  # brackets deeper than this never reach sympy

# ------------------------------------------------------------------ final answer
# `####` (not part of a deeper `#####` heading), then an optional lead-in ("The final answer
# is:", "**Answer:**" with the number on the same or the next line, or `x =`), then an
# answer-like start (a line that opens with other words, "#### She has 42" or the heading
# "#### Step 2", is read by _HASH_PHRASE_RE below).
_HASH_RE = re.compile(
    r"(?<!#)####(?!#)[ \t]*"
    r"(?:\**[ \t]*(?:the[ \t]+)?(?:final[ \t]+)?answer(?:[ \t]+is)?[ \t]*:?[ \t]*\**[ \t]*:?[ \t]*\n?[ \t]*"
    r"|[A-Za-z][A-Za-z_]*[ \t]*=[ \t]*)?"
    r"([-+\u2212$\\.*(\d`][^\n]*)", re.IGNORECASE)
# a heading: "#### 2. Compute the total", "#### 3) Check", "#### 4 - Verify", and (when more
# text follows it) "#### 3 Verification", a section number then a title
_HEADING_RE = re.compile(r"\d+(?:[.):]|[ \t]+[-\u2013\u2014])[ \t]+[A-Za-z]")
_TITLE_RE = re.compile(r"\d{1,2}[ \t]+[A-Z][A-Za-z]*(?:[ \t]+[A-Za-z]+)*[ \t]*:?")
# a `####` line that opens with words the pattern above does not read (`#### She has 42
# apples left`), taken whole; it holds no other `#`, so each line is read once
_HASH_PHRASE_RE = re.compile(r"(?<!#)####(?!#)[ \t]*([^\n#]*)")
_DIGIT_RE = re.compile(r"\d")
# markdown bold around words or a number (`**42** apples`), not Python's power (`2**3`)
_BOLD_RE = re.compile(r"(?<![\w*])\*\*(?=\S)([^*\n]*?)(?<=\S)\*\*(?![\w*])")
# what belongs to the number just before its first digit: a sign, `$`, `**`, `\frac{`, `(`
_NUMBER_PREFIX_RE = re.compile(r"(?:\\[A-Za-z]+\s*\{|\\[$(\[]|[-+\u2212$*`(\[\s])*\.?\Z")
_ANSWER_WORD_RE = re.compile(r"\banswer\b", re.IGNORECASE)
_LAST_WORD_RE = re.compile(r"[A-Za-z]+\Z")
_LABEL_ALONE_RE = re.compile(r"\d+[ \t]*\Z")  # the number of a label, alone: `Step 2`
_BOXED_OR_BRACE_RE = re.compile(r"\\boxed\s*\{|\{|\}")
# code: a fenced block (``` or ~~~, to its closing fence or the end) or an inline `span`
# (an info string holds no ` or ~, which also keeps a line of 100k backticks linear)
_CODE_RE = re.compile(r"^[ \t]*(`{3,}|~{3,})[^`~\n]*\n.*?(?:^[ \t]*\1[`~]*[ \t]*$|\Z)|`[^`\n]+`",
                      re.MULTILINE | re.DOTALL)
_TEXT_RE = re.compile(r"\S")


def extract_final_answer(text: str) -> str | None:
    """The final answer of a response: of the last `#### <answer>` line and the last balanced
    `\\boxed{...}`, the one that comes later; None when there is neither. A `####` line that
    is a heading, or holds no digit (`\\(#### \\)` quoted from the instructions), is not an
    answer; a marker inside code counts only when there is none outside code."""
    found = final_answer_and_form(text)
    return None if found is None else found[1]


def final_answer_and_form(text: str) -> tuple[str, str] | None:
    """(form, answer) of the final answer: form "####" or "boxed" (see extract_final_answer)."""
    if not isinstance(text, str):
        return None
    code = [m.span() for m in _CODE_RE.finditer(text)]
    found = _final_answer_outside(text, code)
    return found if found is not None or not code else _final_answer_outside(text, [])


def _final_answer_outside(text: str, code: list[tuple[int, int]]) -> tuple[str, str] | None:
    """(form, answer) of the last marker that does not start inside one of the `code` spans."""
    starts = [s for s, _ in code]
    hashed = _last_hash_answer(text, code, starts)
    boxed = _last_boxed_span(text, code, starts)
    if boxed is not None and (hashed is None or boxed[0] > hashed[0]):
        return "boxed", text[boxed[1]:boxed[2]].strip()
    return None if hashed is None else ("####", hashed[1])


def _last_hash_answer(text: str, code: list[tuple[int, int]],
                      starts: list[int]) -> tuple[int, str] | None:
    """(where, answer) of the last `####` answer outside `code`: a line _HASH_RE reads (the
    number first, or after words that say it is the answer), or one that opens with other
    words (`#### She has 42 apples left`, read by _answer_after_words)."""
    hashed = None
    read = set()  # where the lines _HASH_RE reads start: answers, or headings
    for m in _HASH_RE.finditer(text):
        read.add(m.start())
        answer = m.group(1).strip()
        if answer[:1] in ("*", "`") and answer.lstrip("*` ")[:1].isalpha():  # **She has 42**
            answer = _answer_after_words(answer, bool(_TEXT_RE.search(text, m.end()))) or ""
        if (any(c.isdigit() for c in answer) and not _HEADING_RE.match(answer)
                and not (_TITLE_RE.fullmatch(answer) and _TEXT_RE.search(text, m.end()))
                and not _inside(m.start(), code, starts)):
            hashed = (m.start(), answer)
    for m in reversed(list(_HASH_PHRASE_RE.finditer(text))):  # the last answer is the one
        if hashed is not None and m.start() < hashed[0]:
            break
        if (m.start() in read or text[m.end():m.end() + 1] not in ("", "\n")
                or _inside(m.start(), code, starts)):
            continue
        answer = _answer_after_words(m.group(1), bool(_TEXT_RE.search(text, m.end())))
        if answer is not None:
            return m.start(), answer
    return hashed


def _answer_after_words(line: str, more_text: bool) -> str | None:
    """The answer of a `####` line that opens with words (rule 2): the text from its first
    number on (`She has **42** apples left` -> `42 apples left`); None for a line with no
    digit, or a heading (rule 3): a capitalized label and a number, then a heading's title
    (`Part 3: Check`) or, when `more_text` follows the line, a title or nothing (`Step 2`)."""
    line = _BOLD_RE.sub(r"\1", line)
    digit = _DIGIT_RE.search(line)
    if digit is None:
        return None
    window = line[max(0, digit.start() - 32):digit.start()]  # bounded: no quadratic search
    cut = digit.start() - (len(window) - _NUMBER_PREFIX_RE.search(window).start())
    words, answer = line[:cut].strip(" \t*_`"), line[cut:].strip()
    if not words or _ANSWER_WORD_RE.search(words) or words.endswith((":", "=", ",")):
        return answer
    last = _LAST_WORD_RE.search(words[-40:])  # bounded, as above
    if last is not None and last.group()[0].isupper() and (_HEADING_RE.match(answer) or (
            more_text and (_TITLE_RE.fullmatch(answer) or _LABEL_ALONE_RE.match(answer)))):
        return None
    return answer


def _inside(position: int, spans: list[tuple[int, int]], starts: list[int]) -> bool:
    """True when `position` falls in one of the sorted, disjoint `spans` (starts: their starts)."""
    i = bisect.bisect_right(starts, position) - 1
    return i >= 0 and position < spans[i][1]


def _last_boxed(text: str) -> str | None:
    """Content of the last `\\boxed{...}` whose braces balance, in one pass (O(len))."""
    span = _last_boxed_span(text)
    return None if span is None else text[span[1]:span[2]].strip()


def _last_boxed_span(text: str, code: list[tuple[int, int]] = (),
                     starts: list[int] = ()) -> tuple[int, int, int] | None:
    """(where `\\boxed` starts, content start, content end) of the last balanced one; braces
    inside the `code` spans are not read."""
    stack: list[tuple[int, int] | None] = []  # per open brace: (start, content) of a \boxed
    best: tuple[int, int, int] | None = None
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
# a mixed number at the start of an answer phrase (rule 5): `2 1/2`, `2 \frac{1}{2}`
_MIXED_RE = re.compile(r"([-+]?)(\d+)\s+(?:(\d+)/(\d+)|\\frac\{(\d+)\}\{(\d+)\})")
# a scale word after the number multiplies it ("2 million"; "hundred-dollar bills" is a unit)
_SCALE_RE = re.compile(r"\s*(hundred|thousand|million|billion|trillion|dozen)s?(?![\w-])",
                       re.IGNORECASE)
SCALES = {"hundred": 100, "thousand": 1000, "million": 10**6, "billion": 10**9,
          "trillion": 10**12, "dozen": 12}
COUNTED_IN = {"dozen"}  # scales problems also count in ("how many dozen"): read both ways
# what may follow the number: nothing, a space, a per-unit (`5/day`), degrees, a hyphened
# unit (`42-year-old`), punctuation, a unit written against it (`60km/h`; `2x` is not one)
_TAIL_START_RE = re.compile(r"\Z|\s|/|\u00b0|[-\u2013][A-Za-z]|[,;:!?]|[A-Za-z]{2}")
# words after the number that offer another answer or add to it: `42 or 43`, `42 (or 43)`,
# `42 or so`, `2 and a half`
_ALTERNATIVE_RE = re.compile(
    r"\bor\b|\band\s+(?:a|an|one|two|three)\s+(?:half|halves|quarters?|thirds?)\b", re.IGNORECASE)
_UNIT_POWER_RE = re.compile(r"\^\s*\{?\s*[23]\s*\}?")  # cm^2, m/s^{2}
_BRACKETS_RE = re.compile(r"\([^()\[\]]*\)|\[[^()\[\]]*\]")  # innermost (...) or [...]
# what no unit holds: a digit (another number) or an operator (`42 + x`, `42 \pi`)
_NOT_A_UNIT_RE = re.compile(r"[\d+*=<>^\\{}|\u00d7\u00f7]")
# a word (not a LaTeX command, not a function called: `\sqrt`, `sqrt(16)`), and words at the
# end of an expression (its unit: `16 + 8 apples`)
_WORD_RE = re.compile(r"(?<![\\A-Za-z])[A-Za-z]{2,}(?![A-Za-z(])")
# two numbers side by side, a space or a long dash between them (`2 6/4`): no expression
_SIDE_BY_SIDE_RE = re.compile(r"\d(?:\s+|\s*[\u2013\u2014]\s*)[.\d]")
_TRAILING_WORDS_RE = re.compile(r"\s+[A-Za-z\u00b0][A-Za-z\u00b0\s.,;:'/-]*\Z")
_DEGREES_RE = re.compile(r"\^\s*\{?\s*\\circ\s*\}?")


def normalize_answer(text: str) -> str:
    """Strip what does not change a number: `$`, `%`, thousands commas, `\\boxed{}`,
    `\\text{}`, `\\[ \\]`, markdown bold, spaces after a sign, a final period. Returns the
    text left."""
    s = _BOLD_RE.sub(r"\1", text.replace("\u2212", "-")).strip().strip("*`").strip()
    for left, right in (("\\[", "\\]"), ("\\(", "\\)"), ("$$", "$")):  # display math
        if s.startswith(left) and s.endswith(right):
            s = s[len(left):len(s) - len(right)].strip()
    while s.startswith("\\boxed{") and s.endswith("}") and _last_boxed(s) == s[7:-1].strip():
        s = s[7:-1].strip()
    s = _LATEX_TEXT_RE.sub(r" \1 ", s)
    s = _DEGREES_RE.sub("\u00b0", s).replace("\\ ", " ").replace("~", " ")
    for junk in ("\\$", "$", "\\%", "%", "\\!", "\\,", "\\;", "\\left", "\\right", "`",
                 "\\(", "\\)", "\\[", "\\]"):  # `42` apples, \(42\) apples: inline, not math
        s = s.replace(junk, "")
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    s = _THOUSANDS_RE.sub("", s)
    s = re.sub(r"^([-+])\s+", r"\1", s.strip())
    return s.rstrip(". ").strip()


def parse_number(text: str) -> Fraction | None:
    """The exact value of a numeric answer (`-1,234.50`, `$18`, `25%`, `3/4`, `\\frac{3}{4}`,
    `42 apples`, `2 1/2 hours`, `2 million`, `42 (6 x 7 = 42)`, `x = 5`), or None when it is
    not one number (`42 or 43`), or is too long to be one. `3 dozen` is 36 here; readings()
    also gives its other reading, 3."""
    values = readings(text)
    return values[0] if values else None


def readings(text: str) -> tuple[Fraction, ...]:
    """Every value a numeric answer can mean, as parse_number reads it: one, or two for a
    count of dozens (`3 dozen`: 36, or 3 when the problem counts in dozens); () for none."""
    if not isinstance(text, str):
        return ()
    s = normalize_answer(text)
    if not s or len(s) > MAX_ANSWER_CHARS:
        return ()
    if m := _NUMBER_RE.fullmatch(s):
        return (Fraction(m.group(1)),)
    if m := _RATIO_RE.fullmatch(s):
        return (Fraction(int(m.group(1)), int(m.group(2))),) if int(m.group(2)) else ()
    if m := _FRAC_RE.fullmatch(s):
        num, den = Fraction(m.group(2)), Fraction(m.group(3))
        return ((-1 if m.group(1) == "-" else 1) * num / den,) if den else ()
    side = _last_side(s)
    return () if side is None else _phrase_readings(side)


def _last_side(s: str) -> str | None:
    """What follows the last `=` outside brackets (`6 x 7 = 42 apples` -> `42 apples`), or
    `s` itself without one; None for a list (`3, b = 4`, `a = 3, b = 4`)."""
    depth, last, comma = 0, -1, None  # the last `=` and the first `,` outside brackets
    for i, ch in enumerate(s):
        depth += (ch in "([{") - (ch in ")]}")
        if depth == 0 and ch == "," and comma is None:
            comma = i
        elif (depth == 0 and ch == "=" and s[i - 1:i] not in ("<", ">", "!", "=")
                and s[i + 1:i + 2] != "="):
            last = i
    if last < 0:
        return s
    return None if comma is not None and comma < last else s[last + 1:].strip()


def _leading_value(s: str) -> tuple[Fraction, int] | None:
    """(value, where it ends) of the number `s` starts with; None when there is none, a
    zero denominator, or a mixed number whose fraction is not proper (`2 6/4`)."""
    if (m := _MIXED_RE.match(s)) is not None:
        num, den = (int(m.group(3) or m.group(5)), int(m.group(4) or m.group(6)))
        if 0 < num < den:
            sign = -1 if m.group(1) == "-" else 1
            return sign * (int(m.group(2)) + Fraction(num, den)), m.end()
    if (m := _RATIO_RE.match(s)) is not None:
        return (Fraction(int(m.group(1)), int(m.group(2))), m.end()) if int(m.group(2)) else None
    if (m := _FRAC_RE.match(s)) is not None:
        num, den = Fraction(m.group(2)), Fraction(m.group(3))
        return ((-1 if m.group(1) == "-" else 1) * num / den, m.end()) if den else None
    if (m := _NUMBER_RE.match(s)) is not None:
        return Fraction(m.group(1)), m.end()
    return None


def _phrase_readings(s: str) -> tuple[Fraction, ...]:
    """Values of a number, then an optional scale word, then its unit, words or bracketed
    working (rule 5); () when the rest is not a unit (rule 6: another number outside
    brackets, an operator, `or`, `and a half`)."""
    found = _leading_value(s)
    if found is None:
        return ()
    value, end = found
    values = (value,)
    if (m := _SCALE_RE.match(s, end)) is not None:
        word = m.group(1).lower()
        values = (value * SCALES[word],) + ((value,) if word in COUNTED_IN else ())
        end = m.end()
    tail = s[end:]
    if not _TAIL_START_RE.match(tail) or _ALTERNATIVE_RE.search(tail):
        return ()
    tail = _UNIT_POWER_RE.sub(" ", tail)
    while (bare := _BRACKETS_RE.sub(" ", tail)) != tail:  # working in brackets, innermost first
        tail = bare
    return () if _NOT_A_UNIT_RE.search(tail) else values


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


def verify_with_timeout(answer: str, label: str, timeout_s: float | None = None) -> bool:
    """math-verify's judgement of `answer` against `label`, from any thread; False when it
    fails or exceeds `timeout_s` (default MATH_VERIFY_TIMEOUT_S; its worker process is then
    killed and replaced: labkit.reward.verifier)."""
    return verifier.verify(answer, label, MATH_VERIFY_TIMEOUT_S if timeout_s is None else timeout_s)


# ------------------------------------------------------------------ the math reward
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
    answer without the unit after it (`16 + 8 apples` -> `16 + 8`); None when other words
    remain (`42 or 43`, `42 (or 43)`: math-verify reads that one as 43) or the words are no
    unit (`16 + 8 or so`, `2 and a half`), so a sentence never reaches it; None also for two
    numbers side by side (`2 6/4`, 40 and 50 with an en dash), which math-verify reads as
    the first."""
    m = _TRAILING_WORDS_RE.search(s)
    if m is not None and _WORD_RE.search(m.group()):
        if _ALTERNATIVE_RE.search(m.group()) or readings(s[:m.start()]):
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


FORMAT_CREDIT = 0.1  # math_format: what a wrong number in the asked format earns


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


REWARDS: dict[str, RewardFn] = {
    "math": math_reward,  # 1 for the right final answer (#### or \boxed{}), else 0
    "math_format": math_format_reward,  # the same, plus 0.1 for a wrong #### <number>
}


# ------------------------------------------------------------------ registry and scoring
def load_reward(rm_type: str, custom_rm_path: str | None = None) -> RewardFn:
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
    from labkit.errors import ConfigError

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
    except (Exception, SystemExit) as e:  # whatever the user's file raises
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
    except Exception as e:  # one bad response must not stop the run
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
