"""labkit.machine.placement: a sweep's runs on every GPU, as many on each as its free memory holds.

The machine is simulated: the driver's answers (how many GPUs, each one's free GiB) are
monkeypatched, and a run's process is a fake child (FAKE_RUN) that writes its run folder,
says where it started (the GPU its CUDA_VISIBLE_DEVICES names) and ends when the test
writes `end` in its folder, or on the sweep's SIGINT. Every wait is for an event, with a
deadline.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from pathlib import Path

import pytest

from labkit import sweep
from labkit.config import ConfigError
from labkit.machine import memory, placement

QWEN05 = memory.ModelShape(params=494_032_768, vocab=151_936, layers=24, hidden=896)
# What a GPU with this much free holds of the tiny config's runs, sized as the recipe's model
# (each run: 25.8 GiB checkpointed at 24,576 tokens; 52.1 plain): 68 GiB two, 40 GiB one,
# 10 GiB none. test_what_a_gpu_holds checks these against the plan.
HOLDS_TWO, HOLDS_ONE, HOLDS_NONE = 68.0, 40.0, 10.0
DEADLINE_S = 600.0  # a bound for a broken test, not the expected time

FAKE_RUN = '''
import json, os, signal, sys, time
from pathlib import Path

spec = Path(sys.argv[1])
cfg = json.loads(spec.read_text())
spec.unlink()
run = Path(cfg["output_dir"]) / cfg["run_name"]
run.mkdir(parents=True, exist_ok=True)
(run / "config.json").write_text(json.dumps(cfg))
stopped = []
signal.signal(signal.SIGINT, lambda *a: stopped.append(1))
readies = Path(cfg["output_dir"]) / ".ready"
ready = os.environ.get("LABKIT_READY_FILE")
start = {"run": cfg["run_name"], "gpu": os.environ.get("CUDA_VISIBLE_DEVICES"),
         "order": os.environ.get("CUDA_DEVICE_ORDER"), "resume": (sys.argv[2:] or [None])[0],
         "ready_file": ready, "evaluator": os.environ.get("LABKIT_START_EVALUATOR"),
         "ready_before": sorted(p.name for p in readies.iterdir()) if readies.is_dir() else []}
with open(Path(cfg["output_dir"]) / "starts.jsonl", "a") as f:
    f.write(json.dumps(start) + "\\n")
end = time.monotonic() + 600
while not stopped and not (run / "end").exists() and time.monotonic() < end:
    if ready and (run / "ready").exists() and not os.path.exists(ready):
        Path(ready).parent.mkdir(parents=True, exist_ok=True)
        Path(ready).write_text("ready")  # as labkit.run.ready.say, when the test says so
    time.sleep(0.02)
how = "signal" if stopped else (run / "end").read_text() if (run / "end").exists() else "error"
if how == "fail":
    print("ValueError: a made-up failure")
    sys.exit(1)
status = {"reason": how, "last_step": -1, "message": "", "signal": "SIGINT" if stopped else None}
(run / "status.json").write_text(json.dumps(status))
sys.exit(130 if stopped else 0)
'''


@pytest.fixture()
def machine(monkeypatch):
    """machine(free, ...): a machine whose GPUs have that many GiB free (None: unreadable),
    runs that use vLLM on them, the recipe model's shape; returns the GPUs asked about."""
    asked = []

    def make(*free):
        monkeypatch.setattr(memory, "gpu_count", lambda: len(free))
        monkeypatch.setattr(memory, "gpu_free_gib",
                            lambda index=0: asked.append(str(index)) or free[int(index)])
        return asked

    for name in ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", placement.ENV):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(sweep, "_on_gpu", lambda cfg: True)
    monkeypatch.setattr(memory.ModelShape, "of", classmethod(lambda cls, path: QWEN05))
    return make


