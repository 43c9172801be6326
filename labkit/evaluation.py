"""Held-out accuracy: greedy answers to the test split, through the run's own engine.

The training reward says how the model does on the prompts it is trained on; whether it
got better at GSM8K is a question for problems it never trains on. A run evaluates its
first `--eval-split-size` test problems greedily (one answer each, temperature 0) before
its first step and after its last (and every `--eval-interval` steps if asked), scoring
them with the math reward: the share scored 1 is the accuracy, logged as
`eval/<source>_<split>` (`eval/gsm8k_test`, miles' style of name) in `eval.jsonl`, one
line per evaluation, with its own `perf/eval_time`: an evaluation is never part of a
step's `perf/step_time`, so rollout-time comparisons do not see it.

How many problems depends on where the run is (`--eval-split-size auto`, the default,
decided once by `resolve_size`). vLLM, in the trainer or behind a router, writes the
recipe's 1,319 answers of up to 1,024 tokens in about 20 s on an H200: auto is the whole
test split there. The transformers engine on two CPU cores had written 3 of them after 18
minutes (the whole split went in as one batch) and would have taken days, before the
first step. There auto times the first batch of EVAL_BATCH answers and takes as many
problems as fit in about EVAL_BUDGET_S seconds, or none when that batch alone would not
finish within it. The size is written to config.json, so the evaluation after the last
step, and a resumed run, use the same problems. A size given with the flag is honoured,
with one line saying how long it will take when that is more than SAY_ABOVE_S.

The transformers engine evaluates EVAL_BATCH answers per call, the progress bar counts the
answers and tokens as they are written, and a stop (a signal, labkit's stop button) ends the
evaluation between two tokens, or between two layers while the prompts are read (16 of them
took 11 s there on one core): nothing is logged for it, and the run stops (EvaluationStopped)
with what --resume needs to evaluate again, after the last step as anywhere else.

One evaluation of n problems has a binomial standard error of sqrt(p (1 - p) / n): 0.012
for p = 0.25 on all 1,319 GSM8K test problems, 0.11 on 16. pass@k for k > 1 would need k
sampled answers per problem, k times the work of this greedy pass; it is not computed.
"""

from __future__ import annotations

import contextlib
import math
import time
from pathlib import Path

from labkit.data import encode_prompt
from labkit.engines import keep
from labkit.engines.base import Cancelled, Engine, Sampling
from labkit.reward import math_reward, score
from labkit.run import start_results
from labkit.run.outcomes import outcome_row

# Answers per call of the transformers engine (a stop waits for at most one token of it): on
# two idle cores the cpu preset's 200 greedy answers took 29.9 s in calls of 32, 36.4 in calls
# of 16 (each call reads its prompts' shared prefix once: 59.8 s in calls of 16 without that).
EVAL_BATCH = 32
EVAL_BUDGET_S = 40.0  # auto on the transformers engine: an evaluation of about this long
SAY_ABOVE_S = 180.0  # a longer evaluation is announced with its estimate and the flag that changes it
MEASURED_ENGINES = ("hf",)  # engines whose auto size is measured; the others evaluate the whole split


class EvaluationStopped(Exception):
    """A stop (signal, request) cut the held-out evaluation short; nothing was logged for it."""


def evaluation_due(cfg, trained_steps: int) -> bool:
    """Whether a run evaluates after `trained_steps` steps: before the first, after the last,
    and every --eval-interval steps."""
    return (trained_steps == 0 or trained_steps == cfg.num_rollout
            or bool(cfg.eval_interval and trained_steps % cfg.eval_interval == 0))


def eval_name(problems) -> str:
    """`eval/<source>_<split>` from the problems' ids ("gsm8k/test/12" -> eval/gsm8k_test)."""
    source, split = problems[0].id.split("/")[:2] if problems else ("heldout", "test")
    return f"eval/{source}_{split}"


# ----------------------------------------------------------------------------- how many
def held_out_problems(cfg) -> list:
    """The test problems a run may evaluate: the first --eval-split-size, or with auto (None)
    the whole test split (resolve_size cuts it), none for data of one file (no test split)."""
    from labkit import data as datamod

    if cfg.eval_split_size == 0:
        return []
    if cfg.eval_split_size is None and cfg.data not in ("gsm8k", "synthetic") \
            and Path(cfg.data).expanduser().is_file():
        return []
    return datamod.split_eval(cfg.data, cfg.eval_split_size, synthetic_steps=cfg.synthetic_steps)


