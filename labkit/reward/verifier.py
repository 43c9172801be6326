"""math-verify in a reusable worker process, killed when a check runs past its timeout.

Why a process: a sympy computation cannot be stopped from outside its thread. math-verify's
own timeouts use SIGALRM, which works only on the main thread, and the trainer may score in
a thread pool; a check run in a thread under a timeout goes on after the timeout. One answer,
`\\boxed{(a+b+c+d+e+f+g+h)^{99}}`, left a thread expanding the power for minutes, and after a
few such answers every answer that needed math-verify scored 0 for the rest of the run. Here
one worker process does the checks, one at a time; a check that runs past its timeout kills
the worker (the computation stops for real), scores 0.0, and a fresh worker starts at once
for the next check. Nothing is switched off for good.

Why one reused worker, not a process per check: starting Python and importing math-verify
takes ~0.5 s and a check 1-20 ms, and the reward runs on every answer of every rollout (most
never get here: labkit.reward's exact path decides plain numbers, and its pre-check keeps
answers that could make sympy hang away). Starting a worker is not counted in a check's
timeout. The worker reads one JSON line per check, `[answer, label]`, and writes `1` or `0`;
it leaves when its parent closes the pipe or dies, and ignores the terminal's Ctrl-C (the
trainer decides when to stop).
"""

from __future__ import annotations

import atexit
import json
import os
import selectors
import signal
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path

START_TIMEOUT_S = 120.0  # importing math-verify on a loaded machine (~0.5 s idle)
RETRY_AFTER_S = 60.0  # after a worker that did not start: score 0.0 this long, then try again
# -c with the working folder taken off sys.path first: a folder named like a package there
# must not shadow the one this process uses (labkit is found through PYTHONPATH, below)
_BOOT = "import sys; del sys.path[0]; from labkit.reward.verifier import serve; serve()"


class _Worker:
    """One worker process, the pipes to it, and what it has written but not yet been read."""

    def __init__(self) -> None:
        root = str(Path(__file__).resolve().parents[1])  # the folder that holds this labkit
        path = os.environ.get("PYTHONPATH")
        env = {**os.environ, "PYTHONPATH": root + (os.pathsep + path if path else "")}
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _BOOT], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL, env=env, start_new_session=True)
        self.owner, self.ready, self._buffer = os.getpid(), False, b""
        self._selector = selectors.DefaultSelector()  # not select(): fds past 1024 are common
        self._selector.register(self.proc.stdout, selectors.EVENT_READ)

    def ask(self, answer: str, label: str) -> None:
        self.proc.stdin.write((json.dumps([answer, label]) + "\n").encode())
        self.proc.stdin.flush()

    def read_line(self, timeout_s: float) -> str | None:
        """The worker's next line, or None when none came within `timeout_s`; raises
        EOFError when the worker has exited."""
        deadline = time.monotonic() + timeout_s
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not self._selector.select(left):
                return None
            chunk = os.read(self.proc.stdout.fileno(), 4096)
            if not chunk:
                raise EOFError("the math-verify worker exited")
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line.decode("utf-8", "replace").strip()

    def kill(self) -> None:
        """Stop the worker for real (SIGKILL) and reap it."""
        self._selector.close()
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        for pipe in (self.proc.stdin, self.proc.stdout):
            try:
                pipe.close()
            except OSError:
                pass


_lock = threading.Lock()
_worker: _Worker | None = None
_missing: str | None = None  # math-verify cannot be imported: set once, for good
_retry_at = 0.0
_warned: set[str] = set()
restarts = 0  # workers killed after a check ran past its timeout (or died in one)


def _warn_once(key: str, message: str) -> None:
    if key not in _warned:
        _warned.add(key)
        warnings.warn(message, RuntimeWarning, stacklevel=4)