@pytest.fixture()
def fake_runs(tmp_path, monkeypatch):
    """Each run's process is FAKE_RUN; returns the file that lists where each one started."""
    script = tmp_path / "fake_run.py"
    script.write_text(FAKE_RUN)
    monkeypatch.setattr(sweep, "_command", lambda spec, resume_dir: [
        sys.executable, str(script), str(spec), *([resume_dir] if resume_dir else [])])
    return tmp_path / "runs" / "starts.jsonl"


def _starts(path: Path) -> list[dict]:
    """Where each run started, in order (a line still being written is not read yet)."""
    lines = path.read_text().splitlines(keepends=True) if path.exists() else []
    return [json.loads(x) for x in lines if x.endswith("\n")]


def _wait_for_starts(path: Path, n: int) -> list[dict]:
    end = time.monotonic() + DEADLINE_S
    while len(_starts(path)) < n:
        if time.monotonic() > end:
            raise AssertionError(f"{n} runs started: not within {DEADLINE_S:.0f} s "
                                 f"({len(_starts(path))} did)")
        time.sleep(0.02)
    return _starts(path)


def _end(cfg, name: str, how: str = "completed") -> None:
    """Tell the fake run `name` to end `how` (whole, so that it never reads the file half written)."""
    _say(Path(cfg.output_dir) / name / "end", how)


def _say(path: Path, text: str) -> None:
    path.with_suffix(".tmp").write_text(text)
    path.with_suffix(".tmp").replace(path)


def _sweep_beside(script, cfgs, let_go, **sweep_kwargs):
    """run_sweep(cfgs) with `script` driving the runs beside it (_driven); fails the test
    with the script's own failure, if any. Returns the sweep's slots."""
    thread, failed = _driven(script, let_go)
    slots = sweep.run_sweep(cfgs, **sweep_kwargs)
    thread.join(timeout=60)
    assert not failed, failed
    return slots


def _ended_all(tiny_cfg, cfgs):
    """A let_go for _driven: end every run, those the sweep starts later too (each finds its
    `end` written as it starts), so that a failed test never waits on a held run."""
    def let_go():
        for c in cfgs:
            (Path(c.output_dir) / c.run_name).mkdir(parents=True, exist_ok=True)
            _end(tiny_cfg, c.run_name)

    return let_go


def _driven(script, let_go):
    """Run `script` in a thread beside the sweep; should it fail (a deadline), note why and
    let every run go (`let_go`), so that the test fails rather than hangs."""
    failed = []

    def body():
        try:
            script()
        except Exception as e:  # said by the test's assertion
            failed.append(f"{e.__class__.__name__}: {e}")
            let_go()

    thread = threading.Thread(target=body, daemon=True)
    thread.start()
    return thread, failed


def _configs(tiny_cfg, n: int):
    return [tiny_cfg.replace(run_name=f"r{i}") for i in range(n)]


# ----------------------------------------------------------------------------- the plan
def test_what_a_gpu_holds(tiny_cfg, machine):
    machine(HOLDS_TWO, HOLDS_ONE, HOLDS_NONE)
    fresh = _configs(tiny_cfg, 6)
    holds = [placement._holds(fresh, [], QWEN05, f, 6) for f in (HOLDS_TWO, HOLDS_ONE, HOLDS_NONE)]
    assert holds == [2, 1, 0]
    # Runs can wait on several GPUs: no more at once for a smaller token budget. Six would
    # fit on 139 GiB at a smaller budget (and do on one GPU, where none waits); five keep it.
    six = placement.shared_gpu(fresh[0], QWEN05, 6, 139.0)
    assert memory.fits(six, QWEN05, 6, 139.0) and six.max_tokens_per_gpu < fresh[0].max_tokens_per_gpu
    assert placement._holds(fresh, [], QWEN05, 139.0, 6) == 5
    assert placement._holds(fresh, [], QWEN05, 24.0, 6) == 1  # one alone: a smaller budget, then
    assert placement.share_out(6, [2, 2]) == [2, 2]
    assert placement.share_out(4, [4, 4]) == [2, 2]  # evenly: each run gets more memory
    assert placement.share_out(4, [1, 4]) == [1, 3]


