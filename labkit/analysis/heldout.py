"""Held-out accuracy of runs: the GSM8K test score before training and after, per run and setting.

The training reward says how a run does on the prompts it trains on; whether the model got
better at GSM8K is read from problems it never sees (labkit.evaluation writes `eval.jsonl`:
greedy accuracy on the test split before the first step and after the last). One
evaluation of n problems has a binomial standard error sqrt(p (1 - p) / n), about 0.012 on
all 1,319 GSM8K test problems: a change smaller than two or three of those is not a change.

    runs = labkit.analysis.load_runs("data/runs")
    labkit.analysis.heldout_gains(runs)          # one row per run: before, after, change
    labkit.analysis.group_heldout(runs)          # one row per setting: seed ranges
"""

from __future__ import annotations

import json
import math
import warnings
from pathlib import Path

import pandas as pd

from labkit.analysis.gains import setting
from labkit.analysis.runframe import AnalysisError, Runs, as_runs
from labkit.run.log import EVAL

SETTING = ["prompts", "group_size"]  # what a setting is in the group-size comparison


def read_evaluations(run_dir: str | Path) -> pd.DataFrame:
    """A run folder's eval.jsonl as a frame: trained_steps, name, accuracy, stderr, n,
    eval_time (one row per evaluation; empty when the run has none).

    A file that cannot be read, or lines that are not evaluations (cut short by a killed run,
    edited by hand), are left out with a warning naming the file: a run whose evaluations
    are lost must not read as a run that was never evaluated."""
    path = Path(run_dir) / EVAL
    rows, bad = [], 0
    try:
        lines = path.read_text(encoding="utf-8").splitlines() if path.exists() else []
    except (OSError, UnicodeDecodeError) as e:
        warnings.warn(f"{path} cannot be read ({e.__class__.__name__}: {e}); its held-out "
                      f"accuracy is left out", stacklevel=2)
        lines = []
    for line in lines:
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            name = next((k for k in row if k.startswith("eval/") and f"{k}_n" in row), None)
            p, n = float(row[name]), int(row[f"{name}_n"])
            trained = int(row.get("eval/trained_steps", -1))
        except (ValueError, TypeError, KeyError, AttributeError):
            bad += 1
            continue
        rows.append({"trained_steps": trained, "name": name, "accuracy": p, "n": n,
                     "stderr": math.sqrt(p * (1 - p) / max(n, 1)) if 0 <= p <= 1 else math.nan,
                     "eval_time": row.get("perf/eval_time")})
    if bad:
        warnings.warn(f"{path}: {bad} of {bad + len(rows)} lines are not readable evaluations "
                      f"(cut short or edited?); they are left out", stacklevel=2)
    return pd.DataFrame(rows, columns=["trained_steps", "name", "accuracy", "n", "stderr",
                                       "eval_time"])


def heldout_gains(runs: Runs) -> pd.DataFrame:
    """One row per run that was evaluated both before training and after its last step:
    run, prompts, group_size, seed, name (eval/gsm8k_test), n, before, after, change,
    stderr (of one evaluation, at the 'after' accuracy), trained_steps."""
    runs = as_runs(runs)
    out = []
    for name, rows in runs.groupby("run", sort=False):
        first = rows.iloc[0]
        evals = read_evaluations(first["path"]) if first.get("source") == "labkit" else None
        if evals is None or evals.empty:
            continue
        before = evals[evals.trained_steps == 0]
        after = evals[evals.trained_steps == evals.trained_steps.max()]
        if before.empty or after.iloc[0].trained_steps == 0:
            continue
        b, a = before.iloc[0], after.iloc[0]
        out.append({"run": name, "prompts": first.get("prompts"), "group_size": first.get("group_size"),
                    "seed": first.get("seed"), "name": a["name"], "n": int(a["n"]),
                    "before": b.accuracy, "after": a.accuracy, "change": a.accuracy - b.accuracy,
                    "stderr": a.stderr, "trained_steps": int(a.trained_steps)})
    return pd.DataFrame(out, columns=["run", "prompts", "group_size", "seed", "name", "n", "before",
                                      "after", "change", "stderr", "trained_steps"])


def group_heldout(runs: Runs) -> pd.DataFrame:
    """One row per setting (prompts x answers): setting ("32 x 8"), prompts, group_size,
    seeds, the 'before' accuracy, the range of 'after' over seeds, the range of the change,
    and the standard error of one evaluation.
    Raises AnalysisError when no run was evaluated at both ends."""
    gains = heldout_gains(runs)
    if gains.empty:
        raise AnalysisError("no run has held-out accuracy before and after training (eval.jsonl); "
                            "runs made with --eval-split-size 0, or before labkit evaluated, have none")
    twice = gains[gains.duplicated([*SETTING, "seed"], keep=False)]
    if len(twice):
        raise AnalysisError(
            "runs of one setting share a seed, so they are not seeds of it: "
            + "; ".join(f"{p} x {n} seed {s}: {', '.join(g.run)}"
                        for (p, n, s), g in twice.groupby([*SETTING, "seed"]))
            + ". Compare the runs of one plan (e.g. data/runs/b256-*)")
    rows = []
    for (prompts, answers), g in gains.groupby(SETTING, sort=True):
        rows.append({"setting": setting(prompts, answers), "prompts": prompts,
                     "group_size": answers, "seeds": len(g),
                     "before": g.before.mean(), "after_low": g.after.min(), "after_high": g.after.max(),
                     "after_mean": g.after.mean(), "change_low": g.change.min(),
                     "change_high": g.change.max(), "stderr": g.stderr.mean(), "n": int(g.n.max())})
    return pd.DataFrame(rows)


def heldout_verdict(table: pd.DataFrame, reference: int | str, *, by: str = "setting") -> str:
    """In words, from group_heldout's table: did training move held-out accuracy (every run's
    change against two standard errors of one evaluation), and does any setting's range of
    'after' lie outside the reference's seed range?"""
    se = float(table.stderr.mean())
    low, high = table.change_low.min(), table.change_high.max()
    moved = ("moved it" if low > 2 * se else "did not move it clearly" if high < 2 * se
             else "moved it in some runs only")
    text = [f"Held-out: training {moved}: from {table.before.mean():.3f} before, every run changed "
            f"by {low:+.3f} to {high:+.3f} ({low / se:.1f} to {high / se:.1f} standard errors of "
            f"one evaluation, {se:.3f})."]
    key = table.setting if by == "setting" else table.group_size
    ref = table[key == reference]
    if ref.empty or int(ref.seeds.iat[0]) < 2:
        text.append(f"No seed range at {reference} to read the others against.")
        return " ".join(text)
    r = ref.iloc[0]
    outside = [f"{k} ({row.after_low:.3f} to {row.after_high:.3f})"
               for k, row in zip(key, table.itertuples())
               if k != reference and (row.after_low > r.after_high or row.after_high < r.after_low)]
    span = f"the {int(r.seeds)} seeds at {reference} end at {r.after_low:.3f} to {r.after_high:.3f}"
    text.append(f"Inside one range: {span}, and every other setting's range overlaps it."
                if not outside else
                f"Not inside one range: {span}; entirely outside: {', '.join(outside)}.")
    return " ".join(text)
