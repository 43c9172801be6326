"""Which text of a response is its final answer: the last `#### <answer>` line or `\\boxed{}`.

Rule by rule (each comes from answers seen scored wrong):

1. The last marker wins, a `#### <answer>` line or a balanced `\\boxed{...}`, whichever comes
   later: a model that guesses `#### 26` early, or copies the prompt's `#### 42` example, and
   ends with the right `\\boxed{}` is right; `#### 623` early and `#### 440` last is 440.
2. A `####` line may open with words before the number: words that say it is the answer
   (`#### The final answer is: 440`, `#### **Answer:** 440`, `#### Final Answer` with the
   number on the next line), or any phrase on the line (`#### She has 42 apples left`,
   `#### Total: $42`, `#### In all, Maya read 57 pages.`). After an `=` the answer is its
   last side: `#### x = 5`, `#### 6 x 7 = 42 apples` (labkit.reward.number reads that, and
   words before the number inside a box: `\\boxed{\\text{The answer is } 42}`).
3. A `####` line that is a heading is not an answer: one with no digit (`\\(#### \\)` quoted
   from the instructions), a numbered heading (`#### 2. Compute`, `#### 3) Check`, `#### 4 -
   Verify`, also after a capitalized label: `#### Part 3: Check`), and `##### 3` (a deeper
   heading). With more text after it, so is a section number and a title (`\\boxed{42}`,
   then `#### 3 Verification` and a check: 42) and a label and a number (`#### Step 2`);
   as the last line, `#### Total 42` is an answer. A phrase is no label: `#### total 42`,
   `#### Total: 42`, `#### In 2 weeks she saves 42` (the number rules refuse that one).
4. A marker inside code (a fenced block, an inline `span`) is not the answer: `\\boxed{7}`,
   then a block that runs `print('#### 5')`, is 7. Only when no marker stands outside code
   does one inside count (a model that puts its `#### 42` in a block).

Every search is bounded: hostile responses (100k backticks, braces or `####` markers) are
read within a fraction of a second.
"""

from __future__ import annotations

import bisect
import re

# `####` (not part of a deeper `#####` heading), then an optional lead-in ("The final answer
# is:", "**Answer:**" with the number on the same or the next line, or `x =`), then an
# answer-like start (a line that opens with other words, "#### She has 42" or the heading
# "#### Step 2", is read by _HASH_PHRASE_RE below).
_HASH_RE = re.compile(
    r"(?<!#)####(?!#)[ \t]*"
    r"(?:\**[ \t]*(?:the[ \t]+)?(?:final[ \t]+)?answer(?:[ \t]+is)?[ \t]*:?[ \t]*\**[ \t]*:?[ \t]*\n?[ \t]*"
    r"|[A-Za-z][A-Za-z_]*[ \t]*=[ \t]*)?"
    r"([-+\u2212$\\.*(\d`\u00bc-\u00be\u2150-\u215e\u2189][^\n]*)", re.IGNORECASE)
# a heading: "#### 2. Compute the total", "#### 3) Check", "#### 4 - Verify", and (when more
# text follows it) "#### 3 Verification", a section number then a title
_HEADING_RE = re.compile(r"\d+(?:[.):]|[ \t]+[-\u2013\u2014])[ \t]+[A-Za-z]")
_TITLE_RE = re.compile(r"\d{1,2}[ \t]+[A-Z][A-Za-z]*(?:[ \t]+[A-Za-z]+)*[ \t]*:?")
# a `####` line that opens with words the pattern above does not read (`#### She has 42
# apples left`), taken whole; it holds no other `#`, so each line is read once
_HASH_PHRASE_RE = re.compile(r"(?<!#)####(?!#)[ \t]*([^\n#]*)")
_DIGIT_RE = re.compile(r"[\d\u00bc-\u00be\u2150-\u215e\u2189]")  # a digit, or a vulgar fraction: ¾
# markdown bold around words or a number (`**42** apples`), not Python's power (`2**3`)
BOLD_RE = re.compile(r"(?<![\w*])\*\*(?=\S)([^*\n]*?)(?<=\S)\*\*(?![\w*])")
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
        if (_DIGIT_RE.search(answer) and not _HEADING_RE.match(answer)
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
    line = BOLD_RE.sub(r"\1", line)
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


def last_boxed(text: str) -> str | None:
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


