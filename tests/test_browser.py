"""Students' copies of lessons 1.2 and 1.1 in JupyterLab, in a real browser: Run All runs every
cell, a stop pressed during 1.1's launch leaves a run that resumes, and the rerun cell's live
figure grows as runs log steps.

What a student does first: open the lesson, Run > Run All Cells, read. This test does the
same in headless Chromium (Debian's `chromium`, driven by Playwright's Python package; no
browser is downloaded) against a JupyterLab started for it: as this user (with
--allow-root when that is root), on a free loopback port, with a token and a temporary
HOME, config and settings folder, on the students' copy as `labkit students` writes it from
the teachers' notebook, in a temporary folder laid out as a checkout (the lesson's runs
land there). So the copy in notebooks/students/, which a student may have solved, is
neither read nor touched (`labkit students --check` holds the committed copy to the same
text). Lesson 1.2: every code cell ran, the plots came out as PNG images, and each unsolved
exercise's check printed its not-yet line (a check cell never stops Run All). Lesson 1.1:
Kernel > Interrupt Kernel (the ■ button) once the launch cell's run has logged a step; the
run stops after its step with a checkpoint, Run All goes on to the last cell, and
`labkit launch --resume` continues the run with each step logged once. The live figure
(labkit.course.live, lesson 1.3's rerun cell) over two stand-in runs that log a step every
1.5 s: each image the cell shows is read off as the figure of so many steps, and they grow,
and the last is the final figure, no longer titled live. Lesson 1.3's cells as a student
meets them: the rise table of a completed and a stopped rerun (every column and the whole
note in view), the rerun cell edited to another seed (refused in one line, without the old
runs' figure), and answer cells that never end or run before the cells above them (one
line each, and Run All goes on). A screenshot of the page is kept in the test's temporary
folder, and in $LABKIT_SCREENSHOTS when set.

Skipped, with the reason, without chromium, playwright or JupyterLab: `pytest -q` alone
skips it. `.ci/run` installs both and sets LABKIT_REQUIRE_BROWSER, which turns the skip into
a failure, so CI cannot pass without running it.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
NOTEBOOKS = REPO / "notebooks"
LESSON = "02_watchdog_replay.ipynb"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]
# JupyterLab settings for the test: every cell in the page (no windowing, so the page holds
# each cell's prompt and output), no news or update checks (no network)
SETTINGS = {
    "@jupyterlab/notebook-extension/tracker.jupyterlab-settings": {"windowingMode": "none"},
    "@jupyterlab/apputils-extension/notification.jupyterlab-settings":
        {"fetchNews": "false", "checkForUpdates": False},
}
RUN_ALL_S = 150  # Run All on 2 cores takes ~20 s; the whole test stays under 3 minutes

pytestmark = pytest.mark.browser


def _missing() -> str | None:
    if not Path(CHROMIUM).exists():
        return "no chromium (Debian: apt-get install -y chromium)"
    for module, package in [("playwright.sync_api", "playwright"), ("jupyterlab", "jupyterlab")]:
        try:
            __import__(module)
        except ImportError:
            return f"no {package} (pip install {package})"
    return None


def fresh_copy(notebooks: Path = NOTEBOOKS, name: str = LESSON) -> str:
    """The students' copy of lesson `name` as `labkit students` writes it from the teachers'
    notebook in `notebooks` (never the copy in notebooks/students/, which may be solved)."""
    from labkit.course.students import student_texts

    return student_texts(notebooks)[name]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _write_settings(folder: Path) -> None:
    for name, values in SETTINGS.items():
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(values))


@pytest.fixture()
def lab(tmp_path, request):
    """(base URL, token, notebook path) of a JupyterLab serving a students' copy of the lesson
    (lesson 1.2, or the one a test names with `@pytest.mark.parametrize("lab", [NAME],
    indirect=True)`, or a notebook of the test's own given as (NAME, TEXT)), in the folder
    `tmp_path / "lab"`."""
    lesson = getattr(request, "param", LESSON)
    lesson, text = lesson if isinstance(lesson, tuple) else (lesson, None)
    missing = _missing()
    if missing and os.environ.get("LABKIT_REQUIRE_BROWSER"):
        pytest.fail(f"LABKIT_REQUIRE_BROWSER is set, but: {missing}")
    if missing:
        pytest.skip(missing)
    root, home = tmp_path / "lab", tmp_path / "home"
    # laid out as a student's checkout: the lesson in notebooks/, beside labkit/ and data/
    # (links to this one's), so the lesson's own runs go to this folder's runs/
    # (labkit.course.profiles.course_root), not to the repository's
    (root / "notebooks").mkdir(parents=True)
    for folder in ("labkit", "data"):
        (root / folder).symlink_to(REPO / folder, target_is_directory=True)
    home.mkdir()
    (root / "notebooks" / lesson).write_text(text or fresh_copy(name=lesson), encoding="utf-8")
    _write_settings(tmp_path / "settings")
    port, token = _free_port(), "labkit-browser-test"
    env = {k: v for k, v in os.environ.items()
           if k not in ("LABKIT_GRADING", "JUPYTER_CONFIG_DIR", "MPLBACKEND")}
    env.update(HOME=str(home), JUPYTER_CONFIG_DIR=str(tmp_path / "config"),
               JUPYTERLAB_SETTINGS_DIR=str(tmp_path / "settings"),
               JUPYTERLAB_WORKSPACES_DIR=str(tmp_path / "workspaces"), LABKIT_PROFILE="cpu",
               PYTHONPATH=os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p))
    command = [sys.executable, "-m", "jupyterlab", "--no-browser", "--ServerApp.ip=127.0.0.1",
               f"--ServerApp.port={port}", "--ServerApp.port_retries=0",
               f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={root}",
               "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"]
    if os.geteuid() == 0:
        command.append("--allow-root")
    log = open(tmp_path / "jupyterlab.log", "w")
    server = subprocess.Popen(command, cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT,
                              start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_for(f"{url}/api/status?token={token}", server, tmp_path / "jupyterlab.log")
        yield url, token, f"notebooks/{lesson}"
    finally:
        os.killpg(server.pid, signal.SIGTERM)  # the server and the kernels it started
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
        log.close()


def _wait_for(url: str, server: subprocess.Popen, log: Path, timeout_s: float = 90) -> None:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if server.poll() is not None:
            pytest.fail(f"JupyterLab exited ({server.returncode}):\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(url, timeout=2) as answer:
                if answer.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
    pytest.fail(f"JupyterLab did not answer in {timeout_s:.0f} s:\n{log.read_text()[-3000:]}")


def _wait_for_kernel(url: str, token: str, name: str, page, timeout_s: float = 90) -> None:
    """Wait until the notebook's kernel is up and idle (the server's sessions say so); a
    "Select Kernel" dialog, if JupyterLab asks, is answered with its default, as a student would."""
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        dialog = page.query_selector(".jp-Dialog .jp-mod-accept")
        if dialog is not None:
            dialog.click()
        with urllib.request.urlopen(f"{url}/api/sessions?token={token}", timeout=5) as answer:
            sessions = json.load(answer)
        if any(s["path"].endswith(name) and s["kernel"]["execution_state"] == "idle"
               for s in sessions):
            return
        page.wait_for_timeout(500)
    pytest.fail(f"the kernel of {name} did not start in {timeout_s:.0f} s")


def _prompts(page) -> list[str]:
    """The execution prompt of every code cell, in order ("[3]:", "[*]:" or "[ ]:")."""
    return page.eval_on_selector_all(".jp-Notebook .jp-CodeCell .jp-InputPrompt",
                                     "nodes => nodes.map(n => n.textContent.trim())")


@contextlib.contextmanager
def _lesson_page(lab):
    """The lesson open in headless Chromium, its kernel up and idle; the browser closes after."""
    from playwright.sync_api import sync_playwright

    url, token, name = lab
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=FLAGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.goto(f"{url}/lab/tree/{name}?token={token}")
            page.wait_for_selector(".jp-Notebook .jp-CodeCell", timeout=60_000)
            _wait_for_kernel(url, token, name, page)
            yield page
        finally:
            browser.close()


def _until_every_cell_ran(page, code_cells: int, bound_s: float, screenshot: Path) -> None:
    """Wait until every code cell shows its number (a new kernel counts from 1), at most
    `bound_s`; then keep a screenshot of the page."""
    fresh = [f"[{i}]:" for i in range(1, code_cells + 1)]
    end = time.monotonic() + bound_s
    while time.monotonic() < end and _prompts(page) != fresh:
        page.wait_for_timeout(500)
    page.wait_for_timeout(1000)  # the last outputs render
    page.screenshot(path=str(screenshot), full_page=True)
    _keep_screenshot(screenshot)


def _menu(page, menu: str, item: str) -> None:
    page.click(f".lm-MenuBar-itemLabel:text-is('{menu}')")
    page.click(f".lm-Menu-itemLabel:text-is('{item}')")


def test_run_all_on_a_students_copy_runs_every_cell(lab, tmp_path):
    notebook = json.loads(fresh_copy())
    code_cells = sum(c["cell_type"] == "code" for c in notebook["cells"])
    figures = sum("labkit.serving.replay.timeline(" in "".join(c["source"])
                  for c in notebook["cells"] if c["cell_type"] == "code")
    sources = "\n".join("".join(c["source"]) for c in notebook["cells"])
    unsolved = re.findall(r'exercises\.check\("([\d.]+)"', sources)
    with _lesson_page(lab) as page:
        _menu(page, "Run", "Run All Cells")
        _until_every_cell_ran(page, code_cells, RUN_ALL_S, tmp_path / "run-all.png")
        plot = page.query_selector(".jp-OutputArea-output img")
        if plot is not None:
            plot.scroll_into_view_if_needed()
            plot.screenshot(path=str(tmp_path / "plot.png"))
            _keep_screenshot(tmp_path / "plot.png")
        prompts = _prompts(page)
        outputs = page.inner_text(".jp-Notebook")
        images = page.eval_on_selector_all(
            ".jp-OutputArea-output img",
            "nodes => nodes.map(n => [n.getAttribute('src').slice(0, 22), n.naturalWidth])")
    assert prompts == [f"[{i}]:" for i in range(1, code_cells + 1)], f"not every cell ran: {prompts}"
    pngs = [width for src, width in images if src.startswith("data:image/png;base64")]
    assert len(pngs) == figures >= 1 and all(width > 0 for width in pngs), images
    assert len(unsolved) == 3
    for id in unsolved:
        assert f"Exercise {id}: not answered yet.\n" in outputs
    assert "Traceback" not in outputs and "ExerciseError" not in outputs


LAUNCHER = "01_launcher.ipynb"
# bounds only, never waited out: the first step of lesson 1.1's launch (the model read, one
# step of the cpu preset: ~1 minute on 2 idle cores), then the rest of its Run All
FIRST_STEP_S, LAUNCHER_RUN_ALL_S = 900, 1800


def _logged_runs(runs: Path) -> list[Path]:
    """Run folders under `runs` that have logged a step, oldest first."""
    found = [m.parent for m in runs.glob("*/metrics.jsonl") if m.read_text().strip()]
    return sorted(found, key=lambda d: (d / "config.json").stat().st_mtime)


@pytest.mark.parametrize("lab", [LAUNCHER], indirect=True)
def test_a_stop_in_lesson_1_1s_launch_cell_leaves_a_run_that_resumes(lab, tmp_path):
    """A student's Run All of lesson 1.1 who presses stop (Kernel > Interrupt Kernel, the ■
    button) once the launch cell's run has logged its first step: the run stops after the
    step it is in, Run All goes on through every cell with the stopped run, and the run then
    resumes from its checkpoint where it stopped."""
    root = tmp_path / "lab"
    notebook = json.loads(fresh_copy(name=Path(lab[2]).name))
    code_cells = sum(c["cell_type"] == "code" for c in notebook["cells"])
    with _lesson_page(lab) as page:
        _menu(page, "Run", "Run All Cells")
        end = time.monotonic() + FIRST_STEP_S
        while time.monotonic() < end and not _logged_runs(root / "runs"):
            page.wait_for_timeout(1000)
        assert _logged_runs(root / "runs"), f"no step logged in {FIRST_STEP_S} s"
        launched = _logged_runs(root / "runs")[0]
        _menu(page, "Kernel", "Interrupt Kernel")  # ■
        _until_every_cell_ran(page, code_cells, LAUNCHER_RUN_ALL_S, tmp_path / "launcher-stopped.png")
        prompts, outputs = _prompts(page), page.inner_text(".jp-Notebook")
    assert prompts == [f"[{i}]:" for i in range(1, code_cells + 1)], f"not every cell ran: {prompts}"
    assert "Traceback" not in outputs and "ExerciseError" not in outputs
    status = json.loads((launched / "status.json").read_text())
    assert status["reason"] == "signal", status
    last = status["last_step"]
    assert 0 <= last < notebook_steps(launched) - 1
    assert f"run stopped (signal: SIGINT) after step {last}" in outputs
    env = {**os.environ, "HOME": str(tmp_path / "home"), "LABKIT_PROFILE": "cpu"}
    env.pop("LABKIT_GRADING", None)
    resumed = subprocess.run(
        [sys.executable, "-m", "labkit", "launch", "--resume", str(launched),
         "--num-rollout", str(last + 2), "--no-progress"],
        cwd=root / "notebooks", env=env, capture_output=True, text=True,
        timeout=LAUNCHER_RUN_ALL_S)
    assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-2000:]
    steps = [json.loads(line)["rollout/step"] for line in
             (launched / "metrics.jsonl").read_text().splitlines() if line.strip()]
    assert steps == list(range(last + 2))  # each step once: the stopped ones, then one more


def live_reward(step, i):
    """The made-up reward of run `i` at `step` (an expression, for the cell; a value, here)."""
    return f"0.1 + 0.1 * {step} + 0.05 * {i}" if isinstance(step, str) else 0.1 + 0.1 * step + 0.05 * i


LIVE_STEPS = 6
LIVE_RUNS = ["2 answers", "8 answers"]
LIVE_ENDS = [{"reason": "completed", "last_step": LIVE_STEPS - 1},  # each run's status.json
             {"reason": "signal", "last_step": LIVE_STEPS - 1}]
# two runs that log a step every 1.5 s (what launch_many's runs do, minutes apart), drawn by
# the rerun cell's live figure, redrawn at most every 0.5 s
LIVE_CELL = f"""\
import json, threading, time
from pathlib import Path

