"""The exact value of an answer: the one number it states, read with `fractions.Fraction`.

Most answers are plain numbers, so this path decides them in microseconds; only what it
cannot read (`\\sqrt{16}`, `16 + 8`) goes on to math-verify (labkit.reward.math). It reads,
as one number each (every class comes from answers seen scored wrong):

* markup that does not change a number: `$`, `%`, `€`, `£`, `\\boxed{}`, `\\text{}` and its
  kin (`\\textbf`, `\\mbox`, `\\mathrm`, `\\mathbf`, ...), `\\[ \\]`, markdown bold, inline code,
  a final period;
* thousands grouped by commas (`1,234,567`, LaTeX's `1{,}234`) or by spaces (`1 234 567`, also
  with a no-break, narrow no-break or thin space, or LaTeX's `\\,`): only groups of exactly
  three digits after a first group of one to three, so `12 34` and `42 43` stay two numbers;
* decimals, ratios (`3/4`), `\\frac{3}{4}`, mixed numbers (`2 1/2`) and vulgar fractions (`¾`,
  `2½`, `2 ½`, `1⅓`, `1⁄2` with a fraction slash);
* e-notation, whatever the letter's case (`1e3`, `1E3`, `-1.5e-2`), and a power of ten written
  out (`1.2 x 10^3`, `1.5 × 10³`, `1.5 \\times 10^{3}`, `1.5 \\cdot 10^3`, `1.5*10**3`,
  `2.5 · 10⁻²`), up to 10 to the ±MAX_EXPONENT (a larger one is no answer to a word problem,
  and building 10**100000000 takes minutes);
* words before the number, inside a box too (`\\boxed{\\text{The answer is } 42}`,
  `\\boxed{\\approx 42}`: labkit.reward.final_answer already cuts them from a `####` line).

5. What follows the number leaves the number: a unit or words (`#### 60 km/h`,
   `\\boxed{42\\text{ cm}^2}`, `#### 42 apples, all told`, `$5/day`, `42^\\circ`), also after a
   fraction or mixed number (`3/4 cup`, `1/2 of the pizza`, `2 1/2 hours` is 2.5), and
   working in brackets (`#### 42 (6 x 7 = 42)`, `#### 18 (3 * 6)`: its numbers are not the
   answer). A scale word multiplies it: `2 million` is 2000000, `1.5 thousand` 1500; `3
   dozen` is 36 or 3, whichever the label is (problems ask for eggs and for dozens of eggs
   alike, and a label is a plain number).
6. An answer is one number. A second one outside brackets, wherever it stands, makes the
   answer wrong: `#### 42 or 43`, `#### 42 43`, `#### between 40 and 50`, `#### 40-50
   minutes`, `#### In 2 weeks she saves 42` (words cannot say which number is meant: "she
   saves 42 in 2 weeks" puts it first; a number in words is no number, so `In two weeks she
   saves 42` is 42). So do `or` after the number (`42 (or 43)`, `42 or so`), words that add
   to it (`2 and a half`) and an operator (`42 + x`).

(Rules 1-4, which text is the final answer, are labkit.reward.final_answer's.)
"""

from __future__ import annotations

import re
from fractions import Fraction

from labkit.reward.final_answer import BOLD_RE, last_boxed

MAX_ANSWER_CHARS = 200  # a longer "final answer" is not a number a GSM8K problem asks for
MAX_EXPONENT = 400  # 10**400 and 10**-400 are the largest and smallest powers read

# ------------------------------------------------------------------ markup
_LATEX_TEXT_RE = re.compile(r"\\(?:text(?:bf|it|rm|sf|tt|up|normal)?|math(?:rm|bf|it|sf|tt|normal)"
                            r"|mbox|hbox|emph|operatorname)\*?\s*\{([^{}]*)\}")
_DEGREES_RE = re.compile(r"\^\s*\{?\s*\\circ\s*\}?")
# LaTeX's spaces (`\ `, `~`, `\,`, `\;`, `\:`, `\quad`) and unicode's (no-break, narrow
# no-break, thin, ...): a space between words, or between the groups of a number
_SPACE_RE = re.compile(r"\\[ ,;:]|\\q?quad(?![A-Za-z])|~|[\u00a0\u2000-\u200b\u202f\u205f\u3000]")
_JUNK = ("\\$", "$", "\\%", "%", "\\!", "\\left", "\\right", "`", "\\(", "\\)", "\\[", "\\]",
         "\\displaystyle", "\\textstyle", "\\euro", "\\pounds", "\u20ac", "\u00a3", "\u00a5",
         "\u20b9")  # `42` apples, \(42\) apples: inline, not math; € £ ¥ ₹ as $
