"""Figures of runs side by side, saved as PNG and SVG: the steps behind the comparison table.

One figure per question of the course: does the reward rise (with the two windows of the
gain shaded, and the seeds of one group size as a min-max band around their mean), what does
a rollout cost (with the heat pauses shaded, since a paused or throttled GPU makes a step
look slow), how long are the answers, how many groups taught nothing (all answers equal),
and did held-out accuracy move (per setting, with paired intervals over problems and seeds).

Every function takes the frame from `labkit.analysis.load_runs` (or paths) and returns a
matplotlib Figure. Figures are closed in pyplot as soon as they are built, so a notebook
shows one exactly once, when it is the cell's value, and scripts never pile up open figures.
Without a display (a terminal, CI) the Agg backend is chosen; a notebook keeps its inline one.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable
from pathlib import Path

import matplotlib


def _use_agg_without_display() -> None:
    """Choose Agg in a headless process that has not picked a backend, but never in a notebook."""
    headless = sys.platform.startswith("linux") and not (
        os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"))
    chosen = os.environ.get("MPLBACKEND") or "matplotlib.pyplot" in sys.modules
    if headless and not chosen and "ipykernel" not in sys.modules:
        matplotlib.use("Agg")


_use_agg_without_display()

import matplotlib.pyplot as plt  # noqa: E402  (after the backend choice)
import pandas as pd  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402
from matplotlib.transforms import blended_transform_factory  # noqa: E402

from labkit.analysis.costs import common_clean_steps, run_costs  # noqa: E402
from labkit.analysis.gains import EARLY, LATE  # noqa: E402
from labkit.analysis.runframe import (  # noqa: E402
    RESPONSE_LEN,
    REWARD,
    ROLLOUT_TIME,
    ZERO_STD,
    Runs,
    as_runs,
    is_constructed,
    is_stopped,
    metric_values,
    status_text,
)
from labkit.run.metrics import STEP  # noqa: E402

STEP_LABEL = "step (rollout index, from 0)"
PAUSE_COLOR = "tab:red"


# ====================================================================== shared pieces
def _figure(nrows: int = 1, *, height: float = 4.2, sharey: bool = False):
    """A new figure, closed in pyplot at once (see the module docstring)."""
    fig, axes = plt.subplots(nrows, 1, figsize=(8.0, height), sharex=True, sharey=sharey,
                             layout="constrained", squeeze=False)
    plt.close(fig)
    return fig, list(axes[:, 0])


def _single_axes(ax, height: float = 4.6):
    """(figure, axes, whether the figure is ours): `ax` when given, else a new figure."""
    if ax is not None:
        return ax.figure, ax, False
    fig, axes = _figure(height=height)
    return fig, axes[0], True


def _colors(runs: pd.DataFrame, by: str = "group_size") -> dict:
    """One color per group size (or per value of `by`), the same in every figure of these runs."""
    return {g: f"C{i}" for i, g in enumerate(sorted(runs[by].unique()))}


def _group_label(by: str, value) -> str:
    units = {"group_size": "answers", "prompts": "prompts"}  # a count reads "8 answers"
    return f"{value} {units[by]}" if by in units else f"{by} {value:g}"


def _caption(runs: pd.DataFrame) -> str:
    """What the runs share (or not): model, engine, prompts per step, runs; and which runs
    are constructed (made up), so a figure never passes one off as measured."""
    per_run = runs.groupby("run", sort=False).first()

    def joined(col: str) -> str:
        return ", ".join(str(v) for v in per_run[col].dropna().unique()) or "?"

    made_up = [str(r) for r in per_run.index if is_constructed(r)]
    return (f"model {joined('model')} · engine {joined('engine')} · "
            f"{joined('prompts')} prompts per step · {len(per_run)} run{'s' * (len(per_run) != 1)}"
            + (f"\nCONSTRUCTED (made up, not measured): {', '.join(made_up)}" if made_up else ""))


def _step_axis(ax, runs: pd.DataFrame) -> None:
    """The x axis spans the runs' steps, whole numbers only (a 1-step run is one tick, not 0.04s)."""
    steps = runs[STEP]
    ax.set_xlim(int(steps.min()) - 0.5, int(steps.max()) + 0.5)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True, min_n_ticks=1))


