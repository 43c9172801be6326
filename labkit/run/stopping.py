"""Stop a run between steps (time limit, SIGTERM, SIGHUP, SIGINT), so its log is always complete.

Why: a run queue kills a container at its time limit, a closed ssh session sends SIGHUP, and
a notebook's interrupt button sends SIGINT. Any one landing mid-step loses the step, and in
the course's 16-answer run the queue's limit hit while the container shut down. So the loop
asks `should_stop()` after each step:

- the first SIGTERM, SIGHUP or SIGINT only sets a flag; the step in progress finishes and is logged;
- a second one raises `SecondSignal` (a KeyboardInterrupt) at once, also in the middle of
  the final checkpoint; once the run is writing its status (`finishing()`), further signals
  are only noted, so the status always lands;
- with a time limit, the run does not start a step that would end past it.

A signal the process inherited as ignored stays ignored, but SIGTERM: `nohup` ignores SIGHUP
so that a closed session does not end the run, and a shell starts `cmd &` in a script with
SIGINT ignored so that a Ctrl-C meant for the foreground does not reach it. A process that
leads its own session (a sweep's run, started with `start_new_session`) has no terminal to
send it a Ctrl-C: a SIGINT it gets was sent on purpose (by the sweep), so it is caught there.

The estimate of the next step is the *longest* of the last `window` steps (default 5), not the
mean: step times jump (heat pauses, eval steps, long answers), overshooting the limit costs the
step and maybe the checkpoint, while stopping one step early costs one step. `reserve_s` keeps
time for the shutdown (the final checkpoint). Reasons read "<kind>: <detail>", kind being
signal, time_limit, or what `request_stop` was given (status.json takes the kind).

`exit_code(status)` is what `labkit launch` exits with, so a queue can tell the stops apart:
0 completed, 124 time limit (as timeout(1)), 128 + the signal's number for a signal (143
SIGTERM, 129 SIGHUP, 130 SIGINT), 1 an error.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections import deque
from collections.abc import Callable

SIGNALS = tuple(s for s in (getattr(signal, "SIGTERM", None), getattr(signal, "SIGHUP", None),
                            signal.SIGINT) if s is not None)
TIME_LIMIT_EXIT = 124  # what timeout(1) exits with
MAX_RESERVE_SHARE = 0.25  # the shutdown reserve never takes more than this share of the limit


class SecondSignal(KeyboardInterrupt):
    """A second signal: interrupt the step (or the final checkpoint) in progress now."""

    def __init__(self, signum: int):
        self.signum = signum
        name = signal.Signals(signum).name
        super().__init__(f"second signal ({name}): interrupting the step in progress")


def exit_code(status: dict | None) -> int:
    """The exit code for a run's status: 0 completed, 124 time limit, 128 + signal, else 1."""
    status = status or {}
    reason = status.get("reason")
    if reason == "completed":
        return 0
    if reason == "time_limit":
        return TIME_LIMIT_EXIT
    if reason == "signal" and status.get("signal"):
        try:
            return 128 + int(signal.Signals[status["signal"]])
        except KeyError:
            pass
    return 1


def print_notice(message: str) -> None:
    """The default notice: one line on stderr; safe inside a signal handler."""
    line = f"labkit: {message}\n"
    try:
        sys.stderr.write(line)
        sys.stderr.flush()
    except (RuntimeError, OSError, ValueError):  # re-entrant write from a handler, closed stream
        try:
            os.write(2, line.encode())
        except OSError:
            pass


def left_ignored() -> set[int]:
    """The stop signals this process keeps ignoring: SIGHUP and SIGINT where it was started
    with them ignored (nohup; `cmd &` in a script), except SIGINT in a process that leads its
    own session (no terminal's Ctrl-C can reach it: a SIGINT there was sent on purpose)."""
    kept = set()
    for sig in SIGNALS:
        if sig == getattr(signal, "SIGTERM", None) or signal.getsignal(sig) is not signal.SIG_IGN:
            continue
        if sig == signal.SIGINT and _leads_its_session():
            continue
        kept.add(sig)
    return kept


def _leads_its_session() -> bool:
    try:
        return os.getsid(0) == os.getpid()
    except (AttributeError, OSError):  # no sessions here (Windows)
        return False