def test_one_gpu_takes_every_run_at_once_as_before(tiny_cfg, machine, capsys):
    asked = machine(139.0)
    plan = placement.plan(_configs(tiny_cfg, 4), [])
    assert [(g.id, g.seats) for g in plan.gpus] == [("0", 4)] and asked == ["0"]
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 1 and out[0].startswith(
        "labkit: 4 runs share the GPU (139 GiB free): each with gradient checkpointing, "
        "24,576 tokens a micro-batch, a KV cache of 8 GiB; planned 25.8 GiB")


def test_gpus_limits_the_gpus_the_runs_use(tiny_cfg, machine, monkeypatch, capsys):
    asked = machine(139.0, 139.0, 139.0, 139.0)
    plan = placement.plan(_configs(tiny_cfg, 4), [], placement.requested([1, 3]))
    assert [(g.id, g.seats) for g in plan.gpus] == [("1", 2), ("3", 2)] and asked == ["1", "3"]
    assert "4 runs on GPUs 1, 3: 4 at once" in capsys.readouterr().out
    monkeypatch.setenv(placement.ENV, "2")  # one GPU: the one-GPU plan, on GPU 2
    plan = placement.plan(_configs(tiny_cfg, 4), [], placement.requested())
    assert [(g.id, g.seats) for g in plan.gpus] == [("2", 4)]
    assert capsys.readouterr().out.startswith("labkit: 4 runs share the GPU (139 GiB free)")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,3")  # what the user's environment allows
    assert placement.gpu_ids(None) == ["0", "3"]
    assert placement.gpu_ids(["1"]) == ["1"]  # --gpus says, in nvidia-smi's numbers


@pytest.mark.parametrize("value, said", [
    ("0,0", "gpus 0,0: GPU 0 is listed twice; list each GPU once"),
    ("0,", "gpus '0,': list GPU numbers (as nvidia-smi numbers them) between commas"),
    ([-1], "gpus '-1': list GPU numbers"),
    ("0,a", "gpus '0,a': 'a' is not a GPU; list GPU numbers"),
    ("7", "GPU 7 is not on this machine (its GPUs are 0-1, as nvidia-smi numbers them)"),
])
def test_gpus_that_cannot_be_used_are_one_line(tiny_cfg, machine, value, said):
    machine(139.0, 139.0)
    with pytest.raises(ConfigError) as e:
        placement.gpu_ids(placement.requested(value))
    assert said in str(e.value) and "\n" not in str(e.value)


def test_a_gpu_another_program_fills_is_skipped_in_one_line(tiny_cfg, machine, capsys):
    machine(HOLDS_NONE, 139.0)
    plan = placement.plan(_configs(tiny_cfg, 3), [])
    assert [(g.id, g.seats) for g in plan.gpus] == [("1", 3)]
    captured = capsys.readouterr()
    # the least a run takes: checkpointed at the default budget (none smaller fits either)
    assert captured.err.strip() == "labkit: GPU 0 is skipped: 10.0 GiB free, and one run needs 23.0 GiB"
    assert "labkit: 3 runs on GPU 1: 3 at once" in captured.out


def test_unreadable_free_memory_shares_the_runs_out_without_the_check(tiny_cfg, machine, capsys):
    machine(None, None)
    plan = placement.plan(_configs(tiny_cfg, 5), [])
    assert [(g.id, g.seats) for g in plan.gpus] == [("0", 3), ("1", 3)]
    assert "could not be read; the runs are shared out over GPUs 0, 1 without the check" in \
        capsys.readouterr().err


def test_nothing_starts_when_no_gpu_holds_one_run(tiny_cfg, machine, monkeypatch):
    machine(HOLDS_NONE, 12.0)
    started = []
    monkeypatch.setattr(sweep, "_start", lambda *a: started.append(a))
    with pytest.raises(memory.GPUMemoryError) as e:
        sweep.launch_many(_configs(tiny_cfg, 3))
    message = str(e.value)
    assert message.startswith("no GPU can hold one run: one needs 23.0 GiB") and "\n" not in message
    assert "the most free is 12.0 GiB (GPU 1; 95% usable)" in message
    assert message.endswith("nothing was started")
    assert started == [] and not Path(tiny_cfg.output_dir).exists()


