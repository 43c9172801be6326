"""The engine interface: write n answers for each prompt, then take new weights.

The trainer sees engines only through this interface, so the transformers engine,
the in-process vLLM engine and the HTTP client behind a router are interchangeable.
An engine works on token ids: the trainer owns the tokenizer and the chat template,
which keeps prompts identical whichever engine writes the answers.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Sampling:
    """How to sample: n answers per prompt, temperature, top-p, a token budget, a seed.

    `seed` seeds the whole rollout; `seed_each_answer` gives every answer a seed of its own
    (reproducible answer by answer, whatever else is in the batch; vLLM pays ~1.3x for it).
    `logprobs_for`: the engine returns its sampling log-probs for the answers of the first
    `logprobs_for` prompts only (None: all; vLLM pays ~1.6x on the answers that carry them).
    """

    n: int
    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int = 1024
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()
    seed_each_answer: bool = False
    logprobs_for: int | None = None

    def wants_logprobs(self, prompt_index: int) -> bool:
        """Whether the answers of prompt `prompt_index` should carry the engine's log-probs."""
        return self.logprobs_for is None or prompt_index < self.logprobs_for


@dataclass
class Completion:
    """One answer: its token ids, text, why it ended, and the engine's log-prob of each token."""

    prompt_index: int
    token_ids: list[int]
    text: str
    finish_reason: str  # "stop" (an end token) or "length" (hit max_tokens)
    logprobs: list[float] | None = None  # sampling log-prob of each chosen token, if asked

    @property
    def truncated(self) -> bool:
        return self.finish_reason == "length"


# Called between generation batches (the heat guard waits there when the GPU is hot).
BetweenBatches = Callable[[], None] | None
# Called while answers are written: (answers finished, answers asked for, tokens written so far).
Progress = Callable[[int, int, int], None] | None
# Asked while answers are written: True ends the call at once (it raises Cancelled).
Cancel = Callable[[], bool] | None


class Cancelled(Exception):
    """`generate` was ended early because the engine's `cancel` said so; nothing is returned."""


class Engine(ABC):
    """A rollout engine. `generate` returns, for each prompt, its n completions in order.

    `progress`, when set (the trainer's progress bar sets it), is called as the answers of a
    `generate` call come in, so a long rollout shows how far it is; an engine that cannot
    tell never calls it. `cancel`, when set (a held-out evaluation sets it, so that a stop
    ends it within seconds), is asked between tokens by an engine that can stop mid-call (the
    transformers engine); the others never ask, and their call runs to its end. `interrupt`,
    when set, is asked more often than that where the engine can (the transformers engine
    asks it between layers, so a stop ends even the reading of long prompts); it must be
    cheap, and count nothing (`cancel` may count tokens).
    """

    name: str = "engine"
    progress: Progress = None
    cancel: Cancel = None
    interrupt: Cancel = None

    def report_progress(self, done: int, total: int, tokens: int) -> None:
        """Hand (answers finished, answers asked for, tokens so far) to `progress`, if set."""
        if self.progress is not None:
            self.progress(done, total, tokens)

    @abstractmethod
    def generate(
        self,
        prompt_ids: list[list[int]],
        sampling: Sampling,
        between_batches: BetweenBatches = None,
    ) -> list[list[Completion]]:
        """Sample `sampling.n` answers for each prompt; outer list follows `prompt_ids`."""

    @abstractmethod
    def update_weights(self, model) -> None:
        """Make the engine sample from `model`'s current weights (in place, no restart)."""

    def begin_step(self, step: int) -> None:
        """The trainer's step number, before the step's rollout (an engine that logs by step
        names this one, also for a resumed run and for evaluation inside the step)."""

    def sleep(self) -> None:
        """Release what the engine holds on the GPU between rollouts (KV cache), if it can."""

    def wake(self) -> None:
        """Take back what `sleep` released, before the next rollout."""

    def log_to(self, run_dir) -> None:
        """The run folder, where the engine may keep a log of its own (most keep none)."""

    def step_metrics(self) -> dict:
        """Metrics of the engine's own since the last call, merged into the step's log line."""
        return {}

    def close(self) -> None:
        """Free the engine's resources; the engine is unusable afterwards."""
