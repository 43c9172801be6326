"""Tests of labkit.reward: final-answer extraction, the math reward, custom rewards, scoring."""

from __future__ import annotations

import concurrent.futures
import json
import math
import os
import re
import subprocess
import sys
import threading
import time
import warnings
from fractions import Fraction
from pathlib import Path

import pytest
from waiting import DEADLINE_S, Lines

from labkit import reward
from labkit.reward import (
    REWARDS,
    extract_final_answer,
    load_reward,
    math_reward,
    parse_number,
    score,
    verifier,
)


@pytest.fixture(scope="module", autouse=True)
def warm_math_verify():
    """Start math-verify's worker, so timings below measure scoring, not imports."""
    assert verifier.warm_up()


# (response, label, expected reward)
CASES = [
    ("So she has 18 left.\n#### 18", "18", 1.0),
    ("#### 17", "18", 0.0),
    ("#### 1,234", "1234", 1.0),
    ("#### 1,234,567", "1234567", 1.0),
    ("#### $18", "18", 1.0),
    ("#### $18.00", "18", 1.0),
    ("#### 25%", "25", 1.0),
    ("#### 42.0", "42", 1.0),
    ("#### 42.00", "42", 1.0),
    ("#### 42.5", "42", 0.0),
    ("#### 42.", "42", 1.0),
    ("#### 3/4", "0.75", 1.0),
    ("#### 0.75", "3/4", 1.0),
    ("#### \\frac{3}{4}", "0.75", 1.0),
    ("#### \\dfrac{6}{8}", "0.75", 1.0),
    ("#### -\\frac{1}{2}", "-0.5", 1.0),
    ("#### -5", "-5", 1.0),
    ("#### 5", "-5", 0.0),
    ("#### \u22125", "-5", 1.0),  # unicode minus
    ("#### **42**", "42", 1.0),  # markdown bold
    ("#### 42 apples", "42", 1.0),
    ("The answer is \\boxed{42}.", "42", 1.0),
    ("\\boxed{\\frac{3}{4}}", "0.75", 1.0),
    ("\\boxed{41}", "42", 0.0),
    ("#### 42 \\text{ dollars}", "42", 1.0),
    ("First \\boxed{5}, then \\boxed{6}", "6", 1.0),  # last boxed wins
    ("First \\boxed{5}, then \\boxed{6}", "5", 0.0),
    ("#### 5\nwait, I made an error.\n#### 6", "6", 1.0),  # last #### wins
    ("#### 5\nwait, I made an error.\n#### 6", "5", 0.0),
    ("#### 9\nor maybe \\boxed{8}", "8", 1.0),  # the last marker wins, #### or boxed
    ("#### 9\nor maybe \\boxed{8}", "9", 0.0),
    # made-up rows in the shapes of real ones that scored 0: an early guess, a copied
    # example, a quoted instruction, each followed by the right \boxed{}
    ("Quick guess: #### 26\nChecking: 4 + 3 x 8 = 28, so \\boxed{28}", "28", 1.0),
    ("Format, as in the example:\n#### 42\nNow mine: 3 + 4 = 7\n\\boxed{7}", "7", 1.0),
    ("I must end with \\(#### \\) and the number. 5 x 3 = 15, \\boxed{15}", "15", 1.0),
    ("\\boxed{5} was wrong\n#### 6", "6", 1.0),  # a later #### still beats a boxed
    ("#### 2. Compute the total\nThe total is 2 + 8.", "2", 0.0),  # a numbered heading
    ("#### x = 5", "5", 1.0),
    ("#### \\[12\\]", "12", 1.0),
    ("#### \\(12\\)", "12", 1.0),
    ("I think the answer is 42.", "42", 0.0),  # no final-answer marker
    ("", "42", 0.0),
    ("####", "42", 0.0),
    ("#### Step 1: add\n42 in total", "42", 0.0),  # a markdown heading is not an answer
    ("\\boxed{42", "42", 0.0),  # unbalanced
    ("\\boxed{\\sqrt{1764}}", "42", 1.0),  # needs math-verify
    ("#### 2^{5}+10", "42", 1.0),  # needs math-verify
    ("#### 2^{5}+11", "42", 0.0),
    # a marker inside code is not the answer (rule 4)
    ("The answer is \\boxed{7}.\n```python\nprint('#### 5')\n```", "7", 1.0),
    ("The answer is \\boxed{7}.\n```python\nprint('#### 5')\n```", "5", 0.0),
    ("\\boxed{7}\n~~~\n#### 5\n~~~\nDone.", "7", 1.0),
    ("\\boxed{7}; check it with `print('#### 5')`.", "7", 1.0),
    ("#### 7\n```latex\n\\boxed{5}\n```", "7", 1.0),
    ("\\boxed{7}\n```python\nprint('#### 5')", "7", 1.0),  # a block never closed
    ("```\n#### 42\n```", "42", 1.0),  # no marker outside code: the one inside counts
    ("#### `42`", "42", 1.0),
    # a unit after the number (rule 5)
    ("#### 60 km/h", "60", 1.0),
    ("\\boxed{42\\text{ cm}^2}", "42", 1.0),
    ("#### 60 km/h", "6", 0.0),
    ("#### 60km/h", "60", 1.0),
    ("#### $5/day", "5", 1.0),
    ("#### 9.8 m/s^2", "9.8", 1.0),
    ("\\boxed{42 \\mathrm{m}^{2}}", "42", 1.0),
    ("\\boxed{60\\ \\text{km/h}}", "60", 1.0),
    ("\\boxed{42^\\circ}", "42", 1.0),
    ("\\boxed{42^{\\circ} \\text{F}}", "42", 1.0),
    ("#### 5 x 3", "5", 0.0),  # another number after it: not "5 and a unit"
    ("#### 60 or 70", "60", 0.0),
    # a heading after the answer is not one (rule 3)
    ("So \\boxed{42}.\n#### 3 Verification\nCheck: 40 + 2 = 42.", "42", 1.0),
    ("So \\boxed{42}.\n#### 3 Verification\nCheck: 40 + 2 = 42.", "3", 0.0),
    ("\\boxed{42}\n##### 3 Check\n40 + 2 = 42", "42", 1.0),
    ("\\boxed{42}\n#### 3) Verification\n40 + 2 = 42", "42", 1.0),
    ("\\boxed{42}\n#### 4 - Verify\n40 + 2 = 42", "42", 1.0),
    ("3 boxes of 14 apples.\n#### 42 Apples", "42", 1.0),  # the last line: an answer
    # words that lead in to the answer (rule 2)
    ("#### 623\nLet me recheck.\n#### The final answer is: 440", "440", 1.0),
    ("#### 623\nLet me recheck.\n#### The final answer is: 440", "623", 0.0),
    ("#### Final Answer: 440", "440", 1.0),
    ("#### **Answer:** 440", "440", 1.0),
    ("#### The answer is $440.", "440", 1.0),
    ("#### Final Answer\n440", "440", 1.0),
    ("#### Final Answer\nThe total is 440.", "440", 0.0),  # the next line is not an answer
]


