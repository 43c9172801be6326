"""Exercises: grade a lesson's answers in its check cells.

A lesson's exercise is a code cell whose answer sits between two marker lines, inside
`answer(id)`::

    with labkit.course.exercises.answer("1.1.2"):
        ### BEGIN SOLUTION
        global_batch_16 = recipe.rollout_batch_size * 16
        ### END SOLUTION

followed by a check cell, `labkit.course.exercises.check("1.1.2", global_batch_16, prompts=32)`.
`check` never stores an answer: it computes the expected one from what the cell hands it
with labkit's own functions (RunConfig's batch check, compute_advantages, replay,
run_gains, ...), so an answer is judged on the student's data.

What a check cell says comes in steps, so that no first try gives the solution away: an
unanswered exercise gets a *nudge* (where to look, no code); a first wrong answer gets what
is wrong with it and the nudge again; only a later, different wrong answer gets the *hint*
(the code to write); a right one gets "Exercise 1.1.1: correct.". The wrong answers are
counted per exercise in the kernel (`forget_tries` starts over), so running a check cell
again with the same answer does not give the code away either.

Neither cell stops the notebook. A check cell prints its line. An answer that raises (a
typo in a name, a wrong column) is caught by `answer`: it prints the error in one line, and
the answer's name then holds that error, which the check cell reports; so *Run All* goes on
to the cells below and keeps their outputs (JupyterLab clears the outputs of every cell it
queues, and an error would leave them empty). Only a syntax error stops Run All: Python
cannot run any of the cell then, the `with` included.

An answer also has a deadline of its own (DEADLINE_S, or $LABKIT_ANSWER_DEADLINE_S): one
that never ends (`while True`) would otherwise hold the kernel, and every cell queued after
it, until someone presses the stop button, and under grading until a cell timeout of half an
hour (pytest's; nbval's own is longer), for this cell and then for each one after it. `answer` arms an alarm
(SIGALRM) for the code inside it, stops the answer when it rings, and says so in one line,
as for an error. The check cell is where grading fails: when $LABKIT_GRADING is set
(notebooks/conftest.py sets it for `pytest --nbval-lax`, and the kernels nbval starts
inherit it), a wrong, missing, raising or stopped answer makes its check cell raise
ExerciseError, which nbval shows in one line, so each unsolved exercise fails the lesson
once, at its check cell, naming the exercise.

The students' copies of the lessons, with the solutions taken out, are written by
`labkit.course.students`.
"""

from __future__ import annotations

import math
import os
import re
import signal
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

BEGIN = "### BEGIN SOLUTION"
END = "### END SOLUTION"
GRADING_ENV = "LABKIT_GRADING"
DEADLINE_ENV = "LABKIT_ANSWER_DEADLINE_S"
DEADLINE_S = 60.0  # an answer's own time limit; every lesson's answer takes well under a second
# a check call: its exercise id and, when it is a plain name, the answer variable
CHECK_RE = re.compile(
    r"""exercises\.check\(\s*["'](?P<id>[^"']+)["'](?:\s*,\s*(?P<answer>[A-Za-z_]\w*))?""")


class ExerciseError(AssertionError):
    """An exercise answered wrong or not yet, when grading; the message says which and why.

    IPython (a notebook's kernel, and so nbval) shows it as its message on one line, without
    a traceback: the traceback would only show labkit's grading code."""

    def _render_traceback_(self) -> list[str]:
        return [f"{type(self).__name__}: {' '.join(str(self).split())}"]


class AnswerTimeout(BaseException):
    """Raised inside an answer that ran past its deadline, by `answer`'s alarm. A
    BaseException, so that an answer's own `except Exception` does not swallow it."""


class _Wrong(Exception):
    """Raised by a grader with what is wrong with this answer."""


class GivenError(ValueError):
    """What a check cell hands a grader cannot tell a right answer from a wrong one (the
    lesson's mistake, not the student's): raised as it is, whatever the answer."""


