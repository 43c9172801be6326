"""Live reward curves: the reward per step of runs in progress, redrawn in the cell that launched them.

Lesson 1.3's rerun cell trains for minutes (on a CPU, two 12-step runs one after the other)
and prints a line per step; a curve says more, and sooner, than a column of numbers. So the
cell draws one figure, the reward of every step each run has logged, and redraws it as new
steps land, in place (an IPython display handle, updated), not as a new figure per step:

    with labkit.course.live.reward_curves(configs):
        reruns = labkit.launch_many(configs, resume=True)

A background thread reads the runs' metrics.jsonl, which every run writes the moment a step
ends, and redraws at most every `every_s` seconds, and only when a file grew: the training
loop itself is never called or waited on, and a redraw (a small figure, well under a second)
comes once per step at most. The thread is a daemon and stops when the `with` ends, however it
ends: a stop with the kernel's interrupt button (■) reaches the main thread only, the last
redraw happens on the way out, and the figure stays in the cell's output, titled as final
(no longer "live"), each run's legend saying how it ended (completed, stopped, not started).

When launch_many refuses the runs before any starts (a run folder that holds a run of
another seed, a completed run asked for more steps), the figure it had drawn of the old
runs is taken away and the refusal is one line, with the way to run them in the rerun
cell: `rerun_configs(PROFILE, seed=2)` names runs of their own for what they change.
"""

from __future__ import annotations

import io
import re
import threading
from collections.abc import Callable, Iterable
from pathlib import Path

from labkit.analysis.runframe import REWARD
from labkit.errors import LabkitError, one_line
from labkit.run.log import CONFIG, METRICS, RunLog, read_jsonl
from labkit.run.metrics import STEP

EVERY_S = 5.0  # the least time between two redraws


class LiveCurves:
    """Redraws the reward per step of the runs in `run_dirs` into `show` (a function that
    takes a matplotlib Figure, or None to take the figure away; default: an IPython display
    handle made on `start`, or nothing outside IPython) while started. `steps`: the planned
    steps (the x axis; None: the steps logged). `labels`: a legend label per folder
    (default: its name)."""

    def __init__(self, run_dirs: Iterable, *, every_s: float = EVERY_S,
                 steps: int | None = None, labels: dict | None = None,
                 show: Callable | None = None):
        self.run_dirs = [Path(d) for d in run_dirs]
        self.every_s, self.planned = float(every_s), steps
        self.labels = {Path(k): v for k, v in (labels or {}).items()}
        self.show = show
        self.drawn_steps = 0  # steps in the figure last drawn, over all runs
        self._seen: dict[Path, tuple] = {}
        self._rewards: dict[Path, list[tuple[int, float]]] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # --- start and stop ---------------------------------------------------------------
    def start(self) -> LiveCurves:
        """Draw what is logged now, then redraw from a thread until stop()."""
        if self.show is None:
            self.show = _display_handle()
        self.redraw(force=True)
        self._thread = threading.Thread(target=self._loop, name="labkit-live", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop the thread and draw once more, as final: the figure ends with every step
        logged, and says how each run ended."""
        self._end_thread()
        self.redraw(force=True, final=True)

    def clear(self) -> None:
        """Stop the thread and take the figure away (nothing it drew was launched now)."""
        self._end_thread()
        if self.show is not None:
            self.show(None)

    def _end_thread(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)

    def __enter__(self) -> LiveCurves:
        return self.start()

    def __exit__(self, *exc) -> bool:
        self.stop()
        return False  # an interrupt or an error goes on as it came

    def _loop(self) -> None:
        while not self._stop.wait(self.every_s):
            try:
                self.redraw()
            except Exception as e:  # a figure that cannot be drawn must not end the runs
                print(f"labkit: the live figure stops ({type(e).__name__}: {e})", flush=True)
                return

    # --- reading and drawing ----------------------------------------------------------
    def read(self) -> bool:
        """Read the metrics files that changed since the last read; True when one did."""
        changed = False
        for folder in self.run_dirs:
            path = folder / METRICS
            try:
                stat = path.stat()
            except OSError:
                continue  # not started yet
            key = (stat.st_size, stat.st_mtime_ns)
            if self._seen.get(folder) == key:
                continue
            self._seen[folder] = key
            rows, _ = read_jsonl(path)  # a line being written is left for the next read
            self._rewards[folder] = [(int(r[STEP]), float(r[REWARD])) for r in rows
                                     if isinstance(r.get(STEP), int) and r.get(REWARD) is not None]
            changed = True
        return changed

    def redraw(self, force: bool = False, final: bool = False) -> None:
        """Read the logs and, when a run logged a step (or `force`), show a new figure (the
        final one with `final`)."""
        if not (self.read() or force) or self.show is None:
            return
        figure = self.figure(final=final)
        self.show(figure)

    def figure(self, final: bool = False):
        """The reward per step of every run read so far, one line each; titled live, or with
        `final` as the figure the cell ends with, each run's legend saying how it ended."""
        from matplotlib.figure import Figure
        from matplotlib.ticker import MaxNLocator

        fig = Figure(figsize=(8.0, 3.6), layout="constrained")
        ax = fig.add_subplot()
        steps = 0
        for i, folder in enumerate(self.run_dirs):
            points = sorted(self._rewards.get(folder, []))
            steps += len(points)
            label = self.labels.get(folder, folder.name)
            ended = how_it_ended(folder) if final else ""
            ended = f", {ended}" if ended else ""
            if points:
                xs, ys = zip(*points)
                ax.plot(xs, ys, color=f"C{i}", lw=1.6, marker="o", ms=3,
                        label=f"{label}: {len(points)} step{'s' * (len(points) != 1)}{ended}")
            else:
                ax.plot([], [], color=f"C{i}",
                        label=f"{label}: {'no step' if final else 'no step yet'}{ended}")
        logged = [step for points in self._rewards.values() for step, _ in points]
        last = max([(self.planned or 1) - 1, *logged])
        ax.set_xlim(-0.5, last + 0.5)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True, min_n_ticks=1))
        ax.set_ylim(-0.02, 1.02)
        ax.set_xlabel("step (rollout index, from 0)")
        ax.set_ylabel("mean reward per answer")
        ax.legend(fontsize=8, loc="upper left")
        ax.set_title(f"Reward per step: the {steps} step{'s' * (steps != 1)} logged when the "
                     f"cell ended" if final else f"Reward per step, live: redrawn as steps are "
                     f"logged ({steps} so far)", fontsize=10, loc="left")
        self.drawn_steps = steps
        return fig