@pytest.mark.parametrize("response,label,expected", CASES)
def test_math_reward_table(response, label, expected):
    assert math_reward(response, label) == expected


@pytest.mark.parametrize("text,answer", [
    ("work...\n#### 72", "72"),
    ("#### 1\n#### 2", "2"),
    ("\\boxed{\\frac{1}{2}} and \\boxed{3}", "3"),
    ("\\boxed{\\boxed{3}}", "3"),
    ("\\boxed{ {a}{b} }", "{a}{b}"),
    ("#### 4 \\boxed{5}", "5"),  # the boxed comes later
    ("#### 2. Add them\n#### 3. Divide", None),
    ("Format: \\(#### \\)", None),
    ("nothing here", None),
    ("\\boxed{1", None),
    ("\\boxed{7}\n```\nprint('#### 5')\n```", "7"),
    ("```\nx = {1: 2}\n```\n\\boxed{7}", "7"),  # braces in code do not unbalance the box
    ("#### 5\n#### 2 Check\nmore", "5"),
    ("#### 5\n#### 2 Check", "2 Check"),  # nothing after it: an answer with a word
    ("#### The final answer is: 440", "440"),
    ("#### She has 42 apples left", "42 apples left"),  # a phrase leads in (rule 2)
    ("#### 5\n#### Step 2\nAdd them.", "5"),  # a label and a number, then text: a heading
    ("#### 5\n#### Total 42", "42"),  # the same shape as the last line: an answer
])
def test_extract_final_answer(text, answer):
    assert extract_final_answer(text) == answer


def test_parse_number():
    assert parse_number("$1,234.50") == parse_number("2469/2")
    assert parse_number("\\frac{3}{4}") == parse_number("0.75")
    assert parse_number("3/0") is None
    assert parse_number("x + 1") is None
    assert parse_number("9" * 500) is None  # too long to be an answer


# ------------------------------------------------------------ answers in words (rules 2, 3, 5, 6)
# made-up answers of the kinds models write after `####`: a phrase before the number, working
# in brackets after it, a fraction with its unit, a scale word, and answers that stay wrong
PHRASED = [
    # a phrase between the marker and the number
    ("#### The answer is 42", "42", 1.0),
    ("#### She has 42 apples left", "42", 1.0),
    ("#### Total: $42", "42", 1.0),
    ("#### In all, Maya read 57 pages.", "57", 1.0),
    ("#### Tom needs 8 more boxes", "8", 1.0),
    ("#### Total cost = $1,250", "1250", 1.0),
    ("#### So the bakery made $96 in total.", "96", 1.0),
    ("#### He will be 15 years old", "15", 1.0),
    ("#### The temperature is -7 degrees", "-7", 1.0),
    ("#### The difference is 12", "21", 0.0),
    ("#### Each friend gets 2.5 cookies", "2.5", 1.0),
    # working in brackets after the number
    ("#### 42 (6 x 7 = 42)", "42", 1.0),
    ("#### 42 (6 x 7 = 42)", "7", 0.0),
    ("#### 42 (because 40 + 2)", "42", 1.0),
    ("#### 18 (3 * 6)", "18", 1.0),
    ("#### 18 (3 * 6)", "6", 0.0),
    ("#### 35 marbles (5 bags of 7)", "35", 1.0),
    ("#### $64 (16 hours at $4 an hour)", "64", 1.0),
    ("#### 42 [from 6 x 7]", "42", 1.0),
    ("#### 42 (or 43)", "43", 0.0),
    ("#### 42 (or 43)", "42", 0.0),
    # a fraction or a mixed number with its unit
    ("#### 3/4 cup", "0.75", 1.0),
    ("#### 1/2 of the pizza", "0.5", 1.0),
    ("#### 2 1/2 hours", "2.5", 1.0),
    ("#### 1 3/4 miles", "1.75", 1.0),
    ("#### 5/8 of a tank", "0.625", 1.0),
    ("#### 2 1/2 hours", "2", 0.0),
    ("#### -1 1/2", "-1.5", 1.0),
    ("#### 2 \\frac{1}{4} pounds", "2.25", 1.0),
    # a scale word
    ("#### 2 million", "2000000", 1.0),
    ("#### 1.5 thousand", "1500", 1.0),
    ("#### $3.2 million", "3200000", 1.0),
    ("#### 4 hundred dollars", "400", 1.0),
    ("#### 2 million", "2", 0.0),
    ("#### 3 dozen eggs", "36", 1.0),
    ("#### 3 dozen", "3", 1.0),
    # answers that stay wrong: two numbers, `or`, words that add to the number
    ("#### 42 or 43", "42", 0.0),
    ("#### 42 or 43", "43", 0.0),
    ("#### between 40 and 50", "40", 0.0),
    ("#### between 40 and 50", "50", 0.0),
    ("#### In 2 weeks she saves 42", "42", 0.0),
    ("#### In 2 weeks she saves 42", "2", 0.0),
    ("#### 40-50 minutes", "40", 0.0),
    ("#### 2 and a half hours", "2", 0.0),
    ("#### at least 40", "40", 1.0),  # a bound is read as its number: one number, no other
    ("#### 42, or maybe 43", "42", 0.0),
    ("#### She has -3 dollars", "3", 0.0),
    ("#### The price is $1,000 now", "1000", 1.0),
    ("#### The store sold 25% of its stock", "25", 1.0),
]


