"""Held-out accuracy: scored with the math reward, logged to eval.jsonl at both ends of a run,
outside the steps' clocks; the starting model's result is computed once per process."""

from __future__ import annotations

import json
import math

import pytest
from waiting import Lines

from labkit.data import Problem
from labkit.engines.base import Completion, Engine
from labkit.evaluation import eval_name, evaluate
from labkit.run.metrics import STEP, describe
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


def test_each_problem_s_outcome_is_kept_beside_the_accuracy(tiny_cfg):
    """eval_outcomes.jsonl holds, per evaluation, every problem's outcome and answer length,
    on the same problems as eval.jsonl's accuracy; labkit.run.outcomes reads them back."""
    from labkit.run.outcomes import read_outcomes

    run = train(tiny_cfg.replace(eval_split_size=3, num_rollout=2))
    rows = {r["eval/trained_steps"]: r for r in eval_rows(run)}
    kept = read_outcomes(run.dir)
    assert sorted(kept) == [0, 2]
    for steps, outcomes in kept.items():
        assert outcomes.ids == ("synthetic/test/0", "synthetic/test/1", "synthetic/test/2")
        assert outcomes.accuracy == rows[steps]["eval/synthetic_test"]
        assert sum(outcomes.response_len) / 3 == pytest.approx(rows[steps]["eval/response_len/mean"])
    line = json.loads((run.dir / "eval_outcomes.jsonl").read_text().splitlines()[0])
    assert line["ids"] == "synthetic/test/0-2" and len(line["right"]) == 3


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


# ------------------------------------------------------------------ how many, by engine
def config_of(run) -> dict:
    return json.loads((run.dir / "config.json").read_text())


def eval_rows(run) -> list[dict]:
    path = run.dir / "eval.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


