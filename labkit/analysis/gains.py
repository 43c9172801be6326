"""The reward gain of each run and group size, read against the seed spread.

The course's first question of its group-size runs (section "Choose the group size"): does
the group size change how much the reward rises? The *gain* of a run is the mean reward of
steps 16-23 minus that of steps 0-7. Seeds of one group size differ by as much as group
sizes do, so a gain is read against the seed spread (min to max) of a reference group size
(8 answers), not against zero: "inside one range" or not. A bootstrap over the steps of the
two windows shows how noisy one run's gain is.

Runs of one group size are read as *seeds of one setting*, so every other setting must be
the same: the prompts per rollout, the learning rate, the model, and real runs are never
mixed with constructed ones. `group_gains` and `inside_one_range` (and the table) refuse runs
that differ in these (`refuse_mixed_settings`), unless told `mixed=True`: the course's
rollout batch size sweep ran 8 answers at 16 and 64 prompts, and read as seeds of the
8-answer recipe it widened the seed range from +0.048..+0.070 to -0.007..+0.070.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from labkit.analysis.runframe import (
    REWARD,
    RIGHT,
    AnalysisError,
    Runs,
    as_runs,
    is_constructed,
    status_text,
    steps_text,
)
from labkit.run.metrics import STEP

EARLY = (0, 7)  # the course's windows: steps 0-7 and 16-23 of a 24-step run
LATE = (16, 23)
REFERENCE = 8  # the group size whose seeds give the range
# what seeds of one setting share (frame column: what it is); the group size and seed may differ
SETTINGS = {"prompts": "prompts per rollout (--rollout-batch-size)", "lr": "learning rate (--lr)",
            "model": "model (--model)"}


# ====================================================================== one setting
def setting(prompts, answers) -> str:
    """A setting of the rollout's shape, as the tables name it: "32 x 8" (prompts x answers)."""
    return f"{int(prompts)} x {int(answers)}"


def refuse_mixed_settings(runs: pd.DataFrame, *, by: str = "group_size") -> None:
    """Raise AnalysisError when the runs are not all seeds of one setting: they differ in
    prompts per rollout, learning rate or model (the columns of SETTINGS that `runs` has),
    mix constructed runs with real ones, or two runs of one row share a seed (shared_seeds).
    `runs`: a frame of runs, or of gains (run_gains). With `by="setting"` (rows are prompts x
    answers) the prompts may differ.

    The message lists which runs share each value, and how to select one setting.
    """
    per_run = runs.groupby("run", sort=False).first()
    differ = [c for c in SETTINGS if c in per_run and per_run[c].dropna().nunique() > 1
              and not (by == "setting" and c == "prompts")]
    made_up = [str(r) for r in per_run.index if is_constructed(r)]
    problems = []
    if differ:
        problems.append(
            f"the runs differ in {', '.join(differ)}, so runs of one group size are not seeds "
            f"of one setting: " + "; ".join(_runs_by_value(per_run, c) for c in differ))
    mixed_made_up = bool(made_up) and len(made_up) < len(per_run)
    if mixed_made_up:
        problems.append(f"{', '.join(made_up)} {'is' if len(made_up) == 1 else 'are'} "
                        f"constructed (made up, not measured) and the others are real runs")
    select = (f"Select runs of one setting ({_selection(per_run, differ)}; labkit compare: "
              f"name those run folders)" if problems else "")
    twice = shared_seeds(runs, by=by)
    if twice:
        problems += twice
        select = (select + "; keep" if select else "Keep") + " one run of each seed"
    if problems:
        raise AnalysisError(". ".join(problems) + f". {select}, or pass mixed=True (--mixed)")


def shared_seeds(runs: pd.DataFrame, *, by: str = "group_size") -> list[str]:
    """One line per row of the table (a group size, or with `by="setting"` prompts x answers)
    whose runs share a seed: a rerun of a seed repeats it (bit for bit on a CPU), so counted
    as another seed it narrows the seed spread it should widen. Empty when every seed is one run."""
    per_run = runs.groupby("run", sort=False).first()
    if "seed" not in per_run:
        return []
    keys = per_run.apply(_setting_of, axis=1) if by == "setting" else per_run.group_size
    lines = []
    for (key, seed), group in per_run.groupby([keys, per_run.seed], sort=True):
        if len(group) > 1:
            what = f"{key}" if by == "setting" else f"group size {key}"
            lines.append(f"{', '.join(map(str, group.index))} ({what}) share seed {seed}, so they "
                         f"are one seed, not {len(group)}")
    return lines


def _runs_by_value(per_run: pd.DataFrame, column: str) -> str:
    """'lr 1e-06: a, b, c; lr 1e-05: d': which runs share each value of `column`."""
    parts = []
    for value, group in per_run.groupby(column, sort=True):
        shown = f"{value:g}" if isinstance(value, float) else str(value)
        parts.append(f"{column} {shown}: {', '.join(map(str, group.index))}")
    return "; ".join(parts)