@pytest.mark.parametrize("response,label,expected", PHRASED)
def test_phrased_answers(response, label, expected):
    assert math_reward(response, label) == expected


def test_a_phrase_before_the_number_leads_in_to_it():
    """Rule 2: words on the `####` line before the number are a lead-in, whatever they say."""
    assert extract_final_answer("#### She has 42 apples left") == "42 apples left"
    assert extract_final_answer("#### Total: $42") == "$42"
    assert extract_final_answer("#### So the bakery made **$96** in total.") == "$96 in total."
    assert math_reward("#### **She has 42 apples**", "42") == 1.0
    assert math_reward("#### Final Answer\nShe has 42 apples.", "42") == 0.0  # not its line


def test_the_last_side_of_an_equals_is_the_answer():
    """Rule 2: after `=`, the answer is the last side; a list of equations is no answer."""
    assert math_reward("#### The total is 6 x 7 = 42", "42") == 1.0
    assert parse_number("6 x 7 = 42 apples") == 42
    assert parse_number("x = 5") == 5
    assert parse_number("a = 3, b = 4") is None


def test_a_capitalized_label_and_a_number_is_a_heading_when_text_follows():
    """Rule 3: `#### Step 2` before more text is a heading; as the last line it is an answer."""
    assert math_reward("\\boxed{42}\n#### Step 2\nAdd the boxes.", "42") == 1.0
    assert math_reward("\\boxed{42}\n#### Part 3: Check\n40 + 2 = 42", "42") == 1.0
    assert math_reward("#### Total 42", "42") == 1.0
    assert math_reward("#### So 42\n", "42") == 1.0  # only blank space after it
    assert extract_final_answer("#### In 2 weeks she saves 42\nDone.") == "2 weeks she saves 42"


def test_working_in_brackets_after_the_number_is_not_the_answer():
    """Rule 5: a bracket after the number (and a space) holds working; one against the
    number is math (`3(4+5)` is 27)."""
    assert parse_number("18 (3 * 6)") == 18
    assert parse_number("42 (6 x (3 + 4)) apples") == 42
    assert math_reward("#### 18 (3 * 6)", "6") == 0.0
    assert parse_number("3(4+5)") is None and math_reward("#### 3(4+5)", "27") == 1.0


def test_fractions_and_mixed_numbers_keep_their_unit():
    """Rule 5: `3/4 cup` is 3/4 and `2 1/2 hours` is 5/2; `2 6/4` is two numbers."""
    assert parse_number("3/4 cup") == Fraction(3, 4)
    assert parse_number("2 1/2 hours") == Fraction(5, 2)
    assert parse_number("-1 1/2") == Fraction(-3, 2)
    assert parse_number("2 \\frac{1}{4} pounds") == Fraction(9, 4)
    assert parse_number("2 6/4") is None and parse_number("2 1/0") is None
    assert math_reward("#### 2 6/4", "2") == 0.0


def test_a_scale_word_multiplies_the_number():
    """Rule 5: `2 million` is 2000000, never 2; `3 dozen` is 36, or 3 for a problem that
    counts dozens; a word that only starts like a scale is a unit."""
    assert parse_number("2 million") == 2_000_000
    assert parse_number("$3.2 billion") == 3_200_000_000
    assert parse_number("1/2 million") == 500_000
    assert parse_number("2 1/2 dozen") == 30
    assert parse_number("5 hundred-dollar bills") == 5 and parse_number("2 millionaires") == 2
    assert reward.readings("3 dozen eggs") == (36, 3)
    assert math_reward("#### 3 dozen", "36") == math_reward("#### 3 dozen", "3") == 1.0
    assert math_reward("#### 3 dozen", "12") == 0.0
    assert math_reward("#### 2 million", "2") == 0.0


ONE_NUMBER_TOO_MANY = ["42 or 43", "between 40 and 50", "40-50 minutes", "40 to 50",
                       "In 2 weeks she saves 42", "42 (or 43)", "42, or maybe 43",
                       "2 and a half hours", "$1,000 or $2,000", "42 apples and 3 pears"]


@pytest.mark.parametrize("answer", ONE_NUMBER_TOO_MANY)
def test_an_answer_is_one_number(answer):
    """Rule 6: with a second number outside brackets (or `or`, or `and a half`) no number
    in the answer is right, and it earns no format credit."""
    from labkit.reward import math_format_reward

    for label in re.findall(r"\d+", answer.replace(",", "")):
        assert math_reward(f"#### {answer}", label) == 0.0
        assert math_format_reward(f"#### {answer}", label) == 0.0


def test_answers_in_words_never_reach_math_verify(monkeypatch):
    """Rule 6: math-verify reads `42 (or 43)` as 43; only an expression goes to it, without
    its unit."""
    asked = []
    monkeypatch.setattr(reward.math, "verify_with_timeout",
                        lambda answer, label, timeout_s=None: asked.append(answer) or True)
    assert math_reward("#### 42 (or 43)", "43") == 0.0
    assert math_reward("#### 42 apples (or 43)", "43") == 0.0
    assert math_reward("#### 2 6/4", "2") == 0.0
    assert math_reward("#### 16 + 8 or so", "24") == 0.0
    assert asked == []
    assert math_reward("#### 16 + 8 apples", "24") == 1.0
    assert asked == ["16 + 8"]