def resolve_size(cfg, engine_name: str, recorded=None) -> int | None:
    """How many held-out problems the run evaluates: the flag's number; else the one this
    run folder `recorded` (a resumed run); else by engine, 0 for one file of data, None
    where it is measured (the transformers engine), -1 for the whole split (the others)."""
    if cfg.eval_split_size is not None:
        return cfg.eval_split_size
    if recorded is not None:
        return recorded
    if cfg.data not in ("gsm8k", "synthetic") and Path(cfg.data).expanduser().is_file():
        return 0
    return None if engine_name in MEASURED_ENGINES else -1


# ----------------------------------------------------------------------------- answers
class Pace:
    """Times one batch of answers from the engine's `cancel` calls (one a token, or nearly).

    `projected_batch_s()`: the batch's time if every answer runs to `max_tokens`, at the
    median pace of the last few tokens (the first token also reads the prompts, which took 37
    s for 16 of them on a loaded 2-core machine, and is no token's pace).
    """

    def __init__(self, max_tokens: int, clock=time.perf_counter):
        self.max_tokens, self.clock = max_tokens, clock
        self.start, self.tokens = clock(), 0
        self.ticks: list[float] = []

    def tick(self) -> None:
        """One more token of the batch (the engine asked `cancel`)."""
        self.ticks.append(self.clock())
        del self.ticks[:-5]  # the pace is the median of the last four gaps
        self.tokens += 1

    def elapsed(self) -> float:
        return self.clock() - self.start

    def projected_batch_s(self) -> float | None:
        """Seconds the batch takes if every answer runs to max_tokens (None before 5 tokens)."""
        if self.tokens < 5:
            return None
        gaps = sorted(b - a for a, b in zip(self.ticks, self.ticks[1:]))
        per_token = (gaps[1] + gaps[2]) / 2
        return self.elapsed() + per_token * max(self.max_tokens - self.tokens, 0)


def greedy_answers(engine: Engine, prompt_ids: list[list[int]], *, max_tokens: int,
                   stop_token_ids=(), autocast=None, batch: int | None = None,
                   cancel=None, on_batch=None, done=(), interrupt=None) -> list:
    """One greedy answer per prompt, `batch` prompts per engine call (None: all in one), the
    answers in `done` taken as those of the first prompts; `on_batch(answers written)` after
    each call. The engine's progress counts over all calls. Raises Cancelled when `cancel()`
    says so (between calls, and between tokens where the engine can), or `interrupt()` (a
    check that counts nothing, asked inside a forward pass where the engine can)."""
    greedy = Sampling(n=1, temperature=0.0, max_tokens=max_tokens,
                      stop_token_ids=tuple(stop_token_ids), logprobs_for=0)
    answers, size = list(done), batch or max(len(prompt_ids), 1)
    outer = engine.progress, engine.cancel, engine.interrupt
    outer_progress = engine.progress
    tokens = sum(len(a.token_ids) for a in answers)
    try:
        engine.cancel, engine.interrupt = cancel, interrupt
        while len(answers) < len(prompt_ids):
            if cancel is not None and cancel():
                raise Cancelled(f"cancelled after {len(answers)} answers")
            before, before_tokens = len(answers), tokens
            if outer_progress is not None:
                engine.progress = lambda d, _t, k, before=before, before_tokens=before_tokens: (
                    outer_progress(before + d, len(prompt_ids), before_tokens + k))
            chunk = prompt_ids[before:before + size]
            with (autocast or contextlib.nullcontext)():
                outs = engine.generate(chunk, greedy)
            answers += [group[0] for group in outs]
            tokens += sum(len(group[0].token_ids) for group in outs)
            if on_batch is not None:
                on_batch(len(answers) - len(done))
    finally:
        engine.progress, engine.cancel, engine.interrupt = outer
    return answers


