"""Run a plan of labkit runs on the GPUs of one lent machine, a queue of them per GPU.

Made for a lent H200 machine: its calls last at most 10 minutes, but a process started in
a new session lives on until the machine is given back. So `start` launches a scheduler in
its own session and returns; the scheduler keeps --per-gpu runs on each GPU, starting the
next run of the plan as one ends; each later call runs `collect`, which waits (up to
--wait seconds, or until the plan is done) and copies every run's light files (config,
metrics, samples, heat, status, stdout) into one tarball under --out. `collect --stop`
ends the runs that are still going: each stops after its step, its log complete.

    python scripts/gpu/grid.py start --plan group-size --model M.gguf --data gsm8k-folder \
        --runs-dir $HOME/runs --per-gpu 2 --gpu-delay 1=150
    python scripts/gpu/grid.py collect --runs-dir $HOME/runs --out $OUT --wait 540
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

# The recipe with 24 rollouts and max response 1024; checkpoints off (the machine is lent).
COMMON = ["--rollout-batch-size", "32", "--num-rollout", "24", "--rollout-max-response-len", "1024",
          "--rm-type", "math", "--use-dynamic-batch-size", "--max-tokens-per-gpu", "8192",
          "--save-interval", "-1", "--engine", "vllm", "--no-progress",
          # two runs share each GPU: a fixed KV cache and no sleep, or vLLM's memory checks
          # trip over the other run's allocations (seen: 5 of 10 runs failed without)
          "--rollout-kv-cache-gb", "8", "--no-rollout-sleep"]


def _n(n: int, seed: int, lr: str = "1e-6", prompts: int = 32) -> list[str]:
    return ["--rollout-batch-size", str(prompts), "--n-samples-per-prompt", str(n),
            "--global-batch-size", str(prompts * n), "--lr", lr, "--seed", str(seed)]


# name -> flags, in priority order. The longest runs go first so the queue ends evenly.
PLANS = {
    "group-size": {  # 4, 8, 16 answers x 3 seeds at lr 1e-6, then the prompt sweep
        "n16-lr1e-6-s1": _n(16, 1), "n16-lr1e-6-s2": _n(16, 2), "n16-lr1e-6-s3": _n(16, 3),
        "n8-lr1e-6-s2": _n(8, 2), "n8-lr1e-6-s3": _n(8, 3),
        "n4-lr1e-6-s1": _n(4, 1), "n4-lr1e-6-s2": _n(4, 2), "n4-lr1e-6-s3": _n(4, 3),
        "p64-n8-lr1e-6-s1": _n(8, 1, prompts=64), "p16-n8-lr1e-6-s1": _n(8, 1, prompts=16),
    },
}
LIGHT = ["config.json", "metrics.jsonl", "samples.jsonl", "heat.jsonl", "status.json"]
STAGGER_S = 25  # vLLM measures free memory at start: let the last engine on a GPU settle


def say(msg: str, t0: float) -> None:
    print(f"[{time.time() - t0:7.1f}s] {msg}", flush=True)


def run_finished(run_dir: Path) -> bool:
    status = run_dir / "status.json"
    return status.exists() and json.loads(status.read_text()).get("reason") == "completed"


def schedule(a: argparse.Namespace) -> int:
    """Keep --per-gpu runs on each GPU until the plan is done; one log line per event."""
    t0, runs_dir = time.time(), Path(a.runs_dir)
    from labkit.models import resolve_model

    model = resolve_model(a.model)  # dequantize once, before the runs start together
    todo = [(n, f) for n, f in PLANS[a.plan].items() if not run_finished(runs_dir / n)]
    delay = {g: float(s) for g, s in (d.split("=") for d in a.gpu_delay)}
    running: dict[str, list] = {g: [] for g in a.gpus.split(",")}
    last_start = {g: -1e9 for g in running}
    while todo or any(running.values()):
        for gpu, procs in running.items():
            for name, proc in list(procs):
                if proc.poll() is not None:
                    procs.remove((name, proc))
                    say(f"gpu {gpu}: {name} exit {proc.returncode}", t0)
            ready = time.time() - t0 >= delay.get(gpu, 0) and time.time() - last_start[gpu] >= STAGGER_S
            if todo and ready and len(procs) < a.per_gpu:
                name, flags = todo.pop(0)
                run_dir = runs_dir / name
                if run_dir.exists():  # an earlier try that did not finish: keep it aside
                    shutil.move(str(run_dir), f"{run_dir}.failed{int(time.time())}")
                cmd = [sys.executable, "-m", "labkit", "launch", *COMMON, *flags, "--model", model,
                       "--data", a.data, "--rollout-gpu-memory-fraction", a.memory_fraction,
                       "--output-dir", str(runs_dir), "--run-name", name]
                log = open(runs_dir / f"{name}.stdout", "a")
                env = {**os.environ, "CUDA_VISIBLE_DEVICES": gpu}
                procs.append((name, subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)))
                last_start[gpu] = time.time()
                say(f"gpu {gpu}: {name} start ({len(todo)} left)", t0)
        time.sleep(2)
    say("plan done", t0)
    return 0


def start(a: argparse.Namespace) -> int:
    """Launch the scheduler in a session of its own (it outlives this call) and return."""
    runs_dir = Path(a.runs_dir)
    runs_dir.mkdir(parents=True, exist_ok=True)
    args = [sys.executable, __file__, "schedule", "--plan", a.plan, "--model", a.model, "--data", a.data,
            "--runs-dir", a.runs_dir, "--per-gpu", str(a.per_gpu), "--gpus", a.gpus,
            "--memory-fraction", a.memory_fraction, *[x for d in a.gpu_delay for x in ("--gpu-delay", d)]]
    log = open(runs_dir / "scheduler.log", "a")
    # cwd: the source tree this file is in, so `-m labkit` runs that copy of labkit
    proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                            cwd=Path(__file__).resolve().parents[1])
    (runs_dir / "scheduler.pid").write_text(str(proc.pid))
    print(f"scheduler started, pid {proc.pid}, log {runs_dir / 'scheduler.log'}")
    return 0


def _alive(pid: int, *, group: bool = False) -> bool:
    """Whether process `pid` (or any process of its group) still runs."""
    try:
        (os.killpg if group else os.kill)(pid, 0)
    except OSError:
        return False
    return True


def collect(a: argparse.Namespace) -> int:
    """Wait for the plan (at most --wait s), optionally stop it, then tar the light files."""
    runs_dir, out = Path(a.runs_dir), Path(a.out)
    runs_dir.mkdir(parents=True, exist_ok=True)
    pid_file = runs_dir / "scheduler.pid"
    pid = int(pid_file.read_text()) if pid_file.exists() else None
    end = time.time() + a.wait
    while pid and _alive(pid) and time.time() < end:
        time.sleep(5)
    if a.stop and pid and _alive(pid, group=True):
        os.killpg(pid, signal.SIGTERM)  # each run stops after its step (labkit.stopping)
        deadline = time.time() + a.stop_wait
        while _alive(pid, group=True) and time.time() < deadline:
            time.sleep(2)
    stage = out / "runs"
    for run in sorted(p for p in runs_dir.iterdir() if p.is_dir()):
        dest = stage / run.name
        dest.mkdir(parents=True, exist_ok=True)
        for f in LIGHT:
            if (run / f).exists():
                shutil.copy(run / f, dest / f)
        if (runs_dir / f"{run.name}.stdout").exists():
            shutil.copy(runs_dir / f"{run.name}.stdout", dest / "stdout.log")
        steps = len((run / "metrics.jsonl").read_text().splitlines()) if (run / "metrics.jsonl").exists() else 0
        print(f"{run.name}: {'done' if run_finished(run) else 'not done'}, {steps} steps", flush=True)
    stage.mkdir(parents=True, exist_ok=True)
    if (runs_dir / "scheduler.log").exists():
        shutil.copy(runs_dir / "scheduler.log", stage / "scheduler.log")
    shutil.make_archive(str(out / "runs"), "gztar", root_dir=out, base_dir="runs")
    shutil.rmtree(stage)
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    for name in ("start", "schedule"):
        s = sub.add_parser(name)
        s.add_argument("--plan", default="group-size", choices=sorted(PLANS))
        s.add_argument("--model", required=True)
        s.add_argument("--data", required=True)
        s.add_argument("--runs-dir", required=True)
        s.add_argument("--per-gpu", type=int, default=2)
        s.add_argument("--gpus", default="0", help="comma list of GPU indices")
        s.add_argument("--memory-fraction", default="0.12", help="--rollout-gpu-memory-fraction of each run")
        s.add_argument("--gpu-delay", action="append", default=[], metavar="GPU=SECONDS",
                       help="start nothing on GPU before SECONDS (it is busy with a benchmark)")
    c = sub.add_parser("collect")
    c.add_argument("--runs-dir", required=True)
    c.add_argument("--out", required=True)
    c.add_argument("--wait", type=float, default=0, help="seconds to wait for the plan first")
    c.add_argument("--stop", action="store_true", help="then stop the runs still going")
    c.add_argument("--stop-wait", type=float, default=60, help="seconds the runs get to finish their step")
    a = p.parse_args()
    return {"start": start, "schedule": schedule, "collect": collect}[a.cmd](a)


if __name__ == "__main__":
    raise SystemExit(main())
