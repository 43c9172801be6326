"""Tests of labkit.course.exercises (graders, students' copies, --check) and labkit.course.profiles."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

import labkit
from labkit.cli import main as labkit_main
from labkit.course import exercises, profiles, students
from labkit.course.exercises import BEGIN as BEGIN_MARK
from labkit.course.exercises import ExerciseError, check
from labkit.course.students import student_notebook, student_source
from labkit.serving.client import RetryPolicy

REPO = Path(__file__).resolve().parents[1]
NOTEBOOKS = REPO / "notebooks"
sys.path.insert(0, str(Path(__file__).resolve().parent))


def flat(text: str) -> str:
    """Text with its line breaks and indents as single spaces (the verdict is wrapped)."""
    return " ".join(text.split())


def wrong(id: str, answer, **given) -> str:
    """What a check cell shows for a wrong `answer` (it must be wrong), on one line."""
    right, text = exercises.verdict(id, answer, **given)
    assert not right, text
    return flat(text)


@pytest.fixture()
def graded(monkeypatch):
    """Grading on, as notebooks/conftest.py turns it on for pytest --nbval."""
    monkeypatch.setenv(exercises.GRADING_ENV, "1")


@pytest.fixture(autouse=True)
def not_graded(monkeypatch):
    """Grading off unless a test asks for it (a run under pytest --nbval may have set it), and
    no wrong answers remembered from another test."""
    monkeypatch.delenv(exercises.GRADING_ENV, raising=False)
    exercises.forget_tries()


# ====================================================================== check()
def test_check_prints_the_verdict(capsys):
    check("1.1.2", 512, prompts=32, answers=16)
    assert capsys.readouterr().out == "Exercise 1.1.2: correct.\n"


def test_unanswered_prints_a_nudge_and_does_not_raise(capsys):
    check("1.1.2", None, prompts=32, answers=16)  # a check cell never stops Run All
    out = capsys.readouterr().out
    assert out.split("\n")[0] == "Exercise 1.1.2: not answered yet."
    line = flat(out)
    assert line.startswith("Exercise 1.1.2: not answered yet. Replace the None")
    assert "counts every answer of a rollout" in line  # the nudge
    assert "rollout_batch_size * 16" not in line  # not the code


def test_a_first_wrong_answer_says_what_is_off_and_nudges_without_the_code(capsys):
    check("1.1.2", 16, prompts=32, answers=16)
    out = capsys.readouterr().out
    assert all(len(row) <= 88 for row in out.split("\n"))  # wrapped at words, not by the browser
    line = flat(out)
    assert line.startswith("Exercise 1.1.2: not yet. 16 is the group size")
    assert "Look again: the global batch counts every answer of a rollout." in line
    assert "Hint" not in line and "rollout_batch_size * 16" not in line


def test_the_hint_with_the_code_comes_with_another_wrong_answer(capsys):
    check("1.1.2", 16, prompts=32, answers=16)
    check("1.1.2", 16, prompts=32, answers=16)  # the same answer again: still no code
    assert "rollout_batch_size * 16" not in capsys.readouterr().out
    check("1.1.2", 32, prompts=32, answers=16)  # a second, different wrong answer
    out = capsys.readouterr().out
    assert any(row.startswith("  Hint: ") for row in out.split("\n")[1:])
    line = flat(out)
    assert line.startswith("Exercise 1.1.2: not yet. 32 is the prompts per rollout")
    assert "recipe.rollout_batch_size * 16" in line
    check("1.1.1", 5, rewards=torch.zeros(2, 4))  # another exercise starts with the nudge
    assert "Hint" not in capsys.readouterr().out
    exercises.forget_tries("1.1.2")
    check("1.1.2", 64, prompts=32, answers=16)
    assert "Hint" not in capsys.readouterr().out


def test_an_unanswered_check_is_not_a_wrong_try(capsys):
    check("1.1.2", None, prompts=32, answers=16)
    check("1.1.2", 16, prompts=32, answers=16)
    assert "Hint" not in capsys.readouterr().out


def test_grading_raises_for_wrong_and_missing_answers(graded, capsys):
    with pytest.raises(ExerciseError, match=r"^Exercise 1\.1\.2: not answered yet"):
        check("1.1.2", None, prompts=32, answers=16)
    with pytest.raises(ExerciseError, match=r"^Exercise 1\.1\.2: not yet\. 16 is the group\s+size"):
        check("1.1.2", 16, prompts=32, answers=16)
    check("1.1.2", 512, prompts=32, answers=16)
    assert capsys.readouterr().out == "Exercise 1.1.2: correct.\n"


def test_grading_follows_the_environment():
    assert not exercises.grading({})
    assert not exercises.grading({"LABKIT_GRADING": "0"})
    assert exercises.grading({"LABKIT_GRADING": "1"})


@pytest.mark.parametrize("id", sorted(exercises.EXERCISES))
def test_the_first_message_nudges_without_the_code(id):
    ex = exercises.EXERCISES[id]
    right, line = exercises.verdict(id, None)
    assert not right and ex.nudge in flat(line) and ex.hint not in flat(line)
    # the code in the hint: calls, products, flags with their value
    code = re.findall(r"[\w.]+\([^)]*\)|\w+\s*\*\s*\d+|--[\w-]+ \d+", ex.hint)
    assert code, f"the hint of {id} shows no code"
    assert not any(c in ex.nudge for c in code), f"the nudge of {id} gives the code away"


def test_an_answer_the_grader_cannot_handle_is_a_line_not_a_traceback(tmp_path, capsys):
    check("1.2.2", 3, log=tmp_path / "missing.jsonl", gap=1)
    line = flat(capsys.readouterr().out)
    assert line.startswith("Exercise 1.2.2: not yet. This answer could not be graded")


def test_unknown_exercise_lists_the_known_ones():
    with pytest.raises(KeyError, match="1.1.1"):
        check("9.9.9", 1)


def test_global_batch_hints():
    assert "is the group size" in wrong("1.1.2", 16, prompts=32, answers=16)
    assert "is the prompts per rollout" in wrong("1.1.2", 32, prompts=32, answers=16)
    assert "makes 2 optimizer steps" in wrong("1.1.2", 256, prompts=32, answers=16)
    assert "RunConfig refuses it" in wrong("1.1.2", 500, prompts=32, answers=16)
    assert "not a whole number" in wrong("1.1.2", 512.5, prompts=32, answers=16)


def test_no_signal_counts_all_zero_and_all_one_groups(capsys):
    rewards = torch.tensor([[0., 0, 0, 0], [0, 1, 0, 0], [1, 1, 1, 1], [0, 0, 0, 0],
                            [1, 0, 1, 1], [0, 1, 1, 0], [1, 0, 0, 0]])
    check("1.1.1", torch.tensor(3), rewards=rewards)  # a tensor answer is fine
    assert "correct" in capsys.readouterr().out
    assert "only the all-0 groups" in wrong("1.1.1", 2, rewards=rewards)
    assert "only the all-1 groups" in wrong("1.1.1", 1, rewards=rewards)
    assert "groups that do teach" in wrong("1.1.1", 4, rewards=rewards)


def test_rollout_share_from_the_log():
    metrics = pd.DataFrame({"perf/rollout_time": [3.0, 1.0], "perf/step_time": [4.0, 4.0]})
    check("1.1.3", 0.5, run=metrics)
    assert "percentage" in wrong("1.1.3", 50.0, run=metrics)
    assert "upside down" in wrong("1.1.3", 2.0, run=metrics)
    assert "mean of the per-step shares" in wrong("1.1.3", 0.625, run=pd.DataFrame(
        {"perf/rollout_time": [3.0, 1.0], "perf/step_time": [4.0, 2.0]}))


def test_backoff_wait_before_the_fifth_attempt():
    policy = RetryPolicy(base_s=0.5, cap_s=8.0)
    check("1.2.1", 0.5 + 1 + 2 + 4, policy=policy)
    assert "only the last wait" in wrong("1.2.1", 4.0, policy=policy)
    assert "after the 5th attempt" in wrong("1.2.1", 15.5, policy=policy)
    capped = RetryPolicy(base_s=1.0, cap_s=2.0)  # the cap changes the answer: 1 + 2 + 2 + 2
    check("1.2.1", 7.0, policy=capped)


@pytest.fixture(scope="module")
def incident(tmp_path_factory) -> Path:
    """A constructed log with bursts 0-10 s, 20-27 s (gap 10 s) and 100-110 s (gap 73 s)."""
    from labkit.course.incidents import BurstSpec, make_scenario, write_scenario

    bursts = [BurstSpec(0.0, 10.0, 5.0), BurstSpec(20.0, 7.0, 5.0), BurstSpec(100.0, 10.0, 5.0)]
    events = make_scenario(bursts, steps=1, step_s=150.0, requests=64, seed=3)
    return write_scenario(tmp_path_factory.mktemp("log") / "three.constructed.jsonl", events)


def test_burst_count_at_another_gap(incident):
    from labkit.serving.replay import replay

    assert len(replay(incident).bursts) == 3
    assert len(replay(incident, burst_gap=30).bursts) == 2
    check("1.2.2", 2, log=incident, gap=30)
    assert "default gap of 5 s" in wrong("1.2.2", 3, log=incident, gap=30)
    assert "only merge bursts" in wrong("1.2.2", 4, log=incident, gap=30)
    split = len(replay(incident, burst_gap=0.01).bursts)
    assert split > 3
    check("1.2.2", split, log=incident, gap=0.01)
    assert "only split bursts" in wrong("1.2.2", 1, log=incident, gap=0.01)


def test_lowered_counts_lower_decisions_only(incident):
    check("1.2.3", 3, log=incident)
    assert "counts every decision" in wrong("1.2.3", 6, log=incident)  # 3 lower + 3 restore
    assert "default policy" in wrong("1.2.3", 0, log=incident)


def test_extra_args_line():
    check("1.3.1", "--n-samples-per-prompt 16 --global-batch-size 512", prompts=32)
    assert "2 optimizer steps" in wrong("1.3.1", "--n-samples-per-prompt 16", prompts=32)
    eight = "--n-samples-per-prompt 8 --global-batch-size 256"
    assert "8 answers per prompt" in wrong("1.3.1", eight)
    assert "refuses it" in wrong("1.3.1", "--n-samples-per-prompt 16 --global-batch-size 500")
    assert "one string" in wrong("1.3.1", 512)


@pytest.fixture(scope="module")
def course_runs(tmp_path_factory) -> pd.DataFrame:
    from fixtures_runs import write_course_runs

    from labkit.analysis import load_runs

    return load_runs(write_course_runs(tmp_path_factory.mktemp("course")))


def test_gain_of_one_run(course_runs):
    check("1.3.2", 0.038, runs=course_runs, run="n8-seed1")
    assert "sign is flipped" in wrong("1.3.2", -0.038, runs=course_runs, run="n8-seed1")
    # the 48-step run with noise, its steps after 23 raised: a late window running on is a slip
    runs = course_runs.copy()
    mine = runs.run == "n8-seed1234"
    noise = np.random.default_rng(0).normal(0, 0.05, mine.sum())
    runs.loc[mine, "rollout/raw_reward"] += noise + 0.1 * (runs.loc[mine, "rollout/step"] > 23)
    reward = runs[runs.run == "n8-seed1234"].set_index("rollout/step")["rollout/raw_reward"]
    check("1.3.2", reward.loc[16:23].mean() - reward.loc[0:7].mean(), runs=runs, run="n8-seed1234")
    too_long = reward.loc[16:].mean() - reward.loc[0:7].mean()
    assert "stops at step 23" in wrong("1.3.2", too_long, runs=runs, run="n8-seed1234")
    assert "8 steps" in wrong("1.3.2", reward.loc[16:22].mean() - reward.loc[0:6].mean(),
                              runs=runs, run="n8-seed1234")
    assert "early window includes step 8" in wrong(
        "1.3.2", reward.loc[16:23].mean() - reward.loc[0:8].mean(), runs=runs, run="n8-seed1234")
    assert "late window includes step 15" in wrong(
        "1.3.2", reward.loc[15:23].mean() - reward.loc[0:7].mean(), runs=runs, run="n8-seed1234")
    assert "no run named" in wrong("1.3.2", 0.1, runs=course_runs, run="n3-nope")


def test_common_clean_steps_of_two_runs():
    def rows(name: str, dirty: set[int], steps: int) -> pd.DataFrame:
        return pd.DataFrame({"run": name, "group_size": 8, "rollout/step": range(steps),
                             "clean": [s not in dirty for s in range(steps)]})

    runs = pd.concat([rows("a", {1, 2}, 30), rows("b", {2, 3, 25}, 30)], ignore_index=True)
    both = [s for s in range(24) if s not in (1, 2, 3)]
    check("1.3.3", both, runs=runs, a="a", b="b")
    check("1.3.3", set(both), runs=runs, a="a", b="b")  # any collection of the steps
    assert "only steps 0-23" in wrong("1.3.3", both + [24, 26, 27, 28, 29], runs=runs, a="a", b="b")
    assert "clean steps of one run" in wrong("1.3.3", [s for s in range(24) if s not in (1, 2)],
                                             runs=runs, a="a", b="b")
    assert "the union" in wrong("1.3.3", [s for s in range(24) if s != 2], runs=runs, a="a", b="b")
    assert "list of whole numbers" in wrong("1.3.3", 7, runs=runs, a="a", b="b")
    assert "common clean steps are 21" in wrong("1.3.3", [0], runs=runs, a="a", b="b")


def test_common_clean_steps_are_graded_on_two_runs_that_both_paused():
    """With one run clean throughout, the other run's clean steps alone would pass: refused."""
    def rows(name: str, dirty: set[int]) -> pd.DataFrame:
        return pd.DataFrame({"run": name, "group_size": 8, "rollout/step": range(24),
                             "clean": [s not in dirty for s in range(24)]})

    runs = pd.concat([rows("a", {1, 2}), rows("b", set())], ignore_index=True)
    with pytest.raises(exercises.GivenError, match="b has none"):
        exercises.verdict("1.3.3", [0, 3], runs=runs, a="a", b="b")


