"""Checkpoints: the policy and optimizer after a finished step, written so none is half there.

A checkpoint is one file, `checkpoint/step-<N>.pt`, written to a temporary name and
renamed; `checkpoint/latest.json` (also renamed into place) names the newest. A crash
while saving leaves the previous checkpoint and pointer intact, and only a temporary file,
which the next start in that folder sweeps away. Everything else a run needs to continue
(data order, sampling seeds) is derived from the config's seed and the step number, so the
checkpoint holds no RNG streams to get out of step.

When to write one (`SavePolicy`, `--save-interval`): a checkpoint of SmolLM2-135M with its
Adam state is 1.6 GB, and a walk through the lessons wrote 14 GB of them, so by default
(`0`) a run writes one only when it may be resumed: when it stops before its last step
(signal, time limit, error), and a rolling one after a step when `AUTO_SAVE_S` (10 minutes)
have passed since the last, so a run killed without warning (SIGKILL, the OOM killer)
loses at most that much. A run that completes removes those and keeps none. `K > 0` saves
every K steps and after the last step, and removes nothing; `-1` never saves (no --resume).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path

import torch

from labkit.run.files import (
    WriteFailed,
    disk_full,
    file_there,
    folder_there,
    read_json,
    write_json_atomic,
)
from labkit.run.log import CHECKPOINT, RunLogError

LATEST = "latest.json"
AUTO_SAVE_S = 600.0  # default policy: a rolling checkpoint once this long has passed since the last
AUTO = ("stop", "rolling")  # what the default policy writes, and removes when the run completes


class SavePolicy:
    """When the trainer writes a checkpoint, from `--save-interval` (see the module docstring).

    `after_step(step)` and `at_end(step, completed)` return why to save ("interval",
    "rolling", "final", "stop") or None; `saved(step)` records a write.
    """

    def __init__(self, interval: int, *, every_s: float | None = None,
                 clock: Callable[[], float] = time.monotonic):
        self.interval, self.clock = int(interval), clock
        self.every_s = AUTO_SAVE_S if every_s is None else float(every_s)
        self.last_saved: int | None = None
        self._since = clock()

    def after_step(self, step: int) -> str | None:
        if self.interval > 0:
            return "interval" if (step + 1) % self.interval == 0 else None
        if self.interval == 0 and self.clock() - self._since >= self.every_s:
            return "rolling"
        return None

    def at_end(self, step: int, completed: bool) -> str | None:
        if self.interval < 0 or step < 0 or step == self.last_saved:
            return None
        if self.interval > 0:
            return "final" if completed else "stop"
        return None if completed else "stop"

    def saved(self, step: int) -> None:
        self.last_saved, self._since = step, self.clock()


class CheckpointWriteFailed(WriteFailed):
    """A checkpoint could not be written (the disk is full, the folder is read-only, ...)."""


def save_checkpoint(run_dir: Path, step: int, model, optimizer, *, keep: int = 1,
                    why: str = "stop") -> Path:
    """Save the state after `step`; keep the newest `keep` checkpoints. Returns the file.

    `why` (stop, rolling, interval, final) goes to latest.json: a completed run removes the
    checkpoints of the default policy (AUTO). Raises CheckpointWriteFailed in plain words.
    """
    folder = Path(run_dir) / CHECKPOINT
    path = folder / f"step-{step}.pt"
    tmp = folder / f".step-{step}.pt.tmp{os.getpid()}"
    state = {
        "step": step,
        "model": {k: v.detach().cpu() for k, v in model.state_dict().items()},
        "optimizer": optimizer.state_dict(),
        "torch_rng": torch.get_rng_state(),
    }
    try:
        folder.mkdir(parents=True, exist_ok=True)  # a full disk may refuse the folder too
        # Our own file, closed whatever happens: torch.save(state, path) keeps its file open
        # while its exception lives, so after a full disk the removed temporary file still
        # held the space, and the status written next found the disk full.
        with open(tmp, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        tmp.unlink(missing_ok=True)
        if isinstance(e, Exception):
            raise CheckpointWriteFailed(_write_failure(folder, step, e, _bytes(state))) from e
        raise
    try:
        write_json_atomic(folder / LATEST, {"step": step, "file": path.name, "why": why})
    except OSError as e:  # the step file stands: latest_checkpoint finds it without the pointer
        raise CheckpointWriteFailed(_write_failure(folder, step, e)) from e
    for old in _step_files(folder)[:-keep]:
        if old != path:
            old.unlink(missing_ok=True)
    return path


def _bytes(state) -> int:
    """The bytes of the tensors in a (nested) checkpoint state: about the file's size."""
    if isinstance(state, torch.Tensor):
        return state.numel() * state.element_size()
    if isinstance(state, dict):
        return sum(_bytes(v) for v in state.values())
    if isinstance(state, (list, tuple)):
        return sum(_bytes(v) for v in state)
    return 0


