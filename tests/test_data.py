"""Tests of labkit.data: labels, loaders, synthetic problems and the rollout prompt order."""

from __future__ import annotations

import json
import random
import re
import sys
import warnings
from pathlib import Path

import pytest

from labkit.data import (
    SYSTEM_PROMPT,
    Problem,
    build_messages,
    extract_label,
    load_problems,
    rollout_problems,
    split_eval,
    synthetic_problems,
)
from labkit.errors import DataError
from labkit.reward import math_reward

GSM8K = Path(__file__).parents[1] / ".." / "shared" / "data" / "gsm8k"


@pytest.mark.parametrize("answer,label", [
    ("3 + 4 = 7\n#### 7", "7"),
    ("#### 1,234", "1234"),
    ("#### 1,234,567 ", "1234567"),
    ("#### -5", "-5"),
    ("#### 2.5", "2.5"),
    ("#### 3\n#### 4", "4"),
    ("no marker, 42", None),
    ("####", None),
    ("####   \n", None),
    (None, None),
])
def test_extract_label(answer, label):
    assert extract_label(answer) == label


def test_messages_ask_for_the_format_the_reward_reads():
    messages = build_messages("Tom has 3 pens and buys 2 more. How many pens?")
    assert [m["role"] for m in messages] == ["system", "user"]
    assert messages[0]["content"] == SYSTEM_PROMPT and "#### " in SYSTEM_PROMPT
    assert messages[1]["content"].startswith("Tom has 3 pens")
    example = SYSTEM_PROMPT.rsplit("\n", 1)[1]  # the example last line itself scores
    assert math_reward(example, "42") == 1.0


# ------------------------------------------------------------------ local files
def _write_jsonl(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n")
    return path


GOOD = {"question": "Ada has 2 kites and buys 3 more. How many kites?", "answer": "2+3=5\n#### 5"}


def test_malformed_rows_are_counted_and_skipped_with_one_warning(tmp_path):
    folder = tmp_path / "mydata"
    folder.mkdir()
    rows = [
        json.dumps(GOOD),                                                 # 0 ok
        json.dumps({"question": "Why?", "answer": "because"}),            # 1 no ####
        json.dumps({"question": "  ", "answer": "#### 3"}),               # 2 empty question
        json.dumps({"question": "How many?", "answer": "#### 1,200"}),   # 3 ok
        json.dumps({"question": "How many?", "answer": "#### lots"}),    # 4 label not a number
        "{not json",                                                      # 5 not JSON
        json.dumps({"question": "How many?"}),                            # 6 no answer
        json.dumps({"question": "How many now?", "answer": "#### -4"}),   # 7 ok
    ]
    _write_jsonl(folder / "train.jsonl", rows)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        problems = load_problems(str(folder))
    assert [p.id for p in problems] == ["mydata/train/0", "mydata/train/3", "mydata/train/7"]
    assert [p.label for p in problems] == ["5", "1200", "-4"]
    assert len(caught) == 1
    message = str(caught[0].message)
    assert "skipped 5 of 8 rows" in message
    # each reason names the file and line of its rows, so the user can fix them
    assert "2 no '#### ' answer line (train.jsonl line 2, train.jsonl line 7)" in message
    assert "1 not JSON (train.jsonl line 6)" in message


def test_parquet_folder_single_file_and_limits(tmp_path):
    pd = pytest.importorskip("pandas")
    pytest.importorskip("pyarrow")
    frame = pd.DataFrame([GOOD, {"question": "Bo has 9 cups. How many?", "answer": "#### 9"}])
    frame.to_parquet(tmp_path / "train-00000-of-00001.parquet")
    frame.iloc[:1].to_parquet(tmp_path / "test-00000-of-00001.parquet")
    train = load_problems(str(tmp_path))
    assert [p.label for p in train] == ["5", "9"]
    assert train[1].id == f"{tmp_path.name}/train/1"
    assert len(split_eval(str(tmp_path), 10)) == 1
    assert len(load_problems(str(tmp_path), n=1)) == 1

    single = _write_jsonl(tmp_path / "extra.jsonl", [json.dumps(GOOD)])
    assert load_problems(str(single)) == [Problem("extra/train/0", GOOD["question"], "5")]
    with pytest.raises(ValueError, match="no held-out test split"):
        split_eval(str(single), 4)


def test_missing_paths_and_empty_data_name_the_fix(tmp_path):
    with pytest.raises(DataError, match="no such file or folder; use gsm8k, synthetic"):
        load_problems(str(tmp_path / "nowhere"))
    with pytest.raises(DataError, match="no test.jsonl or test\\*.parquet"):
        load_problems(str(tmp_path), "test")
    bad = _write_jsonl(tmp_path / "bad.jsonl", [json.dumps({"question": "Q", "answer": "A"})])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(ValueError, match="no usable rows of 1"):
            load_problems(str(bad))


def test_a_file_that_is_not_utf8_names_its_line(tmp_path):
    folder = tmp_path / "latin"
    folder.mkdir()
    good = json.dumps(GOOD).encode()
    (folder / "train.jsonl").write_bytes(good + b"\n" + good.replace(b"Ada", b"Ren\xe9e") + b"\n")
    with pytest.raises(DataError, match=r"train.jsonl line 2: not UTF-8 text .*save the file as UTF-8"):
        load_problems(str(folder))


def test_a_file_of_bad_lines_names_them(tmp_path):
    bad = _write_jsonl(tmp_path / "bad.jsonl", ["{not json", "[1, 2]", "{also not"])
    with pytest.raises(DataError, match=r"no usable rows of 3: 2 not JSON \(bad.jsonl line 1, "
                                        r"bad.jsonl line 3\); 1 not a JSON object \(bad.jsonl line 2\)"):
        load_problems(str(bad))


def test_gsm8k_offline_names_the_way_out(monkeypatch):
    class Offline:
        @staticmethod
        def load_dataset(*a, **k):
            raise ConnectionError("Couldn't reach 'openai/gsm8k' on the Hub (LocalEntryNotFoundError)")

    monkeypatch.setitem(sys.modules, "datasets", Offline)
    with pytest.raises(DataError, match=r"--data gsm8k: could not load .*offline.*--data synthetic"):
        load_problems("gsm8k")


def test_gsm8k_without_datasets_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)  # makes `import datasets` fail
    with pytest.raises(DataError, match=r"pip install 'labkit\[hub\]'.*local folder"):
        load_problems("gsm8k")


