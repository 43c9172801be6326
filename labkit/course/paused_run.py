"""Two constructed runs with heat pauses, made from real runs, for exercise 1.3.3.

None of our GPU runs paused for heat (the hottest reading was 58 C), so every shipped step
is clean and "the steps clean in both runs" would be every step. The exercise needs two runs
where pauses touched some rollouts, and both of them: with one run clean throughout, the
clean steps of the other alone are the right answer too, and a wrong method passes. This
module makes them from real runs, with pauses on steps that partly overlap, and says so
everywhere: each folder's name contains "constructed" (load_runs leaves it out unless asked,
and the comparisons refuse to mix it with real runs), its config.json carries a `note`, and
a README.md sits beside the logs. Nothing in them is a measurement of a pause.

What changes from the real run: on the steps of its PAUSES, a pause of that many seconds is
put inside the rollout (as the heat guard does between generation batches), so the step's
`heat/clean` is false, its rollout and step times grow by the pause (and its tokens per
second drop), `heat/max_temp_c` reads hot, heat.jsonl records the pause, and every later
step starts that much later. Rewards and everything else are the real run's. The samples
are not copied.

    from labkit.course.paused_run import write_paused_runs
    write_paused_runs("data/runs")   # writes data/runs/constructed-heat-n8-lr1e-6-s2 and -n16-
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from labkit.run.log import CONFIG, HEAT, METRICS, STATUS, read_jsonl
from labkit.run.metrics import STEP

# the real run each is made from -> {step: (seconds of the made-up pause in its rollout, peak C)}
PAUSES: dict[str, dict[int, tuple[float, float]]] = {
    "n8-lr1e-6-s2": {4: (35.0, 86.0), 5: (62.0, 88.0), 11: (48.0, 86.0), 12: (71.0, 89.0),
                     13: (40.0, 87.0), 18: (55.0, 87.0), 21: (38.0, 86.0)},
    "n16-lr1e-6-s2": {2: (44.0, 87.0), 5: (58.0, 88.0), 9: (36.0, 86.0), 13: (66.0, 89.0),
                      16: (41.0, 86.0), 21: (52.0, 87.0)},
}
SOURCE, SECOND = PAUSES  # exercise 1.3.3's runs A and B are made from these
PAUSE_AFTER_S = 2.0  # into the rollout: after the first generation batch


def name_of(source: str) -> str:
    """The constructed run's name (and folder) for the real run `source`."""
    return f"constructed-heat-{source}"


NAME = name_of(SOURCE)
NAMES = [name_of(source) for source in PAUSES]


def note(source: str) -> str:
    """What the constructed run made from `source` is, for its config.json and README.md."""
    return (f"CONSTRUCTED, not measured: the real run {source} with made-up heat pauses inside "
            f"the rollouts of steps {', '.join(map(str, PAUSES[source]))}, for exercise 1.3.3 "
            f"(labkit.course.paused_run). No run of ours paused for heat.")


def write_paused_runs(runs_dir: str | Path, out_dir: str | Path | None = None) -> list[Path]:
    """Write every constructed run of PAUSES (write_paused_run); returns their folders."""
    return [write_paused_run(runs_dir, out_dir, source=source) for source in PAUSES]


def write_paused_run(runs_dir: str | Path, out_dir: str | Path | None = None, *,
                     source: str = SOURCE) -> Path:
    """Write the constructed run of `runs_dir`/`source` into `out_dir` (default: runs_dir)/
    name_of(source), replacing what is there; returns the folder."""
    src = Path(runs_dir) / source
    name = name_of(source)
    dest = Path(out_dir or runs_dir) / name
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    config = json.loads((src / CONFIG).read_text())
    config.update(run_name=name, note=note(source))
    _write_json(dest / CONFIG, config)
    steps, _ = read_jsonl(src / METRICS)
    steps, pauses = _with_pauses(steps, PAUSES[source])
    _write_lines(dest / METRICS, steps)
    _write_lines(dest / HEAT, pauses)
    shutil.copyfile(src / STATUS, dest / STATUS)
    (dest / "README.md").write_text(f"# {name}\n\n{note(source)}\n\nWritten by `write_paused_run` "
                                    f"from `{source}`; see `labkit/course/paused_run.py`.\n")
    return dest


def _with_pauses(steps: list[dict], made_up: dict[int, tuple[float, float]]
                 ) -> tuple[list[dict], list[dict]]:
    """The steps with the `made_up` pauses put into their rollouts, later steps shifted; and
    the pause rows."""
    out, pauses, shift = [], [], 0.0
    for row in steps:
        row = dict(row)
        row["time/start"] += shift
        step = int(row[STEP])
        if step in made_up:
            pause, peak = made_up[step]
            start = row["time/start"] + PAUSE_AFTER_S
            pauses.append({"start": start, "end": start + pause, "seconds": pause,
                           "peak_c": peak, "step": step})
            row.update({"heat/clean": False, "heat/pause_time": pause, "heat/max_temp_c": peak,
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
