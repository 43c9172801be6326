"""What a rollout over HTTP costs the trainer's process: one request per answer or per prompt,
answers read by json or orjson, against labkit's fake engine (no generation time).

Why: through vllm-router a 32 x 8 rollout took 1.50x the colocated engine's time on an H200.
Part of that is the engines' (their HTTP servers, the router), part the trainer's own
client: it opens a request per answer, reads each answer's JSON (token ids and log-probs of
up to 1024 tokens) and checks it. The fake engine answers at once (`--delay-s 0`, a slot
for every request) with --max-tokens made-up tokens, so what is left is the client and the
HTTP between: the rollout's wall time and the trainer process's CPU time, per variant:

* `per_answer/json`, `per_answer/orjson`: one request per answer (labkit's default: what a
  router spreads over its engines, and what the 503 study opens 512 of), answers read by
  json or by orjson (labkit.serving.client uses orjson where installed);
* `per_prompt/orjson`: one request per prompt asking for its n answers (OpenAI `n`,
  HttpEngine(per_prompt=True)).

Each variant: one warm-up rollout, then --repeats, taking turns; medians. The fake engine is
a process of its own (`labkit fake-engine`), so its CPU is not the client's.

    python benchmarks/bench_http_client.py --prompts 32 --answers 8 --max-tokens 1024
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from labkit.engines.base import Sampling  # noqa: E402
from labkit.engines.http import HttpEngine  # noqa: E402
from labkit.serving import client  # noqa: E402
from labkit.serving.processes import find_free_base_port  # noqa: E402

VARIANTS = {"per_answer/json": (False, json.loads), "per_answer/orjson": (False, None),
            "per_prompt/orjson": (True, None)}


def start_fake_engine(vocab: int, deadline_s: float = 120.0) -> tuple[subprocess.Popen, str]:
    """`labkit fake-engine` answering at once, with a slot for every request; (process, URL)."""
    port = find_free_base_port(1)
    proc = subprocess.Popen([sys.executable, "-m", "labkit", "fake-engine", "--port", str(port),
                             "--delay-s", "0", "--slots", "100000", "--vocab-size", str(vocab)],
                            cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url, end = f"http://127.0.0.1:{port}", time.monotonic() + deadline_s
    while True:
        try:
            urllib.request.urlopen(url + "/health", timeout=2).read()
            return proc, url
        except OSError:
            if proc.poll() is not None or time.monotonic() > end:
                proc.kill()
                raise SystemExit(f"bench_http_client: the fake engine did not come up at {url}") from None
            time.sleep(0.2)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--prompts", type=int, default=32)
    p.add_argument("--answers", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=1024)
    p.add_argument("--prompt-len", type=int, default=150, help="prompt tokens (GSM8K's are ~110-260)")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--out", default=None, help="append the row here (JSON lines)")
    a = p.parse_args(argv)
    vocab = 151_936
    proc, url = start_fake_engine(vocab)
    orjson_loads = client._fast_loads
    prompts = [[1 + (i * 131 + j) % 1000 for j in range(a.prompt_len)] for i in range(a.prompts)]
    sampling = Sampling(n=a.answers, temperature=1.0, max_tokens=a.max_tokens)
    walls: dict[str, list[float]] = {v: [] for v in VARIANTS}
    cpus: dict[str, list[float]] = {v: [] for v in VARIANTS}
    requests: dict[str, int] = {}
    try:
        engines = {v: HttpEngine(url, vocab_size=vocab, per_prompt=per) for v, (per, _) in VARIANTS.items()}
        for rep in range(a.repeats + 1):  # the first round warms up
            for v, (_, loads) in VARIANTS.items():
                client._fast_loads = loads or orjson_loads
                cpu, wall = time.process_time(), time.perf_counter()
                out = engines[v].generate(prompts, sampling)
                wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
                assert [len(g) for g in out] == [a.answers] * a.prompts
                requests[v] = engines[v].step_metrics()["client/requests"]
                if rep:
                    walls[v].append(round(wall, 4))
                    cpus[v].append(round(cpu, 4))
    finally:
        client._fast_loads = orjson_loads
        proc.terminate()
        proc.wait(30)
    row = {"machine": f"{os.cpu_count()} CPU cores; {platform.machine()}; load "
                      f"{os.getloadavg()[0]:.1f} at the end",
           "python": platform.python_version(), "orjson": orjson_loads is not json.loads,
           "prompts": a.prompts, "answers": a.answers, "max_tokens": a.max_tokens,
           "repeats": a.repeats, "requests_per_rollout": requests,
           "wall_median_s": {v: statistics.median(x) for v, x in walls.items()},
           "client_cpu_median_s": {v: statistics.median(x) for v, x in cpus.items()},
           "wall_s": walls, "client_cpu_s": cpus}
    print(json.dumps(row), flush=True)
    if a.out:
        with open(a.out, "a") as f:
            f.write(json.dumps(row) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