@pytest.mark.skipif(not (REPO / "data" / "runs").is_dir(), reason="no data/runs")
def test_lesson_1_3s_pair_tells_one_runs_clean_steps_from_the_common_ones():
    from labkit.analysis import load_runs
    from labkit.course import paused_run

    lesson = json.loads((NOTEBOOKS / "03_group_size.ipynb").read_text())
    source = "\n".join("".join(c["source"]) for c in lesson["cells"])
    a, b = re.search(r'^A, B = "([^"]+)", "([^"]+)"', source, re.M).groups()
    assert [a, b] == paused_run.NAMES
    pair = load_runs([REPO / "data" / "runs" / a, REPO / "data" / "runs" / b], constructed=True)
    for name in (a, b):
        mine = pair[(pair.run == name) & pair.clean]["rollout/step"]
        assert "clean steps of one run" in wrong("1.3.3", sorted(mine), runs=pair, a=a, b=b)


# ====================================================================== students' copies
SOLVED = """rewards = [1, 2]
### BEGIN SOLUTION
total = sum(rewards)
double = 2 * total
### END SOLUTION
print("after")"""


def test_student_source_replaces_the_block_and_keeps_the_rest():
    out = student_source(SOLVED, "1.1.1")
    assert out.split("\n") == [
        "rewards = [1, 2]",
        "total = None  # Exercise 1.1.1: your answer",
        "double = None  # Exercise 1.1.1: your answer",
        'print("after")',
    ]