def _selection(per_run: pd.DataFrame, differ: list[str]) -> str:
    """The pandas filter that keeps the most common value of each differing setting."""
    terms = []
    for c in differ:
        value = per_run[c].value_counts().idxmax()
        value = value.item() if hasattr(value, "item") else value  # numpy scalars print plainly
        terms.append(f"(runs.{c} == {value:g})" if isinstance(value, float)
                     else f"(runs.{c} == {value!r})")
    if any(is_constructed(r) for r in per_run.index):
        terms.append('~runs.run.str.contains("constructed")')
    return "e.g. runs[" + " & ".join(terms) + "]"


def reward_at_ends(metrics: pd.DataFrame) -> tuple[float, float, int]:
    """(mean reward of the first third of a run's steps, of the last third, steps in a
    third): the launcher's one-line answer to "did the reward rise?". `metrics`: a run's
    step rows (Run.metrics). AnalysisError for a run with no reward logged."""
    scored, k = _thirds(metrics)
    rewards = scored[REWARD].to_numpy(float)
    return float(rewards[:k].mean()), float(rewards[-k:].mean()), k


def reward_parts(metrics: pd.DataFrame) -> pd.DataFrame:
    """The reward of a run's first and last third of steps (reward_at_ends) taken apart: one
    row per third, with its steps, the mean reward, the share of answers right (the answers
    that got the full reward, 1) and the rest of the reward, what `--rm-type math_format`
    paid for a wrong number in the asked format (0 with `math`). AnalysisError for a run
    that logged no share of right answers (rollout/right_frac: runs before it was logged)."""
    scored, k = _thirds(metrics)
    if RIGHT not in scored or scored[RIGHT].isna().any():
        raise AnalysisError(f"the run logs no {RIGHT} (the share of answers right) for every "
                            f"step; it was made before labkit logged it, so its reward cannot "
                            f"be taken apart")
    rows = {}
    for name, part in (("first", scored.iloc[:k]), ("last", scored.iloc[-k:])):
        reward, right = float(part[REWARD].mean()), float(part[RIGHT].mean())
        steps = part[STEP].astype(int)
        label = (f"{name} step ({steps.iat[0]})" if k == 1
                 else f"{name} {k} steps ({steps.iat[0]}-{steps.iat[-1]})")
        rows[label] = {
            "mean reward": reward, "answers right": right,
            "format credit": max(reward - right, 0.0)}
    return pd.DataFrame.from_dict(rows, orient="index")


def _steps_words(steps: pd.Series) -> str:
    """'step 0', '2 steps (0-1)', '4 steps (8-11)': a run of step numbers, in words."""
    steps = steps.astype(int)
    if len(steps) == 1:
        return f"step {steps.iat[0]}"
    return f"{len(steps)} steps ({steps.min()}-{steps.max()})"


def end_windows(metrics: pd.DataFrame) -> tuple[tuple[int, int], tuple[int, int]]:
    """The steps reward_at_ends averages, as (first, last) windows for reward_curve's
    `early` and `late`: the plot then shades what the launcher's line reports."""
    scored, k = _thirds(metrics)
    steps = scored[STEP].astype(int).to_list()
    return (steps[0], steps[k - 1]), (steps[-k], steps[-1])