@dataclass(frozen=True)
class Exercise:
    """One exercise: its id ("1.1.1": lesson 1.1, exercise 1), the task, a nudge, a hint, a
    grader, the name the lesson's answer cell assigns (`answer`), and the names its answer
    reads that cells above it define (`needs`).

    The nudge says where to look (shown while the exercise is unanswered); the hint shows the
    code (shown after a wrong answer). `grade(answer, **given)` returns when `answer` is right
    and raises _Wrong(why) when not. A NameError for one of `needs` is not the answer's
    mistake: the cells above have not run (a restarted kernel, a cell run out of order).
    """

    id: str
    task: str
    nudge: str
    hint: str
    grade: Callable[..., None]
    answer: str = ""
    needs: tuple[str, ...] = ()


EXERCISES: dict[str, Exercise] = {}
HINT_AFTER = 2  # the hint (the code) comes with the second different wrong answer
_tries: dict[str, set[str]] = {}  # exercise id -> the wrong answers seen in this kernel


def exercise(id: str, task: str, *, nudge: str, hint: str, answer: str,
             needs: tuple[str, ...] = ()):
    """Register the decorated grader as exercise `id`, whose answer cell assigns `answer` and
    reads `needs` from the cells above it."""
    def register(grade: Callable[..., None]) -> Callable[..., None]:
        EXERCISES[id] = Exercise(id, task, nudge, hint, grade, answer, tuple(needs))
        return grade
    return register


@dataclass(frozen=True)
class Raised:
    """What an exercise's answer name holds after its answer cell raised or was stopped:
    what happened, in one line (`answer` puts it there, so the check cell below reports it
    instead of stopping on a name the cell never assigned). `said` is what the check cell
    says of the answer cell: "raised NameError: ...", "did not end in 60 s ...", ..."""

    id: str
    error: str
    said: str = ""
    then: str = "Fix it there, then run both cells again."

    def __post_init__(self):
        if not self.said:
            object.__setattr__(self, "said", f"raised {self.error}")

    def __repr__(self) -> str:
        return f"<the answer to exercise {self.id}: {self.said}>"


def answer_deadline(env: dict | None = None) -> float:
    """An answer's deadline in seconds: $LABKIT_ANSWER_DEADLINE_S when it is a number > 0,
    else DEADLINE_S."""
    value = (os.environ if env is None else env).get(DEADLINE_ENV, "")
    try:
        seconds = float(value)
    except ValueError:
        return DEADLINE_S
    return seconds if math.isfinite(seconds) and seconds > 0 else DEADLINE_S