def _title(fig: Figure, ax, title: str, runs: pd.DataFrame) -> None:
    fig.suptitle(title, x=0.01, ha="left", fontsize=12, fontweight="bold")
    ax.set_title(_caption(runs), loc="left", fontsize=8, color="0.35")


def _draw_by_group(ax, runs: pd.DataFrame, column: str, by: str = "group_size") -> bool:
    """Draw `column` per step: a group size (or value of `by`) with several seeds as its mean
    line and a min-max band (on the steps all its seeds have), one with one seed as that
    run's line. Returns False when no run logged `column`."""
    if column not in runs or runs[column].notna().sum() == 0:
        return False
    colors = _colors(runs, by)
    for g, group in runs.groupby(by, sort=True):
        wide = group.pivot(index=STEP, columns="run", values=column)
        wide = wide.apply(pd.to_numeric, errors="coerce").dropna(axis=1, how="all")
        if wide.shape[1] == 0:
            continue
        color, name = colors[g], _group_label(by, g)
        stopped = [status_text(run) for _, run in group.groupby("run", sort=False)
                   if run.run.iat[0] in wide.columns and is_stopped(run)]
        if wide.shape[1] == 1:
            seed = group.seed.iat[0]
            ended = f"; {stopped[0]}" if stopped else ""
            ax.plot(wide.index, wide.iloc[:, 0], color=color, lw=1.8, marker="o", ms=3,
                    label=f"{name} (1 run, seed {seed}{ended})")
            continue
        shared = wide.dropna()
        ended = f" ({len(stopped)} stopped)" if stopped else ""
        ax.fill_between(shared.index, shared.min(axis=1), shared.max(axis=1), color=color,
                        alpha=0.22, lw=0, label=f"{name}: min-max of {wide.shape[1]} seeds{ended}")
        ax.plot(shared.index, shared.mean(axis=1), color=color, lw=1.8, marker="o", ms=3,
                label=f"{name}: mean of {wide.shape[1]} seeds{ended}")
        tails = [wide[run][~wide.index.isin(shared.index)].dropna() for run in wide.columns]
        for i, tail in enumerate(t for t in tails if len(t)):  # steps only some seeds have
            ax.plot(tail.index, tail, color=color, lw=0.9, alpha=0.7, ls="--",
                    label=None if i else f"{name}: steps only some seeds ran")
    return True


def _legend(fig: Figure, ax, own: bool) -> None:
    """A legend below the plot on our own figure (it never hides data), else the best corner."""
    handles, labels = ax.get_legend_handles_labels()
    if not handles:
        return
    if own:
        fig.legend(handles, labels, loc="outside lower center", ncol=2, fontsize=8, frameon=False)
    else:
        ax.legend(fontsize=8, loc="best")


def _headroom(ax, share: float = 0.15) -> None:
    """Room above the data for the labels drawn at the top of the axes."""
    low, high = ax.get_ylim()
    ax.set_ylim(low, high + share * (high - low))


def _no_data(ax, column: str) -> None:
    ax.text(0.5, 0.5, f"no run logged {column}", transform=ax.transAxes, ha="center",
            va="center", color="0.4")


def _spans(steps: Iterable[int]) -> list[tuple[int, int]]:
    """Consecutive step numbers merged into (first, last) spans."""
    spans: list[list[int]] = []
    for s in sorted(int(x) for x in steps):
        if spans and s == spans[-1][1] + 1:
            spans[-1][1] = s
        else:
            spans.append([s, s])
    return [(a, b) for a, b in spans]


