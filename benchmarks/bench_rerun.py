"""A rerun in one process, as a notebook cell does it: the recipe, then another group size.

Why: a lesson reruns one cell with another --n-samples-per-prompt. The first launch starts
everything (model, vLLM: load, compile, CUDA graphs); the second, with the same model and
engine settings, takes back what the first left up (labkit.engines.keep). This measures,
for both, the seconds from `labkit.launch` to the start of the first step, and where the
first launch's start-up went (perf/startup_* of its first step). The first run is a full
recipe run (its steps are the synchronous row of BENCHMARKS.md); the rerun is short.

    python benchmarks/bench_rerun.py --model M.gguf --data gsm8k-folder --out runs \\
        --result rerun.json -- --rollout-batch-size 32 --n-samples-per-prompt 8 ...

Flags after `--` are the first run's (labkit launch flags); the rerun changes the group
size to --rerun-answers and the run length to --rerun-steps.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def timed_launch(cfg) -> dict:
    """Run `cfg`; return the seconds to its first step and its first step's start-up metrics."""
    import labkit

    t0 = time.time()
    run = labkit.launch(cfg)
    first = run.metrics.iloc[0]
    return {"run": str(run.dir), "status": run.status["reason"], "steps": len(run.metrics),
            "seconds_to_first_step": float(first["time/start"] - t0),
            "wall_seconds": time.time() - t0,
            "startup": {k: float(first[k]) for k in first.index if k.startswith("perf/startup_")}}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", required=True)
    p.add_argument("--data", required=True)
    p.add_argument("--out", required=True, help="folder for the two run folders")
    p.add_argument("--result", required=True, help="JSON file for the timings")
    p.add_argument("--rerun-answers", type=int, default=4)
    p.add_argument("--rerun-steps", type=int, default=3)
    p.add_argument("flags", nargs=argparse.REMAINDER, help="-- then the first run's flags")
    a = p.parse_args()
    from labkit.config import config_from_args

    flags = [f for f in a.flags if f != "--"]
    cfg = config_from_args([*flags, "--model", a.model, "--data", a.data, "--output-dir", a.out,
                            "--run-name", "first"], env={})
    result = {"command": " ".join(sys.argv), "first": timed_launch(cfg)}
    rerun = cfg.replace(run_name="rerun", n_samples_per_prompt=a.rerun_answers,
                        global_batch_size=cfg.rollout_batch_size * a.rerun_answers,
                        num_rollout=a.rerun_steps)  # same held-out set: its start is reused
    result["rerun"] = timed_launch(rerun)
    Path(a.result).write_text(json.dumps(result, indent=2))
    for name in ("first", "rerun"):
        r = result[name]
        print(f"{name}: first step {r['seconds_to_first_step']:.1f} s after launch; "
              f"{r['steps']} steps, {r['status']}; start-up {r['startup']}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
