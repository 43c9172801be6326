"""Rollouts over HTTP from the launcher: the flags, resume, client/ metrics, the weight sync.

The end-to-end test runs `train` with `--rollout-mode http` against fake engines behind
vllm-router (labkit.serving.cluster's fake backend): every answer goes through the router, and after
each optimizer step every engine reads the trainer's weights file. The fake engine prints
the sum of what it read, so the test checks it against the trainer's checkpoint. The same
path with real vLLM engines, and the log-prob proof, is in tests/test_http_sync_vllm.py.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from aiohttp import web

from labkit.config import ConfigError, RunConfig, config_from_args
from labkit.engines.http import HttpEngine
from labkit.engines.weight_sync import (
    STALE_SYNC_AGE_S,
    SYNC_FOLDER_PREFIX,
    WeightSyncFailed,
    make_sync_folder,
    remove_stale_sync_folders,
    sync_weights,
)
from labkit.engines.weights_file import write_weights
from labkit.run.checkpoint import latest_checkpoint
from labkit.run.log import RunLogError, open_run_folder
from labkit.run.metrics import METRICS
from labkit.serving.client import RouterUnavailable
from labkit.serving.cluster import Cluster, ServeConfig
from labkit.serving.processes import find_free_base_port
from labkit.trainer import train

REPO = Path(__file__).parents[1]

from fixtures_engines import have_router  # noqa: E402

CLIENT = ["client/requests", "client/failed_attempts", "client/503s", "client/retried_requests",
          "client/max_attempts", "client/stalls", "client/engines_synced", "client/weights_write_time",
          "client/weights_gather_time", "client/weights_file_time", "client/weights_bytes",
          "client/weights_in_memory", "client/weights_load_time", "client/weights_engine_time",
          "client/weights_engine_read_time"]


# ---------------------------------------------------------------------- flags
def test_http_mode_flags_parse_and_default_to_colocate():
    assert RunConfig().rollout_mode == "colocate" and RunConfig().max_open_requests == 512
    cfg = config_from_args(["--rollout-mode", "http", "--router-url", "http://127.0.0.1:8000",
                            "--max-open-requests", "64"], env={})
    assert (cfg.rollout_mode, cfg.router_url, cfg.max_open_requests) == ("http", "http://127.0.0.1:8000", 64)


def test_http_mode_without_router_url_is_refused_naming_the_fix():
    with pytest.raises(ConfigError, match=r"--rollout-mode http needs --router-url.*labkit serve"):
        config_from_args(["--rollout-mode", "http"], env={})
    with pytest.raises(ConfigError, match="--router-url '127.0.0.1:8000' must start with http://"):
        RunConfig(rollout_mode="http", router_url="127.0.0.1:8000").check()
    with pytest.raises(ConfigError, match="--max-open-requests must be a whole number >= 1"):
        RunConfig(max_open_requests=0).check()


def test_a_run_resumes_against_a_new_router(tmp_path):
    cfg = RunConfig(rollout_mode="http", router_url="http://127.0.0.1:8000", output_dir=str(tmp_path),
                    run_name="r")
    run_dir, _, _ = open_run_folder(cfg, None)
    moved = cfg.replace(router_url="http://10.0.0.2:9000", max_open_requests=64)
    assert open_run_folder(moved, run_dir)[0] == run_dir
    with pytest.raises(RunLogError, match="--rollout-mode: folder has 'http', given 'colocate'"):
        open_run_folder(moved.replace(rollout_mode="colocate"), run_dir)  # still refused


# ---------------------------------------------------------------------- client/ metrics
def test_step_metrics_count_the_events_of_one_step_then_start_again():
    engine = HttpEngine("http://127.0.0.1:9")  # never contacted: events are fed by hand
    emit = engine.log.emit
    emit("fail", request_id="a", attempt=1, status=503, code="no_available_workers")
    emit("fail", request_id="a", attempt=2, status=None, code="connection_error")
    emit("done", request_id="a", attempts=3)
    emit("fail", request_id="b", attempt=1, status=503, code="no_available_workers")
    emit("done", request_id="b", attempts=2)
    emit("done", request_id="c", attempts=1)
    emit("stall", reason="no request completed for 60 s")  # the live watchdog's flag
    m = engine.step_metrics()
    assert {k: m[k] for k in CLIENT[:6]} == {
        "client/requests": 3, "client/failed_attempts": 3, "client/503s": 2,
        "client/retried_requests": 2, "client/max_attempts": 3, "client/stalls": 1}
    assert set(m) == set(CLIENT) and set(m) <= set(METRICS)
    assert engine.step_metrics()["client/requests"] == 0
    engine.close()


# ---------------------------------------------------------------------- engines that take weights
def test_served_vllm_engines_start_ready_for_the_weight_sync(tiny_model_dir):
    import importlib

    from labkit.engines.served_sync import LOAD_WEIGHTS_METHOD
    from labkit.serving.cluster import WORKER_EXTENSION, engine_command, engine_env

    cfg = ServeConfig(backend="vllm", model=str(tiny_model_dir), vllm_python="python", dtype="float32")
    cmd = " ".join(engine_command(cfg, 8001))
    assert f"--worker-extension-cls {WORKER_EXTENSION}" in cmd and "--dtype float32" in cmd
    assert "--logprobs-mode processed_logprobs" in cmd  # the trainer's log-probs, after temperature
    assert engine_env(cfg, 0)["VLLM_SERVER_DEV_MODE"] == "1"  # /collective_rpc, /reset_prefix_cache
    module, _, name = WORKER_EXTENSION.rpartition(".")
    assert callable(getattr(getattr(importlib.import_module(module), name), LOAD_WEIGHTS_METHOD))


# ---------------------------------------------------------------------- weight sync failures
class BareEngine:
    """A vLLM server started without VLLM_SERVER_DEV_MODE: no /collective_rpc, no /list_workers."""

    async def health(self, request):
        return web.Response(text="ok")

    async def start(self) -> str:
        app = web.Application()
        app.add_routes([web.get("/health", self.health)])
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        return f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"


def test_sync_to_an_engine_without_dev_mode_names_the_fix(tmp_path):
    async def go():
        server = BareEngine()
        url = await server.start()
        try:
            await sync_weights(url, str(tmp_path / "w.safetensors"))
        finally:
            await server.runner.cleanup()

    with pytest.raises(WeightSyncFailed, match=r"has no /collective_rpc.*VLLM_SERVER_DEV_MODE=1.*labkit serve"):
        asyncio.run(go())


def test_sync_to_a_router_that_does_not_answer_fails_fast(tmp_path):
    port = find_free_base_port(1)
    with pytest.raises(RouterUnavailable, match=f"127.0.0.1:{port}.*labkit serve"):
        asyncio.run(sync_weights(f"http://127.0.0.1:{port}", str(tmp_path / "w.safetensors")))


def test_weights_file_holds_a_tied_weight_once_in_the_asked_dtype(tmp_path):
    from safetensors.torch import load_file

    model = torch.nn.Sequential(torch.nn.Embedding(5, 3), torch.nn.Linear(3, 5))
    model[1].weight = model[0].weight  # a tied LM head: the file has it once, as the embedding
    path = tmp_path / "w.safetensors"
    assert write_weights(model, path, torch.bfloat16) == 2
    got = load_file(path)
    assert set(got) == {"0.weight", "1.bias"} and got["1.bias"].dtype == torch.bfloat16
    assert torch.equal(got["0.weight"], model[0].weight.detach().bfloat16())
    assert [f.name for f in tmp_path.iterdir()] == ["w.safetensors"]  # no half-written file left


# ---------------------------------------------------------------------- weights left behind
KILLED_MID_SYNC = """
import os, signal, sys
from labkit.engines.weight_sync import make_sync_folder
folder = make_sync_folder(sys.argv[1])
(folder / "weights-0.safetensors.part").write_bytes(b"half a file")
os.kill(os.getpid(), signal.SIGKILL)
"""


def killed_trainer_folder(root: Path, age_s: float = 0.0) -> Path:
    """The sync folder a trainer left when it was killed (SIGKILL) while writing weights."""
    child = subprocess.Popen([sys.executable, "-c", KILLED_MID_SYNC, str(root)], cwd=REPO)
    assert child.wait(timeout=60) == -signal.SIGKILL
    (folder,) = [d for d in root.iterdir() if d.name.startswith(f"{SYNC_FOLDER_PREFIX}{child.pid}-")]
    os.utime(folder, (time.time() - age_s,) * 2)
    return folder


def test_a_folder_left_by_a_trainer_killed_mid_sync_is_removed_once_stale(tmp_path):
    left = killed_trainer_folder(tmp_path)
    mine = make_sync_folder(str(tmp_path))  # this process is alive: kept
    no_pid = tmp_path / f"{SYNC_FOLDER_PREFIX}abc123"  # an older labkit's name: kept
    no_pid.mkdir()
    assert remove_stale_sync_folders([tmp_path]) == []  # young: its trainer may be elsewhere
    for d in (left, mine, no_pid):
        os.utime(d, (time.time() - STALE_SYNC_AGE_S - 1,) * 2)
    assert remove_stale_sync_folders([tmp_path]) == [left.resolve()]
    assert sorted(tmp_path.iterdir()) == sorted([mine, no_pid])


def test_a_failed_sync_leaves_no_weights_and_the_first_removes_stale_folders(tmp_path, monkeypatch):
    import tempfile

    from labkit.engines import http

    killed_trainer_folder(tmp_path, age_s=STALE_SYNC_AGE_S + 1)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(http, "fast_tmp", lambda need_bytes: None)  # the temp folder, not /dev/shm
    engine = HttpEngine(f"http://127.0.0.1:{find_free_base_port(1)}")  # nothing listens
    with pytest.raises(RouterUnavailable):
        engine.update_weights(torch.nn.Linear(2, 2))
    assert list(tmp_path.iterdir()) == []


def test_a_write_cut_short_leaves_no_part_file_in_weights_dir(tmp_path, monkeypatch):
    from labkit.engines import weights_file

    def cut_short(path, chunks):
        Path(path).write_bytes(b"half a file")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(weights_file, "write_chunks", cut_short)
    shared = tmp_path / "shared"
    shared.mkdir()
    engine = HttpEngine("http://127.0.0.1:9", weights_dir=shared)  # never contacted
    with pytest.raises(OSError, match="No space left"):
        engine.update_weights(torch.nn.Linear(2, 2))
    assert list(shared.iterdir()) == []


# ---------------------------------------------------------------------- the launcher end to end
def loads(log: Path) -> list[float]:
    """The sums of the weights files a fake engine read, in order."""
    return [float(x) for x in re.findall(r"loaded \d+ tensors, sum (\S+),", log.read_text())]


@pytest.mark.skipif(not have_router(), reason="vllm-router is not installed")
def test_launch_over_http_syncs_every_engine_after_every_step(tiny_cfg, tiny_model_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    vocab = AutoModelForCausalLM.from_pretrained(tiny_model_dir).config.vocab_size
    cfg = ServeConfig(engines=2, backend="fake", port=find_free_base_port(4), fake_delay_s=0.01,
                      fake_vocab_size=vocab, log_dir=str(tmp_path / "serve"), startup_timeout_s=600)
    with Cluster(cfg) as cluster:
        run = train(tiny_cfg.replace(rollout_mode="http", router_url=cluster.url,
                                     max_open_requests=4, save_interval=2))
        engine_logs = [cluster.log_dir / f"engine{i}.log" for i in range(2)]
    rows = run.metrics.to_dict("records")
    assert run.status["reason"] == "completed" and len(rows) == 2
    for r in rows:
        assert set(r) <= set(METRICS), set(r) - set(METRICS)
        assert r["client/requests"] == 8  # 2 prompts x 4 answers, one request each
        assert r["client/failed_attempts"] == 0 and r["client/max_attempts"] == 1
        assert r["client/engines_synced"] == 2
        assert r["perf/update_weights_time"] > 0
        assert r["client/weights_bytes"] > 0 and r["client/weights_in_memory"] in (0, 1)
        assert 0 <= r["client/weights_gather_time"] + r["client/weights_file_time"] <= r["client/weights_write_time"]
    events = [json.loads(x) for x in (run.dir / "client.jsonl").read_text().splitlines()]
    assert sum(e["event"] == "done" for e in events) == 16
    syncs = [e for e in events if e["event"] == "sync"]  # at start, then after each step
    assert [e["sync"] for e in syncs] == [1, 2, 3] and {e["kind"] for e in syncs} <= {"memory", "disk", "unknown"}
    assert all(len(e["engine_s"]) == 2 and e["bytes"] == rows[0]["client/weights_bytes"] for e in syncs)
    # each engine read the weights at the start and after each of the 2 steps; the last
    # file is the policy the trainer saved, the first the model it started from
    _, path = latest_checkpoint(run.dir)
    final = sum(float(t.double().sum()) for t in torch.load(path, weights_only=False)["model"].values())
    start = sum(float(t.double().sum()) for t in
                AutoModelForCausalLM.from_pretrained(tiny_model_dir).state_dict().values())
    for log in engine_logs:
        sums = loads(log)
        assert len(sums) == 3, log.read_text()[-2000:]
        assert sums[0] == pytest.approx(start, rel=1e-9, abs=1e-6)
        assert sums[-1] == pytest.approx(final, rel=1e-9, abs=1e-6)
        assert abs(sums[-1] - sums[0]) > 1e-3  # the optimizer steps changed what was sent


def test_engines_that_stop_before_the_weight_sync_keep_the_step_and_name_the_sync(
        tiny_cfg, tiny_model_dir, tmp_path, monkeypatch):
    """`labkit serve` stops between step 0's update and its weight sync: the status names the
    sync (not the optimizer step), step 0 is logged and checkpointed, and a resume against
    new engines goes on with step 1."""
    from transformers import AutoModelForCausalLM

    from labkit.errors import LabkitError

    vocab = AutoModelForCausalLM.from_pretrained(tiny_model_dir).config.vocab_size

    def serve(name):
        return Cluster(ServeConfig(engines=1, backend="fake", router="none", fake_delay_s=0.01,
                                   port=find_free_base_port(3), fake_vocab_size=vocab,
                                   log_dir=str(tmp_path / name), startup_timeout_s=600))

    first = serve("serve1").start()
    real_sync, syncs = HttpEngine.update_weights, []

    def sync(self, model):  # the first sync is at start; the second, after step 0's update
        syncs.append(1)
        if len(syncs) == 2:
            first.stop()
        return real_sync(self, model)

    monkeypatch.setattr(HttpEngine, "update_weights", sync)
    cfg = tiny_cfg.replace(rollout_mode="http", router_url=first.url, max_open_requests=4)
    try:
        with pytest.raises(LabkitError, match="during the weight sync|does not answer"):
            train(cfg)
    finally:
        first.stop()
    run_dir = Path(cfg.output_dir) / cfg.run_name
    status = json.loads((run_dir / "status.json").read_text())
    assert status["reason"] == "error" and status["last_step"] == 0
    assert status["message"].startswith("the weight sync to the engines after step 0 failed: ")
    assert "optimizer step" not in status["message"]
    assert latest_checkpoint(run_dir)[0] == 0
    monkeypatch.setattr(HttpEngine, "update_weights", real_sync)
    with serve("serve2") as second:
        resumed = train(cfg.replace(router_url=second.url), resume=run_dir)
    assert resumed.metrics["rollout/step"].tolist() == [0, 1]
    assert resumed.status["reason"] == "completed"