# ====================================================================== the figures
def reward_curve(runs: Runs, *, early=EARLY, late=LATE, ax=None, by: str = "group_size") -> Figure:
    """Mean reward per step of each group size, with the gain's two windows shaded.

    `runs`: a frame from load_runs, or paths. `early`, `late`: (first, last) steps of the
    windows; a window is shaded once a run reaches its last step (a short run shows its own
    steps, not an empty axis up to step 23). `ax`: draw into this axes instead of a new
    figure. `by`: the column whose values get a line each ("lr" for a learning-rate probe,
    "prompts" for a rollout batch size sweep). Returns the Figure.
    """
    runs = as_runs(runs)
    fig, ax, own = _single_axes(ax)
    label = blended_transform_factory(ax.transData, ax.transAxes)
    last = int(runs[STEP].max())
    reached = [(w, name) for w, name in [(early, "early"), (late, "late")] if last >= w[1]]
    for (a, b), name in reached:
        ax.axvspan(a - 0.5, b + 0.5, color="0.9", zorder=0)
        ax.text((a + b) / 2, 0.98, f"{name} window\nsteps {a}-{b}", transform=label,
                ha="center", va="top", fontsize=8, color="0.3")
    if not _draw_by_group(ax, runs, REWARD, by):
        _no_data(ax, REWARD)
    low, high = ax.get_ylim()  # a reward is 0 to 1: a flat 0 is drawn near the bottom, not mid-axis
    ax.set_ylim(max(low, -0.02), max(high, 0.1))
    _headroom(ax)
    _step_axis(ax, runs)
    ax.set_xlabel(STEP_LABEL)
    ax.set_ylabel("mean reward per answer (0 to 1)")
    _legend(fig, ax, own)
    title = "Reward per step"
    if len(reached) == 2:
        title += ": gain = mean of the late window - mean of the early window"
    else:
        title += (f" (gain windows {early[0]}-{early[1]} and {late[0]}-{late[1]} "
                  f"shaded once reached)")
    _title(fig, ax, title, runs)
    return fig


def rollout_time_curve(runs: Runs, *, last_step: int | None = LATE[1]) -> Figure:
    """Rollout time per step, one panel per run, with the steps a heat pause touched shaded.

    A step is shaded when its heat/clean is false or its run's heat.jsonl records a pause
    inside it. Filled dots are the steps the table's median uses (the common clean steps),
    and the dashed line is that median (or the all-steps median, marked as including pauses,
    for a run with no clean step). `last_step`: the table's last compared step (None: all).
    """
    runs = as_runs(runs)
    if last_step is not None:
        runs = runs[runs[STEP] <= last_step]
    costs = run_costs(runs).set_index("run")
    common, _ = common_clean_steps(runs)
    names = list(costs.index)
    fig, axes = _figure(len(names), height=1.4 + 1.6 * len(names), sharey=True)
    colors = _colors(runs)
    for ax, name in zip(axes, names):
        _draw_time_panel(ax, runs[runs.run == name], costs.loc[name], common, colors,
                         alone=len(names) == 1)
    top = pd.to_numeric(runs.get(ROLLOUT_TIME, pd.Series(dtype=float)), errors="coerce").max()
    axes[0].set_ylim(0, 1.45 * top if top > 0 else 1.0)  # room for each panel's label
    _step_axis(axes[-1], runs)  # the panels share their x axis
    axes[-1].set_xlabel(STEP_LABEL)
    paused = bool(_paused_steps(runs).any())
    handles = [Line2D([], [], color="0.3", marker="o", ls="", label="step used in the median"),
               Line2D([], [], color="0.3", marker="o", mfc="white", ls="", label="step not used"),
               Line2D([], [], color="0.3", ls="--", label="median")]
    if paused:
        handles.insert(0, Patch(color=PAUSE_COLOR, alpha=0.3, label="step touched by a heat pause"))
    fig.legend(handles=handles, loc="outside lower center", ncol=4, fontsize=8, frameon=False)
    _title(fig, axes[0], _time_title(runs, paused), runs)
    return fig


def _paused_steps(runs: pd.DataFrame) -> pd.Series:
    """Per row: a heat pause touched the step (heat/clean false, or heat.jsonl has a pause)."""
    return ~runs["clean"].astype(bool) | (runs["heat_pause_s"] > 0)


def _time_title(runs: pd.DataFrame, paused: bool) -> str:
    """The timing figure's title: the heat pauses only where there could be some. A run whose
    guard read no temperature (a CPU run: no GPU) cannot pause, so its title does not say
    pause."""
    if paused:
        return "Rollout time per step, steps touched by a heat pause shaded"
    read = "heat/max_temp_c" in runs and pd.to_numeric(runs["heat/max_temp_c"],
                                                       errors="coerce").notna().any()
    return ("Rollout time per step: no step was touched by a heat pause" if read
            else "Rollout time per step")


