"""Runs side by side: the reward gain and the rollout cost of each group size, from run folders.

The course asks two things of its group-size runs (section "Choose the group size"):

* Does the group size change how much the reward rises? The *gain* of a run is the mean
  reward of steps 16-23 minus that of steps 0-7. Seeds of one group size differ by as much
  as group sizes do, so a gain is read against the seed spread (min to max) of a reference
  group size (8 answers), not against zero: "inside one range" or not. A bootstrap over the
  steps of the two windows shows how noisy one run's gain is.
* What does it cost? The median `perf/rollout_time` over *clean* steps, those no heat pause
  touched: a GPU that pauses to cool (or throttles) makes a rollout look slow. Times are
  compared on the step numbers that are clean in every compared run.

Rule for the common clean steps: the intersection of the clean step numbers, within the
compared steps (0 to the end of the late window), of the runs that have at least one clean
step. A run with no clean step at all would empty the intersection for everyone, so it is
left out of it and shown with its all-steps median, labelled as including the pauses. A run
that logged no `heat/clean` (made before the heat guard) counts its steps as clean unless
its heat.jsonl records a pause inside them.

Runs come from labkit run folders (see labkit.runlog) or from miles logs (labkit.miles).
"""

from __future__ import annotations

import json
import os
import sys
import warnings
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence, Union

import numpy as np
import pandas as pd

from labkit.metrics import STEP
from labkit.runlog import CONFIG, HEAT, METRICS, STATUS, read_jsonl

REWARD = "rollout/raw_reward"
ROLLOUT_TIME = "perf/rollout_time"
TOKENS = "rollout/tokens"
RESPONSE_LEN = "rollout/response_len/mean"
ZERO_STD = "rollout/zero_std/frac_groups"
HEAT_CLEAN = "heat/clean"

EARLY = (0, 7)  # the course's windows: steps 0-7 and 16-23 of a 24-step run
LATE = (16, 23)
REFERENCE = 8  # the group size whose seeds give the range
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
}
# per-step metrics that stand in when a config lacks the field
METRIC_FALLBACK = {"group_size": "rollout/n_samples_per_prompt", "prompts": "rollout/n_prompts"}

PathLike = Union[str, os.PathLike]
Runs = Union[pd.DataFrame, PathLike, Sequence[PathLike]]


class AnalysisError(ValueError):
    """Runs that cannot be read or compared as asked; the message names the run and the fix."""


# ====================================================================== loading
def load_runs(paths: PathLike | Sequence[PathLike]) -> pd.DataFrame:
    """Read run folders and miles logs into one tidy frame, one row per run and step.

    `paths`: a path or a list of them; each is a run folder, a folder searched for run
    folders (like ``data/runs``), or a miles log: a file, or a folder holding miles.log
    (read by `labkit.miles.read_miles_log`).
    Columns: ``run, group_size, prompts, global_batch, seed, model, engine, lr, source, path,
    status``, the step key ``rollout/step``, every logged metric, and ``heat_pause_s`` (seconds
    of heat.jsonl pauses inside the step), ``clean`` (no pause touched the rollout),
    ``heat_guard`` (the run logged heat/clean). Rows are sorted by group size, run, step.
    """
    frames, names = [], set()
    for path, explicit in find_sources(paths):
        miles = path.is_file() or _is_miles_folder(path)
        frame = _read_miles(path) if miles else _read_run_folder(path, explicit)
        if frame is None:
            continue
        name = frame["run"].iat[0]
        if name in names:  # two folders with one name: say which parent each came from
            name = f"{path.parent.name}/{name}"
            frame["run"] = name
        if name in names:
            raise AnalysisError(f"two runs are both named {name!r} ({path}); rename one folder")
        names.add(name)
        frames.append(frame)
    if not frames:
        raise AnalysisError(f"no run with a finished step in {_show(paths)}")
    runs = pd.concat(frames, ignore_index=True)
    return runs.sort_values(["group_size", "run", STEP], kind="stable", ignore_index=True)


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
            raise AnalysisError(
                f"{item} holds no run folder (none below it has {CONFIG}, {METRICS} or "
                f"{MILES_LOG}); "
                f"name a run folder, a folder of them, or a miles log file"
            )
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
    rows, bad = read_jsonl(path / METRICS)
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
    pauses, _ = read_jsonl(path / HEAT)
    return _tidy(
        pd.DataFrame(rows), config, name=str(config.get("run_name") or path.name), path=path,
        source="labkit", status=_read_json(path / STATUS).get("reason"), pauses=pauses,
    )