def _write_failure(folder: Path, step: int, e: Exception, need: int = 0) -> str:
    """A failed checkpoint write in words. torch says a full disk in its own words
    ("file write failed", "unexpected pos"), so a disk with less room than the checkpoint
    needs counts as full too (labkit.run.log.disk_full)."""
    full, free = disk_full(e, folder, need)
    if full:
        return (f"could not write the checkpoint of step {step} to {folder}: the disk is full "
                f"({free}, the checkpoint needs {need / 2**20:,.0f} MB); free some space, or "
                f"pass --save-interval -1 for no checkpoints")
    return (f"could not write the checkpoint of step {step} to {folder} "
            f"({e.__class__.__name__}: {str(e).splitlines()[0] if str(e) else ''}; {free})")


def _step_files(folder: Path) -> list[Path]:
    """The complete checkpoint files (step-N.pt), oldest first."""
    files = [p for p in folder.glob("step-*.pt") if p.stem.split("-", 1)[1].isdigit()]
    return sorted(files, key=lambda p: int(p.stem.split("-", 1)[1]))


def latest_checkpoint(run_dir: Path) -> tuple[int, Path] | None:
    """(step, file) of the newest complete checkpoint, or None when there is none.

    latest.json names it; when that pointer is gone or names a missing file, the newest
    step-N.pt stands in (a step file only appears once it is completely written). A
    checkpoint folder that is not one, or a pointer that cannot be read, is a RunLogError.
    """
    folder = Path(run_dir) / CHECKPOINT
    there = folder_there(folder, "it holds no checkpoint (a resume keeps its checkpoints there)")
    pointer = folder / LATEST
    files = _step_files(folder) if there else []
    if not there or not file_there(pointer):
        if files:
            print(f"labkit: {pointer} is missing; using {files[-1].name}, the newest complete "
                  f"checkpoint", flush=True)
            return int(files[-1].stem.split("-", 1)[1]), files[-1]
        return None
    info = read_json(pointer, "a checkpoint's pointer")
    name, step = info.get("file"), info.get("step")
    if not isinstance(name, str) or not isinstance(step, int) or Path(name).name != name:
        raise RunLogError(f"{pointer} is damaged (no step number and file name of the "
                          f"checkpoint in it); remove it, and the newest step-N.pt is used")
    path = folder / name
    if not file_there(path):
        if files:
            print(f"labkit: {pointer} names {path.name}, which is missing; using "
                  f"{files[-1].name}", flush=True)
            return int(files[-1].stem.split("-", 1)[1]), files[-1]
        raise RunLogError(f"{pointer} names {path.name}, which is missing")
    return step, path


def remove_auto_checkpoints(run_dir: Path) -> int:
    """Remove the checkpoint the default policy wrote (a completed run keeps none); return
    the bytes freed. A checkpoint the user asked for (--save-interval K) stays."""
    folder = Path(run_dir) / CHECKPOINT
    pointer = folder / LATEST
    try:
        why = json.loads(pointer.read_text()).get("why")
    except (OSError, ValueError, AttributeError):
        return 0
    if why not in AUTO:
        return 0
    freed = 0
    for path in _step_files(folder):
        freed += path.stat().st_size
        path.unlink(missing_ok=True)
    pointer.unlink(missing_ok=True)
    try:
        folder.rmdir()
    except OSError:  # something else lives there; leave it
        pass
    return freed


def sweep_temp_files(run_dir: Path) -> tuple[int, int]:
    """Remove the temporary files a killed run left in its folder and checkpoint folder
    (`.step-N.pt.tmpPID`, `.status.json.*.tmp`, ...); return (files, bytes).

    Call it holding the run folder's lock: then no other writer can own them.
    """
    count = size = 0
    for folder in (Path(run_dir), Path(run_dir) / CHECKPOINT):
        if not folder.is_dir():
            continue
        for path in folder.iterdir():
            if path.name.startswith(".") and ".tmp" in path.name and path.is_file():
                size += path.stat().st_size
                path.unlink(missing_ok=True)
                count += 1
    return count, size


def load_checkpoint(path: Path, model, optimizer) -> int:
    """Load a checkpoint into `model` and `optimizer`; return its step. A file that is not a
    checkpoint of this run's model is a RunLogError naming it."""
    if not file_there(path):
        raise RunLogError(f"{path}: the checkpoint is not there; resume again, or start a new run")
    try:
        state = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as e:  # a truncated or foreign file
        raise RunLogError(f"{path}: not a readable checkpoint ({e.__class__.__name__}: "
                          f"{str(e).splitlines()[0] if str(e) else ''})") from e
    missing = [k for k in ("step", "model", "optimizer", "torch_rng")
               if not isinstance(state, dict) or k not in state]
    if missing:
        raise RunLogError(f"{path}: not a labkit checkpoint (it holds no {missing[0]!r}); "
                          f"move it away and resume from the one before, or start a new run")
    try:
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        torch.set_rng_state(state["torch_rng"])
    except (RuntimeError, ValueError, KeyError, TypeError) as e:
        raise RunLogError(f"{path}: not a checkpoint of this run's model "
                          f"({e.__class__.__name__}: {str(e).splitlines()[0]})") from e
    return int(state["step"])