def _draw_time_panel(ax, run: pd.DataFrame, cost: pd.Series, common: list[int],
                     colors: dict[int, str], alone: bool = False) -> None:
    """One run's rollout time per step, its paused steps shaded, its median dashed. `alone`:
    the figure's only run (its median is over its own clean steps: no others to share)."""
    paused = run.loc[_paused_steps(run), STEP]
    for a, b in _spans(paused):
        ax.axvspan(a - 0.5, b + 0.5, color=PAUSE_COLOR, alpha=0.13, lw=0, zorder=0)
    time = metric_values(run, ROLLOUT_TIME)
    if time.isna().all():
        _no_data(ax, ROLLOUT_TIME)
    else:
        color = colors[cost.group_size]
        used = run[STEP].isin(common).to_numpy() & (cost.basis == "common clean steps")
        ax.plot(run[STEP], time, color=color, lw=1.2)
        ax.plot(run[STEP][~used], time[~used], "o", ms=3.5, mfc="white", mec=color)
        ax.plot(run[STEP][used], time[used], "o", ms=3.5, color=color)
        ax.axhline(cost.time_s, color=color, ls="--", lw=1)
    ax.text(0.01, 0.95, _panel_text(run.run.iat[0], cost, len(common), alone=alone),
            transform=ax.transAxes, va="top", fontsize=8,
            bbox=dict(fc="white", ec="none", alpha=0.8))
    ax.set_ylabel("rollout time (s)")


def _panel_text(name: str, cost: pd.Series, n_common: int, *, alone: bool = False) -> str:
    head = f"{name}: {cost.group_size} answers, seed {cost.seed}"
    if is_constructed(name):
        head = f"CONSTRUCTED (made up) {head}"
    if cost.basis == "common clean steps" and alone:
        if cost.clean_steps == cost.steps:
            return f"{head}\nmedian {cost.time_s:.1f} s over its {cost.steps} steps"
        return (f"{head}\nmedian {cost.time_s:.1f} s on its {cost.clean_steps} clean steps "
                f"(of {cost.steps})")
    if cost.basis == "common clean steps":
        return f"{head}\nmedian {cost.time_s:.1f} s on the {n_common} common clean steps"
    if cost.basis == "own clean steps":
        return f"{head}\nmedian {cost.time_s:.1f} s on its own {cost.clean_steps} clean steps"
    if cost.basis == "all steps, includes pauses":
        return f"{head}\nno clean step: median {cost.time_s:.1f} s includes the pauses"
    return head


def response_length_curve(runs: Runs, *, ax=None) -> Figure:
    """Mean response length per step of each group size (seeds as a min-max band).

    `runs`: a frame from load_runs, or paths; `ax`: draw into it. Returns the Figure.
    """
    return _metric_curve(runs, RESPONSE_LEN, ax=ax, ylabel="mean response length (tokens)",
                         title="Response length per step", top=None)


def zero_std_curve(runs: Runs, *, ax=None) -> Figure:
    """Fraction of groups whose answers all got the same reward (no GRPO signal), per step.

    `runs`: a frame from load_runs, or paths; `ax`: draw into it. Returns the Figure.
    """
    return _metric_curve(runs, ZERO_STD, ax=ax, ylabel="all-equal groups (fraction of groups)",
                         title="Groups that teach nothing: every answer got the same reward",
                         top=1.02)


def _metric_curve(runs: Runs, metric: str, *, ax, ylabel: str, title: str,
                  top: float | None) -> Figure:
    """One metric per step, a line per group size with its seeds as a band; y from 0 to `top`
    (None: 5% above the data)."""
    runs = as_runs(runs)
    fig, ax, own = _single_axes(ax)
    if not _draw_by_group(ax, runs, metric):
        _no_data(ax, metric)
    ax.set_ylim(0, ax.get_ylim()[1] * 1.05 if top is None else top)
    _step_axis(ax, runs)
    ax.set_xlabel(STEP_LABEL)
    ax.set_ylabel(ylabel)
    _legend(fig, ax, own)
    _title(fig, ax, title, runs)
    return fig