# ----------------------------------------------------------------------------- the runs
def test_runs_go_to_every_gpu_and_the_rest_wait_for_a_place(tiny_cfg, machine, fake_runs, capsys):
    """6 runs, 2 GPUs that hold 2 each: 4 start, spread over both; a run that fails frees
    its place for the next waiting run, as does one that completes."""
    machine(HOLDS_TWO, HOLDS_TWO)
    cfgs = _configs(tiny_cfg, 6)
    seen = {}

    def script():
        seen["first"] = _wait_for_starts(fake_runs, 4)
        seen["waiting"] = [c.run_name for c in cfgs if (Path(c.output_dir) / c.run_name).exists()]
        _end(tiny_cfg, "r1", "fail")
        seen["fifth"] = _wait_for_starts(fake_runs, 5)[4]
        _end(tiny_cfg, "r0")
        seen["sixth"] = _wait_for_starts(fake_runs, 6)[5]
        for name in ("r2", "r3", "r4", "r5"):
            _end(tiny_cfg, name)

    slots = _sweep_beside(script, cfgs, _ended_all(tiny_cfg, cfgs))
    assert sorted((s["run"], s["gpu"], s["order"]) for s in seen["first"]) == [
        ("r0", "0", "PCI_BUS_ID"), ("r1", "1", "PCI_BUS_ID"),
        ("r2", "0", "PCI_BUS_ID"), ("r3", "1", "PCI_BUS_ID")]
    assert seen["waiting"] == ["r0", "r1", "r2", "r3"]  # r4 and r5 not started yet
    assert (seen["fifth"]["run"], seen["fifth"]["gpu"]) == ("r4", "1")  # r1's place
    assert (seen["sixth"]["run"], seen["sixth"]["gpu"]) == ("r5", "0")  # r0's place
    assert [s.outcome.split(":")[0] for s in slots] == ["completed", "failed", *["completed"] * 4]
    assert [s.gpu for s in slots] == ["0", "1", "0", "1", "1", "0"]
    captured = capsys.readouterr()
    assert "labkit: 6 runs on GPUs 0, 1: 4 at once, 2 wait for a place" in captured.out
    assert "labkit: GPUs 0, 1 (each): 2 runs share the GPU (68 GiB free)" in captured.out
    assert ("6 runs: 5 completed (r0 on GPU 0, r2 on GPU 0, r3 on GPU 1, r4 on GPU 1, r5 on "
            "GPU 0); 1 failed (r1 on GPU 1 (ValueError: a made-up failure))") in captured.out
    assert "run r1 failed: ValueError: a made-up failure" in captured.err


def test_a_stop_starts_no_waiting_run_and_resume_goes_on_on_any_gpu(tiny_cfg, machine, fake_runs,
                                                                      capsys):
    """4 runs, 2 GPUs that hold 1 each: a stop while 2 wait stops the 2 running and starts
    neither waiting one. Resumed with GPU 0 full (another program took it), all four go to
    GPU 1: the stopped two continue their folders there, the other two start."""
    machine(HOLDS_ONE, HOLDS_ONE)
    cfgs = _configs(tiny_cfg, 4)
    folders = [Path(c.output_dir) / c.run_name for c in cfgs]

    def stop():
        _wait_for_starts(fake_runs, 2)
        os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C on the sweep

    slots = _sweep_beside(stop, cfgs, lambda: [_say(f / "end", "completed") for f in folders if f.exists()])
    assert [(s.outcome, s.gpu) for s in slots] == [("stopped", "0"), ("stopped", "1"),
                                                   ("not started", None), ("not started", None)]
    assert sweep.sweep_exit_code(slots) == 130
    assert len(_starts(fake_runs)) == 2 and not folders[2].exists() and not folders[3].exists()
    assert "2 stopped (r0 on GPU 0, r1 on GPU 1); 2 not started (r2, r3)" in capsys.readouterr().out

    machine(HOLDS_NONE, 139.0)

    def finish():
        for start in _wait_for_starts(fake_runs, 6)[2:]:
            _end(tiny_cfg, start["run"])

    slots = _sweep_beside(finish, cfgs, lambda: [_say(f / "end", "completed") for f in folders
                                                 if f.exists()], resume=True)
    again = {s["run"]: (s["gpu"], s["resume"]) for s in _starts(fake_runs)[2:]}
    assert again == {"r0": ("1", str(folders[0])), "r1": ("1", str(folders[1])),
                     "r2": ("1", None), "r3": ("1", None)}
    assert [s.outcome for s in slots] == ["completed"] * 4
    captured = capsys.readouterr()
    # the resumed runs keep the settings they had (25.8 GiB): the most one run needs
    assert "labkit: GPU 0 is skipped: 10.0 GiB free, and one run needs 25.8 GiB" in captured.err
    assert "4 runs: 4 completed (r0, r1, r2, r3)" in captured.out  # one GPU used: none named


