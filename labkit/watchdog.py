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
second) and offline: `replay(log)` feeds a recorded log through it on the log's own clock,
so the same log always gives the same table. Times that the watchdog cannot see at an
event (a burst that ended, a stall that began) are computed from the gap, not from when
the next line happened to arrive, which keeps live and replayed decisions identical.

Events are JSON objects with `t` (unix seconds) and `event`, one of:
    fail        a failed attempt: request_id, attempt, status (None: no answer), code, error
    done        a request answered: request_id, attempts
    gave_up     a request out of retry time: request_id, attempts, status, code
    step_start  a rollout begins: step, requests, open_limit     step_end: step
    heat_start  a heat pause begins (no completions expected)  heat_end: it ends
    limit       the client changed its open-request limit (live only; replay decides anew)
    meta        who recorded the log: machine, command, versions, constructed
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Optional, Sequence

import pandas as pd

try:  # orjson parses a log about 3x faster; plain json gives the same events
    from orjson import loads as _loads
except ImportError:  # pragma: no cover
    from json import loads as _loads

KINDS = {"meta", "fail", "done", "gave_up", "step_start", "step_end", "heat_start", "heat_end", "limit"}


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
    stop_burst_s: Optional[float] = None
    stop_stall_s: Optional[float] = None

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
    limit: Optional[int]
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
        self.t0: Optional[float] = None
        self.bursts: list[_Burst] = []
        self.stalls: list[dict] = []
        self.decisions: list[Decision] = []
        self.counts: Counter = Counter()
        self._burst: Optional[_Burst] = None
        self._stall: Optional[dict] = None
        self._in_rollout = self._paused = self._stopped = False
        self._progress: Optional[float] = None  # last completion, step start or heat end

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


# ---------------------------------------------------------------------- replay
@dataclass
class LogRead:
    """The valid events of a log in time order, and what was wrong with the rest."""

    events: list[dict]
    meta: dict
    bad_lines: int = 0  # not JSON (truncated), not an object, or without a finite t / event
    out_of_order: int = 0  # valid lines whose t is earlier than a line before them (re-sorted)
    unknown: int = 0  # valid lines of an event kind the watchdog does not know (skipped)
    bad_examples: list[str] = field(default_factory=list)


def read_events(path: Path, max_examples: int = 3) -> LogRead:
    """Read a client log (JSON lines); count bad, out-of-order and unknown lines, never raise."""
    events, meta, bad, late, unknown, examples = [], {}, 0, 0, 0, []
    latest = -math.inf
    with open(path, encoding="utf-8", errors="replace") as f:
        for n, raw in enumerate(f, 1):
            if not raw.strip():
                continue
            e = _parse_line(raw)
            if e is None:
                bad += 1
                if len(examples) < max_examples:
                    examples.append(f"line {n}: {raw[:80]!r}")
                continue
            if e["event"] == "meta":
                meta = {**meta, **{k: v for k, v in e.items() if k not in ("t", "event")}}
            if e["event"] not in KINDS:
                unknown += 1
                continue
            if e["t"] < latest:
                late += 1
            latest = max(latest, e["t"])
            events.append(e)
    events.sort(key=lambda e: e["t"])  # stable: equal times keep the file's order
    return LogRead(events, meta, bad, late, unknown, examples)


def _parse_line(raw: str) -> Optional[dict]:
    try:
        e = _loads(raw)
    except ValueError:  # json's and orjson's decode errors are ValueErrors
        return None
    if not isinstance(e, dict) or not isinstance(e.get("event"), str):
        return None
    t = e.get("t")
    if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t):
        return None
    e["t"] = float(t)
    return e