@pytest.mark.skipif(not (GSM8K / "train.jsonl").is_file(), reason="no local GSM8K copy")
@pytest.mark.parametrize("split,full_size", [("train", 7473), ("test", 1319)])
def test_local_gsm8k_copy_loads_every_row(split, full_size):
    rows = sum(1 for line in open(GSM8K / f"{split}.jsonl") if line.strip())
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the real data has no malformed rows
        problems = load_problems(str(GSM8K), split)
    assert len(problems) == rows
    if rows != full_size:
        pytest.skip(f"partial GSM8K copy: {rows} rows of {split}")
    assert problems[0].id == f"gsm8k/{split}/0"
    assert problems[-1].id == f"gsm8k/{split}/{full_size - 1}"
    assert len({p.id for p in problems}) == full_size
    assert all(re.fullmatch(r"-?\d+", p.label) for p in problems)
    assert all(p.question for p in problems)


# ------------------------------------------------------------------ synthetic problems
OPERATIONS = [  # the phrase that names each operation in the text -> how it changes the amount
    (re.compile(r"\b(\d+) more\b"), lambda x, k: x + k),
    (re.compile(r"\b(?:gives away|loses|sells) (\d+)\b"), lambda x, k: x - k),
    (re.compile(r"\b(\d+) times as many\b"), lambda x, k: x * k),
    (re.compile(r"\binto (\d+) equal groups\b"), lambda x, k: x / k),
]


def _recompute(question: str) -> tuple[float, int]:
    """The answer and the number of steps of a synthetic question, read from its text."""
    first, *middle, last = re.split(r"(?<=[.?])\s+", question)
    value = int(re.search(r" has (\d+) ", first).group(1))
    assert last.startswith("How many")
    for sentence in middle:
        hits = [(m, op) for pattern, op in OPERATIONS if (m := pattern.search(sentence))]
        assert len(hits) == 1, sentence
        value = hits[0][1](value, int(hits[0][0].group(1)))
        assert value == int(value) and value >= 1, sentence  # whole amounts all the way
    return value, len(middle)


@pytest.mark.parametrize("steps", [1, 2, 4])
def test_synthetic_labels_are_correct(steps):
    for problem in synthetic_problems(300, steps, seed=3):
        value, n_steps = _recompute(problem.question)
        assert n_steps == steps
        assert problem.label == str(int(value))


