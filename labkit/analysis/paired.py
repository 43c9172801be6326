"""Paired intervals: a held-out change read problem by problem, and across seeds.

Before and after training a run answers the same test problems, and two runs evaluated on
one test split answer the same problems too. So a change is read per problem (right before,
right after) instead of as two accuracies, each with its own binomial error: what every
problem shares (how hard it is) cancels, and the interval is far tighter. On GSM8K's 1,319
test problems one accuracy has a standard error of ~0.012; the paired change of a run that
moved 12% of the problems either way has one of ~0.007.

The intervals are percentile bootstraps (numpy's generator, a fixed seed: the same runs
give the same interval). Within one run the problems are resampled. Across runs the
resampling is stratified, as `rliable` does for few runs (Agarwal et al. 2021, "Deep RL at the
edge of the statistical precipice"): the problems are drawn once per resample for every
run (they are the same problems, so two settings stay paired), and each setting's seeds
are drawn from its own seeds, so an interval spans both what the problems and what the
seeds would vary. With one seed a setting's interval spans the problems only, and says so;
with three, the seeds' part of it is rough (a bootstrap of three draws), and no
interval can show more of the seeds than they spread.

A run evaluated before labkit kept each problem's outcome (eval.jsonl only) still reads:
its change is then drawn from a normal of the two evaluations' independent binomial errors
(`paired=False`, and said so), which is what the old tables showed as "SE".

    paired_change(before_right, after_right)         # one run: +0.21 (+0.15 to +0.27)
    setting_change({"s1": d1, "s2": d2})              # one setting over its seeds
    difference(settings["16"], settings["8"])         # 16 answers against 8, paired
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

LEVEL = 0.95  # the intervals' coverage
RESAMPLES = 4000  # bootstrap draws: the interval's ends move by ~0.002 between generator seeds
SEED = 0  # the generator's seed: the same runs give the same interval


@dataclass(frozen=True)
class Interval:
    """An estimate and its LEVEL interval: `problems` evaluated (in common), `seeds` runs
    behind it (a difference: the fewer side's), `paired` whether it was read problem by
    problem."""

    estimate: float
    low: float
    high: float
    problems: int
    seeds: int = 1
    paired: bool = True
    level: float = LEVEL

    @property
    def excludes_zero(self) -> bool:
        """Whether the whole interval lies on one side of zero: a change, not noise."""
        return self.low > 0 or self.high < 0

    def text(self) -> str:
        """"+0.210 (95% interval +0.150 to +0.270)", with "unpaired" when it was not paired."""
        kind = "" if self.paired else ", unpaired"
        return (f"{self.estimate:+.3f} ({self.level:.0%} interval {self.low:+.3f} to "
                f"{self.high:+.3f}{kind})")

    def range_text(self) -> str:
        """"+0.150 to +0.270" (the interval alone)."""
        return f"{self.low:+.3f} to {self.high:+.3f}"


@dataclass(frozen=True)
class RunChange:
    """One run's per-problem change on the problems `ids` (after minus before: -1, 0, 1), or,
    for a run without per-problem outcomes, its change and that change's standard error."""

    change: float
    ids: tuple[str, ...] = ()
    per_problem: np.ndarray | None = None  # int8, one per id
    stderr: float = math.nan  # unpaired runs only: sqrt(se_before^2 + se_after^2)
    problems: int = 0

    @property
    def paired(self) -> bool:
        return self.per_problem is not None


def paired_change(before, after, *, level: float = LEVEL, resamples: int = RESAMPLES,
                  seed: int = SEED) -> Interval:
    """The change in the share right from `before` to `after` (one bool per problem, the
    same problems in the same order) with its paired bootstrap interval over problems."""
    d = per_problem_change(before, after)
    ids = tuple(str(i) for i in range(len(d)))
    return setting_change([RunChange(float(d.mean()), ids, d, problems=len(d))],
                          level=level, resamples=resamples, seed=seed)


def per_problem_change(before, after) -> np.ndarray:
    """after - before per problem (int8: -1 lost, 0 kept, +1 gained); ValueError when the
    two are not the same number of problems, or none."""
    b, a = np.asarray(before, dtype=np.int8), np.asarray(after, dtype=np.int8)
    if b.shape != a.shape or b.ndim != 1 or not len(b):
        raise ValueError(f"before and after must be outcomes of the same problems "
                         f"({b.shape} and {a.shape})")
    return a - b


def unpaired_run(before: float, after: float, n_before: int, n_after: int) -> RunChange:
    """A run read from its two accuracies only: its change and the change's standard error,
    the two evaluations taken as independent (binomial errors)."""
    se = math.sqrt(_binomial_var(before, n_before) + _binomial_var(after, n_after))
    return RunChange(after - before, stderr=se, problems=min(n_before, n_after))


def setting_change(runs, *, level: float = LEVEL, resamples: int = RESAMPLES,
                   seed: int = SEED) -> Interval:
    """The mean change of a setting's `runs` (RunChange, one per seed; a dict's values are
    taken), with an interval that spans the problems and the seeds (stratified bootstrap)."""
    runs = _runs(runs)
    draws = _setting_draws(runs, _problem_weights(runs, resamples, seed), resamples, seed + 1)
    return _interval(float(np.mean([r.change for r in runs])), draws, level, runs)


def difference(a, b, *, level: float = LEVEL, resamples: int = RESAMPLES,
               seed: int = SEED) -> Interval:
    """Setting `a`'s mean change minus setting `b`'s (each a list or dict of RunChange, its
    seeds), paired over the problems both answered, with an interval that spans the problems
    and both settings' seeds. Unpaired (normal draws per run) when a run has no outcomes."""
    a, b = _runs(a), _runs(b)
    both = a + b
    weights = _problem_weights(both, resamples, seed)
    if weights is not None:  # paired: restrict both sides to the problems every run answered
        a, b = _on_common(a, weights[1]), _on_common(b, weights[1])
    draws = (_setting_draws(a, weights, resamples, seed + 1)
             - _setting_draws(b, weights, resamples, seed + 2))
    estimate = float(np.mean([r.change for r in a]) - np.mean([r.change for r in b]))
    shown = _interval(estimate, draws, level, both)
    return Interval(shown.estimate, shown.low, shown.high, shown.problems,
                    min(len(a), len(b)), shown.paired, level)


# ----------------------------------------------------------------------------- internals
def _runs(runs) -> list[RunChange]:
    runs = list(runs.values()) if isinstance(runs, dict) else list(runs)
    if not runs:
        raise ValueError("no runs to read a change from")
    return runs


def _binomial_var(p: float, n: int) -> float:
    return p * (1 - p) / max(n, 1) if 0 <= p <= 1 else math.nan


def _problem_weights(runs: list[RunChange], resamples: int, seed: int):
    """(resamples x problems weights, the common ids) when every run has per-problem
    outcomes on a set of problems they share; None otherwise (then nothing is paired). Each
    row of weights counts how often a problem is drawn in that resample, over its total."""
    if not all(r.paired for r in runs):
        return None
    common = set(runs[0].ids)
    for r in runs[1:]:
        common &= set(r.ids)
    if not common:
        return None
    ids = tuple(i for i in runs[0].ids if i in common)
    rng = np.random.default_rng(seed)
    counts = rng.multinomial(len(ids), np.full(len(ids), 1 / len(ids)), size=resamples)
    return counts / len(ids), ids


def _on_common(runs: list[RunChange], ids: tuple[str, ...]) -> list[RunChange]:
    """Each run's per-problem change on `ids` only, in that order (its change recomputed)."""
    out = []
    for r in runs:
        where = {i: k for k, i in enumerate(r.ids)}
        d = r.per_problem[[where[i] for i in ids]]
        out.append(RunChange(float(d.mean()), ids, d, problems=len(ids)))
    return out


def _setting_draws(runs: list[RunChange], weights, resamples: int, seed: int) -> np.ndarray:
    """`resamples` draws of a setting's mean change: its seeds resampled (stratified), each
    seed's change under the shared problem weights, or a normal draw around an unpaired run's
    change."""
    rng = np.random.default_rng(seed)
    if weights is not None:
        w, ids = weights
        runs = _on_common(runs, ids) if any(r.ids != ids for r in runs) else runs
        per_run = w @ np.stack([r.per_problem.astype(float) for r in runs]).T  # resamples x runs
    else:
        changes = np.array([r.change for r in runs])
        spread = np.array([r.stderr if not r.paired else _paired_se(r) for r in runs])
        per_run = changes + rng.standard_normal((resamples, len(runs))) * spread
    if len(runs) == 1:
        return per_run[:, 0]
    pick = rng.integers(0, len(runs), size=(resamples, len(runs)))
    return np.take_along_axis(per_run, pick, axis=1).mean(axis=1)


def _paired_se(r: RunChange) -> float:
    """The standard error of a paired run's mean change (used only when another run of the
    comparison is unpaired, so the draws are normal)."""
    return float(r.per_problem.std(ddof=1) / math.sqrt(len(r.per_problem))) if len(r.per_problem) > 1 else 0.0


def _interval(estimate: float, draws: np.ndarray, level: float, runs: list[RunChange]) -> Interval:
    tail = (1 - level) / 2 * 100
    low, high = np.percentile(draws, [tail, 100 - tail])
    return Interval(estimate, float(low), float(high), min(r.problems for r in runs), len(runs),
                    all(r.paired for r in runs), level)
