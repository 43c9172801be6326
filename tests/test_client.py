"""Rollout client: retries against a scripted local server, backoff, log lines, HttpEngine."""

from __future__ import annotations

import asyncio
import json
import random
import socket
import time

import aiohttp
import pytest
from aiohttp import web

from labkit.engines.base import Sampling
from labkit.engines.http import HttpEngine
from labkit.serving.client import (
    EventLog,
    RetryPolicy,
    RolloutClient,
    RolloutFailed,
    RolloutStopped,
    RouterUnavailable,
    error_code,
)
from labkit.serving.watchdog import Policy, Watchdog


class MaxJitter(random.Random):
    """Full jitter that always draws the ceiling, so the waits are known."""

    def uniform(self, a, b):
        return b


class FakeTime:
    """A clock that only moves when the client sleeps: tests never wait for backoff."""

    def __init__(self):
        self.now, self.waits = 1000.0, []

    async def sleep(self, s):
        self.waits.append(s)
        self.now += s
        await asyncio.sleep(0)

    def clock(self):
        return self.now


class Scripted:
    """A test server on 127.0.0.1: /v1/completions answers from a script, then 200."""

    def __init__(self, script=(), delay_s=0.0):
        self.script, self.delay_s = list(script), delay_s
        self.calls = self.open = self.max_open = 0
        self.bodies = []

    async def completions(self, request):
        body = await request.json()
        self.bodies.append(body)
        self.calls += 1
        self.open += 1
        self.max_open = max(self.max_open, self.open)
        try:
            await asyncio.sleep(self.delay_s)
            if self.script:
                status = self.script.pop(0)
                if isinstance(status, str):  # a 200 with this body (e.g. cut short)
                    return web.Response(status=200, text=status, content_type="application/json")
                if isinstance(status, dict):  # a 200 with this JSON answer
                    return web.json_response(status)
                if status != 200:
                    return web.Response(status=status, text="No available workers (all circuits open or unhealthy)")
            return web.json_response(vllm_answer(body["prompt"]))
        finally:
            self.open -= 1

    async def health(self, request):
        return web.Response(text="ok")

    async def start(self):
        app = web.Application()
        app.add_routes([web.post("/v1/completions", self.completions), web.get("/health", self.health)])
        self.runner = web.AppRunner(app, shutdown_timeout=1.0)  # a hanging handler is not waited for
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    async def stop(self):
        await self.runner.cleanup()


def vllm_answer(prompt):
    """What vLLM answers with logprobs=1 and return_tokens_as_token_ids: ids as 'token_id:N'."""
    ids = [int(prompt[-1]) + 1, int(prompt[-1]) + 2]
    return {"choices": [{"index": 0, "text": "ab", "finish_reason": "length",
                         "logprobs": {"tokens": [f"token_id:{i}" for i in ids],
                                      "token_logprobs": [-0.5, -1.25]}}]}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def post_once(server, retry, tmp_path, rng=None):
    """Start the server, POST one request through a client with fake time; return what happened."""
    url = await server.start()
    fake = FakeTime()
    log = EventLog(tmp_path / "client.jsonl", wall=fake.clock)
    client = RolloutClient(url, retry=retry, log=log, sleep=fake.sleep, clock=fake.clock,
                           rng=rng or MaxJitter())
    try:
        async with aiohttp.ClientSession() as session:
            try:
                answer = await client.post(session, "/v1/completions", {"prompt": [1]}, "r0")
            except RolloutFailed as e:
                answer = e
    finally:
        await server.stop()
        log.close()
    lines = [json.loads(x) for x in (tmp_path / "client.jsonl").read_text().splitlines()]
    return answer, fake, lines


def test_backoff_ceiling_doubles_and_is_capped():
    policy = RetryPolicy(base_s=0.5, cap_s=8.0)
    assert [policy.ceiling(k) for k in range(1, 8)] == [0.5, 1, 2, 4, 8, 8, 8]
    rng = random.Random(0)
    draws = [policy.delay(k, rng) for k in range(1, 200) for _ in range(3)]
    assert all(0 <= d <= 8.0 for d in draws) and max(draws) > 6  # jitter spreads up to the cap


def test_three_503s_then_200_retries_three_times(tmp_path):
    answer, fake, lines = asyncio.run(post_once(Scripted([503, 503, 503]), RetryPolicy(), tmp_path))
    assert answer["choices"][0]["text"] == "ab"
    assert fake.waits == [0.5, 1.0, 2.0]  # growing waits (ceiling drawn)
    fails = [x for x in lines if x["event"] == "fail"]
    assert [(x["attempt"], x["status"], x["code"]) for x in fails] == [
        (1, 503, "no_available_workers"), (2, 503, "no_available_workers"), (3, 503, "no_available_workers")]
    assert all(x["request_id"] == "r0" and "t" in x for x in fails)
    assert lines[-1]["event"] == "done" and lines[-1]["attempts"] == 4