@pytest.fixture()
def small(tiny_cfg, tmp_path):
    """tiny_cfg on a folder of made-up problems whose test split has 20 (automatic sizes stay
    small, and quick to evaluate), evaluated with the automatic size."""
    folder = tmp_path / "made"
    folder.mkdir()
    for split, n in (("train", 24), ("test", 20)):
        rows = [{"question": f"Sam has {i} apples and buys {i + 2} more. How many now?",
                 "answer": f"{i} + {i + 2} = {2 * i + 2}\n#### {2 * i + 2}"} for i in range(n)]
        (folder / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return tiny_cfg.replace(data=str(folder), eval_split_size=None)


def sizes(run) -> list[tuple[int, int]]:
    return [(r["eval/trained_steps"], r["eval/made_test_n"]) for r in eval_rows(run)]


def test_the_size_is_the_flags_else_the_folders_else_the_engines(tmp_path):
    from labkit.config import RunConfig
    from labkit.evaluation import resolve_size

    auto = RunConfig(data="synthetic")
    assert auto.eval_split_size is None  # auto: decided where the run is
    assert resolve_size(auto, "hf") is None  # measured on the transformers engine
    assert resolve_size(auto, "vllm") == -1 and resolve_size(auto, "http") == -1  # the whole split
    assert resolve_size(auto, "hf", recorded=48) == 48  # a resumed run keeps its size
    assert resolve_size(auto.replace(eval_split_size=5), "hf", recorded=48) == 5
    assert resolve_size(auto.replace(eval_split_size=0), "vllm") == 0
    one_file = tmp_path / "train.jsonl"
    one_file.write_text('{"question": "made up", "answer": "#### 1"}\n')
    assert resolve_size(auto.replace(data=str(one_file)), "vllm") == 0  # no test split
    assert RunConfig.preset("cpu").eval_split_size > 0  # made-up test problems, sized to ~30 s


def test_auto_takes_whole_batches_that_fit_the_budget(monkeypatch):
    import labkit.evaluation as ev

    monkeypatch.setattr(ev, "EVAL_BUDGET_S", 40.0)
    monkeypatch.setattr(ev, "EVAL_BATCH", 16)
    assert ev.auto_size(500, 10.0) == 64  # 4 batches of 16 in 40 s
    assert ev.auto_size(500, 39.0) == 16
    assert ev.auto_size(500, 41.0) == 0  # one batch is already over the budget
    assert ev.auto_size(500, None) == 0  # the batch was given up
    assert ev.auto_size(20, 1.0) == 20  # never more than the split


def test_auto_on_the_transformers_engine_is_measured_and_recorded(small, capsys):
    run = train(small)
    size = config_of(run)["eval_split_size"]
    assert isinstance(size, int) and 0 < size <= 20
    assert sizes(run) == [(0, size), (2, size)]
    out = capsys.readouterr().out
    assert f"held-out evaluation of {size:,} of the 20 test problems, about" in out
    assert "--eval-split-size N to choose, 0 for none" in out


def test_auto_on_a_slow_machine_is_none_and_says_the_flag(small, monkeypatch, capsys):
    import labkit.evaluation as ev

    monkeypatch.setattr(ev, "EVAL_BUDGET_S", 0.0)  # any batch is too slow
    run = train(small)
    assert config_of(run)["eval_split_size"] == 0 and eval_rows(run) == []
    out = capsys.readouterr().out
    assert (f"labkit: no held-out evaluation: {ev.EVAL_BATCH} greedy answers of up to 12 tokens "
            f"would take over") in out
    assert "--eval-split-size N evaluates N of them anyway" in out
    assert run.status["reason"] == "completed" and len(run.metrics) == 2


def test_auto_on_vllm_is_the_whole_split_in_one_call(small, served):
    run = train(small.replace(num_rollout=1))
    assert config_of(run)["eval_split_size"] == 20 and sizes(run) == [(0, 20), (1, 20)]
    (engine,) = served
    calls = [e for e in engine.events if e[0] == "generate"]
    assert len(calls) == 3  # evaluation, rollout, evaluation: one call each


def test_a_long_chosen_evaluation_says_how_long(tiny_cfg, monkeypatch, capsys):
    import labkit.evaluation as ev

    monkeypatch.setattr(ev, "SAY_ABOVE_S", 0.0)  # any evaluation counts as long
    train(tiny_cfg.replace(eval_split_size=40, num_rollout=1))
    out = capsys.readouterr().out
    assert out.count("labkit: the held-out evaluation of 40 problems will take about") == 1
    assert "--eval-split-size 0 turns it off" in out
    monkeypatch.setattr(ev, "SAY_ABOVE_S", 1e9)
    train(tiny_cfg.replace(eval_split_size=40, num_rollout=1, run_name="short"))
    assert "will take" not in capsys.readouterr().out


def test_the_python_api_resumes_an_auto_run_with_its_recorded_size(small):
    from labkit.run.log import config_mismatches, saved_config

    first = train(small.replace(num_rollout=1, save_interval=1))
    recorded = config_of(first)["eval_split_size"]
    assert config_mismatches(saved_config(first.dir), small) == []  # auto matches what it became
    again = train(small.replace(num_rollout=2, save_interval=1), resume=first.dir)
    assert sizes(again) == [(0, recorded), (1, recorded), (2, recorded)]


# ------------------------------------------------------------------ answers as they come
def test_answers_are_counted_across_the_batches(tiny_model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from labkit.engines.hf import HFEngine
    from labkit.evaluation import greedy_answers

    engine = HFEngine(AutoModelForCausalLM.from_pretrained(tiny_model_dir),
                      AutoTokenizer.from_pretrained(tiny_model_dir))
    reports, batches = [], []
    engine.progress = lambda done, total, tokens: reports.append((done, total, tokens))
    answers = greedy_answers(engine, [[5, 6, 7]] * 5, max_tokens=4, batch=2,
                             on_batch=batches.append)
    written = sum(len(a.token_ids) for a in answers)
    assert len(answers) == 5 and batches == [2, 4, 5]
    assert {total for _, total, _ in reports} == {5}  # one count over the three calls
    assert [d for d, _, _ in reports] == sorted(d for d, _, _ in reports)
    assert [t for _, _, t in reports] == sorted(t for _, _, t in reports)
    assert reports[-1] == (5, 5, written)
    assert engine.progress is not None and engine.cancel is None  # given back as found


def test_a_cancel_ends_the_transformers_engine_at_the_next_token(tiny_model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from labkit.engines.base import Cancelled, Sampling
    from labkit.engines.hf import HFEngine

    engine = HFEngine(AutoModelForCausalLM.from_pretrained(tiny_model_dir),
                      AutoTokenizer.from_pretrained(tiny_model_dir))
    asked = []

    def cancel():
        asked.append(1)
        return len(asked) >= 4  # the 4th question: a stop came during the 3rd token

    engine.cancel = cancel
    with pytest.raises(Cancelled):
        engine.generate([[5, 6, 7]] * 3, Sampling(n=1, temperature=0.0, max_tokens=200))
    assert len(asked) == 4  # asked no more once it said stop: 3 tokens of 200 written


# ------------------------------------------------------------------ a stop during it
def test_a_stop_during_the_evaluation_ends_it_and_the_run_resumes(small, monkeypatch, capsys):
    from labkit.engines import hf
    from labkit.run.stopping import StopController

    stopper, asked = StopController(None), []
    real = hf._CancelCheck.__call__

    def stop_on_the_third_token(self, input_ids, scores, **kw):
        asked.append(stopper.stop_requested)
        if len(asked) == 3:
            stopper.request_stop("the stop button")  # as a signal's handler does, mid-batch
        return real(self, input_ids, scores, **kw)

    monkeypatch.setattr(hf._CancelCheck, "__call__", stop_on_the_third_token)
    cfg = small.replace(rollout_max_response_len=16)
    run = train(cfg, stopper=stopper)
    assert asked == [False, False, False]  # no token after the one the stop came in
    assert run.status["reason"] == "requested" and run.status["last_step"] == -1
    assert eval_rows(run) == [] and len(run.metrics) == 0
    assert config_of(run)["eval_split_size"] is None  # not measured: decided when resumed
    assert ("labkit: held-out evaluation after 0 steps stopped (requested: the stop button); "
            "nothing logged for it") in capsys.readouterr().out

    monkeypatch.setattr(hf._CancelCheck, "__call__", real)
    again = train(cfg, resume=run.dir)
    assert again.status["reason"] == "completed" and len(again.metrics) == 2
    size = config_of(again)["eval_split_size"]
    assert size > 0 and sizes(again) == [(0, size), (2, size)]


SIGTERM_CHILD = """
import sys
from labkit.config import RunConfig
from labkit.engines import hf
from labkit.run.stopping import exit_code
from labkit.trainer import train

real = hf.HFEngine._generate_chunk
def marked(self, prompts, sampling, *a, **kw):  # the evaluation starts writing (greedy)
    if sampling.temperature == 0 and not getattr(hf, "said", False):
        hf.said = True
        print("writing", flush=True)
    return real(self, prompts, sampling, *a, **kw)
hf.HFEngine._generate_chunk = marked

model, out = sys.argv[1:3]
cfg = RunConfig(model=model, data="synthetic", engine="hf", rollout_batch_size=2,
                n_samples_per_prompt=4, global_batch_size=8, num_rollout=2,
                rollout_max_response_len=256, eval_split_size=500, output_dir=out,
                run_name="stopped", progress=False)
run = train(cfg)
sys.exit(exit_code(run.status))
"""


def test_sigterm_during_the_evaluation_stops_it_and_logs_no_step(tiny_model_dir, tmp_path):
    """500 answers of up to 256 tokens: minutes on this model. A SIGTERM while they are
    written ends the run before its first step (before, the evaluation ran to its end)."""
    import os
    import signal
    import subprocess
    import sys
    from pathlib import Path

    from labkit.run.log import Run

    repo = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(repo), os.environ.get("PYTHONPATH", "")])}
    child = subprocess.Popen([sys.executable, "-c", SIGTERM_CHILD, str(tiny_model_dir),
                              str(tmp_path / "runs")], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=env)
    out_lines, err_lines = Lines(child), Lines(child, child.stderr)
    try:
        out_lines.until("writing")  # the evaluation writes
        child.send_signal(signal.SIGTERM)
        out, err = out_lines.rest(), err_lines.rest()
    finally:
        child.kill()
    assert child.returncode == 143, err
    run = Run(tmp_path / "runs" / "stopped")
    assert run.status["reason"] == "signal" and run.status["last_step"] == -1
    assert not (run.dir / "eval.jsonl").exists() or eval_rows(run) == []
    assert "held-out evaluation after 0 steps stopped (signal: SIGTERM)" in out


