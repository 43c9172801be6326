"""Record a real 503 incident: K vLLM CPU engines behind vllm-router, 512 open requests.

The course's 16-answer run logged 22,357 503 lines with 512 open requests. This script
rebuilds that load on one small machine: 32 made-up prompts x 16 answers = 512 requests
open at once, sent by labkit's retrying client through vllm-router to K vLLM engines,
for a few steps. The router runs with SHED_LOAD_ROUTER_ARGS (labkit/serve.py): an answer
slower than 60 s fails and counts against its engine's circuit breaker, and while every
engine's circuit is open the router answers 503 "No available workers".

Writes, under --out (default data/incidents/):
    <name>.jsonl          the client log (every failed attempt, completion, step boundary)
    <name>.expected.json  the burst table that replaying the log must give (tests check it)
    <name>-timeline.png/.svg
Run:
    python benchmarks/record_incident.py --name vllm-cpu-2x-512open --engines 2 --steps 2
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import platform
import random
import shlex
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from labkit.engines.base import Sampling  # noqa: E402
from labkit.engines.completions import build_requests  # noqa: E402
from labkit.serving.client import EventLog, RetryPolicy, RolloutClient, RolloutFailed, run_sync  # noqa: E402
from labkit.serving.cluster import SHED_LOAD_ROUTER_ARGS, Cluster, ServeConfig, vllm_python  # noqa: E402
from labkit.serving.processes import find_free_base_port  # noqa: E402
from labkit.serving.replay import replay, timeline  # noqa: E402

NAMES = ["Ada", "Bo", "Cai", "Dee", "Eli", "Fay", "Gus", "Hana"]
ITEMS = ["pencils", "stamps", "marbles", "cookies", "shells", "cards"]


def made_up_problems(n: int, seed: int = 0) -> list[str]:
    """n small arithmetic word problems invented here (no dataset text)."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        who, what = rng.choice(NAMES), rng.choice(ITEMS)
        a, b, c = rng.randrange(3, 40), rng.randrange(2, 9), rng.randrange(1, 20)
        out.append(f"{who} has {a} {what}. {who} buys {b} boxes with {c} {what} in each box. "
                   f"How many {what} does {who} have now?")
    return out


def prompt_ids(model_dir: str, n: int) -> list[list[int]]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    ids = []
    for q in made_up_problems(n):
        msgs = [{"role": "user", "content": q + " Think step by step, then give the number."}]
        ids.append(list(tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True,
                                                return_dict=False)))
    return ids


def machine() -> str:
    cpu = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    load = os.getloadavg()[0]
    return (f"{os.cpu_count()}-core CPU box, no GPU ({cpu}, {mem:.0f} GiB RAM, {platform.system()}); "
            f"shared with other jobs, load average {load:.1f} at start")