def test_inline_code_math_and_bold_around_the_number_are_markup():
    assert parse_number("`42` apples") == parse_number("\\(42\\) apples") == 42
    assert parse_number("**42** apples") == 42
    assert parse_number("2**3") is None  # Python's power is no bold
    assert math_reward("#### `42`^2", "42") == 0.0  # 42 squared


def test_math_format_credit_goes_to_wrong_numbers_only():
    """A right answer in words scores 1.0 under math_format too (`2 million` earned the
    wrong-number credit); a wrong one that reads as one number earns FORMAT_CREDIT, and one
    that does not read earns nothing."""
    from labkit.reward import FORMAT_CREDIT, math_format_reward

    for response, label, expected in PHRASED:
        form_reward = math_format_reward(response, label)
        if expected == 1.0:
            assert form_reward == 1.0, response
        readable = parse_number(extract_final_answer(response)) is not None
        assert math_format_reward(response, "987654") == (FORMAT_CREDIT if readable else 0.0)
    assert math_format_reward("#### 2 million", "2000000") == 1.0
    assert math_format_reward("#### She has 42 apples left", "41") == FORMAT_CREDIT
    assert math_format_reward("#### 42 (6 x 7 = 42)", "7") == FORMAT_CREDIT
    assert math_format_reward("#### 2 1/2 hours", "3") == FORMAT_CREDIT
    assert math_format_reward("#### In 2 weeks she saves 42", "42") == 0.0


# ------------------------------------------------------------ classes of numbers (labkit.reward.number)
# made-up answers of each class models write: several of each, none of them the lines the
# classes were first found by
CLASSES = [
    # words inside the box, before the number (and after it)
    ("\\boxed{\\textbf{Final answer:} 56}", "56", 1.0),
    ("\\boxed{\\mbox{Total: }18}", "18", 1.0),
    ("\\boxed{\\text{She needs } 7 \\text{ more boxes}}", "7", 1.0),
    ("\\boxed{\\text{The temperature is } -12}", "-12", 1.0),
    ("\\boxed{\\textit{Answer: } 3.75}", "3.75", 1.0),
    ("\\boxed{\\text{about } \\$1,250}", "1250", 1.0),
    ("\\boxed{The answer is 88}", "88", 1.0),
    ("\\boxed{\\text{\\textbf{64}}}", "64", 1.0),
    ("\\boxed{\\mathbf{31}}", "31", 1.0),
    ("\\boxed{\\text{Each gets }\\frac{3}{4}}", "0.75", 1.0),
    ("\\boxed{\\approx 42}", "42", 1.0),
    ("\\boxed{\\text{The answer is } 57}", "75", 0.0),
    ("\\boxed{\\text{In 3 days she reads } 45}", "45", 0.0),  # two numbers (rule 6)
    ("\\boxed{\\text{In 3 days she reads } 45}", "3", 0.0),
    ("\\boxed{\\text{between } 40 \\text{ and } 50}", "40", 0.0),
    ("\\boxed{\\text{x } 5}", "5", 0.0),  # a letter is no lead-in
    # thousands grouped by spaces: plain, no-break, narrow no-break, thin, LaTeX's
    ("#### 2 500", "2500", 1.0),
    ("#### 12 345 678", "12345678", 1.0),
    ("#### -3 000", "-3000", 1.0),
    ("#### $4 500.50", "4500.5", 1.0),
    ("#### 1\u00a0500 apples", "1500", 1.0),
    ("#### 3\u202f000\u202f000", "3000000", 1.0),
    ("#### 7\u2009250 km", "7250", 1.0),
    ("\\boxed{1\\,000\\,000}", "1000000", 1.0),
    ("\\boxed{1\\ 500}", "1500", 1.0),
    ("#### 1{,}234{,}567", "1234567", 1.0),  # LaTeX's comma
    ("#### 1 2345", "12345", 0.0),  # not groups of three: two numbers
    ("#### 1234 567", "1234567", 0.0),
    ("#### 7 50", "750", 0.0),
    ("#### 12\\,34", "1234", 0.0),
    ("#### 12 34", "12", 0.0),
    # e-notation, whatever the letter's case
    ("#### 2.5e3", "2500", 1.0),
    ("#### 2.5E+3", "2500", 1.0),
    ("#### 7.5e-1", "0.75", 1.0),
    ("#### -4e2", "-400", 1.0),
    ("\\boxed{3E2}", "300", 1.0),
    ("#### 1e3 dollars", "1000", 1.0),
    ("#### 5e", "5", 0.0),  # no exponent: not e-notation
    # a power of ten written out
    ("#### 3 \\cdot 10^4", "30000", 1.0),
    ("#### 4.2 X 10^2", "420", 1.0),
    ("#### 2.5 \u22c5 10^{-1}", "0.25", 1.0),
    ("#### 6*10**3", "6000", 1.0),
    ("#### -1.5 \u00d7 10\u2074", "-15000", 1.0),  # a superscript exponent
    ("#### 2.5 \u00b7 10\u207b\u00b2", "0.025", 1.0),
    ("#### 7 \u00d7 10^2 km", "700", 1.0),
    ("#### 10^{2}", "100", 1.0),
    ("#### 10\u2075", "100000", 1.0),
    ("#### 1.2 x 10^3", "1.2", 0.0),
    ("#### 3 x 10^2 + 1", "300", 0.0),  # an operator after it (rule 6)
    ("#### 1.2 x 10^3 or 1.3 x 10^3", "1200", 0.0),
    # vulgar fractions, against a digit, after a space, alone, with a fraction slash
    ("#### 3\u00bc", "3.25", 1.0),
    ("#### \u00bd", "0.5", 1.0),
    ("#### -1\u00bd", "-1.5", 1.0),
    ("#### 4 \u00be cups", "4.75", 1.0),
    ("#### \u215d of a tank", "0.625", 1.0),
    ("\\boxed{2\u2154}", "8/3", 1.0),
    ("#### 5\u20448", "0.625", 1.0),
    ("#### 2\u00b9\u2044\u2082 hours", "2.5", 1.0),
    ("#### $3\u00bd", "3.5", 1.0),
    ("#### 3\u00bc", "3", 0.0),
    ("#### 2 and \u00bd", "2.5", 0.0),  # words that add to it (rule 6)
    # other classes: currency signs, full-width digits, markup, a unit's power
    ("#### \u20ac42", "42", 1.0),
    ("\\boxed{\u00a342}", "42", 1.0),
    ("\\boxed{42\u20ac}", "42", 1.0),
    ("#### \uff14\uff12", "42", 1.0),
    ("\\boxed{\\displaystyle 42}", "42", 1.0),
    ("#### 9.8 m s^{-2}", "9.8", 1.0),
    ("#### 42 m\u00b2", "42", 1.0),
]