def test_an_interrupt_ends_the_transformers_engine_while_it_reads_the_prompts(tiny_model_dir):
    """The first token of a batch reads its prompts in one forward pass (11 s for 16 prompts
    of SmolLM2 on one core); a stop that came then waited for its end. `interrupt` is asked
    before each decoder layer, so the pass ends within a layer, before any token."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from labkit.engines.base import Cancelled, Sampling
    from labkit.engines.hf import HFEngine

    engine = HFEngine(AutoModelForCausalLM.from_pretrained(tiny_model_dir),
                      AutoTokenizer.from_pretrained(tiny_model_dir))
    asked, layers = [], []
    engine.cancel = lambda: bool(asked.append(1))  # before the batch, then once a token
    engine.interrupt = lambda: bool(layers.append(1)) or len(layers) >= 2  # a stop after layer 1
    with pytest.raises(Cancelled):
        engine.generate([[5, 6, 7]] * 3, Sampling(n=1, temperature=0.0, max_tokens=200))
    assert len(asked) == 1 and len(layers) == 2  # no token written: the first pass ended
    assert not any(m._forward_pre_hooks for m in engine.model.modules())  # the checks are gone
    engine.cancel = engine.interrupt = None
    (answer,), = engine.generate([[5, 6, 7]], Sampling(n=1, temperature=0.0, max_tokens=3))
    assert len(answer.token_ids) <= 3  # the model is as it was


def test_a_sigterm_during_the_evaluation_after_the_last_step_stops_and_resume_does_it(
        tiny_cfg, monkeypatch, capsys):
    """The evaluation after the last step, stopped: before, the run said `completed`, removed
    its checkpoint and had no evaluation after training; --resume was refused."""
    import os
    import signal

    import labkit.trainer as trainer
    from labkit.engines import hf
    from labkit.run.checkpoint import latest_checkpoint
    from labkit.run.stopping import exit_code

    cfg = tiny_cfg.replace(eval_split_size=3, num_rollout=2, rollout_max_response_len=16)
    real_eval, real_check = trainer.log_evaluation, hf._CancelCheck.__call__
    last, sent = [], []

    def evaluation(s, trained_steps, bar=None):
        if trained_steps == cfg.num_rollout:
            last.append(trained_steps)
        return real_eval(s, trained_steps, bar)

    def sigterm_in_the_last(self, input_ids, scores, **kw):
        if last and not sent:  # the third token of the last evaluation's first batch
            sent.append(input_ids.shape[1])
            os.kill(os.getpid(), signal.SIGTERM)
        return real_check(self, input_ids, scores, **kw)

    monkeypatch.setattr(trainer, "log_evaluation", evaluation)
    monkeypatch.setattr(hf._CancelCheck, "__call__", sigterm_in_the_last)
    run = train(cfg)
    assert sent and run.status["reason"] == "signal" and exit_code(run.status) == 143
    assert run.status["last_step"] == 1
    assert "during the held-out evaluation after 2 steps" in run.status["message"]
    evaluated = lambda r: [(x["eval/trained_steps"], x["eval/synthetic_test_n"])  # noqa: E731
                           for x in eval_rows(r)]
    assert evaluated(run) == [(0, 3)] and len(run.metrics) == 2
    assert latest_checkpoint(run.dir)[0] == 1  # kept: the evaluation needs these weights
    out = capsys.readouterr().out
    assert "held-out evaluation after 2 steps stopped (signal: SIGTERM); nothing logged for it, " \
           "and --resume runs it" in out

    monkeypatch.undo()
    again = train(cfg, resume=run.dir)
    assert again.status["reason"] == "completed" and again.status["last_step"] == 1
    assert evaluated(again) == [(0, 3), (2, 3)] and again.metrics[STEP].tolist() == [0, 1]
    assert not (again.dir / "checkpoint").exists()  # completed: the default keeps none
    said = capsys.readouterr().out
    assert "after step 1, its last, for the held-out evaluation a stop cut short" in said


def test_a_run_killed_after_its_first_evaluation_does_not_evaluate_the_start_twice(tiny_cfg):
    from labkit.run.log import open_run_folder

    cfg = tiny_cfg.replace(eval_split_size=2)
    run_dir, log, _ = open_run_folder(cfg, None)  # evaluated, then killed in step 0
    log.append_eval({"eval/synthetic_test": 0.5, "eval/synthetic_test_n": 2,
                     "eval/trained_steps": 0})
    log.release()
    resumed = train(cfg, resume=run_dir)
    assert [r["eval/trained_steps"] for r in eval_rows(resumed)] == [0, 2]  # each once
    assert eval_rows(resumed)[0]["eval/synthetic_test"] == 0.5


def test_the_launch_s_last_line_leads_with_the_held_out_change_and_its_interval(tiny_model_dir,
                                                                                 tmp_path, capsys):
    """`labkit launch` of a run evaluated at both ends ends with one line: held-out right
    before -> after with its paired interval and the problems' count, then the training
    figures, said to be noisy; without an evaluation, the training reward alone, as before."""
    import re

    from labkit.cli import main

    flags = ["--model", str(tiny_model_dir), "--data", "synthetic", "--engine", "hf",
             "--rollout-batch-size", "2", "--n-samples-per-prompt", "4", "--global-batch-size", "8",
             "--num-rollout", "2", "--rollout-max-response-len", "12", "--lr", "1e-3",
             "--no-progress", "--output-dir", str(tmp_path / "runs")]
    assert main(["launch", *flags, "--eval-split-size", "6", "--run-name", "held"]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert re.fullmatch(r"held-out right \d\.\d{3} -> \d\.\d{3} \([-+]\d\.\d{3}, 95% interval "
                        r"[-+]\d\.\d{3} to [-+]\d\.\d{3}, 6 made-up problems\); training answers right "
                        r"\d\.\d{3} -> \d\.\d{3}, reward \d\.\d{3} -> \d\.\d{3} \(first vs last "
                        r"step of 2, 2 problems each: noisy\); plot: .*reward\.png",
                        last), last
    assert main(["launch", *flags, "--eval-split-size", "0", "--run-name", "plain"]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith("reward ") and "held-out" not in last


def _eval_rows_by_step(run):
    return [(r["eval/trained_steps"], r) for r in eval_rows(run)]


def test_a_run_the_sweep_did_not_name_trains_on_and_logs_the_start_later(tiny_cfg, monkeypatch, tmp_path,
                                                                          capsys):
    """A sweep names one run to evaluate the starting model; another run that finds no result
    yet does not wait: it trains, and logs the evaluator's result before its last evaluation."""
    from labkit import evaluation, trainer
    from labkit.data import encode_prompt
    from labkit.run import start_results

    monkeypatch.setenv(start_results.FOLDER_ENV, str(tmp_path / ".start"))
    monkeypatch.setenv(start_results.EVALUATOR_ENV, "smallest")
    written = {}
    real = trainer.update_policy

    def update(s, rollout, adv, step):
        if step == 0:  # the evaluator's result lands while this run trains, from the same start
            ids = [encode_prompt(s, p) for p in s.eval_problems]
            row = evaluation.evaluate(s.engine, ids, s.eval_problems, max_tokens=s.cfg.rollout_max_response_len,
                                      stop_token_ids=s.stop_ids, autocast=s.autocast)
            written.update(start_results.shared(evaluation._start_key(s, ids), lambda: row, who="smallest")[0])
        return real(s, rollout, adv, step)

    monkeypatch.setattr(trainer, "update_policy", update)
    run = train(tiny_cfg.replace(eval_split_size=3, num_rollout=2, run_name="largest"))
    rows = _eval_rows_by_step(run)
    assert [steps for steps, _ in rows] == [0, 2]
    start = rows[0][1]
    assert start["eval/reused"] is True and start["eval/synthetic_test"] == written["eval/synthetic_test"]
    assert rows[1][1]["eval/reused"] is False
    out = capsys.readouterr().out
    assert "run smallest evaluates the starting model for this sweep" in out
    assert "held-out accuracy after 0 steps" in out and "already evaluated by run smallest" in out
    assert out.index("after 0 steps") < out.index("after 2 steps")