_THOUSANDS_RE = re.compile(r"(?<=\d),(?=\d{3}(?:\D|$))")
_SPACED_RUN_RE = re.compile(r"(?<![\d.,/])\d+(?: \d+)+")  # `1 234 567`, or `42 43`: see _join
_SUPER = "\u2070\u00b9\u00b2\u00b3\u2074\u2075\u2076\u2077\u2078\u2079"  # superscript 0-9
_SUB = "".join(chr(0x2080 + i) for i in range(10))  # subscript 0-9
_ASCII = str.maketrans(_SUPER + _SUB + "\u207a\u207b", "0123456789" * 2 + "+-")
_SLASH_FRACTION_RE = re.compile(rf"(?:(\d)[ \t]*)?([{_SUPER}]+)[/\u2044\u2215]([{_SUB}]+)")  # 2¹⁄₂
_SUPERSCRIPT_RE = re.compile(rf"[\u207a\u207b]?[{_SUPER}]+")  # 10³, 10⁻², m²
_VULGAR = {"\u00bd": "1/2", "\u2153": "1/3", "\u2154": "2/3", "\u00bc": "1/4", "\u00be": "3/4",
           "\u2155": "1/5", "\u2156": "2/5", "\u2157": "3/5", "\u2158": "4/5", "\u2159": "1/6",
           "\u215a": "5/6", "\u2150": "1/7", "\u215b": "1/8", "\u215c": "3/8", "\u215d": "5/8",
           "\u215e": "7/8", "\u2151": "1/9", "\u2152": "1/10", "\u2189": "0/3"}
_VULGAR_RE = re.compile(rf"(?:(\d)[ \t]*)?([{''.join(_VULGAR)}])")  # 2½ and 2 ½: 2 1/2


def normalize_answer(text: str) -> str:
    """Strip what does not change a number (`$`, `%`, thousands separators, `\\boxed{}`,
    `\\text{}`, `\\[ \\]`, markdown bold, spaces after a sign, a final period) and write
    vulgar fractions and superscripts in ASCII (`2½` -> `2 1/2`, `10³` -> `10^{3}`).
    Returns the text left."""
    s = BOLD_RE.sub(r"\1", text.replace("\u2212", "-")).strip().strip("*`").strip()
    for left, right in (("\\[", "\\]"), ("\\(", "\\)"), ("$$", "$")):  # display math
        if s.startswith(left) and s.endswith(right):
            s = s[len(left):len(s) - len(right)].strip()
    while s.startswith("\\boxed{") and s.endswith("}") and last_boxed(s) == s[7:-1].strip():
        s = s[7:-1].strip()
    for _ in range(3):  # \text{\textbf{42}}: the innermost first, a bounded number of times
        s, found = _LATEX_TEXT_RE.subn(r" \1 ", s)
        if not found:
            break
    s = _SPACE_RE.sub(" ", _DEGREES_RE.sub("\u00b0", s))
    for junk in _JUNK:
        s = s.replace(junk, "")
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac").replace("{,}", ",")
    s = _SLASH_FRACTION_RE.sub(_ascii_fraction, s).replace("\u2044", "/").replace("\u2215", "/")
    s = _VULGAR_RE.sub(lambda m: (m.group(1) + " " if m.group(1) else "") + _VULGAR[m.group(2)], s)
    s = _SUPERSCRIPT_RE.sub(lambda m: "^{" + m.group().translate(_ASCII) + "}", s)
    s = _SPACED_RUN_RE.sub(_join, _THOUSANDS_RE.sub("", s))
    s = re.sub(r"^([-+])\s+", r"\1", s.strip())
    return s.rstrip(". ").strip()


def _ascii_fraction(m: re.Match) -> str:
    """`2¹⁄₂` -> `2 1/2`, `¾`-like fractions written with super- and subscript digits."""
    whole = m.group(1) + " " if m.group(1) else ""
    return f"{whole}{m.group(2).translate(_ASCII)}/{m.group(3).translate(_ASCII)}"


def _join(m: re.Match) -> str:
    """Numbers side by side, one space apart: one number when they are thousands groups
    (`1 234 567`: one to three digits, then groups of exactly three, not the whole number of
    a fraction `2 125/1000`), else left as they are (`42 43`, `12 34`, `2 1/2`)."""
    groups = m.group().split(" ")
    fraction = m.string[m.end():m.end() + 1] == "/"
    if len(groups[0]) <= 3 and all(len(g) == 3 for g in groups[1:]) and not fraction:
        return "".join(groups)
    return m.group()


# ------------------------------------------------------------------ one number
_NUM = r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?"
_NUMBER_RE = re.compile(rf"({_NUM})")
_RATIO_RE = re.compile(r"([-+]?\d+)/(\d+)")
_FRAC_RE = re.compile(r"([-+]?)\\frac\{([-+]?\d+(?:\.\d+)?)\}\{([-+]?\d+(?:\.\d+)?)\}")
# a mixed number at the start of an answer phrase (rule 5): `2 1/2`, `2 \frac{1}{2}`
_MIXED_RE = re.compile(r"([-+]?)(\d+)\s+(?:(\d+)/(\d+)|\\frac\{(\d+)\}\{(\d+)\})")
# a power of ten: `^3`, `^{-2}`, `^(3)`, `**3` (superscripts are `^{...}` by now)
_EXPONENT = r"(?:\^|\*\*)\s*(?:\{\s*([-+]?\d+)\s*\}|\(\s*([-+]?\d+)\s*\)|([-+]?\d+))"
_TIMES_TEN_RE = re.compile(
    rf"\s*(?:[xX*\u00d7\u00b7\u22c5\u2219]|\\times|\\cdot)\s*10\s*{_EXPONENT}")
