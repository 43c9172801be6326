"""Held-out accuracy of runs: the test score before training and after, per run and setting.

The training reward says how a run does on the prompts it trains on; whether the model got
better is read from problems it never sees (labkit.evaluation writes `eval.jsonl`: greedy
accuracy on the test split before the first step and after the last, and
`eval_outcomes.jsonl`: each problem's outcome). Before and after are the same problems, so
a run's change is read problem by problem, with a paired interval (labkit.analysis.paired);
settings are compared the same way, over the problems and the seeds. A change whose
interval spans zero is not a change. Runs evaluated before the outcomes were kept read from
eval.jsonl alone, unpaired (each evaluation's binomial error, sqrt(p (1 - p) / n): ~0.012
on all 1,319 GSM8K test problems), and the tables say so.

    runs = labkit.analysis.load_runs("data/runs")
    labkit.analysis.heldout_change("runs/x")     # one run: before, after, the paired interval
    labkit.analysis.heldout_gains(runs)          # one row per run: before, after, change, interval
    labkit.analysis.group_heldout(runs, 8)       # one row per setting: seeds, interval, vs 8 answers
"""

from __future__ import annotations

import json
import math
import warnings
from pathlib import Path

import pandas as pd

from labkit.analysis.gains import setting
from labkit.analysis.paired import (
    LEVEL,
    RunChange,
    difference,
    per_problem_change,
    setting_change,
    unpaired_run,
)
from labkit.analysis.runframe import AnalysisError, Runs, as_runs
from labkit.errors import RunLogError
from labkit.run.log import EVAL
from labkit.run.outcomes import read_outcomes

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


GAIN_COLUMNS = ["run", "prompts", "group_size", "seed", "name", "n", "before", "after", "change",
                "change_low", "change_high", "paired", "stderr", "trained_steps"]


def heldout_gains(runs: Runs) -> pd.DataFrame:
    """One row per run that was evaluated both before training and after its last step:
    run, prompts, group_size, seed, name (eval/gsm8k_test), n, before, after, change, its
    interval (change_low, change_high: paired over the problems when the run kept each
    problem's outcome, `paired`; else from the two evaluations' binomial errors), stderr (of
    one evaluation, at the 'after' accuracy), trained_steps."""
    return _gains_frame(_evaluated_runs(runs))


def _gains_frame(found: dict) -> pd.DataFrame:
    out = []
    for name, (first, b, a, change) in found.items():
        interval = setting_change([change])
        out.append({"run": name, "prompts": first.get("prompts"), "group_size": first.get("group_size"),
                    "seed": first.get("seed"), "name": a["name"], "n": int(a["n"]),
                    "before": b.accuracy, "after": a.accuracy, "change": a.accuracy - b.accuracy,
                    "change_low": interval.low, "change_high": interval.high,
                    "paired": change.paired, "stderr": a.stderr, "trained_steps": int(a.trained_steps)})
    return pd.DataFrame(out, columns=GAIN_COLUMNS)


def heldout_change(run_dir) -> dict | None:
    """One run folder's held-out result: name (eval/synthetic_test), n, before, after, and
    `interval` (labkit.analysis.paired.Interval of the change: paired over the problems when
    the run kept their outcomes); None when the run was not evaluated at both ends."""
    ends = _ends(run_dir)
    if ends is None:
        return None
    b, a = ends
    change = _change(run_dir, b, a)
    return {"name": a["name"], "n": int(a["n"]), "before": b.accuracy, "after": a.accuracy,
            "interval": setting_change([change])}


def heldout_line(found: dict | None) -> str:
    """heldout_change's result in words: "held-out right 0.545 -> 0.640 (+0.095, 95% interval
    +0.040 to +0.150, 200 made-up problems)"; "" for None (a run not evaluated at both ends)."""
    if found is None:
        return ""
    i = found["interval"]
    source = found["name"].removeprefix("eval/").rsplit("_", 1)[0]
    what = {"synthetic": "made-up problems", "gsm8k": "GSM8K test problems"}.get(
        source, f"{source} test problems")
    return (f"held-out right {found['before']:.3f} -> {found['after']:.3f} ({i.estimate:+.3f}, "
            f"{i.level:.0%} interval {i.low:+.3f} to {i.high:+.3f}"
            f"{'' if i.paired else ' unpaired'}, {found['n']:,} {what})")


def _evaluated_runs(runs: Runs) -> dict:
    """run -> (its first frame row, the 'before' and 'after' evaluations, its RunChange), for
    the runs evaluated before training and after their last step."""
    runs = as_runs(runs)
    out = {}
    for name, rows in runs.groupby("run", sort=False):
        first = rows.iloc[0]
        ends = _ends(first["path"]) if first.get("source") == "labkit" else None
        if ends is not None:
            out[name] = (first, *ends, _change(first["path"], *ends))
    return out


def _ends(run_dir):
    """(the evaluation before training, the one after the last step) of a run folder, as
    rows of read_evaluations; None when it lacks either."""
    evals = read_evaluations(run_dir)
    if evals.empty:
        return None
    before = evals[evals.trained_steps == 0]
    after = evals[evals.trained_steps == evals.trained_steps.max()]
    if before.empty or after.iloc[0].trained_steps == 0:
        return None
    return before.iloc[0], after.iloc[0]