def _thirds(metrics: pd.DataFrame) -> tuple[pd.DataFrame, int]:
    """The steps with a reward, in order, and how many make a third (at least one)."""
    if REWARD not in metrics or metrics[REWARD].dropna().empty:
        raise AnalysisError(f"no {REWARD} logged")
    scored = metrics.dropna(subset=[REWARD]).sort_values(STEP)
    return scored, max(1, len(scored) // 3)


def rise_windows(runs: Runs) -> tuple[tuple[int, int], tuple[int, int]]:
    """The (first, last) windows reward_rise compares for `runs`: the first and the last third
    of the steps the runs were launched for (their longest --num-rollout, planned_steps; or
    the most steps one logged, when that is more or not known). A run stopped early is
    read over the same steps as a complete one, never over thirds of its own few steps.
    Pass them to reward_curve's `early` and `late` to shade what the table compares."""
    runs = as_runs(runs)
    logged = int(runs[STEP].max()) + 1
    planned = pd.to_numeric(runs["planned_steps"], errors="coerce").max() \
        if "planned_steps" in runs else float("nan")
    n = max(logged, int(planned)) if pd.notna(planned) else logged
    k = max(1, n // 3)
    return (0, k - 1), (n - k, n - 1)


def reward_rise(runs: Runs) -> pd.DataFrame:
    """How far and how fast each run's reward rose, for runs too short for the course's
    windows (a CPU run of a dozen steps). Every run is read over the same two windows,
    rise_windows: the first and last third of the steps the runs were launched for.

    One row per run: run, group_size, seed, status (status_text: "completed", "stopped
    after step 1", ...), steps (logged), minutes (the steps' own time, perf/step_time
    summed), start and end (mean reward of the early and of the late window), rise (end -
    start), rise_per_step (over the steps between the two windows' middles),
    rise_per_minute, all_equal (the mean share of groups whose answers all got one reward:
    they teach nothing), right_rise (how far the share of answers right rose between the
    windows: the part of the rise that is right answers, not format credit; NaN for a run
    that does not log it), and note. A run without a reward for every step of a window (it
    stopped before the late window) has no start or end there and no rise (NaN), and its
    note says why; a rise from fewer steps would not be the same measure.
    """
    runs = as_runs(runs)
    early, late = rise_windows(runs)
    n, k = late[1] + 1, early[1] - early[0] + 1
    rows = []
    for name, run in runs.groupby("run", sort=False):
        means = {}
        for key, window in (("start", early), ("end", late)):
            try:
                means[key] = float(window_rewards(run, window).mean())
            except AnalysisError:
                means[key] = float("nan")
        rise = means["end"] - means["start"]
        short = np.isnan(rise)
        note = (f"no rise: it has {_steps_words(run[STEP])}, the windows are steps "
                f"{early[0]}-{early[1]} and {late[0]}-{late[1]}" if short else "")
        minutes = float(pd.to_numeric(run.get("perf/step_time"), errors="coerce").sum()) / 60
        rows.append(dict(run=name, group_size=int(run.group_size.iat[0]), seed=run.seed.iat[0],
                         status=status_text(run), steps=len(run), minutes=minutes,
                         start=means["start"], end=means["end"], rise=rise,
                         rise_per_step=rise / max(n - k, 1),
                         rise_per_minute=rise / minutes if minutes else float("nan"),
                         all_equal=float(pd.to_numeric(run.get("rollout/zero_std/frac_groups"),
                                                       errors="coerce").mean()),
                         right_rise=_right_rise(run, early, late), note=note))
    return pd.DataFrame(rows)


def _right_rise(run: pd.DataFrame, early, late) -> float:
    """How far the share of answers right rose from window `early` to `late`; NaN when the
    run does not log it for every step of both."""
    if RIGHT not in run:
        return float("nan")
    right = run.set_index(STEP)[RIGHT].astype(float)
    parts = [right.reindex(range(a, b + 1)) for a, b in (early, late)]
    if any(p.isna().any() for p in parts):
        return float("nan")
    return float(parts[1].mean() - parts[0].mean())


def check_window(window: tuple[int, int], name: str) -> tuple[int, int]:
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
        raise AnalysisError(f"run {name} has no reward for step(s) {steps_text(missing)} of the "
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
    early, late = check_window(early, "early"), check_window(late, "late")
    return [(run.iloc[0], window_rewards(run, early), window_rewards(run, late))
            for _, run in runs.groupby("run", sort=False)]


def run_gains(runs: Runs, *, early=EARLY, late=LATE, n_boot: int = 2000, ci: float = 0.95,
              seed: int = 0) -> pd.DataFrame:
    """Each run's gain, mean reward of `late` minus that of `early` (steps, inclusive).

    Returns one row per run: run, group_size, prompts, lr, seed, early_mean, late_mean,
    gain, ci_low, ci_high (bootstrap over the steps of the windows; seeded by `seed` and the
    run name, so the same runs always give the same interval). Runs of any settings: each
    gain is its own run's.
    """
    rows = []
    for head, early_r, late_r in _windows(as_runs(runs), early, late):
        rng = np.random.default_rng([seed, zlib.crc32(str(head.run).encode())])
        low, high = bootstrap_gain([(early_r, late_r)], rng, n_boot=n_boot, ci=ci)
        rows.append(dict(run=head.run, group_size=int(head.group_size),
                         prompts=head.get("prompts"), lr=head.get("lr"), seed=head.seed,
                         setting=_setting_of(head),
                         early_mean=early_r.mean(), late_mean=late_r.mean(),
                         gain=late_r.mean() - early_r.mean(), ci_low=low, ci_high=high))
    return pd.DataFrame(rows)


def group_gains(runs: Runs, *, early=EARLY, late=LATE, n_boot: int = 2000, ci: float = 0.95,
                seed: int = 0, mixed: bool = False, by: str = "group_size") -> pd.DataFrame:
    """The gain per group size (or, `by="setting"`, per prompts x answers): one row each,
    smallest first.

    Columns: group_size (or setting), seeds (runs), seed_values, gains (one per run),
    spread_low and spread_high (min and max over the seeds), mean_gain, ci_low and ci_high
    (bootstrap of the mean gain over the steps of every seed; seeded by `seed` and the row).
    The runs must be seeds of one setting (refuse_mixed_settings) unless `mixed`.
    """
    runs = as_runs(runs)
    if not mixed:
        refuse_mixed_settings(runs, by=by)
    by_group: dict = {}
    for head, early_r, late_r in _windows(runs, early, late):
        key = _setting_of(head) if by == "setting" else int(head.group_size)
        by_group.setdefault(key, []).append((head, early_r, late_r))
    rows = []
    for g in sorted(by_group, key=_order):
        members = by_group[g]
        pairs = [(early_r, late_r) for _, early_r, late_r in members]
        gains = [late_r.mean() - early_r.mean() for early_r, late_r in pairs]
        rng = np.random.default_rng([seed, zlib.crc32(str(g).encode())])
        low, high = bootstrap_gain(pairs, rng, n_boot=n_boot, ci=ci)
        rows.append(dict(**{by: g}, seeds=len(members), seed_values=[h.seed for h, _, _ in members],
                         gains=gains, spread_low=min(gains), spread_high=max(gains),
                         mean_gain=float(np.mean(gains)), ci_low=low, ci_high=high))
    return pd.DataFrame(rows)


def _setting_of(head) -> str | None:
    prompts = head.get("prompts")
    return setting(prompts, head.group_size) if prompts is not None and pd.notna(prompts) else None


def _order(key):
    """Settings in order of answers per prompt ("64 x 4" before "32 x 8"), group sizes by size."""
    if isinstance(key, str):
        prompts, answers = (int(x) for x in key.split(" x "))
        return (answers, prompts)
    return (key, 0)


@dataclass
class Verdict:
    """The answer to "are all gains inside one range?": `inside` is None when it cannot be judged."""

    inside: bool | None
    reference: int | str
    low: float = float("nan")
    high: float = float("nan")
    outside: list[str] = field(default_factory=list)
    text: str = ""

    def __str__(self) -> str:
        return self.text


def inside_one_range(gains: Runs, reference: int | str = REFERENCE, *, mixed: bool = False,
                     by: str = "group_size", **gain_options) -> Verdict:
    """Does every run's gain fall inside the range (min to max) of the reference's seeds?

    `gains`: a frame from `run_gains`, or runs (then `gain_options` go to run_gains).
    `by`: "group_size" (reference: answers, e.g. 8) or "setting" (prompts x answers, e.g.
    "32 x 8"). Returns a Verdict whose text says it in words; `inside` is None when the
    reference has a single seed. Raises AnalysisError when no run has the reference, and
    when the runs are not seeds of one setting (refuse_mixed_settings) unless `mixed`.
    """
    if not (isinstance(gains, pd.DataFrame) and "gain" in gains):
        runs = as_runs(gains)
        if not mixed:
            refuse_mixed_settings(runs, by=by)
        gains = run_gains(runs, **gain_options)
    elif not mixed:
        refuse_mixed_settings(gains, by=by)
    what = (lambda key: f"{key} answers") if by == "group_size" else (lambda key: str(key))  # noqa: E731
    ref = gains[gains[by] == reference]
    if ref.empty:
        present = ", ".join(str(g) for g in sorted(gains[by].dropna().unique(), key=_order))
        kind = "group sizes" if by == "group_size" else "settings"
        raise AnalysisError(f"no run has {what(reference)} ({kind} here: {present}); pass "
                            f"reference= one of them, or add runs of {what(reference)}")
    low, high = ref.gain.min(), ref.gain.max()
    if len(ref) < 2:
        return Verdict(None, reference, low, high, text=(
            f"Cannot judge: {what(reference)} has one seed, and a range needs two or more; "
            f"run more seeds of {what(reference)} (--seed)"))
    others = gains[gains[by] != reference]
    out = others[(others.gain < low - 1e-12) | (others.gain > high + 1e-12)]
    span = f"the {len(ref)} seeds at {what(reference)} span {low:+.3f} to {high:+.3f}"
    def listed(rows: pd.DataFrame) -> str:
        return ", ".join(f"{r.run} ({what(getattr(r, by))}) {r.gain:+.3f}" for r in rows.itertuples())

    if out.empty:
        text = (f"Inside one range: {span}, and every other run falls inside it"
                f"{': ' + listed(others) if len(others) else ''}. No effect of the "
                f"{'group size' if by == 'group_size' else 'split'} on the gain stands out from "
                f"the seed noise.")
    else:
        text = (f"Not inside one range: {span}, and {len(out)} run(s) fall outside: "
                f"{listed(out)}. Run more seeds of those "
                f"{'group sizes' if by == 'group_size' else 'settings'} before calling it an effect.")
    return Verdict(out.empty, reference, low, high, list(out.run), text)
