"""Run folders and miles logs read into one tidy frame: one row per run and step.

The gains, costs, table and figures of the group-size lesson all start from this frame.
Each row carries the run's config columns (group size, prompts, global batch, seed, model,
engine, lr), where it came from, every metric the run logged (labkit.run.metrics names), and
heat columns: ``heat_pause_s`` (seconds of heat.jsonl pauses inside the step), ``clean``
(no heat pause touched the rollout: a GPU that pauses to cool makes a rollout look slow)
and ``heat_guard`` (the run logged heat/clean). A run that logged no `heat/clean` (made
before the heat guard) counts its steps as clean unless its heat.jsonl records a pause.

Runs come from labkit run folders (see labkit.run.log) or from miles logs (labkit.miles.log).

A run whose name contains "constructed" is made up (a lesson's exercise needs, say, a run
with heat pauses, and none of ours had one). It is never read as a measurement by accident:
`load_runs` leaves such runs out, saying so, unless asked with `constructed=True`, and the
comparisons refuse to mix one with real runs (labkit.analysis.gains.refuse_mixed_settings).
"""

from __future__ import annotations

import json
import os
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from labkit.errors import LabkitError, RunLogError
from labkit.run.log import CONFIG, HEAT, METRICS, STATUS, file_there, read_bytes, read_jsonl
from labkit.run.metrics import STEP

REWARD = "rollout/raw_reward"
RIGHT = "rollout/right_frac"  # the share of answers that got the full reward: the right ones
ROLLOUT_TIME = "perf/rollout_time"
TOKENS = "rollout/tokens"
RESPONSE_LEN = "rollout/response_len/mean"
ZERO_STD = "rollout/zero_std/frac_groups"
HEAT_CLEAN = "heat/clean"

MILES_LOG = "miles.log"  # a folder holding it is a miles run (labkit launch --backend miles)
MILES_INFO = "labkit_miles.json"  # ... and this, when labkit wrote its script, holds the config

# tidy column -> the RunConfig field it is read from
CONFIG_COLUMNS = {
    "group_size": "n_samples_per_prompt",
    "prompts": "rollout_batch_size",
    "global_batch": "global_batch_size",
    "seed": "seed",
    "model": "model",
    "engine": "engine",
    "lr": "lr",
    "planned_steps": "num_rollout",  # the steps it was launched for (a stopped run has fewer)
}
# per-step metrics that stand in when a config lacks the field
METRIC_FALLBACK = {"group_size": "rollout/n_samples_per_prompt", "prompts": "rollout/n_prompts"}
CONSTRUCTED = "constructed"  # in a run's name: made up, not measured
# status.json reasons of a run that ended before its last step (labkit.lifecycle), and the
# words said after "stopped after step N"; "error" is said as "failed after step N"
STOPPED = {"signal": "", "interrupted": "", "requested": "", "time_limit": " (time limit)",
           "error": ""}

PathLike = str | os.PathLike
Runs = pd.DataFrame | PathLike | Sequence[PathLike]


class AnalysisError(LabkitError, ValueError):
    """Runs that cannot be read or compared as asked; the message names the run and the fix."""

    exit_code = 2


def is_constructed(name: str) -> bool:
    """True for a made-up run: its name (or folder name) contains "constructed"."""
    return CONSTRUCTED in str(name).lower()