def _change(run_dir, b, a) -> RunChange:
    """The run's RunChange: paired when eval_outcomes.jsonl holds both evaluations (on the
    same problems), else from the two accuracies."""
    try:
        kept = read_outcomes(run_dir)
    except RunLogError as e:
        warnings.warn(f"{e}; its held-out change is read unpaired", stacklevel=3)
        kept = {}
    ob, oa = kept.get(int(b.trained_steps)), kept.get(int(a.trained_steps))
    if ob is not None and oa is not None and ob.ids == oa.ids:
        d = per_problem_change(ob.right, oa.right)
        return RunChange(float(d.mean()), ob.ids, d, problems=len(d))
    return unpaired_run(b.accuracy, a.accuracy, int(b.n), int(a.n))


def group_heldout(runs: Runs, reference: int | str | None = None, *,
                  by: str = "setting") -> pd.DataFrame:
    """One row per setting (prompts x answers): setting ("32 x 8"), prompts, group_size,
    seeds, the 'before' accuracy, the range of 'after' over seeds, the range of the change
    over seeds (change_low, change_high), the standard error of one evaluation; the mean
    change with its interval over the problems and the seeds (change, ci_low, ci_high;
    `paired` when every run kept its outcomes); and with a `reference` (a setting, or a group
    size with by="group_size"), each setting's change minus the reference's with its interval
    (vs_reference, vs_low, vs_high; NaN on the reference's own row).
    Raises AnalysisError when no run was evaluated at both ends."""
    found = _evaluated_runs(runs)
    gains = _gains_frame(found)
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
    changes = {name: change for name, (*_, change) in found.items()}
    groups = {key: [changes[r] for r in g.run] for key, g in gains.groupby(SETTING, sort=True)}
    keyed = {(setting(*k) if by == "setting" else k[1]): k for k in groups}
    ref = groups.get(keyed.get(reference)) if reference is not None else None
    rows = []
    for (prompts, answers), g in gains.groupby(SETTING, sort=True):
        mine = groups[(prompts, answers)]
        interval = setting_change(mine)
        row = {"setting": setting(prompts, answers), "prompts": prompts,
               "group_size": answers, "seeds": len(g),
               "before": g.before.mean(), "after_low": g.after.min(), "after_high": g.after.max(),
               "after_mean": g.after.mean(), "change_low": g.change.min(),
               "change_high": g.change.max(), "stderr": g.stderr.mean(), "n": int(g.n.max()),
               "change": interval.estimate, "ci_low": interval.low, "ci_high": interval.high,
               "paired": interval.paired, "vs_reference": math.nan, "vs_low": math.nan,
               "vs_high": math.nan}
        if ref is not None and mine is not ref:
            vs = difference(mine, ref)
            row.update(vs_reference=vs.estimate, vs_low=vs.low, vs_high=vs.high,
                       paired=row["paired"] and vs.paired)
        rows.append(row)
    return pd.DataFrame(rows)


def heldout_verdict(table: pd.DataFrame, reference: int | str, *, by: str = "setting") -> str:
    """In words, from group_heldout's table (made with the same `reference`): did training
    move held-out accuracy (each setting's interval over problems and seeds against zero),
    and does any setting's change differ from the reference's (the interval of the
    difference against zero: "inside one range" when every one spans zero)?"""
    key = table.setting if by == "setting" else table.group_size
    name = (lambda k: f"{k}") if by == "setting" else (lambda k: f"{k} answers")
    above = table.ci_low > 0
    moved = ("moved it" if above.all() else "did not move it clearly" if not above.any()
             else "moved it in some settings only")
    level = f"{LEVEL:.0%}"
    per = "; ".join(f"{name(k)} {r.change:+.3f} ({r.ci_low:+.3f} to {r.ci_high:+.3f})"
                    for k, r in zip(key, table.itertuples()))
    seeds = int(table.seeds.min())
    basis = ("over the problems; one seed a setting, so not over seeds" if seeds < 2
             else "over the problems and the seeds")
    text = [f"Held-out: training {moved}: from {table.before.mean():.3f} before, the change "
            f"({level} interval {basis}) was {per}."]
    if not table.paired.all():
        text.append("Unpaired: some runs kept no per-problem outcomes, so their intervals come "
                    "from each evaluation's binomial error.")
    others = table[(key != reference) & table.vs_reference.notna()]
    if not (key == reference).any() or others.empty:
        text.append(f"Nothing to read against {name(reference)}.")
        return " ".join(text)
    apart = [f"{name(k)} {r.vs_reference:+.3f} ({r.vs_low:+.3f} to {r.vs_high:+.3f})"
             for k, r in zip(key[others.index], others.itertuples())
             if r.vs_low > 0 or r.vs_high < 0]
    if apart:
        text.append(f"Not inside one range: against {name(reference)}, the change differs for "
                    f"{', '.join(apart)}.")
    else:
        worst = others.loc[(others.vs_reference.abs()).idxmax()]
        text.append(f"Inside one range: against {name(reference)}, every setting's difference "
                    f"in change has an interval that spans zero (the largest, "
                    f"{name(key[worst.name])} {worst.vs_reference:+.3f}, {worst.vs_low:+.3f} to "
                    f"{worst.vs_high:+.3f}).")
    return " ".join(text)