class answer:
    """`with labkit.course.exercises.answer("1.2.1"):` around an answer cell's code.

    An error in it (an Exception) prints one line, "Exercise 1.2.1: your answer raised
    NameError: ... (line 3 of this cell)", and the cell ends without raising, so Run All goes
    on; a NameError for a name the cells above define says to run them first. An answer
    still running after `deadline_s` seconds (default: answer_deadline()) is stopped, with a
    line that says so, and the cell ends the same way: the cells after it are not held up.
    The exercise's answer name (Exercise.answer) is then set to a Raised in the cell's
    namespace, so the check cell says what went wrong rather than reading an older answer
    or stopping on an unassigned name; under grading the check cell fails for it, once.
    KeyboardInterrupt (the stop button) goes on as it came. The deadline needs SIGALRM, so
    it holds in the main thread of a POSIX process (a notebook's kernel runs cells there),
    and nowhere else. Raises KeyError for an unknown exercise id."""

    def __init__(self, id: str, *, deadline_s: float | None = None):
        _known(id)
        self.id = id
        self.deadline_s = answer_deadline() if deadline_s is None else float(deadline_s)
        self._alarm: tuple | None = None  # (the SIGALRM handler and timer it replaced, armed at)
        self._ended = False

    def __enter__(self) -> answer:
        self._arm()
        return self

    def __exit__(self, kind, error, tb) -> bool:
        self._disarm()
        line = f" {tb.tb_lineno}" if tb is not None else ""  # the cell's line it was at
        if isinstance(error, AnswerTimeout):
            said = f"did not end in {self.deadline_s:g} s and was stopped at line{line}"
            return self._told(f"Exercise {self.id}: your answer {said} of this cell (a loop that "
                              f"never ends?).", Raised(self.id, "AnswerTimeout",
                                                       f"{said} (a loop that never ends?)"))
        if error is None or not isinstance(error, Exception):
            return False  # KeyboardInterrupt (the stop button) goes on as it came
        missing = getattr(error, "name", None) if isinstance(error, NameError) else None
        if missing and missing in EXERCISES[self.id].needs:
            first = (f"Exercise {self.id}: this cell needs `{missing}`, which a cell above "
                     f"defines: run the cells above first (Run > Run All Above Selected Cell).")
            return self._told(first, Raised(
                self.id, f"NameError: {error}", f"ran before the cells above it (`{missing}` "
                f"was not defined yet)", "Run the cells above first, then both cells again."),
                then="Then run this cell and the check cell below again.")
        told = " ".join(str(error).split())  # one line, however the error wrote it
        told = told if len(told) <= 300 else told[:297] + "..."
        what = f"{type(error).__name__}: {told}" if told else type(error).__name__
        where = f" (line{line} of this cell)" if line else ""
        return self._told(f"Exercise {self.id}: your answer raised {what}{where}.",
                          Raised(self.id, what))

    def _told(self, first: str, raised: Raised,
              then: str = "Fix it, then run this cell and the check cell below again.") -> bool:
        """Print what happened, set the answer's name to `raised` at the cell's top level, and
        end the `with` without raising."""
        print(_lines(first, then), flush=True)
        name, cell = EXERCISES[self.id].answer, sys._getframe(2)
        if name and cell.f_locals is cell.f_globals:  # a cell's top level (not in a function)
            cell.f_globals[name] = raised
        return True

    # --- the deadline: an alarm (SIGALRM) that raises AnswerTimeout inside the answer
    def _arm(self) -> None:
        if not hasattr(signal, "setitimer") or threading.current_thread() is not threading.main_thread():
            return
        handler = signal.signal(signal.SIGALRM, self._ring)
        timer = signal.setitimer(signal.ITIMER_REAL, self.deadline_s, 1.0)  # again each second
        self._alarm = (handler, timer, time.monotonic())

    def _ring(self, signum, frame) -> None:
        if not self._ended:  # the answer ended as the alarm rang: nothing to stop
            raise AnswerTimeout(f"exercise {self.id}: the answer ran past {self.deadline_s:g} s")

    def _disarm(self) -> None:
        self._ended = True
        if self._alarm is None:
            return
        handler, (delay, interval), armed = self._alarm
        self._alarm = None
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, signal.SIG_DFL if handler is None else handler)
        if delay > 0:  # an alarm set before this answer rings when it would have
            signal.setitimer(signal.ITIMER_REAL, max(delay - (time.monotonic() - armed), 1e-3),
                             interval)


def _known(id: str) -> Exercise:
    if id not in EXERCISES:
        raise KeyError(f"no exercise {id!r}; known: {', '.join(EXERCISES)}")
    return EXERCISES[id]


def grading(env: dict | None = None) -> bool:
    """True when a wrong answer must raise: $LABKIT_GRADING is set to anything but "" or "0"."""
    value = (os.environ if env is None else env).get(GRADING_ENV, "")
    return value.strip() not in ("", "0")


def verdict(id: str, answer: Any, **given) -> tuple[bool, str]:
    """(right, what a check cell shows) for `answer` to exercise `id`: the verdict on the first
    line, then the nudge (unanswered, or a first wrong answer) or the hint with the code (from
    the HINT_AFTER-th different wrong answer on). Never raises for an answer, whatever it is;
    raises KeyError for an unknown exercise id, and GivenError when what the check cell
    hands cannot tell a right answer from a wrong one."""
    ex = _known(id)
    if isinstance(answer, Raised):  # not a wrong try: the answer never came to be
        return False, _lines(f"Exercise {id}: not yet. Your answer cell {answer.said}.",
                             answer.then)
    if answer is None or answer is Ellipsis:
        return False, _lines(f"Exercise {id}: not answered yet.",
                             "Replace the None in the cell above with your answer, then run "
                             "both cells again.", f"Where to start: {ex.nudge}")
    try:
        ex.grade(answer, **given)
    except GivenError:
        raise
    except _Wrong as wrong:
        why = str(wrong)
    except Exception as e:  # an answer of a shape the grader did not foresee
        why = f"This answer could not be graded ({type(e).__name__}: {e})."
    else:
        return True, f"Exercise {id}: correct."
    tries = _tries.setdefault(id, set())
    tries.add(_answer_key(answer))
    if len(tries) >= HINT_AFTER:
        return False, _lines(f"Exercise {id}: not yet. {why}", f"Hint: {ex.hint}")
    return False, _lines(f"Exercise {id}: not yet. {why}", f"Look again: {ex.nudge}",
                         "Change your answer and run both cells again; after another wrong "
                         "answer this cell shows a hint with the code.")