def load_runs(paths: PathLike | Sequence[PathLike], *, constructed: bool = False) -> pd.DataFrame:
    """Read run folders and miles logs into one tidy frame, one row per run and step.

    `paths`: a path or a list of them; each is a run folder, a folder searched for run
    folders (like ``data/runs``), or a miles log: a file, or a folder holding miles.log
    (read by `labkit.miles.log.read_miles_log`). A file that is neither (``README.md``) is
    skipped with a warning, and so is a copy of a run folder already read (the same config
    and first step line): a copied run is one run, not two seeds. Constructed runs (made up;
    their name says "constructed") are left out with a line on stderr, unless `constructed`.
    Columns: ``run, group_size, prompts, global_batch, seed, model, engine, lr, planned_steps
    (the config's --num-rollout), source, path, status`` (status.json's reason: see
    `status_text`), the step key ``rollout/step``, every logged metric, and ``heat_pause_s`` (seconds
    of heat.jsonl pauses inside the step), ``clean`` (no pause touched the rollout),
    ``heat_guard`` (the run logged heat/clean). Rows are sorted by group size, run, step.
    """
    frames, names, made_up, copies = [], set(), [], {}
    for path, explicit in find_sources(paths):
        miles = path.is_file() or _is_miles_folder(path)
        if not miles and _is_copy(path, copies):
            continue
        try:
            frame = _read_miles(path) if miles else _read_run_folder(path, explicit)
        except (ValueError, OSError) as e:  # AnalysisError too
            if isinstance(e, UnicodeDecodeError) and not path.is_file():  # train_args.txt, say
                raise AnalysisError(f"{path}: a file in it is not text ({_why_not_text(e)}); "
                                    f"restore it, or leave {path} out") from None
            if not path.is_file():
                raise
            warnings.warn(f"skipped {path}: not a run folder or a miles log ({e})", stacklevel=2)
            continue
        if frame is None:
            continue
        name = frame["run"].iat[0]
        if not constructed and (is_constructed(name) or is_constructed(path.name)):
            made_up.append(name)
            continue
        if name in names:  # two folders with one name: say which parent each came from
            name = f"{path.parent.name}/{name}"
            frame["run"] = name
        if name in names:
            raise AnalysisError(f"two runs are both named {name!r} ({path}); rename one folder")
        names.add(name)
        frames.append(frame)
    if made_up:
        print(f"left out: constructed run {', '.join(made_up)} (made up, not measured; "
              f"load_runs(..., constructed=True) reads it)", file=sys.stderr)
    if not frames:
        raise AnalysisError(f"no run with a finished step in {_show(paths)}"
                            + (" but constructed ones; pass constructed=True to read them"
                               if made_up else ""))
    runs = pd.concat(frames, ignore_index=True)
    return runs.sort_values(["group_size", "run", STEP], kind="stable", ignore_index=True)


def with_steps(runs: Sequence) -> list[Path]:
    """The folders of `runs` (Run objects, as labkit.launch_many returns, or run folders) that
    have logged a step, in order; a line on stderr for each left out (a run stopped before
    its first step: launching it again with resume continues it). AnalysisError when none
    has: there is nothing to read yet."""
    kept, left_out = [], []
    for run in runs:
        folder = Path(getattr(run, "dir", run))
        rows, _ = read_jsonl(folder / METRICS)
        (kept if rows else left_out).append(folder)
    for folder in left_out:
        print(f"left out: run {folder.name} has no finished step yet (it stopped before its "
              f"first; launched again with resume=True it continues)", file=sys.stderr)
    if not kept:
        raise AnalysisError("no run has a finished step yet; run the cell that launched them "
                            "again (with resume=True it continues them)")
    return kept


def _is_copy(path: Path, seen: dict) -> bool:
    """True (with a warning) when `path` is a copy of a run folder already read: the same
    config (but its name and folder) and the same first step line, start time included."""
    try:
        config = json.loads((path / CONFIG).read_text()) if (path / CONFIG).is_file() else {}
        with open(path / METRICS) as f:
            first = json.loads(f.readline() or "null")
    except (OSError, ValueError):
        return False
    if not isinstance(config, dict) or first is None:
        return False
    config = {k: v for k, v in config.items() if k not in ("run_name", "output_dir")}
    key = json.dumps([config, first], sort_keys=True, default=str)
    if key in seen:
        warnings.warn(f"{path} is a copy of {seen[key]} (the same config and the same first "
                      f"step, to the second); it is read once, not as another seed", stacklevel=3)
        return True
    seen[key] = path
    return False


