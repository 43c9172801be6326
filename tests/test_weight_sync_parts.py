"""A weight sync's parts in the run's log: where the file went, the trainer's and engines' times.

Two engines of our own (aiohttp, on a loop in a thread) take the sync as vLLM's dev
endpoints do: each reads the weights file with safetensors while the sync waits on it and
answers with its own seconds, as labkit.engines.served_sync does. The trainer's side must
then carry every part into the step's `client/weights_*` metrics and one `sync` line per
sync in client.jsonl, the sync at start (before the log has a file) included, and say once
where the file went.
"""

from __future__ import annotations

import asyncio
import json
import threading

import torch
from aiohttp import web
from safetensors.torch import load_file

from labkit.engines.http import HttpEngine
from labkit.engines.weight_sync import describe_folder
from labkit.engines.weights_file import plan_weights
from labkit.run.metrics import METRICS
from labkit.serving.replay import read_events


class SyncEngine:
    """An engine that loads the weights file it is sent and reports its own seconds."""

    def __init__(self, seconds: float, read_seconds: float):
        self.seconds, self.read_seconds = seconds, read_seconds
        self.loaded: list[dict[str, torch.Tensor]] = []
        self.resets = 0

    async def collective_rpc(self, request):
        body = await request.json()
        self.loaded.append(load_file(body["kwargs"]["path"]))  # the file is whole while it loads
        return web.json_response({"results": [{"tensors": len(self.loaded[-1]), "seconds": self.seconds,
                                               "read_seconds": self.read_seconds}]})

    async def reset(self, request):
        self.resets += 1
        return web.Response(status=200)

    async def start(self) -> str:
        app = web.Application()
        app.add_routes([web.post("/collective_rpc", self.collective_rpc),
                        web.post("/reset_prefix_cache", self.reset)])
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        return f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"


class Engines:
    """Run SyncEngines on their own loop in a thread, for the synchronous HttpEngine."""

    def __init__(self, *engines: SyncEngine):
        self.engines, self.loop = engines, asyncio.new_event_loop()

    def __enter__(self) -> list[str]:
        urls = [self.loop.run_until_complete(e.start()) for e in self.engines]
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        return urls

    def __exit__(self, *exc):
        for e in self.engines:
            asyncio.run_coroutine_threadsafe(e.runner.cleanup(), self.loop).result(timeout=30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=30)


def test_every_part_of_a_sync_is_in_the_metrics_and_the_client_log(tmp_path):
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 2))
    slow, fast = SyncEngine(0.25, 0.125), SyncEngine(0.05, 0.02)
    said: list[str] = []
    with Engines(slow, fast) as urls:
        engine = HttpEngine("http://127.0.0.1:9", engine_urls=urls, sync_dtype=torch.bfloat16,
                            notify=said.append)  # the router is never asked: engine_urls
        engine.update_weights(model)  # at start: the log has no file yet
        engine.log_to(tmp_path)
        with torch.no_grad():
            model[0].weight.add_(1.0)  # an optimizer step
        engine.begin_step(0)
        engine.update_weights(model)
        m = engine.step_metrics()
        engine.close()
    plan = plan_weights(model, torch.bfloat16)
    for e in (slow, fast):  # each engine read the trainer's weights of each sync, in bfloat16
        assert len(e.loaded) == 2 and e.resets == 2
        assert torch.equal(e.loaded[-1]["0.weight"], model[0].weight.detach().bfloat16())
    assert set(m) <= set(METRICS), set(m) - set(METRICS)
    assert m["client/engines_synced"] == 2 and m["client/weights_bytes"] == plan.bytes
    assert m["client/weights_engine_time"] == 0.25 and m["client/weights_engine_read_time"] == 0.125
    assert m["client/weights_load_time"] >= 0.0
    assert m["client/weights_gather_time"] + m["client/weights_file_time"] <= m["client/weights_write_time"]
    syncs = [json.loads(x) for x in (tmp_path / "client.jsonl").read_text().splitlines()]
    assert [e["event"] for e in syncs] == ["sync", "sync"] and [e["sync"] for e in syncs] == [1, 2]
    root = syncs[0]["folder"]
    assert m["client/weights_in_memory"] == int(describe_folder(root)["kind"] == "memory")
    assert syncs[1]["engine_s"] == {urls[0]: 0.25, urls[1]: 0.05}
    assert syncs[1]["engine_read_s"] == {urls[0]: 0.125, urls[1]: 0.02}
    assert syncs[1]["bytes"] == plan.bytes and syncs[1]["tensors"] == 4
    assert len(said) == 1 and said[0].startswith(f"weight sync through {root} (")
    assert read_events(tmp_path / "client.jsonl").unknown == 0  # replay knows the sync lines


def test_an_engine_counts_its_slowest_worker_and_zero_where_it_says_nothing():
    from labkit.engines.http import _per_engine

    results = {"tp2": [{"seconds": 0.5, "read_seconds": 0.2}, {"seconds": 0.75}],  # two workers
               "fake": [{"tensors": 3, "sum": 1.5, "seconds": 0.0}],  # labkit's fake engine
               "odd": [None, {"seconds": "soon"}]}
    assert _per_engine(results, "seconds") == {"tp2": 0.75, "fake": 0.0, "odd": 0.0}
    assert _per_engine(results, "read_seconds") == {"tp2": 0.2, "fake": 0.0, "odd": 0.0}
