"""The HTTP rollout client: many open requests to a router, each retried until a deadline.

A rollout behind a router is hundreds of independent requests (the 16-answer recipe opens
32 x 16 = 512 at once). When the router finds no free engine it answers 503 Service
Unavailable; the course's 16-answer run logged 22,357 such lines in bursts of up to 60 s
and went on because its client retried. miles retries every 1 s, up to 60 times. This
client retries 503s (and 408, 429, 500, 502, 504, connection errors) with capped exponential backoff
and full jitter (AWS architecture blog, "Exponential Backoff And Jitter"): the delay before
attempt k+1 is uniform in [0, min(cap, base * 2**(k-1))], so a burst does not make 512
requests hit the router in lockstep, and retrying goes on for at least `deadline_s`
(default 120 s, twice miles' 60 s). A request that gets no answer at all (an engine that
hangs) is cancelled at `request_timeout_s` (`--request-timeout`, 600 s), attempts and
waits included. A 200 whose body is cut short or has no usable answer (`check`) is a failed
attempt too, retried and logged; an answer that cannot be right however often it is asked
(token ids outside the trainer's vocabulary: the engines serve another model) fails at once.

Every failed attempt is one JSON line in the client log (`t`, `event`, `request_id`,
`attempt`, `status`, `code`, `error`, `delay_s`), and so are completions, step boundaries
and changes of the open-request limit: the watchdog reads the same lines live and offline.
A request that runs out of time raises `RolloutFailed`; the other requests of the step are
cancelled and nothing of the step is returned, so nothing of it is applied.

The client knows requests and answers, not the trainer's engine interface:
labkit.engines.completions turns prompts into `/v1/completions` requests and answers into
Completions, and labkit.engines.http puts it all behind that interface, with the weight
sync. Answers are parsed with orjson where it is installed (vllm-router brings it): a 32 x 8
rollout of 1024-token answers in vLLM's shape is ~27 MB of JSON, which json read in 0.34 s
of the event loop's time on a 2-core CPU box and orjson in 0.15 s.
"""

from __future__ import annotations

import asyncio
import json
import random
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from labkit.errors import LabkitError

try:
    from orjson import loads as _fast_loads
except ImportError:  # json alone reads the same answers
    _fast_loads = json.loads

# Transient answers: overload (429, 503), upstream failures a router reports as 5xx
# (vllm-router answers 500 when an engine timed out), and 408: vllm-router's own limit
# (--max-concurrent-requests) answers it when a request waits in its queue, within a second
# with vllm-router 0.1.17 (measured: benchmarks/bench_router_bursts.py). Other 4xx are the
# request's fault.
RETRY_STATUSES = (408, 429, 500, 502, 503, 504)
# Plain-text bodies of the routers' 503s, mapped to the code sglang-router sends as JSON.
KNOWN_BODIES = {"no available workers": "no_available_workers"}


class RolloutFailed(LabkitError, RuntimeError):
    """A request ran out of retry time (or met a status that is not retried): the step fails."""

    def __init__(self, request_id: str, attempts: int, last_status: int | None,
                 last_code: str | None, message: str):
        super().__init__(message)
        self.request_id, self.attempts = request_id, attempts
        self.last_status, self.last_code = last_status, last_code


class RolloutStopped(RolloutFailed):
    """The watchdog stopped the rollout (a burst or a stall passed its limit)."""


class BadAnswer(ValueError):
    """A 200 answer the rollout cannot use; `retry` says whether asking again may help."""

    def __init__(self, code: str, message: str, retry: bool = True):
        super().__init__(message)
        self.code, self.retry = code, retry


class RouterUnavailable(LabkitError, RuntimeError):
    """The router URL does not answer its health check: the rollout is not started."""