def evaluate(engine: Engine, prompt_ids: list[list[int]], problems, *, max_tokens: int,
             stop_token_ids=(), autocast=None, batch: int | None = None, cancel=None,
             on_batch=None, done=(), done_seconds: float = 0.0, interrupt=None) -> dict:
    """Greedy accuracy of `engine` on `problems` (prompts given as token ids).

    Returns the eval row: the accuracy under eval_name(problems), its standard error, the
    problem count, the mean answer length, the share cut at `max_tokens`, and
    perf/eval_time (seconds, with the `done_seconds` the answers in `done` took); and under
    "outcomes", each problem's (right, answer length), for eval_outcomes.jsonl (log_evaluation
    takes it out of the row). Raises Cancelled when `cancel()` or `interrupt()` says so
    (greedy_answers)."""
    start = time.perf_counter()
    answers = greedy_answers(engine, prompt_ids, max_tokens=max_tokens,
                             stop_token_ids=stop_token_ids, autocast=autocast, batch=batch,
                             cancel=cancel, on_batch=on_batch, done=done, interrupt=interrupt)
    rewards = score([a.text for a in answers], [p.label for p in problems], math_reward)
    n = max(len(rewards), 1)
    accuracy = sum(r == 1.0 for r in rewards) / n
    name = eval_name(problems)
    return {
        name: accuracy,
        f"{name}_stderr": math.sqrt(accuracy * (1 - accuracy) / n),
        f"{name}_n": len(rewards),
        "eval/response_len/mean": sum(len(a.token_ids) for a in answers) / n,
        "eval/truncated_ratio": sum(a.truncated for a in answers) / n,
        "perf/eval_time": time.perf_counter() - start + done_seconds,
        "outcomes": {"right": [r == 1.0 for r in rewards],
                     "response_len": [len(a.token_ids) for a in answers]},
    }




# ----------------------------------------------------------------------------- in a run
def log_evaluation(s, trained_steps: int, bar=None) -> dict | None:
    """Evaluate the session's policy (labkit.session.Session) after `trained_steps` steps on
    its held-out problems and append the row to eval.jsonl. The run's first evaluation fixes
    how many problems (fix_size). The starting model's result is computed once per process
    for the same model and problems (a rerun in a notebook need not wait for it), and once
    per sweep (labkit.run.start_results): a run the sweep did not name to compute it, finding
    it not yet written, trains on and logs it before its next evaluation (s.start_owed).
    Returns the row, or None when there are no problems or the start's result is owed. A
    stop ends it between two tokens (or two layers): said in one line, nothing logged,
    EvaluationStopped raised."""

    say = bar.say if bar is not None else _print
    stopping = lambda: s.stopper is not None and s.stopper.stop_requested  # noqa: E731
    first_time = not s.eval_size_fixed
    try:
        if bar is not None and s.eval_problems:
            bar.evaluating(len(s.eval_problems), sizing=s.cfg.eval_split_size is None)
        first, first_s = fix_size(s, lambda probs: [encode_prompt(s, p) for p in probs], say,
                                  stopping)
        if not s.eval_problems:
            return None
        ids = [encode_prompt(s, p) for p in s.eval_problems]
        if trained_steps > 0 and s.start_owed:
            _log_owed_start(s, ids, say, stopping)
        measured = s.engine.name in MEASURED_ENGINES
        teller = Teller(len(s.eval_problems), s.cfg, say if first_time and measured and not first
                        else None, stopping)

        def run() -> dict:
            return evaluate(s.engine, ids, s.eval_problems,
                            max_tokens=s.cfg.rollout_max_response_len, stop_token_ids=s.stop_ids,
                            autocast=s.autocast, batch=EVAL_BATCH if measured else None,
                            cancel=teller.check, on_batch=teller.batch_done, done=first,
                            done_seconds=first_s, interrupt=stopping)

        reused, by = False, None
        if trained_steps == 0:
            key = ("eval", s.policy_key, s.engine.name, tuple(p.id for p in s.eval_problems),
                   s.cfg.rollout_max_response_len, s.cfg.dtype)
            file_key = _start_key(s, ids)
            evaluator = start_results.evaluator()
            if (not first and evaluator not in (None, s.cfg.run_name) and not keep.has_result(key)
                    and not start_results.written(file_key)):
                s.start_owed = True
                say(f"labkit: run {evaluator} evaluates the starting model for this sweep; this "
                    f"run trains on and logs that result before its next evaluation")
                return None

            def once_in_the_sweep() -> dict:
                nonlocal by
                row, by = start_results.shared(file_key, run, who=s.cfg.run_name, stopping=stopping)
                return row

            row, reused = keep.starting_result(key, once_in_the_sweep)
            reused = reused or by is not None
        else:
            row = run()
    except Cancelled as e:
        why = s.stopper.reason if s.stopper is not None and s.stopper.reason else "stopped"
        say(f"labkit: held-out evaluation after {trained_steps} steps stopped ({why}); "
            f"nothing logged for it, and --resume runs it")
        raise EvaluationStopped(why) from e
    finally:
        if bar is not None:
            bar.evaluated()
    return _log_row(s, trained_steps, row, reused, by, say)


