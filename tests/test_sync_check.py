"""--http-sync-check: every served engine's log-probs of a fixed answer, against the trainer's.

The engines here are stand-ins with weights of their own (a copy of the tiny model): they
load a weights file only through `/collective_rpc`, as vLLM's served engines do, and answer
`prompt_logprobs` from their copy. One of them can be made stale (it answers the sync but
keeps its weights), which is what the check must catch. The same check against real vLLM
engines runs in tests/test_http_sync_vllm.py.
"""

from __future__ import annotations

import asyncio
import copy
import threading

import pytest
import torch
from aiohttp import web
from fixtures_engines import perturb_like_an_update  # noqa: E402

from labkit.config import ConfigError, RunConfig
from labkit.engines.fake_server import fake_answer
from labkit.engines.http import HttpEngine
from labkit.engines.served_sync import LOAD_WEIGHTS_METHOD
from labkit.engines.sync_check import SyncCheckFailed, fixed_token_ids, trainer_logprobs
from labkit.run.metrics import METRICS
from labkit.trainer import train

CHECK = ["client/sync_check_abs_diff", "client/sync_check_engines_changed",
         "client/sync_check_engine_change", "client/sync_check_trainer_change",
         "client/sync_check_time"]


class ModelEngine:
    """A served engine with its own copy of `model`, on a port of its own in a thread.

    `stale=True`: it answers the weight sync but keeps its weights. `prompt_logprobs=False`:
    it answers like an engine that has none (labkit's fake engine). `workers`: the URLs its
    /list_workers names (it then stands in for a router too)."""

    def __init__(self, model, vocab_size: int, *, stale: bool = False, prompt_logprobs: bool = True):
        self.model = copy.deepcopy(model).eval()
        self.vocab_size, self.stale, self.prompt_logprobs = vocab_size, stale, prompt_logprobs
        self.workers: list[str] = []
        self.loads = 0
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.url = asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(timeout=60)

    async def _start(self) -> str:
        app = web.Application()
        app.add_routes([web.get("/health", self.health), web.get("/list_workers", self.list_workers),
                        web.post("/v1/completions", self.completions),
                        web.post("/collective_rpc", self.collective_rpc),
                        web.post("/reset_prefix_cache", self.health)])
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        return f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"

    async def health(self, request):
        return web.Response(text="ok")

    async def list_workers(self, request):
        return web.json_response({"urls": self.workers or [self.url]})

    async def collective_rpc(self, request):
        from safetensors.torch import load_file

        body = await request.json()
        assert body["method"] == LOAD_WEIGHTS_METHOD
        tensors = load_file(body["kwargs"]["path"])
        if not self.stale:
            self.model.load_state_dict(tensors, strict=False)
        self.loads += 1
        return web.json_response({"results": [{"tensors": len(tensors), "seconds": 0.0}]})

    async def completions(self, request):
        body = await request.json()
        if "prompt_logprobs" not in body:  # a rollout's answer: made-up tokens
            return web.json_response(fake_answer(body, "stand-in", self.vocab_size))
        answer = fake_answer({**body, "max_tokens": 1}, "stand-in", self.vocab_size)
        if self.prompt_logprobs:
            ids = body["prompt"]
            lp = trainer_logprobs(self.model, ids).tolist()
            answer["choices"][0]["prompt_logprobs"] = [None] + [
                {str(t): {"logprob": v, "rank": 1}} for t, v in zip(ids[1:], lp)]
        return web.json_response(answer)

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(timeout=60)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=60)


@pytest.fixture()
def tiny(tiny_model_dir):
    from labkit.models import load_policy, load_tokenizer

    policy = load_policy(str(tiny_model_dir), torch.float32, torch.device("cpu"))
    return policy, load_tokenizer(str(tiny_model_dir))


@pytest.fixture()
def two_engines(tiny):
    policy, _ = tiny
    engines = [ModelEngine(policy, policy.config.vocab_size) for _ in range(2)]
    engines[0].workers = [e.url for e in engines]  # the first one is the router too
    yield engines
    for e in engines:
        e.stop()


