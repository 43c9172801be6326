"""A run says when it is ready to step: its data, model and engine loaded.

Why: `labkit sweep --stagger-starts` starts the run that sets the sweep's pace alone and the
others once it is ready. Started together, the three runs of lesson 1.3's sweep each
compiled vLLM's graphs at the same time and took 92-94 s for vLLM's `LLM`, where one run
alone took 57 s (H100, BENCHMARKS.md); a run that starts once another is up takes vLLM's
compiled graphs from its cache (4-5 s instead of 17-24 s of compilation in the study on an
H200). The sweep names a file in the run's environment (ENV) and watches for it; the run
writes it after its set-up (labkit.lifecycle.start_run). Without ENV nothing is written.
"""

from __future__ import annotations

import os
from pathlib import Path

ENV = "LABKIT_READY_FILE"  # the file a sweep's run writes once it is ready to step


def marker(output_dir: str | Path, run_name: str) -> Path:
    """Where the sweep asks run `run_name` to say it is ready."""
    return Path(output_dir) / ".ready" / run_name


def say() -> None:
    """Write the file the sweep named (ENV), if it named one. Best effort: a file that cannot
    be written only starts the sweep's other runs when this one ends."""
    path = os.environ.get(ENV)
    if not path:
        return
    try:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(f"{os.getpid()}\n")
    except OSError:
        pass


def is_ready(path: Path) -> bool:
    return path.exists()
