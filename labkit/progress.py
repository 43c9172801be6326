"""The run's progress bar, down to the phase of the step in progress.

Why: on a CPU one step of a lesson's run takes a minute or more, and a bar that counts only
steps sits at 0/1 all that time, which looks like a hang. So the bar's one line also says
what the step in progress is doing:

    GRPO steps:  0%|          | 0/3 [00:21<?, ?step/s, step 0 rollout: 3/8 answers, 212 tokens]
    GRPO steps:  0%|          | 0/3 [00:40<?, ?step/s, step 0 update: micro-batch 1, 8/8 answers]

The rollout's numbers come from the engine (`Engine.progress`, which the transformers engine
calls as it writes); the update's from a hook on the policy's forward passes that carry a
gradient (the passes that generate answers or compute reference log-probs do not). After each
step one line with its reward and times is printed above the bar, which keeps to one line
(tqdm.auto: a widget in a notebook, a text line on stderr in a terminal).
"""

from __future__ import annotations

import time

import torch

from labkit.metrics import STEP


class StepProgress:
    """A tqdm bar over the steps `initial`..`total`, showing the phase of the step in progress.

    `engine`: its `progress` is pointed at this bar (and cleared on close). `policy`: the
    module whose gradient passes are the update's micro-batches. `samples`: answers per
    rollout (for "8/8 answers" in the update). `every_s`: the least time between two
    redraws of the bar. `bar`: a tqdm-like bar to draw on (default: a new tqdm.auto bar).
    """

    def __init__(self, total: int, initial: int, *, engine=None, policy=None, samples: int = 0,
                 every_s: float = 0.5, clock=time.monotonic, bar=None):
        if bar is None:
            from tqdm.auto import tqdm

            bar = tqdm(total=total, initial=initial, desc="GRPO steps", unit="step",
                       dynamic_ncols=True)
        self.bar, self.step, self.samples = bar, initial, samples
        self.phase, self.passes, self.rows = "", 0, 0
        self.every_s, self.clock, self._shown = every_s, clock, float("-inf")
        self.engine = engine
        if engine is not None:
            engine.progress = self.generating
        self._hook = None
        if policy is not None:
            self._hook = policy.register_forward_pre_hook(self._forward, with_kwargs=True)

    # --- what the step is doing --------------------------------------------------------
    def generating(self, done: int, total: int, tokens: int) -> None:
        """The engine's report: answers finished of `total`, tokens written so far."""
        phase = "eval" if self.phase in ("update", "eval") else "rollout"
        self._set(phase, f"{done}/{total} answers, {tokens:,} tokens", now=done == total)

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

    def _set(self, phase: str, text: str, now: bool = False) -> None:
        changed = phase != self.phase
        self.phase = phase
        if changed or now or self.clock() - self._shown >= self.every_s:
            self._shown = self.clock()
            self.bar.set_postfix_str(f"step {self.step} {phase}: {text}")

    def evaluating(self, problems: int) -> None:
        """A held-out evaluation starts (before the first step, after the last)."""
        self._set("eval", f"greedy answers to {problems} held-out problems", now=True)

    def say(self, line: str) -> None:
        """One line above the bar (a print would run into it)."""
        self.bar.write(line)

    # --- the end of a step -------------------------------------------------------------
    def advance(self, metrics: dict) -> None:
        """Count a finished step: one line with its numbers above the bar, the bar one on."""
        self.bar.write(step_line(metrics))
        self.bar.set_postfix_str(f"reward {metrics['rollout/raw_reward']:.3f}", refresh=False)
        self.bar.update(1)
        self.step, self.phase = int(metrics[STEP]) + 1, ""

    def close(self) -> None:
        """Close the bar and let go of the engine and the policy."""
        if self._hook is not None:
            self._hook.remove()
            self._hook = None
        if self.engine is not None and self.engine.progress == self.generating:
            self.engine.progress = None
        self.bar.close()


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