def test_student_source_keeps_only_the_graded_answer():
    out = student_source(SOLVED, "1.1.1", answer="double")
    assert out.split("\n")[1:3] == ["double = None  # Exercise 1.1.1: your answer",
                                     'print("after")']
    assert student_source(SOLVED, "1.1.1", answer="missing") == student_source(SOLVED, "1.1.1")


def test_check_calls_read_the_id_and_the_answer():
    text = 'labkit.course.exercises.check("1.3.2", gain, runs=runs)\nexercises.check(\'1.1.2\', 2 * x)'
    assert students.check_calls(text) == [("1.3.2", "gain"), ("1.1.2", None)]


def test_student_source_without_assignment_raises_not_implemented():
    solved = "def f():\n    ### BEGIN SOLUTION\n    return 1\n    ### END SOLUTION"
    assert student_source(solved, "2.1") == (
        'def f():\n    raise NotImplementedError("Exercise 2.1: write your solution here")')


@pytest.mark.parametrize("text", ["### BEGIN SOLUTION\nx = 1", "x = 1\n### END SOLUTION",
                                  "### BEGIN SOLUTION\n### BEGIN SOLUTION\n### END SOLUTION"])
def test_unpaired_markers_are_refused(text):
    with pytest.raises(ValueError, match="SOLUTION"):
        student_source(text, "1.1.1")


def cell(kind: str, text: str, outputs=None, count=None, tags=None) -> dict:
    c = {"cell_type": kind, "id": f"id{abs(hash(text)) % 10**8}", "metadata": {},
         "source": text.splitlines(keepends=True)}
    if tags:
        c["metadata"]["tags"] = tags
    if kind == "code":
        c["outputs"], c["execution_count"] = outputs or [], count
    return c


def stream(text: str) -> list[dict]:
    return [{"name": "stdout", "output_type": "stream", "text": [text]}]


def lesson() -> dict:
    """A small solved lesson: narration, a plot-like cell, an exercise and its check."""
    cells = [
        cell("markdown", "# A lesson\nSome narration."),
        cell("code", "# NBVAL_IGNORE_OUTPUT\nimport torch\nimport labkit.course.exercises",
             stream("took 3 s\n"), 1),
        cell("code", "rewards = torch.tensor([[0., 0.], [0., 1.]])\nprint(rewards.shape)",
             stream("torch.Size([2, 2])\n"), 2, tags=["keep-me"]),
        cell("markdown", "### Exercise 1.1.1\nCount the groups."),
        cell("code", "### BEGIN SOLUTION\nno_signal = 1\n### END SOLUTION\nprint(no_signal)",
             stream("1\n"), 3),
        cell("code", 'labkit.course.exercises.check("1.1.1", no_signal, rewards=rewards)',
             stream("Exercise 1.1.1: correct.\n"), 4),
        cell("code", "print('the end')", stream("the end\n"), 5),
    ]
    return {"cells": cells, "metadata": {"kernelspec": {"name": "python3"}},
            "nbformat": 4, "nbformat_minor": 5}


def test_student_notebook_strips_solutions_and_keeps_everything_else():
    source = lesson()
    student = student_notebook(source, source_name="01_lesson.ipynb")
    banner, cells = student["cells"][0], student["cells"][1:]
    assert "Student copy" in "".join(banner["source"])
    assert "python -m pytest --nbval-lax --nbval-current-env notebooks/students/01_lesson.ipynb" \
        in "".join(banner["source"])
    assert len(cells) == len(source["cells"])
    for i, (mine, theirs) in enumerate(zip(cells, source["cells"])):
        if i in (4, 5):
            continue
        assert mine == theirs  # narration, outputs, tags, counts: untouched
    text = "".join(cells[4]["source"])
    assert "SOLUTION" not in text and "= 1" not in text
    assert text.startswith("no_signal = None  # Exercise 1.1.1")
    assert cells[4]["outputs"] == [] and cells[4]["execution_count"] is None
    assert cells[5]["outputs"] == [] and cells[5]["execution_count"] is None
    assert cells[5]["source"] == source["cells"][5]["source"]
    assert student["metadata"]["labkit"]["student_copy_of"] == "01_lesson.ipynb"
    assert student["metadata"]["labkit"]["fingerprint"] == students.fingerprint(student)
    assert source["cells"][4]["outputs"]  # the source itself is not changed


def run_cells(nb: dict) -> dict:
    """Execute a notebook's code cells in one namespace, as a kernel would, in order."""
    namespace: dict = {}
    for c in nb["cells"]:
        if c["cell_type"] == "code":
            exec(compile("".join(c["source"]), "<cell>", "exec"), namespace)
    return namespace


def test_unsolved_student_check_cell_prints_and_the_cells_below_run(capsys):
    student = student_notebook(lesson(), source_name="01_lesson.ipynb")
    run_cells(student)
    out = capsys.readouterr().out
    assert "Exercise 1.1.1: not answered yet" in out
    assert out.endswith("the end\n")  # the cell after the check ran too


def test_unsolved_student_check_cell_fails_when_graded(graded):
    student = student_notebook(lesson(), source_name="01_lesson.ipynb")
    with pytest.raises(ExerciseError) as e:
        run_cells(student)
    assert str(e.value).startswith("Exercise 1.1.1: not answered yet")


def test_solved_student_check_cell_passes(capsys):
    student = student_notebook(lesson(), source_name="01_lesson.ipynb")
    exercise = student["cells"][5]
    exercise["source"] = ["no_signal = 1\n"]  # the student's answer
    run_cells(student)
    assert "Exercise 1.1.1: correct." in capsys.readouterr().out


WRAPPED = """with labkit.course.exercises.answer("1.1.1"):
    ### BEGIN SOLUTION
    no_signal = 1
    ### END SOLUTION"""


