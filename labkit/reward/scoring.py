"""Scoring: a step's answers through a reward function, guarded against one that misbehaves.

A reward, above all a user's (`--custom-rm-path`), can fail in four ways, and each is met
here, where the function is called:

* It raises on some answers (an `Exception`): those answers score 0.0, with one warning per
  function. One odd answer must not stop a run of hours.
* It raises on every answer of a step, or returns NaN for each: the run stops (RewardError,
  naming the function and the first error). Trained on, the step's rewards would all be 0.0,
  every group all-equal: the run would go on for hours and learn nothing, which a warning
  among the step lines does not make plain.
* It ends with something that is not an `Exception` (`SystemExit` from `sys.exit()`,
  `GeneratorExit`, a `BaseException` of its own): the run stops at once, in one line naming
  the function, the file and line, and the error (its traceback goes to the run's
  status.json). Such an exception asks to end, not to score an answer. Only
  `KeyboardInterrupt` (Ctrl-C, a stop) passes through untouched: labkit.run.stopping handles it.
* It returns inf, or a number beyond ±MAX_REWARD: the run stops, naming the function and the
  value. Clipping it instead would hide a bug (numpy's division by zero, its log of 0) and would
  still wreck the step: the clipped answer dominates every group statistic it is in, and
  training learns toward the bug. No score a person means comes near ±1e15, and values
  past ~1e19 overflow the float32 group statistics (1e300 logged `rollout/raw_reward: inf`).
"""

from __future__ import annotations

import concurrent.futures
import math
import traceback
import warnings

from labkit.errors import LabkitError, one_line
from labkit.reward.custom import RewardFn, reward_name

MAX_REWARD = 1e15  # a reward's largest magnitude: a group's variance stays far inside float32

_warned: set[tuple[str, str]] = set()  # (function, kind) warned about


class RewardError(LabkitError, RuntimeError):
    """A reward function that training cannot use; the message names it and what it did."""

    exit_code = 1


def score(responses: list[str], labels: list[str], fn: RewardFn, *, max_workers: int = 1) -> list[float]:
    """Rewards of `responses[i]` against `labels[i]`, in order; `max_workers` > 1 uses a
    thread pool (helps rewards that wait on I/O; the math reward is CPU-bound and fast).
    Raises RewardError when `fn` fails on every one of two or more answers (the trainer
    scores a step's at once; one answer alone, as miles scores them, says too little), ends
    with a BaseException, or returns a value beyond ±MAX_REWARD."""
    if len(responses) != len(labels):
        raise ValueError(f"score: {len(responses)} responses but {len(labels)} labels; "
                         f"repeat each label n-samples-per-prompt times")
    if max_workers <= 1 or len(responses) < 2:
        results = [_score_one(fn, r, y) for r, y in zip(responses, labels)]
    else:
        with concurrent.futures.ThreadPoolExecutor(max_workers) as pool:
            results = list(pool.map(lambda ry: _score_one(fn, *ry), zip(responses, labels)))
    failures = [failed for _, failed in results if failed is not None]
    name = reward_name(fn)
    if len(results) >= 2 and len(failures) == len(results):
        raise RewardError(f"the reward {name} failed on every answer of the step ({len(results)} "
                          f"of {len(results)}; the first {failures[0][1]}): the run stops rather "
                          f"than train on rewards of 0.0; fix the reward")
    for kind, failed in failures:  # said once per function and kind, not per answer
        if (name, kind) not in _warned:
            _warned.add((name, kind))
            warnings.warn(f"reward {name} {failed}; scoring such answers 0.0 (warned once)",
                          RuntimeWarning, stacklevel=2)
    return [value for value, _ in results]


def _score_one(fn: RewardFn, response: str, label: str) -> tuple[float, tuple[str, str] | None]:
    """(reward, None), or (0.0, (kind, how it failed)) for an answer `fn` raised on or gave
    no number for; raises RewardError for what ends the run (see the module)."""
    try:
        raw = fn(response, label)
    except KeyboardInterrupt:  # a stop: labkit.run.stopping's to handle
        raise
    except Exception as e:  # one bad answer must not stop the run
        return 0.0, ("raise", f"raised {type(e).__name__}: {one_line(e)}{_where(e)}")
    except BaseException as e:  # sys.exit(), GeneratorExit, ...: it asks to end
        raise RewardError(_ended(reward_name(fn), e)) from e
    try:
        value = float(raw)
    except OverflowError:  # an int past float's range
        value = math.inf
    except (TypeError, ValueError):
        return 0.0, ("type", f"returned {_short(raw)}, not a number")
    if math.isnan(value):
        return 0.0, ("nan", "returned nan")
    if not abs(value) <= MAX_REWARD:
        raise RewardError(f"the reward {reward_name(fn)} returned {_short(raw)} for an answer: a "
                          f"reward is a number within ±{MAX_REWARD:g} (past that the group "
                          f"statistics overflow), so the run stops; fix the reward, or clip it "
                          f"yourself")
    return value, None


def _ended(name: str, e: BaseException) -> str:
    """One line for a reward that ended with a BaseException: the error, where, the function."""
    if isinstance(e, SystemExit):
        what = f"SystemExit: sys.exit({e.code!r}) was called"
    else:
        what = f"{type(e).__name__}{f' ({one_line(e)})' if str(e).strip() else ''} was raised"
    return (f"{what}{_where(e)}, by the reward {name}; a reward returns a number for each "
            f"answer, so the run stops")


def _where(e: BaseException) -> str:
    """' in file, line n': where `e` was raised (the innermost frame), or ''."""
    frames = traceback.extract_tb(e.__traceback__)[1:]  # the first is _score_one's own
    return f" in {frames[-1].filename}, line {frames[-1].lineno}" if frames else ""


def _short(value: object) -> str:
    """A returned value for a message: its repr, cut to 60 characters."""
    try:
        text = repr(value)
    except Exception:  # a repr of the user's that fails, or an int too long to print
        text = f"a {type(value).__name__}"
    return text if len(text) <= 60 else text[:57] + "..."
