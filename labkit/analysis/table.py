"""The group-size table: gains, held-out accuracy and cost side by side, for one setting.

One row per group size (or per prompts x answers, `by="setting"`, for splits of one sample
budget), as display strings: the gain of each seed and their spread, the bootstrap
interval, held-out accuracy before -> after training (seed range) when the runs were
evaluated, the rollout and step time, tokens per step, the share of all-equal groups and
the answer length. The numbers come from labkit.analysis.gains, .heldout and .costs; this
module checks that the runs compare one setting (only the group size, or the split, and
the seed may differ) and puts the numbers into words.
"""

from __future__ import annotations

import sys
import warnings

import pandas as pd

from labkit.analysis.costs import common_clean_steps, run_costs
from labkit.analysis.gains import (
    EARLY,
    LATE,
    REFERENCE,
    check_window,
    group_gains,
    inside_one_range,
    refuse_mixed_settings,
    run_gains,
    shared_seeds,
)
from labkit.analysis.heldout import group_heldout, heldout_verdict
from labkit.analysis.runframe import AnalysisError, Runs, as_runs
from labkit.run.metrics import STEP


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
def compare(runs: Runs, *, reference: int | str | None = None, early=EARLY, late=LATE,
            n_boot: int = 2000, ci: float = 0.95, seed: int = 0, mixed: bool = False,
            by: str = "group_size") -> pd.DataFrame:
    """The course's table: one row per group size (or per setting), as display strings.

    `runs`: a frame from load_runs, or paths. Compares steps 0 to the end of `late` of each
    run. `by`: "group_size" (the runs share prompts per rollout; reference 8) or "setting"
    (prompts x answers may both change, e.g. one sample budget split three ways; reference
    "32 x 8"). Columns: the row's key, seeds, gain per seed, seed spread, gain interval,
    held-out accuracy before -> after (seed range) and its change, when the runs were
    evaluated; rollout time (median over the common clean steps), time vs the reference,
    step time, tokens per step, all-equal groups, response length. `table.attrs` holds
    "verdict" (the gains, in words), "heldout_verdict", "common_clean_steps" and "notes".
    Print with `render_table`; the numbers are in run_gains, group_gains, group_heldout and
    run_costs. Raises AnalysisError for runs that are not seeds of one setting
    (refuse_mixed_settings); `mixed=True` compares them anyway, with a warning.
    """
    if by not in ("group_size", "setting"):
        raise ValueError(f"by={by!r}: use 'group_size' or 'setting'")
    reference = reference if reference is not None else (REFERENCE if by == "group_size" else "32 x 8")
    runs = as_runs(runs)
    if not mixed:
        refuse_mixed_settings(runs, by=by)
    for line in shared_seeds(runs, by=by) if mixed else ():
        warnings.warn(f"{line}; the table counts each run as a seed", stacklevel=2)
    if by == "group_size":
        check_comparable(runs)
    options = dict(early=early, late=late, n_boot=n_boot, ci=ci, seed=seed)
    gains = group_gains(runs, mixed=mixed, by=by, **options)
    costs = run_costs(runs, last_step=check_window(late, "late")[1])
    try:
        verdict = inside_one_range(run_gains(runs, **options), reference, mixed=mixed, by=by).text
    except AnalysisError as e:
        verdict = f"Cannot judge: {e}"
    try:
        held = group_heldout(runs, reference, by=by)
    except AnalysisError:  # no run was evaluated
        held = None
    heldout = _heldout_by(held, by)
    ref_time, ref_basis = _group_time(costs[costs[by] == reference])
    rows = []
    for g in gains.itertuples():
        key = getattr(g, by)
        time, basis = _group_time(costs[costs[by] == key])
        mine = costs[costs[by] == key]
        row = {
            "group size" if by == "group_size" else "prompts x answers": key,
            "seeds": g.seeds,
            "gain per seed": ", ".join(f"{x:+.3f}" for x in g.gains),
            "seed spread": f"{g.spread_low:+.3f} to {g.spread_high:+.3f}" if g.seeds > 1 else "one seed",
            f"gain {ci:.0%} interval (steps resampled)": f"{g.ci_low:+.3f} to {g.ci_high:+.3f}",
        }
        if heldout is not None:
            row.update(_heldout_cells(heldout.get(key), reference))
        row.update({
            "rollout time (s)": _time_text(time, basis),
            f"time vs {reference}": (f"{time / ref_time:.2f}x" if basis == ref_basis ==
                                     "common clean steps" else "n/a"),
            "step time (s)": _mean_text(mine.step_time_s, "{:.1f}"),
            "common clean steps": int(mine.common_clean_steps.max()),
            "tokens per step": _mean_text(mine.tokens_per_step, "{:,.0f}"),
            "all-equal groups": _mean_text(mine.zero_std, "{:.0%}"),
            "response length (tokens)": _mean_text(mine.response_len, "{:.0f}"),
        })
        rows.append(row)
    table = pd.DataFrame(rows)
    common, _ = common_clean_steps(runs, last_step=late[1])
    table.attrs.update(verdict=verdict, common_clean_steps=common, notes=_cost_notes(costs, common),
                       heldout_verdict=(heldout_verdict(held, reference, by=by)
                                        if held is not None else None))
    return table


def _heldout_by(table: pd.DataFrame | None, by: str) -> dict | None:
    """group_heldout's rows by the table's key, or None when no run was evaluated."""
    if table is None:
        return None
    key = table.setting if by == "setting" else table.group_size
    return {k: r for k, r in zip(key, table.itertuples())}


def _heldout_cells(h, reference) -> dict:
    """The held-out columns of one row: before -> after (seed range), the change with its
    interval over problems and seeds, and the difference from the reference's change."""
    vs = f"vs {reference}" if isinstance(reference, str) else f"vs {reference} answers"
    if h is None:
        return {"held-out before -> after": "not evaluated", "held-out change": "", vs: ""}
    after = (f"{h.after_low:.3f}" if h.seeds == 1 else f"{h.after_low:.3f} to {h.after_high:.3f}")
    kind = "" if h.paired else ", unpaired"
    return {"held-out before -> after": f"{h.before:.3f} -> {after}",
            "held-out change": f"{h.change:+.3f} ({h.ci_low:+.3f} to {h.ci_high:+.3f}{kind})",
            vs: ("" if h.vs_reference != h.vs_reference  # NaN: the reference's own row
                 else f"{h.vs_reference:+.3f} ({h.vs_low:+.3f} to {h.vs_high:+.3f})")}


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