# ---------------------------------------------------------------------- the check itself
def test_the_check_sees_every_engine_take_the_weights_and_one_that_keeps_its_own(tiny, two_engines):
    policy, tokenizer = tiny
    first, second = two_engines
    engine = HttpEngine(first.url, engine_urls=[first.url, second.url], sync_dtype=torch.float32,
                        tokenizer=tokenizer, sync_check=True)
    engine.update_weights(policy)  # at start: the engines hold what the trainer holds
    start = engine.step_metrics()
    assert start["client/sync_check_abs_diff"] < 1e-6
    assert "client/sync_check_engines_changed" not in start  # nothing to have changed from yet

    perturb_like_an_update(policy, seed=1)
    engine.update_weights(policy)
    synced = engine.step_metrics()
    assert synced["client/sync_check_engines_changed"] == 2
    assert synced["client/sync_check_abs_diff"] < 1e-6
    assert synced["client/sync_check_trainer_change"] > 1e-3
    assert synced["client/sync_check_engine_change"] == pytest.approx(
        synced["client/sync_check_trainer_change"], rel=1e-4)

    second.stale = True  # answers the sync, keeps the weights it had
    perturb_like_an_update(policy, seed=2)
    engine.update_weights(policy)
    missed = engine.step_metrics()
    engine.close()
    assert first.loads == second.loads == 3
    assert missed["client/sync_check_engines_changed"] == 1
    assert missed["client/sync_check_engine_change"] == 0.0
    # the stale engine is as far from the trainer as the trainer moved in the step
    assert missed["client/sync_check_abs_diff"] > 1e-3
    assert missed["client/sync_check_abs_diff"] == pytest.approx(
        missed["client/sync_check_trainer_change"], rel=0.5)
    assert set(CHECK) <= set(METRICS)


def test_an_engine_without_prompt_logprobs_fails_the_check_naming_the_flag(tiny):
    policy, tokenizer = tiny
    bare = ModelEngine(policy, policy.config.vocab_size, prompt_logprobs=False)
    engine = HttpEngine(bare.url, tokenizer=tokenizer, sync_dtype=torch.float32, sync_check=True)
    try:
        with pytest.raises(SyncCheckFailed, match=f"engine {bare.url} gave no prompt log-probs.*"
                                                  f"--http-sync-check"):
            engine.update_weights(policy)
    finally:
        engine.close()
        bare.stop()


def test_without_a_tokenizer_the_fixed_answer_spreads_over_the_vocabulary():
    ids = fixed_token_ids(vocab_size=50)
    assert len(ids) == 32 and all(0 <= t < 50 for t in ids) and len(set(ids)) > 10
    with pytest.raises(ValueError, match="tokenizer or a vocab_size"):
        fixed_token_ids()


# ---------------------------------------------------------------------- in a run
def test_a_run_with_the_check_logs_it_after_every_step(tiny_cfg, two_engines):
    first, second = two_engines
    run = train(tiny_cfg.replace(rollout_mode="http", router_url=first.url, max_open_requests=4,
                                 http_sync_check=True, save_interval=-1))
    rows = run.metrics.to_dict("records")
    assert run.status["reason"] == "completed" and len(rows) == 2
    assert first.loads == second.loads == 3  # at start, and after each step
    for r in rows:
        assert set(r) <= set(METRICS), set(r) - set(METRICS)
        assert r["client/engines_synced"] == 2
        assert r["client/sync_check_engines_changed"] == 2
        assert r["client/sync_check_abs_diff"] < 1e-5
        assert r["client/sync_check_trainer_change"] > 0
        assert 0 < r["client/sync_check_time"] < r["perf/update_weights_time"]


def test_the_check_needs_rollouts_over_http():
    with pytest.raises(ConfigError, match="--http-sync-check .* needs --rollout-mode http"):
        RunConfig(http_sync_check=True).check()
    RunConfig(http_sync_check=True, rollout_mode="http", router_url="http://127.0.0.1:8000").check()
