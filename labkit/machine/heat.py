"""The heat guard: pause before a rollout while the GPU is too hot, and flag the steps a pause touched.

Why: in the course's runs the GPU throttled when hot, and the pauses we then added polluted the
step times. A step is *clean* when no heat pause overlaps its rollout; the analysis takes its
medians over clean steps only (a run whose every step overlapped a pause has no clean time).

How it works: a background thread reads the temperature every `interval` seconds and keeps the
latest reading and the hottest since the last `mark()` (the `heat/max_temp_c` metric). The trainer
calls `wait_if_hot(step)` before each rollout and between generation batches; when the latest
reading is >= `pause_c` it blocks until the GPU has cooled to <= `resume_c` and returns a `Pause`.
Pause times are unix seconds, so they compare directly with the step's `time/start`/`time/end`.

Without `nvidia-ml-py` on a GPU machine the guard is off: it says so once and never pauses.
Without a GPU it is off and says nothing (there is nothing to watch; the run folder's
config.json still records `heat_guard: "off: no GPU"`). Notices go through tqdm.write, so
they print above a progress bar instead of into it.
Tests drive everything synchronously: inject a fake `clock` and `sleep`, do not `start()` the
thread, and `wait_if_hot` reads the sensor itself.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Protocol

Reading = float | None
EventFn = Callable[[str, str], None]  # (kind, message); kinds: off, pause, resume, timeout, sensor_error


class Sensor(Protocol):
    """Anything with `read() -> float | None`: degrees C, or None when unknown right now."""

    def read(self) -> float | None: ...


class SensorUnavailable(RuntimeError):
    """No temperature can be read here (no package, no driver, no GPU)."""


@dataclass(frozen=True)
class Pause:
    """One heat pause: unix start/end, its length, the hottest reading seen, the step it delayed."""

    start: float
    end: float
    seconds: float
    peak_c: float
    step: int

    def to_dict(self) -> dict:
        """The row written to heat.jsonl: start, end, seconds, peak_c, step."""
        return asdict(self)


# ------------------------------------------------------------------ sensors
class NvmlSensor:
    """The hottest GPU temperature this process can see, read through NVML (`nvidia-ml-py`).

    `indices`: NVML device indices to watch. None: the GPUs that CUDA_VISIBLE_DEVICES names
    (plain indices or GPU-UUIDs; any other form: all GPUs), else all GPUs. Integer entries of
    CUDA_VISIBLE_DEVICES are taken as NVML indices, which match CUDA's order unless the machine
    mixes GPU models; reading more GPUs than used errs on the safe side.
    Raises SensorUnavailable (with the fix) when NVML cannot be used.
    """

    def __init__(self, indices: Sequence[int] | None = None):
        try:
            import pynvml  # optional: the `nvidia-ml-py` package
        except ImportError as e:
            raise SensorUnavailable(
                "no NVML: pip install nvidia-ml-py (or labkit[nvidia]) to watch the GPU temperature"
            ) from e
        self._nvml = pynvml
        try:
            pynvml.nvmlInit()
        except Exception as e:  # pynvml.NVMLError: no driver, no GPU
            raise SensorUnavailable(f"NVML did not start ({e}); no NVIDIA GPU or driver here") from e
        try:
            self._handles = _open_handles(pynvml, indices)
        except Exception as e:
            pynvml.nvmlShutdown()
            raise SensorUnavailable(f"NVML found no GPU to watch ({e})") from e
        if not self._handles:
            pynvml.nvmlShutdown()
            raise SensorUnavailable("NVML found no GPU to watch (CUDA_VISIBLE_DEVICES hides them all)")
        self._use_v = hasattr(pynvml, "nvmlDeviceGetTemperatureV")

    def read(self) -> float | None:
        """The hottest watched GPU in degrees C; None when NVML gives no reading."""
        temps = [t for t in (self._read_one(h) for h in self._handles) if t is not None]
        return float(max(temps)) if temps else None

    def _read_one(self, handle) -> float | None:
        nvml = self._nvml
        if self._use_v:  # the non-deprecated call; older drivers lack it
            try:
                return nvml.nvmlDeviceGetTemperatureV(handle, nvml.NVML_TEMPERATURE_GPU)
            except Exception:
                self._use_v = False
        try:
            return nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU)
        except Exception:
            return None

    def close(self) -> None:
        """Release NVML (safe to call twice)."""
        if self._handles:
            self._handles = []
            self._nvml.nvmlShutdown()


def _open_handles(nvml, indices: Sequence[int] | None) -> list:
    """NVML handles for `indices`, else for the GPUs CUDA_VISIBLE_DEVICES names, else for all."""
    if indices is None:
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        if visible is not None:
            entries = [e.strip() for e in visible.split(",") if e.strip()]
            if not entries or entries[0] == "-1":
                return []
            if all(e.isdigit() for e in entries):
                indices = [int(e) for e in entries]
            elif all(e.startswith("GPU-") for e in entries):
                return [nvml.nvmlDeviceGetHandleByUUID(e) for e in entries]
    if indices is None:
        indices = range(nvml.nvmlDeviceGetCount())
    return [nvml.nvmlDeviceGetHandleByIndex(i) for i in indices]


class ScriptedSensor:
    """A sensor for tests and lessons: a list of readings, or a function of the clock.

    `readings` as a sequence: each `read()` returns the next one; the last one repeats.
    `readings` as a callable: `read()` returns `readings(clock())`.
    `reads` counts the calls.
    """

    def __init__(
        self,
        readings: Sequence[Reading] | Callable[[float], Reading],
        *,
        clock: Callable[[], float] = time.time,
    ):
        if not callable(readings) and len(readings) == 0:
            raise ValueError("ScriptedSensor needs at least one reading")
        self._readings = readings
        self._clock = clock
        self._lock = threading.Lock()
        self.reads = 0

    def read(self) -> float | None:
        with self._lock:
            i = self.reads
            self.reads += 1
        if callable(self._readings):
            return self._readings(self._clock())
        return self._readings[min(i, len(self._readings) - 1)]


# ------------------------------------------------------------------ the guard
def print_event(kind: str, message: str) -> None:
    """The default notice: one line on stderr, above the run's progress bar when one is shown
    (kind is for callers that route events)."""
    from tqdm.auto import tqdm

    tqdm.write(f"heat guard: {message}", file=sys.stderr)


class HeatGuard:
    """Samples a sensor and pauses the caller while the GPU is hot (see the module docstring).

    `pause_c`/`resume_c`: pause when a reading is >= pause_c, resume when one is <= resume_c.
    `interval`: seconds between samples (thread) and between polls during a pause.
    `clock`: unix seconds (Pause start/end use it; pass the trainer's clock for step times).
    `sleep`: how a pause waits; a fake clock's sleep makes tests instant.
    `max_pause_s`: give up a pause after this long (None: wait as long as it takes).
    `on_event(kind, message)`: notices; default one line on stderr.
    `sensor=None` makes an off guard (say why with `HeatGuard.off(reason)`); `quiet` keeps an
    off guard from saying so (there is no GPU to watch).
    """

    THREAD_NAME = "labkit-heat-sampler"

    def __init__(
        self,
        sensor: Sensor | None,
        pause_c: float,
        resume_c: float,
        *,
        interval: float = 1.0,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], None] = time.sleep,
        max_pause_s: float | None = None,
        on_event: EventFn | None = None,
        off_reason: str = "no temperature sensor",
        quiet: bool = False,
    ):
        if resume_c > pause_c:
            raise ValueError(
                f"heat guard: resume_c {resume_c} is above pause_c {pause_c}; "
                f"set --heat-resume-c at or below --heat-pause-c"
            )
        if interval <= 0:
            raise ValueError(f"heat guard: interval must be > 0 seconds, got {interval}")
        self.sensor, self.pause_c, self.resume_c = sensor, float(pause_c), float(resume_c)
        self.interval, self.max_pause_s = float(interval), max_pause_s
        self._clock, self._sleep = clock, sleep
        self._on_event = on_event or print_event
        self.off_reason: str | None = None if sensor is not None else off_reason
        self.pauses: list[Pause] = []
        self._n_taken = 0
        self.latest_c: float | None = None
        self._max_c: float | None = None
        self._lock = threading.Lock()
        self._said: set[str] = {"off"} if quiet else set()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @classmethod
    def off(cls, reason: str, *, on_event: EventFn | None = None, quiet: bool = False) -> HeatGuard:
        """A guard that never pauses; it says `reason` once, on first use (never when `quiet`)."""
        return cls(None, float("inf"), float("inf"), on_event=on_event, off_reason=reason,
                   quiet=quiet)

    @property
    def enabled(self) -> bool:
        return self.sensor is not None

    @property
    def state(self) -> str:
        """"on (pause at 85 C, resume at 75 C)" or "off: <why>", for the run's record."""
        if self.enabled:
            return f"on (pause at {self.pause_c:g} C, resume at {self.resume_c:g} C)"
        return f"off: {self.off_reason}"

    # --- sampling -------------------------------------------------------------------
    def sample(self) -> float | None:
        """Read the sensor once; update the latest reading and the max since mark(); return it."""
        if self.sensor is None:
            return None
        try:
            t = self.sensor.read()
        except Exception as e:  # a broken sensor must not kill the run or the thread
            self._say_once("sensor_error", f"the sensor failed ({e!r}); treating readings as unknown")
            t = None
        with self._lock:
            self.latest_c = t
            if t is not None and (self._max_c is None or t > self._max_c):
                self._max_c = t
        return t

    def mark(self) -> None:
        """Start a new max window (call at the start of each step)."""
        with self._lock:
            self._max_c = None

    @property
    def max_temp_c(self) -> float | None:
        """The hottest reading since the last mark() (None: no reading), for heat/max_temp_c."""
        return self._max_c

    # --- the thread -----------------------------------------------------------------
    def start(self) -> HeatGuard:
        """Start the sampler thread (a daemon); no-op when off or already running."""
        if not self.enabled:
            self._say_off()
            return self
        if self.running:
            return self
        self._stop.clear()
        self.sample()
        self._thread = threading.Thread(target=self._run, name=self.THREAD_NAME, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop the sampler thread and wait for it to end."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=max(5.0, 2 * self.interval))
            self._thread = None

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):  # real time, so stop() is prompt
            self.sample()

    def __enter__(self) -> HeatGuard:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # --- pausing --------------------------------------------------------------------
    def wait_if_hot(self, step: int, cancel: Callable[[], bool] | None = None) -> Pause | None:
        """Block while the GPU is hot; return the Pause, or None (quickly) when it is not hot.

        `step`: the step this pause delays (recorded in the Pause).
        `cancel()`: polled during a pause; True ends it early (e.g. a stop was requested).
        With the thread running the latest reading is used; without it, the sensor is read now.
        """
        if not self.enabled:
            self._say_off()
            return None
        t = self.latest_c if self.running else self.sample()
        if t is None or t < self.pause_c:
            return None
        start, peak = self._clock(), t
        self._on_event("pause", f"GPU at {t:.0f} C >= {self.pause_c:.0f} C: pausing step {step} "
                                f"until it cools to {self.resume_c:.0f} C")
        ended = "resume"
        while True:
            self._sleep(self.interval)
            t = self.sample()
            if t is not None:
                peak = max(peak, t)
                if t <= self.resume_c:
                    break
            if cancel is not None and cancel():
                ended = "cancelled"
                break
            if self.max_pause_s is not None and self._clock() - start >= self.max_pause_s:
                ended = "timeout"
                break
        end = self._clock()
        pause = Pause(start=start, end=end, seconds=end - start, peak_c=peak, step=step)
        self.pauses.append(pause)
        now = "unknown" if t is None else f"{t:.0f} C"
        if ended == "timeout":
            self._on_event("timeout", f"still hot after {pause.seconds:.0f} s (max_pause_s); "
                                      f"resuming step {step} at {now}")
        else:
            self._on_event("resume", f"resuming step {step} after {pause.seconds:.0f} s "
                                     f"({'stop requested, ' if ended == 'cancelled' else ''}"
                                     f"now {now}, peak {peak:.0f} C)")
        return pause

    def take_new_pauses(self) -> list[Pause]:
        """The pauses since the last call (for heat.jsonl); `pauses` keeps them all."""
        new = self.pauses[self._n_taken:]
        self._n_taken += len(new)
        return new

    # --- notices --------------------------------------------------------------------
    def _say_off(self) -> None:
        self._say_once("off", f"off ({self.off_reason}); steps will not pause for heat")

    def _say_once(self, kind: str, message: str) -> None:
        if kind not in self._said:
            self._said.add(kind)
            self._on_event(kind, message)


def make_guard(
    pause_c: float, resume_c: float, sensor: Sensor | None = None, *,
    gpu: bool | None = None, **kwargs
) -> HeatGuard:
    """A HeatGuard on `sensor`, else on NVML when a GPU is there, else an off guard.

    `gpu`: whether this machine has a GPU (None: ask torch). Without one the guard is off and
    quiet: nothing can overheat that it could watch, so a CPU run prints nothing about it.
    `kwargs` go to HeatGuard (interval, clock, sleep, max_pause_s, on_event).
    """
    if sensor is None:
        if not (_gpu_visible() if gpu is None else gpu):
            return HeatGuard(None, pause_c, resume_c, off_reason="no GPU", quiet=True, **kwargs)
        try:
            sensor = NvmlSensor()
        except SensorUnavailable as e:
            return HeatGuard(None, pause_c, resume_c, off_reason=str(e), **kwargs)
    return HeatGuard(sensor, pause_c, resume_c, **kwargs)


def _gpu_visible() -> bool:
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a dependency
        return False
    return bool(torch.cuda.is_available())


# ------------------------------------------------------------------ clean steps
def _overlap(start: float, end: float, pause: Pause) -> float:
    return min(end, pause.end) - max(start, pause.start)


def _overlaps(start: float, end: float, pause: Pause) -> bool:
    # Strict: a pause that ends exactly when the rollout starts (the usual case: the trainer
    # reads the clock after wait_if_hot returns) or starts exactly when it ends does not count.
    return pause.start < end and pause.end > start


def is_clean(rollout_start: float, rollout_end: float, pauses: Iterable[Pause]) -> bool:
    """True when no pause overlaps the open interval (rollout_start, rollout_end).

    Touching endpoints do not count as overlap; a zero-length pause strictly inside does.
    """
    return not any(_overlaps(rollout_start, rollout_end, p) for p in pauses)


def pause_seconds_within(start: float, end: float, pauses: Iterable[Pause]) -> float:
    """Seconds of pause inside [start, end] (pauses never overlap each other, so they add up)."""
    return sum(max(0.0, _overlap(start, end, p)) for p in pauses if _overlaps(start, end, p))
