"""A constructed run with heat pauses, made from a real run, for exercise 1.3.3.

None of our GPU runs paused for heat (the hottest reading was 58 C), so every shipped step
is clean and "the steps clean in both runs" would be every step. The exercise needs a run
where a pause touched some rollouts. This module makes one from a real run, and says so
everywhere: the folder's name contains "constructed" (load_runs leaves it out unless asked,
and the comparisons refuse to mix it with real runs), its config.json carries a `note`, and
a README.md sits beside the logs. Nothing in it is a measurement of a pause.

What changes from the real run: on the steps of PAUSES, a pause of that many seconds is put
inside the rollout (as the heat guard does between generation batches), so the step's
`heat/clean` is false, its rollout and step times grow by the pause (and its tokens per
second drop), `heat/max_temp_c` reads hot, heat.jsonl records the pause, and every later
step starts that much later. Rewards and
everything else are the real run's. The samples are not copied.

    from labkit.course.paused_run import write_paused_run
    write_paused_run("data/runs")      # writes data/runs/constructed-heat-n8-lr1e-6-s2
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from labkit.run.log import CONFIG, HEAT, METRICS, STATUS, read_jsonl
from labkit.run.metrics import STEP

SOURCE = "n8-lr1e-6-s2"  # the real run it is made from
NAME = f"constructed-heat-{SOURCE}"
# step -> seconds of the made-up pause inside its rollout
PAUSES = {4: 35.0, 5: 62.0, 11: 48.0, 12: 71.0, 13: 40.0, 18: 55.0, 21: 38.0}
PAUSE_AFTER_S = 2.0  # into the rollout: after the first generation batch
PEAK_C = {4: 86.0, 5: 88.0, 11: 86.0, 12: 89.0, 13: 87.0, 18: 87.0, 21: 86.0}
NOTE = (f"CONSTRUCTED, not measured: the real run {SOURCE} with made-up heat pauses inside the "
        f"rollouts of steps {', '.join(map(str, PAUSES))}, for exercise 1.3.3 "
        f"(labkit.course.paused_run). No run of ours paused for heat.")


def write_paused_run(runs_dir: str | Path, out_dir: str | Path | None = None) -> Path:
    """Write the constructed run from `runs_dir`/SOURCE into `out_dir` (default: runs_dir)/NAME,
    replacing what is there; returns the folder."""
    src = Path(runs_dir) / SOURCE
    dest = Path(out_dir or runs_dir) / NAME
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    config = json.loads((src / CONFIG).read_text())
    config.update(run_name=NAME, note=NOTE)
    _write_json(dest / CONFIG, config)
    steps, _ = read_jsonl(src / METRICS)
    steps, pauses = _with_pauses(steps)
    _write_lines(dest / METRICS, steps)
    _write_lines(dest / HEAT, pauses)
    shutil.copyfile(src / STATUS, dest / STATUS)
    (dest / "README.md").write_text(f"# {NAME}\n\n{NOTE}\n\nWritten by `write_paused_run` "
                                    f"from `{SOURCE}`; see `labkit/course/paused_run.py`.\n")
    return dest


def _with_pauses(steps: list[dict]) -> tuple[list[dict], list[dict]]:
    """The steps with PAUSES put into their rollouts, later steps shifted; and the pause rows."""
    out, pauses, shift = [], [], 0.0
    for row in steps:
        row = dict(row)
        row["time/start"] += shift
        pause = PAUSES.get(int(row[STEP]))
        if pause:
            start = row["time/start"] + PAUSE_AFTER_S
            pauses.append({"start": start, "end": start + pause, "seconds": pause,
                           "peak_c": PEAK_C[int(row[STEP])], "step": int(row[STEP])})
            row.update({"heat/clean": False, "heat/pause_time": pause,
                        "heat/max_temp_c": PEAK_C[int(row[STEP])],
                        "perf/rollout_time": row["perf/rollout_time"] + pause,
                        "perf/step_time": row["perf/step_time"] + pause})
            row["perf/tokens_per_s"] = row["rollout/tokens"] / row["perf/rollout_time"]
            shift += pause
        row["time/end"] += shift
        out.append(row)
    return out, pauses


def _write_json(path: Path, obj: dict) -> None:
    path.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n")


def _write_lines(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in rows))