# ----------------------------------------------------------------------------- runs of several sizes
QWEN05_KV = memory.ModelShape(params=494_032_768, vocab=151_936, layers=24, hidden=896,
                              kv_bytes_per_token=2 * 24 * 2 * 64 * 2)  # 2 KV heads of 64, bf16


def _study(tiny_cfg, sizes=(4, 8, 16), seeds=(1, 2, 3)):
    """The group-size study's runs, shaped as the recipe (32 prompts, answers of up to 1,024
    tokens), in the sweep's order: each group size, each seed."""
    return [tiny_cfg.replace(run_name=f"n{n}-s{s}", rollout_batch_size=32, n_samples_per_prompt=n,
                             global_batch_size=32 * n, rollout_max_response_len=1024, seed=s)
            for n in sizes for s in seeds]


def test_a_rollout_s_kv_cache_is_what_its_sequences_need(tiny_cfg):
    """Every sequence at its longest (256 prompt + 1,024 answer tokens, 12 KiB a token for
    Qwen2.5-0.5B): 32 x 4 needs 1.9 GiB, 32 x 8 3.75, 32 x 16 7.5, rounded up to half a GiB."""
    kv = {c.n_samples_per_prompt: memory.kv_cache_gib(c, QWEN05_KV) for c in _study(tiny_cfg, seeds=(1,))}
    assert kv == {4: 2.0, 8: 4.0, 16: 7.5}
    assert memory.kv_cache_gib(tiny_cfg, QWEN05_KV) == 1.0  # at least 1 GiB
    assert memory.kv_cache_gib(tiny_cfg, QWEN05) == memory.DEFAULT_KV_CACHE_GIB  # size unknown