def wrapped_lesson() -> dict:
    """The small lesson with its answer inside `answer("1.1.1")`, as the lessons write it."""
    nb = lesson()
    nb["cells"][4] = cell("code", WRAPPED)
    nb["cells"][1]["source"] = ["import torch\n", "import labkit.course.exercises\n",
                                "from labkit.grpo import compute_advantages"]
    return nb


def typed(nb: dict, text: str) -> dict:
    """The students' copy of `nb` with `text` typed over its answer placeholder."""
    student = student_notebook(nb, source_name="01_lesson.ipynb")
    for c in student["cells"]:
        source = "".join(c["source"])
        if "# Exercise 1.1.1: your answer" in source:
            c["source"] = [re.sub(r"no_signal = None.*", text, source)]
    return student


TYPO = "no_signal = int(compute_advantagez(rewards).zero_std.sum())"


def test_an_answer_that_raises_prints_one_line_and_the_cells_below_run(capsys):
    namespace = run_cells(typed(wrapped_lesson(), TYPO))  # Run All: no exception
    out = capsys.readouterr().out
    said = flat(out.split("Exercise 1.1.1: not yet")[0])
    assert said.endswith("Exercise 1.1.1: your answer raised NameError: name 'compute_advantagez' "
                         "is not defined (line 2 of this cell). Fix it, then run this cell and "
                         "the check cell below again.")
    assert "Traceback" not in out and "exercises.py" not in out
    assert ("Exercise 1.1.1: not yet. Your answer cell raised NameError: name "
            "'compute_advantagez' is not defined.") in flat(out)
    assert out.endswith("the end\n")  # the cells below ran
    assert isinstance(namespace["no_signal"], exercises.Raised)


def test_an_answer_that_raises_replaces_the_answer_it_had():
    """A right answer, then a broken one: the check reports the error, not the old answer."""
    namespace: dict = {"labkit": labkit}
    run_cell = lambda text: exec(compile(text, "<cell>", "exec"), namespace)  # noqa: E731
    run_cell(WRAPPED)
    assert exercises.verdict("1.1.1", namespace["no_signal"], rewards=torch.tensor(
        [[0., 0.], [0., 1.]]))[0]
    run_cell(WRAPPED.replace("no_signal = 1", "no_signal = 1 / 0"))
    right, line = exercises.verdict("1.1.1", namespace["no_signal"], rewards=torch.zeros(2, 2))
    assert not right and "raised ZeroDivisionError: division by zero" in flat(line)
    run_cell(WRAPPED.replace("no_signal = 1", "no_signal = 2 / 0"))  # another error
    exercises.verdict("1.1.1", namespace["no_signal"], rewards=torch.zeros(2, 2))
    # two raised answers are no wrong tries: the first wrong number still gets no code
    assert "Hint" not in exercises.verdict("1.1.1", 4, rewards=torch.zeros(2, 2))[1]


def test_an_answer_that_raises_fails_once_when_graded_at_its_check_with_its_own_error(graded):
    """Graded, the answer cell says its error and ends; the check cell fails, once, with that
    error (not a second, bare NameError for the name the answer cell never assigned)."""
    student = typed(wrapped_lesson(), TYPO)
    code = [c for c in student["cells"] if c["cell_type"] == "code"]
    answer_at = next(i for i, c in enumerate(code) if "exercises.answer(" in "".join(c["source"]))
    namespace: dict = {}
    for c in code[:answer_at + 1]:  # up to the answer cell: none raises
        exec(compile("".join(c["source"]), "<cell>", "exec"), namespace)
    with pytest.raises(ExerciseError) as failed:
        exec(compile("".join(code[answer_at + 1]["source"]), "<cell>", "exec"), namespace)
    assert flat(str(failed.value)).startswith(
        "Exercise 1.1.1: not yet. Your answer cell raised NameError: name 'compute_advantagez' "
        "is not defined.")


def test_a_grading_failure_is_shown_as_one_line_without_a_traceback():
    """What IPython (and so nbval) shows for a check cell that fails under grading."""
    error = ExerciseError("Exercise 1.1.1: not yet. Your answer cell raised NameError: name\n"
                          "  'x' is not defined.\n  Fix it there, then run both cells again.")
    assert error._render_traceback_() == [
        "ExerciseError: Exercise 1.1.1: not yet. Your answer cell raised NameError: name 'x' is "
        "not defined. Fix it there, then run both cells again."]


def test_an_answer_that_never_ends_is_stopped_at_its_deadline_in_one_line(capsys):
    """`while True` inside answer(): stopped at its deadline, however the loop catches
    errors, said in one line naming the exercise and the line; the check cell reports it."""
    import time

    namespace: dict = {"labkit": labkit}
    started = time.monotonic()
    exec(compile('with labkit.course.exercises.answer("1.1.1", deadline_s=0.5):\n'
                 "    while True:\n"
                 "        try:\n"
                 "            no_signal = 1\n"
                 "        except Exception:\n"
                 "            pass\n", "<cell>", "exec"), namespace)
    assert time.monotonic() - started < 30  # a bound for a broken deadline, not the expected time
    said = flat(capsys.readouterr().out)
    assert said.startswith("Exercise 1.1.1: your answer did not end in 0.5 s and was stopped at "
                           "line ") and "a loop that never ends?" in said
    right, line = exercises.verdict("1.1.1", namespace["no_signal"], rewards=torch.zeros(2, 2))
    assert not right and flat(line).startswith(
        "Exercise 1.1.1: not yet. Your answer cell did not end in 0.5 s and was stopped at line")


def test_an_answer_that_ends_leaves_no_alarm_behind():
    import signal
    import threading

    before, timer = signal.getsignal(signal.SIGALRM), signal.getitimer(signal.ITIMER_REAL)
    with exercises.answer("1.1.1", deadline_s=0.2):
        no_signal = 1  # noqa: F841
    assert signal.getsignal(signal.SIGALRM) == before  # pytest-timeout's, or none
    left = signal.getitimer(signal.ITIMER_REAL)
    assert (left[0] > 0) == (timer[0] > 0) and left[0] <= timer[0]  # its alarm goes on as it was
    rang = threading.Event()
    signal.signal(signal.SIGALRM, lambda *_: rang.set())
    try:  # an alarm set before the answer still rings after it
        signal.setitimer(signal.ITIMER_REAL, 0.3)
        with exercises.answer("1.1.1", deadline_s=5):
            pass
        assert rang.wait(timeout=30)
    finally:
        signal.signal(signal.SIGALRM, before)
        signal.setitimer(signal.ITIMER_REAL, *timer)  # pytest-timeout's alarm, when it had one


def test_an_answers_deadline_comes_from_the_environment():
    assert exercises.answer_deadline({}) == exercises.DEADLINE_S == 60
    assert exercises.answer_deadline({exercises.DEADLINE_ENV: "2.5"}) == 2.5
    for bad in ("", "0", "-1", "soon", "nan"):
        assert exercises.answer_deadline({exercises.DEADLINE_ENV: bad}) == exercises.DEADLINE_S


