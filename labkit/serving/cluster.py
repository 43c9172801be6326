"""Engines behind a router: start K engine servers and a router on loopback, stop them all.

The course's 16-answer run sampled through a router in front of several engines, and
its 503 bursts came from that router. `labkit serve` rebuilds the setup on one machine:
K OpenAI-compatible engine servers (vLLM's, or labkit.engines.fake_server for tests), and
vllm-router (a Rust load balancer from PyPI) in front of them, all on 127.0.0.1.

Every process starts in its own process group (labkit.serving.processes), so stopping one stops
the workers it spawned (vLLM's engine core) too; `stop` sends SIGTERM to each group,
waits, then SIGKILL, and checks by process group that nothing is left. Ports are checked
before anything starts, and each engine must answer /health before the router starts.

Weight sync (`labkit launch --rollout-mode http`): after each optimizer step the trainer
writes its weights to one safetensors file and asks every engine to load it. vLLM's server
has no public endpoint that loads new weights from a file and then refreshes what it
derived from them, so each vLLM engine starts with its dev endpoints on
(`VLLM_SERVER_DEV_MODE=1`: `/collective_rpc`, `/reset_prefix_cache`; loopback only) and
with labkit.engines.served_sync mixed into its worker (`--worker-extension-cls`). The
trainer finds the engines through the router's `/list_workers`; `serve.json` lists them too.

    labkit serve --engines 2 --port 8000              # vLLM engines, Ctrl-C stops all
    labkit serve --backend fake --engines 2 --duration 60
    labkit serve --dtype float32 --engine-args --enforce-eager --max-num-seqs 64   # last
    labkit serve --one-by-one --engine-args --gpu-memory-utilization 0.15  # 2 on one GPU
"""

from __future__ import annotations

import atexit
import functools
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path

from labkit.config import flag_field
from labkit.serving.processes import Proc, ServeError, check_ports_free, group_members, spawn, stop_groups, wait_healthy

# The class each served vLLM engine mixes into its worker (`--worker-extension-cls`) to load
# the trainer's weights file: labkit.engines.served_sync, the engine side of the weight sync.
# vLLM imports it by this path inside the engine, so starting engines imports no engine code.
WORKER_EXTENSION = "labkit.engines.served_sync.EngineWeightSync"

REPO = Path(__file__).resolve().parents[2]  # the checkout this labkit runs from (or site-packages)

# By default vllm-router forwards every request (up to 32,768 at once) and the engines queue
# them: an overload shows as slow answers, never as 503. It answers 503 "No available
# workers (all circuits open or unhealthy)" when no engine may take a request. These
# settings make that happen under overload: a request the engine has not answered in
# 60 s fails (HTTP 500 to the client) and counts against that engine's circuit breaker;
# 8 failures open the circuit for 15 s, and while every circuit is open the router sheds
# load with 503s. Router-side retries are off, so every retry is the client's, and logged.
# (Its other limit, --max-concurrent-requests with --queue-size, sheds with 429 instead.)
SHED_LOAD_ROUTER_ARGS = (
    "--request-timeout-secs", "60", "--cb-failure-threshold", "8",
    "--cb-timeout-duration-secs", "15", "--disable-retries",
)


