"""NVIDIA MPS for the runs of a sweep that share a GPU: their kernels at once, not in turns.

Why: without MPS a GPU runs one process's kernels at a time. A rollout's decode step is
many small products (a 0.5B model's projections at a few hundred rows fill a small part of
the card), so runs side by side mostly take turns on a card that is idle inside each turn.
MPS, NVIDIA's user-space server (`nvidia-cuda-mps-control -d`; no setting of the card
changes), lets the kernels of the processes that reach it run at once. Measured on one H100
(BENCHMARKS.md): three 32 x 8 recipe runs side by side stepped in 7.82 s with MPS against
9.99 s without (rollout 4.59 against 6.24 s, update 2.86 against 3.33 s), the same sweep
one after the other in one sitting, with a server started around it as this module starts
one.

`server()` starts a server of the sweep's own: its pipe folder is private, so it serves
only the runs given that folder (CUDA_MPS_PIPE_DIRECTORY), and no other program's server
is used or stopped. It quits when the sweep's runs have ended, a stop included.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from labkit.errors import LabkitError

CONTROL = "nvidia-cuda-mps-control"
PIPE_ENV, LOG_ENV = "CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_LOG_DIRECTORY"


class MPSError(LabkitError, RuntimeError):
    """The MPS server could not start."""


def missing() -> str | None:
    """Why this machine cannot start an MPS server (None: it can, as far as can be told
    without starting one)."""
    if shutil.which(CONTROL) is None:
        return f"{CONTROL} is not on PATH (it comes with NVIDIA's driver utilities)"
    return None


@contextmanager
def server() -> Iterator[dict[str, str]]:
    """Start an MPS server of our own; yield the environment a process needs to reach it;
    quit it on the way out. A server that does not start is MPSError, one line."""
    folder = Path(tempfile.mkdtemp(prefix="labkit-mps-"))  # short: the pipe is a socket path
    env = {PIPE_ENV: str(folder / "pipe"), LOG_ENV: str(folder / "log")}
    for path in env.values():
        Path(path).mkdir()
    full = {**os.environ, **env}
    try:
        started = subprocess.run([CONTROL, "-d"], env=full, capture_output=True, text=True,
                                 timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        shutil.rmtree(folder, ignore_errors=True)
        raise MPSError(f"the MPS server did not start ({e})") from e
    if started.returncode != 0:
        shutil.rmtree(folder, ignore_errors=True)
        said = (started.stderr or started.stdout).strip().splitlines()
        raise MPSError(f"the MPS server did not start ({CONTROL} -d: exit {started.returncode}"
                       + (f": {said[-1]}" if said else "") + ")")
    try:
        yield env
    finally:
        _quit(full, folder)


def _quit(env: dict, folder: Path) -> None:
    try:
        done = subprocess.run([CONTROL], input="quit\n", env=env, capture_output=True, text=True,
                              timeout=60)
        failed = f"exit {done.returncode}" if done.returncode != 0 else None
    except (OSError, subprocess.TimeoutExpired) as e:
        failed = str(e)
    if failed:  # its folder stays: the server may still need it, and its log says why
        print(f"labkit: the MPS server did not quit ({failed}); its log: {folder / 'log'}",
              file=sys.stderr, flush=True)
    else:
        shutil.rmtree(folder, ignore_errors=True)