def test_an_answer_run_before_the_cells_above_says_to_run_them(capsys):
    """Exercise 1.3.3's answer run first in a fresh kernel: `pair` is the lesson's, not a typo."""
    namespace: dict = {"labkit": labkit}
    exec(compile('with labkit.course.exercises.answer("1.3.3"):\n'
                 "    common = sorted(set(pair[pair.clean].step))\n", "<cell>", "exec"), namespace)
    said = flat(capsys.readouterr().out)
    assert said == ("Exercise 1.3.3: this cell needs `pair`, which a cell above defines: run the "
                    "cells above first (Run > Run All Above Selected Cell). Then run this cell and "
                    "the check cell below again.")
    assert "your answer" not in said
    _, line = exercises.verdict("1.3.3", namespace["common"], runs=None, a="a", b="b")
    assert flat(line) == ("Exercise 1.3.3: not yet. Your answer cell ran before the cells above "
                          "it (`pair` was not defined yet). Run the cells above first, then both "
                          "cells again.")


def test_an_answers_error_of_many_lines_is_said_in_one(capsys):
    with exercises.answer("1.1.1"):
        raise ValueError("first line\n  second line\n" + "x" * 400)
    said = flat(capsys.readouterr().out)
    assert said.startswith("Exercise 1.1.1: your answer raised ValueError: first line second "
                           "line xxx") and "..." in said and len(said) < 500


def test_an_interrupt_inside_an_answer_is_not_caught():
    with pytest.raises(KeyboardInterrupt):
        with exercises.answer("1.1.1"):
            raise KeyboardInterrupt
    with pytest.raises(KeyError, match="no exercise '9.9'"):
        exercises.answer("9.9")


def test_the_students_copy_of_a_wrapped_answer_keeps_the_with():
    student = student_notebook(wrapped_lesson(), source_name="01_lesson.ipynb")
    assert "".join(student["cells"][5]["source"]) == (
        'with labkit.course.exercises.answer("1.1.1"):\n'
        "    no_signal = None  # Exercise 1.1.1: your answer")
    banner = flat("".join(student["cells"][0]["source"]))
    assert "Neither cell stops *Run All*" in banner and "Run Selected Cell and All Below" in banner


def write_lesson(folder: Path, nb: dict, name: str = "01_lesson.ipynb") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(students.dumps(nb))
    return path


def test_students_command_writes_then_check_passes(tmp_path, capsys):
    src = tmp_path / "notebooks"
    write_lesson(src, lesson())
    assert labkit_main(["students", str(src), "--check"]) == 1  # missing copy
    assert "missing" in capsys.readouterr().out
    assert labkit_main(["students", str(src)]) == 0
    written = json.loads((src / "students" / "01_lesson.ipynb").read_text())
    assert "BEGIN SOLUTION" not in json.dumps(written)
    assert labkit_main(["students", str(src), "--check"]) == 0


def test_check_detects_a_stale_and_an_extra_copy(tmp_path, capsys):
    src, out = tmp_path / "notebooks", tmp_path / "copies"
    nb = lesson()
    write_lesson(src, nb)
    assert labkit_main(["students", str(src), "--out", str(out)]) == 0
    nb["cells"][0]["source"] = ["# A lesson, edited\n"]
    write_lesson(src, nb)
    (out / "99_old.ipynb").write_text("{}")
    assert labkit_main(["students", str(src), "--out", str(out), "--check"]) == 1
    printed = capsys.readouterr().out
    assert "01_lesson.ipynb: stale" in printed and "99_old.ipynb: extra" in printed


def test_students_command_keeps_a_copy_a_student_edited(tmp_path, capsys):
    src = tmp_path / "notebooks"
    write_lesson(src, lesson())
    write_lesson(src, lesson(), "02_other.ipynb")
    assert labkit_main(["students", str(src)]) == 0
    copy = src / "students" / "01_lesson.ipynb"
    solved = copy.read_text().replace("no_signal = None", "no_signal = 1")
    copy.write_text(solved)  # the student's answer
    capsys.readouterr()
    assert labkit_main(["students", str(src)]) == 1
    printed = capsys.readouterr()
    assert copy.read_text() == solved
    assert f"kept 1 copy edited since labkit wrote it: {copy}; it may hold" in printed.err
    assert "--force" in printed.err
    assert f"wrote {src / 'students' / '02_other.ipynb'}" in printed.out
    assert labkit_main(["students", str(src), "--force"]) == 0
    assert "no_signal = None" in copy.read_text()


def test_check_calls_a_solved_copy_edited_not_stale_or_changed(tmp_path, capsys):
    src = tmp_path / "notebooks"
    write_lesson(src, lesson())
    assert labkit_main(["students", str(src)]) == 0
    copy = src / "students" / "01_lesson.ipynb"
    copy.write_text(copy.read_text().replace("no_signal = None", "no_signal = 1"))
    capsys.readouterr()
    assert labkit_main(["students", str(src), "--check"]) == 1
    printed = capsys.readouterr()
    assert f"{copy}: edited since labkit wrote it" in printed.out and "stale" not in printed.out
    assert "--force" not in printed.out + printed.err  # it would overwrite the student's answers
    assert printed.err.strip() == students.check_advice(src, None, [f"{copy}: edited since labkit wrote it"])


def test_the_checks_advice_for_an_edited_copy_keeps_the_answers(tmp_path):
    src = tmp_path / "notebooks"
    write_lesson(src, lesson())
    assert labkit_main(["students", str(src)]) == 0
    copy = src / "students" / "01_lesson.ipynb"
    copy.write_text(copy.read_text().replace("no_signal = None", "no_signal = 1"))
    nb = lesson()
    nb["cells"][0]["source"] = ["# A lesson, edited\n"]
    write_lesson(src, nb, "02_other.ipynb")
    advice = students.check_advice(src, None, students.stale_students(src))
    assert "--force" not in advice
    fresh = src / "students-fresh"
    assert advice == (f"the students' copies are out of date; run: labkit students {src} (it "
                      f"keeps the edited copies and their answers; for fresh ones beside them: "
                      f"labkit students {src} --out {fresh})")
    assert labkit_main(["students", str(src), "--out", str(fresh)]) == 0  # the advice is safe:
    assert "no_signal = 1" in copy.read_text()  # the answer is still there
    assert (fresh / "01_lesson.ipynb").exists()
    assert students.check_advice(src, "out", ["x: stale (...)"]) == (
        f"the students' copies are out of date; run: labkit students {src} --out out")


def test_students_command_rewrites_an_untouched_copy_of_a_changed_lesson(tmp_path):
    src = tmp_path / "notebooks"
    nb = lesson()
    write_lesson(src, nb)
    assert labkit_main(["students", str(src)]) == 0
    nb["cells"][0]["source"] = ["# A lesson, edited by the teacher\n"]
    write_lesson(src, nb)
    assert labkit_main(["students", str(src)]) == 0  # nobody touched the copy: rewritten
    assert "edited by the teacher" in (src / "students" / "01_lesson.ipynb").read_text()


def test_a_copy_knows_whether_it_is_as_written():
    text = students.dumps(student_notebook(lesson(), source_name="01_lesson.ipynb"))
    assert students.as_written(text)
    reformatted = json.dumps(json.loads(text), indent=2)  # another editor's formatting
    assert students.as_written(reformatted)
    assert not students.as_written(text.replace("no_signal = None", "no_signal = 2"))
    assert not students.as_written("{not json")