def versions(vpython: str) -> dict:
    code = "import importlib.metadata as m, torch; print(m.version('vllm-cpu'), torch.__version__)"
    try:
        vllm_v, torch_v = subprocess.run([vpython, "-c", code], capture_output=True, text=True,
                                         timeout=120).stdout.split()
    except ValueError:
        vllm_v, torch_v = "?", "?"
    return {"vllm-cpu": vllm_v, "torch (engines)": torch_v,
            "vllm-router": importlib.metadata.version("vllm-router"),
            "aiohttp": importlib.metadata.version("aiohttp"), "python": platform.python_version()}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--name", default="vllm-cpu-2x-512open")
    p.add_argument("--engines", type=int, default=2)
    p.add_argument("--prompts", type=int, default=32)
    p.add_argument("--answers", type=int, default=16)
    p.add_argument("--max-open", type=int, default=None,
                   help="open-request limit (default: prompts x answers, all at once)")
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--max-tokens", type=int, default=4)
    p.add_argument("--max-num-seqs", type=int, default=16)
    p.add_argument("--max-model-len", type=int, default=512)
    p.add_argument("--deadline-s", type=float, default=1200.0,
                   help="per-request retry deadline; long, so the run goes on as the course's did")
    p.add_argument("--engine-args", default="--enforce-eager",
                   help="extra vLLM flags, one shell-quoted string (eager: starts in a minute, "
                        "no compile on the first request, about as fast on 2 busy cores)")
    p.add_argument("--burst-gap", type=float, default=5.0)
    p.add_argument("--stall-s", type=float, default=60.0)
    p.add_argument("--out", default=str(REPO / "data" / "incidents"))
    p.add_argument("--summarize", default=None, metavar="LOG",
                   help="only replay LOG (a recording cut short) and write its expected summary")
    a = p.parse_args(argv)
    if a.summarize:
        summarize(Path(a.summarize), a.burst_gap, a.stall_s)
        return 0

    max_open = a.max_open or a.prompts * a.answers
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    log_path = out / f"{a.name}.jsonl"
    if log_path.exists():
        log_path.unlink()
    cfg = ServeConfig(engines=a.engines, backend="vllm", port=find_free_base_port(a.engines + 2),
                      router_args=SHED_LOAD_ROUTER_ARGS, max_num_seqs=a.max_num_seqs,
                      max_model_len=a.max_model_len, engine_args=tuple(shlex.split(a.engine_args)),
                      log_dir=str(REPO / "out" / "incident-serve"))
    command = "python benchmarks/record_incident.py " + " ".join(shlex.quote(x) for x in (argv or sys.argv[1:]))
    meta = {"machine": machine(), "command": command, "versions": versions(vllm_python(cfg)),
            "serve": {"engines": cfg.engines, "max_num_seqs": cfg.max_num_seqs,
                      "max_model_len": cfg.max_model_len, "router_args": list(cfg.router_args),
                      "engine_args": list(cfg.engine_args), "kv_cache_gib": cfg.kv_cache_gib},
            "rollout": {"prompts": a.prompts, "answers": a.answers, "max_tokens": a.max_tokens,
                        "max_open_requests": max_open, "deadline_s": a.deadline_s},
            "constructed": False}
    print(json.dumps(meta, indent=2), flush=True)

    t_start = time.time()
    with Cluster(cfg) as cluster:
        print(f"cluster up in {time.time() - t_start:.0f} s at {cluster.url}", flush=True)
        from labkit.models import resolve_model

        prompts = prompt_ids(resolve_model(cfg.model), a.prompts)
        log = EventLog(log_path)
        log.emit("meta", **meta)
        client = RolloutClient(cluster.url, max_open_requests=max_open,
                               retry=RetryPolicy(deadline_s=a.deadline_s), log=log)
        for step in range(a.steps):
            # No per-request seed: vllm-cpu 0.32 kills its engine core on seeded requests.
            sampling = Sampling(n=a.answers, temperature=1.0, max_tokens=a.max_tokens)
            requests = build_requests(prompts, sampling, cfg.served_model_name, step)
            t0 = time.time()
            try:
                run_sync(client.run(requests, step=step))
            except RolloutFailed as e:
                print(f"step {step}: {e}", flush=True)
                log.emit("step_end", step=step, failed=str(e)[:200])
                break
            print(f"step {step}: {len(requests)} requests in {time.time() - t0:.1f} s", flush=True)
        log.close()

    summarize(log_path, a.burst_gap, a.stall_s)
    return 0


def summarize(log_path: Path, burst_gap: float, stall_s: float) -> None:
    """Replay a recorded log; write <name>.expected.json (the tests' answer) and the timeline."""
    result = replay(log_path, burst_gap=burst_gap, stall_s=stall_s)
    print(result.report())
    expected = {"burst_gap": burst_gap, "stall_s": stall_s, "lines_503": result.summary["lines_503"],
                "bad_lines": result.summary["bad_lines"], "bursts": result.bursts.to_dict(orient="records")}
    log_path.with_suffix(".expected.json").write_text(json.dumps(expected, indent=1) + "\n")
    timeline(result, log_path.parent, name=f"{log_path.stem}-timeline")
    print(f"wrote {log_path} ({log_path.stat().st_size / 1e6:.2f} MB), expected summary and timeline")


if __name__ == "__main__":
    sys.exit(main())