@dataclass
class ServeConfig:
    """What to start: K engines on port+1..port+K, the router on port, its metrics on port+K+1.

    Each field is a `labkit serve` flag (`max_num_seqs` is `--max-num-seqs`), help written once.
    """

    engines: int = flag_field(2, "engine servers behind the router")
    backend: str = flag_field("vllm", "vllm (OpenAI-compatible vLLM server) or fake (made-up "
                              "tokens, for tests)", choices=["vllm", "fake"])
    model: str = flag_field("smollm2", "hub id, folder, .gguf, or smollm2 (embedded)")
    served_model_name: str = flag_field("smollm2", "the model name the engines answer to")
    host: str = flag_field("127.0.0.1", "loopback only: the engines' dev endpoints take weights",
                           flag=False)
    port: int = flag_field(8000, "router port; engines use port+1..port+K, router metrics port+K+1")
    router: str = flag_field("vllm-router", "the router in front of the engines, or none (one "
                             "engine, used directly)", choices=["vllm-router", "none"])
    shed_load: bool = flag_field(
        False, "answers slower than 60 s fail and open the engine's circuit for 15 s, so an "
        "overloaded router answers 503 (SHED_LOAD_ROUTER_ARGS)")
    router_args: tuple[str, ...] = flag_field((), "extra router flags, one shell-quoted string")
    max_num_seqs: int = flag_field(16, "vLLM: sequences per batch")
    max_model_len: int = flag_field(1024, "vLLM: context length")
    dtype: str = flag_field("auto", "vLLM: weights dtype (auto, float32, bfloat16); float32 on "
                            "CPU to compare log-probs with the trainer")
    kv_cache_gib: int = flag_field(1, "vLLM CPU: KV cache GiB per engine (VLLM_CPU_KVCACHE_SPACE)")
    fake_delay_s: float = flag_field(0.05, "fake engine: seconds per request")
    fake_slots: int = flag_field(8, "fake engine: requests generated at once (the rest wait)")
    fake_vocab_size: int = flag_field(1000, "fake engine: token ids are drawn below this")
    log_dir: str = flag_field("out/serve", "engine and router logs, and serve.json")
    startup_timeout_s: float = flag_field(900.0, "seconds an engine may take to answer /health")
    one_by_one: bool = flag_field(
        False, "start each engine once the one before is ready: engines that share a GPU then "
        "do not measure its free memory while another one is taking some (vLLM's start-up "
        "profiling) nor compile into the same cache at once")
    vllm_python: str | None = flag_field(None, "a Python that imports vllm (default: found)")
    env: dict = flag_field(dict, "extra environment for the engines", flag=False)
    # Last on the command line, and takes the rest of it: a value starting with "-" is not
    # read as a flag of labkit serve.
    engine_args: tuple[str, ...] = flag_field(
        (), "extra engine flags: the rest of the line (--engine-args --enforce-eager "
        "--max-num-seqs 64), or one quoted string (--engine-args=\"--enforce-eager "
        "--max-num-seqs 64\", which may come before other flags)", rest_of_line=True)

    def ports(self) -> list[int]:
        """Every port this config binds: router, engines, router metrics."""
        extra = [self.port + self.engines + 1] if self.router != "none" else []
        return [self.port] + [self.port + 1 + i for i in range(self.engines)] + extra


class Cluster:
    """K engines and a router; use as a context manager, or call start() and stop()."""

    def __init__(self, cfg: ServeConfig):
        self.cfg, self.procs = cfg, []
        self.log_dir = Path(cfg.log_dir)

    @property
    def url(self) -> str:
        """The router's URL (the first engine's when router is 'none')."""
        c = self.cfg
        return f"http://{c.host}:{c.port if c.router != 'none' else c.port + 1}"

    def __enter__(self) -> Cluster:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> Cluster:
        """Check ports, start the engines (all at once, or `one_by_one`), wait for their
        health, then start the router."""
        c = self.cfg
        if c.engines < 1:
            raise ServeError(f"--engines must be >= 1, got {c.engines}")
        if not 1 <= c.port or max(c.ports()) > 65535:
            raise ServeError(f"--port {c.port}: the router and {c.engines} engine(s) take ports "
                             f"{c.port}..{max(c.ports())}, and a port is 1 to 65535; e.g. --port 8000")
        check_ports_free(c.host, c.ports())
        try:
            self.log_dir.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise ServeError(f"--log-dir {self.log_dir}: cannot create it ({e.strerror or e}); "
                             f"choose a folder you can write to") from None
        atexit.register(self.stop)
        try:
            for i in range(c.engines):
                port = c.port + 1 + i
                self._spawn(f"engine{i}", engine_command(c, port), f"http://{c.host}:{port}",
                            engine_env(c, i))
                if c.one_by_one:
                    self._ready(self.procs[-1])
            if not c.one_by_one:
                for p in list(self.procs):
                    self._ready(p)
            if c.router != "none":
                router = self._spawn("router", router_command(c, [p.url for p in self.procs]),
                                     f"http://{c.host}:{c.port}", {})
                wait_healthy(router, 120.0)
        except BaseException:
            self.stop()
            raise
        return self

    def _ready(self, proc: Proc) -> None:
        """Wait for an engine's /health, then (vLLM) for its first completion."""
        wait_healthy(proc, self.cfg.startup_timeout_s)
        if self.cfg.backend == "vllm":
            warm_up(proc, self.cfg.startup_timeout_s)

    def _spawn(self, name: str, cmd: list[str], url: str, env: dict) -> Proc:
        proc = spawn(name, cmd, url, env, self.log_dir / f"{name}.log")
        self.procs.append(proc)
        return proc

    def engine_urls(self) -> list[str]:
        """The engines' own URLs (the weight sync goes to each of them, not to the router)."""
        return [p.url for p in self.procs if p.name.startswith("engine")]

    def pids(self) -> dict[str, int]:
        return {p.name: p.popen.pid for p in self.procs}

    def dead(self) -> list[Proc]:
        """Processes that exited while they should be serving."""
        return [p for p in self.procs if p.popen.poll() is not None]

    def stop(self, grace_s: float = 20.0) -> list[int]:
        """SIGTERM every group (router first), SIGKILL what is left; return pids still alive."""
        left = stop_groups(list(reversed(self.procs)), grace_s)
        self.procs = [p for p in self.procs if group_members(p.pgid)]
        atexit.unregister(self.stop)
        return left