def how_it_ended(folder: Path) -> str:
    """'completed', 'stopped after step 3', 'failed', ... from a run folder's status.json;
    'not started' without a folder; '' while it has no status (running, or died without one)."""
    if not folder.is_dir():
        return "not started"
    try:
        status = RunLog(folder).status() or {}
    except (LabkitError, OSError, ValueError):
        return ""
    reason, last = status.get("reason"), status.get("last_step")
    if reason == "completed":
        return "completed"
    if reason in ("signal", "requested", "time_limit"):
        return f"stopped after step {last}" if isinstance(last, int) else "stopped before a step"
    return "failed" if reason else ""


def _display_handle() -> Callable | None:
    """A function that shows a figure in place in the running cell (an IPython display
    handle's update, as a PNG image: no pyplot backend has to be set up for it), or None
    outside IPython."""
    try:
        from IPython import get_ipython
        from IPython.display import Image, display
    except ImportError:  # pragma: no cover - IPython comes with the course's environment
        return None
    if get_ipython() is None:
        return None
    handle = None

    def show(figure) -> None:
        nonlocal handle
        if figure is None:  # take it away
            if handle is not None:
                handle.update({"text/plain": ""}, raw=True)
            return
        png = io.BytesIO()
        figure.savefig(png, format="png", dpi=100)
        image = Image(data=png.getvalue(), format="png")
        if handle is None:
            handle = display(image, display_id=True)
        else:
            handle.update(image)

    return show


class RerunRefused(LabkitError):
    """launch_many refused the rerun cell's runs before any started; the message says why
    and how to run them from the cell. A notebook shows it as that one line."""

    exit_code = 2

    def _render_traceback_(self) -> list[str]:
        return [f"{type(self).__name__}: {self}"]


class RerunCurves(LiveCurves):
    """LiveCurves of the runs of `configs` (lesson 1.3's rerun cell): when the `with` ends in
    a refusal of launch_many (a LabkitError: nothing started), the figure of the runs
    already in the folders is taken away and the refusal raised again as RerunRefused,
    one line, with the rerun cell's way around it."""

    def __init__(self, configs: list, **kwargs):
        super().__init__([Path(c.output_dir) / c.run_name for c in configs], **kwargs)
        self.configs = configs

    def __exit__(self, kind, error, tb) -> bool:
        if not isinstance(error, LabkitError):
            return super().__exit__(kind, error, tb)
        self.clear()
        raise RerunRefused(f"{one_line(error)}. {rerun_advice(self.configs)}") from None


RENAMING = ("n_samples_per_prompt", "global_batch_size", "run_name", "output_dir")  # set per run


def rerun_advice(configs: list) -> str:
    """How the rerun cell runs `configs` beside the runs already in their folders: the
    rerun_configs call that names them for what they change (the fields whose values
    differ from a folder's run), and what the cells below read until then."""
    from dataclasses import fields

    from labkit.config import RunConfig
    from labkit.course.profiles import rerun_name
    from labkit.run.log import RESUMABLE, saved_config

    changes: dict = {}
    for c in configs:
        folder = Path(c.output_dir) / c.run_name
        try:
            saved = saved_config(folder) if (folder / CONFIG).exists() else None
        except LabkitError:
            saved = None
        for f in fields(RunConfig) if saved is not None else ():
            resumable = f.name in RESUMABLE and f.name != "num_rollout"
            if not resumable and f.name not in RENAMING and getattr(saved, f.name) != getattr(c, f.name):
                changes[f.name] = getattr(c, f.name)
    changes = changes or {"seed": 2}  # an example, when the folders do not say
    profile = re.match(r"rerun-([a-z]+)-n\d", configs[0].run_name or "")
    named = rerun_name(profile[1] if profile else "cpu", configs[0].n_samples_per_prompt, **changes)
    return (f"In this cell, configs = labkit.course.profiles.rerun_configs(PROFILE, "
            f"{', '.join(f'{k}={v!r}' for k, v in changes.items())}) runs them under names of their "
            f"own ({named}, ...), beside the runs already there; until this cell runs, the cells "
            f"below read the runs it launched last")


def reward_curves(configs: Iterable, *, every_s: float = EVERY_S) -> RerunCurves:
    """RerunCurves (not started: use it in a `with`) of the runs `configs` will write: each
    RunConfig's run folder (output_dir/run_name, so the configs must be named, as
    labkit.course.profiles.rerun_configs names them), labelled by its group size."""
    configs = list(configs)
    unnamed = [c for c in configs if not c.run_name]
    if unnamed:
        raise ValueError("reward_curves needs named runs (run_name) to find their folders "
                         "before they start; name them, as rerun_configs does")
    labels = {Path(c.output_dir) / c.run_name: f"{c.n_samples_per_prompt} answers" for c in configs}
    return RerunCurves(configs, every_s=every_s, labels=labels,
                       steps=max(c.num_rollout for c in configs))