@pytest.mark.parametrize("response,label,expected", CLASSES)
def test_each_class_of_numbers(response, label, expected):
    assert math_reward(response, label) == expected


@pytest.mark.parametrize("answer,value", [
    ("1 234 567", 1234567), ("1\u00a0234", 1234), ("1\u202f234", 1234), ("1\u2009234", 1234),
    ("1e3", 1000), ("1E3", 1000), ("-1.5e-2", Fraction(-3, 200)), ("1.2 x 10^3", 1200),
    ("1.5 \u00d7 10\u00b3", 1500), ("1.5 \\times 10^{3}", 1500), ("1.5*10^3", 1500),
    ("1.5 \u00b7 10^3", 1500), ("2\u00bd", Fraction(5, 2)), ("2 \u00bd", Fraction(5, 2)),
    ("\u00be", Fraction(3, 4)), ("1\u2153", Fraction(4, 3)), ("The answer is 42", 42),
])
def test_parse_number_reads_each_class(answer, value):
    assert parse_number(answer) == value


@pytest.mark.parametrize("answer", ["42 43", "12 34", "1 2345", "7 50", "2 1/2 3", "1e401",
                                    "2 x 10^999", "10^{100000}", "3,5", "1.234.567", "1 234 56"])
def test_what_is_not_one_number_stays_refused(answer):
    """Groups of exactly three digits make one number; other numbers side by side stay two
    (rule 6); powers past MAX_EXPONENT and the debatable separators read as no number."""
    from labkit.reward import math_format_reward

    assert parse_number(answer) is None
    assert math_format_reward(f"#### {answer}", "987654") == 0.0  # no number, no format credit


def test_the_debatable_answers_read_as_the_docstring_says():
    """A decimal comma is no number, a dot is the decimal point, rounding is not forgiven
    (labkit.reward.math's docstring says why)."""
    from labkit.reward import math_format_reward

    assert math_reward("#### 3,5", "3.5") == math_reward("#### 3,5", "35") == 0.0
    assert math_reward("#### 3,500", "3500") == 1.0
    assert parse_number("1.234") == Fraction(1234, 1000)
    assert math_reward("#### 1.234", "1234") == 0.0
    assert math_reward("#### 3.3333", "3.33") == math_reward("#### 3.33", "10/3") == 0.0
    assert math_format_reward("#### 3.3333", "3.33") == 0.1  # a wrong number, in the format
    assert math_reward("#### 42 430", "42430") == 1.0


def test_format_credit_follows_the_classes():
    """math_format pays 1.0 to a right answer of every class, and 0.1 to a wrong one that
    reads as one number in the asked format."""
    from labkit.reward import FORMAT_CREDIT, math_format_reward

    for response, label, expected in CLASSES:
        if expected == 1.0:
            assert math_format_reward(response, label) == 1.0, response
        readable = parse_number(extract_final_answer(response)) is not None
        hashed = response.startswith("####")
        assert math_format_reward(response, "987654") == (
            FORMAT_CREDIT if readable and hashed else 0.0), response


def test_numbers_never_reach_math_verify(monkeypatch):
    """The exact path reads every class itself: math-verify is not asked."""
    asked = []
    monkeypatch.setattr(reward.math, "verify_with_timeout",
                        lambda answer, label, timeout_s=None: asked.append(answer) or False)
    for response, label, expected in CLASSES:
        if expected == 1.0:
            assert math_reward(response, label) == 1.0, response
    assert asked == []


ADVERSARIAL = {
    "10**100000 written out": "#### 1" + "0" * 100_000,
    "10k digits": "#### " + "7" * 10_000,
    "10k digits boxed": "\\boxed{" + "7" * 10_000 + "}",
    "nested boxed, unbalanced": "\\boxed{" * 5_000,
    "deep balanced braces": "\\boxed{" + "{" * 5_000 + "42" + "}" * 5_001,
    "deeply nested frac": "#### " + "\\frac{" * 3_000 + "1" + "}{2}" * 3_000,
    "short nested frac": "#### " + "\\frac{" * 6 + "1" + "}{2}" * 6,
    "power tower": "#### 9^{9^{9^{9}}}",
    "huge power": "#### 10^{100000}",
    "two-digit power": "#### 99^{99}",
    "factorial": "#### 100000!",
    "big sum": "\\boxed{\\sum_{i=1}^{10^{12}} i}",
    "exponent notation": "#### 1e100000000",
    "big product": "#### 99999999999999*99999999999999",
    "only closing braces": "}" * 100_000,
    "many markers": "#### " * 20_000,
    "many boxes": "\\boxed{1}" * 20_000,
    "unbalanced in #### line": "#### \\frac{{{{{{{{{{{{1}{2",
    "a line of backticks": "`" * 100_000,
    "many code fences": "```\n" * 20_000,
    "a code block never closed": "```python\n" + "x = 1\n" * 20_000,
    "many titled headings": "#### 3 Verification\n" * 20_000,
    "many lead-ins": "#### The final answer is: " * 10_000,
    "a long unit": "#### 5 " + "km/h " * 40_000,
    "a long phrase before the number": "#### " + "she has " * 20_000 + "7",
    "a phrase line of brackets": "#### She has " + "(" * 50_000 + "7",
    "many phrase lines": "#### She has 7 apples\n" * 20_000,
    "many labelled headings": "#### Step 2\nAdd.\n" * 20_000,
    "many bracketed workings": "#### 7 " + "(1) " * 20_000,
    "a long label": "#### " + "A" * 100_000 + " 7\nmore",
}


