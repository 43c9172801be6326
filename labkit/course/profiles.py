"""Profiles: the run a lesson launches, the GPU recipe or a CPU run that ends in minutes.

A lesson is written once and runs on two kinds of machine. On the course's H200 it
launches the recipe as written (`gpu`: `RunConfig()`, Qwen2.5-0.5B-Instruct, 32 prompts
x 8 answers, 24 steps). On a laptop or a CI runner with no GPU it launches the same loop
on the embedded SmolLM2-135M (`cpu`: the `cpu` preset, command (a) of the README, a run
on made-up problems whose reward rises in minutes), so every cell runs and every exercise
can be graded. The first cell of
each notebook is `PROFILE = labkit.course.profiles.pick()`: the GPU when there is one, else the
CPU, and the environment variable LABKIT_PROFILE overrides both.

On a GPU box without the hub, LABKIT_MODEL and LABKIT_DATA (labkit.config) name local
copies of the recipe's model (a folder or a GGUF) and of GSM8K; the `gpu` profile, made
from the recipe, uses them, and says so. miles trains a Hugging Face checkpoint, so lesson
1.1's miles script names the recipe's hub model then (`miles_config`).

The lessons also need to find the course's data from wherever the notebook is opened
(notebooks/ or notebooks/students/): the raw runs (data/runs, or LABKIT_RUNS_DIR, which
is how tests and CI point a lesson at constructed runs) and the recorded 503 incident
(data/incidents).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from pathlib import Path

from labkit.config import DATA_ENV, EMBEDDED_MODEL, MODEL_ENV, RECIPE_MODEL, ConfigError, RunConfig

PROFILE_ENV = "LABKIT_PROFILE"
RUNS_ENV = "LABKIT_RUNS_DIR"

# A profile is a kind of machine; the run it launches is a preset of labkit.config.PRESETS
# (one definition of each run, whatever launches it).
PROFILES: dict[str, str] = {
    "gpu": "recipe",  # the course's recipe as written: Qwen2.5-0.5B-Instruct, 24 steps
    "cpu": "cpu",  # the embedded model on the easiest made-up problems: command (a)'s run
}


def has_gpu() -> bool:
    """True when torch sees a CUDA device."""
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a dependency
        return False
    return bool(torch.cuda.is_available())


def pick(env: Mapping[str, str] | None = None, *, gpu: bool | None = None,
         say: bool = True) -> str:
    """The profile a lesson runs: $LABKIT_PROFILE when set, else "gpu" with a GPU, else "cpu".

    `env` (default os.environ) and `gpu` (default: ask torch) are for tests. With `say`,
    prints one line naming the profile, why it was chosen and how to change it.
    Raises ConfigError for a LABKIT_PROFILE that names no profile.
    """
    env = os.environ if env is None else env
    gpu = has_gpu() if gpu is None else gpu
    asked = (env.get(PROFILE_ENV) or "").strip().lower()
    if asked:
        if asked not in PROFILES:
            raise ConfigError(f"{PROFILE_ENV}={asked!r} names no profile; use one of: "
                              f"{', '.join(PROFILES)} (or unset it to choose by hardware)")
        name, why = asked, f"{PROFILE_ENV}={asked}"
        if name == "gpu" and not gpu:
            why += "; no GPU is visible, so launching will be very slow or fail"
    else:
        name = "gpu" if gpu else "cpu"
        why = ("a GPU is visible" if gpu else "no GPU here") + \
              f"; set {PROFILE_ENV}={'cpu' if gpu else 'gpu'} to change it"
    if say:
        print(f"profile: {name} ({why})\n  runs {describe(name)}")
    return name


def describe(profile: str, env: Mapping[str, str] | None = None) -> str:
    """What a profile's launch runs, read from its preset (so the text follows the preset),
    naming a local copy set by LABKIT_MODEL or LABKIT_DATA (`env`, default os.environ)."""
    cfg = RunConfig.preset(PROFILES[profile])
    env = os.environ if env is None else env
    model = {RECIPE_MODEL: RECIPE_MODEL, EMBEDDED_MODEL: "SmolLM2-135M (embedded)"}.get(
        cfg.model, cfg.model)
    if cfg.model == (env.get(MODEL_ENV) or "").strip():
        model = f"{cfg.model} (${MODEL_ENV})"
    data = "made-up problems" if cfg.data == "synthetic" else cfg.data
    if cfg.data == (env.get(DATA_ENV) or "").strip():
        data = f"{cfg.data} (${DATA_ENV})"
    steps = f"{cfg.num_rollout} step{'s' if cfg.num_rollout != 1 else ''}"
    return (f"{'the recipe: ' if profile == 'gpu' else ''}{model} on {data}, "
            f"{cfg.rollout_batch_size} prompts x {cfg.n_samples_per_prompt} answers, "
            f"at most {cfg.rollout_max_response_len} tokens, {steps}")


def miles_config(profile: str) -> RunConfig:
    """The config lesson 1.1 shows as a miles script: the `gpu` profile's run, or the recipe
    on the `cpu` profile, with the recipe's hub model in place of a model miles cannot
    take as it is (a local copy set by LABKIT_MODEL, a GGUF, the embedded model); then
    prints a note that says so."""
    cfg = config(profile) if profile == "gpu" else RunConfig.preset(PROFILES["gpu"])
    if cfg.model == RECIPE_MODEL:
        return cfg
    print(f"note: this machine's runs train {cfg.model}; the script names the recipe's "
          f"{RECIPE_MODEL}, the Hugging Face checkpoint miles trains (put a copy where "
          f"HF_CHECKPOINT says, or set HF_CHECKPOINT)")
    return cfg.replace(model=RECIPE_MODEL)


def plain_warnings() -> None:
    """Show warnings as "UserWarning: message", without the file and line they came from.

    The file path changes from machine to machine (and, for a notebook cell, from kernel to
    kernel), so a lesson graded by nbval shows a warning the same way everywhere.
    """
    import warnings

    def short(message, category, filename, lineno, line=None) -> str:
        return f"{category.__name__}: {message}\n"

    warnings.formatwarning = short


def config(profile: str, **changes) -> RunConfig:
    """The RunConfig a lesson launches for `profile` ("gpu" or "cpu"), with `changes` on top.

    Runs go to the repository's runs/ folder (ignored by git) unless `output_dir` is given,
    named relative to the working folder when it is inside the repository (`../runs` from
    notebooks/), so what a lesson prints holds no machine's absolute path.
    The config is checked, so a change that breaks the batch arithmetic raises ConfigError.
    """
    if profile not in PROFILES:
        raise ConfigError(f"unknown profile {profile!r}; use one of: {', '.join(PROFILES)}")
    values = {"output_dir": str(_near(course_root() / "runs")), **changes}
    return RunConfig.preset(PROFILES[profile], **values).check()


# Lesson 1.3's rerun cell: the group sizes it runs side by side (GPU) or one after another (CPU)
RERUN_ANSWERS: dict[str, tuple[int, ...]] = {"cpu": (2, 8), "gpu": (4, 8, 16)}


def rerun_configs(profile: str, answers: tuple[int, ...] | None = None, **changes) -> list[RunConfig]:
    """The configs of lesson 1.3's rerun cell: the profile's run with `answers` answers per
    prompt (default RERUN_ANSWERS: 2 and 8 on a CPU, 4, 8 and 16 on a GPU), each with the
    matching --global-batch-size (one optimizer step per rollout) and `changes` to other
    fields (seed=2, num_rollout=24, ...), and a fixed run name, rerun_name(...): launching
    them again with resume=True continues what a stop left (labkit.launch_many), and runs
    with other changes get folders of their own. Raises ConfigError for a change that
    breaks the batch arithmetic or names no field."""
    base = config(profile, **changes)
    return [base.replace(n_samples_per_prompt=n, global_batch_size=base.rollout_batch_size * n,
                         run_name=rerun_name(profile, n, **changes)).check()
            for n in (answers or RERUN_ANSWERS[profile])]


def rerun_name(profile: str, answers: int, **changes) -> str:
    """The rerun cell's name of a run: `rerun-<profile>-n<answers>`, then `-<field><value>`
    for each change from the profile's run, in the order given: rerun-cpu-n2-seed2."""
    said = "".join(f"-{name}{value}" for name, value in changes.items() if name != "output_dir")
    return f"rerun-{profile}-n{answers}{said}"