def test_always_503_retries_for_the_whole_deadline_then_fails(tmp_path):
    retry = RetryPolicy(base_s=0.5, cap_s=8.0, deadline_s=60.0)
    err, fake, lines = asyncio.run(post_once(Scripted([503] * 1000), retry, tmp_path))
    assert isinstance(err, RolloutFailed)
    assert err.request_id == "r0" and err.last_status == 503 and err.attempts == len(fake.waits) + 1
    assert sum(fake.waits) == pytest.approx(60.0)  # the last wait is cut to end at the deadline
    assert max(fake.waits) == 8.0 and err.attempts == 12  # 0.5+1+2+4 + 8 x 6 + 4.5 = 60
    assert "the router answered all 12 attempts in 60 s with HTTP 503 (no_available_workers): " \
           "no engine behind it took the request" in str(err) and "nothing of it is applied" in str(err)
    assert "timeout" not in str(err).replace("--request-timeout", "")
    assert lines[-1]["event"] == "gave_up" and sum(x["event"] == "fail" for x in lines) == 12


def test_a_router_that_answers_503_to_everything_is_not_reported_as_a_timeout(tmp_path):
    # the launcher's policy with --request-timeout 30: the deadline is the request's timeout
    retry = RetryPolicy(deadline_s=30.0, request_timeout_s=30.0)
    err, fake, _ = asyncio.run(post_once(Scripted([503] * 1000), retry, tmp_path))
    assert "the router answered all" in str(err) and "with HTTP 503" in str(err)
    assert "got no answer" not in str(err) and "Check that the engines are up" in str(err)
    mixed = Scripted([503, 503, 500] * 100)  # not only 503s: the last status is named
    err, _, _ = asyncio.run(post_once(mixed, retry, tmp_path / "m"))
    assert "gave up after" in str(err) and "last HTTP" in str(err)


def test_a_router_that_is_up_with_no_healthy_engine_is_named_so():
    class Unhealthy(Scripted):
        async def health(self, request):
            return web.Response(status=503, text="No available workers")

    async def go():
        server = Unhealthy()
        url = await server.start()
        try:
            with pytest.raises(RouterUnavailable) as info:
                await RolloutClient(url).run([("r0", "/v1/completions", {"prompt": [1]})])
        finally:
            await server.stop()
        return str(info.value)

    message = asyncio.run(go())
    assert "answers" in message and "HTTP 503" in message
    assert "it is up but has no healthy engine behind it" in message


def test_a_status_that_is_not_retried_fails_at_once(tmp_path):
    err, fake, _ = asyncio.run(post_once(Scripted([400]), RetryPolicy(), tmp_path))
    assert isinstance(err, RolloutFailed) and err.attempts == 1 and fake.waits == []
    assert "not retried" in str(err)


def test_a_routers_queue_timeout_is_retried(tmp_path):
    """vllm-router's --max-concurrent-requests answers 408 to a request its queue held."""
    answer, fake, lines = asyncio.run(post_once(Scripted([408, 408]), RetryPolicy(), tmp_path))
    assert answer["choices"][0]["text"] == "ab" and fake.waits == [0.5, 1.0]
    assert [x["status"] for x in lines if x["event"] == "fail"] == [408, 408]


def test_connection_errors_are_retried(tmp_path):
    async def go():
        fake = FakeTime()
        client = RolloutClient(f"http://127.0.0.1:{free_port()}", retry=RetryPolicy(deadline_s=5.0),
                               sleep=fake.sleep, clock=fake.clock, rng=MaxJitter(),
                               log=EventLog(tmp_path / "c.jsonl", wall=fake.clock))
        async with aiohttp.ClientSession() as session:
            with pytest.raises(RolloutFailed) as info:
                await client.post(session, "/v1/completions", {}, "r9")
        return info.value, fake

    err, fake = asyncio.run(go())
    assert err.last_status is None and err.last_code == "connection_error" and err.attempts == 5
    assert sum(fake.waits) == pytest.approx(5.0)