def test_nine_runs_of_three_sizes_share_one_gpu_by_what_each_needs(tiny_cfg, machine, monkeypatch,
                                                                    capsys):
    """4, 8 and 16 answers x 3 seeds on one H200 (139 GiB free): each run planned with its own
    KV cache (19.8, 21.8 and 25.3 GiB), at most six at once (the six smallest fit), the others
    waiting. Seated longest first, the three 16-answer runs and two 8-answer runs start (a third
    8-answer run, 21.8 GiB, does not fit beside them, nor a 4-answer one); when a 16-answer run
    ends, the 8-answer run takes its room, and a 4-answer run still waits."""
    machine(139.0)
    monkeypatch.setattr(memory.ModelShape, "of", classmethod(lambda cls, path: QWEN05_KV))
    cfgs = _study(tiny_cfg)
    plan = placement.plan(cfgs, [])
    assert [g.seats for g in plan.gpus] == [6]
    line = capsys.readouterr().out.strip()
    assert line == ("labkit: 6 runs share the GPU (139 GiB free): each with gradient checkpointing, "
                    "24,576 tokens a micro-batch; planned a run: 32 x 4 19.8 GiB (KV cache 2), "
                    "32 x 8 21.8 GiB (KV cache 4), 32 x 16 25.3 GiB (KV cache 7.5); 9 runs: at most "
                    "6 at once, the others wait for a place (the longest first)")
    order = placement.longest_first(cfgs)
    assert [cfgs[k].n_samples_per_prompt for k in order] == [16] * 3 + [8] * 3 + [4] * 3
    running, waiting = [], [cfgs[k] for k in order]

    def seat_all():
        for c in list(waiting):
            placed = plan.place(c, running)
            if placed is not None:
                waiting.remove(c)
                running.append((placed[0].id, placed[1]))

    seat_all()
    assert [c.run_name for _, c in running] == ["n16-s1", "n16-s2", "n16-s3", "n8-s1", "n8-s2"]
    assert {c.n_samples_per_prompt: c.rollout_kv_cache_gb for _, c in running} == {16: 7.5, 8: 4.0}
    assert all(c.rollout_gpu_memory_fraction == 0.5 / 6 and c.gradient_checkpointing for _, c in running)
    running.pop(0)  # n16-s1 ends
    seat_all()
    assert [c.run_name for _, c in running][-1] == "n8-s3" and len(running) == 5
    assert sum(memory.run_memory(c, QWEN05_KV).total for _, c in running) <= 139.0 * memory.HEADROOM
    while waiting:  # the rest end one by one, the oldest first: the 4-answer runs go in as room frees
        running.pop(0)
        seat_all()
        assert len(running) <= 6
        assert sum(memory.run_memory(c, QWEN05_KV).total for _, c in running) <= 139.0 * memory.HEADROOM
    assert sorted(c.n_samples_per_prompt for _, c in running)[:3] == [4, 4, 4]


def test_three_runs_are_planned_as_three(tiny_cfg, machine, monkeypatch, capsys):
    machine(139.0)
    monkeypatch.setattr(memory.ModelShape, "of", classmethod(lambda cls, path: QWEN05_KV))
    plan = placement.plan(_study(tiny_cfg, seeds=(11,)), [])
    assert [g.seats for g in plan.gpus] == [3]
    assert "3 runs share the GPU" in capsys.readouterr().out
    assert plan.settings(_study(tiny_cfg, seeds=(11,))[0], plan.gpus[0]).rollout_gpu_memory_fraction == 0.5 / 3


def test_staggered_starts_start_the_longest_alone_and_the_rest_once_it_is_ready(
        tiny_cfg, machine, monkeypatch, fake_runs, capsys):
    """--stagger-starts on a GPU that seats all three of lesson 1.3's runs: the 16-answer run
    starts alone, and while it is not ready the sweep's next looks at its waiting runs start
    none; the others start once it has written its ready file (each finds it written as it
    starts), and the 4-answer run, not the first, evaluates the start."""
    machine(139.0)
    monkeypatch.setattr(memory.ModelShape, "of", classmethod(lambda cls, path: QWEN05_KV))
    cfgs = _study(tiny_cfg, seeds=(11,))
    out = Path(tiny_cfg.output_dir)
    looked, seen = threading.Condition(), {"looks": 0}
    start_seated = sweep._start_seated

    def counted(*args, **kwargs):
        start_seated(*args, **kwargs)
        with looked:
            seen["looks"] += 1
            looked.notify_all()

    monkeypatch.setattr(sweep, "_start_seated", counted)

    def script():
        seen["first"] = _wait_for_starts(fake_runs, 1)[0]
        with looked:  # two more looks at the waiting runs, the first one still starting
            after = seen["looks"] + 2
            assert looked.wait_for(lambda: seen["looks"] >= after, timeout=DEADLINE_S)
        seen["held"] = len(_starts(fake_runs))
        _say(out / "n16-s11" / "ready", "yes")
        seen["all"] = _wait_for_starts(fake_runs, 3)
        for c in cfgs:
            _end(tiny_cfg, c.run_name)

    slots = _sweep_beside(script, cfgs, _ended_all(tiny_cfg, cfgs), stagger_starts=True)
    assert seen["first"]["run"] == "n16-s11" and seen["held"] == 1
    assert seen["first"]["ready_file"] == str(out / ".ready" / "n16-s11")
    later = seen["all"][1:]
    assert [s["run"] for s in later] == ["n8-s11", "n4-s11"]  # longest first, as without
    assert all(s["ready_before"] == ["n16-s11"] and s["ready_file"] is None for s in later)
    assert {s["evaluator"] for s in seen["all"]} == {"n4-s11"}
    assert [s.outcome for s in slots] == ["completed"] * 3
    captured = capsys.readouterr()
    assert "labkit: run n16-s11 starts first; the others start when it is ready to step" in captured.out
    assert "waiting for n16-s11 to start" in captured.err  # the held runs' bars


