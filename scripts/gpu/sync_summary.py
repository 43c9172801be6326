"""One HTTP run's weight syncs and rollouts, in a few lines (http_run.sh writes it per run).

Reads the run folder's client.jsonl (`sync` lines: every sync, the one at start included)
and metrics.jsonl (per step), and prints where the weights file went, each part of a sync
(gathering the tensors, the file, the engines' loads, the slowest engine's own load and its
read of the file) as medians over the syncs, and the median rollout; with --baseline (a
colocated run's folder) the rollout's ratio to it.

    python scripts/gpu/sync_summary.py RUN_FOLDER [--baseline COLOCATED_RUN_FOLDER]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path


def lines(path: Path) -> list[dict]:
    """The JSON objects of a JSON-lines file; a line cut short is skipped."""
    rows = []
    if path.exists():
        for raw in path.read_text(errors="replace").splitlines():
            try:
                row = json.loads(raw)
            except ValueError:
                continue
            if isinstance(row, dict):
                rows.append(row)
    return rows


def median(rows: list[dict], key: str) -> float | None:
    values = [float(r[key]) for r in rows if isinstance(r.get(key), (int, float))]
    return statistics.median(values) if values else None


def summary(run: Path, baseline: Path | None = None) -> list[str]:
    syncs = [e for e in lines(run / "client.jsonl") if e.get("event") == "sync"]
    steps = lines(run / "metrics.jsonl")
    out = [f"{run.name}: {len(syncs)} syncs, {len(steps)} steps"]
    if syncs:
        kinds = sorted({f"{e.get('folder')} ({e.get('kind')})" for e in syncs})
        engine = [{"s": max(e.get("engine_s", {}).values(), default=None),
                   "read": max(e.get("engine_read_s", {}).values(), default=None)} for e in syncs]
        parts = {k: median(syncs, k) for k in ("write_s", "gather_s", "file_s", "load_s")}
        whole = median([{"s": e.get("write_s", 0) + e.get("load_s", 0)} for e in syncs], "s")
        out.append(f"  file through {', '.join(kinds)}, {syncs[-1].get('bytes', 0) / 2**30:.2f} GiB, "
                   f"{syncs[-1].get('tensors')} tensors")
        out.append("  median s: sync " + f"{whole:.3f} = write {parts['write_s']:.3f} (gather "
                   f"{parts['gather_s'] or 0:.3f}, file {parts['file_s'] or 0:.3f}) + load "
                   f"{parts['load_s']:.3f}")
        e_s, e_read = median(engine, "s"), median(engine, "read")
        if e_s is not None:
            out.append(f"  slowest engine's own load {e_s:.3f} s (reading the file {e_read or 0:.3f} s)")
    per_step = {k: median(steps, f"client/weights_{k}_time") for k in ("write", "gather", "file", "load", "engine")}
    if any(v is not None for v in per_step.values()):
        out.append("  per step (metrics.jsonl), median s: " + ", ".join(
            f"{k} {v:.3f}" for k, v in per_step.items() if v is not None))
    roll = median(steps, "perf/rollout_time")
    if roll is not None:
        line = f"  median rollout {roll:.2f} s, update_weights {median(steps, 'perf/update_weights_time') or 0:.2f} s"
        base = median(lines(baseline / "metrics.jsonl"), "perf/rollout_time") if baseline else None
        if base:
            line += f"; {roll / base:.2f}x the colocated {baseline.name} ({base:.2f} s)"
        out.append(line)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("run", type=Path)
    p.add_argument("--baseline", type=Path, default=None)
    a = p.parse_args(argv)
    print("\n".join(summary(a.run, a.baseline)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
