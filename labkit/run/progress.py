"""The run's progress bar, down to the phase of the step in progress.

Why: on a CPU one step of a lesson's run takes a minute or more, and a bar that counts only
steps sits at 0/1 all that time, which looks like a hang. So the bar's one line also says
what the step in progress is doing:

    GRPO steps:  0%|          | 0/3 [00:21<?, ?step/s, step 0 rollout: 3/8 answers, 212 tokens, at most 0:40 left]
    GRPO steps:  0%|          | 0/3 [00:40<?, ?step/s, step 0 update: micro-batch 1, 8/8 answers]

The rollout's numbers come from the engine (`Engine.progress`, which the transformers engine
calls as it writes), with an upper bound of the time left as soon as tokens come (every
answer running to the longest allowed, at the rate so far); the update's from a hook on the
policy's forward passes that carry a gradient (the passes that generate answers or compute
reference log-probs do not). A held-out evaluation is shown the same way. After each step
one line with its reward and times is printed above the bar, which keeps to one line
(tqdm.auto: a widget in a notebook, a text line on stderr in a terminal).

On a loaded 2-core machine one 4-answer step took 12-13 minutes instead of 20-32 s (the run
now says the load: labkit.machine.cpuload), with a clock that stood still for minutes inside a
phase. So a timer thread redraws the bar every second (its clock runs while a phase does),
and a run that stops cleanly (a signal, the time limit) closes it as stopped, not as failed
(red in a notebook).

In a notebook every redraw that changes the bar's text is a message from the kernel to the
browser, and a grader does not read them while a cell runs: nbval reads a cell's messages
only when it has ended, and past a few thousand queued (1,000 at each end of the kernel's
output socket, then what the connection holds) the rest are dropped, the cell's end among
them, and nbval fails the cell ("Timeout of 5 seconds exceeded waiting for output"). The
clock redrawn every second and the counts every half second made up to 2,700 in a 15-minute
cell. So a notebook bar redraws its clock and the counts at most every NOTEBOOK_GAP_S
seconds or NOTEBOOK_GAP_SHARE of its age, whichever is longer: about 270 redraws in 20
minutes, 450 in two hours, growing as the log of a run's length (the redraws a phase or a
step starts or ends come on top, a few a step). A terminal's bar keeps its every_s and
refresh_s.
"""

from __future__ import annotations

import sys
import threading
import time
from contextvars import ContextVar

import torch

from labkit.run.metrics import STEP

# How a stopped run continues, in the words of the call that launched it: a sweep sets its own
# (`launch_many(..., resume=True)`) while its runs go one after another in this process, where
# a notebook may hold no `cfg` or `run` to resume with; None: labkit.launch's words.
RESUME_HOW: ContextVar[str | None] = ContextVar("labkit_resume_how", default=None)

CLEAN_STOPS = ("completed", "signal", "time_limit", "requested")  # not a failure: no red bar
NOTEBOOK_GAP_S = 2.0  # a notebook bar's least time between two redraws of its clock or counts,
NOTEBOOK_GAP_SHARE = 0.01  # and at least this share of the bar's age