def test_synthetic_is_deterministic_and_splits_are_disjoint():
    a = synthetic_problems(200, 2, seed=7)
    assert a == synthetic_problems(200, 2, seed=7)
    assert a[:50] == synthetic_problems(50, 2, seed=7)
    assert a != synthetic_problems(200, 2, seed=8)
    assert [p.id for p in a[:2]] == ["synthetic/train/0", "synthetic/train/1"]
    assert len({p.question for p in a}) == 200
    train = {p.question for p in synthetic_problems(3000, 1, seed=0)}
    test = synthetic_problems(300, 1, seed=0, split="test")
    assert test[0].id == "synthetic/test/0"
    assert not train & {p.question for p in test}


def test_load_problems_synthetic_and_eval_split():
    problems = load_problems("synthetic", seed=1, synthetic_steps=1, n=10)
    assert problems == synthetic_problems(10, 1, 1)
    held_out = split_eval("synthetic", 8, synthetic_steps=1)
    assert len(held_out) == 8 and all(p.id.startswith("synthetic/test/") for p in held_out)


# ------------------------------------------------------------------ rollout order
def _problems(n: int) -> list[Problem]:
    return [Problem(f"toy/train/{i}", f"q{i}", str(i)) for i in range(n)]


def test_rollout_order_is_a_function_of_seed_and_step():
    problems = _problems(50)
    random.seed(0)
    before = random.random()
    random.seed(0)
    batch = rollout_problems(problems, step=3, batch_size=8, seed=11)
    assert random.random() == before  # the global RNG is untouched
    assert batch == rollout_problems(problems, step=3, batch_size=8, seed=11)
    assert batch != rollout_problems(problems, step=3, batch_size=8, seed=12)
    assert batch != rollout_problems(problems, step=4, batch_size=8, seed=11)


def test_rollout_order_covers_each_epoch_then_wraps():
    problems = _problems(10)
    steps = [rollout_problems(problems, s, batch_size=4, seed=5) for s in range(5)]
    drawn = [p.id for batch in steps for p in batch]
    first, second = drawn[:10], drawn[10:20]
    assert sorted(first) == sorted(p.id for p in problems)  # epoch 0: each problem once
    assert sorted(second) == sorted(first)  # epoch 1 too, starting inside step 2
    assert first != second  # with a new permutation
    assert drawn[:10] == [p.id for p in rollout_problems(problems, 0, batch_size=10, seed=5)]
    big = rollout_problems(problems, 0, batch_size=25, seed=5)  # batch larger than the data
    assert [p.id for p in big[:20]] == drawn


def test_rollout_order_refuses_bad_arguments():
    with pytest.raises(ValueError, match="no problems"):
        rollout_problems([], 0, 4, 0)
    with pytest.raises(ValueError, match="batch_size >= 1"):
        rollout_problems(_problems(3), 0, 0, 0)


def test_redact_quotes_cuts_every_restatement_of_the_problem():
    from labkit.data import redact_quotes

    q = "Lina has four boxes with nine pens each. She gives away seven pens. How many are left?"
    text = ("Lina has four boxes with nine pens each. So 4*9=36. Since she gives away seven pens, "
            "36-7=29. Recall: Lina has four boxes with nine pens each.\n#### 29")
    out = redact_quotes(text, q)
    assert "Lina has four boxes with nine pens" not in out
    assert out.count("[...]") == 3 and out.endswith("#### 29") and "36-7=29" in out
    assert redact_quotes("#### 29", q) == "#### 29"  # short overlaps stay


def test_worked_examples_come_before_the_question_in_the_asked_format():
    from labkit.data import EXAMPLES
    from labkit.reward import math_reward

    plain = build_messages("Q?")
    shown = build_messages("Q?", examples=2)
    assert [m["role"] for m in shown] == ["system", "user", "assistant", "user", "assistant", "user"]
    assert shown[0] == plain[0] and shown[-1] == plain[-1] == {"role": "user", "content": "Q?"}
    for question, answer in EXAMPLES:  # each worked example is right by the math reward
        label = answer.rsplit("#### ", 1)[1]
        assert math_reward(answer, label) == 1.0 and "####" not in question
    with pytest.raises(ValueError, match="4 worked examples"):
        build_messages("Q?", examples=5)


def test_the_easiest_synthetic_problems_add_or_subtract_small_numbers():
    problems = synthetic_problems(200, steps=0, seed=1)
    assert len({p.question for p in problems}) == 200
    for p in problems:
        numbers = [int(w) for w in p.question.replace(".", " ").split() if w.isdigit()]
        assert len(numbers) == 2 and numbers[0] <= 20 and 2 <= numbers[1] <= 10
        assert int(p.label) in (numbers[0] + numbers[1], numbers[0] - numbers[1]) and int(p.label) >= 1
