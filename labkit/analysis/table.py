"""The group-size table: gains and rollout cost side by side, for one setting.

One row per group size, as display strings: the gain of each seed and their spread, the
bootstrap interval, the rollout time over the common clean steps and against the reference
group size, tokens per step and answer length. The numbers come from labkit.analysis.gains and
labkit.analysis.costs; this module checks that the runs compare one setting (only the group size
and the seed may differ) and puts the numbers into words.
"""

from __future__ import annotations

import sys
import warnings

import pandas as pd

from labkit.analysis.costs import common_clean_steps, run_costs
from labkit.analysis.gains import (EARLY, LATE, REFERENCE, check_window, group_gains, inside_one_range,
                          run_gains)
from labkit.metrics import STEP
from labkit.analysis.runframe import AnalysisError, Runs, as_runs


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
    costs = run_costs(runs, last_step=check_window(late, "late")[1])
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


# ====================================================================== which runs
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
        most = int(last.max())
        raise AnalysisError(
            f"no run reaches step {late[1]}, the end of the late window {late[0]}-{late[1]}; the "
            f"runs go to step {most} at most: choose windows inside it, e.g. labkit compare "
            f"--early 0-{most // 2} --late {most // 2 + 1}-{most} (early=, late= in Python)"
            if most >= 1 else f"no run reaches step {late[1]}, the end of the late window, "
            f"and none has two steps to compare")
    return runs[~runs["run"].isin(short.index)]


def refuse_mixed_settings(runs: pd.DataFrame) -> None:
    """Raise AnalysisError when the runs differ in learning rate, model or prompts per rollout:
    then runs of one group size are not seeds of one setting (`labkit compare --mixed` allows it)."""
    per_run = runs.groupby("run", sort=False).first()
    differ = [c for c in ("lr", "model", "prompts") if per_run[c].dropna().nunique() > 1]
    if differ:
        raise AnalysisError(
            f"the runs differ in {', '.join(differ)}, so runs of one group size are not "
            f"seeds of one setting; name runs that share them, or pass --mixed. "
            + "; ".join(_runs_by_value(per_run, c) for c in differ))


def _runs_by_value(per_run, column: str) -> str:
    """'lr 1e-06: a, b, c; lr 1e-05: d': which runs share each value of `column`."""
    parts = []
    for value, group in per_run.groupby(column, sort=True):
        shown = f"{value:g}" if isinstance(value, float) else str(value)
        parts.append(f"{column} {shown}: {', '.join(map(str, group.index))}")
    return "; ".join(parts)