def test_router_that_does_not_answer_fails_fast(tmp_path):
    fake = FakeTime()  # the client's waits are recorded, not slept: a retry would show in them
    client = RolloutClient(f"http://127.0.0.1:{free_port()}", health_timeout_s=2.0,
                           sleep=fake.sleep, clock=fake.clock,
                           log=EventLog(tmp_path / "c.jsonl", wall=fake.clock))
    with pytest.raises(RouterUnavailable, match="labkit serve"):
        asyncio.run(client.run([("r0", "/v1/completions", {})]))
    assert fake.waits == [] and not (tmp_path / "c.jsonl").read_text()  # no request was sent


def test_open_requests_never_exceed_the_limit(tmp_path):
    async def go():
        server = Scripted(delay_s=0.05)
        url = await server.start()
        try:
            client = RolloutClient(url, max_open_requests=4, log=EventLog(tmp_path / "c.jsonl"))
            answers = await client.run([(f"r{i}", "/v1/completions", {"prompt": [i]}) for i in range(20)])
        finally:
            await server.stop()
        return server, answers

    server, answers = asyncio.run(go())
    assert server.max_open == 4 and server.calls == 20
    assert [a["choices"][0]["logprobs"]["tokens"][0] for a in answers] == [f"token_id:{i + 1}" for i in range(20)]
    kinds = [json.loads(x)["event"] for x in (tmp_path / "c.jsonl").read_text().splitlines()]
    assert kinds[0] == "step_start" and kinds[-1] == "step_end" and kinds.count("done") == 20


def test_watchdog_stop_ends_the_rollout(tmp_path):
    async def go():
        server = Scripted([503] * 1000)
        url = await server.start()
        fake = FakeTime()
        dog = Watchdog(burst_gap=30.0, policy=Policy(stop_burst_s=10.0))
        client = RolloutClient(url, max_open_requests=2, watchdog=dog, sleep=fake.sleep,
                               clock=fake.clock, rng=MaxJitter(),
                               log=EventLog(tmp_path / "c.jsonl", wall=fake.clock))
        try:
            with pytest.raises(RolloutStopped) as info:
                await client.run([(f"r{i}", "/v1/completions", {"prompt": [i]}) for i in range(4)])
        finally:
            await server.stop()
        return info.value, dog

    err, dog = asyncio.run(go())
    assert "Policy.stop_burst_s" in str(err)
    assert [d.action for d in dog.decisions] == ["stop"]


def test_watchdog_lower_decision_changes_the_open_limit(tmp_path):
    async def go():
        server = Scripted([503, 503], delay_s=0.01)
        url = await server.start()
        dog = Watchdog(burst_gap=1.0, policy=Policy(on_burst="lower", lower_factor=0.5, min_open=1))
        fake = FakeTime()
        client = RolloutClient(url, max_open_requests=8, watchdog=dog, sleep=fake.sleep,
                               clock=fake.clock, rng=MaxJitter(), log=EventLog(tmp_path / "c.jsonl", wall=fake.clock))
        try:
            await client.run([(f"r{i}", "/v1/completions", {"prompt": [i]}) for i in range(16)])
        finally:
            await server.stop()
        return dog

    dog = asyncio.run(go())
    assert ("lower", 4) in [(d.action, d.limit) for d in dog.decisions]
    limits = [json.loads(x) for x in (tmp_path / "c.jsonl").read_text().splitlines()]
    assert any(x["event"] == "limit" and x["limit"] == 4 for x in limits)


def test_error_code_reads_json_codes_and_known_texts():
    assert error_code(503, json.dumps({"error": {"code": "no_available_workers"}})) == "no_available_workers"
    assert error_code(503, "No available workers (all circuits open or unhealthy)") == "no_available_workers"
    assert error_code(502, "bad gateway") == "http_502"