@dataclass
class ReplayResult:
    """What a replay found: bursts, stalls, decisions, per-second counts and a summary."""

    bursts: pd.DataFrame
    stalls: pd.DataFrame
    decisions: pd.DataFrame
    per_second: pd.DataFrame  # columns second, fails (503 lines), other_fails, done
    summary: dict

    def report(self) -> str:
        """The summary and the burst table as text, for a terminal or a notebook."""
        s = self.summary
        lines = [f"log: {s['log']}" + ("  [CONSTRUCTED scenario, not a recorded run]" if s["constructed"] else ""),
                 f"events: {s['events']}  503 lines: {s['lines_503']}  other failed attempts: "
                 f"{s['other_fails']}  completions: {s['done']}  gave up: {s['gave_up']}  "
                 f"span: {s['span_s']:.1f} s",
                 f"bad lines: {s['bad_lines']}  out of order: {s['out_of_order']}  "
                 f"unknown kinds: {s['unknown']}"]
        lines += [f"  {x}" for x in s["bad_examples"]]
        lines += ["", f"bursts (gap > {s['burst_gap']:g} s ends one): {len(self.bursts)}",
                  self.bursts.to_string(index=False) if len(self.bursts) else "  none"]
        if len(self.stalls):
            lines += ["", f"stalls (no completion for > {s['stall_s']:g} s):", self.stalls.to_string(index=False)]
        lines += ["", "decisions:", self.decisions.to_string(index=False) if len(self.decisions) else "  none"]
        return "\n".join(lines)


def replay(log_path: Path, burst_gap: float = 5.0, stall_s: float = 60.0,
           policy: Policy = Policy(), open_limit: int = 512) -> ReplayResult:
    """Feed a recorded client log through a Watchdog on the log's clock; return its findings.

    Deterministic: the same log and settings give the same tables. Bad lines are counted
    in the summary, never raised.
    """
    log_path = Path(log_path)
    if not log_path.is_file():
        raise FileNotFoundError(f"no client log at {log_path}; pass the .jsonl the rollout client wrote")
    read = read_events(log_path)
    dog = Watchdog(burst_gap=burst_gap, stall_s=stall_s, policy=policy, open_limit=open_limit)
    statuses = dog.statuses
    seconds: Counter = Counter()
    other: Counter = Counter()
    done: Counter = Counter()
    for e in read.events:
        dog.observe(e)
        if e["event"] == "fail":
            (seconds if e.get("status") in statuses else other)[int(e["t"] - dog.t0)] += 1
        elif e["event"] == "done":
            done[int(e["t"] - dog.t0)] += 1
    dog.finish()
    span = read.events[-1]["t"] - read.events[0]["t"] if read.events else 0.0
    n = int(span) + 1 if read.events else 0
    per_second = pd.DataFrame({"second": range(n), "fails": [seconds[i] for i in range(n)],
                               "other_fails": [other[i] for i in range(n)],
                               "done": [done[i] for i in range(n)]})
    c = dog.counts
    summary = {
        "log": log_path.name, "constructed": bool(read.meta.get("constructed", False)),
        "meta": read.meta, "events": len(read.events), "lines_503": int(sum(seconds.values())),
        "other_fails": c["fail"] - int(sum(seconds.values())), "done": c["done"],
        "gave_up": c["gave_up"], "steps": c["step_start"], "span_s": round(span, 3),
        "bad_lines": read.bad_lines, "out_of_order": read.out_of_order, "unknown": read.unknown,
        "bad_examples": read.bad_examples, "burst_gap": burst_gap, "stall_s": stall_s,
        "policy": dataclasses.asdict(policy),
    }
    return ReplayResult(dog.burst_table(), dog.stall_table(), dog.decision_table(), per_second, summary)


# ---------------------------------------------------------------------- the timeline
MARKS = {"lower": ("v", "tab:orange"), "restore": ("^", "tab:green"),
         "stall": ("x", "tab:purple"), "stop": ("X", "tab:red")}