def _near(path: Path) -> Path:
    """`path` relative to the working folder when both are inside the repository, else as is."""
    root, here = course_root(), Path.cwd().resolve()
    if here == root or root in here.parents:
        return Path(os.path.relpath(path, here))
    return path


class AfterStep(threading.Thread):
    """Calls `function(*args)` once a new run under `output_dir` has logged step `step`, from a
    thread: lesson 1.1 presses ■ (SIGINT to its own kernel) this way, in the middle of a run
    whatever the machine's pace, and never while the model is still loading. `cancel()`
    (after the run) keeps it from calling at all."""

    def __init__(self, output_dir, step: int, function, *args, poll_s: float = 0.2):
        super().__init__(daemon=True)
        self.output_dir, self.step, self.poll_s = Path(output_dir), step, poll_s
        self.function, self.args = function, args
        self.finished = threading.Event()
        self.called = False
        self._old = set(self._runs())

    def _runs(self) -> list[Path]:
        return [p for p in self.output_dir.glob("*") if p.is_dir()] \
            if self.output_dir.is_dir() else []

    def _logged(self, run_dir: Path) -> bool:
        from labkit.run.log import METRICS

        try:
            lines = (run_dir / METRICS).read_text().splitlines()
        except OSError:
            return False
        return len([line for line in lines if line.strip()]) > self.step

    def run(self) -> None:
        while not self.finished.wait(self.poll_s):  # wakes at once on cancel()
            if any(self._logged(p) for p in self._runs() if p not in self._old):
                self.finished.set()
                self.called = True
                self.function(*self.args)

    def cancel(self) -> None:
        self.finished.set()