def forget_tries(id: str | None = None) -> None:
    """Forget the wrong answers seen so far (of exercise `id`, or of all): the next wrong
    answer gets the nudge again, not the code."""
    if id is None:
        _tries.clear()
    else:
        _tries.pop(id, None)


def _answer_key(answer: Any) -> str:
    """What makes two answers the same try: their text, shortened (a tensor or a frame too)."""
    try:
        text = repr(answer)
    except Exception:  # noqa: BLE001 - an object whose repr fails is one try of its own
        text = f"<{type(answer).__name__} at {id(answer):x}>"
    return text[:2000]


def _lines(first: str, *more: str, width: int = 88) -> str:
    """The verdict and what follows it, wrapped at word boundaries (a notebook's output area
    breaks a long line inside words) and indented under the first line."""
    return "\n".join(textwrap.fill(text, width, initial_indent="" if i == 0 else "  ",
                                    subsequent_indent="  ", break_long_words=False,
                                    break_on_hyphens=False)
                      for i, text in enumerate((first, *more)))


def check(id: str, answer: Any, **given) -> None:
    """Grade `answer` to exercise `id` against what `given` holds (runs, a log, a config).

    Prints "Exercise <id>: correct." when right, else one line that says "not yet" with a
    nudge (unanswered: None or ...) or what is wrong and a hint. When grading (see
    `grading`), a wrong or missing answer raises ExerciseError with that line instead.
    """
    __tracebackhide__ = True  # pytest: show the message, not this frame
    right, line = verdict(id, answer, **given)
    if not right and grading():
        raise ExerciseError(line)
    print(line)


# ====================================================================== helpers for graders
def _number(answer: Any, what: str) -> float:
    """`answer` as a float (a number, a numpy scalar, a one-element tensor or Series)."""
    if isinstance(answer, bool) or isinstance(answer, str):
        raise _Wrong(f"the answer is {answer!r}; give {what} as a number.")
    item = getattr(answer, "item", None)
    try:
        value = float(item() if callable(item) else answer)
    except (TypeError, ValueError, RuntimeError):  # RuntimeError: a tensor of many numbers
        raise _Wrong(f"the answer is a {type(answer).__name__}; give {what} as one number."
                     ) from None
    if not math.isfinite(value):
        raise _Wrong(f"the answer is {value}; give {what} as a finite number.")
    return value


def _whole(answer: Any, what: str) -> int:
    value = _number(answer, what)
    if value != int(value):
        raise _Wrong(f"{value:g} is not a whole number; {what} is a count.")
    return int(value)


def _close(a: float, b: float, tol: float = 1e-6) -> bool:
    return math.isclose(a, b, rel_tol=tol, abs_tol=tol)


def _metrics(run) -> Any:
    """The per-step metrics frame of a Run, or the frame itself."""
    return run.metrics if hasattr(run, "metrics") and hasattr(run, "dir") else run


# ====================================================================== lesson 1.1
@exercise("1.1.1", "Set no_signal to the number of groups in `rewards` whose answers all got "
          "the same reward.",
          nudge="a group teaches nothing when every answer in it got the same reward. "
                "compute_advantages finds those groups for you: look at what it returns.",
          hint="compute_advantages(rewards_b).zero_std is True for those groups, and .sum() "
               "counts them. All-0 and all-1 groups both teach nothing.",
          answer="no_signal", needs=("torch", "compute_advantages"))
