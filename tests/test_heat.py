"""Heat guard: scripted temperatures, pauses, clean-step flags, the off guard, the sampler thread."""

from __future__ import annotations

import sys
import threading
import time
import types

import pytest

from labkit.machine import heat
from labkit.machine.heat import HeatGuard, Pause, ScriptedSensor, is_clean, make_guard, pause_seconds_within

T0 = 1_700_000_000.0  # a unix time


class FakeClock:
    """Unix seconds that move only when someone sleeps."""

    def __init__(self, t: float = T0):
        self.t = t
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.slept.append(s)
        self.t += s


def make(readings, clock=None, **kw):
    clock = clock or FakeClock()
    events: list[tuple[str, str]] = []
    sensor = ScriptedSensor(readings, clock=clock)
    guard = HeatGuard(sensor, 85, 75, interval=1.0, clock=clock, sleep=clock.sleep,
                      on_event=lambda k, m: events.append((k, m)), **kw)
    return guard, sensor, clock, events


# ------------------------------------------------------------------ pauses
def test_scripted_readings_cross_thresholds_make_one_pause():
    guard, sensor, clock, events = make([70, 86, 88, 80, 74, 70])
    assert guard.wait_if_hot(0) is None            # 70: cool, no sleeping
    assert clock.slept == []
    p = guard.wait_if_hot(1)                       # 86 >= 85: pause; 88, 80, then 74 <= 75
    assert p == Pause(start=T0, end=T0 + 3, seconds=3.0, peak_c=88, step=1)
    assert clock.slept == [1.0, 1.0, 1.0]
    assert guard.wait_if_hot(2) is None            # 70
    assert guard.pauses == [p]
    assert [k for k, _ in events] == ["pause", "resume"]
    assert "86 C" in events[0][1] and "step 1" in events[0][1] and "peak 88 C" in events[1][1]
    assert p.to_dict() == {"start": T0, "end": T0 + 3, "seconds": 3.0, "peak_c": 88, "step": 1}


def test_pause_threshold_is_inclusive_and_between_is_not_hot():
    guard, *_ = make([84.9, 85.0, 75.0])
    assert guard.wait_if_hot(0) is None            # just below pause_c
    p = guard.wait_if_hot(0)                       # exactly pause_c pauses; exactly resume_c resumes
    assert p.seconds == 1.0 and p.peak_c == 85.0


def test_temperature_as_function_of_clock_cools_linearly():
    clock = FakeClock()
    def cooling(t):  # 95 C now, 2 C per second
        return 95.0 - 2.0 * (t - T0)
    guard, _, clock, _ = make(cooling, clock=clock)
    p = guard.wait_if_hot(7)
    assert p.start == T0 and p.end == T0 + 10 and p.peak_c == 95.0   # 95 - 20 = 75 at t0 + 10


def test_unknown_readings_during_a_pause_keep_waiting():
    guard, *_ = make([90, None, None, 80, 70])
    p = guard.wait_if_hot(0)
    assert p.seconds == 4.0 and p.peak_c == 90


def test_unknown_reading_before_a_rollout_does_not_pause():
    guard, *_ = make([None])
    assert guard.wait_if_hot(0) is None


def test_max_pause_gives_up_and_says_so():
    guard, _, clock, events = make([99], max_pause_s=10)
    p = guard.wait_if_hot(3)
    assert p.seconds == 10.0 and p.peak_c == 99
    assert [k for k, _ in events] == ["pause", "timeout"]


def test_cancel_ends_a_pause_early():
    polls = []
    guard, *_ = make([99])
    p = guard.wait_if_hot(0, cancel=lambda: polls.append(1) or len(polls) >= 2)
    assert p.seconds == 2.0


def test_a_failing_sensor_is_unknown_and_reported_once():
    class Broken:
        def read(self):
            raise OSError("bus error")

    events = []
    guard = HeatGuard(Broken(), 85, 75, on_event=lambda k, m: events.append(k))
    assert guard.wait_if_hot(0) is None and guard.wait_if_hot(1) is None
    assert events == ["sensor_error"]


def test_refuses_resume_above_pause():
    with pytest.raises(ValueError, match="--heat-resume-c at or below --heat-pause-c"):
        HeatGuard(ScriptedSensor([50]), 75, 85)


