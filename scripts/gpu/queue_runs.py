"""One queue of labkit runs in one Python process: it claims the next run of a plan, runs it,
and claims the next, until the plan is done.

One process for many runs, so each run after the first takes back the policy, the vLLM
engine and the starting model's held-out accuracy that the previous run left up
(labkit.engines.keep): about a minute saved per run on an H200. Several queues share a
plan through claim files (`<runs-dir>/.claims/<run>`, created exclusively), so two GPUs
with two queues each work through one list. A run already completed in --runs-dir or in
the repository's data/runs/ is skipped: a later session runs only what is missing. A file
`<runs-dir>/.stop` (session.sh stop writes it) ends every queue after its current run.
`--share N`: N queues share this GPU, so each run is set as `labkit sweep` sets one of N runs
on a GPU (labkit.machine.placement.shared_gpu: a fixed KV cache, no sleep mode, gradient
checkpointing at twice the default token budget, and with it liger-kernel's layers where
they import).

    CUDA_VISIBLE_DEVICES=1 python scripts/gpu/queue_runs.py --plan held-out --model M.gguf \\
        --data gsm8k-folder --runs-dir $HOME/runs --name gpu1-a
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import sys
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parents[1]), str(HERE)]  # this checkout's labkit, and plans.py

from plans import COMMON, PLANS  # noqa: E402

DONE_ELSEWHERE = HERE.parents[1] / "data" / "runs"


def completed(run_dir: Path) -> bool:
    status = run_dir / "status.json"
    try:
        return json.loads(status.read_text()).get("reason") == "completed"
    except (OSError, ValueError):
        return False


def claim(runs_dir: Path, name: str) -> bool:
    """Take `name` for this queue; False when another queue took it first."""
    claims = runs_dir / ".claims"
    claims.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(claims / name, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return False
    os.write(fd, f"{os.getpid()}\n".encode())
    os.close(fd)
    return True


def say(name: str, message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {name}: {message}", flush=True)


def model_shape(model: str):
    """The model's shape, which a shared GPU's settings are sized by."""
    from labkit.machine.memory import ModelShape
    from labkit.models import resolve_model

    return ModelShape.of(resolve_model(model))


def run_queue(a: argparse.Namespace) -> int:
    import labkit
    from labkit.config import config_from_args
    from labkit.machine.placement import shared_gpu

    runs_dir = Path(a.runs_dir)
    shape = model_shape(a.model) if a.share > 1 else None
    for name, flags in PLANS[a.plan].items():
        if (runs_dir / ".stop").exists():
            say(a.name, "asked to stop: claiming no more runs")
            break
        if completed(runs_dir / name) or completed(DONE_ELSEWHERE / name):
            continue
        if not claim(runs_dir, name):
            continue
        if (runs_dir / name).exists():  # an earlier try that did not finish: keep it aside
            shutil.move(str(runs_dir / name), f"{runs_dir / name}.failed{int(time.time())}")
        own = [*flags, *shlex.split(a.extra)]
        argv = [*COMMON, *own, "--model", a.model, "--data", a.data,
                "--output-dir", str(runs_dir), "--run-name", name]
        say(a.name, f"{name} start: {' '.join(own)}")
        start = time.time()
        try:
            cfg = config_from_args(argv, env={})
            if shape is not None:
                cfg = shared_gpu(cfg, shape, a.share, None)
                say(a.name, f"{name} shares the GPU with {a.share - 1} more: checkpointing "
                    f"{cfg.gradient_checkpointing}, {cfg.max_tokens_per_gpu:,} tokens a micro-batch, "
                    f"KV cache {cfg.rollout_kv_cache_gb:g} GiB, vLLM fraction {cfg.rollout_gpu_memory_fraction:g}")
            run = labkit.launch(cfg)
            say(a.name, f"{name} {run.status['reason']} in {time.time() - start:.0f} s")
        except Exception:  # one failed run must not stop the queue
            say(a.name, f"{name} failed after {time.time() - start:.0f} s:\n{traceback.format_exc()}")
    say(a.name, "queue done")
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--plan", default="held-out", choices=sorted(PLANS))
    p.add_argument("--model", required=True)
    p.add_argument("--data", required=True)
    p.add_argument("--runs-dir", required=True)
    p.add_argument("--name", default="queue", help="this queue's name in the log")
    p.add_argument("--extra", default="", help="flags after each run's own, for how the machine "
                   "is shared (e.g. four runs to a GPU: --gradient-checkpointing --max-tokens-per-gpu "
                   "24576); they change memory and speed, not the run's algorithm")
    p.add_argument("--share", type=int, default=0, help="queues on this GPU: each run set as one "
                   "of that many runs sharing a GPU (labkit sweep's own settings; a checkpointing or "
                   "token budget that --extra sets stays)")
    return run_queue(p.parse_args())


if __name__ == "__main__":
    raise SystemExit(main())
