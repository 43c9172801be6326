"""Constructed 503 scenarios: client logs made up from a burst recipe, for exercises and tests.

The lesson replays one recorded incident (`data/incidents/`); exercises also need logs
whose answer is known in advance (three bursts of 10, 30 and 60 s: does the watchdog find
three?). Every log made here is marked as constructed: its first line is a `meta` event
with `"constructed": true`, `write_scenario` refuses a file name without "constructed",
and `replay` and the timeline print "CONSTRUCTED" for it. A constructed log is never a
measurement.
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

T0 = 1_700_000_000.0  # a fixed start time keeps constructed logs identical from run to run
COURSE_503_LINES = 22_357  # the count in the course text's 16-answer run


@dataclass(frozen=True)
class BurstSpec:
    """One burst to construct: start (s from the log's start), duration (s), 503 lines per s."""

    start_s: float
    duration_s: float
    rate: float


def make_scenario(bursts: Sequence[BurstSpec], *, steps: int = 1, step_s: float = 120.0,
                  requests: int = 512, seed: int = 0, lines: Sequence[int] | None = None
                  ) -> list[dict]:
    """Events of `steps` rollouts of `requests` requests, `step_s` s each, with the given bursts.

    Each burst's 503 lines (rate x duration, or `lines[i]` when given) fall at seeded
    random times inside it, on requests of the step the line falls in; a request that
    failed completes after its last failed attempt, the others at random times in their
    step. Returns the events in time order, the meta line first.
    """
    rng = random.Random(seed)
    meta = {"t": T0, "event": "meta", "constructed": True, "seed": seed,
            "recipe": [b.__dict__ for b in bursts], "steps": steps, "step_s": step_s,
            "machine": "none (constructed by labkit.course.incidents)"}
    events, attempts, last_fail = [], {}, {}
    for k, b in enumerate(bursts):
        n = int(lines[k]) if lines is not None else int(round(b.rate * b.duration_s))
        times = sorted(b.start_s + rng.random() * b.duration_s for _ in range(n))
        if n >= 2:  # pin the ends so the burst spans exactly its duration
            times[0], times[-1] = b.start_s, b.start_s + b.duration_s
        for t in times:
            step = min(int(t // step_s), steps - 1)
            rid = f"s{step}-r{rng.randrange(requests)}"
            attempts[rid] = attempts.get(rid, 0) + 1
            last_fail[rid] = t
            events.append({"t": round(T0 + t, 4), "event": "fail", "request_id": rid,
                           "attempt": attempts[rid], "status": 503, "code": "no_available_workers",
                           "error": "No available workers (all circuits open or unhealthy)",
                           "delay_s": None})
    for step in range(steps):
        begin, finish = step * step_s, (step + 1) * step_s - 0.5
        events.append({"t": round(T0 + begin, 4), "event": "step_start", "step": step,
                       "requests": requests, "open_limit": requests})
        events.append({"t": round(T0 + finish + 0.4, 4), "event": "step_end", "step": step})
        for i in range(requests):
            rid = f"s{step}-r{i}"
            after = last_fail.get(rid)
            t = after + 0.05 + rng.random() * 0.3 if after is not None else begin + rng.random() * (finish - begin)
            events.append({"t": round(T0 + min(t, finish), 4), "event": "done", "request_id": rid,
                           "attempts": attempts.get(rid, 0) + 1})
    return [meta] + sorted(events, key=lambda e: (e["t"], e["event"] != "step_start"))


def course_scenario(seed: int = 0) -> list[dict]:
    """A constructed log shaped like the course's run: 24 steps of 188 s (the course's
    median step), 22,357 503 lines in 12 bursts of 5 to 60 s. Not the real log."""
    rng = random.Random(seed)
    durations = [60, 12, 35, 8, 47, 20, 5, 60, 15, 28, 40, 9]
    step_s, bursts = 188.0, []
    for k, d in enumerate(durations):  # one burst in every other step, inside the step
        start = 2 * k * step_s + 10 + rng.random() * (step_s - d - 40)
        bursts.append(BurstSpec(round(start, 3), float(d), 0.0))
    weights = [d * (0.8 + 0.4 * rng.random()) for d in durations]
    lines = [int(COURSE_503_LINES * w / sum(weights)) for w in weights]
    lines[0] += COURSE_503_LINES - sum(lines)
    return make_scenario(bursts, steps=24, step_s=step_s, requests=512, seed=seed, lines=lines)


def write_scenario(path: Path, events: Sequence[dict]) -> Path:
    """Write constructed events as JSON lines; the file name must say "constructed"."""
    path = Path(path)
    if "constructed" not in path.name:
        raise ValueError(f"{path.name}: a constructed log's file name must contain 'constructed' "
                         f"(e.g. {path.stem}.constructed.jsonl) so nobody takes it for a recording")
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        for e in events:
            f.write(json.dumps(e, separators=(",", ":")) + "\n")
    return path