def test_max_since_mark():
    guard, *_ = make([60, 70, 65, 62])
    assert guard.max_temp_c is None
    guard.sample(), guard.sample(), guard.sample()
    assert guard.max_temp_c == 70 and guard.latest_c == 65
    guard.mark()
    assert guard.max_temp_c is None
    guard.sample()
    assert guard.max_temp_c == 62


def test_pause_peak_counts_in_max_temp():
    guard, *_ = make([86, 91, 70])
    guard.mark()
    guard.wait_if_hot(0)
    assert guard.max_temp_c == 91


# ------------------------------------------------------------------ clean steps
P = Pause(start=100.0, end=103.0, seconds=3.0, peak_c=88.0, step=1)


@pytest.mark.parametrize(
    "start, end, clean, seconds",
    [
        (90.0, 100.0, True, 0.0),    # rollout ends when the pause starts: touching, clean
        (103.0, 110.0, True, 0.0),   # rollout starts when the pause ends: touching, clean
        (80.0, 95.0, True, 0.0),     # well before
        (101.0, 102.0, False, 1.0),  # inside the pause
        (95.0, 200.0, False, 3.0),   # contains the pause
        (102.0, 105.0, False, 1.0),  # overlaps its end
        (99.0, 100.5, False, 0.5),   # overlaps its start
    ],
)
def test_is_clean_and_pause_seconds(start, end, clean, seconds):
    assert is_clean(start, end, [P]) is clean
    assert pause_seconds_within(start, end, [P]) == pytest.approx(seconds)


def test_pause_seconds_add_over_several_pauses():
    q = Pause(start=110.0, end=112.0, seconds=2.0, peak_c=86.0, step=2)
    assert pause_seconds_within(95.0, 111.0, [P, q]) == pytest.approx(4.0)
    assert is_clean(103.0, 110.0, [P, q])
    assert is_clean(0.0, 1.0, [])


def test_trainer_flow_marks_pre_rollout_pause_clean_and_mid_rollout_pause_dirty():
    # step 0: hot before the rollout; step 1: hot between two generation batches
    guard, _, clock, _ = make([90, 74, 70, 70, 70, 88, 70, 70])
    steps = []
    for step in range(2):
        guard.wait_if_hot(step)
        start = clock()
        for _ in range(2):                        # two generation batches of 5 s
            clock.t += 5.0
            guard.wait_if_hot(step)
        steps.append((start, clock()))
    (s0, e0), (s1, e1) = steps
    assert [p.step for p in guard.pauses] == [0, 1]
    assert is_clean(s0, e0, guard.pauses)         # the pause ended exactly when the rollout began
    assert not is_clean(s1, e1, guard.pauses)
    assert pause_seconds_within(s1, e1, guard.pauses) == 1.0
    assert guard.take_new_pauses() == guard.pauses and guard.take_new_pauses() == []
    assert e1 - s1 - pause_seconds_within(s1, e1, guard.pauses) == 10.0  # perf/rollout_time


# ------------------------------------------------------------------ off guard
def test_guard_without_sensor_is_off_and_says_so_once():
    events = []
    guard = HeatGuard.off("no GPU here", on_event=lambda k, m: events.append((k, m)))
    assert not guard.enabled
    assert events == []                           # quiet until used
    guard.start()
    assert guard.wait_if_hot(0) is None and guard.wait_if_hot(1) is None
    assert not guard.running
    assert events == [("off", "off (no GPU here); steps will not pause for heat")]
    guard.stop()


def test_make_guard_without_pynvml_on_a_gpu_is_off_and_says_how_to_fix_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)   # import pynvml -> ImportError
    events = []
    guard = make_guard(85, 75, on_event=lambda k, m: events.append(m), gpu=True)
    assert not guard.enabled and "pip install nvidia-ml-py" in guard.off_reason
    guard.wait_if_hot(0), guard.wait_if_hot(1)
    assert len(events) == 1 and "nvidia-ml-py" in events[0]


def test_make_guard_without_a_gpu_is_off_and_quiet(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "pynvml", None)
    guard = make_guard(85, 75, gpu=False)
    with guard:
        assert guard.wait_if_hot(0) is None
    assert capsys.readouterr() == ("", "")  # not a word, on a machine with nothing to watch
    assert guard.state == "off: no GPU"
    assert make_guard(85, 75, ScriptedSensor([50])).state == "on (pause at 85 C, resume at 75 C)"


