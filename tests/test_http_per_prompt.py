"""Rollouts over HTTP with one request per prompt (OpenAI `n`), and how answers are read.

The default stays one request per answer (the 503 study opens 512 of them); `per_prompt`
asks a prompt's answers in one request. Its answers must come back as the same groups, in
the order of the choices' `index`, and an answer with fewer choices than asked is a failed
attempt that is retried. Answers are read by orjson where installed, and by json where
orjson refuses what json reads, so what the rollout gets never depends on which is there.
"""

from __future__ import annotations

import asyncio
import json
import threading

import pytest
from aiohttp import web

from labkit.engines.base import Sampling
from labkit.engines.completions import build_requests, parse_completions
from labkit.engines.fake_server import fake_answer
from labkit.engines.http import HttpEngine
from labkit.serving import client
from labkit.serving.client import BadAnswer, RetryPolicy, loads_answer


def test_per_prompt_asks_each_prompts_answers_in_one_request():
    sampling = Sampling(n=3, max_tokens=4, seed=10)
    one = build_requests([[1, 2], [3]], sampling, "m", 5, seeded=True)
    grouped = build_requests([[1, 2], [3]], sampling, "m", 5, seeded=True, per_prompt=True)
    assert [r[0] for r in one] == [f"s5-p{i}-a{j}" for i in range(2) for j in range(3)]
    assert {r[2]["n"] for r in one} == {1} and [r[2]["seed"] for r in one] == [10, 11, 12, 13, 14, 15]
    assert [r[0] for r in grouped] == ["s5-p0", "s5-p1"]
    assert [(r[2]["prompt"], r[2]["n"], r[2]["seed"]) for r in grouped] == [([1, 2], 3, 10), ([3], 3, 13)]
    assert {k: v for k, v in grouped[0][2].items() if k not in ("n", "seed")} == \
        {k: v for k, v in one[0][2].items() if k not in ("n", "seed")}


def test_a_prompts_answers_come_back_in_the_order_of_their_index():
    answer = fake_answer({"prompt": [7], "max_tokens": 3, "n": 3}, "m")
    want = [c["token_ids"] for c in answer["choices"]]
    answer["choices"].reverse()
    got = parse_completions(answer, 3, 4, "s0-p4")
    assert [c.token_ids for c in got] == want and {c.prompt_index for c in got} == {4}
    with pytest.raises(BadAnswer, match="asked for 4 answers, got 3 choices"):
        parse_completions(answer, 4, 4, "s0-p4")


def test_the_fake_engines_first_choice_is_the_answer_to_a_request_for_one():
    body = {"prompt": [1, 2, 3], "max_tokens": 5, "seed": 4}
    assert fake_answer({**body, "n": 4}, "m")["choices"][0] == fake_answer(body, "m")["choices"][0]


class Grouping:
    """A fake engine on a loop in a thread: n choices in reverse index order; the first
    answer it gives is one choice short."""

    def __init__(self):
        self.bodies, self.loop = [], asyncio.new_event_loop()

    async def completions(self, request):
        body = await request.json()
        self.bodies.append(body)
        answer = fake_answer(body, "fake", vocab_size=100)
        answer["choices"].reverse()
        if len(self.bodies) == 1:
            answer["choices"].pop()
        return web.json_response(answer)

    async def health(self, request):
        return web.Response(text="ok")

    def __enter__(self) -> str:
        async def start():
            app = web.Application()
            app.add_routes([web.post("/v1/completions", self.completions), web.get("/health", self.health)])
            self.runner = web.AppRunner(app)
            await self.runner.setup()
            site = web.TCPSite(self.runner, "127.0.0.1", 0)
            await site.start()
            return f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"

        url = self.loop.run_until_complete(start())
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        return url

    def __exit__(self, *exc):
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(timeout=30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=30)


def test_http_engine_per_prompt_returns_the_same_groups_and_retries_a_short_answer(tmp_path):
    prompts, sampling = [[10, 11], [20], [30, 31, 32]], Sampling(n=4, max_tokens=3)
    with Grouping() as url:
        engine = HttpEngine(url, per_prompt=True, vocab_size=100, log_path=tmp_path / "c.jsonl",
                            retry=RetryPolicy(base_s=0.01, cap_s=0.02))
        out = engine.generate(prompts, sampling)
        m = engine.step_metrics()
        engine.close()
    for i, (ids, group) in enumerate(zip(prompts, out)):
        want = fake_answer({"prompt": ids, "max_tokens": 3, "n": 4}, "fake", vocab_size=100)["choices"]
        assert [c.token_ids for c in group] == [c["token_ids"] for c in want]
        assert all(c.prompt_index == i and c.logprobs == [-6.9] * 3 for c in group)
    assert m["client/requests"] == 3 and m["client/failed_attempts"] == 1 and m["client/max_attempts"] == 2
    events = [json.loads(x) for x in (tmp_path / "c.jsonl").read_text().splitlines()]
    assert [e["code"] for e in events if e["event"] == "fail"] == ["bad_answer"]
    assert sorted(e["request_id"] for e in events if e["event"] == "done") == ["s0-p0", "s0-p1", "s0-p2"]


def test_answers_read_the_same_with_orjson_or_json(monkeypatch):
    body = '{"choices":[{"token_logprobs":[NaN,-Infinity,-0.5]}],"big":123456789012345678901234567890}'
    want = json.loads(body)
    got = loads_answer(body)  # orjson refuses NaN, Infinity and integers past 64 bits: json reads them
    assert got["big"] == want["big"] and repr(got["choices"]) == repr(want["choices"])
    for loads in (json.loads, client._fast_loads):
        monkeypatch.setattr(client, "_fast_loads", loads)
        assert loads_answer('{"a": [1, 2.5, "x"]}') == {"a": [1, 2.5, "x"]}
        with pytest.raises(ValueError):
            loads_answer('{"choices": [{"te')  # a body cut short stays a failed attempt