def _read_json(path: Path) -> dict:
    if not path.exists():
        return {}
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise AnalysisError(f"{path} is not valid JSON ({e}); restore it from the run's launch") from e


def _read_miles(path: Path) -> pd.DataFrame:
    """A miles log (a file, or a folder holding miles.log) as tidy rows, via labkit.miles.

    Config values the log lacks (model, lr) come from labkit_miles.json beside it, when
    labkit wrote the run's script; the engine is "miles".
    """
    try:
        from labkit.miles import read_miles_log  # only miles logs need the parser
    except ImportError as e:
        raise AnalysisError(
            f"{path} is not a labkit run folder, so it is read as a miles log, but "
            f"labkit.miles cannot be imported ({e}); name a labkit run folder instead"
        ) from e
    steps = read_miles_log(path)
    if steps is None or len(steps) == 0:
        raise AnalysisError(f"{path}: no step found in this miles log (is it a miles training log?)")
    folder = path if path.is_dir() else path.parent
    config = {**_read_json(folder / MILES_INFO).get("config", {}), "engine": "miles"}
    config.pop("run_name", None)  # the folder's own name, from the log
    for col, key in [("run", "run_name"), *CONFIG_COLUMNS.items()]:
        for name in (col, key):  # miles.py may use our column names or the RunConfig fields
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
            f"run {name}: step(s) {_steps_text(twice)} appear more than once in {path}; a resumed "
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
    for col in ("group_size", "prompts", "global_batch", "seed"):
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


def check_comparable(runs: pd.DataFrame) -> list[str]:
    """Warn for each setting other than group size and seed that differs between runs.

    Also warns for a run whose global batch is not prompts x answers (then a rollout is not
    one optimizer step, as in the course). Returns the messages it warned with.
    """
    per_run = runs.groupby("run", sort=False).first()
    messages = []
    for col, what in [("prompts", "prompts per rollout (--rollout-batch-size)"),
                      ("model", "model (--model)"), ("engine", "engine (--engine)"),
                      ("lr", "learning rate (--lr)")]:
        values = per_run[col].dropna()
        if values.nunique() > 1:
            by = "; ".join(f"{v} in {', '.join(map(str, names))}"
                           for v, names in values.groupby(values).groups.items())
            messages.append(f"the runs differ in {what}: {by}. The table compares them as if "
                            f"only the group size changed; compare runs that share it")
    for name, r in per_run.iterrows():
        if pd.notna(r.global_batch) and pd.notna(r.prompts):
            samples = int(r.prompts) * int(r.group_size)
            if samples != int(r.global_batch):
                messages.append(
                    f"run {name}: --global-batch-size {int(r.global_batch)} is not {int(r.prompts)} "
                    f"prompts x {int(r.group_size)} answers = {samples}, so a rollout makes "
                    f"{samples / r.global_batch:g} optimizer steps, not one as in the course")
    for message in messages:
        warnings.warn(message, stacklevel=2)
    return messages


# ====================================================================== the gain
def _check_window(window: tuple[int, int], name: str) -> tuple[int, int]:
    a, b = (int(x) for x in window)
    if not 0 <= a <= b:
        raise AnalysisError(f"{name}={window}: a window is (first step, last step) with 0 <= first <= last")
    return a, b