def test_notices_print_above_a_progress_bar(capsys):
    from tqdm import tqdm

    guard = HeatGuard.off("no NVML here")
    with tqdm(total=3, file=sys.stderr, ncols=60) as bar:
        bar.update(1)
        guard.wait_if_hot(0)
    screen = [line.split("\r")[-1] for line in capsys.readouterr().err.split("\n")]  # as shown
    assert "heat guard: off (no NVML here); steps will not pause for heat" in screen  # own line


def test_make_guard_uses_given_sensor():
    guard = make_guard(85, 75, ScriptedSensor([50]))
    assert guard.enabled and guard.sample() == 50


def fake_nvml(temps, *, init_error=None):
    """A stand-in for the pynvml module: devices with fixed temperatures."""
    m = types.ModuleType("pynvml")

    class NVMLError(Exception):
        pass

    m.NVMLError, m.NVML_TEMPERATURE_GPU = NVMLError, 0
    m.calls = []

    def init():
        if init_error:
            raise NVMLError(init_error)

    def temp(handle, sensor):
        if temps[handle] is None:
            raise NVMLError("Not Supported")
        return temps[handle]

    m.nvmlInit = init
    m.nvmlShutdown = lambda: m.calls.append("shutdown")
    m.nvmlDeviceGetCount = lambda: len(temps)
    m.nvmlDeviceGetHandleByIndex = lambda i: i
    m.nvmlDeviceGetHandleByUUID = lambda u: int(u.split("-")[-1])
    m.nvmlDeviceGetTemperature = temp
    return m


def test_nvml_sensor_reads_the_hottest_visible_gpu(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml([60, 83, None]))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    sensor = heat.NvmlSensor()
    assert sensor.read() == 83.0
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    assert heat.NvmlSensor().read() == 60.0
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-aa-2")
    assert heat.NvmlSensor().read() is None      # that GPU gives no reading: unknown
    sensor.close()
    sensor.close()
    assert sys.modules["pynvml"].calls == ["shutdown"]


def test_nvml_without_driver_or_visible_gpu_turns_the_guard_off(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml([60], init_error="Driver Not Loaded"))
    guard = make_guard(85, 75, on_event=lambda k, m: None, gpu=True)
    assert not guard.enabled and "Driver Not Loaded" in guard.off_reason
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml([60]))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    guard = make_guard(85, 75, on_event=lambda k, m: None, gpu=True)
    assert not guard.enabled and "CUDA_VISIBLE_DEVICES" in guard.off_reason


# ------------------------------------------------------------------ the thread
def sampler_threads():
    return [t for t in threading.enumerate() if t.name == HeatGuard.THREAD_NAME]


def wait_for(cond, timeout=600.0):  # for the event; the bound only ends a broken test
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


def test_sampler_thread_samples_and_stops_without_leftovers():
    sensor = ScriptedSensor([60, 61, 62, 63, 64])
    guard = HeatGuard(sensor, 85, 75, interval=0.01, on_event=lambda k, m: None)
    with guard:
        assert guard.running and len(sampler_threads()) == 1
        wait_for(lambda: sensor.reads >= 5)
        assert guard.latest_c == 64 and guard.max_temp_c == 64
    assert not guard.running and sampler_threads() == []
    guard.start()                                 # restartable
    assert guard.running
    guard.stop()
    assert sampler_threads() == []


def test_with_thread_running_wait_uses_latest_reading():
    clock = FakeClock(T0 - 1)
    readers: list[str] = []

    def temp(t):                                   # a pure function of the fake clock
        readers.append(threading.current_thread().name)
        return 60.0 if t < T0 else 90.0 - 5.0 * (t - T0)

    guard, sensor, clock, _ = make(temp, clock=clock)
    guard.interval = 0.01
    with guard:
        wait_for(lambda: sensor.reads >= 3)
        readers.clear()                            # start() itself reads once
        assert guard.wait_if_hot(0) is None
        assert "MainThread" not in readers         # the thread's reading was used
        clock.t = T0                               # now it is hot
        wait_for(lambda: guard.latest_c == 90.0)
        p = guard.wait_if_hot(1)
    assert "MainThread" in readers                 # a pause polls the sensor itself
    assert p.start == T0 and p.end == pytest.approx(T0 + 3) and p.peak_c == 90.0
    assert sampler_threads() == []