def warm_up(proc: Proc, timeout_s: float) -> None:
    """Send one short completion and wait for it. vllm-cpu's first completion can take
    minutes on 2 busy cores (it compiles lazily), and a router would time it out."""
    body = json.dumps({"prompt": [1, 2, 3], "max_tokens": 4, "logprobs": 1}).encode()
    req = urllib.request.Request(proc.url + "/v1/completions", data=body,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as r:
            r.read()
    except OSError as e:
        raise ServeError(f"{proc.name} is healthy but its first completion failed ({e}); "
                         f"see {proc.log}:\n{proc.tail()}") from e


# ---------------------------------------------------------------------- commands
def vllm_python(cfg: ServeConfig) -> str:
    """A Python that can import vllm: --vllm-python, LABKIT_VLLM_PYTHON, this one, .venv-vllm."""
    for candidate in (cfg.vllm_python, os.environ.get("LABKIT_VLLM_PYTHON")):
        if candidate:
            return candidate
    if importlib.util.find_spec("vllm") is not None:
        return sys.executable
    local = REPO / ".venv-vllm" / "bin" / "python"
    if local.exists():
        return str(local)
    raise ServeError("vLLM is not importable here and no .venv-vllm was found; pass --vllm-python "
                     "PATH (a Python with vllm or vllm-cpu), or --backend fake to test without it")


@functools.cache
def isolated(python: str) -> tuple[str, ...]:
    """`python` with -P (Python 3.11+) where it takes it: `python -m` then leaves the working
    folder off sys.path, so a folder there named like a package (the checkout `labkit/`, in
    the folder that holds it) cannot stand in for the real one. PYTHONPATH still applies."""
    if python == sys.executable:
        return (python, "-P") if sys.version_info >= (3, 11) else (python,)
    try:
        takes = subprocess.run([python, "-P", "-c", ""], capture_output=True,
                               timeout=60).returncode == 0
    except (OSError, subprocess.SubprocessError):
        takes = False  # the engine's own start-up names what is wrong with this Python
    return (python, "-P") if takes else (python,)


def engine_command(cfg: ServeConfig, port: int) -> list[str]:
    """The command line of one engine server on `port`."""
    if cfg.backend == "fake":
        return [*isolated(sys.executable), "-m", "labkit", "fake-engine", "--host", cfg.host,
                "--port", str(port),
                "--delay-s", str(cfg.fake_delay_s), "--slots", str(cfg.fake_slots),
                "--vocab-size", str(cfg.fake_vocab_size),
                "--served-model-name", cfg.served_model_name, *cfg.engine_args]
    if cfg.backend != "vllm":
        raise ServeError(f"--backend {cfg.backend!r} is not valid; valid: vllm, fake")
    from labkit.models import resolve_model

    return [*isolated(vllm_python(cfg)), "-m", "vllm.entrypoints.openai.api_server",
            "--model", resolve_model(cfg.model), "--served-model-name", cfg.served_model_name,
            "--host", cfg.host, "--port", str(port), "--max-model-len", str(cfg.max_model_len),
            "--max-num-seqs", str(cfg.max_num_seqs), "--dtype", cfg.dtype,
            # the log-prob of each token under the distribution it was sampled from (after
            # temperature and top-p), as the trainer computes it; no sampling defaults
            # taken from the model's generation_config.json
            "--logprobs-mode", "processed_logprobs", "--generation-config", "vllm",
            "--worker-extension-cls", WORKER_EXTENSION, *cfg.engine_args]


def engine_env(cfg: ServeConfig, index: int) -> dict:
    """Environment of engine `index`: this labkit importable first (the vLLM worker imports
    WORKER_EXTENSION from it), and for vLLM the dev endpoints for weight sync, and on CPU its
    KV cache size and its own core (cfg.env wins)."""
    env = {}
    path = os.environ.get("PYTHONPATH")
    if (REPO / "pyproject.toml").is_file():  # a checkout; never another venv's site-packages
        env["PYTHONPATH"] = str(REPO) + (os.pathsep + path if path else "")
    if cfg.backend == "vllm":
        env.update({
            "VLLM_CPU_KVCACHE_SPACE": str(cfg.kv_cache_gib),
            # vLLM binds its OpenMP threads to core 0 by default: K engines would share it.
            "VLLM_CPU_OMP_THREADS_BIND": str(index % (os.cpu_count() or 1)),
            # /collective_rpc and /reset_prefix_cache: the trainer's weight sync
            "VLLM_SERVER_DEV_MODE": "1"})
    return {**env, **cfg.env}


# vllm-router's Python entry point: `python -m` runs it where its console script cannot (a
# wheel unpacked with `pip install --target` on another machine: the script's #! line names
# the Python that unpacked it)
ROUTER_MODULES = {"vllm-router": "vllm_router.launch_router"}


def router_binary(name: str) -> list[str]:
    """The router's command: its executable on PATH or beside this Python (a venv's bin),
    else this Python running its module (ROUTER_MODULES) when that is importable."""
    found = shutil.which(name) or shutil.which(name, path=str(Path(sys.executable).parent))
    if found:
        return [found]
    module = ROUTER_MODULES.get(name)
    try:
        importable = module is not None and importlib.util.find_spec(module) is not None
    except ImportError:  # its package is missing
        importable = False
    if importable:
        return [*isolated(sys.executable), "-m", module]
    raise ServeError(f"{name} not found; pip install {name} (a Rust load balancer on PyPI), "
                     f"or pass --router none to use one engine directly")


def router_command(cfg: ServeConfig, worker_urls: list[str]) -> list[str]:
    """vllm-router on cfg.port in front of `worker_urls`, metrics on port+K+1."""
    if cfg.router != "vllm-router":
        raise ServeError(f"--router {cfg.router!r} is not valid; valid: vllm-router, none")
    return [*router_binary(cfg.router), "--host", cfg.host, "--port", str(cfg.port),
            "--worker-urls", *worker_urls, "--policy", "round_robin",
            "--prometheus-host", cfg.host, "--prometheus-port", str(cfg.port + cfg.engines + 1),
            *(SHED_LOAD_ROUTER_ARGS if cfg.shed_load else ()), *cfg.router_args]


# ---------------------------------------------------------------------- labkit serve
def serve(cfg: ServeConfig, duration: float | None = None) -> int:
    """`labkit serve`: start engines and router, print the URL, stop all on Ctrl-C or after
    `duration` seconds. Returns the exit code: 0, 1 when a process died, 2 when start-up failed."""

    def on_term(signum, frame):
        raise KeyboardInterrupt

    # SIGINT too: a shell starts background jobs with it ignored, and Ctrl-C (or kill -INT)
    # must still stop every engine
    old = {sig: signal.signal(sig, on_term) for sig in (signal.SIGTERM, signal.SIGINT)}
    cluster, code = Cluster(cfg), 0
    try:
        cluster.start()
        state = {"url": cluster.url, "engines": cluster.engine_urls(), "pids": cluster.pids(),
                 "config": asdict(cfg)}
        (cluster.log_dir / "serve.json").write_text(json.dumps(state, indent=2))
        print(f"labkit serve: router {cluster.url} in front of {cfg.engines} {cfg.backend} engines "
              f"{' '.join(cluster.engine_urls())} (logs in {cluster.log_dir}); Ctrl-C stops all\n"
              f"labkit serve: train with `labkit launch --rollout-mode http --router-url "
              f"{cluster.url}`", flush=True)
        end = time.monotonic() + duration if duration else float("inf")
        while True:  # until --duration or Ctrl-C
            if time.monotonic() >= end:
                break
            dead = cluster.dead()
            if dead:
                print(f"labkit serve: {dead[0].name} exited (code {dead[0].popen.returncode}); "
                      f"stopping all. Its log ends with:\n{dead[0].tail()}", file=sys.stderr)
                code = 1
                break
            time.sleep(min(1.0, max(0.0, end - time.monotonic())))
    except KeyboardInterrupt:
        print("labkit serve: stopping ...", flush=True)
    except ServeError as e:
        print(f"labkit serve: {e}", file=sys.stderr)
        code = 2
    finally:
        left = cluster.stop()
        for sig, handler in old.items():
            signal.signal(sig, handler)
        if left:
            print(f"labkit serve: processes still alive after SIGKILL: {left}", file=sys.stderr)
            code = code or 1
        else:
            print("labkit serve: all engine and router processes stopped", flush=True)
    return code