def _grade_no_signal(answer, *, rewards) -> None:
    from labkit.grpo import compute_advantages

    n = _whole(answer, "the number of groups")
    zero_std = compute_advantages(rewards).zero_std
    expected = int(zero_std.sum())
    all_zero = int((rewards == 0).all(dim=1).sum())
    all_one = int((rewards == 1).all(dim=1).sum())
    if n == expected:
        return
    if n == len(zero_std) - expected:
        raise _Wrong(f"{n} is the number of groups that do teach something.")
    if n in (all_zero, all_one) and all_zero != all_one:
        raise _Wrong(f"{n} counts only the all-{0 if n == all_zero else 1} groups.")
    raise _Wrong(f"{n} is not the count of groups with one reward for every answer.")


@exercise("1.1.2", "Set global_batch_16 to the --global-batch-size that gives exactly one "
          "optimizer step per rollout for 16 answers per prompt at the recipe's prompts.",
          nudge="the global batch counts every answer of a rollout.",
          hint="prompts x answers per prompt: recipe.rollout_batch_size * 16.",
          answer="global_batch_16", needs=("recipe",))
def _grade_global_batch(answer, *, prompts: int = 32, answers: int = 16) -> None:
    from labkit.config import ConfigError, RunConfig

    g = _whole(answer, "the global batch")
    if g == answers:
        raise _Wrong(f"{g} is the group size (answers per prompt), not the global batch.")
    if g == prompts:
        raise _Wrong(f"{g} is the prompts per rollout, not the global batch.")
    cfg = RunConfig(rollout_batch_size=prompts, n_samples_per_prompt=answers,
                    global_batch_size=g, micro_batch_size=min(8, max(g, 1)))
    try:
        cfg.check()
    except ConfigError as e:
        raise _Wrong(f"RunConfig refuses it: {e}.") from None
    if cfg.steps_per_rollout != 1:
        raise _Wrong(f"--global-batch-size {g} is valid, but a rollout of {prompts} x {answers} "
                     f"then makes {cfg.steps_per_rollout} optimizer steps, not one.")


@exercise("1.1.3", "Set rollout_share to the share of the run's wall time spent in the rollout: "
          "the sum of perf/rollout_time over all steps divided by the sum of perf/step_time.",
          nudge="both columns are in run.metrics; add each one up over the steps, then divide.",
          hint="run.metrics['perf/rollout_time'].sum() / run.metrics['perf/step_time'].sum(), "
               "a number between 0 and 1.",
          answer="rollout_share", needs=("run",))
def _grade_rollout_share(answer, *, run) -> None:
    m = _metrics(run)
    share = _number(answer, "the share")
    rollout, step = m["perf/rollout_time"].astype(float), m["perf/step_time"].astype(float)
    expected = rollout.sum() / step.sum()
    if _close(share, expected, 1e-4):
        return
    if _close(share, 100 * expected, 1e-4):
        raise _Wrong("that is a percentage; give the share as a fraction between 0 and 1.")
    if _close(share, 1 / expected, 1e-4):
        raise _Wrong("that is step time / rollout time, upside down.")
    if _close(share, float((rollout / step).mean()), 1e-4):
        raise _Wrong("that is the mean of the per-step shares; divide the sums instead, so a "
                     "long step weighs more.")
    raise _Wrong(f"{share:.4g} is not the rollout's share of the step time.")


# ====================================================================== lesson 1.2
@exercise("1.2.1", "Set waited to the longest a request can wait in total, under `policy`, "
          "before its 5th attempt.",
          nudge="a wait comes after each failed attempt, and `policy` can tell you the longest "
                "wait after attempt k (see the table above).",
          hint="the waits come after failed attempts 1, 2, 3 and 4: "
               "sum(policy.ceiling(k) for k in range(1, 5)).",
          answer="waited", needs=("policy",))
def _grade_waited(answer, *, policy) -> None:
    waited = _number(answer, "the total wait in seconds")
    waits = [policy.ceiling(k) for k in range(1, 6)]
    if _close(waited, sum(waits[:4])):
        return
    if _close(waited, waits[3]):
        raise _Wrong("that is only the last wait; add the waits before it.")
    if _close(waited, sum(waits)):
        raise _Wrong("that includes the wait after the 5th attempt too.")
    if _close(waited, sum(waits[:3])):
        raise _Wrong("that stops one wait short: attempt 5 comes after 4 failed attempts.")
    raise _Wrong(f"{waited:g} s is not the sum of the longest waits before attempt 5.")