# ====================================================================== saving
def heldout_plot(runs: Runs, *, ax=None) -> Figure:
    """How held-out accuracy changed in training, one column per setting (prompts x answers):
    each seed's change as a dot with its interval (paired over the problems where the run kept
    their outcomes), the setting's mean change as a bar with its interval over the problems
    and the seeds, and zero as a line across: a bar that crosses it is no change. Settings
    with no evaluation are left out."""
    from labkit.analysis.heldout import group_heldout, heldout_gains

    runs = as_runs(runs)
    gains = heldout_gains(runs)
    fig, ax, own = _single_axes(ax)
    _title(fig, ax, "Held-out accuracy: change in training, by setting", runs)
    if gains.empty:
        _no_data(ax, "eval.jsonl (held-out accuracy)")
        return fig
    settings = group_heldout(runs).set_index("setting")
    gains = gains.assign(key=[f"{int(p)} x {int(n)}" for p, n in zip(gains.prompts, gains.group_size)])
    order = sorted(gains.key.unique(), key=lambda k: (int(k.split(" x ")[1]), int(k.split(" x ")[0])))
    for x, key in enumerate(order):
        mine = gains[gains.key == key].sort_values("seed")
        g = settings.loc[key]
        ax.bar(x, g.change, width=0.5, color=f"C{x}", alpha=0.25)
        ax.errorbar([x - 0.3], [g.change], yerr=[[g.change - g.ci_low], [g.ci_high - g.change]],
                    fmt="s", color=f"C{x}", capsize=4, lw=2, ms=5)
        offsets = [0.0] if len(mine) == 1 else [(-0.12 + 0.24 * i / (len(mine) - 1)) for i in range(len(mine))]
        ax.errorbar([x + o for o in offsets], mine.change,
                    yerr=[mine.change - mine.change_low, mine.change_high - mine.change],
                    fmt="o", color=f"C{x}", capsize=2, ms=5, lw=1)
        for o, r in zip(offsets, mine.itertuples()):
            ax.annotate(f"s{r.seed}", (x + o, r.change), textcoords="offset points", xytext=(5, -3),
                        fontsize=7, color="0.35")
    ax.axhline(0.0, color="0.3", lw=1)
    paired = "paired" if gains.paired.all() else "some unpaired"
    before = gains.before.mean()
    ax.set_xticks(range(len(order)), [f"{k}\n({(gains.key == k).sum()} seeds)" for k in order])
    ax.set_xlim(-0.6, len(order) - 0.5)
    ax.set_xlabel("prompts x answers per step")
    ax.set_ylabel(f"change in {gains.name.iat[0]}\n(from {before:.3f} before training)")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(handles=[
        Line2D([], [], color="0.3", marker="s", lw=2, label="setting: mean change, 95% interval "
                                                            "over problems and seeds"),
        Line2D([], [], color="0.3", marker="o", lw=1, label=f"one seed: its change, 95% interval "
                                                            f"over problems ({paired})")],
        loc="upper left", fontsize=8, frameon=False)
    _headroom(ax, 0.25)
    return fig


def save_figure(fig: Figure, out_dir: str | os.PathLike, name: str) -> list[Path]:
    """Write `fig` as <out_dir>/<name>.png (150 dpi) and .svg; returns the two paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    stem = Path(name).stem if Path(name).suffix in (".png", ".svg") else name
    paths = [out / f"{stem}.png", out / f"{stem}.svg"]
    fig.savefig(paths[0], dpi=150)
    fig.savefig(paths[1], metadata={"Date": None})  # no date: the same runs give the same file
    return paths


def plot_all(runs: Runs, out_dir: str | os.PathLike, *, early=EARLY, late=LATE) -> list[Path]:
    """Draw the four figures of `runs` and save each as PNG and SVG in `out_dir`; returns the paths."""
    runs = as_runs(runs)
    figures = {
        "reward": reward_curve(runs, early=early, late=late),
        "rollout_time": rollout_time_curve(runs, last_step=late[1]),
        "response_length": response_length_curve(runs),
        "zero_std": zero_std_curve(runs),
    }
    from labkit.analysis.heldout import heldout_gains

    if not heldout_gains(runs).empty:
        figures["heldout"] = heldout_plot(runs)
    return [p for name, fig in figures.items() for p in save_figure(fig, out_dir, name)]
