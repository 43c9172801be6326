"""Tests of labkit.reward: final-answer extraction, the math reward, custom rewards, scoring."""

from __future__ import annotations

import concurrent.futures
import math
import threading
import time
import warnings

import pytest

from labkit import reward
from labkit.reward import (
    REWARDS, extract_final_answer, load_reward, math_reward, parse_number, score,
    verify_with_timeout,
)


@pytest.fixture(scope="module", autouse=True)
def warm_math_verify():
    """Import math-verify and run it once, so timings below measure scoring, not imports."""
    reward._warm_up()


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
])
def test_extract_final_answer(text, answer):
    assert extract_final_answer(text) == answer


def test_parse_number():
    assert parse_number("$1,234.50") == parse_number("2469/2")
    assert parse_number("\\frac{3}{4}") == parse_number("0.75")
    assert parse_number("3/0") is None
    assert parse_number("x + 1") is None
    assert parse_number("9" * 500) is None  # too long to be an answer


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
}


@pytest.mark.parametrize("name", list(ADVERSARIAL))
def test_adversarial_answers_score_zero_fast(name):
    start = time.perf_counter()
    assert math_reward(ADVERSARIAL[name], "42") == 0.0
    assert time.perf_counter() - start < 0.5


def test_deeply_nested_calls_never_reach_sympy_and_leave_no_thread():
    nested = "exp(" * 9 + "10" + ")" * 9  # nine nested calls: sympy ran >100 s on such a one
    assert not reward.is_safe_for_sympy(nested)
    before = {t for t in threading.enumerate() if t.name == "labkit-math-verify"}
    start = time.perf_counter()
    assert math_reward(f"#### {nested}", "5") == 0.0
    assert time.perf_counter() - start < 0.1
    assert {t for t in threading.enumerate() if t.name == "labkit-math-verify"} == before


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


def test_our_timeout_stops_a_hanging_verifier(monkeypatch):
    release = threading.Event()
    monkeypatch.setattr(reward, "_verify", lambda a, b: release.wait(30))
    monkeypatch.setattr(reward, "_stuck", [])
    monkeypatch.setattr(reward, "_warned", set())
    try:
        start = time.perf_counter()
        assert verify_with_timeout("x", "y", timeout_s=0.2) is False
        assert 0.15 < time.perf_counter() - start < 1.0
        for _ in range(reward.MAX_STUCK_WORKERS - 1):
            verify_with_timeout("x", "y", timeout_s=0.05)
        start = time.perf_counter()  # too many stuck workers: refuse at once, say so
        with pytest.warns(RuntimeWarning, match="still running after their timeout"):
            assert verify_with_timeout("x", "y", timeout_s=5.0) is False
        assert time.perf_counter() - start < 0.1
    finally:
        release.set()


# ------------------------------------------------------------------ registry
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
