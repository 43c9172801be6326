"""Held-out accuracy: scored with the math reward, logged to eval.jsonl at both ends of a run,
outside the steps' clocks; the starting model's result is computed once per process."""

from __future__ import annotations

import json
import math

import pytest

from labkit.data import Problem
from labkit.engines.base import Completion, Engine
from labkit.evaluation import eval_name, evaluate
from labkit.metrics import describe
from labkit.trainer import train


class AnswerBook(Engine):
    """An engine that answers each prompt with a fixed text; records what it was asked."""

    name = "book"

    def __init__(self, answers):
        self.answers, self.calls = answers, []

    def generate(self, prompt_ids, sampling, between_batches=None):
        self.calls.append(sampling)
        return [[Completion(i, [1, 2, 3], self.answers[i % len(self.answers)], "stop")
                 for _ in range(sampling.n)] for i in range(len(prompt_ids))]

    def update_weights(self, model):
        pass


def problems(n):
    return [Problem(f"gsm8k/test/{i}", f"made-up question {i}", str(i)) for i in range(n)]


def test_accuracy_is_the_share_the_math_reward_scores_one():
    probs = problems(4)
    engine = AnswerBook(["#### 0", "#### 5", "#### 2", "no answer"])  # right, wrong, right, none
    row = evaluate(engine, [[1]] * 4, probs, max_tokens=16)
    assert row["eval/gsm8k_test"] == 0.5 and row["eval/gsm8k_test_n"] == 4
    assert row["eval/gsm8k_test_stderr"] == pytest.approx(math.sqrt(0.5 * 0.5 / 4))
    assert row["perf/eval_time"] >= 0 and row["eval/response_len/mean"] == 3
    greedy = engine.calls[0]
    assert greedy.temperature == 0.0 and greedy.n == 1 and greedy.logprobs_for == 0


def test_the_name_comes_from_the_problems():
    assert eval_name(problems(1)) == "eval/gsm8k_test"
    assert eval_name([Problem("synthetic/test/3", "q", "1")]) == "eval/synthetic_test"
    assert "standard error" in describe("eval/gsm8k_test_stderr")
    assert "greedy accuracy" in describe("eval/synthetic_test")
    with pytest.raises(KeyError):
        describe("nope/nothing")


def test_a_run_evaluates_before_and_after_outside_the_step_clock(tiny_cfg, capsys):
    cfg = tiny_cfg.replace(eval_split_size=3, num_rollout=2)
    run = train(cfg)
    rows = [json.loads(x) for x in (run.dir / "eval.jsonl").read_text().splitlines()]
    assert [r["eval/trained_steps"] for r in rows] == [0, 2]
    assert all(r["eval/synthetic_test_n"] == 3 and 0 <= r["eval/synthetic_test"] <= 1 for r in rows)
    assert all(r["perf/eval_time"] > 0 for r in rows)
    assert not any(k.startswith("eval/") for k in run.metrics.columns)  # steps hold no eval
    assert "held-out accuracy after 0 steps" in capsys.readouterr().out


def test_a_second_run_in_the_process_reuses_the_starting_result(tiny_cfg, capsys):
    cfg = tiny_cfg.replace(eval_split_size=3, num_rollout=1)
    first = train(cfg.replace(run_name="first"))
    second = train(cfg.replace(run_name="second", n_samples_per_prompt=2, global_batch_size=4))
    a, b = ([json.loads(x) for x in (r.dir / "eval.jsonl").read_text().splitlines()]
            for r in (first, second))
    assert a[0]["eval/reused"] is False and b[0]["eval/reused"] is True
    assert a[0]["eval/synthetic_test"] == b[0]["eval/synthetic_test"]
    assert b[1]["eval/reused"] is False  # after training: measured anew


def test_periodic_evaluation(tiny_cfg):
    run = train(tiny_cfg.replace(eval_split_size=2, num_rollout=3, eval_interval=2))
    rows = [json.loads(x) for x in (run.dir / "eval.jsonl").read_text().splitlines()]
    assert [r["eval/trained_steps"] for r in rows] == [0, 2, 3]