@exercise("1.2.2", "Set n_bursts to the number of bursts the watchdog finds in the incident "
          "when a gap longer than GAP seconds (not the default 5 s) ends a burst.",
          nudge="replay the incident again with the gap as an argument; its burst table has one "
                "row per burst.",
          hint="len(replay(INCIDENT, burst_gap=GAP).bursts).",
          answer="n_bursts", needs=("replay", "INCIDENT"))
def _grade_bursts(answer, *, log, gap: float) -> None:
    from labkit.serving.replay import replay

    n = _whole(answer, "the number of bursts")
    expected = len(replay(log, burst_gap=gap).bursts)
    if n == expected:
        return
    default = len(replay(log).bursts)
    if n == default:
        raise _Wrong(f"{n} is the count at the default gap of 5 s; pass burst_gap={gap:g}.")
    if gap < 5 and n < default:
        raise _Wrong("a shorter gap can only split bursts, so there cannot be fewer than at 5 s.")
    if gap > 5 and n > default:
        raise _Wrong("a longer gap can only merge bursts, so there cannot be more than at 5 s.")
    raise _Wrong(f"{n} is not the number of rows of the burst table at burst_gap={gap:g}.")


@exercise("1.2.3", "Set lowered to the number of times the watchdog would have lowered the "
          "open-request limit during the incident under Policy(on_burst='lower').",
          nudge="a replay under that policy lists what the watchdog decided, one row per "
                "decision; you made one above.",
          hint="lowering.decisions has an `action` column; count its 'lower' rows: "
               "(lowering.decisions.action == 'lower').sum().",
          answer="lowered", needs=("lowering", "replay", "INCIDENT", "Policy"))
def _grade_lowered(answer, *, log) -> None:
    from labkit.serving.replay import replay
    from labkit.serving.watchdog import Policy

    n = _whole(answer, "the number of times")
    actions = replay(log, policy=Policy(on_burst="lower")).decisions["action"]
    expected = int((actions == "lower").sum())
    if n == expected:
        return
    if n == len(actions):
        raise _Wrong(f"{n} counts every decision; count only the 'lower' ones.")
    if n == int((replay(log).decisions["action"] == "lower").sum()):
        raise _Wrong("that is what the default policy (keep) does; replay with "
                     "policy=Policy(on_burst='lower').")
    raise _Wrong(f"{n} is not the number of 'lower' decisions.")


# ====================================================================== lesson 1.3
@exercise("1.3.1", "Set extra_args_16 to the MILES_EXTRA_ARGS text that runs 16 answers per "
          "prompt with exactly one optimizer step per rollout.",
          nudge="two flags, written as on a command line: --n-samples-per-prompt and "
                "--global-batch-size.",
          hint="the global batch is prompts x answers, 32 x 16: "
               "\"--n-samples-per-prompt 16 --global-batch-size 512\".",
          answer="extra_args_16")
def _grade_extra_args(answer, *, prompts: int = 32) -> None:
    from labkit.config import ConfigError, config_from_args

    if not isinstance(answer, str):
        raise _Wrong(f"the answer is {answer!r}; give the flags as one string, like the "
                     f"course's \"--n-samples-per-prompt 4 --global-batch-size 128\".")
    try:
        cfg = config_from_args(["--rollout-batch-size", str(prompts)],
                               env={"MILES_EXTRA_ARGS": answer})
    except ConfigError as e:
        raise _Wrong(f"the launcher refuses it: {e}.") from None
    if cfg.n_samples_per_prompt != 16:
        raise _Wrong(f"these flags run {cfg.n_samples_per_prompt} answers per prompt, not 16.")
    if cfg.steps_per_rollout != 1:
        raise _Wrong(f"--global-batch-size {cfg.global_batch_size} gives "
                     f"{cfg.steps_per_rollout} optimizer steps per rollout, not one.")


@exercise("1.3.2", "Set gain to the gain of run RUN from its log: the mean reward of steps "
          "16-23 minus the mean reward of steps 0-7.",
          nudge="take run RUN's rows of `finished`, index them by step, and average "
                "rollout/raw_reward over each window (both ends included).",
          hint="reward = finished[finished.run == RUN].set_index(STEP)[REWARD], then "
               "reward.loc[16:23].mean() - reward.loc[0:7].mean().",
          answer="gain", needs=("overview", "finished", "STEP", "REWARD"))