def window_rewards(run: pd.DataFrame, window: tuple[int, int]) -> np.ndarray:
    """The mean reward of each step first..last of one run's rows (`window` = (first, last)).

    Refuses (AnalysisError naming the run) a run without rewards, one too short for the
    window, or one missing a step of it: the gain is never a silent NaN.
    """
    name = run["run"].iat[0]
    a, b = window
    if REWARD not in run or run[REWARD].isna().all():
        keys = [c for c in run.columns if "/" in c][:8]
        raise AnalysisError(f"run {name} logged no {REWARD}, so it has no gain "
                            f"(its steps have {', '.join(keys) or 'no metric'})")
    first, last = int(run[STEP].min()), int(run[STEP].max())
    if last < b or first > a:
        raise AnalysisError(
            f"run {name} has steps {first} to {last}, too short for the window {a}-{b}; let it "
            f"finish, or pass early= and late= windows inside steps {first}-{last}")
    inside = run[(run[STEP] >= a) & (run[STEP] <= b)]
    rewards = pd.to_numeric(inside[REWARD], errors="coerce")
    missing = sorted(set(range(a, b + 1)) - set(inside.loc[rewards.notna(), STEP]))
    if missing:
        raise AnalysisError(f"run {name} has no reward for step(s) {_steps_text(missing)} of the "
                            f"window {a}-{b}; the gain needs every step of both windows")
    return rewards.to_numpy(float)


def bootstrap_gain(windows: list[tuple[np.ndarray, np.ndarray]], rng: np.random.Generator,
                   *, n_boot: int = 2000, ci: float = 0.95) -> tuple[float, float]:
    """Percentile interval of the mean gain over `windows` ((early, late) rewards, one pair
    per seed), resampling the steps of each window with replacement `n_boot` times."""
    gains = np.zeros(n_boot)
    for early, late in windows:
        gains += _resampled_means(late, rng, n_boot) - _resampled_means(early, rng, n_boot)
    low, high = np.quantile(gains / len(windows), [(1 - ci) / 2, (1 + ci) / 2])
    return float(low), float(high)


def _resampled_means(x: np.ndarray, rng: np.random.Generator, n_boot: int) -> np.ndarray:
    return x[rng.integers(0, len(x), size=(n_boot, len(x)))].mean(axis=1)


def _windows(runs: pd.DataFrame, early, late) -> list[tuple[pd.Series, np.ndarray, np.ndarray]]:
    early, late = _check_window(early, "early"), _check_window(late, "late")
    return [(run.iloc[0], window_rewards(run, early), window_rewards(run, late))
            for _, run in runs.groupby("run", sort=False)]


def run_gains(runs: Runs, *, early=EARLY, late=LATE, n_boot: int = 2000, ci: float = 0.95,
              seed: int = 0) -> pd.DataFrame:
    """Each run's gain, mean reward of `late` minus that of `early` (steps, inclusive).

    Returns one row per run: run, group_size, seed, early_mean, late_mean, gain, ci_low,
    ci_high (bootstrap over the steps of the windows; seeded by `seed` and the run name,
    so the same runs always give the same interval).
    """
    rows = []
    for head, early_r, late_r in _windows(as_runs(runs), early, late):
        rng = np.random.default_rng([seed, zlib.crc32(str(head.run).encode())])
        low, high = bootstrap_gain([(early_r, late_r)], rng, n_boot=n_boot, ci=ci)
        rows.append(dict(run=head.run, group_size=int(head.group_size), seed=head.seed,
                         early_mean=early_r.mean(), late_mean=late_r.mean(),
                         gain=late_r.mean() - early_r.mean(), ci_low=low, ci_high=high))
    return pd.DataFrame(rows)


def group_gains(runs: Runs, *, early=EARLY, late=LATE, n_boot: int = 2000, ci: float = 0.95,
                seed: int = 0) -> pd.DataFrame:
    """The gain per group size: one row per group size, smallest first.

    Columns: group_size, seeds (runs), seed_values, gains (one per run), spread_low and
    spread_high (min and max over the seeds), mean_gain, ci_low and ci_high (bootstrap of the
    mean gain over the steps of every seed; seeded by `seed` and the group size).
    """
    by_group: dict[int, list] = {}
    for head, early_r, late_r in _windows(as_runs(runs), early, late):
        by_group.setdefault(int(head.group_size), []).append((head, early_r, late_r))
    rows = []
    for g in sorted(by_group):
        members = by_group[g]
        pairs = [(early_r, late_r) for _, early_r, late_r in members]
        gains = [late_r.mean() - early_r.mean() for early_r, late_r in pairs]
        low, high = bootstrap_gain(pairs, np.random.default_rng([seed, g]), n_boot=n_boot, ci=ci)
        rows.append(dict(group_size=g, seeds=len(members), seed_values=[h.seed for h, _, _ in members],
                         gains=gains, spread_low=min(gains), spread_high=max(gains),
                         mean_gain=float(np.mean(gains)), ci_low=low, ci_high=high))
    return pd.DataFrame(rows)


