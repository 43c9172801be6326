"""Run a list of labkit runs on the GPUs of one machine, several per GPU, until a deadline.

Made for a lent H200 whose calls last at most 10 minutes: each run gets --time-limit so it
stops cleanly (log complete, checkpoint written) before the call ends, and the next call
resumes it (`--resume`) from its checkpoint on the machine's disk. After each call the light
files of every run (config, metrics, samples, heat, status, stdout) are copied to --out.

    python benchmarks/h200_grid.py --model M.gguf --data gsm8k-folder --runs-dir $HOME/runs \
        --out $OUT --deadline 540 --per-gpu 3 --plan grid
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

COMMON = ["--rollout-batch-size", "32", "--num-rollout", "24", "--rollout-max-response-len", "1024",
          "--rm-type", "math", "--micro-batch-size", "8"]

# name -> flags; the order is the priority order (issue 8 and issue 10's runs)
PLANS = {
    "grid": {
        "n8-lr1e-5-s1": ["--n-samples-per-prompt", "8", "--global-batch-size", "256", "--lr", "1e-5", "--seed", "1"],
        "n8-lr1e-6-s1": ["--n-samples-per-prompt", "8", "--global-batch-size", "256", "--lr", "1e-6", "--seed", "1"],
        "n4-lr1e-5-s1": ["--n-samples-per-prompt", "4", "--global-batch-size", "128", "--lr", "1e-5", "--seed", "1"],
        "n16-lr1e-5-s1": ["--n-samples-per-prompt", "16", "--global-batch-size", "512", "--lr", "1e-5", "--seed", "1"],
        "n8-lr3e-6-s1": ["--n-samples-per-prompt", "8", "--global-batch-size", "256", "--lr", "3e-6", "--seed", "1"],
        "n8-lr1e-5-s2": ["--n-samples-per-prompt", "8", "--global-batch-size", "256", "--lr", "1e-5", "--seed", "2"],
        "n8-lr1e-5-s3": ["--n-samples-per-prompt", "8", "--global-batch-size", "256", "--lr", "1e-5", "--seed", "3"],
        "n4-lr1e-5-s2": ["--n-samples-per-prompt", "4", "--global-batch-size", "128", "--lr", "1e-5", "--seed", "2"],
        "n16-lr1e-5-s2": ["--n-samples-per-prompt", "16", "--global-batch-size", "512", "--lr", "1e-5", "--seed", "2"],
        "n4-lr1e-5-s3": ["--n-samples-per-prompt", "4", "--global-batch-size", "128", "--lr", "1e-5", "--seed", "3"],
        "n16-lr1e-5-s3": ["--n-samples-per-prompt", "16", "--global-batch-size", "512", "--lr", "1e-5", "--seed", "3"],
        "p16-n8-lr1e-5-s1": ["--rollout-batch-size", "16", "--n-samples-per-prompt", "8", "--global-batch-size", "128", "--lr", "1e-5", "--seed", "1"],
        "p64-n8-lr1e-5-s1": ["--rollout-batch-size", "64", "--n-samples-per-prompt", "8", "--global-batch-size", "512", "--lr", "1e-5", "--seed", "1"],
    },
}
LIGHT = ["config.json", "metrics.jsonl", "samples.jsonl", "heat.jsonl", "status.json", "stdout.log"]


def run_state(run_dir: Path) -> str:
    """new, done, or partial (has a checkpoint to resume from)."""
    status = run_dir / "status.json"
    if status.exists() and json.loads(status.read_text()).get("reason") == "completed":
        return "done"
    if (run_dir / "checkpoint" / "latest.json").exists():
        return "partial"
    return "new"


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--data", required=True)
    p.add_argument("--runs-dir", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--deadline", type=float, default=540, help="seconds from now to stop every run")
    p.add_argument("--per-gpu", type=int, default=3)
    p.add_argument("--gpus", default=None, help="comma list of GPU indices (default: all)")
    p.add_argument("--plan", default="grid")
    p.add_argument("--memory-fraction", default="0.12")
    a = p.parse_args()
    t0 = time.time()
    runs_dir, out = Path(a.runs_dir), Path(a.out)
    runs_dir.mkdir(parents=True, exist_ok=True)
    import torch

    gpus = a.gpus.split(",") if a.gpus else [str(i) for i in range(torch.cuda.device_count())]
    from labkit.models import resolve_model

    model = resolve_model(a.model)  # dequantize once, before the runs start together
    todo = [(n, f) for n, f in PLANS[a.plan].items() if run_state(runs_dir / n) != "done"]
    slots = [g for g in gpus for _ in range(a.per_gpu)]
    procs = []
    for (name, flags), gpu in zip(todo, slots):
        run_dir = runs_dir / name
        left = int(a.deadline - (time.time() - t0))
        if left < 150:
            break
        if run_state(run_dir) == "partial":
            cmd = ["--resume", str(run_dir), "--time-limit", str(left), "--no-progress"]
        else:
            if run_dir.exists():  # started but never checkpointed: start it again, keep the old
                shutil.move(str(run_dir), str(run_dir) + f".failed{int(time.time())}")
            cmd = [*COMMON, *flags, "--model", model, "--data", a.data, "--engine", "vllm",
                   "--rollout-gpu-memory-fraction", a.memory_fraction, "--output-dir", str(runs_dir),
                   "--run-name", name, "--time-limit", str(left), "--no-progress"]
        run_dir.mkdir(parents=True, exist_ok=True)
        log = open(runs_dir / f"{name}.stdout", "a")
        env = {**os.environ, "CUDA_VISIBLE_DEVICES": gpu}
        print(f"[{time.time() - t0:6.1f}s] gpu {gpu}: {name} {'resume' if '--resume' in cmd else 'start'}", flush=True)
        procs.append((name, subprocess.Popen([sys.executable, "-m", "labkit", "launch", *cmd],
                                             stdout=log, stderr=subprocess.STDOUT, env=env)))
        time.sleep(20)  # stagger: vLLM profiles free memory at start
    for name, proc in procs:
        try:
            proc.wait(timeout=max(5, a.deadline + 40 - (time.time() - t0)))
        except subprocess.TimeoutExpired:
            proc.terminate()
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
        print(f"[{time.time() - t0:6.1f}s] {name}: exit {proc.returncode}", flush=True)
    collect(runs_dir, out)
    return 0


def collect(runs_dir: Path, out: Path) -> None:
    """Copy each run's light files into one tarball under out (the call returns 8 files at most)."""
    stage = out / "runs"
    for run in sorted(p for p in runs_dir.iterdir() if p.is_dir()):
        dest = stage / run.name
        dest.mkdir(parents=True, exist_ok=True)
        for f in LIGHT:
            if (run / f).exists():
                shutil.copy(run / f, dest / f)
        stdout = runs_dir / f"{run.name}.stdout"
        if stdout.exists():
            shutil.copy(stdout, dest / "stdout.log")
        if run_state(run) == "done":  # 6 GB of weights and optimizer state each: free the disk
            shutil.rmtree(run / "checkpoint", ignore_errors=True)
        print(run.name, run_state(run), len((run / "metrics.jsonl").read_text().splitlines())
              if (run / "metrics.jsonl").exists() else 0, "steps", flush=True)
    shutil.make_archive(str(out / "runs"), "gztar", root_dir=out, base_dir="runs")
    shutil.rmtree(stage)


if __name__ == "__main__":
    raise SystemExit(main())