def _start_key(s, ids: list[list[int]]) -> str:
    """The file name of the starting model's result in the sweep's folder (start_results)."""
    return start_results.key_of("eval", s.policy_key, s.engine.name, ids,
                                s.cfg.rollout_max_response_len, list(s.stop_ids), s.cfg.dtype)


def _log_owed_start(s, ids, say, stopping) -> None:
    """Log the starting model's result that the sweep's evaluator wrote (waiting while it
    still computes), before a later evaluation; say so in one line where none was written:
    this run has trained since and cannot compute it."""
    row, by = start_results.read_when_free(_start_key(s, ids), stopping=stopping)
    s.start_owed = False
    if row is None:
        who = f"run {start_results.evaluator()}" if start_results.evaluator() else "the sweep's evaluator"
        say(f"labkit: no held-out result for the starting model: {who} wrote none (it stopped "
            f"or failed first), so this run's before-and-after has no before")
        return
    _log_row(s, 0, row, True, by, say)


def _log_row(s, trained_steps: int, row: dict, reused: bool, by: str | None, say) -> dict:
    """Append an evaluation's row and per-problem outcomes to the run log; say it in one line."""
    row = {**row, "eval/trained_steps": trained_steps, "eval/reused": reused, "time/end": time.time()}
    found = row.pop("outcomes")
    s.log.append_eval(row, outcome_row(trained_steps, eval_name(s.eval_problems),
                                       [p.id for p in s.eval_problems], **found))
    name = eval_name(s.eval_problems)
    said = (f"the same start model, already evaluated by run {by}" if by is not None
            else "same start model as before in this process" if reused
            else f"{row['perf/eval_time']:.1f} s")
    say(f"labkit: held-out accuracy after {trained_steps} steps: {row[name]:.3f} "
        f"({name}, {row[name + '_n']} problems, {said})")
    return row


def fix_size(s, encode, say, stopping) -> tuple[list, float]:
    """On the run's first evaluation, fix how many held-out problems the run evaluates
    (resolve_size; timed on a first batch where the engine's speed decides): cut
    s.eval_problems to them and write the number into s.cfg and config.json. Returns the
    answers and seconds of that timed batch, for the evaluation to keep (none otherwise).
    `encode(problems)` gives their prompts' token ids. Raises Cancelled on a stop."""
    if s.eval_size_fixed:
        return [], 0.0
    cfg, available = s.cfg, s.eval_problems
    size = resolve_size(cfg, s.engine.name, s.log.config().get("eval_split_size"))
    first, seconds = [], 0.0
    if size is None:
        key = ("eval_size", s.policy_key, s.engine.name, cfg.data, cfg.synthetic_steps,
               cfg.prompt_examples, cfg.rollout_max_response_len, cfg.dtype)
        timing = {}

        def measure() -> dict:
            answers, spent, batch_s = time_first_batch(s, encode(available[:EVAL_BATCH]), stopping)
            timing.update(answers=answers, seconds=spent)
            return {"size": auto_size(len(available), spent if answers else None),
                    "batch_s": batch_s}

        found, reused = keep.starting_result(key, measure)
        size = found["size"]
        first, seconds = timing.get("answers", [])[:size], timing.get("seconds", 0.0)
        say(auto_line(size, len(available), found["batch_s"], cfg, reused))
    elif size < 0:
        size = len(available)
    elif size == 0 and cfg.eval_split_size is None:
        say(f"labkit: no held-out evaluation: --data {cfg.data} is one file, with no test split "
            f"(a folder with train.jsonl and test.jsonl has one)")
    s.eval_problems, s.eval_size_fixed = available[:size], True
    if cfg.eval_split_size != size:
        s.cfg = cfg.replace(eval_split_size=size)
        s.log.add_to_config(eval_split_size=size)
    return first, seconds


