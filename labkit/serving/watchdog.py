"""The watchdog: group 503 lines into bursts, flag stalls, and decide what the run does.

The course's 16-answer run logged 22,357 "503 Service Unavailable" lines in bursts of up
to 60 s, and nobody looked at them while it ran: the client retried and the run went on.
A watchdog reads the same event stream the rollout client writes (failed attempts,
completions, step boundaries, heat pauses) and turns it into a few facts: bursts (503
lines with gaps of at most `burst_gap` seconds), stalls (no request completed for
`stall_s` seconds while a rollout was open and not paused for heat), and decisions taken
by a policy: keep going, lower the open-request limit while a burst lasts and restore it
after, or stop the run when a burst or a stall passes its limit.

It runs live (`RolloutClient(watchdog=...)` feeds it each event and calls `tick` every
second) and offline: labkit.serving.replay feeds a recorded log through it on the log's own
clock, so the same log always gives the same table. Times that the watchdog cannot see at an
event (a burst that ended, a stall that began) are computed from the gap, not from when
the next line happened to arrive, which keeps live and replayed decisions identical.

Events are JSON objects with `t` (unix seconds) and `event`, one of:
    fail        a failed attempt: request_id, attempt, status (None: no answer), code, error
    done        a request answered: request_id, attempts
    gave_up     a request out of retry time: request_id, attempts, status, code
    step_start  a rollout begins: step, requests, open_limit     step_end: step
    heat_start  a heat pause begins (no completions expected)  heat_end: it ends
    limit       the client changed its open-request limit (live only; replay decides anew)
    stall       the live watchdog flagged a stall (live only; replay decides anew)
    meta        who recorded the log: machine, command, versions, constructed
    sync        a weight sync to the engines (labkit.engines.http): folder, bytes, seconds
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

import pandas as pd

KINDS = {"meta", "fail", "done", "gave_up", "step_start", "step_end", "heat_start", "heat_end", "limit",
         "stall", "sync"}


@dataclass(frozen=True)
class Policy:
    """What the watchdog does about bursts and stalls.

    on_burst: "keep" (only report) or "lower" (open-request limit x lower_factor while a
        burst lasts, never below min_open; restored when the burst ends).
    stop_burst_s / stop_stall_s: stop the run when one burst / one stall lasts longer
        (None: never stop for it).
    """

    on_burst: str = "keep"
    lower_factor: float = 0.5
    min_open: int = 8
    stop_burst_s: float | None = None
    stop_stall_s: float | None = None

    def __post_init__(self):
        if self.on_burst not in ("keep", "lower"):
            raise ValueError(f"Policy.on_burst must be 'keep' or 'lower', got {self.on_burst!r}")
        if not 0 < self.lower_factor <= 1:
            raise ValueError(f"Policy.lower_factor must be in (0, 1], got {self.lower_factor}")


@dataclass(frozen=True)
class Decision:
    """One action of the policy at time t: lower, restore, stall (flag only) or stop."""

    t: float
    action: str
    limit: int | None
    reason: str


@dataclass
class _Burst:
    start: float
    last: float
    lines: int = 0
    per_request: Counter = field(default_factory=Counter)
    per_second: Counter = field(default_factory=Counter)


class Watchdog:
    """Feed events with `observe(event)` (and `tick(t)` live); read the tables at the end."""

    def __init__(self, burst_gap: float = 5.0, stall_s: float = 60.0, policy: Policy = Policy(),
                 open_limit: int = 512, statuses: Sequence[int] = (503,)):
        if burst_gap <= 0 or stall_s <= 0:
            raise ValueError(f"burst_gap and stall_s must be > 0, got {burst_gap}, {stall_s}")
        self.burst_gap, self.stall_s, self.policy = float(burst_gap), float(stall_s), policy
        self.statuses = set(statuses)
        self.base_limit = self.limit = int(open_limit)
        self.t0: float | None = None
        self.bursts: list[_Burst] = []
        self.stalls: list[dict] = []
        self.decisions: list[Decision] = []
        self.counts: Counter = Counter()
        self._burst: _Burst | None = None
        self._stall: dict | None = None
        self._in_rollout = self._paused = self._stopped = False
        self._progress: float | None = None  # last completion, step start or heat end

    # ------------------------------------------------------------------ feeding
    def observe(self, e: dict) -> list[Decision]:
        """Take one event (dict with t and event); return the decisions it caused."""
        t, kind = float(e["t"]), e["event"]
        if self.t0 is None:
            self.t0 = t
        passed = self.tick(t)  # recorded by tick
        out: list[Decision] = []
        self.counts[kind] += 1
        if kind == "fail":
            if e.get("status") in self.statuses:
                out = self._add_to_burst(t, str(e.get("request_id")))
        elif kind == "done":
            self._end_stall(t)
            self._progress = t
        elif kind == "step_start":
            self._in_rollout, self._progress = True, t
            if e.get("open_limit"):  # a lowered limit stays lowered while its burst lasts
                self.base_limit = int(e["open_limit"])
                self.limit = self._lowered() if self._burst and self.limit < self.base_limit else self.base_limit
        elif kind == "step_end":
            self._end_stall(t)
            self._in_rollout = False
        elif kind == "heat_start":
            self._end_stall(t)
            self._paused = True
        elif kind == "heat_end":
            self._paused, self._progress = False, t
        self.decisions += out
        return passed + out

    def tick(self, t: float) -> list[Decision]:
        """Let time pass to t: end a burst after its gap, open or stop a stall."""
        out: list[Decision] = []
        b = self._burst
        if b is not None and t - b.last > self.burst_gap:
            self.bursts.append(b)
            self._burst = None
            if self.limit != self.base_limit:
                self.limit = self.base_limit
                out.append(Decision(b.last + self.burst_gap, "restore", self.limit,
                                    f"burst over (no 503 for {self.burst_gap:g} s)"))
        if self._in_rollout and not self._paused and self._progress is not None:
            since = self._progress
            if self._stall is None and t - since > self.stall_s:
                self._stall = {"start": since, "flagged": since + self.stall_s}
                out.append(Decision(since + self.stall_s, "stall", self.limit,
                                    f"no request completed for {self.stall_s:g} s"))
            limit = self.policy.stop_stall_s
            if limit and t - since > limit and not self._stopped:
                self._stopped = True
                out.append(Decision(since + limit, "stop", None,
                                    f"stall: no request completed for {limit:g} s "
                                    f"(Policy.stop_stall_s); the router or the engines are stuck"))
        self.decisions += out
        return out

    def finish(self) -> None:
        """Close what is still open at the end of the stream (a burst, a stall)."""
        if self._burst is not None:
            self.bursts.append(self._burst)
            self._burst = None
        if self._stall is not None:
            self._stall["end"] = None
            self.stalls.append(self._stall)
            self._stall = None

    def _add_to_burst(self, t: float, rid: str) -> list[Decision]:
        out: list[Decision] = []
        if self._burst is None:
            self._burst = _Burst(start=t, last=t)
            if self.policy.on_burst == "lower":
                lowered = self._lowered()
                if lowered < self.limit:
                    self.limit = lowered
                    out.append(Decision(t, "lower", lowered, "503 burst started"))
        b = self._burst
        b.last, b.lines = t, b.lines + 1
        b.per_request[rid] += 1
        b.per_second[int(math.floor(t - self.t0))] += 1
        limit = self.policy.stop_burst_s
        if limit and t - b.start > limit and not self._stopped:
            self._stopped = True
            out.append(Decision(t, "stop", None,
                                f"503 burst longer than {limit:g} s (Policy.stop_burst_s) with "
                                f"{len(b.per_request)} requests waiting; lower max_open_requests "
                                f"or add engines"))
        return out

    def _lowered(self) -> int:
        return max(self.policy.min_open, int(self.base_limit * self.policy.lower_factor))

    def _end_stall(self, t: float) -> None:
        if self._stall is not None:
            self._stall["end"] = t
            self.stalls.append(self._stall)
            self._stall = None

    # ------------------------------------------------------------------ tables
    def burst_table(self) -> pd.DataFrame:
        """One row per burst: start_s, end_s (from the first event), duration, lines, ..."""
        rows = []
        for i, b in enumerate(self.bursts + ([self._burst] if self._burst else [])):
            rows.append({
                "burst": i, "start_s": round(b.start - self.t0, 3), "end_s": round(b.last - self.t0, 3),
                "duration_s": round(b.last - b.start, 3), "lines": b.lines,
                "requests": len(b.per_request), "max_attempts": max(b.per_request.values()),
                "peak_per_s": max(b.per_second.values()),
            })
        cols = ["burst", "start_s", "end_s", "duration_s", "lines", "requests", "max_attempts", "peak_per_s"]
        return pd.DataFrame(rows, columns=cols)

    def stall_table(self) -> pd.DataFrame:
        """One row per stall: start_s, flagged_s, end_s (NaN when still open), duration_s."""
        rows = []
        for s in self.stalls + ([self._stall] if self._stall else []):
            end = s.get("end")
            rows.append({"start_s": round(s["start"] - self.t0, 3),
                         "flagged_s": round(s["flagged"] - self.t0, 3),
                         "end_s": round(end - self.t0, 3) if end is not None else float("nan"),
                         "duration_s": round(end - s["start"], 3) if end is not None else float("nan")})
        return pd.DataFrame(rows, columns=["start_s", "flagged_s", "end_s", "duration_s"])

    def decision_table(self) -> pd.DataFrame:
        """One row per decision: t_s (from the first event), action, limit, reason."""
        t0 = self.t0 or 0.0
        rows = [{"t_s": round(d.t - t0, 3), "action": d.action, "limit": d.limit, "reason": d.reason}
                for d in self.decisions]
        table = pd.DataFrame(rows, columns=["t_s", "action", "limit", "reason"])
        return table.astype({"limit": "Int64"})