class StepProgress:
    """A tqdm bar over the steps `initial`..`total`, showing the phase of the step in progress.

    `engine`: its `progress` is pointed at this bar (and cleared on close). `policy`: the
    module whose gradient passes are the update's micro-batches. `samples`: answers per
    rollout (for "8/8 answers" in the update). `max_tokens`: the most tokens an answer may
    have (for the bound on the time left). `every_s`: the least time between two redraws
    with new text; `refresh_s`: how often the timer thread redraws the clock (None: no
    thread). `bar`: a tqdm-like bar to draw on (default: a new tqdm.auto bar). `notebook`:
    pace the redraws as a notebook's (None: when `bar` is tqdm's notebook widget).
    """

    def __init__(self, total: int, initial: int, *, engine=None, policy=None, samples: int = 0,
                 max_tokens: int = 0, every_s: float = 0.5, refresh_s: float | None = 1.0,
                 clock=time.monotonic, bar=None, notebook: bool | None = None):
        if bar is None:
            from tqdm.auto import tqdm

            bar = tqdm(total=total, initial=initial, desc="GRPO steps", unit="step",
                       dynamic_ncols=True)
        self.bar, self.step, self.samples, self.max_tokens = bar, initial, samples, max_tokens
        self.phase, self.passes, self.rows, self.evaluation = "", 0, 0, False
        self.every_s, self.clock, self._shown, self.began = every_s, clock, float("-inf"), clock()
        self.notebook = is_notebook_bar(bar) if notebook is None else bool(notebook)
        self.opened = clock()
        self.engine = engine
        if engine is not None:
            engine.progress = self.generating
        self._hook = None
        if policy is not None:
            self._hook = policy.register_forward_pre_hook(self._forward, with_kwargs=True)
        self._stop, self._timer = threading.Event(), None
        if refresh_s and hasattr(bar, "refresh"):
            self._timer = threading.Thread(target=self._redraw, args=(refresh_s,),
                                           name="labkit-progress", daemon=True)
            self._timer.start()

    # --- what the step is doing --------------------------------------------------------
    def generating(self, done: int, total: int, tokens: int) -> None:
        """The engine's report: answers finished of `total`, tokens written so far."""
        phase = "eval" if self.evaluation else "rollout"
        if phase != self.phase or (done == 0 and tokens == 0 and not self.evaluation):
            self.began = self.clock()  # a rollout starts (an evaluation started in evaluating)
        text = f"{done}/{total} answers, {tokens:,} tokens"
        left = time_left(self.clock() - self.began, total, tokens, self.max_tokens)
        if left is not None and done < total:
            text += f", at most {clock_text(left)} left"
        self._set(phase, text, now=done == total)

    def _forward(self, module, args, kwargs) -> None:
        if not torch.is_grad_enabled():
            return  # generation, old or reference log-probs (no gradient): not the update's passes
        if self.phase != "update":
            self.passes = self.rows = 0
        ids = kwargs.get("input_ids", args[0] if args else None)
        self.passes += 1
        self.rows += int(ids.shape[0]) if ids is not None else 0
        of = f"/{self.samples}" if self.samples else ""
        self._set("update", f"micro-batch {self.passes}, {self.rows}{of} answers")

    def gap(self) -> float:
        """The least seconds between two redraws that move only the clock or a phase's counts
        (a notebook's bar: the longer of NOTEBOOK_GAP_S and NOTEBOOK_GAP_SHARE of its age)."""
        if not self.notebook:
            return self.every_s
        return max(NOTEBOOK_GAP_S, self.every_s, NOTEBOOK_GAP_SHARE * (self.clock() - self.opened))

    def _set(self, phase: str, text: str, now: bool = False) -> None:
        changed = phase != self.phase
        self.phase = phase
        if changed or now or self.clock() - self._shown >= self.gap():
            self._shown = self.clock()
            where = (f"step {self.step} {phase}" if phase != "eval" else "eval before step 0"
                     if self.step == 0 else f"eval after step {self.step - 1}")
            self.bar.set_postfix_str(f"{where}: {text}")

    def evaluating(self, problems: int, sizing: bool = False) -> None:
        """A held-out evaluation starts (before the first step, after the last); with
        `sizing`, its first batch is timed to choose how many problems it takes."""
        self.evaluation, self.began = True, self.clock()
        what = ("timing a first batch to size the held-out evaluation" if sizing
                else f"greedy answers to {problems} held-out problems")
        self._set("eval", what, now=True)

    def evaluated(self) -> None:
        """The evaluation is over (done or stopped): the engine's next answers are a rollout's."""
        self.evaluation, self.phase = False, ""

    def say(self, line: str) -> None:
        """One line above the bar (a print would run into it)."""
        self.bar.write(line)

    def tick(self) -> None:
        """The timer's redraw of the bar's clock (a notebook's bar: once gap() has passed
        since its last redraw)."""
        if self.notebook:
            if self.clock() - self._shown < self.gap():
                return
            self._shown = self.clock()
        self.bar.refresh()

    def _redraw(self, every_s: float) -> None:
        """The timer thread: tick every `every_s` seconds until close()."""
        while not self._stop.wait(every_s):
            try:
                self.tick()
            except Exception:  # a bar torn down under us: nothing left to draw
                return

    # --- the end of a step -------------------------------------------------------------
    def advance(self, metrics: dict) -> None:
        """Count a finished step: one line with its numbers above the bar, the bar one on."""
        self.bar.write(step_line(metrics))
        self.bar.set_postfix_str(f"reward {metrics['rollout/raw_reward']:.3f}", refresh=False)
        self.bar.update(1)
        self.step, self.phase = int(metrics[STEP]) + 1, ""

    def close(self, reason: str = "completed") -> None:
        """Close the bar and let go of the engine and the policy. A run that stopped cleanly
        (`reason` in CLEAN_STOPS) closes as stopped, not as failed (tqdm's notebook bar turns
        red when it closes short of its total)."""
        self._stop.set()
        if self._timer is not None:
            self._timer.join(timeout=5)
        if self._hook is not None:
            self._hook.remove()
            self._hook = None
        if self.engine is not None and self.engine.progress == self.generating:
            self.engine.progress = None
        clean = reason in CLEAN_STOPS
        short = getattr(self.bar, "total", None) and getattr(self.bar, "n", 0) < self.bar.total
        if clean and short:
            how = RESUME_HOW.get() or ("resume=run.dir" if in_notebook() else "--resume")
            self.bar.set_postfix_str(f"stopped ({reason}) before step {self.step}; {how} continues")
        self.bar.close()
        if clean and short and is_notebook_bar(self.bar):
            self.bar.disp(bar_style="info", check_delay=False)


