"""Replay: a recorded client log through the watchdog on the log's own clock, and its timeline.

The course's 16-answer run logged its 503s and nobody looked while it ran. `replay(log)`
feeds every event of a client log (labkit.serving.client writes them) to a
labkit.serving.watchdog.Watchdog in time order, so the same log always gives the same
bursts, stalls and decisions; `timeline` draws them. Bad lines are counted, never raised:
a log cut short by a killed run still replays; a file none of whose lines is an event (a
PNG, a metrics.jsonl) is refused. A policy's stop is its last decision: the run would have
stopped there, so what the log holds after it is counted, and decided on no further. A stall
still open when the log ends has no end (NaN); the report says what that means: where the
recording stops, in which step, how many requests were answered, and how the recording
ended when its meta line says so (`ended`).
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from labkit.serving.watchdog import KINDS, Policy, Watchdog

try:  # orjson parses a log about 3x faster; plain json gives the same events
    from orjson import loads as _loads
except ImportError:  # pragma: no cover
    from json import loads as _loads


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


def _parse_line(raw: str) -> dict | None:
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

    def log_end(self) -> str:
        """What an end_s of NaN means: "no end: the recording stops at 301.2 s, in step 0 (48
        of 512 requests answered; stopped by hand)". The stall did not end; the log did, and
        a log whose step never ended was cut off (its meta line's `ended` says how, when it
        was recorded)."""
        s = self.summary
        text = f"no end: the {'log' if s['constructed'] else 'recording'} stops at {s['span_s']:.1f} s"
        if s.get("open_step") is not None:
            text += f", in step {s['open_step']}"
        said = [f"{s['done']} of {s['requests']} requests answered"] if s.get("requests") else []
        if (s.get("meta") or {}).get("ended"):
            said.append(str(s["meta"]["ended"]))
        return text + (f" ({'; '.join(said)})" if said else "")

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
            lines += [f"  the stall from {row.start_s:.1f} s has {self.log_end()}"
                      for row in self.stalls.itertuples() if math.isnan(row.end_s)]
        lines += ["", "decisions:", self.decisions.to_string(index=False) if len(self.decisions) else "  none"]
        if s.get("stopped_at_s") is not None:
            lines.append(f"the policy stopped the run at {s['stopped_at_s']:.1f} s: the log after it "
                         f"is counted above, and decided on no further")
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
    if not read.events and read.bad_lines:
        raise ValueError(f"{log_path}: not a client log (none of its {read.bad_lines} lines is an "
                         f"event, a JSON object with t and event); pass the client.jsonl that a "
                         f"run with --rollout-mode http wrote")
    dog = Watchdog(burst_gap=burst_gap, stall_s=stall_s, policy=policy, open_limit=open_limit)
    statuses = dog.statuses
    seconds: Counter = Counter()
    other: Counter = Counter()
    done: Counter = Counter()
    started, ended, requests = [], set(), 0
    for e in read.events:
        dog.observe(e)
        if e["event"] == "step_start":
            started.append(e.get("step"))
            requests += int(e.get("requests") or 0)
        elif e["event"] == "step_end":
            ended.add(e.get("step"))
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
    decisions, stopped_at = _until_stop(dog.decision_table())
    summary = {
        "log": log_path.name, "constructed": bool(read.meta.get("constructed", False)),
        "meta": read.meta, "events": len(read.events), "lines_503": int(sum(seconds.values())),
        "other_fails": c["fail"] - int(sum(seconds.values())), "done": c["done"],
        "gave_up": c["gave_up"], "steps": c["step_start"], "span_s": round(span, 3),
        "bad_lines": read.bad_lines, "out_of_order": read.out_of_order, "unknown": read.unknown,
        "bad_examples": read.bad_examples, "burst_gap": burst_gap, "stall_s": stall_s,
        "policy": dataclasses.asdict(policy), "stopped_at_s": stopped_at,
        "requests": requests,  # over the steps the log started
        "open_step": next((step for step in reversed(started) if step not in ended), None),
    }
    return ReplayResult(dog.burst_table(), dog.stall_table(), decisions, per_second, summary)


def _until_stop(decisions: pd.DataFrame) -> tuple[pd.DataFrame, float | None]:
    """The decisions up to the policy's first stop (the run ends there), and when it came."""
    stops = decisions.index[decisions["action"] == "stop"]
    if not len(stops):
        return decisions, None
    first = decisions.index.get_loc(stops[0])
    return decisions.iloc[:first + 1], float(decisions["t_s"].iat[first])


# ---------------------------------------------------------------------- the timeline
MARKS = {"lower": ("v", "tab:orange"), "restore": ("^", "tab:green"),
         "stall": ("x", "tab:purple"), "stop": ("X", "tab:red")}


def timeline(result: ReplayResult, out_dir: Path | None = None, name: str | None = None):
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
