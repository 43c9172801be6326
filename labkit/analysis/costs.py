"""The rollout cost of each run: the median rollout time over clean steps shared by all runs.

The course's second question of its group-size runs: what does a group size cost? The
median `perf/rollout_time` over *clean* steps, those no heat pause touched: a GPU that
pauses to cool (or throttles) makes a rollout look slow. Times are compared on the step
numbers that are clean in every compared run.

Rule for the common clean steps: the intersection of the clean step numbers, within the
compared steps (0 to the end of the late window), of the runs that have at least one clean
step. A run with no clean step at all would empty the intersection for everyone, so it is
left out of it and shown with its all-steps median, labelled as including the pauses. Which
steps are clean is decided when the runs are loaded (labkit.analysis.runframe: the `clean` column).
"""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd

from labkit.analysis.runframe import RESPONSE_LEN, ROLLOUT_TIME, TOKENS, ZERO_STD, Runs, as_runs, metric_values
from labkit.run.metrics import STEP

STEP_TIME = "perf/step_time"


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

    One row per run: run, group_size, setting ("32 x 8"), seed, steps, clean_steps (its own),
    common_clean_steps (how many its time uses), time_s and basis (the median rollout time
    over the common clean steps; else over its own clean steps when no step is clean in all;
    else over all steps, "includes pauses"), time_all_s, step_time_s (median whole step),
    tokens_per_step, response_len and zero_std (means over the steps; zero_std: the share of
    groups whose answers all got one reward).
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
        prompts = run["prompts"].iat[0] if "prompts" in run else None
        rows.append(dict(
            run=name, group_size=int(run.group_size.iat[0]),
            setting=(f"{int(prompts)} x {int(run.group_size.iat[0])}"
                     if prompts is not None and pd.notna(prompts) else None),
            seed=run.seed.iat[0], steps=len(run),
            clean_steps=int(clean.sum()),
            common_clean_steps=int(on_common.sum()) if basis == "common clean steps" else 0,
            time_s=t, basis=basis, time_all_s=time.median(),
            step_time_s=metric_values(run, STEP_TIME).median(),
            tokens_per_step=metric_values(run, TOKENS).mean(),
            response_len=metric_values(run, RESPONSE_LEN).mean(),
            zero_std=metric_values(run, ZERO_STD).mean(),
            heat_guard=bool(run.heat_guard.iat[0])))
    return pd.DataFrame(rows)
