"""What the lessons say and how a student opens them: facts nbval cannot check (markdown, set-up).

nbval runs every code cell of the lessons and compares their outputs; these tests hold the
narration to what a student needs at the place they need it, and the set-up to one command.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
NOTEBOOKS = REPO / "notebooks"


def cells(name: str) -> list[dict]:
    return json.loads((NOTEBOOKS / name).read_text())["cells"]


def text(cell: dict) -> str:
    return "".join(cell["source"])


def first_index(cells_: list[dict], pattern: str, kind: str | None = None) -> int:
    return next(i for i, c in enumerate(cells_)
                if (kind is None or c["cell_type"] == kind) and re.search(pattern, text(c)))


def test_lesson_1_3_names_the_runs_model_where_it_introduces_them():
    lesson = cells("03_group_size.ipynb")
    first_load = first_index(lesson, r"load_runs\(RUNS\)", "code")
    intro = "\n".join(text(c) for c in lesson[first_load - 1:first_load])
    for fact in ("Qwen2.5-Coder-0.5B-Instruct", "Q4_K_M", "H200", "not the recipe's",
                 "no internet"):
        assert fact in intro, fact


def test_lesson_1_3_compares_runs_of_one_setting():
    source = "\n".join(text(c) for c in cells("03_group_size.ipynb") if c["cell_type"] == "code")
    assert "runs = first_plan[(first_plan.prompts == 32) & (first_plan.lr == LR)]" in source


def test_lesson_1_2_introduces_the_16_answer_run_before_quoting_it():
    opening = text(cells("02_watchdog_replay.ipynb")[0])
    quote = opening.index("> The 16-answer run")
    before = opening[:quote]
    assert "16 answers per prompt" in before and "lesson 1.3" in before
    assert "512 requests" in before


def test_lesson_1_1_teaches_interrupt_and_resume():
    lesson = cells("01_launcher.ipynb")
    launch = first_index(lesson, r"run = labkit\.launch\(cfg\)", "code")
    told = first_index(lesson, r"interrupt", "markdown")
    pressed = first_index(lesson, r"signal\.SIGINT", "code")  # what ■ sends, sent by the cell
    resume = first_index(lesson, r"labkit\.launch\(\w+, resume=stopped\.dir\)", "code")
    assert launch < told < pressed < resume
    assert "■" in text(lesson[told]) and "SIGINT" in text(lesson[told])
    assert "press.cancel()" in text(lesson[pressed])  # no stray interrupt after a quick run


def test_lesson_1_1_does_not_hard_code_the_cpu_runs_numbers():
    narration = "\n".join(text(c) for c in cells("01_launcher.ipynb") if c["cell_type"] == "markdown")
    for stale in ("one short step", "48 tokens", "under a minute", "only reaches the first"):
        assert stale not in narration, stale


def test_one_command_sets_up_and_opens_the_lessons():
    pyproject = (REPO / "pyproject.toml").read_text()
    course = re.search(r"^course = \[(.*)\]$", pyproject, re.M)
    assert course and "jupyterlab" in course.group(1) and "ipywidgets" in course.group(1)
    assert '-e ".[dev,course]"' in (REPO / "scripts" / "setup.sh").read_text()
    command = "bash scripts/setup.sh && .venv/bin/jupyter lab notebooks/"
    for readme in (REPO / "README.md", NOTEBOOKS / "README.md"):
        words = readme.read_text()
        assert command in words and "--allow-root" in words, readme
        assert "pip install jupyterlab" not in words, readme


def test_lesson_1_1_shows_the_format_credit_beside_the_math_reward():
    lesson = cells("01_launcher.ipynb")
    shown = first_index(lesson, r"math_format_reward\(", "code")
    assert "math_reward(" in text(lesson[shown])  # side by side, in one table
    said = text(lesson[shown - 1])
    assert "math_format" in said and "0.1" in said and "format" in said
    narration = "\n".join(text(c) for c in lesson if c["cell_type"] == "markdown")
    assert "Nothing in between" not in narration
    read_out = first_index(lesson, r"reward_parts\(run\.metrics\)", "code")
    assert "answers right" in text(lesson[read_out - 1])


def test_lesson_1_1_plot_shades_the_thirds_its_read_out_compares():
    lesson = cells("01_launcher.ipynb")
    plot = first_index(lesson, r"reward_curve\(run\.dir", "code")
    assert "end_windows(run.metrics)" in text(lesson[plot])
    assert "third" in text(lesson[plot - 1])


def test_lesson_1_1_ends_by_releasing_what_its_kernel_holds():
    lesson = cells("01_launcher.ipynb")
    close = first_index(lesson, r"labkit\.close\(\)", "code")
    assert close >= len(lesson) - 3  # at the end, after the last launch
    assert "checkpoints()" in text(lesson[close])
    said = text(lesson[close - 1])
    assert "runs/<name>/checkpoint/" in said and "delete" in said and "Shut Down Kernel" in said


def test_lesson_1_3_reads_its_first_verdict_where_it_appears():
    lesson = cells("03_group_size.ipynb")
    verdict = first_index(lesson, r"print\(labkit\.analysis\.inside_one_range\(", "code")
    reading = text(lesson[verdict + 1])
    assert lesson[verdict + 1]["cell_type"] == "markdown"
    assert "more seeds" in reading and "not an effect" in reading


def test_lesson_1_3_says_why_two_runs_did_not_finish_before_showing_them():
    lesson = cells("03_group_size.ipynb")
    overview = first_index(lesson, r"load_runs\(RUNS\)", "code")
    said = text(lesson[overview + 1])
    for run in ("solo-overlap-p32-n8-s1", "n16-lr1e-5-s1"):
        assert run in said


def test_the_lessons_readme_names_what_exists():
    readme = (NOTEBOOKS / "README.md").read_text()
    assert "lesson-cpu" not in readme and "two short CPU steps" not in readme
    assert "LABKIT_MODEL" in readme and "LABKIT_DATA" in readme


def test_lesson_1_3_ends_by_releasing_what_its_kernel_holds():
    lesson = cells("03_group_size.ipynb")
    close = first_index(lesson, r"labkit\.close\(\)", "code")
    assert close == len(lesson) - 1  # the last cell, after every launch
    assert "checkpoints()" in text(lesson[close])
    said = text(lesson[close - 1])
    assert "runs/<name>/checkpoint/" in said and "Shut Down Kernel" in said


def test_lesson_1_3_reads_the_reruns_over_the_windows_of_the_steps_launched():
    lesson = cells("03_group_size.ipynb")
    plot = first_index(lesson, r"reward_curve\(rerun_frame", "code")
    assert "rise_windows(rerun_frame)" in text(lesson[plot])
    said = text(lesson[plot + 1])
    assert "stopped after step" in said and "At step 0 no update has happened yet" in said


def test_lesson_1_2_says_the_recorded_rollout_was_stopped_by_hand():
    lesson = cells("02_watchdog_replay.ipynb")
    said = text(lesson[first_index(lesson, r"## What the policy would have done", "markdown")])
    assert "The run above went on" not in said
    assert "48 of" in said and "512 requests" in said and "stopped it by hand" in said


def test_every_code_cell_of_the_lessons_was_run_and_saved_in_order():
    """A lesson ships with every code cell executed, numbered 1, 2, ... in order: a cell
    saved unexecuted leaves its table or figure out of the lesson (and out of nbval's check)."""
    for path in sorted(NOTEBOOKS.glob("0*.ipynb")):
        counts = [c["execution_count"] for c in cells(path.name) if c["cell_type"] == "code"]
        assert counts == list(range(1, len(counts) + 1)), (path.name, counts)


def saved_text(name: str, source: str) -> str:
    """The text (pandas' plain text) a lesson's code cell containing `source` shows as its result."""
    cell = next(c for c in cells(name) if c["cell_type"] == "code" and source in text(c))
    return next("".join(o["data"]["text/plain"]) for o in cell["outputs"]
                if o.get("output_type") == "execute_result")


def saved_table(name: str, source: str) -> list[list[str]]:
    """The rows of the table (pandas' text) a lesson's code cell containing `source` shows in
    its saved output."""
    return [line.split() for line in saved_text(name, source).splitlines()[1:]]


@pytest.fixture
def cores():
    """The machine's cores for a test that runs the real embedded model (the suite keeps
    torch to one thread, which suits tiny models; a lesson's run took twice as long on one)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(min(2, os.cpu_count() or 1))
    yield
    torch.set_num_threads(before)


@pytest.mark.slow
def test_lesson_1_1_s_saved_run_is_what_the_code_gives(tmp_path, monkeypatch, cores):
    """The rewards lesson 1.1 shows for its short run (the stop-and-resume cell's table: 3
    steps of the cpu profile, the same as the first 3 of the launch cell's run) are what this
    code gives, to the digits shown: a change that moves a run's numbers fails here until
    the lesson is executed again, so a student's run reproduces the page."""
    import labkit
    from labkit.course import profiles

    saved = {int(step): reward for _, step, reward in
             saved_table("01_launcher.ipynb", 'resumed.metrics[["rollout/step", "rollout/raw_reward"]]')}
    assert sorted(saved) == [0, 1, 2], saved
    monkeypatch.setenv("LABKIT_PROFILE", "cpu")
    run = labkit.launch(profiles.config("cpu", output_dir=str(tmp_path)).replace(num_rollout=3))
    labkit.close()
    now = dict(zip(run.metrics["rollout/step"], run.metrics["rollout/raw_reward"]))
    shown = {step: round(now[step], len(digits.split(".")[1])) for step, digits in saved.items()}
    assert shown == {step: float(digits) for step, digits in saved.items()}


def pandas_rows(shown: str) -> dict[str, dict[str, str]]:
    """{index: {column: value}} from pandas' text of a frame with one-word labels, also when
    pandas wrapped its columns into blocks (each block: a header line, the index's name, rows)."""
    rows: dict[str, dict[str, str]] = {}
    for block in shown.strip().split("\n\n"):
        lines = block.splitlines()
        header = [h for h in lines[0].split() if h != "\\"]
        for line in lines[1:]:
            tokens = [t for t in line.split() if t != "\\"]
            if len(tokens) > 1:
                rows.setdefault(tokens[0], {}).update(zip(header, tokens[1:]))
    return rows


RISE_TABLE = "rise = labkit.analysis.reward_rise(rerun_frame)"


def rise_rows(shown: str) -> dict[str, dict[str, str]]:
    """{group size: {field: value}} from the text of lesson 1.3's rise table: a column per run
    (a header line of the group sizes, then a line per field), or, as saved by older code, a
    row per run. A field whose value has spaces (a status "stopped after ...") is left out."""
    rows = pandas_rows(shown)
    if "start" not in rows:
        return rows  # a row per run
    header, out = shown.strip().splitlines()[0].split()[1:], {}
    for line in shown.strip().splitlines()[1:]:
        tokens = line.split()
        if len(tokens) == len(header) + 1:
            for size, value in zip(header, tokens[1:]):
                out.setdefault(size, {})[tokens[0]] = value
    return out


def test_lesson_1_3_s_saved_8_answer_rerun_is_lesson_1_1_s_saved_run():
    """On the cpu profile the rerun cell's 8-answer run is the profile's own run (the cpu
    preset takes 8 answers), so the rise table lesson 1.3 shows for it must read what lesson
    1.1 shows for its launch: the same mean reward over the first and the last 4 steps, and
    the same rise of the share of answers right. Outputs of one lesson executed with older
    code than the other's differ here."""
    from labkit.config import PRESETS

    assert PRESETS["cpu"]["n_samples_per_prompt"] == 8
    eight = rise_rows(saved_text("03_group_size.ipynb", RISE_TABLE))["8"]
    parts = {line.split()[0]: [float(v) for v in line.split()[-3:]]
             for line in saved_text("01_launcher.ipynb", "reward_parts(run.metrics)").splitlines()
             if line.startswith(("first", "last"))}
    assert (float(eight["start"]), float(eight["end"])) == (parts["first"][0], parts["last"][0])
    assert float(eight["right_rise"]) == pytest.approx(parts["last"][1] - parts["first"][1], abs=1e-3)


@pytest.mark.slow
def test_lesson_1_3_s_saved_2_answer_rerun_is_what_the_code_gives(tmp_path, monkeypatch, cores):
    """The 2-answer run of lesson 1.3's saved rise table starts (its mean reward over steps
    of its early window, the first third of the steps) where this code's run of the same config does, to the
    digits shown: a change that moves the reruns' numbers fails here until lesson 1.3 is
    executed again."""
    import labkit
    from labkit.course import profiles

    saved = rise_rows(saved_text("03_group_size.ipynb", RISE_TABLE))["2"]
    steps = profiles.config("cpu").num_rollout
    assert saved["status"] == "completed" and saved["steps"] == str(steps)
    monkeypatch.setenv("LABKIT_PROFILE", "cpu")
    two = profiles.rerun_configs("cpu", answers=(2,))[0]
    early = steps // 3  # the first third of the steps launched
    run = labkit.launch(two.replace(output_dir=str(tmp_path), num_rollout=early))
    labkit.close()
    assert list(run.metrics["rollout/step"]) == list(range(early))
    assert round(float(run.metrics["rollout/raw_reward"].mean()), 3) == float(saved["start"])


FIGURE = re.compile(r"[+-]\d*\.\d+|\d+(\.\d+)?\s*%")  # a signed decimal or a share, as quoted


def test_lesson_1_3_s_reading_of_the_reruns_quotes_no_figures_of_other_runs():
    """The text under the rerun plot reads the table the cell above computes for these runs;
    it quotes no figure of its own (other seeds', an older preset's), which the table beside
    it would contradict."""
    lesson = cells("03_group_size.ipynb")
    plot = first_index(lesson, r"reward_curve\(rerun_frame", "code")
    said = text(lesson[plot + 1])
    assert not FIGURE.search(said), FIGURE.search(said)
    assert "The table is this cell's own runs" in said and "`seed`" in said


def test_lesson_1_3_s_rise_table_shows_the_seed_and_each_note_in_full():
    source = text(next(c for c in cells("03_group_size.ipynb") if c.get("id") == "rerun-rise"))
    shown = source.splitlines()[-1]
    assert '"seed"' not in shown and '"note"' in shown  # the seed stays; the note is printed
    assert "print(f\"{row.group_size} answers: {row.note}\")" in source


def test_lesson_1_3_says_how_to_rerun_with_another_seed_in_the_cell():
    lesson = cells("03_group_size.ipynb")
    launch = first_index(lesson, r"labkit\.launch_many\(configs", "code")
    said = text(lesson[launch - 1])
    assert "rerun_configs(PROFILE, seed=2, num_rollout=24)" in said
    assert "rerun-cpu-n2-seed2-num_rollout24" in said and "refuses it in one\nline" in said


def test_lesson_1_3_s_closing_text_quotes_no_memory_figure_of_its_own():
    """The memory a kernel holds is printed by the cell below the text (labkit.close()); a
    figure in the text goes stale with the preset, and differed from the cell's."""
    lesson = cells("03_group_size.ipynb")
    close = first_index(lesson, r"labkit\.close\(\)", "code")
    said = text(lesson[close - 1])
    assert not re.search(r"\d[\d.]*\s*GB of memory", said), said
    assert "held and holds now: the line\nunder the next cell" in said


def test_grading_a_lesson_that_trains_says_so_in_the_lesson_the_readme_and_at_its_start(
        monkeypatch):
    """Grading runs the launch cells again in a fresh kernel: minutes of training with no
    output. Lesson 1.1 and the README say so, and pytest names such notebooks first."""
    import importlib.util

    said = text(cells("01_launcher.ipynb")[first_index(cells("01_launcher.ipynb"),
                                                       r"Grading this lesson", "markdown")])
    assert "train again" in said and "prints nothing while a cell runs" in said
    readme = " ".join((NOTEBOOKS / "README.md").read_text().split())
    assert "Grading runs the launch cells too" in readme and "prints nothing while a cell runs" in readme
    monkeypatch.setenv("LABKIT_GRADING", "")  # the conftest sets it; put back after the test
    spec = importlib.util.spec_from_file_location("lessons_conftest", NOTEBOOKS / "conftest.py")
    conftest = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(conftest)
    items = [type("Item", (), {"fspath": NOTEBOOKS / name})() for name in
             ("01_launcher.ipynb", "02_watchdog_replay.ipynb", "03_group_size.ipynb")]
    lines = conftest.pytest_report_collectionfinish(None, REPO, items)
    assert [line.split(" has ")[0] for line in lines] == ["labkit: 01_launcher.ipynb",
                                                          "labkit: 03_group_size.ipynb"]
    assert lines[0].startswith("labkit: 01_launcher.ipynb has 3 cells that train runs; grading "
                               "trains them again")