@pytest.mark.parametrize("name", list(ADVERSARIAL))
def test_adversarial_answers_score_zero_fast(name):
    start = time.perf_counter()
    assert math_reward(ADVERSARIAL[name], "42") == 0.0
    assert time.perf_counter() - start < 0.5


def test_deeply_nested_calls_never_reach_sympy():
    nested = "exp(" * 9 + "10" + ")" * 9  # nine nested calls: sympy ran >100 s on such a one
    assert not reward.is_safe_for_sympy(nested)
    restarts = verifier.restarts
    start = time.perf_counter()
    assert math_reward(f"#### {nested}", "5") == 0.0
    assert time.perf_counter() - start < 0.1
    assert verifier.restarts == restarts  # the worker never saw it


POLYNOMIALS = ["(a+b+c+d+e+f+g+h)^{99}", "(a+b+c+d+e+f+g+h)^{9}", "(x+1)^{50}",
               "(a+b+c+d)(e+f+g+h)(i+j+k+l)(m+n+o+p)", "(a+b)\\cdot(c+d)", "\\left(a+b\\right)^2"]


@pytest.mark.parametrize("answer", POLYNOMIALS)
def test_polynomials_to_expand_never_reach_sympy(answer):
    """Expanding (a+...+h)^99 ran for minutes; a power or product of brackets that hold a
    letter is refused before math-verify sees it."""
    assert not reward.is_safe_for_sympy(reward.normalize_answer(answer))
    restarts = verifier.restarts
    start = time.perf_counter()
    assert math_reward(f"\\boxed{{{answer}}}", "24") == 0.0
    assert time.perf_counter() - start < 0.5
    assert verifier.restarts == restarts


@pytest.mark.parametrize("answer", ["2^{5}+10", "(2+3)^{2}", "x = 5", "\\sqrt{16}", "16 + 8",
                                    "3(4+5)", "\\frac{1}{2}(3+4)", "2x^{2}"])
def test_numeric_powers_and_products_still_reach_math_verify(answer):
    assert reward.is_safe_for_sympy(answer)


def test_non_strings_score_zero():
    assert math_reward(None, "42") == 0.0
    assert math_reward("#### 42", None) == 0.0


def test_reward_works_off_the_main_thread():
    cases = [(r, y) for r, y, _ in CASES]
    expected = [e for _, _, e in CASES]
    results = []
    worker = threading.Thread(target=lambda: results.extend(math_reward(r, y) for r, y in cases))
    worker.start()
    worker.join(timeout=60)
    assert results == expected
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        assert list(pool.map(lambda ry: math_reward(*ry), cases)) == expected


HOSTILE = "(a+b+c+d+e+f+g+h)^{99}"  # sympy expands it for minutes


def _threads() -> set:
    return set(threading.enumerate())


def test_a_check_past_its_timeout_is_killed_and_the_fallback_stays_on(monkeypatch):
    """With the pre-check off, each hostile answer runs past its timeout: its worker is
    killed (the process is gone, no thread is left behind) and the next check gets a new
    one, however many came before; `16 + 8` still scores 1 after them."""
    monkeypatch.setattr(reward.math, "is_safe_for_sympy", lambda text: True)
    assert math_reward("\\boxed{16 + 8}", "24") == 1.0
    threads = _threads()
    for _ in range(6):  # more than the 4 stuck threads that used to switch math-verify off
        pid = verifier.worker_pid()
        start = time.perf_counter()
        assert reward.verify_with_timeout(HOSTILE, "24", timeout_s=0.3) is False
        assert time.perf_counter() - start < 30  # the timeout, plus a new worker's start
        with pytest.raises(ProcessLookupError):  # killed and reaped, not left running
            os.kill(pid, 0)
        assert verifier.worker_pid() != pid
        assert _threads() == threads
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing switched off, nothing to warn about
        assert math_reward("\\boxed{16 + 8}", "24") == 1.0
        assert math_reward(f"\\boxed{{{HOSTILE}}}", "24") == 0.0  # at the full timeout
        assert math_reward("\\boxed{16 + 8}", "24") == 1.0
    assert _threads() == threads


def test_hostile_and_plain_checks_from_a_thread_pool(monkeypatch):
    """Threads share the one worker: a check killed for its time costs no other check its
    answer."""
    monkeypatch.setattr(reward.math, "is_safe_for_sympy", lambda text: True)
    jobs = [(HOSTILE, 0.3), ("16 + 8", 60.0)] * 3
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        got = list(pool.map(lambda job: reward.verify_with_timeout(job[0], "24", timeout_s=job[1]),
                            jobs))
    assert got == [False, True] * 3


def test_the_worker_leaves_when_its_parent_dies(tmp_path):
    """A trainer killed with SIGKILL leaves no math-verify worker behind."""
    code = ("import os, sys; from labkit.reward import verifier; verifier.warm_up(); "
            "print(verifier.worker_pid(), flush=True); sys.stdin.readline(); os._exit(1)")
    parent = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True, cwd=tmp_path,
                              env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])})
    pid = int(Lines(parent).until("")[-1])
    os.kill(pid, 0)  # running
    parent.kill()
    parent.wait(timeout=DEADLINE_S)
    deadline = time.monotonic() + 60
    while _alive(pid) and time.monotonic() < deadline:  # waits for the exit, not a set time
        time.sleep(0.05)
    assert not _alive(pid)