def test_http_engine_groups_answers_by_prompt(tmp_path):
    server = Scripted([503])
    holder = {}

    async def start():
        holder["url"] = await server.start()

    loop = asyncio.new_event_loop()
    loop.run_until_complete(start())
    import threading

    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        engine = HttpEngine(holder["url"], max_open_requests=3, log_path=tmp_path / "e.jsonl", seeded=True,
                            retry=RetryPolicy(base_s=0.01, cap_s=0.02))
        out = engine.generate([[10], [20, 30]], Sampling(n=2, max_tokens=2, seed=7))
    finally:
        asyncio.run_coroutine_threadsafe(server.stop(), loop).result(timeout=10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
    assert [[c.token_ids for c in group] for group in out] == [[[11, 12], [11, 12]], [[31, 32], [31, 32]]]
    first = out[1][1]
    assert first.prompt_index == 1 and first.logprobs == [-0.5, -1.25] and first.truncated
    assert sorted(b["seed"] for b in server.bodies[1:]) == [7, 8, 9, 10]  # the 503'd one is resent
    assert all(b["logprobs"] == 1 and b["return_tokens_as_token_ids"] for b in server.bodies)
    engine.close()  # update_weights: tests/test_http_rollout.py


# ---------------------------------------------------------------------- bad replies
class Serving:
    """Run a Scripted server on its own loop in a thread, for the synchronous HttpEngine."""

    def __init__(self, server):
        self.server, self.loop = server, asyncio.new_event_loop()

    def __enter__(self) -> str:
        import threading

        url = self.loop.run_until_complete(self.server.start())
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        return url

    def __exit__(self, *exc):
        asyncio.run_coroutine_threadsafe(self.server.stop(), self.loop).result(timeout=10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)


def _events(path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()]


def test_a_request_that_never_gets_an_answer_is_cancelled_at_its_timeout_and_the_stall_said(tmp_path):
    async def go():
        server = Scripted(delay_s=3600.0)  # an engine that hangs: only the timeout ends this
        url = await server.start()
        notes = []
        client = RolloutClient(url, retry=RetryPolicy(request_timeout_s=2.5), notify=notes.append,
                               watchdog=Watchdog(stall_s=0.5), log=EventLog(tmp_path / "c.jsonl"))
        start = time.monotonic()
        try:
            with pytest.raises(RolloutFailed) as info:
                await client.run([("s0-p0-a0", "/v1/completions", {"prompt": [1]})], step=0)
            seconds = time.monotonic() - start
        finally:
            await server.stop()
        return info.value, seconds, notes

    err, seconds, notes = asyncio.run(go())
    assert seconds > 2.0  # cancelled at the request's timeout, not before
    assert "got no answer within its 2 s (--request-timeout)" in str(err)
    assert len(notes) == 1 and "rollout stalled: no request completed for 0.5 s" in notes[0]
    events = _events(tmp_path / "c.jsonl")
    assert [e["event"] for e in events if e["event"] in ("stall", "fail", "gave_up")] == [
        "stall", "fail", "gave_up"]
    assert [e["code"] for e in events if e["event"] == "fail"] == ["timeout"]


def test_a_200_cut_short_is_a_failed_attempt_that_is_retried(tmp_path):
    cut = json.dumps(vllm_answer([1]))[:40]
    answer, fake, lines = asyncio.run(post_once(Scripted([cut]), RetryPolicy(), tmp_path))
    assert answer["choices"][0]["text"] == "ab"
    fails = [x for x in lines if x["event"] == "fail"]
    assert [(x["status"], x["code"]) for x in fails] == [(200, "bad_json")]
    assert lines[-1]["event"] == "done" and lines[-1]["attempts"] == 2


def test_empty_choices_are_retried_and_the_steps_are_the_trainers(tmp_path):
    server = Scripted([{"choices": []}])
    with Serving(server) as url:
        engine = HttpEngine(url, log_path=tmp_path / "e.jsonl", retry=RetryPolicy(base_s=0.01, cap_s=0.02))
        engine.begin_step(7)  # a resumed run's step 7
        out = engine.generate([[10]], Sampling(n=2, max_tokens=2))
        engine.generate([[20]], Sampling(n=1, temperature=0.0, max_tokens=2))  # its evaluation
        engine.close()
    assert [c.token_ids for c in out[0]] == [[11, 12], [11, 12]]
    events = _events(tmp_path / "e.jsonl")
    assert [(e["status"], e["code"]) for e in events if e["event"] == "fail"] == [(200, "bad_answer")]
    starts = [(e["step"], e.get("phase")) for e in events if e["event"] == "step_start"]
    assert starts == [(7, None), (7, "eval")]
    done = sorted(e["request_id"] for e in events if e["event"] == "done")
    assert done == ["s7-eval-p0-a0", "s7-p0-a0", "s7-p0-a1"]


def test_token_ids_outside_the_vocabulary_are_refused_naming_the_model(tmp_path):
    server = Scripted([{**vllm_answer([500]), "model": "Qwen/Qwen2.5-7B"}])
    with Serving(server) as url:
        engine = HttpEngine(url, log_path=tmp_path / "e.jsonl", vocab_size=100,
                            retry=RetryPolicy(base_s=0.01, cap_s=0.02))
        with pytest.raises(RolloutFailed, match=r"serving 'Qwen/Qwen2.5-7B' answered token id 501, "
                                                r"outside the trainer's vocabulary of 100"):
            engine.generate([[500]], Sampling(n=1, max_tokens=2))
        engine.close()
    assert server.calls == 1  # not retried: asking again cannot help