def is_notebook_bar(bar) -> bool:
    """True for tqdm's notebook widget (what tqdm.auto makes in a Jupyter kernel)."""
    return hasattr(bar, "container") and hasattr(bar, "disp")


def in_notebook() -> bool:
    """True in a Jupyter kernel (IPython's ZMQ shell): there a stopped run is continued from a
    cell, `labkit.launch(cfg, resume=run.dir)`, not with the command line's `--resume`."""
    ipython = sys.modules.get("IPython")  # never imported here: a kernel has it already
    shell = ipython.get_ipython() if ipython is not None else None
    return type(shell).__name__ == "ZMQInteractiveShell"


def time_left(elapsed: float, total: int, tokens: int, max_tokens: int) -> float | None:
    """An upper bound on the seconds left of a call writing `total` answers of at most
    `max_tokens` tokens, `tokens` of them written in `elapsed` seconds: every answer runs to
    the most allowed, at the rate so far (answers written side by side finish no later).
    None until there is a rate (2 s and some tokens)."""
    if not max_tokens or tokens <= 0 or elapsed < 2.0:
        return None
    return elapsed * max(total * max_tokens - tokens, 0) / tokens


def clock_text(seconds: float) -> str:
    """'0:40', '12:05', '2:03:10' (as tqdm writes times)."""
    s = int(round(seconds))
    h, m = divmod(s // 60, 60)
    return f"{h}:{m:02d}:{s % 60:02d}" if h else f"{m}:{s % 60:02d}"


def step_line(metrics: dict) -> str:
    """'step 3: reward 0.125, 384 tokens; rollout 18.2 s, update 20.4 s, step 39.0 s'."""
    parts = [f"step {int(metrics[STEP])}: reward {metrics['rollout/raw_reward']:.3f}"]
    if metrics.get("rollout/tokens") is not None:
        parts[0] += f", {int(metrics['rollout/tokens']):,} tokens"
    times = [(name, metrics.get(key)) for name, key in [
        ("rollout", "perf/rollout_time"), ("update", "perf/actor_train_time"),
        ("step", "perf/step_time")]]
    parts.append(", ".join(f"{n} {t:.1f} s" for n, t in times if t is not None))
    return "; ".join(p for p in parts if p)