def _alive(pid: int) -> bool:
    """True while `pid` runs (a zombie, exited but not yet reaped by init, counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


# ------------------------------------------------------------------ registry
def test_the_package_face_reexports_its_modules():
    """labkit.reward is the face: each public name is the very object its module defines,
    and every name the lessons take from it is listed."""
    from public_faces import assert_reexports, names_used_in_notebooks

    from labkit.reward import custom, final_answer, number, scoring
    from labkit.reward import math as math_rewards

    assert_reexports(reward, (custom, final_answer, number, math_rewards, scoring, reward))
    used = names_used_in_notebooks("labkit.reward")
    assert {"math_reward", "math_format_reward"} <= used <= set(reward.__all__)


def test_registry_and_config_accept_math():
    from labkit.config import ConfigError, RunConfig

    assert load_reward("math") is math_reward is REWARDS["math"]
    RunConfig().check()
    with pytest.raises(ConfigError, match="valid: math"):
        RunConfig(rm_type="nope").check()


def test_unknown_rm_type_names_the_valid_ones():
    with pytest.raises(ValueError, match=r"--rm-type 'f1' is not valid; valid: math"):
        load_reward("f1")


def _write_module(folder, name):
    path = folder / f"{name}.py"
    path.write_text(
        "def contains(response, label):\n"
        "    return 1.0 if label in response else 0.0\n"
    )
    return path


def test_custom_reward_from_file(tmp_path):
    path = _write_module(tmp_path, "my_rm_file")
    fn = load_reward("math", f"{path}:contains")
    assert fn("it is 7", "7") == 1.0 and fn("it is 8", "7") == 0.0


def test_custom_reward_from_module(tmp_path, monkeypatch):
    _write_module(tmp_path, "my_rm_module")
    monkeypatch.syspath_prepend(str(tmp_path))
    fn = load_reward("ignored-when-custom", "my_rm_module:contains")
    assert fn("7", "7") == 1.0


def test_custom_reward_errors_name_the_fix(tmp_path):
    path = _write_module(tmp_path, "my_rm_errors")
    with pytest.raises(ValueError, match="has no function 'missing'"):
        load_reward("math", f"{path}:missing")
    with pytest.raises(FileNotFoundError, match="no file"):
        load_reward("math", f"{tmp_path}/absent.py:contains")
    with pytest.raises(ValueError, match="package.module:function"):
        load_reward("math", "no_colon_here")


# ------------------------------------------------------------------ score
def test_score_matches_one_by_one_and_in_a_pool():
    responses = [r for r, _, _ in CASES]
    labels = [y for _, y, _ in CASES]
    expected = [e for _, _, e in CASES]
    assert score(responses, labels, math_reward) == expected
    assert score(responses, labels, math_reward, max_workers=4) == expected


def test_score_survives_a_raising_reward_and_warns_once():
    def flaky(response, label):
        if response == "boom":
            raise RuntimeError("bad response")
        return float("nan") if response == "nan" else 1.0

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first = score(["ok", "boom", "boom"], ["1", "1", "1"], flaky)
        second = score(["boom", "ok"], ["1", "1"], flaky, max_workers=2)
        third = score(["nan"], ["1"], flaky)
    assert first == [1.0, 0.0, 0.0] and second == [0.0, 1.0] and third == [0.0]
    messages = [str(w.message) for w in caught]
    assert sum("raised RuntimeError" in m for m in messages) == 1
    assert sum("returned nan" in m for m in messages) == 1
    assert all(math.isfinite(v) for v in first + second + third)


def test_score_refuses_mismatched_lengths():
    with pytest.raises(ValueError, match="2 responses but 1 labels"):
        score(["a", "b"], ["1"], math_reward)


# ------------------------------------------------------------------ rewards that misbehave
MISBEHAVING = """
import sys


class Finished(BaseException):
    pass


def closes(response, label):
    raise GeneratorExit


def finishes(response, label):
    raise Finished("no more answers")


def exits(response, label):
    sys.exit(3)


def huge(response, label):
    return 1e300


def infinite(response, label):
    return float("-inf")


def big_int(response, label):
    return 10 ** 400


def always_raises(response, label):
    raise ValueError("the label is not a date")


def returns_none(response, label):
    return None


def always_nan(response, label):
    return float("nan")


def large_but_fine(response, label):
    return 1e12 if len(response) % 2 else -1e12