def find_sources(paths: PathLike | Sequence[PathLike]) -> list[tuple[Path, bool]]:
    """The run folders and log files that `paths` names, as (path, named_directly) pairs.

    A run folder (it holds config.json or metrics.jsonl), a miles run folder (miles.log) and
    a file are taken as they are; any other folder is searched, not inside the run folders it
    holds, hidden ones skipped.
    Raises AnalysisError for a path that does not exist or a folder that holds no run.
    """
    items = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
    if not items:
        raise AnalysisError("no path given; name run folders or a folder of them, e.g. data/runs")
    found: list[tuple[Path, bool]] = []
    for item in map(Path, items):
        if not item.exists():
            raise AnalysisError(f"{item} does not exist; name a run folder or a folder of them")
        if item.is_file() and item.name in (CONFIG, METRICS) and _is_run_folder(item.parent):
            item = item.parent  # a file of a run folder means its folder
        if item.is_file() or _is_run_folder(item) or _is_miles_folder(item):
            found.append((item, True))
            continue
        inside = _search_run_folders(item)
        if not inside:
            problem = (f"{item} holds no run folder (none below it has {CONFIG}, {METRICS} or "
                       f"{MILES_LOG})")
            if len(items) > 1:  # `labkit compare data/runs/*` names the figures folder too
                warnings.warn(f"skipped {problem}", stacklevel=3)
                continue
            raise AnalysisError(f"{problem}; name a run folder, a folder of them, or a miles log")
        found += [(p, False) for p in inside]
    unique, seen = [], set()
    for path, explicit in found:
        key = path.resolve()
        if key in seen:
            warnings.warn(f"{path} was named twice; it is read once", stacklevel=3)
            continue
        seen.add(key)
        unique.append((path, explicit))
    return unique


def _is_run_folder(path: Path) -> bool:
    return path.is_dir() and ((path / CONFIG).is_file() or (path / METRICS).is_file())


def _is_miles_folder(path: Path) -> bool:
    return path.is_dir() and (path / MILES_LOG).is_file() and not _is_run_folder(path)


def _search_run_folders(top: Path) -> list[Path]:
    found = []
    for root, dirs, _ in os.walk(top):
        if _is_run_folder(Path(root)) or _is_miles_folder(Path(root)):
            found.append(Path(root))
            dirs[:] = []  # a run folder's checkpoint/ holds a model config.json, not a run
        else:
            dirs[:] = sorted(d for d in dirs if not d.startswith("."))
    return found


def _read_run_folder(path: Path, explicit: bool) -> pd.DataFrame | None:
    """One labkit run folder as tidy rows; None (with a warning) for a run found by search
    that has no finished step yet."""
    rows, bad = _text_rows(path / METRICS)
    if bad:
        warnings.warn(
            f"run {path.name}: skipped {bad} unreadable line(s) of {path / METRICS} "
            f"(a truncated last line means the run stopped while writing it)",
            stacklevel=4,
        )
    if not rows:
        problem = f"run {path.name} has no finished step ({path / METRICS} is missing or empty)"
        if explicit:
            raise AnalysisError(f"{problem}; wait for its first step or leave it out")
        warnings.warn(f"{problem}; skipped", stacklevel=4)
        return None
    config = _read_json(path / CONFIG)
    pauses, _ = _text_rows(path / HEAT)
    return _tidy(
        pd.DataFrame(rows), config, name=str(config.get("run_name") or path.name), path=path,
        source="labkit", status=_read_json(path / STATUS).get("reason"), pauses=pauses,
    )


def _read_json(path: Path) -> dict:
    """A run's JSON file as a dict ({} when it is not there). One that is there but cannot be
    read (a link that loops, a folder in its place, not text, not JSON) is an AnalysisError
    naming it and what is wrong, never read as missing."""
    try:
        if not file_there(path):
            return {}
        return json.loads(read_bytes(path).decode("utf-8"))
    except RunLogError as e:
        raise AnalysisError(str(e)) from None
    except UnicodeDecodeError as e:
        raise AnalysisError(_not_text(path, e)) from None
    except json.JSONDecodeError as e:
        raise AnalysisError(f"{path} is not valid JSON ({e}); restore it from the run's launch") from e


def _text_rows(path: Path) -> tuple[list[dict], int]:
    """A run's JSONL file as rows (labkit.run.log.read_jsonl); one that is not text (a binary
    file in its place) is an AnalysisError naming it."""
    try:
        return read_jsonl(path)
    except UnicodeDecodeError as e:
        raise AnalysisError(_not_text(path, e)) from None