def test_staggered_starts_go_on_when_the_first_run_ends_unready(tiny_cfg, machine, monkeypatch,
                                                                fake_runs):
    """The run started first fails before it is ready: the others start all the same (and
    an earlier sweep's ready file, left in the folder, counted for nothing)."""
    machine(139.0)
    monkeypatch.setattr(memory.ModelShape, "of", classmethod(lambda cls, path: QWEN05_KV))
    cfgs = _study(tiny_cfg, seeds=(11,))
    stale = Path(tiny_cfg.output_dir) / ".ready" / "n16-s11"
    stale.parent.mkdir(parents=True)
    stale.write_text("an earlier sweep's")
    seen = {}

    def script():
        _wait_for_starts(fake_runs, 1)
        _end(tiny_cfg, "n16-s11", "fail")
        seen["all"] = _wait_for_starts(fake_runs, 3)
        for name in ("n8-s11", "n4-s11"):
            _end(tiny_cfg, name)

    slots = _sweep_beside(script, cfgs, _ended_all(tiny_cfg, cfgs), stagger_starts=True)
    assert [s["run"] for s in seen["all"]] == ["n16-s11", "n8-s11", "n4-s11"]
    assert all(s["ready_before"] == [] for s in seen["all"])  # the stale one was removed first
    assert [s.outcome.split(":")[0] for s in slots] == ["completed", "completed", "failed"]


def test_staggered_starts_are_refused_where_runs_go_one_after_another(tiny_cfg, capsys):
    with pytest.raises(ConfigError, match=r"^stagger_starts=True: these runs go one after another"):
        sweep.prepare_sweep(_configs(tiny_cfg, 2), side_by_side=False, stagger_starts=True)
    from labkit.cli import main

    assert main(["sweep", "--preset", "cpu", "--seed", "1,2", "--stagger-starts", "--dry-run"]) == 2
    assert capsys.readouterr().err.strip() == (
        "labkit sweep: --stagger-starts: these runs go one after another (no GPU with the vLLM "
        "engine), so each starts alone already")


def test_the_sweep_starts_the_longest_runs_first(tiny_cfg, machine, monkeypatch, fake_runs):
    """A GPU with room for two of lesson 1.3's three runs: the 16- and 8-answer runs start, and
    the 4-answer run (listed first) takes the first place that frees."""
    machine(50.0)
    monkeypatch.setattr(memory.ModelShape, "of", classmethod(lambda cls, path: QWEN05_KV))
    cfgs = _study(tiny_cfg, seeds=(11,))
    seen = {}

    def script():
        seen["first"] = [s["run"] for s in _wait_for_starts(fake_runs, 2)]
        _end(tiny_cfg, "n16-s11")
        seen["third"] = _wait_for_starts(fake_runs, 3)[2]["run"]
        for name in ("n8-s11", "n4-s11"):
            _end(tiny_cfg, name)

    slots = _sweep_beside(script, cfgs, _ended_all(tiny_cfg, cfgs))
    assert sorted(seen["first"]) == ["n16-s11", "n8-s11"] and seen["third"] == "n4-s11"
    assert [s.outcome for s in slots] == ["completed"] * 3