def _ready_worker() -> _Worker | None:
    """The worker, started and past its import (waits up to START_TIMEOUT_S for that); None
    when math-verify is missing, or a start failed less than RETRY_AFTER_S ago."""
    global _worker, _missing, _retry_at
    if _missing or time.monotonic() < _retry_at:
        return None
    if _worker is None or _worker.owner != os.getpid():  # a forked child starts its own
        _worker = _Worker()
    if not _worker.ready:
        try:
            line = _worker.read_line(START_TIMEOUT_S)
        except EOFError:
            line = "exited while starting"
        if line == "ready":
            _worker.ready = True
            return _worker
        _worker.kill()
        _worker = None
        if line and line.startswith("missing"):
            _missing = line
            _warn_once("missing", f"math-verify failed to start ({line[len('missing'):].strip()}); "
                                  f"answers that are not plain numbers score 0.0")
        else:
            _retry_at = time.monotonic() + RETRY_AFTER_S
            why = line or f"not ready after {START_TIMEOUT_S:.0f} s"
            _warn_once("start", f"the math-verify worker did not start ({why}); answers that "
                                f"are not plain numbers score 0.0 until it does (tried again "
                                f"every {RETRY_AFTER_S:.0f} s)")
        return None
    return _worker


def _replace_worker() -> None:
    """Kill the worker and start the next one now, so its import overlaps other work."""
    global _worker, restarts
    if _worker is not None:
        _worker.kill()
    restarts += 1
    _worker = _Worker()


def verify(answer: str, label: str, timeout_s: float) -> bool:
    """math-verify's judgement that `answer` equals `label`, from any thread; False when it
    says no, fails, or runs past `timeout_s` (then its worker is killed and replaced)."""
    with _lock:
        worker = _ready_worker()
        if worker is None:
            return False
        try:
            worker.ask(answer, label)
            line = worker.read_line(timeout_s)
        except (OSError, EOFError, ValueError):  # the worker died during the check
            line = None
        if line is None:
            _replace_worker()
            return False
        return line == "1"


def warm_up() -> bool:
    """Start the worker and wait for its import, so no check's time counts it; True when
    math-verify is there to use."""
    with _lock:
        return _ready_worker() is not None


def worker_pid() -> int | None:
    """The process id of the current worker (None before the first check)."""
    worker = _worker
    return None if worker is None else worker.proc.pid


def close() -> None:
    """Stop the worker (at exit; the next check starts a new one)."""
    global _worker
    with _lock:
        if _worker is not None and _worker.owner == os.getpid():
            _worker.kill()
        _worker = None


def _after_fork_in_child() -> None:
    """A forked child must not use the parent's lock or pipes: it starts its own worker."""
    global _lock, _worker
    _lock, _worker = threading.Lock(), None


atexit.register(close)
os.register_at_fork(after_in_child=_after_fork_in_child)


# ------------------------------------------------------------------ the worker process
def _say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def _exit_with_parent(parent: int) -> None:
    """Leave when the parent dies, also in the middle of a long check."""
    while os.getppid() == parent:
        time.sleep(1.0)
    os._exit(0)


def _check(answer: str, label: str) -> bool:
    from math_verify import parse
    from math_verify import verify as mv_verify

    gold = parse(f"${label}$", parsing_timeout=None)
    pred = parse(f"${answer}$", parsing_timeout=None)
    return bool(gold and pred and mv_verify(gold, pred, timeout_seconds=None))


def serve() -> None:
    """The worker's loop: import math-verify, say `ready`, then answer one check per line."""
    import logging

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    threading.Thread(target=_exit_with_parent, args=(os.getppid(),), daemon=True).start()
    logging.disable(logging.WARNING)  # "Timeout is disabled": ours is on, in the parent
    try:
        _check("\\frac{1}{2}", "0.5")  # the import and sympy's first-call set-up
    except ImportError as e:  # the parent says it once and scores 0.0 from then on
        _say(f"missing {type(e).__name__}: {e}".replace("\n", " "))
        return
    except Exception as e:  # the parent retries later
        _say(f"failed {type(e).__name__}: {e}".replace("\n", " "))
        return
    _say("ready")
    for line in sys.stdin:
        try:
            answer, label = json.loads(line)
            _say("1" if _check(str(answer), str(label)) else "0")
        except Exception:  # an answer math-verify cannot judge is wrong
            _say("0")
