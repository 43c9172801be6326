"""A sweep's runs evaluate their starting model once between them.

Every run of `labkit sweep` starts from the same model, and before its first step each one
evaluates it on the same held-out problems, greedily: the same answers, computed once per
run. In lesson 1.3's study (nine runs on one H200) that was nine evaluations of the 1,319
GSM8K test problems where one does. So the sweep gives its runs a folder (the variable
FOLDER_ENV, `<output_dir>/.start`), and the first run that needs a starting result computes
it while holding a lock and writes it there; the others wait for the lock, then read the
result instead of computing it. A run seated later, when a place frees, finds it written, and so does a later sweep
into the same output folder from the same model.

The result is keyed by everything that makes it: the model's folder, the engine, the
prompts' very token ids, the answer length, the stop tokens, the dtype and the policy's
kernels (`key_of`). The lock is an flock, which the kernel drops when its holder dies: the
next run then computes the result itself. A stop while waiting ends the wait (Cancelled).
Every run's before and after are then one evaluation of the start against its own after: a
paired comparison across the sweep's runs has one "before" (greedy vLLM answers of two
evaluations of one model differed on a problem or two in 1,319: 0.254 against 0.255).

Only one run need wait for it. The sweep names one run the evaluator (EVALUATOR_ENV: of the
runs it starts first, the one with the fewest answers a step, whose steps are the shortest)
and the others do not wait for its result: a run that finds no result written yet trains on,
and reads it before its next evaluation (`written`, `read_when_free`), when the evaluator has
long finished. In lesson 1.3's sweep that keeps the 16-answer run, which sets the sweep's
pace, from waiting 20 s for an evaluation by another run. A run that is not the evaluator
never computes the start itself once it has trained: were the evaluator to die first, the
run says that its start has no result.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import time
from collections.abc import Callable
from pathlib import Path

from labkit.engines.base import Cancelled

FOLDER_ENV = "LABKIT_START_RESULTS"
EVALUATOR_ENV = "LABKIT_START_EVALUATOR"  # the run that computes the sweep's starting results
POLL_S = 0.2  # how often a waiting run looks whether the lock is free (and for a stop)


def folder() -> Path | None:
    """The folder a sweep gave this run for its runs' shared starting results, or None."""
    found = os.environ.get(FOLDER_ENV)
    return Path(found) if found else None


def evaluator() -> str | None:
    """The run the sweep named to compute its starting results, or None (every run may)."""
    return os.environ.get(EVALUATOR_ENV) or None


def key_of(*parts) -> str:
    """A file name for the result that `parts` (JSON-able: strings, numbers, lists) make."""
    text = json.dumps(parts, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def shared(key: str, compute: Callable[[], dict], *, who: str, stopping=lambda: False,
           where: Path | None = None) -> tuple[dict, str | None]:
    """The result under `key` in the sweep's folder (`where`, else folder()): read when a run
    wrote it, else computed here (`compute()`) under the lock and written for the others.
    Returns (result, the run that computed it: None when this one did). Without a folder,
    computes. Raises Cancelled when `stopping()` says so while waiting for the lock."""
    where = where if where is not None else folder()
    if where is None:
        return compute(), None
    where.mkdir(parents=True, exist_ok=True)
    with _locked(where, key, stopping) as found:
        if found is not None:
            return found
        result = compute()
        result_path = where / f"{key}.json"
        tmp = result_path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"by": who, "written": time.time(), "result": result}))
        os.replace(tmp, result_path)
        return result, None  # leaving the block drops the lock


def written(key: str, where: Path | None = None) -> bool:
    """Whether the result under `key` is written in the sweep's folder (`where`, else folder())."""
    where = where if where is not None else folder()
    return where is not None and _read(where / f"{key}.json") is not None


def read_when_free(key: str, *, stopping=lambda: False,
                   where: Path | None = None) -> tuple[dict | None, str | None]:
    """The result under `key`, read once no run holds its lock (one computing it has written
    it then): (result, the run that computed it), or (None, None) when none was written.
    Raises Cancelled when `stopping()` says so while waiting."""
    where = where if where is not None else folder()
    if where is None or not where.is_dir():
        return None, None
    with _locked(where, key, stopping) as found:
        return found or (None, None)


@contextlib.contextmanager
def _locked(where: Path, key: str, stopping):
    """Hold the lock of `key`'s result (waiting while another run holds it); yield the result
    written under it as (result, the run that computed it), or None."""
    with open(where / f"{key}.lock", "a+") as lock:
        _wait_for(lock, stopping)
        found = _read(where / f"{key}.json")  # under the lock: written whole, or not at all
        yield None if found is None else (found["result"], str(found.get("by", "another run")))


def _wait_for(lock, stopping) -> None:
    try:
        import fcntl
    except ImportError:  # no flock (Windows): every run computes its own
        return
    while True:
        try:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except OSError:
            if stopping():
                raise Cancelled("stopped while another run evaluated the starting model") from None
            time.sleep(POLL_S)


def _read(path: Path) -> dict | None:
    try:
        found = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return found if isinstance(found, dict) and isinstance(found.get("result"), dict) else None
