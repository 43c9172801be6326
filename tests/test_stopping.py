"""StopController: time-limit decisions on a fake clock, real signals, a stopped subprocess."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
from waiting import DEADLINE_S, Lines

from labkit.run.stopping import StopController

REPO = Path(__file__).resolve().parents[1]


class FakeClock:
    def __init__(self, t: float = 0.0):
        self.t = t

    def __call__(self) -> float:
        return self.t


def run_steps(stop: StopController, clock: FakeClock, seconds: list[float]) -> list[str | None]:
    """Run fake steps of the given lengths; return should_stop() after each."""
    out = []
    for s in seconds:
        clock.t += s
        stop.record_step(s)
        out.append(stop.should_stop())
    return out


# ------------------------------------------------------------------ time limit
def test_no_limit_never_stops():
    clock = FakeClock()
    stop = StopController(None, clock=clock)
    assert run_steps(stop, clock, [1000.0] * 10) == [None] * 10


def test_first_step_may_start_without_an_estimate():
    clock = FakeClock()
    stop = StopController(3600, clock=clock)
    clock.t = 3000.0                              # a slow model load, no step yet
    assert stop.next_step_estimate() is None
    assert stop.should_stop() is None


def test_stops_before_a_step_that_would_end_past_the_limit():
    clock = FakeClock()
    stop = StopController(3600, clock=clock)
    # 3100 s after 31 steps of 100 s; then one slow step of 512 s: 3612 s
    assert run_steps(stop, clock, [100.0] * 31) == [None] * 31
    assert run_steps(stop, clock, [512.0]) == [
        "time_limit: next step would end at 4124 s > limit 3600 s"
    ]


def test_estimate_is_the_longest_recent_step():
    clock = FakeClock()
    stop = StopController(3600, clock=clock, window=3)
    # elapsed 3000 with recent steps 100, 600, 100: the estimate is 600 -> 3600, not past it
    clock.t = 2200.0
    assert run_steps(stop, clock, [100.0, 600.0, 100.0]) == [None, None, None]
    assert stop.elapsed() == 3000.0 and stop.next_step_estimate() == 600.0
    clock.t += 1.0                                # 3001 + 600 > 3600
    assert stop.should_stop() == "time_limit: next step would end at 3601 s > limit 3600 s"


def test_old_steps_leave_the_window():
    clock = FakeClock()
    stop = StopController(10_000, clock=clock, window=2)
    run_steps(stop, clock, [900.0, 10.0, 20.0])
    assert stop.next_step_estimate() == 20.0


def test_reserve_keeps_time_for_the_shutdown_and_the_decision_stays():
    clock, plain = FakeClock(), FakeClock()
    stop = StopController(3600, clock=clock, reserve_s=60)
    no_reserve = StopController(3600, clock=plain)
    assert run_steps(stop, clock, [100.0] * 34) == [None] * 34      # 3400 + 100 + 60 <= 3600
    assert run_steps(stop, clock, [100.0]) == [
        "time_limit: next step would end at 3600 s + 60 s reserve > limit 3600 s"
    ]
    assert run_steps(no_reserve, plain, [100.0] * 35)[-1] is None   # 3600 is not past 3600
    reason = stop.should_stop()
    stop.record_step(1.0)
    assert stop.should_stop() == reason and not stop.stop_requested


def test_a_limit_shorter_than_the_reserve_still_runs_steps():
    clock = FakeClock()
    stop = StopController(20, clock=clock, reserve_s=30)  # --time-limit 20s ran zero steps
    clock.t = 2.0
    assert stop.should_stop() is None and stop.reserve_s == 5.0
    assert run_steps(stop, clock, [4.0, 6.0]) == [None, "time_limit: next step would end at 18 s "
                                                        "+ 5 s reserve > limit 20 s"]


def test_exit_codes_tell_the_stops_apart():
    from labkit.run.stopping import exit_code

    assert exit_code({"reason": "completed"}) == 0
    assert exit_code({"reason": "time_limit"}) == 124
    assert exit_code({"reason": "signal", "signal": "SIGTERM"}) == 143
    assert exit_code({"reason": "signal", "signal": "SIGHUP"}) == 129
    assert exit_code({"reason": "signal", "signal": "SIGINT"}) == 130
    assert exit_code({"reason": "error"}) == 1 and exit_code(None) == 1


def test_time_already_spent_before_the_first_step():
    clock = FakeClock()
    stop = StopController(3600, clock=clock)
    clock.t = 3700.0
    assert stop.should_stop() == "time_limit: 3700 s elapsed >= limit 3600 s"


def test_request_stop_keeps_the_first_reason():
    stop = StopController(None)
    assert stop.should_stop() is None and not stop.stop_requested
    stop.request_stop("503 bursts longer than 60 s", kind="watchdog")
    stop.request_stop("enough for today")
    assert stop.stop_requested
    assert stop.should_stop() == "watchdog: 503 bursts longer than 60 s"


def test_refuses_a_nonpositive_limit():
    with pytest.raises(ValueError, match="--time-limit"):
        StopController(0)


# ------------------------------------------------------------------ signals
def test_real_sigterm_sets_the_flag_and_a_second_interrupts():
    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    notes = []
    with StopController(None, notify=notes.append) as stop:
        assert stop.installed
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop.stop_requested and stop.should_stop() == "signal: SIGTERM"
        assert len(notes) == 1 and "SIGTERM" in notes[0] and "again" in notes[0]
        with pytest.raises(KeyboardInterrupt, match="second signal"):
            os.kill(os.getpid(), signal.SIGTERM)
        assert stop.should_stop() == "signal: SIGTERM"
    assert not stop.installed
    assert {s: signal.getsignal(s) for s in before} == before


def test_sigint_then_sigint_like_the_jupyter_interrupt_button():
    before = signal.getsignal(signal.SIGINT)
    stop = StopController(None, notify=lambda m: None).install()
    try:
        signal.raise_signal(signal.SIGINT)
        assert stop.should_stop() == "signal: SIGINT"
        with pytest.raises(KeyboardInterrupt):
            signal.raise_signal(signal.SIGINT)
    finally:
        stop.uninstall()
    assert signal.getsignal(signal.SIGINT) is before
    stop.uninstall()                              # twice is harmless


def test_handlers_restored_even_when_the_loop_raises():
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(RuntimeError):
        with StopController(None):
            assert signal.getsignal(signal.SIGTERM) is not before
            raise RuntimeError("step failed")
    assert signal.getsignal(signal.SIGTERM) is before


def test_install_off_the_main_thread_installs_nothing_and_says_so():
    before = signal.getsignal(signal.SIGTERM)
    notes, result = [], {}

    def worker():
        stop = StopController(None, notify=notes.append).install()
        result["installed"] = stop.installed
        stop.uninstall()

    t = threading.Thread(target=worker)
    t.start()
    t.join(timeout=DEADLINE_S)
    assert result == {"installed": False}
    assert len(notes) == 1 and "not in the main thread" in notes[0]
    assert signal.getsignal(signal.SIGTERM) is before


# ------------------------------------------------------------------ a real process
# Each step holds until the test lets it go (a file `go <step>` appears), so a signal the test
# sends "during step 1" lands there however slow the machine is.
LOOP = """
import os, sys, time
from labkit.run.stopping import StopController