def timeline(result: ReplayResult, out_dir: Optional[Path] = None, name: Optional[str] = None):
    """Plot 503 lines per second with bursts shaded and decisions marked; save PNG and SVG.

    Returns the matplotlib Figure; with `out_dir`, writes `<name>.png` and `<name>.svg`.
    """
    import matplotlib

    if out_dir is not None:
        matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    s, ps = result.summary, result.per_second
    fig, (ax, ax2) = plt.subplots(2, 1, figsize=(10, 5.2), sharex=True,
                                  gridspec_kw={"height_ratios": [3, 1.4]})
    ax.step(ps["second"], ps["fails"], where="post", lw=0.8, color="tab:blue", label="503 lines / s")
    if len(ps) and ps["other_fails"].any():
        ax.step(ps["second"], ps["other_fails"], where="post", lw=0.8, color="0.45", ls="--",
                label="other failed attempts / s")
    for _, b in result.bursts.iterrows():
        ax.axvspan(b["start_s"], b["end_s"] + 1, color="tab:red", alpha=0.12, lw=0)
    top = max(1, int(ps["fails"].max()) if len(ps) else 1)
    for action, (marker, color) in MARKS.items():
        d = result.decisions[result.decisions["action"] == action]
        if len(d):
            ax.scatter(d["t_s"], [top * 1.08] * len(d), marker=marker, color=color, s=40,
                       label=action, zorder=3)
    ax.set_ylim(0, top * 1.45)
    ax.set_ylabel("failed attempts per second")
    ax.legend(loc="upper right", fontsize=8, ncol=3)
    kind = "CONSTRUCTED scenario" if s["constructed"] else "recorded client log"
    ax.set_title(f"{s['log']} ({kind}): {len(result.bursts)} bursts, {s['lines_503']} 503 lines "
                 f"(burst gap {s['burst_gap']:g} s; shaded: bursts)", fontsize=10)
    ax2.step(ps["second"], ps["done"], where="post", lw=0.8, color="tab:gray")
    ax2.set_ylabel("completions / s")
    ax2.set_xlabel("seconds from the first event")
    meta = s.get("meta") or {}
    foot = "\n".join(f"{k}: {str(meta[k])[:160]}" for k in ("machine", "command") if meta.get(k))
    if foot:
        fig.text(0.01, 0.005, foot, fontsize=6.5, color="0.35")
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    if out_dir is not None:
        out_dir = Path(out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        stem = name or Path(s["log"]).stem + "-timeline"
        for ext in ("png", "svg"):
            fig.savefig(out_dir / f"{stem}.{ext}", dpi=130)
    return fig


# ---------------------------------------------------------------------- labkit replay
def replay_main(argv: Optional[Sequence[str]] = None) -> int:
    """`labkit replay LOG [--burst-gap S] [--out DIR]`: print the burst table, save the plot."""
    p = argparse.ArgumentParser(prog="labkit replay", description=__doc__.split("\n")[0])
    p.add_argument("log", help="a client log (.jsonl) written by labkit.client")
    p.add_argument("--burst-gap", type=float, default=5.0, help="a gap longer than this ends a burst (s)")
    p.add_argument("--stall-s", type=float, default=60.0, help="flag a stall after this long without a completion (s)")
    p.add_argument("--on-burst", choices=["keep", "lower"], default="keep", help="policy during a burst")
    p.add_argument("--stop-burst-s", type=float, default=None, help="stop when a burst lasts longer (s)")
    p.add_argument("--stop-stall-s", type=float, default=None, help="stop when a stall lasts longer (s)")
    p.add_argument("--open-limit", type=int, default=512, help="open-request limit the policy lowers")
    p.add_argument("--out", default="out/replay", help="folder for the timeline PNG and SVG")
    args = p.parse_args(argv)
    try:
        policy = Policy(on_burst=args.on_burst, stop_burst_s=args.stop_burst_s, stop_stall_s=args.stop_stall_s)
        result = replay(Path(args.log), args.burst_gap, args.stall_s, policy, args.open_limit)
    except (FileNotFoundError, ValueError, IsADirectoryError) as e:
        print(f"labkit replay: {e}", file=sys.stderr)
        return 2
    print(result.report())
    timeline(result, Path(args.out))
    print(f"\ntimeline: {Path(args.out) / (Path(args.log).stem + '-timeline')}.png and .svg")
    return 0


if __name__ == "__main__":
    sys.exit(replay_main())