@dataclass
class Verdict:
    """The answer to "are all gains inside one range?": `inside` is None when it cannot be judged."""

    inside: bool | None
    reference: int
    low: float = float("nan")
    high: float = float("nan")
    outside: list[str] = field(default_factory=list)
    text: str = ""

    def __str__(self) -> str:
        return self.text


def inside_one_range(gains: Runs, reference: int = REFERENCE, **gain_options) -> Verdict:
    """Does every run's gain fall inside the range (min to max) of the reference group's seeds?

    `gains`: a frame from `run_gains`, or runs (then `gain_options` go to run_gains).
    Returns a Verdict whose text says it in words; `inside` is None when the reference group
    has a single seed. Raises AnalysisError when no run has the reference group size.
    """
    if not (isinstance(gains, pd.DataFrame) and "gain" in gains):
        gains = run_gains(gains, **gain_options)
    ref = gains[gains.group_size == reference]
    if ref.empty:
        present = ", ".join(str(g) for g in sorted(gains.group_size.unique()))
        raise AnalysisError(f"no run has {reference} answers per prompt (group sizes here: "
                            f"{present}); pass reference= one of them, or add runs of {reference}")
    low, high = ref.gain.min(), ref.gain.max()
    if len(ref) < 2:
        return Verdict(None, reference, low, high, text=(
            f"Cannot judge: {reference} answers has one seed, and a range needs two or more; "
            f"run more seeds of {reference} answers (--seed)"))
    others = gains[gains.group_size != reference]
    out = others[(others.gain < low - 1e-12) | (others.gain > high + 1e-12)]
    span = f"the {len(ref)} seeds at {reference} answers span {low:+.3f} to {high:+.3f}"
    def listed(rows: pd.DataFrame) -> str:
        return ", ".join(f"{r.run} ({r.group_size} answers) {r.gain:+.3f}" for r in rows.itertuples())

    if out.empty:
        text = (f"Inside one range: {span}, and every other run falls inside it"
                f"{': ' + listed(others) if len(others) else ''}. No effect of the group size "
                f"on the gain stands out from the seed noise.")
    else:
        text = (f"Not inside one range: {span}, and {len(out)} run(s) fall outside: "
                f"{listed(out)}. Run more seeds of those group sizes before calling it an effect.")
    return Verdict(out.empty, reference, low, high, list(out.run), text)


# ====================================================================== the cost
def common_clean_steps(runs: Runs, *, last_step: int | None = None) -> tuple[list[int], list[str]]:
    """The step numbers clean in every run that has a clean step, and the runs left out.

    Only steps up to `last_step` count (None: all). A run with no clean step is left out of
    the intersection (it would empty it) and returned in the second list.
    """
    sets, left_out = [], []
    for name, run in as_runs(runs).groupby("run", sort=False):
        if last_step is not None:
            run = run[run[STEP] <= last_step]
        clean = set(run.loc[run["clean"].astype(bool), STEP].astype(int))
        if clean:
            sets.append(clean)
        else:
            left_out.append(name)
    return (sorted(set.intersection(*sets)) if sets else []), left_out


def run_costs(runs: Runs, *, last_step: int | None = None) -> pd.DataFrame:
    """The cost of each run over its steps up to `last_step` (None: all).

    One row per run: run, group_size, seed, steps, clean_steps (its own), common_clean_steps
    (how many its time uses), time_s and basis (the median rollout time over the common clean
    steps; else over its own clean steps when no step is clean in all; else over all steps,
    "includes pauses"), time_all_s, tokens_per_step and response_len (means over the steps).
    """
    runs = as_runs(runs)
    common, left_out = common_clean_steps(runs, last_step=last_step)
    with_clean = runs["run"].nunique() - len(left_out)
    if not common and with_clean > 1:
        warnings.warn("no step number is clean in every run that has clean steps; each time is "
                      "the median over that run's own clean steps, which differ", stacklevel=2)
    rows = []
    for name, run in runs.groupby("run", sort=False):
        if last_step is not None:
            run = run[run[STEP] <= last_step]
        time = metric_values(run, ROLLOUT_TIME)
        clean = run["clean"].astype(bool).to_numpy()
        on_common = run[STEP].isin(common).to_numpy()
        if time.isna().all():
            basis, t = "not logged", np.nan
        elif name not in left_out and common:
            basis, t = "common clean steps", time[on_common].median()
        elif name not in left_out:
            basis, t = "own clean steps", time[clean].median()
        else:
            basis, t = "all steps, includes pauses", time.median()
        rows.append(dict(
            run=name, group_size=int(run.group_size.iat[0]), seed=run.seed.iat[0], steps=len(run),
            clean_steps=int(clean.sum()),
            common_clean_steps=int(on_common.sum()) if basis == "common clean steps" else 0,
            time_s=t, basis=basis, time_all_s=time.median(),
            tokens_per_step=metric_values(run, TOKENS).mean(),
            response_len=metric_values(run, RESPONSE_LEN).mean(),
            heat_guard=bool(run.heat_guard.iat[0])))
    return pd.DataFrame(rows)