"""


def _line(statement: str) -> int:
    """The line of MISBEHAVING that holds `statement` (as a traceback numbers it)."""
    return next(i for i, line in enumerate(MISBEHAVING.splitlines(), 1) if statement in line)


@pytest.fixture()
def misbehaving(tmp_path) -> Path:
    path = tmp_path / "misbehaving.py"
    path.write_text(MISBEHAVING)
    return path


def _refusal(fn, responses=("#### 1", "#### 2", "#### 3", "#### 4")) -> str:
    """The one-line message a score() of `fn` stops with (a LabkitError: the CLI's one line)."""
    from labkit.errors import LabkitError

    with pytest.raises(LabkitError) as e:
        score(list(responses), ["1"] * len(responses), fn)
    message = str(e.value)
    assert "\n" not in message
    return message


@pytest.mark.parametrize("name, said", [
    ("closes", f"GeneratorExit was raised in {{file}}, line {_line('raise GeneratorExit')}, by the reward "
     "{file}:closes"),
    ("finishes", f"Finished (no more answers) was raised in {{file}}, line {_line('raise Finished')}, "
                 "by the reward {file}:finishes"),
    ("exits", f"SystemExit: sys.exit(3) was called in {{file}}, line {_line('sys.exit(3)')}, by the "
               "reward {file}:exits"),
])
def test_a_reward_that_ends_with_a_base_exception_stops_in_one_line(misbehaving, name, said):
    """GeneratorExit, SystemExit, a BaseException of the user's own: not an answer scored 0
    but the run's end, said in one line naming the error, the file and line, the function."""
    message = _refusal(load_reward("math", f"{misbehaving}:{name}"))
    assert message.startswith(said.format(file=misbehaving)), message


def test_ctrl_c_in_a_reward_stays_a_stop():
    def interrupted(response, label):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        score(["a", "b"], ["1", "1"], interrupted)


@pytest.mark.parametrize("name, value", [("huge", "1e+300"), ("infinite", "-inf"),
                                         ("big_int", "100000000000")])
def test_a_reward_past_the_largest_stops_naming_the_value(misbehaving, name, value):
    """inf, or so large that the group statistics overflow: refused, not trained on."""
    from labkit.reward import MAX_REWARD

    message = _refusal(load_reward("math", f"{misbehaving}:{name}"))
    assert message.startswith(f"the reward {misbehaving}:{name} returned {value}"), message
    assert f"within ±{MAX_REWARD:g}" in message
    fine = load_reward("math", f"{misbehaving}:large_but_fine")
    assert score(["a", "ab"], ["1", "1"], fine) == [1e12, -1e12]


@pytest.mark.parametrize("name, first", [
    ("always_raises", f"raised ValueError: the label is not a date in {{file}}, line "
                      f"{_line('not a date')}"),
    ("returns_none", "returned None, not a number"),
    ("always_nan", "returned nan"),
])
def test_a_reward_that_fails_on_every_answer_stops_the_run(misbehaving, name, first):
    """Every answer of a step failed: the run would train on zeros and learn nothing, so it
    stops, naming the function and the first failure. One answer alone (miles scores them
    one at a time) still scores 0.0 with a warning, as does a step where some succeed."""
    fn = load_reward("math", f"{misbehaving}:{name}")
    message = _refusal(fn)
    assert message.startswith(f"the reward {misbehaving}:{name} failed on every answer of the "
                              f"step (4 of 4; the first {first.format(file=misbehaving)})"), message
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        assert score(["#### 1"], ["1"], fn) == [0.0]


def test_a_custom_reward_is_named_as_its_path_spells_it(misbehaving, tmp_path, monkeypatch):
    from labkit.reward import reward_name

    assert reward_name(load_reward("math", f"{misbehaving}:huge")) == f"{misbehaving}:huge"
    _write_module(tmp_path, "my_named_rm")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert reward_name(load_reward("math", "my_named_rm:contains")) == "my_named_rm:contains"
    assert reward_name(math_reward) == "labkit.reward.math:math_reward"


RUN_FLAGS = ["--data", "synthetic", "--engine", "hf", "--rollout-batch-size", "2",
             "--n-samples-per-prompt", "4", "--global-batch-size", "8", "--num-rollout", "2",
             "--rollout-max-response-len", "12", "--lr", "1e-3", "--eval-split-size", "0",
             "--no-progress", "--run-name", "tiny"]


@pytest.mark.parametrize("name, said", [
    ("closes", f"GeneratorExit was raised in {{file}}, line {_line('raise GeneratorExit')}, by the reward "
     "{file}:closes"),
    ("huge", "the reward {file}:huge returned 1e+300 for an answer"),
    ("always_raises", "the reward {file}:always_raises failed on every answer of the step (8 of 8"),
])
def test_a_run_with_a_misbehaving_reward_stops_in_one_line(tmp_path, tiny_model_dir, misbehaving,
                                                          capsys, name, said):
    """`labkit launch` with such a reward: exit 1 before any step is trained, one line on
    stderr naming the function and the error, and status.json saying why, traceback kept."""
    from labkit.cli import main

    out = tmp_path / "runs"
    flags = ["--model", str(tiny_model_dir), "--output-dir", str(out), *RUN_FLAGS,
             "--custom-rm-path", f"{misbehaving}:{name}"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert main(["launch", *flags]) == 1
    said = said.format(file=misbehaving)
    err = capsys.readouterr().err  # after transformers' bar while the model loads
    lines = [line for line in err.splitlines() if line.strip() and "Loading weights" not in line]
    assert len(lines) == 1 and lines[0].startswith(f"labkit launch: {said}"), err
    assert lines[0].endswith(f"(status and traceback: {out / 'tiny' / 'status.json'})")
    assert "Traceback" not in err
    status = json.loads((out / "tiny" / "status.json").read_text())
    assert status["reason"] == "error" and status["last_step"] == -1
    assert status["message"].startswith(said)
    assert str(misbehaving) in status["traceback"]
    assert not (out / "tiny" / "metrics.jsonl").exists() or not (out / "tiny" / "metrics.jsonl").read_text()


# ------------------------------------------------------------------ math_format
def test_math_format_pays_the_right_answer_and_a_little_for_the_asked_format():
    from labkit.reward import FORMAT_CREDIT, REWARDS, math_format_reward

    assert REWARDS["math_format"] is math_format_reward
    assert math_format_reward("8 + 4 = 12\n#### 12", "12") == 1.0  # right, in the asked format
    assert math_format_reward("#### 13", "12") == FORMAT_CREDIT == 0.1  # the format alone
    assert math_format_reward("The answer is 12.", "12") == 0.0  # right number, wrong format
    assert math_format_reward("12", "12") == 0.0
    assert math_format_reward("\\boxed{13}", "12") == 0.0  # no credit for another format
    assert math_format_reward("#### 5, then \\boxed{13}", "12") == 0.0  # the last answer counts
    assert math_format_reward("#### twelve", "12") == 0.0  # no number, no format
    assert math_format_reward("", "12") == 0.0


def test_no_constant_string_pays_under_math_format():
    """A policy that always writes one string earns the format credit plus the share of
    problems whose answer that string happens to be: far below what right answers earn."""
    from labkit.data import synthetic_problems
    from labkit.reward import math_format_reward

    problems = synthetic_problems(400, steps=0, seed=3)
    for constant in ("#### 7", "#### 0", "#### 12\n#### 12", "I don't know"):
        mean = sum(math_format_reward(constant, p.label) for p in problems) / len(problems)
        assert mean < 0.2, (constant, mean)
    right = sum(math_format_reward(f"#### {p.label}", p.label) for p in problems) / len(problems)
    assert right == 1.0