def _not_text(path: Path, e: UnicodeDecodeError) -> str:
    return (f"{path} is not text ({_why_not_text(e)}): a binary file in a run folder's place; "
            f"restore it from the run, or leave the run out")


def _why_not_text(e: UnicodeDecodeError) -> str:
    return f"byte {e.start} is {e.object[e.start:e.start + 1]!r}, not UTF-8"


def _read_miles(path: Path) -> pd.DataFrame:
    """A miles log (a file, or a folder holding miles.log) as tidy rows, via labkit.miles.log.

    Config values the log lacks (model, lr) come from labkit_miles.json beside it, when
    labkit wrote the run's script; the engine is "miles".
    """
    try:
        from labkit.miles.log import read_miles_log  # only miles logs need the parser
    except ImportError as e:
        raise AnalysisError(
            f"{path} is not a labkit run folder, so it is read as a miles log, but "
            f"labkit.miles.log cannot be imported ({e}); name a labkit run folder instead"
        ) from e
    steps = read_miles_log(path)
    if steps is None or len(steps) == 0:
        raise AnalysisError(f"{path}: no step found in this miles log (is it a miles training log?)")
    folder = path if path.is_dir() else path.parent
    config = {**_read_json(folder / MILES_INFO).get("config", {}), "engine": "miles"}
    config.pop("run_name", None)  # the folder's own name, from the log
    for col, key in [("run", "run_name"), *CONFIG_COLUMNS.items()]:
        for name in (col, key):  # the reader may use our column names or the RunConfig fields
            if name in steps and steps[name].notna().any():
                config[key] = steps[name].dropna().iat[0]
                break
    steps = steps.drop(columns=[c for c in [*CONFIG_COLUMNS, *CONFIG_COLUMNS.values(), "run",
                                            "run_name"] if c in steps])
    return _tidy(steps, config, name=str(config.get("run_name") or path.stem), path=path,
                 source="miles", status=None, pauses=[])


def _tidy(steps: pd.DataFrame, config: dict, *, name: str, path: Path, source: str,
          status: str | None, pauses: list[dict]) -> pd.DataFrame:
    """Check one run's step rows, add its heat columns and put its config columns in front."""
    if STEP not in steps or steps[STEP].isna().any():
        raise AnalysisError(f"run {name}: a step line in {path} has no {STEP!r} (the step key)")
    steps = steps.copy()
    steps[STEP] = steps[STEP].astype(int)
    twice = sorted(steps.loc[steps[STEP].duplicated(), STEP].unique())
    if twice:
        raise AnalysisError(
            f"run {name}: step(s) {steps_text(twice)} appear more than once in {path}; a resumed "
            f"run must go on after its last logged step. Keep one line per step and load again"
        )
    steps = steps.sort_values(STEP, ignore_index=True)
    steps["heat_pause_s"] = _pause_seconds(steps, pauses)
    steps["clean"], guard = _clean_flags(steps)
    steps["heat_guard"] = guard
    head = {"run": name}
    for col, key in CONFIG_COLUMNS.items():
        value = config.get(key)
        fallback = METRIC_FALLBACK.get(col)
        if value is None and fallback in steps and steps[fallback].notna().any():
            value = steps[fallback].dropna().iat[0]
        head[col] = value
    if head["group_size"] is None:
        raise AnalysisError(
            f"run {name}: unknown group size; {path} records no n_samples_per_prompt (in "
            f"config.json, or train_args.txt beside a miles log) and no "
            f"{METRIC_FALLBACK['group_size']} per step"
        )
    for col in ("group_size", "prompts", "global_batch", "seed", "planned_steps"):
        head[col] = None if head[col] is None else int(head[col])
    head.update(source=source, path=str(path), status=status)
    front = pd.DataFrame({k: [v] * len(steps) for k, v in head.items()})
    return pd.concat([front, steps.drop(columns=[c for c in head if c in steps])], axis=1)