def time_first_batch(s, ids, stopping) -> tuple[list, float, float]:
    """Greedy answers to the prompts `ids` (one batch), timed, given up (no answers) as soon
    as the batch is projected to take longer than EVAL_BUDGET_S. Returns (answers, seconds
    spent, the batch's seconds or projection). Raises Cancelled on a stop."""
    pace = Pace(s.cfg.rollout_max_response_len)

    def check() -> bool:
        pace.tick()
        projected = pace.projected_batch_s()
        slow = pace.elapsed() > EVAL_BUDGET_S or (projected or 0.0) > EVAL_BUDGET_S
        return stopping() or slow

    try:
        answers = greedy_answers(s.engine, ids, max_tokens=s.cfg.rollout_max_response_len,
                                 stop_token_ids=s.stop_ids, autocast=s.autocast, cancel=check,
                                 interrupt=stopping)
    except Cancelled:
        if stopping():
            raise
        return [], pace.elapsed(), pace.projected_batch_s() or pace.elapsed()
    return answers, pace.elapsed(), pace.elapsed()


class Teller:
    """The cancel check and batch hook of an evaluation of `size` problems that says once, to
    `say`, how long the whole will take when that is more than SAY_ABOVE_S: at the end of its
    first batch, or 10 s into it from the projection of the batch (None: says nothing)."""

    def __init__(self, size: int, cfg, say, stopping):
        self.size, self.cfg, self.say, self.stopping = size, cfg, say, stopping
        self.pace = Pace(cfg.rollout_max_response_len)

    def check(self) -> bool:
        if self.say is not None:
            self.pace.tick()
            projected = self.pace.projected_batch_s()
            if projected is not None and self.pace.elapsed() >= 10.0:
                self.tell(projected, upper=True)
        return self.stopping()

    def batch_done(self, answers: int) -> None:
        if self.say is not None:
            self.tell(self.pace.elapsed() / max(answers, 1) * EVAL_BATCH, upper=False)

    def tell(self, batch_s: float, upper: bool) -> None:
        say, self.say = self.say, None  # once
        total = batch_s * math.ceil(self.size / EVAL_BATCH)
        if total > SAY_ABOVE_S:
            say(estimate_line(self.size, total, upper, self.cfg))


def auto_size(available: int, batch_s: float | None) -> int:
    """Problems that take about EVAL_BUDGET_S at `batch_s` seconds per EVAL_BATCH answers
    (whole batches, at most `available`); 0 when one batch takes longer, or did not finish
    (batch_s None)."""
    if batch_s is None or batch_s > EVAL_BUDGET_S:
        return 0
    return min(available, EVAL_BATCH * int(EVAL_BUDGET_S // max(batch_s, 1e-9)))


def auto_line(size: int, available: int, batch_s: float, cfg, reused: bool) -> str:
    """The one line that says what the automatic size came to, and how to change it."""
    per = f"{EVAL_BATCH} greedy answers of up to {cfg.rollout_max_response_len} tokens"
    if size == 0:
        whole = batch_s * math.ceil(available / EVAL_BATCH)
        return (f"labkit: no held-out evaluation: {per} would take over {EVAL_BUDGET_S:.0f} s on "
                f"this machine, so the {available:,} test problems would take up to about "
                f"{_duration(whole)}; --eval-split-size N evaluates N of them anyway")
    how = "timed earlier in this process" if reused else f"{per} took {batch_s:.1f} s"
    return (f"labkit: held-out evaluation of {size:,} of the {available:,} test problems, about "
            f"{_duration(batch_s * math.ceil(size / EVAL_BATCH))} before the first step and "
            f"after the last ({how}; sized to the machine on the transformers engine: "
            f"--eval-split-size N to choose, 0 for none)")


def estimate_line(size: int, total_s: float, upper: bool, cfg) -> str:
    """The one line that says a chosen evaluation is long, and the flag that changes it."""
    return (f"labkit: the held-out evaluation of {size:,} problems will take "
            f"{'up to ' if upper else ''}about {_duration(total_s)} here, before the first step "
            f"and after the last (--eval-split-size {size}); --eval-split-size 0 turns it off, "
            f"and leaving the flag out sizes it to about {EVAL_BUDGET_S:.0f} s")


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    if seconds < 48 * 3600:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} days"


def _print(line: str) -> None:
    print(line, flush=True)
