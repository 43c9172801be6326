"""labkit serve: ports checked first, engines behind the router answer, nothing left after stop."""

from __future__ import annotations

import asyncio
import dataclasses
import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from labkit.cli import serve_config
from labkit.engines.base import Sampling
from labkit.engines.http import HttpEngine
from labkit.serving.client import RolloutClient
from labkit.serving.cluster import Cluster, ServeConfig, engine_command
from labkit.serving.processes import PortInUse, ServeError, check_ports_free, find_free_base_port, group_members

REPO = Path(__file__).parents[1]


from conftest import folder_with_a_labkit  # noqa: E402
from fixtures_engines import have_router, needs_router  # noqa: E402


def alive(pid: int) -> bool:
    """True while pid is a live process (a zombie counts as gone)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def fake_config(tmp_path, engines=2, router="vllm-router", **kw) -> ServeConfig:
    port = find_free_base_port(engines + 2)
    return ServeConfig(engines=engines, backend="fake", port=port, router=router,
                       log_dir=str(tmp_path / "serve"), startup_timeout_s=600, **kw)


def test_a_port_in_use_is_refused_before_anything_starts(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        taken = s.getsockname()[1]
        with pytest.raises(PortInUse, match=f"port {taken} .* in use.*--port"):
            check_ports_free("127.0.0.1", [taken])
        cfg = ServeConfig(engines=1, backend="fake", port=taken, log_dir=str(tmp_path / "s"))
        cluster = Cluster(cfg)
        with pytest.raises(PortInUse):
            cluster.start()
        assert cluster.procs == []


EAGER_64 = ("--enforce-eager", "--max-num-seqs", "64")


@pytest.mark.parametrize("argv", [
    ["--dtype", "float32", "--engine-args", "--enforce-eager", "--max-num-seqs", "64"],  # the rest
    ["--dtype", "float32", "--engine-args", "--enforce-eager --max-num-seqs 64"],  # one string
    ["--engine-args=--enforce-eager --max-num-seqs 64", "--dtype", "float32"],  # = form, then more
], ids=["rest-of-line", "quoted", "equals"])
def test_engine_args_that_start_with_a_dash_reach_the_engine(argv):
    cfg, _ = serve_config(argv)
    assert cfg.engine_args == EAGER_64 and cfg.dtype == "float32"
    assert tuple(engine_command(dataclasses.replace(cfg, backend="fake"), 8001)[-3:]) == EAGER_64
    assert serve_config(["--engine-args", "--enforce-eager"])[0].engine_args == ("--enforce-eager",)


def test_engines_without_router_answer_and_stop_cleanly(tmp_path):
    cfg = fake_config(tmp_path, engines=2, router="none")
    with Cluster(cfg) as cluster:
        pids = list(cluster.pids().values())
        assert len(pids) == 2 and all(alive(p) for p in pids)
        answers = asyncio.run(RolloutClient(cluster.url).run(
            [(f"r{i}", "/v1/completions", {"prompt": [i], "max_tokens": 3}) for i in range(5)]))
        assert all(len(a["choices"][0]["token_ids"]) == 3 for a in answers)
    assert not any(alive(p) for p in pids)
    assert all(group_members(p) == [] for p in pids)


@needs_router
def test_router_in_front_of_fake_engines_serves_an_http_engine(tmp_path):
    cfg = fake_config(tmp_path, engines=2)
    with Cluster(cfg) as cluster:
        pids = list(cluster.pids().values())
        assert len(pids) == 3
        engine = HttpEngine(cluster.url, max_open_requests=8, log_path=tmp_path / "client.jsonl")
        out = engine.generate([[1, 2], [3]], Sampling(n=4, max_tokens=5, seed=1))
        engine.close()
    assert [len(g) for g in out] == [4, 4] and all(len(c.token_ids) == 5 for g in out for c in g)
    assert not any(alive(p) for p in pids)


@pytest.mark.parametrize("one_by_one, order", [
    (False, ["spawn engine0", "spawn engine1", "ready engine0", "ready engine1"]),
    (True, ["spawn engine0", "ready engine0", "spawn engine1", "ready engine1"]),
])
def test_one_by_one_starts_each_engine_once_the_one_before_is_ready(tmp_path, monkeypatch,
                                                                    one_by_one, order):
    """Engines sharing a GPU: the second measures free memory only once the first holds its share."""
    import labkit.serving.cluster as cluster_mod

    seen = []
    spawn, healthy = cluster_mod.spawn, cluster_mod.wait_healthy
    monkeypatch.setattr(cluster_mod, "spawn", lambda name, *a: seen.append(f"spawn {name}") or spawn(name, *a))
    monkeypatch.setattr(cluster_mod, "wait_healthy",
                        lambda proc, t: (healthy(proc, t), seen.append(f"ready {proc.name}")))
    cfg = fake_config(tmp_path, engines=2, router="none", one_by_one=one_by_one)
    with Cluster(cfg):
        pass
    assert seen == order
    assert serve_config(["--one-by-one"])[0].one_by_one is True


HAS_ROUTER_MODULE = importlib.util.find_spec("vllm_router") is not None


@pytest.mark.skipif(not HAS_ROUTER_MODULE, reason="vllm-router is not installed")
def test_a_router_without_its_script_runs_as_this_pythons_module(tmp_path, monkeypatch):
    """A wheel unpacked with `pip install --target` elsewhere (the lent GPU machine) has no
    runnable vllm-router script: the router then starts as `python -m` and serves all the same."""
    import labkit.serving.cluster as cluster_mod

    monkeypatch.setattr(cluster_mod.shutil, "which", lambda *a, **k: None)
    command = cluster_mod.router_binary("vllm-router")
    assert command[0] == sys.executable and command[-2:] == ["-m", "vllm_router.launch_router"]
    with Cluster(fake_config(tmp_path, engines=2)) as cluster:
        engine = HttpEngine(cluster.url, max_open_requests=8)
        out = engine.generate([[1, 2]], Sampling(n=4, max_tokens=3))
        engine.close()
        router_log = (cluster.log_dir / "router.log").read_text()
    assert router_log.startswith(f"$ {sys.executable}") and "-m vllm_router.launch_router" in router_log
    assert [len(c.token_ids) for c in out[0]] == [3, 3, 3, 3]


def test_no_router_script_and_no_module_is_one_line_naming_the_fix(monkeypatch):
    import labkit.serving.cluster as cluster_mod

    monkeypatch.setattr(cluster_mod.shutil, "which", lambda *a, **k: None)
    monkeypatch.setattr(cluster_mod.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ServeError, match="vllm-router not found; pip install vllm-router.*--router none"):
        cluster_mod.router_binary("vllm-router")


def test_an_engine_that_cannot_start_is_reported_and_nothing_is_left(tmp_path):
    cfg = fake_config(tmp_path, engines=2, router="none", engine_args=("--no-such-flag",))
    cluster = Cluster(cfg)
    with pytest.raises(ServeError, match="engine0 exited with code 2 before it was healthy"):
        cluster.start()
    assert cluster.procs == []


def run_serve(tmp_path, *extra, background=False) -> tuple[subprocess.Popen, dict]:
    """Start `labkit serve` with a fake engine; return it and its serve.json. `background`:
    start it as a shell starts `cmd &`, with SIGINT ignored."""
    port = find_free_base_port(3)
    log_dir = tmp_path / "serve"
    cmd = [sys.executable, "-m", "labkit", "serve", "--backend", "fake", "--engines", "1",
           "--router", "vllm-router" if have_router() else "none", "--port", str(port),
           "--log-dir", str(log_dir), "--startup-timeout-s", "600", *extra]
    ignore = (lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)) if background else None
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, preexec_fn=ignore)
    state_file = log_dir / "serve.json"
    seen = []
    for line in proc.stdout:  # serve.json is written, then this line printed (or serve failed)
        seen.append(line)
        if line.startswith("labkit serve: router"):
            return proc, json.loads(state_file.read_text())
    proc.kill()  # its engines get SIGTERM when it dies (PR_SET_PDEATHSIG)
    raise AssertionError("labkit serve ended before it served:\n" + "".join(seen))


@pytest.mark.parametrize("sig,background", [(signal.SIGINT, False), (signal.SIGTERM, False),
                                            (signal.SIGINT, True)],
                         ids=["ctrl-c", "sigterm", "kill-int-when-started-in-the-background"])
def test_serve_stops_every_child_on_a_signal(tmp_path, sig, background):
    proc, state = run_serve(tmp_path, background=background)
    pids = list(state["pids"].values())
    assert all(alive(p) for p in pids)
    proc.send_signal(sig)
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, out
    assert "all engine and router processes stopped" in out
    assert not any(alive(p) for p in pids)


def test_serve_stops_all_when_an_engine_dies(tmp_path):
    proc, state = run_serve(tmp_path)
    os.kill(state["pids"]["engine0"], signal.SIGKILL)
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 1 and "engine0 exited" in out
    assert not any(alive(p) for p in state["pids"].values())


@pytest.mark.vllm
@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm is not importable")
@needs_router
def test_two_vllm_engines_behind_the_router(tmp_path):
    port = find_free_base_port(4)
    cfg = ServeConfig(engines=2, backend="vllm", port=port, max_model_len=256, max_num_seqs=4,
                      engine_args=("--enforce-eager",),
                      log_dir=str(tmp_path / "serve"))
    with Cluster(cfg) as cluster:
        pids = list(cluster.pids().values())
        engine = HttpEngine(cluster.url, max_open_requests=4)
        out = engine.generate([[1, 2, 3], [4, 5]], Sampling(n=2, max_tokens=4, seed=0))
    assert [len(g) for g in out] == [2, 2]
    assert all(0 < len(c.token_ids) <= 4 and c.logprobs and len(c.logprobs) == len(c.token_ids)
               for g in out for c in g)
    assert not any(alive(p) for p in pids)


@pytest.mark.parametrize("shadow", ["checkout", "package"])
def test_engines_start_from_a_folder_that_holds_something_named_labkit(tmp_path, monkeypatch, shadow):
    """`labkit serve` run from the folder that holds the checkout (`labkit/`, a namespace
    package to Python), or beside any package named labkit: the engines, started with
    `python -m labkit`, must still import the real labkit, not the folder."""
    monkeypatch.chdir(folder_with_a_labkit(tmp_path, shadow))
    with Cluster(fake_config(tmp_path, engines=1, router="none")) as cluster:
        url = cluster.engine_urls()[0]
        with urllib.request.urlopen(url + "/health", timeout=60) as answer:
            assert answer.status == 200


def test_the_engines_import_the_labkit_that_started_them():
    from labkit.serving import cluster

    cfg = ServeConfig(backend="fake")
    isolated = ["-P"] if sys.version_info >= (3, 11) else []
    assert engine_command(cfg, 8001)[:4] == [sys.executable, *isolated, "-m", "labkit"][:4]
    repo = Path(cluster.__file__).resolve().parents[2]
    assert (repo / "labkit" / "serving" / "cluster.py").is_file() and cluster.REPO == repo
    assert cluster.engine_env(cfg, 0)["PYTHONPATH"].split(os.pathsep)[0] == str(repo)


@pytest.mark.parametrize("flags, said", [
    (["--port", "99999"], "--port 99999: the router and 1 engine(s) take ports 99999..100000"),
    (["--port", "-5"], "--port -5: "),
    (["--duration", "-1"], "--duration -1: seconds to serve must be > 0"),
])
def test_serve_refuses_a_port_or_duration_it_cannot_use_in_one_line(tmp_path, capsys, flags, said):
    from labkit.cli import main

    assert main(["serve", "--backend", "fake", "--router", "none", "--engines", "1",
                 "--log-dir", str(tmp_path / "serve"), *flags]) == 2
    err = capsys.readouterr().err
    assert f"labkit serve: {said}" in err and "did not expect" not in err


def test_serve_refuses_a_log_dir_it_cannot_make(tmp_path, capsys):
    from labkit.cli import main

    (tmp_path / "a-file").write_text("")
    log_dir = tmp_path / "a-file" / "serve"
    assert main(["serve", "--backend", "fake", "--router", "none", "--engines", "1",
                 "--port", str(find_free_base_port(2)), "--log-dir", str(log_dir)]) == 2
    assert f"labkit serve: --log-dir {log_dir}: cannot create it (Not a directory)" in capsys.readouterr().err
