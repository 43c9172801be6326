"""labkit.run.progress and Engine.progress: a step shows where it is, the rollout's answers, then the update."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import labkit
from labkit.engines.base import Sampling
from labkit.engines.hf import HFEngine, _ProgressCounter
from labkit.run.progress import StepProgress, clock_text, step_line, time_left


class Bar:
    """A stand-in for the tqdm bar: records what is drawn on it."""

    def __init__(self):
        self.postfixes, self.written, self.n, self.closed = [], [], 0, False

    def set_postfix_str(self, text, refresh=True):
        self.postfixes.append(text)

    def write(self, text):
        self.written.append(text)

    def update(self, n):
        self.n += n

    def close(self):
        self.closed = True


class Clock:
    """A clock the test moves by hand."""

    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def tiny_engine(tiny_model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    return model, HFEngine(model, AutoTokenizer.from_pretrained(tiny_model_dir), max_batch=4)


def test_the_counter_counts_finished_answers_and_their_tokens():
    counter = _ProgressCounter(lambda *a: None, width=2, stop_ids=(9,), before=(4, 100), total=8)
    ids = torch.tensor([[1, 1, 5, 9, 0, 0],   # stopped after 2 tokens
                        [1, 1, 5, 5, 5, 5],   # still writing: 4 so far
                        [0, 1, 9, 0, 0, 0]])  # stopped at once: 1 token
    assert counter.count(ids[:, 2:]) == (2, 2 + 4 + 1)
    assert counter.count(ids[:, 2:2]) == (0, 0)


def test_the_engine_reports_answers_as_they_come(tiny_model_dir):
    _, engine = tiny_engine(tiny_model_dir)
    reports = []
    engine.progress = lambda done, total, tokens: reports.append((done, total, tokens))
    out = engine.generate([[5, 6, 7], [8, 9]], Sampling(n=4, max_tokens=6, seed=1))
    written = sum(len(c.token_ids) for group in out for c in group)
    assert reports[0] == (0, 8, 0)
    assert (4, 8) == reports[-2][:2] and reports[-1] == (8, 8, written)  # after each batch of 4
    assert [r[0] for r in reports] == sorted(r[0] for r in reports)


def test_the_bar_shows_the_rollout_then_the_update(tiny_model_dir):
    model, engine = tiny_engine(tiny_model_dir)
    bar = Bar()
    progress = StepProgress(3, 0, engine=engine, policy=model, samples=8, bar=bar)
    engine.generate([[5, 6, 7], [8, 9]], Sampling(n=4, max_tokens=6, seed=1))
    assert bar.postfixes[0] == "step 0 rollout: 0/8 answers, 0 tokens"
    assert bar.postfixes[-1].startswith("step 0 rollout: 8/8 answers, ")
    shown = len(bar.postfixes)
    with torch.no_grad():  # e.g. reference log-probs: not an update pass
        model(input_ids=torch.tensor([[5, 6]]))
    assert len(bar.postfixes) == shown
    for rows in (5, 3):
        model(input_ids=torch.ones(rows, 4, dtype=torch.long))
    assert bar.postfixes[shown:][0] == "step 0 update: micro-batch 1, 5/8 answers"
    progress.evaluating(1)  # a held-out evaluation after the update
    assert bar.postfixes[-1] == "eval before step 0: greedy answers to 1 held-out problems"
    engine.generate([[5]], Sampling(n=2, max_tokens=2, temperature=0.0))
    assert bar.postfixes[-1].startswith("eval before step 0: 2/2 answers")
    progress.evaluated()
    progress.advance({"rollout/step": 0, "rollout/raw_reward": 0.25, "rollout/tokens": 40,
                      "perf/rollout_time": 12.0, "perf/actor_train_time": 8.5, "perf/step_time": 21.0})
    assert bar.written == ["step 0: reward 0.250, 40 tokens; rollout 12.0 s, update 8.5 s, step 21.0 s"]
    assert bar.n == 1 and progress.step == 1
    engine.generate([[5]], Sampling(n=2, max_tokens=2, seed=1))
    assert bar.postfixes[-1].startswith("step 1 rollout: 2/2 answers")
    progress.close()
    assert bar.closed and engine.progress is None
    model(input_ids=torch.ones(2, 4, dtype=torch.long))  # the hook is gone
    assert not bar.postfixes[-1].startswith("step 1 update")


def test_step_line_without_times():
    assert step_line({"rollout/step": 2, "rollout/raw_reward": 0.5}) == "step 2: reward 0.500"


def test_a_run_shows_its_phases_and_a_line_per_step_and_no_heat_notice(tiny_cfg, capsys):
    run = labkit.launch(tiny_cfg.replace(progress=True))
    out, err = capsys.readouterr()
    assert "step 0 rollout: 0/8 answers, 0 tokens" in err
    assert "step 0 update: micro-batch 1" in err
    assert "step 1 rollout:" in err
    lines = [line.split("\r")[-1] for line in (out + err).split("\n")]
    assert sum(line.startswith("step 0: reward ") for line in lines) == 1
    assert sum(line.startswith("step 1: reward ") for line in lines) == 1
    assert "heat guard" not in out + err  # no GPU here: nothing to say about heat
    assert run.config["heat_guard"] == "off: no GPU"


def test_a_rollout_after_an_evaluation_is_shown_as_a_rollout(tiny_model_dir):
    model, engine = tiny_engine(tiny_model_dir)
    bar = Bar()
    progress = StepProgress(3, 0, engine=engine, policy=model, samples=8, bar=bar, refresh_s=None)
    progress.evaluating(500, sizing=True)
    assert bar.postfixes[-1] == "eval before step 0: timing a first batch to size the held-out evaluation"
    engine.generate([[5]], Sampling(n=1, max_tokens=2, temperature=0.0))
    progress.evaluated()
    engine.generate([[5]], Sampling(n=2, max_tokens=2, seed=1))
    assert bar.postfixes[-1].startswith("step 0 rollout: 2/2 answers")
    progress.advance({"rollout/step": 0, "rollout/raw_reward": 0.0})
    progress.evaluating(3)  # after the last step
    assert bar.postfixes[-1] == "eval after step 0: greedy answers to 3 held-out problems"
    progress.close()


def test_the_time_left_is_an_upper_bound_from_the_rate_so_far():
    # 4 answers of at most 32 tokens; 40 tokens in 10 s: 88 more at most, 22 s
    assert time_left(10.0, 4, 40, 32) == 22.0
    assert time_left(1.0, 4, 40, 32) is None  # no rate yet
    assert time_left(10.0, 4, 0, 32) is None and time_left(10.0, 4, 40, 0) is None
    assert time_left(10.0, 4, 128, 32) == 0.0
    assert [clock_text(x) for x in (22.0, 725, 7390)] == ["0:22", "12:05", "2:03:10"]


def test_the_bar_says_the_time_left_of_the_rollout():
    clock, bar = Clock(), Bar()
    progress = StepProgress(3, 0, bar=bar, max_tokens=32, clock=clock, every_s=0.0, refresh_s=None)
    progress.generating(0, 4, 0)  # the rollout starts
    clock.now += 10.0
    progress.generating(1, 4, 40)
    assert bar.postfixes[-1] == "step 0 rollout: 1/4 answers, 40 tokens, at most 0:22 left"
    progress.generating(4, 4, 90)
    assert bar.postfixes[-1] == "step 0 rollout: 4/4 answers, 90 tokens"  # done: nothing left


def test_a_timer_redraws_the_bar_while_a_phase_runs_until_closed():
    import threading

    class Redrawn(Bar):
        def __init__(self):
            super().__init__()
            self.redraws, self.twice = 0, threading.Event()

        def refresh(self):
            self.redraws += 1
            if self.redraws >= 2:
                self.twice.set()

    bar = Redrawn()
    progress = StepProgress(3, 0, bar=bar, refresh_s=0.01)
    progress.generating(0, 4, 0)  # a phase starts, and nothing more is reported
    assert bar.twice.wait(60), "the bar's clock was not redrawn"
    progress.close()
    assert not progress._timer.is_alive()
    after = bar.redraws
    assert bar.closed and bar.redraws == after  # no redraw once closed


def notebook_bar(total=3):
    pytest.importorskip("ipywidgets")
    from tqdm.notebook import tqdm

    return tqdm(total=total, desc="GRPO steps", display=False)


@pytest.mark.parametrize("reason, style", [("signal", "info"), ("time_limit", "info"),
                                           ("error", "danger"), ("interrupted", "danger")])
def test_a_clean_stop_does_not_close_the_notebook_bar_as_failed(reason, style):
    bar = notebook_bar()
    progress = StepProgress(3, 0, bar=bar, refresh_s=None)
    progress.advance({"rollout/step": 0, "rollout/raw_reward": 0.5})
    progress.close(reason)
    assert bar.container.children[1].bar_style == style
    if style == "info":
        shown = bar.container.children[2].value.replace("\u2007", " ")  # tqdm's spaces in HTML
        assert f"stopped ({reason}) before step 1; --resume continues" in shown


def test_a_completed_run_closes_the_notebook_bar_as_done():
    bar = notebook_bar(total=1)
    progress = StepProgress(1, 0, bar=bar, refresh_s=None)
    progress.advance({"rollout/step": 0, "rollout/raw_reward": 0.5})
    progress.close("completed")
    assert bar.container.children[1].bar_style == "success"


def test_a_stopped_bar_names_the_notebooks_way_to_resume_in_a_kernel(monkeypatch):
    import sys
    import types

    import labkit.run.progress

    assert not labkit.run.progress.in_notebook()  # pytest is not a kernel
    ZMQInteractiveShell = type("ZMQInteractiveShell", (), {})
    fake = types.SimpleNamespace(get_ipython=lambda: ZMQInteractiveShell())
    monkeypatch.setitem(sys.modules, "IPython", fake)
    assert labkit.run.progress.in_notebook()
    bar = Bar()
    bar.total = 3
    progress = StepProgress(3, 0, bar=bar, refresh_s=None)
    progress.advance({"rollout/step": 0, "rollout/raw_reward": 0.5})
    progress.close("signal")
    assert bar.postfixes[-1] == "stopped (signal) before step 1; resume=run.dir continues"
    monkeypatch.setitem(sys.modules, "IPython", types.SimpleNamespace(get_ipython=lambda: None))
    assert not labkit.run.progress.in_notebook()  # IPython in a terminal


class Drawn(Bar):
    """A bar that counts its redraws (the words set, the clock redrawn)."""

    def __init__(self):
        super().__init__()
        self.refreshes = 0

    def refresh(self):
        self.refreshes += 1


def simulate(progress, clock, seconds, report_s=0.1, tick_s=1.0):
    """Drive a rollout for `seconds` of the fake clock: the engine reports every `report_s`,
    the timer ticks every `tick_s` (as the engine and the timer thread would)."""
    progress.generating(0, 8, 0)
    ticks, end, n = 0, clock.now + seconds, 0
    while clock.now < end:
        clock.now += report_s
        n += 1
        progress.generating(0, 8, n)
        if clock.now >= progress.opened + (ticks + 1) * tick_s:
            ticks += 1
            progress.tick()


def test_a_notebook_bar_redraws_as_the_log_of_the_run_s_length():
    """nbval holds a cell's messages until it ends, and drops those past a few thousand, the
    cell's end among them: a notebook bar's redraws must not grow with the run's length."""
    counts = {}
    for hours in (1 / 6, 2.0):
        clock, bar = Clock(), Drawn()
        progress = StepProgress(3, 0, bar=bar, max_tokens=32, clock=clock, refresh_s=None, notebook=True)
        simulate(progress, clock, hours * 3600)
        counts[hours] = len(bar.postfixes) + bar.refreshes
    assert counts[1 / 6] <= 250 and counts[2.0] <= 500, counts
    assert counts[2.0] < 2.5 * counts[1 / 6], counts  # twelve times as long, not twelve times the redraws