folder = sys.argv[1]
with StopController(None) as stop:
    try:
        for step in range(1000):
            print(f"start {step}", flush=True)
            end = time.monotonic() + 600  # a test that never lets go: the loop gives up
            while not os.path.exists(os.path.join(folder, f"go {step}")):  # the step's work
                if time.monotonic() > end:
                    sys.exit(f"step {step} was never let go")
                time.sleep(0.01)
            print(f"end {step} requested={stop.stop_requested}", flush=True)
            reason = stop.should_stop()
            if reason:
                print(f"stopped: {reason}", flush=True)
                break
    except KeyboardInterrupt as e:
        print(f"interrupted in step {step}: {e}", flush=True)
        sys.exit(130)
"""


def start_loop(tmp_path: Path, **popen) -> subprocess.Popen:
    """The loop in a child; its stdout and stderr lines are read as they come (`out`, `err`)."""
    script = tmp_path / "loop.py"
    script.write_text(textwrap.dedent(LOOP))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen(
        [sys.executable, str(script), str(tmp_path)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, **popen,
    )
    proc.out, proc.err = Lines(proc), Lines(proc, proc.stderr)
    return proc


def let_go(tmp_path: Path, step: int) -> None:
    (tmp_path / f"go {step}").touch()


def read_until(proc: subprocess.Popen, prefix: str) -> list[str]:
    """The loop's lines up to the first that starts with `prefix` (with a deadline)."""
    return [line.strip() for line in proc.out.until(prefix)]