def metric_values(run: pd.DataFrame, column: str) -> pd.Series:
    """A metric column as numbers (NaN where not logged), or all NaN when no step logged it."""
    if column not in run:
        return pd.Series(np.nan, index=run.index)
    return pd.to_numeric(run[column], errors="coerce")


# ====================================================================== the table
def compare(runs: Runs, *, reference: int = REFERENCE, early=EARLY, late=LATE,
            n_boot: int = 2000, ci: float = 0.95, seed: int = 0) -> pd.DataFrame:
    """The course's table: one row per group size, gains and cost, as display strings.

    `runs`: a frame from load_runs, or paths. Compares steps 0 to the end of `late` of each
    run. Columns: group size, seeds, gain per seed, seed spread, gain interval, rollout time
    (median over the common clean steps), time vs the reference, common clean steps, tokens
    per step, response length. `table.attrs` holds "verdict" (text), "common_clean_steps"
    (the step numbers) and "notes". Print with `render_table`; numbers are in run_gains,
    group_gains and run_costs.
    """
    runs = as_runs(runs)
    check_comparable(runs)
    options = dict(early=early, late=late, n_boot=n_boot, ci=ci, seed=seed)
    gains = group_gains(runs, **options)
    costs = run_costs(runs, last_step=_check_window(late, "late")[1])
    try:
        verdict = inside_one_range(run_gains(runs, **options), reference).text
    except AnalysisError as e:
        verdict = f"Cannot judge: {e}"
    ref_time, ref_basis = _group_time(costs[costs.group_size == reference])
    rows = []
    for g in gains.itertuples():
        time, basis = _group_time(costs[costs.group_size == g.group_size])
        mine = costs[costs.group_size == g.group_size]
        rows.append({
            "group size": g.group_size,
            "seeds": g.seeds,
            "gain per seed": ", ".join(f"{x:+.3f}" for x in g.gains),
            "seed spread": f"{g.spread_low:+.3f} to {g.spread_high:+.3f}" if g.seeds > 1 else "one seed",
            f"gain {ci:.0%} interval (steps resampled)": f"{g.ci_low:+.3f} to {g.ci_high:+.3f}",
            "rollout time (s)": _time_text(time, basis),
            f"time vs {reference}": (f"{time / ref_time:.2f}x" if basis == ref_basis ==
                                     "common clean steps" else "n/a"),
            "common clean steps": int(mine.common_clean_steps.max()),
            "tokens per step": _mean_text(mine.tokens_per_step, "{:,.0f}"),
            "response length (tokens)": _mean_text(mine.response_len, "{:.0f}"),
        })
    table = pd.DataFrame(rows)
    common, _ = common_clean_steps(runs, last_step=late[1])
    table.attrs.update(verdict=verdict, common_clean_steps=common, notes=_cost_notes(costs, common))
    return table


def _group_time(costs: pd.DataFrame) -> tuple[float, str]:
    """The median over a group's runs of their times, taking only the runs with the best basis."""
    for basis in ("common clean steps", "own clean steps", "all steps, includes pauses"):
        times = costs.loc[costs.basis == basis, "time_s"]
        if len(times):
            return float(times.median()), basis
    return float("nan"), "not logged"