import labkit.course.live

folders = [Path("live-runs") / name for name in {LIVE_RUNS!r}]
for folder in folders:
    folder.mkdir(parents=True, exist_ok=True)

def log_steps():
    for step in range({LIVE_STEPS}):
        time.sleep(1.5)
        for i, folder in enumerate(folders):
            row = {{"rollout/step": step, "rollout/raw_reward": {live_reward("step", "i")}}}
            with open(folder / "metrics.jsonl", "a") as out:
                out.write(json.dumps(row) + "\\n")
    for folder, status in zip(folders, {LIVE_ENDS!r}):  # as each run ends
        (folder / "status.json").write_text(json.dumps(status))

runs = threading.Thread(target=log_steps)
with labkit.course.live.LiveCurves(folders, every_s=0.5, steps={LIVE_STEPS}):
    runs.start()
    runs.join()
"""


def live_figures() -> dict[bytes, tuple[int, bool]]:
    """Every PNG the live figure can show for the cell's runs -> (the steps it draws, whether
    it is the final figure): the figure drawn here, by the same code, for each count of
    logged steps, live and final (the final one with how each run ended, LIVE_ENDS)."""
    import io
    import tempfile

    import labkit.course.live as live

    figures = {}
    with tempfile.TemporaryDirectory() as there:
        folders = [Path(there) / name for name in LIVE_RUNS]  # as the cell's, once they ended
        for folder, status in zip(folders, LIVE_ENDS):
            folder.mkdir()
            (folder / "status.json").write_text(json.dumps(status))
        for logged in range(2 * LIVE_STEPS + 1):
            curves = live.LiveCurves(folders, steps=LIVE_STEPS)
            for i, folder in enumerate(folders):  # run 0 logs a step before run 1 does
                steps = (logged + 1 - i) // 2
                curves._rewards[folder] = [(s, live_reward(s, i)) for s in range(steps)]
            for final in (False, True):
                png = io.BytesIO()
                curves.figure(final=final).savefig(png, format="png", dpi=100)
                figures[png.getvalue()] = (logged, final)
    return figures


@pytest.mark.parametrize("lab", [("live_curves.ipynb", json.dumps({
    "cells": [{"cell_type": "code", "execution_count": None, "metadata": {}, "outputs": [],
               "source": LIVE_CELL}],
    "metadata": {"kernelspec": {"display_name": "Python 3 (ipykernel)", "language": "python",
                                "name": "python3"}},
    "nbformat": 4, "nbformat_minor": 5}))], indirect=True)
def test_the_live_figure_grows_in_the_cell_while_the_runs_log_steps(lab, tmp_path):
    """The rerun cell's figure in JupyterLab: while the cell runs, the image in its output is
    redrawn with more steps each time, titled live; it ends with every step, titled as the
    final figure (no longer "live ... so far" once the runs are over). Each image is read
    off by the figure this test draws for that many steps, live or final."""
    import base64

    figures = live_figures()
    seen: list[tuple[int, bool]] = []
    with _lesson_page(lab) as page:
        _menu(page, "Run", "Run All Cells")
        end = time.monotonic() + 120  # the cell takes ~9 s
        while time.monotonic() < end:
            srcs = page.eval_on_selector_all(".jp-OutputArea-output img",
                                             "nodes => nodes.map(n => n.getAttribute('src'))")
            for src in srcs:
                png = base64.b64decode(src.split(",", 1)[1])
                shown = figures.get(png, (-1, False))
                if not seen or seen[-1] != shown:
                    seen.append(shown)
            if _prompts(page) == ["[1]:"]:
                break
            page.wait_for_timeout(100)
        page.wait_for_timeout(1000)  # the last image renders
        for src in page.eval_on_selector_all(".jp-OutputArea-output img",
                                             "nodes => nodes.map(n => n.getAttribute('src'))"):
            shown = figures.get(base64.b64decode(src.split(",", 1)[1]), (-1, False))
            if seen[-1] != shown:
                seen.append(shown)
        page.screenshot(path=str(tmp_path / "live-figure.png"), full_page=True)
        _keep_screenshot(tmp_path / "live-figure.png")
    steps = [logged for logged, _ in seen]
    assert -1 not in steps, f"an image that is not the figure of any count of steps: {seen}"
    assert steps == sorted(steps) and seen[-1] == (2 * LIVE_STEPS, True), seen
    assert not any(final for _, final in seen[:-1]), f"final before the cell ended: {seen}"
    assert len(seen) >= 4, f"the figure was not redrawn as steps came: {seen}"


def notebook_steps(run_dir: Path) -> int:
    """The steps the run was launched for (its config's --num-rollout)."""
    return json.loads((run_dir / "config.json").read_text())["num_rollout"]


def _keep_screenshot(path: Path) -> None:
    folder = os.environ.get("LABKIT_SCREENSHOTS")
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        shutil.copy(path, Path(folder) / path.name)


def test_the_browser_test_serves_a_fresh_copy_not_a_solved_one(tmp_path):
    """A student who solved lesson 1.2 in notebooks/students/ does not change what the
    browser test opens: the copy written from the teachers' notebook, unsolved."""
    teacher = json.loads((NOTEBOOKS / LESSON).read_text())
    (tmp_path / LESSON).write_text(json.dumps(teacher))
    (tmp_path / "students").mkdir()
    solved = fresh_copy().replace("= None  # Exercise", "= 3  # Exercise")
    assert solved != fresh_copy()
    (tmp_path / "students" / LESSON).write_text(solved)
    served = fresh_copy(tmp_path)
    assert served == fresh_copy() and served.count("= None  # Exercise 1.2.") == 3


def test_a_missing_browser_is_named_for_the_skip(monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "CHROMIUM", "/nonexistent/chromium")
    assert _missing() == "no chromium (Debian: apt-get install -y chromium)"
    monkeypatch.setitem(sys.modules, "playwright.sync_api", None)  # import -> ImportError
    monkeypatch.setattr(sys.modules[__name__], "CHROMIUM", sys.executable)  # a file that exists
    assert _missing() == "no playwright (pip install playwright)"


GROUP_SIZE = "03_group_size.ipynb"


def lesson_cell(name: str, id: str) -> str:
    """The source of the teachers' notebook `name`'s cell `id`."""
    cells = json.loads((NOTEBOOKS / name).read_text())["cells"]
    return next("".join(c["source"]) for c in cells if c.get("id") == id)


def notebook_of(*sources: str) -> str:
    """A notebook (as text) of one code cell per source, for the lab fixture."""
    return json.dumps({
        "cells": [{"cell_type": "code", "execution_count": None, "metadata": {}, "outputs": [],
                   "source": source} for source in sources],
        "metadata": {"kernelspec": {"display_name": "Python 3 (ipykernel)", "language": "python",
                                    "name": "python3"}},
        "nbformat": 4, "nbformat_minor": 5})


def write_reruns(folder: Path) -> None:
    """Two stand-in reruns of 12 steps launched: 2 answers completed, 8 answers stopped after
    step 2 (so its rise table row has a note)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from fixtures_runs import write_run

    for answers, steps, status in ((2, 12, "completed"), (8, 3, "signal")):
        run = write_run(folder, f"rerun-cpu-n{answers}", group_size=answers, seed=7, prompts=4,
                        rewards=[0.2 + 0.02 * s for s in range(steps)], times=[30.0] * steps,
                        status=status)
        config = json.loads((run / "config.json").read_text())
        (run / "config.json").write_text(json.dumps({**config, "num_rollout": 12}))


RISE_SETUP = """\
from pathlib import Path

import labkit
import labkit.analysis

reruns = [labkit.Run(p) for p in sorted(Path("reruns").iterdir())]"""


@pytest.mark.parametrize("lab", [("rise_table.ipynb", notebook_of(
    RISE_SETUP, lesson_cell(GROUP_SIZE, "rerun-rise")))], indirect=True)
def test_the_rerun_rise_table_shows_every_column_and_note_in_view(lab, tmp_path):
    """Lesson 1.3's rise table, as its cell shows it in JupyterLab, for a completed and a
    stopped rerun: the seed is there, and the stopped run's note can be read whole, without
    scrolling the output sideways."""
    import labkit.analysis

    folder = tmp_path / "lab" / "notebooks" / "reruns"
    write_reruns(folder)
    rise = labkit.analysis.reward_rise(labkit.analysis.load_runs(folder))
    (note,) = [n for n in rise.note if n]  # the stopped run's, as reward_rise words it
    with _lesson_page(lab) as page:
        _menu(page, "Run", "Run All Cells")
        _until_every_cell_ran(page, 2, 120, tmp_path / "rise-table.png")
        output = page.query_selector_all(".jp-Notebook .jp-CodeCell .jp-OutputArea")[-1]
        output.screenshot(path=str(tmp_path / "rise-output.png"))
        _keep_screenshot(tmp_path / "rise-output.png")
        seen = output.inner_text()
        cut = page.evaluate("""(area) => {
            const box = area.getBoundingClientRect();
            return [...area.querySelectorAll('td, th')]
                .filter(c => c.getBoundingClientRect().right > box.right + 1)
                .map(c => c.textContent.trim());
        }""", output)
        wide = page.evaluate("(area) => area.scrollWidth > area.clientWidth + 1", output)
    assert f"8 answers: {note}" in seen, seen  # whole, not cut short with "..."
    assert "seed" in seen and "stopped after step 2" in seen, seen
    assert cut == [] and not wide, f"cut off at the output's right edge: {cut}"


def students_cell(name: str, id: str, typed: str | None = None) -> str:
    """The source of cell `id` of the students' copy of lesson `name`, with `typed` over its
    answer placeholder (the line `... = None  # Exercise ...`) when given."""
    cells = json.loads(fresh_copy(name=name))["cells"]
    source = next("".join(c["source"]) for c in cells if c.get("id") == id)
    return re.sub(r"\w+ = None  # Exercise .*", lambda _: typed, source) if typed else source


def solution_typed(name: str, id: str) -> str:
    """The teachers' answer cell `id` of lesson `name` without its marker lines: a right
    answer, as a student would type it in their copy."""
    return "\n".join(line for line in lesson_cell(name, id).splitlines() if "SOLUTION" not in line)


ANSWER_DEADLINE_S = 3  # the test's deadline for an answer (the lessons' is 60 s)


@pytest.mark.parametrize("lab", [("answers.ipynb", notebook_of(
    f"import os\nos.environ['LABKIT_ANSWER_DEADLINE_S'] = '{ANSWER_DEADLINE_S}'",
    students_cell(LESSON, "c01"),
    students_cell(LESSON, "c07"),  # the retry policy, which 1.2.1 asks about
    students_cell(LESSON, "c09", typed="while True:\n        pass"),
    students_cell(LESSON, "c10"),
    solution_typed(GROUP_SIZE, "c26"),
    "print('the end')"))], indirect=True)
def test_an_answer_that_never_ends_or_runs_too_early_says_so_and_run_all_goes_on(lab, tmp_path):
    """A student's Run All over an answer that never ends (1.2.1: `while True`) and a right
    answer run before the cells it needs (1.3.3, without `pair`): the loop is stopped at
    its deadline and said in one line, its check says so, the early answer is told to run
    the cells above (not that it is wrong), and every cell after them runs."""
    with _lesson_page(lab) as page:
        _menu(page, "Run", "Run All Cells")
        _until_every_cell_ran(page, 7, 120, tmp_path / "answers.png")
        page.query_selector_all(".jp-Notebook .jp-CodeCell")[-1].scroll_into_view_if_needed()
        page.screenshot(path=str(tmp_path / "answers-below.png"))
        _keep_screenshot(tmp_path / "answers-below.png")
        prompts, outputs = _prompts(page), page.inner_text(".jp-Notebook")
    assert prompts == [f"[{i}]:" for i in range(1, 8)], f"not every cell ran: {prompts}"
    said = " ".join(outputs.split())
    assert (f"Exercise 1.2.1: your answer did not end in {ANSWER_DEADLINE_S} s and was stopped at "
            f"line 2 of this cell (a loop that never ends?).") in said, said
    assert (f"Exercise 1.2.1: not yet. Your answer cell did not end in {ANSWER_DEADLINE_S} s and "
            f"was stopped at line 2 (a loop that never ends?).") in said, said
    assert ("Exercise 1.3.3: this cell needs `pair`, which a cell above defines: run the cells "
            "above first") in said, said
    assert "your answer raised NameError" not in said and "Traceback" not in outputs
    assert "the end" in outputs


def write_old_reruns(root: Path) -> list[str]:
    """The rerun cell's run folders in the checkout at `root` as a launch of the cpu profile
    left them, with two steps logged each; returns their names."""
    from labkit.course import profiles

    names = []
    for cfg in profiles.rerun_configs("cpu"):
        folder = root / "runs" / cfg.run_name
        folder.mkdir(parents=True)
        (folder / "config.json").write_text(json.dumps(cfg.to_dict()))
        (folder / "metrics.jsonl").write_text("".join(
            json.dumps({"rollout/step": s, "rollout/raw_reward": 0.2}) + "\n" for s in range(2)))
        names.append(cfg.run_name)
    return names


RERUN_SEED_2 = lesson_cell(GROUP_SIZE, "c08").replace(
    "configs = labkit.course.profiles.rerun_configs(PROFILE)",
    "configs = [c.replace(seed=2) for c in labkit.course.profiles.rerun_configs(PROFILE)]")


@pytest.mark.parametrize("lab", [("rerun_seed.ipynb", notebook_of(
    lesson_cell(GROUP_SIZE, "c01"), RERUN_SEED_2, "print('the end')"))], indirect=True)
def test_the_rerun_cell_with_another_seed_is_refused_in_one_line_that_says_how(lab, tmp_path):
    """Lesson 1.3's rerun cell edited to another seed, where the folders hold the runs of the
    profile's seed: the cell shows one line, no traceback and no figure of the old runs, and
    the line says how to run the new seed from the cell."""
    assert "c.replace(seed=2)" in RERUN_SEED_2  # the lesson's cell, as a student edits it
    old = write_old_reruns(tmp_path / "lab")
    with _lesson_page(lab) as page:
        _menu(page, "Run", "Run All Cells")
        end = time.monotonic() + 120  # Run All stops at the refused cell
        while time.monotonic() < end and "RerunRefused" not in page.inner_text(".jp-Notebook"):
            page.wait_for_timeout(500)
        page.wait_for_timeout(1000)  # the output renders
        cell = page.query_selector_all(".jp-Notebook .jp-CodeCell")[1]
        cell.scroll_into_view_if_needed()
        cell.screenshot(path=str(tmp_path / "rerun-refused.png"))
        _keep_screenshot(tmp_path / "rerun-refused.png")
        shown = cell.query_selector(".jp-OutputArea").inner_text()
        images = cell.query_selector_all(".jp-OutputArea-output img")
    lines = [line for line in shown.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("RerunRefused: "), shown
    assert f"{old[0]} holds a run of another config" in lines[0]
    assert "rerun_configs(PROFILE, seed=2)" in lines[0] and "Traceback" not in shown
    assert images == [], "the figure of the old runs is still shown"
