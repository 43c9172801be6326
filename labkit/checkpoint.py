"""Checkpoints: the policy and optimizer after a finished step, written so none is half there.

A checkpoint is one file, `checkpoint/step-<N>.pt`, written to a temporary name and
renamed; `checkpoint/latest.json` (also renamed into place) names the newest. A crash
while saving leaves the previous checkpoint and pointer intact. Everything else a run
needs to continue (data order, sampling seeds) is derived from the config's seed and the
step number, so the checkpoint holds no RNG streams to get out of step.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from labkit.runlog import CHECKPOINT, RunLogError, write_json_atomic

LATEST = "latest.json"


def save_checkpoint(run_dir: Path, step: int, model, optimizer, *, keep: int = 1) -> Path:
    """Save the state after `step`; keep the newest `keep` checkpoints. Returns the file."""
    folder = Path(run_dir) / CHECKPOINT
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"step-{step}.pt"
    tmp = folder / f".step-{step}.pt.tmp{os.getpid()}"
    state = {
        "step": step,
        "model": {k: v.detach().cpu() for k, v in model.state_dict().items()},
        "optimizer": optimizer.state_dict(),
        "torch_rng": torch.get_rng_state(),
    }
    try:
        torch.save(state, tmp)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    write_json_atomic(folder / LATEST, {"step": step, "file": path.name})
    for old in sorted(folder.glob("step-*.pt"), key=lambda p: int(p.stem.split("-")[1]))[:-keep]:
        if old != path:
            old.unlink(missing_ok=True)
    return path


def latest_checkpoint(run_dir: Path) -> tuple[int, Path] | None:
    """(step, file) of the newest complete checkpoint, or None when there is none."""
    folder = Path(run_dir) / CHECKPOINT
    pointer = folder / LATEST
    if not pointer.exists():
        return None
    try:
        info = json.loads(pointer.read_text())
        path = folder / info["file"]
    except (json.JSONDecodeError, KeyError) as e:
        raise RunLogError(f"{pointer} is unreadable ({e}); the checkpoint cannot be trusted") from e
    if not path.exists():
        raise RunLogError(f"{pointer} names {path.name}, which is missing")
    return int(info["step"]), path


def load_checkpoint(path: Path, model, optimizer) -> int:
    """Load a checkpoint into `model` and `optimizer`; return its step."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as e:  # a truncated or foreign file
        raise RunLogError(f"{path}: not a readable checkpoint ({e.__class__.__name__}: {e})") from e
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    torch.set_rng_state(state["torch_rng"])
    return int(state["step"])