def _time_text(time: float, basis: str) -> str:
    texts = {"common clean steps": f"{time:.1f}",
             "own clean steps": f"{time:.1f} (own clean steps)",
             "all steps, includes pauses": f"no clean step; {time:.1f} includes pauses"}
    return texts.get(basis, "not logged")


def _mean_text(values: pd.Series, fmt: str) -> str:
    return fmt.format(values.mean()) if values.notna().any() else "n/a"


def _cost_notes(costs: pd.DataFrame, common: list[int]) -> list[str]:
    notes = []
    for r in costs.itertuples():
        if r.basis == "all steps, includes pauses":
            notes.append(f"Every step of {r.run} ({r.group_size} answers) overlapped a heat pause, "
                         f"so it has no clean time. Its median of {r.time_s:.1f} s includes the pauses.")
        elif r.basis == "common clean steps":
            notes.append(f"{r.run} ({r.group_size} answers): {r.time_s:.1f} s on the {len(common)} "
                         f"common clean steps ({r.clean_steps} of its {r.steps} steps are clean)"
                         + ("" if r.heat_guard else "; it logged no heat/clean (no heat guard), "
                            "so its steps count as clean unless heat.jsonl records a pause"))
    return notes


def render_table(table: pd.DataFrame, fmt: str = "markdown") -> str:
    """The table as Markdown (`fmt="markdown"`, needs tabulate) or plain text (`"text"`)."""
    if fmt == "markdown":
        return table.to_markdown(index=False)
    if fmt == "text":
        return table.to_string(index=False)
    raise ValueError(f"fmt={fmt!r}: use 'markdown' or 'text'")


def _steps_text(steps: Sequence[int]) -> str:
    return ", ".join(str(int(s)) for s in steps)


def _show(paths) -> str:
    items = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
    return ", ".join(str(p) for p in items)


# ====================================================================== command line
def drop_unfinished(runs: pd.DataFrame, late=LATE) -> pd.DataFrame:
    """The runs that reached the end of the late window; say which were left out and why.

    A folder of runs often holds one that is still going or was stopped early; the table
    leaves it out (with a line saying so) rather than refusing every run.
    """
    last = runs.groupby("run", sort=False)[STEP].max()
    short = last[last < late[1]]
    for name, step in short.items():
        print(f"left out: run {name} has steps 0 to {int(step)}, too short for the window "
              f"{late[0]}-{late[1]}", file=sys.stderr)
    if len(short) == len(last):
        raise AnalysisError(f"no run reaches step {late[1]}, the end of the late window")
    return runs[~runs["run"].isin(short.index)]


def compare_main(paths: list[str], out_dir: str | None = None, reference: int = REFERENCE,
                 *, early=EARLY, late=LATE, mixed: bool = False) -> int:
    """`labkit compare RUN...`: print the table, the verdict and the common clean steps, and
    write the plots (PNG and SVG) to `out_dir` (default: ./compare). Runs that did not reach
    the late window are left out with a line saying so. Returns the exit code: 0, or 2 when the runs cannot be compared."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            runs = drop_unfinished(load_runs(paths), late)
            per_run = runs.groupby("run", sort=False).first()
            differ = [c for c in ("lr", "model", "prompts") if per_run[c].dropna().nunique() > 1]
            if differ and not mixed:
                raise AnalysisError(
                    f"the runs differ in {', '.join(differ)}, so runs of one group size are not "
                    f"seeds of one setting; name runs that share them "
                    f"(e.g. labkit compare data/runs/n*-lr1e-5-*), or pass --mixed")
            table = compare(runs, reference=reference, early=early, late=late)
        except AnalysisError as e:
            print(f"labkit compare: {e}", file=sys.stderr)
            return 2
    for w in caught:
        print(f"warning: {w.message}", file=sys.stderr)
    common = table.attrs["common_clean_steps"]
    print(render_table(table))
    print()
    print(table.attrs["verdict"])
    print(f"\nCommon clean steps ({len(common)}): {_steps_text(common) or 'none'}")
    for note in table.attrs["notes"]:
        print(f"- {note}")
    from labkit import plots  # matplotlib only when plotting

    out = Path(out_dir) if out_dir else Path("compare")
    written = plots.plot_all(runs, out, early=early, late=late)
    print(f"\nwrote {len(written)} files to {out}: {', '.join(p.name for p in written)}")
    return 0