_TEN_TO_RE = re.compile(rf"\s*{_EXPONENT}")  # after a bare 10: `10^3`
# words before the number (`The answer is 42`, `Total: 42`, `\approx 42`); at least one of
# two letters or an approximate sign, so `x 5` keeps its letter
_LEAD_IN_RE = re.compile(r"(?:[A-Za-z][A-Za-z'\u2019]*\.?(?:[ \t]*[:,][ \t]*|[ \t]+)"
                         r"|(?:\\approx|\\sim|\u2248)[ \t]*)+(?=[-+]?(?:\d|\.\d|\\frac|\\sqrt))")
_LEAD_WORD_RE = re.compile(r"[A-Za-z]{2}|\\approx|\\sim|\u2248")
_EQUALS_OR_COMMA_RE = re.compile(r"[,=]")


def parse_number(text: str) -> Fraction | None:
    """The exact value of a numeric answer (`-1,234.50`, `$18`, `25%`, `3/4`, `\\frac{3}{4}`,
    `2½`, `1 234 567`, `1.2 x 10^3`, `1e3`, `42 apples`, `2 1/2 hours`, `2 million`, `42 (6 x 7
    = 42)`, `x = 5`, `The answer is 42`), or None when it is not one number (`42 or 43`, `42
    43`), or is too long to be one. `3 dozen` is 36 here; readings() also gives its other
    reading, 3."""
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
        value = _decimal(m.group(1))
        return () if value is None else (value,)
    side = _last_side(s)
    return () if side is None else _phrase_readings(without_lead_in(side))


def without_lead_in(s: str) -> str:
    """`s` without the words before its number (`The answer is 42` -> `42`); `s` itself when
    no number follows words (`x + 1`, `42 apples`, `x 5`)."""
    m = _LEAD_IN_RE.match(s)
    return s[m.end():] if m is not None and _LEAD_WORD_RE.search(m.group()) else s


def _decimal(text: str) -> Fraction | None:
    """The value of a decimal in e-notation or not (`-1.5e-2`); None past 10**±MAX_EXPONENT."""
    _, _, exponent = text.lower().partition("e")
    if exponent and (len(exponent) > 6 or abs(int(exponent)) > MAX_EXPONENT):
        return None
    return Fraction(text)


def _last_side(s: str) -> str | None:
    """What follows the last `=` outside brackets (`6 x 7 = 42 apples` -> `42 apples`), or
    `s` itself without one; None for a list (`3, b = 4`, `a = 3, b = 4`)."""
    if not _EQUALS_OR_COMMA_RE.search(s):
        return s
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
    zero denominator, a mixed number whose fraction is not proper (`2 6/4`), or a power of
    ten past MAX_EXPONENT."""
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
    if (m := _NUMBER_RE.match(s)) is None or (value := _decimal(m.group(1))) is None:
        return None
    power = _TIMES_TEN_RE.match(s, m.end())
    if power is None and m.group(1).lstrip("+-") == "10":  # `10^3`: 1 x 10^3
        power = _TEN_TO_RE.match(s, m.end())
        value = value / 10 if power is not None else value
    if power is None:
        return value, m.end()
    exponent = next(g for g in power.groups() if g is not None)
    if len(exponent) > 6 or abs(int(exponent)) > MAX_EXPONENT:
        return None
    return value * Fraction(10) ** int(exponent), power.end()


# ------------------------------------------------------------------ what follows the number
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
ALTERNATIVE_RE = re.compile(
    r"\bor\b|\band\s+(?:a|an|one|two|three)\s+(?:half|halves|quarters?|thirds?)\b", re.IGNORECASE)
_UNIT_POWER_RE = re.compile(r"\^\s*\{?\s*-?[1-4]\s*\}?")  # cm^2, m/s^{2}, m s^{-1}
_BRACKETS_RE = re.compile(r"\([^()\[\]]*\)|\[[^()\[\]]*\]")  # innermost (...) or [...]
# what no unit holds: a digit (another number) or an operator (`42 + x`, `42 \pi`)
_NOT_A_UNIT_RE = re.compile(r"[\d+*=<>^\\{}|\u00d7\u00f7]")


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
    if not _TAIL_START_RE.match(tail) or ALTERNATIVE_RE.search(tail):
        return ()
    tail = _UNIT_POWER_RE.sub(" ", tail)
    while (bare := _BRACKETS_RE.sub(" ", tail)) != tail:  # working in brackets, innermost first
        tail = bare
    return () if _NOT_A_UNIT_RE.search(tail) else values