def _pause_seconds(steps: pd.DataFrame, pauses: list[dict]) -> np.ndarray:
    """Seconds of heat pauses inside each step: by time overlap with [time/start, time/end]
    when both sides have times, else the pauses whose `step` is the step."""
    if not pauses:
        return np.zeros(len(steps))

    def field_of(key: str) -> np.ndarray:
        return np.array([np.nan if p.get(key) is None else p[key] for p in pauses], float)

    p_start, p_end, p_step, p_sec = (field_of(k) for k in ("start", "end", "step", "seconds"))
    p_sec = np.where(np.isnan(p_sec), p_end - p_start, p_sec)
    nan = np.full(len(steps), np.nan)
    s_start = steps["time/start"].to_numpy(float) if "time/start" in steps else nan
    s_end = steps["time/end"].to_numpy(float) if "time/end" in steps else nan
    timed = ~np.isnan(s_start)[:, None] & ~np.isnan(s_end)[:, None] & ~np.isnan(p_start + p_end)
    overlap = np.minimum(s_end[:, None], p_end) - np.maximum(s_start[:, None], p_start)
    same_step = steps[STEP].to_numpy()[:, None] == p_step
    seconds = np.where(timed, np.clip(np.nan_to_num(overlap), 0, None),
                       np.where(same_step, np.nan_to_num(p_sec), 0.0))
    return seconds.sum(axis=1)


def _clean_flags(steps: pd.DataFrame) -> tuple[np.ndarray, bool]:
    """(clean per step, whether heat/clean was logged): heat/clean where logged, else no
    recorded pause inside the step."""
    no_pause = steps["heat_pause_s"].to_numpy() == 0
    if HEAT_CLEAN not in steps:
        return no_pause, False
    logged = steps[HEAT_CLEAN]
    flags = [bool(v) if pd.notna(v) else ok for v, ok in zip(logged, no_pause)]
    return np.array(flags, bool), bool(logged.notna().any())


def as_runs(runs: Runs) -> pd.DataFrame:
    """A tidy frame from `load_runs`, or paths to load into one."""
    if isinstance(runs, pd.DataFrame):
        missing = {"run", "group_size", STEP} - set(runs.columns)
        if missing:
            raise AnalysisError(f"this frame lacks {sorted(missing)}; make it with load_runs(paths)")
        if runs.empty:
            raise AnalysisError("the runs frame is empty; load_runs(paths) found no step")
        return runs
    return load_runs(runs)


def is_stopped(run: pd.DataFrame) -> bool:
    """True for one run's rows when the run ended before its last step: its status.json says
    it was stopped (a signal, the ■ button, its time limit) or failed, and it logged fewer
    steps than it was launched for (planned_steps, when known: a stop after the last step,
    in the final evaluation, leaves every step there). A run still going, or a miles log,
    has no status, and is not called stopped."""
    if "status" not in run or run["status"].iat[0] not in STOPPED:
        return False
    planned = run["planned_steps"].iat[0] if "planned_steps" in run else None
    return planned is None or pd.isna(planned) or int(run[STEP].max()) + 1 < int(planned)


def status_text(run: pd.DataFrame) -> str:
    """How one run's rows ended, in words: "completed", "stopped after step 1", "stopped after
    step 6 (time limit)", "failed after step 21", or "no status after step 3" (a run still
    going, one killed before it could write its status, a miles log). The step is the last
    one logged."""
    reason = run["status"].iat[0] if "status" in run else None
    last = int(run[STEP].max())
    if reason == "completed":
        return "completed"
    if reason == "error":
        return f"failed after step {last}"
    if reason in STOPPED:
        return f"stopped after step {last}{STOPPED[reason]}"
    return f"no status after step {last}" if reason is None or pd.isna(reason) else \
        f"{reason} after step {last}"


def metric_values(run: pd.DataFrame, column: str) -> pd.Series:
    """A metric column as numbers (NaN where not logged), or all NaN when no step logged it."""
    if column not in run:
        return pd.Series(np.nan, index=run.index)
    return pd.to_numeric(run[column], errors="coerce")


def steps_text(steps: Sequence[int]) -> str:
    return ", ".join(str(int(s)) for s in steps)


def _show(paths) -> str:
    items = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
    return ", ".join(str(p) for p in items)