class StopController:
    """Decides when the step loop stops: signals, programmatic requests and a time limit.

    `time_limit_s`: wall-clock budget in seconds from construction (None: no limit), so create
    it first thing. `window`: steps the estimate looks back over. `reserve_s`: seconds kept for
    the shutdown, at most a quarter of the limit. `clock`: monotonic seconds (injectable for tests).
    `notify(message)`: notices (signal received, handlers not installed); default stderr.
    """

    def __init__(
        self,
        time_limit_s: float | None,
        *,
        window: int = 5,
        reserve_s: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
        notify: Callable[[str], None] | None = None,
    ):
        if time_limit_s is not None and time_limit_s <= 0:
            raise ValueError(f"time limit must be > 0 seconds, got {time_limit_s} (--time-limit)")
        if window < 1:
            raise ValueError(f"window must be >= 1 step, got {window}")
        self.time_limit_s, self.reserve_s = time_limit_s, float(reserve_s)
        if time_limit_s is not None:  # a 20 s limit with the whole 30 s reserve ran no step
            self.reserve_s = min(self.reserve_s, time_limit_s * MAX_RESERVE_SHARE)
        self._clock = clock
        self._t0 = clock()
        self._notify = notify or print_notice
        self.step_seconds: deque[float] = deque(maxlen=window)
        self.reason: str | None = None
        self._requested = False
        self.signal_count = 0
        self.interrupts = 0  # second signals raised (SecondSignal), so a failure can be told apart
        self.interrupt_signum: int | None = None  # the last of them
        self.signal_name: str | None = None  # the first signal's name (SIGTERM, ...)
        self._finishing = False
        self.installed = False
        self._previous: dict[int, object] = {}

    # --- requests -------------------------------------------------------------------
    @property
    def stop_requested(self) -> bool:
        """True once a signal or request_stop() asked the run to stop."""
        return self._requested

    def request_stop(self, detail: str, kind: str = "requested") -> None:
        """Ask the loop to stop after the step in progress; the first reason is kept."""
        self._requested = True
        if self.reason is None:
            self.reason = f"{kind}: {detail}"

    # --- time limit -----------------------------------------------------------------
    def record_step(self, seconds: float) -> None:
        """Record the wall time of a finished step (it feeds the next-step estimate)."""
        self.step_seconds.append(float(seconds))

    def elapsed(self) -> float:
        """Seconds since the controller was made."""
        return self._clock() - self._t0

    def next_step_estimate(self) -> float | None:
        """The longest of the recent steps (None before the first step)."""
        return max(self.step_seconds) if self.step_seconds else None

    def should_stop(self) -> str | None:
        """The reason to stop now, or None to run another step. Once given, it stays."""
        if self.reason is None and self.time_limit_s is not None:
            self.reason = self._time_limit_reason()
        return self.reason

    def _time_limit_reason(self) -> str | None:
        elapsed, limit = self.elapsed(), self.time_limit_s
        guess = self.next_step_estimate()
        reserve = f" + {self.reserve_s:.0f} s reserve" if self.reserve_s else ""
        if guess is None:  # no estimate yet: start unless the time is already gone
            if elapsed + self.reserve_s >= limit:
                return f"time_limit: {elapsed:.0f} s elapsed{reserve} >= limit {limit:.0f} s"
            return None
        end = elapsed + guess
        if end + self.reserve_s > limit:
            return f"time_limit: next step would end at {end:.0f} s{reserve} > limit {limit:.0f} s"
        return None

    # --- signals --------------------------------------------------------------------
    def install(self) -> StopController:
        """Catch SIGTERM, SIGHUP and SIGINT (main thread only; elsewhere install nothing, say so),
        leaving ignored the ones the process was started with ignored (`left_ignored`)."""
        if self.installed:
            return self
        if threading.current_thread() is not threading.main_thread():
            self._notify("not in the main thread: SIGTERM/SIGHUP/SIGINT are not caught; "
                         "the run stops on its time limit or request_stop()")
            return self
        kept = left_ignored()
        for sig in SIGNALS:
            if sig in kept:
                continue
            self._previous[sig] = signal.getsignal(sig)
            signal.signal(sig, self._handle)
        if signal.SIGINT in kept:
            self._notify("SIGINT is ignored here (started in the background), so Ctrl-C does not "
                         f"stop this run: SIGTERM does (kill {os.getpid()})")
        self.installed = True
        return self

    def uninstall(self) -> None:
        """Put back the handlers that were there before install()."""
        if not self.installed:
            return
        for sig, prev in self._previous.items():
            signal.signal(sig, prev if prev is not None else signal.SIG_DFL)
        self._previous.clear()
        self.installed = False

    def finishing(self) -> None:
        """The run is writing its status: from now on a signal is noted, never raised."""
        self._finishing = True

    def _handle(self, signum: int, frame) -> None:
        name = signal.Signals(signum).name
        self.signal_count += 1
        if self.signal_count == 1:
            self.signal_name = name
            self.request_stop(name, kind="signal")
            self._notify(f"{name}: stopping after the step in progress "
                         f"(send it again to interrupt now)")
            return
        if self._finishing:
            self._notify(f"{name}: already stopping; writing the run's status")
            return
        if self.signal_name is None:
            self.signal_name = name
        self.interrupts, self.interrupt_signum = self.interrupts + 1, signum
        raise SecondSignal(signum)

    def __enter__(self) -> StopController:
        return self.install()

    def __exit__(self, *exc) -> None:
        self.uninstall()