def test_a_start_the_evaluator_never_wrote_is_said_not_computed_after_training(tiny_cfg, monkeypatch,
                                                                              tmp_path, capsys):
    from labkit.run import start_results

    monkeypatch.setenv(start_results.FOLDER_ENV, str(tmp_path / ".start"))
    monkeypatch.setenv(start_results.EVALUATOR_ENV, "smallest")
    run = train(tiny_cfg.replace(eval_split_size=3, num_rollout=2, run_name="largest"))
    assert [steps for steps, _ in _eval_rows_by_step(run)] == [2]
    assert "no held-out result for the starting model: run smallest wrote none" in capsys.readouterr().out


def test_the_named_evaluator_computes_the_start_at_once(tiny_cfg, monkeypatch, tmp_path):
    from labkit.run import start_results

    monkeypatch.setenv(start_results.FOLDER_ENV, str(tmp_path / ".start"))
    monkeypatch.setenv(start_results.EVALUATOR_ENV, "smallest")
    run = train(tiny_cfg.replace(eval_split_size=3, num_rollout=1, run_name="smallest"))
    rows = _eval_rows_by_step(run)
    assert [steps for steps, _ in rows] == [0, 1] and rows[0][1]["eval/reused"] is False
    assert len(list((tmp_path / ".start").glob("*.json"))) == 1


def test_a_resumed_run_logs_the_start_it_still_owes(tiny_cfg, monkeypatch, tmp_path):
    from labkit.run import start_results

    monkeypatch.setenv(start_results.FOLDER_ENV, str(tmp_path / ".start"))
    monkeypatch.setenv(start_results.EVALUATOR_ENV, "smallest")
    cfg = tiny_cfg.replace(eval_split_size=3, num_rollout=1, save_interval=1)
    largest = train(cfg.replace(run_name="largest"))  # the evaluator had written nothing yet
    assert [steps for steps, _ in _eval_rows_by_step(largest)] == [1]
    smallest = train(cfg.replace(run_name="smallest"))
    resumed = train(cfg.replace(run_name="largest", num_rollout=2), resume=largest.dir)
    rows = dict(_eval_rows_by_step(resumed))
    assert sorted(rows) == [0, 1, 2] and rows[0]["eval/reused"] is True
    assert rows[0]["eval/synthetic_test"] == dict(_eval_rows_by_step(smallest))[0]["eval/synthetic_test"]