def ended(proc: subprocess.Popen) -> tuple[str, str]:
    """(stdout, stderr) the loop wrote until it exited (with a deadline)."""
    return proc.out.rest(), proc.err.rest()


def test_sigterm_mid_step_finishes_the_step_then_exits(tmp_path):
    proc = start_loop(tmp_path)
    try:
        lines = read_until(proc, "start 0")
        let_go(tmp_path, 0)
        lines += read_until(proc, "start 1")
        proc.send_signal(signal.SIGTERM)          # while step 1 works
        let_go(tmp_path, 1)
        out, err = ended(proc)
    finally:
        proc.kill()
    lines += out.strip().splitlines()
    assert proc.returncode == 0, err
    assert lines == ["start 0", "end 0 requested=False", "start 1",
                     "end 1 requested=True", "stopped: signal: SIGTERM"]
    assert "SIGTERM: stopping after the step in progress" in err


def test_second_sigterm_interrupts_the_step_at_once(tmp_path):
    proc = start_loop(tmp_path)                   # step 0 is never let go: only a signal ends it
    try:
        read_until(proc, "start 0")
        proc.send_signal(signal.SIGTERM)
        assert "stopping after the step in progress" in proc.err.until("labkit:")[-1]
        proc.send_signal(signal.SIGTERM)
        out, err = ended(proc)
    finally:
        proc.kill()
    assert proc.returncode == 130, err
    assert out.strip() == "interrupted in step 0: second signal (SIGTERM): interrupting the step in progress"


def test_sighup_from_a_closed_session_stops_like_sigterm(tmp_path):
    # started as from a terminal's session, SIGHUP at its default: under `nohup` (this test's
    # own runner may be) the loop would inherit it ignored and rightly keep it so
    proc = start_loop(tmp_path, preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_DFL))
    try:
        read_until(proc, "start 0")
        proc.send_signal(signal.SIGHUP)
        let_go(tmp_path, 0)
        out, err = ended(proc)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert out.strip().splitlines()[-1] == "stopped: signal: SIGHUP"


def test_after_finishing_a_second_signal_is_only_noted():
    notes = []
    with StopController(None, notify=notes.append) as stop:
        os.kill(os.getpid(), signal.SIGTERM)
        stop.finishing()  # the run is writing its status: nothing may cut that short
        os.kill(os.getpid(), signal.SIGTERM)
    assert stop.signal_count == 2 and "already stopping" in notes[-1]


def _ignoring(*signals):
    """preexec_fn of a child started as a shell starts `cmd &` in a script (SIGINT ignored)
    or as nohup does (SIGHUP ignored)."""
    return lambda: [signal.signal(s, signal.SIG_IGN) for s in signals]


def test_a_run_started_in_the_background_keeps_sigint_and_nohups_sighup_ignored(tmp_path):
    proc = start_loop(tmp_path, preexec_fn=_ignoring(signal.SIGINT, signal.SIGHUP))
    try:
        lines = read_until(proc, "start 0")
        proc.send_signal(signal.SIGINT)   # a Ctrl-C meant for the script's foreground
        proc.send_signal(signal.SIGHUP)   # the closed session nohup was for
        let_go(tmp_path, 0)
        lines += read_until(proc, "start 1")
        proc.send_signal(signal.SIGTERM)  # `kill PID` still stops it after the step
        let_go(tmp_path, 1)
        out, err = ended(proc)
    finally:
        proc.kill()
    lines += out.strip().splitlines()
    assert proc.returncode == 0, err
    assert lines == ["start 0", "end 0 requested=False", "start 1",
                     "end 1 requested=True", "stopped: signal: SIGTERM"]
    assert "SIGINT is ignored here (started in the background)" in err
    assert f"SIGTERM does (kill {proc.pid})" in err


def test_a_run_in_a_session_of_its_own_takes_sigint_though_it_came_ignored(tmp_path):
    """A sweep starts each run in a session of its own, where no terminal's Ctrl-C reaches
    it: a SIGINT there is the sweep's stop, also when the sweep was started with it ignored."""
    proc = start_loop(tmp_path, preexec_fn=_ignoring(signal.SIGINT), start_new_session=True)
    try:
        read_until(proc, "start 0")
        proc.send_signal(signal.SIGINT)
        let_go(tmp_path, 0)
        out, err = ended(proc)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert out.strip().splitlines() == ["end 0 requested=True", "stopped: signal: SIGINT"]
    assert "ignored" not in err