def test_a_terminal_bar_keeps_its_clock_and_counts_live():
    clock, bar = Clock(), Drawn()
    progress = StepProgress(3, 0, bar=bar, max_tokens=32, clock=clock, refresh_s=None)
    assert not progress.notebook  # a stand-in bar is not tqdm's notebook widget
    simulate(progress, clock, 600)
    assert bar.refreshes >= 599 and len(bar.postfixes) >= 1100  # a tick a second, counts every 0.5 s


def test_the_notebook_widget_is_paced_as_a_notebook_s():
    progress = StepProgress(3, 0, bar=notebook_bar(), refresh_s=None)
    assert progress.notebook
    progress.close()


NOTEBOOK_RUN = """\
import labkit.run.progress as progress

class Clock:
    now = 0.0
    def __call__(self):
        return self.now

clock = Clock()
run = progress.StepProgress(3, 0, max_tokens=512, clock=clock, refresh_s=None)  # tqdm.auto's widget
run.generating(0, 8, 0)
for n in range(1, {reports}):  # three hours of a rollout, an engine report every 0.1 s
    clock.now += 0.1
    run.generating(0, 8, n)
    if n % 10 == 0:
        run.tick()
run.close("signal")
print("ran to the end")
"""


def test_nbval_grades_a_cell_that_ran_for_hours_in_a_notebook(tmp_path):
    """The real thing: tqdm's notebook widget in a kernel, under nbval, a three-hour rollout on
    a fake clock (a bar redrawn at a terminal's pace sends some 20,000 messages: nbval loses the
    cell's end and fails it with 'Timeout of 5 seconds exceeded waiting for output')."""
    nbformat = pytest.importorskip("nbformat")
    pytest.importorskip("nbval")
    pytest.importorskip("ipywidgets")
    cell = nbformat.v4.new_code_cell("# NBVAL_IGNORE_OUTPUT\n" + NOTEBOOK_RUN.format(reports=3 * 36000))
    nbformat.write(nbformat.v4.new_notebook(cells=[cell]), tmp_path / "hours.ipynb")
    repo = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(repo)}
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "--nbval", "--nbval-current-env",
                             "hours.ipynb", "-p", "no:cacheprovider"], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:]
    assert "1 passed" in result.stdout
