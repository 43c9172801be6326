"""A run as the user holds it: its folder, config, per-step metrics and samples as DataFrames.

`labkit.launch(cfg)` returns a Run; so does `Run("runs/<name>")` for a finished run. The
same folder can be continued with `--resume`, which only accepts a config that matches the
one the folder was started with (a few bookkeeping fields may change).
"""

from __future__ import annotations

import time
from dataclasses import fields
from pathlib import Path

from labkit import __version__
from labkit.config import RunConfig
from labkit.runlog import RunLog, RunLogError, read_jsonl

# Fields a resumed run may change: they do not change what a step computes. With
# --rollout-mode http that includes where the engines are: a run may resume against a new
# router (its engines get the checkpoint's weights at start).
RESUMABLE = {"num_rollout", "time_limit", "progress", "output_dir", "run_name", "eval_interval",
             "save_interval", "n_logged_prompts", "heat_pause_c", "heat_resume_c",
             "router_url", "max_open_requests"}


class Run:
    """A run folder with readers for what the run wrote."""

    def __init__(self, run_dir: str | Path):
        self.dir = Path(run_dir)
        if not (self.dir / "config.json").exists():
            raise RunLogError(f"{self.dir} is not a labkit run folder (no config.json)")

    @property
    def config(self) -> dict:
        return RunLog(self.dir).config()

    @property
    def metrics(self):
        """One row per finished step, columns named as in labkit.metrics."""
        import pandas as pd

        rows, _ = read_jsonl(self.dir / "metrics.jsonl")
        return pd.DataFrame(rows)

    @property
    def samples(self):
        """The logged completions: step, prompt id, label, completion, reward."""
        import pandas as pd

        rows, _ = read_jsonl(self.dir / "samples.jsonl")
        return pd.DataFrame(rows)

    @property
    def status(self) -> dict | None:
        return RunLog(self.dir).status()

    def __repr__(self) -> str:
        st = self.status or {}
        return (f"Run({str(self.dir)!r}: {len(self.metrics)} steps, "
                f"{st.get('reason', 'running or died')})")


def default_run_name(cfg: RunConfig) -> str:
    """A readable, unique-enough folder name: time, prompts x answers, seed."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return f"{stamp}-p{cfg.rollout_batch_size}-n{cfg.n_samples_per_prompt}-s{cfg.seed}"


def saved_config(run_dir: str | Path) -> RunConfig:
    """The RunConfig a run folder was started with."""
    saved = RunLog(Path(run_dir)).config()
    known = {f.name for f in fields(RunConfig)}
    return RunConfig(**{k: v for k, v in saved.items() if k in known})


def config_mismatches(saved: RunConfig, given: RunConfig) -> list[str]:
    """Flags whose values differ between a run folder and a config, outside RESUMABLE."""
    out = []
    for f in fields(RunConfig):
        a, b = getattr(saved, f.name), getattr(given, f.name)
        if f.name not in RESUMABLE and a != b:
            out.append(f"--{f.name.replace('_', '-')}: folder has {a!r}, given {b!r}")
    return out


def open_run_folder(cfg: RunConfig, resume: str | Path | None) -> tuple[Path, RunLog, int]:
    """Create the run folder, or open `resume` after checking its config matches `cfg`."""
    if resume is None:
        run_dir = Path(cfg.output_dir) / (cfg.run_name or default_run_name(cfg))
        log = RunLog.create(run_dir, {**cfg.to_dict(), "labkit_version": __version__})
        return run_dir, log, 0
    run_dir = Path(resume)
    log = RunLog.open(run_dir, repair=True)
    bad = config_mismatches(saved_config(run_dir), cfg)
    if bad:
        raise RunLogError(
            f"--resume {run_dir}: the config does not match the run folder:\n  " + "\n  ".join(bad)
            + "\nresume with the folder's config (labkit launch --resume DIR and no other flags)"
        )
    return run_dir, log, log.last_step() + 1