def _grade_gain(answer, *, runs, run: str) -> None:
    import numpy as np

    from labkit.analysis.gains import run_gains
    from labkit.analysis.runframe import REWARD
    from labkit.run.metrics import STEP

    gain = _number(answer, "the gain")
    rows = runs[runs["run"] == run]
    if rows.empty:
        raise _Wrong(f"no run named {run!r} in the runs handed to check().")
    expected = float(run_gains(rows, n_boot=1).gain.iat[0])
    if _close(gain, expected):
        return
    if _close(gain, -expected):
        raise _Wrong("the sign is flipped: late window minus early window.")
    reward = rows.set_index(STEP)[REWARD].astype(float)

    def mean(a, b):
        return float(reward.loc[(reward.index >= a) & (reward.index <= b)].mean())

    if _close(gain, mean(16, int(reward.index.max())) - mean(0, 7)) and reward.index.max() > 23:
        raise _Wrong("the late window stops at step 23; this run goes on past it.")
    if _close(gain, mean(16, 23) - mean(0, 8)):
        raise _Wrong("your early window includes step 8; it is steps 0 to 7.")
    if _close(gain, mean(15, 23) - mean(0, 7)):
        raise _Wrong("your late window includes step 15; it is steps 16 to 23.")
    if _close(gain, mean(16, 22) - mean(0, 6)) or _close(gain, mean(17, 23) - mean(1, 7)):
        raise _Wrong("each window has 8 steps, both ends included.")
    if np.isclose(gain, mean(0, 7)) or np.isclose(gain, mean(16, 23)):
        raise _Wrong("that is one window's mean; subtract the other.")
    raise _Wrong(f"{gain:+.4f} is not the late mean minus the early mean of {run}.")


@exercise("1.3.3", "Set common to the sorted list of step numbers, among steps 0-23, that are "
          "clean in both runs A and B.",
          nudge="the `clean` column says which steps no heat pause touched; keep the steps "
                "that are clean in both runs.",
          hint="A's clean steps are set(pair[(pair.run == A) & pair.clean][STEP]); intersect "
               "them with B's (&), keep the steps up to 23, and sort them.",
          answer="common", needs=("pair", "A", "B", "STEP"))
def _grade_common(answer, *, runs, a: str, b: str) -> None:
    from labkit.run.metrics import STEP

    try:
        steps = sorted(int(s) for s in answer)
    except (TypeError, ValueError):
        raise _Wrong("give the steps as a list of whole numbers, e.g. [0, 1, 4].") from None

    def clean(name: str, last: int | None = 23) -> set[int]:
        r = runs[runs["run"] == name]
        if last is not None:
            r = r[r[STEP] <= last]
        return set(r.loc[r["clean"].astype(bool), STEP].astype(int))

    def every(name: str) -> set[int]:
        r = runs[runs["run"] == name]
        return set(r.loc[r[STEP] <= 23, STEP].astype(int))

    for name in (a, b):  # else one run's clean steps are the answer too, and pass
        if clean(name) == every(name):
            raise GivenError(f"exercise 1.3.3 needs two runs that both have unclean steps among "
                             f"steps 0-23; {name} has none (or no step there)")

    expected = sorted(clean(a) & clean(b))
    if steps == expected:
        return
    if steps == sorted(clean(a, None) & clean(b, None)):
        raise _Wrong("only steps 0-23 are compared; drop the later ones.")
    if steps in (sorted(clean(a)), sorted(clean(b))):
        raise _Wrong("those are the clean steps of one run; keep the steps clean in both.")
    if steps == sorted(every(a) & every(b)):
        raise _Wrong("those are all the steps both runs have; a heat pause touched some of "
                     "them, so keep only the clean ones.")
    if steps == sorted(clean(a) | clean(b)):
        raise _Wrong("that is the union; keep only the steps clean in both runs.")
    raise _Wrong(f"{len(steps)} steps given; the common clean steps are {len(expected)}.")