def after_step(cfg: RunConfig, step: int, function, *args) -> AfterStep:
    """A thread (not started) that calls `function(*args)` once a run of `cfg` started from now
    on has logged step `step` (see AfterStep); `start()` it before the launch."""
    return AfterStep(cfg.output_dir, step, function, *args)


def checkpoints(folder: Path | None = None):
    """The checkpoints kept in the run folders under `folder` (default: the repository's runs/,
    where the lessons write): a DataFrame with one row per run folder that holds one, its
    step, its size in GB and the folder to delete when the run need not resume. A completed
    run keeps none; a run stopped with ■ keeps one (1.6 GB on the CPU profile)."""
    import pandas as pd

    from labkit.run.checkpoint import latest_checkpoint
    from labkit.run.log import CHECKPOINT, RunLogError

    folder = Path(folder) if folder is not None else _near(course_root() / "runs")
    rows = []
    for run_dir in sorted(p.parent for p in folder.glob(f"*/{CHECKPOINT}") if p.is_dir()):
        files = [f for f in (run_dir / CHECKPOINT).rglob("*") if f.is_file()]
        try:
            found = latest_checkpoint(run_dir)
        except RunLogError:
            found = None
        rows.append({"run": run_dir.name, "after step": found[0] if found else None,
                     "GB": round(sum(f.stat().st_size for f in files) / 1e9, 2),
                     "delete to free it": str(run_dir / CHECKPOINT)})
    return pd.DataFrame(rows, columns=["run", "after step", "GB", "delete to free it"])


# ------------------------------------------------------------------ where the data lives
def course_root(start: Path | None = None) -> Path:
    """The repository folder: the first of `start` (default: the working folder) and its
    parents that holds both notebooks/ and labkit/; else the folder above the labkit
    package (an editable install)."""
    here = Path(start or Path.cwd()).resolve()
    for folder in (here, *here.parents):
        if (folder / "notebooks").is_dir() and (folder / "labkit").is_dir():
            return folder
    return Path(__file__).resolve().parents[2]


def runs_dir(env: Mapping[str, str] | None = None) -> Path:
    """The folder of raw runs a lesson compares: $LABKIT_RUNS_DIR when set, else data/runs."""
    env = os.environ if env is None else env
    given = env.get(RUNS_ENV)
    return Path(given).expanduser() if given else course_root() / "data" / "runs"


def recorded_incidents(folder: Path | None = None) -> list[Path]:
    """The recorded client logs in `folder` (default data/incidents): *.jsonl files whose
    name does not say "constructed", sorted by name."""
    folder = Path(folder) if folder else course_root() / "data" / "incidents"
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.glob("*.jsonl") if "constructed" not in p.name)


def incident_log(name: str | None = None, *, folder: Path | None = None,
                 scratch: Path | None = None) -> Path:
    """The client log lesson 1.2 replays.

    `name` (a file stem or name in data/incidents) picks a recording; without it the first
    recording there is taken. With no recording at all, the constructed course scenario
    (labkit.course.incidents.course_scenario: made up, not measured) is written to
    `scratch`/course.constructed.jsonl (default: out/incidents, ignored by git) and that
    path is returned; replay() and the timeline label it CONSTRUCTED.
    Raises FileNotFoundError for a `name` that is not there.
    """
    recorded = recorded_incidents(folder)
    if name is not None:
        for path in recorded:
            if name in (path.name, path.stem):
                return path
        have = ", ".join(p.name for p in recorded) or "none"
        raise FileNotFoundError(f"no recorded incident {name!r} in "
                                f"{folder or 'data/incidents'} (recordings there: {have})")
    if recorded:
        return recorded[0]
    from labkit.course.incidents import course_scenario, write_scenario

    scratch = Path(scratch) if scratch else course_root() / "out" / "incidents"
    return write_scenario(scratch / "course.constructed.jsonl", course_scenario())