def test_students_command_defaults_to_the_notebooks_folder(monkeypatch, tmp_path):
    write_lesson(tmp_path / "notebooks", lesson())
    monkeypatch.chdir(tmp_path)
    assert labkit_main(["students"]) == 0
    assert (tmp_path / "notebooks" / "students" / "01_lesson.ipynb").exists()
    assert labkit_main(["students", "--check"]) == 0


def test_students_command_refuses_a_folder_without_notebooks(tmp_path, capsys):
    assert labkit_main(["students", str(tmp_path)]) == 2
    assert "holds no .ipynb" in capsys.readouterr().err


# ====================================================================== the lessons
LESSONS = sorted(NOTEBOOKS.glob("*.ipynb"))


def test_every_exercise_is_used_by_a_lesson_and_every_check_is_known():
    used = set()
    for path in LESSONS:
        nb = json.loads(path.read_text())
        for c in nb["cells"]:
            used.update(id for id, _ in students.check_calls("".join(c["source"])))
        student_notebook(nb, source_name=path.name)  # markers pair up
    assert used == set(exercises.EXERCISES)


def test_every_answer_cell_catches_its_own_error():
    """Each lesson's answer sits in `answer(id)` for the id its check cell grades, and the
    check grades the name the exercise's `answer` sets when the cell raises."""
    seen = set()
    for path in LESSONS:
        cells = json.loads(path.read_text())["cells"]
        for i, c in enumerate(cells):
            source = "".join(c["source"])
            if BEGIN_MARK not in source:
                continue
            id, name = students._following_check(cells, i)
            assert f'with labkit.course.exercises.answer("{id}"):\n    {BEGIN_MARK}' in source, \
                f"{path.name}: the answer to {id} is not inside answer({id!r})"
            assert name == exercises.EXERCISES[id].answer, (path.name, id)
            seen.add(id)
    assert seen == set(exercises.EXERCISES)


def defined(source: str) -> set[str]:
    """The names a cell's code assigns or imports at its top level (a for's target too)."""
    import ast

    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
    return names