@dataclass(frozen=True)
class RetryPolicy:
    """Capped exponential backoff with full jitter, bounded by a per-request deadline.

    base_s, cap_s: attempt k waits uniform(0, min(cap_s, base_s * 2**(k-1))) before the next.
    deadline_s: no attempt starts later than this after the first; the last wait is cut so
        that one attempt is made at the deadline, so retrying lasts at least deadline_s (when
        the deadline is not before request_timeout_s, until the last wait that leaves an
        attempt time to be answered).
    request_timeout_s: the most one request may take, its attempts and waits included (a
        whole generation, queued behind others); the attempt in flight then is cancelled.
    retry_statuses: HTTP statuses that are retried; any other non-200 fails at once.
    """

    base_s: float = 0.5
    cap_s: float = 8.0
    deadline_s: float = 120.0
    request_timeout_s: float = 600.0
    retry_statuses: tuple[int, ...] = RETRY_STATUSES

    def __post_init__(self):
        if not 0 < self.base_s <= self.cap_s:
            raise ValueError(f"RetryPolicy: need 0 < base_s <= cap_s, got {self.base_s}, {self.cap_s}")
        if self.deadline_s < 0 or not self.request_timeout_s > 0:
            raise ValueError(f"RetryPolicy: need deadline_s >= 0 and request_timeout_s > 0, got "
                             f"{self.deadline_s}, {self.request_timeout_s}")

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

    def __init__(self, path: Path | None = None, listeners: Sequence[Callable] = (),
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


def error_code(status: int | None, body: str) -> str | None:
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
    A `watchdog` (labkit.serving.watchdog.Watchdog) sees every event and a tick each second; its
    "lower"/"restore" decisions change the open limit, "stall" is logged and said on stderr
    (`notify`), "stop" ends the rollout with `RolloutStopped`. The router's /health is
    checked once, before the first rollout. `check(answer)` raises BadAnswer for a 200 answer
    the rollout cannot use.
    """

    def __init__(self, base_url: str, *, max_open_requests: int = 512,
                 retry: RetryPolicy = RetryPolicy(), log: EventLog | None = None,
                 watchdog=None, sleep: Callable[[float], Awaitable] = asyncio.sleep,
                 clock: Callable[[], float] = time.monotonic, rng: random.Random | None = None,
                 health_timeout_s: float = 5.0, check: Callable[[dict], None] | None = None,
                 notify: Callable[[str], None] | None = None):
        if max_open_requests < 1:
            raise ValueError(f"max_open_requests must be >= 1, got {max_open_requests}")
        self.base_url = base_url.rstrip("/")
        self.max_open_requests, self.retry = max_open_requests, retry
        self.log = log or EventLog()
        self.watchdog, self.sleep, self.clock = watchdog, sleep, clock
        self.rng = rng or random.Random()
        self.health_timeout_s = health_timeout_s
        self.check, self.notify = check, notify or _notice
        self._limit: OpenLimit | None = None
        self._stop: str | None = None
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
            elif d.action == "stall":
                self.log.emit("stall", reason=d.reason)
                self.notify(f"rollout stalled: {d.reason}; a request waits up to "
                            f"{self.retry.request_timeout_s:.0f} s (--request-timeout)")
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
        else:  # it answers, but not healthy: its engines are the problem, not the URL
            raise RouterUnavailable(
                f"the router at {self.base_url} answers {url} with {why.strip()}: it is up but "
                f"has no healthy engine behind it; check the engines (labkit serve's --log-dir "
                f"has their logs) or restart them with `labkit serve`")
        raise RouterUnavailable(
            f"the router at {self.base_url} does not answer {url} ({why}); start the engines "
            f"and the router with `labkit serve`, or pass the URL it printed"
        )

    # -------------------------------------------------------------- one request
    async def post(self, session: aiohttp.ClientSession, path: str, payload: dict,
                   request_id: str) -> dict:
        """POST `payload` to `path` until a usable 200, the retry deadline or the request's
        timeout; return the JSON answer."""
        start, policy = self.clock(), self.retry
        attempt, status, code, refused = 0, None, None, 0  # refused: attempts answered 503
        while True:
            if self._stop:
                raise RolloutStopped(request_id, attempt, status, code, self._stop)
            attempt += 1
            left = policy.request_timeout_s - (self.clock() - start)
            timeout = aiohttp.ClientTimeout(total=max(left, 0.001))
            permanent = False
            try:
                async with session.post(self.base_url + path, json=payload, timeout=timeout) as r:
                    body = await r.text()
                    status = r.status
                if status == 200:
                    try:
                        answer = self._accept(body)
                    except BadAnswer as e:
                        code, error, permanent = e.code, str(e)[:300], not e.retry
                    else:
                        self.emit("done", request_id=request_id, attempts=attempt,
                                  latency_s=round(self.clock() - start, 4))
                        return answer
                else:
                    code, error = error_code(status, body), body[:200]
                    permanent = status not in policy.retry_statuses
                    refused += status == 503
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as e:
                status, code, error = None, _exception_code(e), f"{type(e).__name__}: {e}"[:200]
            elapsed = self.clock() - start
            budget = policy.request_timeout_s - elapsed  # what the request has left
            left = min(policy.deadline_s - elapsed, budget)
            wait = min(policy.delay(attempt, self.rng), max(left, 0.0))
            # an attempt after this wait would have no time to be answered: it could only
            # "time out", and would hide what the router said (503s) behind a timeout
            last = permanent or left <= 0 or wait >= budget
            self.emit("fail", request_id=request_id, attempt=attempt, status=status, code=code,
                      error=error, delay_s=None if last else round(wait, 4))
            if last:
                self.emit("gave_up", request_id=request_id, attempts=attempt, status=status, code=code)
                raise RolloutFailed(request_id, attempt, status, code, _give_up_message(
                    request_id, attempt, status, code, error, permanent, elapsed, policy,
                    refused))
            await self.sleep(wait)

    def _accept(self, body: str) -> dict:
        """The JSON answer of a 200, or BadAnswer: a body cut short, or one `check` refuses."""
        try:
            answer = loads_answer(body)
        except ValueError:
            raise BadAnswer("bad_json", f"a 200 whose body is not JSON (cut short?): {body[:200]!r}") from None
        if self.check is not None:
            self.check(answer)
        return answer

    # -------------------------------------------------------------- a rollout
    async def run(self, requests: Sequence[tuple[str, str, dict]], step: int | None = None,
                  phase: str | None = None) -> list[dict]:
        """Send (request_id, path, payload) requests; return answers in order or raise.

        The first request that fails cancels the others and raises RolloutFailed. `step` (the
        trainer's) and `phase` (e.g. "eval") go to the step_start and step_end lines.
        """
        info = {"phase": phase} if phase else {}
        start_limit = self.max_open_requests  # a burst still on from the last step keeps it low
        if self.watchdog is not None and self.watchdog.limit < self.watchdog.base_limit:
            start_limit = min(start_limit, self.watchdog.limit)
        self._limit, self._stop = OpenLimit(start_limit), None
        ticker = None
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
            if not self._checked:
                await self.check_health(session)
                self._checked = True
            self.emit("step_start", step=step, requests=len(requests),
                      open_limit=self.max_open_requests, **info)

            async def one(rid, path, payload):
                async with self._limit:
                    return await self.post(session, path, payload, rid)

            tasks = [asyncio.create_task(one(*r)) for r in requests]
            if self.watchdog is not None:
                ticker = asyncio.create_task(self._tick())
            answers = await _gather_or_cancel(tasks, ticker)
            self.emit("step_end", step=step, **info)
            return answers

    async def _tick(self, every_s: float = 1.0) -> None:
        """Let the watchdog see time pass (burst ends, stalls) between events."""
        for _ in range(10_000_000):  # bounded: cancelled when the rollout ends
            await asyncio.sleep(every_s)
            self.apply(self.watchdog.tick(self.log.wall()))


async def _gather_or_cancel(tasks: list[asyncio.Task], ticker: asyncio.Task | None) -> list:
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


def _notice(message: str) -> None:
    sys.stderr.write(f"labkit: {message}\n")
    sys.stderr.flush()


def _exception_code(e: BaseException) -> str:
    if isinstance(e, asyncio.TimeoutError):
        return "timeout"
    if isinstance(e, aiohttp.ServerDisconnectedError):
        return "disconnected"
    return "connection_error"


def _give_up_message(rid, attempts, status, code, error, permanent, elapsed, policy,
                     refused: int = 0) -> str:
    what = f"HTTP {status}" if status else "no answer"
    if permanent:
        return (f"request {rid} failed with {what} ({code}): {error}; this is not retried, so "
                f"the step is abandoned and nothing of it is applied")
    if refused == attempts:  # answered every time, never served: not a timeout
        return (f"request {rid}: the router answered all {attempts} attempts in {elapsed:.0f} s "
                f"with HTTP 503 ({code}): no engine behind it took the request, so the step is "
                f"abandoned and nothing of it is applied. Check that the engines are up "
                f"(labkit serve says when one stopped; its --log-dir has their logs); if they "
                f"are only overloaded, raise --request-timeout or lower --max-open-requests")
    if code == "timeout":
        return (f"request {rid} got no answer within its {policy.request_timeout_s:.0f} s "
                f"(--request-timeout) after {attempts} attempt(s), last {what} ({code}); the "
                f"step is abandoned and nothing of it is applied. If the engines are slow rather "
                f"than stuck, raise --request-timeout")
    return (f"request {rid} gave up after {attempts} attempts in {elapsed:.0f} s, last "
            f"{what} ({code}); the step is abandoned and nothing of it is applied. If the "
            f"router sheds load for longer, raise RetryPolicy.deadline_s or lower "
            f"max_open_requests")


def loads_answer(body: str) -> Any:
    """A JSON body, read by orjson when it can; what orjson refuses and json reads (NaN,
    Infinity, integers past 64 bits) is read by json, so the result is always json's."""
    try:
        return _fast_loads(body)
    except ValueError:
        if _fast_loads is json.loads:
            raise
        return json.loads(body)


def run_sync(coro) -> Any:
    """Run a coroutine to the end from sync code, also inside Jupyter's running loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result()