def test_each_exercise_needs_the_names_its_answer_cell_reads_from_the_cells_above():
    """`needs` is what an answer cell run before the cells above it misses: every name the
    lesson's answer cell reads that a cell above defines, and none that no cell above does."""
    import ast

    for path in LESSONS:
        code = ["".join(c["source"]) for c in json.loads(path.read_text())["cells"]
                if c["cell_type"] == "code"]
        for i, source in enumerate(code):
            if BEGIN_MARK not in source:
                continue
            id, _ = students._following_check([{"cell_type": "code", "source": s} for s in code], i)
            above = set().union(*(defined(s) for s in code[:i]))
            read = {n.id for n in ast.walk(ast.parse(source))
                    if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
            wanted = (read & above) - defined(source) - {"labkit"}
            needs = set(exercises.EXERCISES[id].needs)
            assert wanted <= needs, (path.name, id, wanted - needs)
            assert needs <= above, (path.name, id, needs - above)


def test_a_typo_in_lesson_1_2s_first_answer_lets_run_all_go_on(capsys):
    """The students' 1.2 with a typo in 1.2.1's answer, every cell run in order as Run All
    does: no cell raises, the typo is one line, the other exercises still get their checks."""
    path = NOTEBOOKS / "02_watchdog_replay.ipynb"
    student = student_notebook(json.loads(path.read_text()), source_name=path.name)
    for c in student["cells"]:
        c["source"] = ["".join(c["source"]).replace(
            "waited = None", "waited = sum(polcy.ceiling(k) for k in range(1, 5))")]
    import warnings

    saved = warnings.formatwarning  # the lesson's first cell sets plain warnings
    try:
        run_cells(student)
    finally:
        warnings.formatwarning = saved
    out = flat(capsys.readouterr().out)
    assert "Exercise 1.2.1: your answer raised NameError: name 'polcy' is not defined" in out
    assert "Exercise 1.2.1: not yet. Your answer cell raised NameError" in out
    assert "Exercise 1.2.2: not answered yet" in out and "Exercise 1.2.3: not answered yet" in out


def test_committed_student_copies_are_up_to_date():
    if not LESSONS:
        pytest.skip("no lesson notebooks")
    assert students.stale_students(NOTEBOOKS) == []


def test_lesson_1_1_first_check_fails_unsolved_in_the_students_copy(graded, capsys):
    """The students' 1.1, graded up to its first check cell: the check fails with the nudge."""
    path = NOTEBOOKS / "01_launcher.ipynb"
    student = student_notebook(json.loads(path.read_text()), source_name=path.name)
    code = [c for c in student["cells"] if c["cell_type"] == "code"]
    first_check = next(i for i, c in enumerate(code) if "exercises.check" in "".join(c["source"]))
    import warnings

    namespace: dict = {}
    saved = warnings.formatwarning  # the lesson's first cell sets plain warnings
    try:
        for c in code[:first_check]:
            exec(compile("".join(c["source"]), "<cell>", "exec"), namespace)
    finally:
        warnings.formatwarning = saved
    with pytest.raises(ExerciseError, match=r"(?s)Exercise 1\.1\.1: not answered yet.*compute_adv"):
        exec(compile("".join(code[first_check]["source"]), "<cell>", "exec"), namespace)


# ====================================================================== grading a lesson
GRADED = "02_watchdog_replay.ipynb"  # reads logs only: graded in seconds


def grading_command(text: str) -> list[str]:
    """The grading command a text gives (its first `python -m pytest --nbval-lax ...` line)."""
    found = re.search(r"python -m pytest --nbval-lax[^`\n]*", text)
    assert found, "no grading command in the text"
    return found.group(0).split()


def grade(command: list[str], cwd: Path) -> subprocess.CompletedProcess:
    """Run a grading command as a student would, with this Python and this labkit."""
    env = {k: v for k, v in os.environ.items() if k != exercises.GRADING_ENV}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    return subprocess.run([sys.executable, *command[1:], "-p", "no:cacheprovider"], cwd=cwd,
                          env=env, capture_output=True, text=True, timeout=600)


def failed_cells(result: subprocess.CompletedProcess) -> list[str]:
    return re.findall(r"^FAILED \S+::(Cell \d+)", result.stdout, re.M)


def test_the_grading_commands_agree():
    copy = json.loads((NOTEBOOKS / "students" / GRADED).read_text())
    header = "".join(copy["cells"][0]["source"])
    readme = (NOTEBOOKS / "README.md").read_text()
    assert grading_command(header) == grading_command(readme)[:-1] + [f"notebooks/students/{GRADED}"]


def test_grading_fails_the_unsolved_students_copy():
    """The students' copy as committed: the header's command fails it, on its check cells only."""
    copy = json.loads((NOTEBOOKS / "students" / GRADED).read_text())
    result = grade(grading_command("".join(copy["cells"][0]["source"])), REPO)
    assert result.returncode == 1, result.stdout[-3000:]
    code = [c for c in copy["cells"] if c["cell_type"] == "code"]
    checks = [f"Cell {i}" for i, c in enumerate(code) if "exercises.check(" in "".join(c["source"])]
    assert len(checks) == 3 and failed_cells(result) == checks, result.stdout[-3000:]
    assert "Exercise 1.2.1: not answered yet" in result.stdout


def test_grading_passes_the_students_copy_once_solved(tmp_path):
    """The same copy with the teachers' solutions typed in: the same command passes it."""
    teacher = json.loads((NOTEBOOKS / GRADED).read_text())
    solutions = {c["id"]: c["source"] for c in teacher["cells"]
                 if any(BEGIN_MARK in line for line in c["source"])}
    copy = json.loads((NOTEBOOKS / "students" / GRADED).read_text())
    for c in copy["cells"]:
        if c["id"] in solutions:
            c["source"] = [line for line in solutions[c["id"]] if "SOLUTION" not in line]
    assert len(solutions) == 3
    folder = tmp_path / "notebooks" / "students"
    folder.mkdir(parents=True)
    (folder / GRADED).write_text(json.dumps(copy))
    (tmp_path / "notebooks" / "conftest.py").symlink_to(NOTEBOOKS / "conftest.py")
    result = grade(grading_command("".join(copy["cells"][0]["source"])), tmp_path)
    assert result.returncode == 0, result.stdout[-3000:]
    assert failed_cells(result) == []


def solved_copy(folder: Path, answers: dict[str, str]) -> Path:
    """The students' copy of lesson 1.2 in `folder`/notebooks/students, with `answers` ({the
    placeholder's name: code}) typed over the placeholders, beside notebooks/conftest.py as
    in a checkout; returns the checkout folder."""
    copy = json.loads(students.student_texts(NOTEBOOKS)[GRADED])
    for c in copy["cells"]:
        for name, code in answers.items():
            c["source"] = [re.sub(rf"{name} = None  # Exercise .*", code, "".join(c["source"]))]
    where = folder / "notebooks" / "students"
    where.mkdir(parents=True)
    (where / GRADED).write_text(json.dumps(copy))
    (folder / "notebooks" / "conftest.py").symlink_to(NOTEBOOKS / "conftest.py")
    return folder


def failures(out: str) -> str:
    """pytest's failure reports, without its short summary at the end: where the CI variable is
    set, the summary repeats each failure's whole message rather than one cut line."""
    return out.split(" short test summary info ")[0]


def grade_within(command: list[str], cwd: Path, bound_s: float, **env) -> tuple[str, float]:
    """Run a grading command (its own process group, with `env` added) and wait for it at
    most `bound_s`; past that, end it and its kernel and fail. Returns (its output, seconds)."""
    import signal
    import time

    env = {**{k: v for k, v in os.environ.items() if k != exercises.GRADING_ENV}, **env,
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    started = time.monotonic()
    proc = subprocess.Popen([sys.executable, *command[1:], "-p", "no:cacheprovider"], cwd=cwd,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=bound_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # pytest and the kernel it started
        out, _ = proc.communicate()
        pytest.fail(f"grading still ran after {bound_s:.0f} s:\n{out[-3000:]}")
    return out, time.monotonic() - started


def test_grading_stops_an_answer_that_never_ends_and_fails_its_check_in_one_line(tmp_path):
    """An answer that loops forever, graded with the students' command: it is stopped at its
    deadline, the cells after it run, and the lesson fails once for it, at its check cell,
    in one line that names the exercise; no timeout of nbval's, no traceback, no stack dump.
    (Without a deadline of its own the loop holds the kernel for nbval's 2000 s cell timeout,
    then every cell after it does the same.)"""
    checkout = solved_copy(tmp_path, {"waited": "while True:\n        pass"})
    copy = json.loads((checkout / "notebooks" / "students" / GRADED).read_text())
    out, took = grade_within(grading_command("".join(copy["cells"][0]["source"])), checkout,
                             bound_s=300, LABKIT_ANSWER_DEADLINE_S="3")
    code = [c for c in copy["cells"] if c["cell_type"] == "code"]
    checks = [f"Cell {i}" for i, c in enumerate(code) if "exercises.check(" in "".join(c["source"])]
    assert re.findall(r"^FAILED \S+::(Cell \d+)", out, re.M) == checks, out[-3000:]  # once each
    said = [line for line in failures(out).splitlines() if "Exercise 1.2.1" in line]
    assert said == ["ExerciseError: Exercise 1.2.1: not yet. Your answer cell did not end in 3 s "
                    "and was stopped at line 2 (a loop that never ends?). Fix it there, then run "
                    "both cells again."], out[-3000:]
    assert "Exercise 1.2.2: not answered yet" in out  # the cells after it ran
    for noise in ("Timeout", "Traceback (most recent call last)", "Thread", "KeyboardInterrupt"):
        assert noise not in out, out[-3000:]
    assert took < 240, took


def test_grading_fails_a_raising_answer_once_with_its_own_error(tmp_path):
    """A typo in an answer, graded: its check cell fails with the typo's NameError, and the
    answer cell itself passes (it said the error in one line): one failure, not two."""
    checkout = solved_copy(tmp_path, {"waited": "waited = sum(polcy.ceiling(k) for k in range(1, 5))"})
    copy = json.loads((checkout / "notebooks" / "students" / GRADED).read_text())
    out, _ = grade_within(grading_command("".join(copy["cells"][0]["source"])), checkout,
                          bound_s=300)
    code = [c for c in copy["cells"] if c["cell_type"] == "code"]
    checks = [f"Cell {i}" for i, c in enumerate(code) if "exercises.check(" in "".join(c["source"])]
    assert re.findall(r"^FAILED \S+::(Cell \d+)", out, re.M) == checks, out[-3000:]
    said = [line for line in failures(out).splitlines() if "Exercise 1.2.1" in line]
    assert said == ["ExerciseError: Exercise 1.2.1: not yet. Your answer cell raised NameError: "
                    "name 'polcy' is not defined. Fix it there, then run both cells again."], out
    assert "Traceback (most recent call last)" not in out


# ====================================================================== profiles
def test_pick_follows_the_hardware_and_the_environment(capsys):
    assert profiles.pick({}, gpu=False) == "cpu"
    assert "no GPU here" in capsys.readouterr().out
    assert profiles.pick({}, gpu=True, say=False) == "gpu"
    assert profiles.pick({"LABKIT_PROFILE": "CPU"}, gpu=True, say=False) == "cpu"
    assert profiles.pick({"LABKIT_PROFILE": "gpu"}, gpu=False) == "gpu"
    assert "no GPU is visible" in capsys.readouterr().out
    with pytest.raises(profiles.ConfigError, match="LABKIT_PROFILE='tpu'.*gpu, cpu"):
        profiles.pick({"LABKIT_PROFILE": "tpu"})


def test_profile_configs():
    cpu = profiles.config("cpu")
    assert (cpu.model, cpu.rollout_batch_size, cpu.n_samples_per_prompt, cpu.num_rollout,
            cpu.rollout_max_response_len, cpu.steps_per_rollout) == ("smollm2", 4, 8, 24, 48, 1)
    assert (cpu.rm_type, cpu.synthetic_steps, cpu.prompt_examples) == ("math_format", 0, 2)
    gpu = profiles.config("gpu")
    assert gpu.model == "Qwen/Qwen2.5-0.5B-Instruct" and gpu.global_batch_size == 256
    assert (Path.cwd() / gpu.output_dir).resolve() == profiles.course_root() / "runs"
    assert profiles.config("cpu", output_dir="elsewhere").output_dir == "elsewhere"
    with pytest.raises(profiles.ConfigError, match="--global-batch-size 32 does not divide"):
        profiles.config("cpu", n_samples_per_prompt=3)
    with pytest.raises(profiles.ConfigError, match="unknown profile"):
        profiles.config("tpu")


def test_a_profile_is_described_from_its_preset(monkeypatch):
    from labkit import config

    monkeypatch.setitem(config.PRESETS, "cpu",
                        {**config.PRESETS["cpu"], "num_rollout": 12, "rollout_batch_size": 4,
                         "n_samples_per_prompt": 4, "global_batch_size": 16,
                         "rollout_max_response_len": 48})
    assert profiles.describe("cpu") == ("SmolLM2-135M (embedded) on made-up problems, 4 prompts "
                                        "x 4 answers, at most 48 tokens, 12 steps")
    assert profiles.describe("gpu").startswith("the recipe: Qwen/Qwen2.5-0.5B-Instruct on gsm8k, "
                                               "32 prompts x 8 answers")


def test_runs_are_named_from_the_working_folder(monkeypatch, tmp_path):
    monkeypatch.chdir(REPO / "notebooks")
    assert profiles.config("cpu").output_dir == "../runs"
    monkeypatch.chdir(tmp_path)  # outside the repository: the absolute path
    assert Path(profiles.config("cpu").output_dir).is_absolute()


def test_course_root_and_runs_dir(tmp_path):
    assert profiles.course_root(REPO / "notebooks" / "students") == REPO
    assert profiles.course_root(tmp_path) == REPO  # outside the repository: where labkit is
    assert profiles.runs_dir({}) == REPO / "data" / "runs"
    assert profiles.runs_dir({"LABKIT_RUNS_DIR": str(tmp_path)}) == tmp_path


def test_incident_log_prefers_a_recording(tmp_path):
    folder, scratch = tmp_path / "incidents", tmp_path / "scratch"
    folder.mkdir()
    made = profiles.incident_log(folder=folder, scratch=scratch)
    assert made == scratch / "course.constructed.jsonl"
    first = json.loads(made.read_text().splitlines()[0])
    assert first["event"] == "meta" and first["constructed"] is True
    (folder / "b-run.jsonl").write_text("")
    (folder / "a-run.jsonl").write_text("")
    (folder / "x.constructed.jsonl").write_text("")
    (folder / "a-run.expected.json").write_text("{}")
    assert profiles.incident_log(folder=folder) == folder / "a-run.jsonl"
    assert profiles.incident_log("b-run", folder=folder) == folder / "b-run.jsonl"
    with pytest.raises(FileNotFoundError, match="a-run.jsonl, b-run.jsonl"):
        profiles.incident_log("c-run", folder=folder)


def test_plain_warnings_drop_the_path():
    import warnings

    saved = warnings.formatwarning
    try:
        profiles.plain_warnings()
        shown = warnings.formatwarning("odd", UserWarning, "/some/file.py", 3)
        assert shown == "UserWarning: odd\n"
    finally:
        warnings.formatwarning = saved


def test_the_gpu_profile_takes_local_copies_and_the_miles_script_names_the_hub_model(
        monkeypatch, tmp_path, capsys):
    from labkit.miles import render_script

    model, data = tmp_path / "qwen2.5-coder-0.5b-q4_k_m.gguf", tmp_path / "gsm8k"
    monkeypatch.setenv("LABKIT_MODEL", str(model))
    monkeypatch.setenv("LABKIT_DATA", str(data))
    gpu = profiles.config("gpu")
    assert (gpu.model, gpu.data) == (str(model), str(data))
    assert profiles.config("cpu").model == "smollm2"  # the CPU profile is offline already
    assert profiles.describe("gpu") == (
        f"the recipe: {model} ($LABKIT_MODEL) on {data} ($LABKIT_DATA), 32 prompts x 8 "
        f"answers, at most 1024 tokens, 24 steps")
    for profile in ("gpu", "cpu"):
        shown = profiles.miles_config(profile)
        note = flat(capsys.readouterr().out)
        assert shown.model == "Qwen/Qwen2.5-0.5B-Instruct" and shown.data == str(data)
        assert note.startswith(f"note: this machine's runs train {model}; the script names "
                               f"the recipe's Qwen/Qwen2.5-0.5B-Instruct")
        assert "hf download Qwen/Qwen2.5-0.5B-Instruct" in render_script(shown, explicit=[])
    monkeypatch.delenv("LABKIT_MODEL")
    assert profiles.miles_config("gpu").model == "Qwen/Qwen2.5-0.5B-Instruct"
    assert capsys.readouterr().out == ""  # the hub model itself: no note


def test_checkpoints_lists_the_run_folders_that_keep_one(tmp_path, tiny_cfg):
    from labkit.run.stopping import StopController

    stopper = StopController(None)
    original = stopper.record_step
    stopper.record_step = lambda s: (original(s), stopper.request_stop("SIGINT", "signal"))
    labkit.launch(tiny_cfg.replace(run_name="done", num_rollout=1))
    from labkit.trainer import train

    train(tiny_cfg.replace(run_name="stopped"), stopper=stopper)  # ■ during step 0
    kept = profiles.checkpoints(Path(tiny_cfg.output_dir))
    assert kept["run"].tolist() == ["stopped"] and kept["after step"].tolist() == [0]
    assert kept["GB"].iat[0] >= 0 and kept["delete to free it"].iat[0].endswith("stopped/checkpoint")
    assert profiles.checkpoints(tmp_path / "nothing-here").empty


def test_after_step_presses_once_a_new_run_logged_the_step(tiny_cfg, capsys, monkeypatch):
    import os
    import signal
    import threading

    from labkit import trainer
    from labkit.trainer import train

    labkit.launch(tiny_cfg.replace(run_name="before", num_rollout=1))  # there before: ignored
    cfg = tiny_cfg.replace(run_name="pressed", num_rollout=3)
    pressed = threading.Event()

    def press_stop():
        os.kill(os.getpid(), signal.SIGINT)
        pressed.set()

    advance = trainer._advance

    def held_after_its_step(bar, metrics):  # the run waits for the press after each step
        advance(bar, metrics)
        pressed.wait(timeout=120)

    monkeypatch.setattr(trainer, "_advance", held_after_its_step)
    press = profiles.after_step(cfg, 0, press_stop)  # ■ once step 0 is logged
    press.start()
    stopped = train(cfg)
    press.cancel()
    assert press.called and pressed.is_set()
    assert stopped.status["reason"] == "signal" and stopped.status["last_step"] == 0
    monkeypatch.undo()
    resumed = train(cfg, resume=stopped.dir)
    assert resumed.metrics["rollout/step"].tolist() == [0, 1, 2]
    idle = profiles.after_step(cfg, 0, pytest.fail, "called after cancel")
    idle.start()
    idle.cancel()
    idle.join(timeout=30)
    assert not idle.is_alive() and not idle.called
