"""labkit.run.log: files rewritten in place keep their mode; the folder's lock; lines set aside."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from waiting import DEADLINE_S, Lines

from labkit.run.log import RunLog, RunLogError, write_text_atomic


@pytest.fixture()
def umask_022():
    old = os.umask(0o022)
    yield
    os.umask(old)


def test_a_rewritten_file_gets_the_users_umask_not_0600(tmp_path, umask_022):
    path = tmp_path / "status.json"
    write_text_atomic(path, "{}")
    assert path.stat().st_mode & 0o777 == 0o644  # mkstemp alone gave 0600
    path.chmod(0o640)
    write_text_atomic(path, "{}\n")
    assert path.stat().st_mode & 0o777 == 0o640  # an existing file keeps its mode


def _run_folder(tmp_path):
    run = tmp_path / "run"
    RunLog.create(run, {"seed": 1}).release()
    return run


def test_the_lock_of_a_live_trainer_refuses_and_a_dead_ones_is_taken_over(tmp_path, capsys):
    run = _run_folder(tmp_path)
    holder = subprocess.Popen(  # another process holds the folder, then is killed
        [sys.executable, "-c", "import sys, time; from labkit.run.log import RunLog; "
         f"log = RunLog.open({str(run)!r}); print('held', flush=True); sys.stdin.read()"],  # holds it until killed
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env={**os.environ})
    try:
        assert Lines(holder).until("held")[-1].strip() == "held"
        with pytest.raises(RunLogError, match=rf"in use by another trainer \(pid {holder.pid} "):
            RunLog.open(run)
    finally:
        holder.kill()
        holder.wait(timeout=DEADLINE_S)
    log = RunLog.open(run)  # the kernel dropped the dead process's lock
    assert f"pid {holder.pid} held this folder and is gone" in capsys.readouterr().out
    assert json.loads((run / "lock").read_text())["pid"] == os.getpid()
    log.release()
    assert not (run / "lock").exists()


def test_a_failed_start_removes_only_what_it_made(tmp_path):
    log = RunLog.create(tmp_path / "new" / "runs" / "r1", {"seed": 1})
    log.abandon()
    assert not (tmp_path / "new").exists()
    (tmp_path / "kept").mkdir()
    (tmp_path / "kept" / "notes.txt").write_text("mine")
    RunLog.create(tmp_path / "kept", {"seed": 1}).abandon()
    assert [p.name for p in (tmp_path / "kept").iterdir()] == ["notes.txt"]


@pytest.mark.parametrize("by_hand", [False, True], ids=["new folder", "folder made by hand"])
def test_two_starts_of_one_run_at_once_the_loser_is_refused_and_removes_nothing(tmp_path, monkeypatch,
                                                                                 by_hand):
    """Two kernels start one fixed run name together: the first to reach the folder's lock
    waits there (an event) until the second has made the run; it is then refused in one line,
    and the second's folder, config and lock stay as they were."""
    import threading

    from labkit.run import log as runlog

    run = tmp_path / "runs" / "fixed"
    if by_hand:
        run.mkdir(parents=True)
        (run / "notes.txt").write_text("mine")
    real, entered, second_done = runlog.RunLock.acquire, threading.Event(), threading.Event()
    results = {}

    def acquire(path):
        if threading.current_thread() is not threading.main_thread():
            entered.set()
            assert second_done.wait(60)
        return real(path)

    def start(who):
        try:
            results[who] = RunLog.create(run, {"who": who})
        except RunLogError as e:
            results[who] = e

    monkeypatch.setattr(runlog.RunLock, "acquire", staticmethod(acquire))
    first = threading.Thread(target=start, args=("first",))
    first.start()
    assert entered.wait(60)
    start("second")  # while the first waits at the lock
    second_done.set()
    first.join(60)
    refused = results["first"]
    assert isinstance(refused, RunLogError) and "\n" not in str(refused)
    assert json.loads((run / "config.json").read_text()) == {"who": "second"}
    assert json.loads((run / "lock").read_text())["pid"] == os.getpid()  # still held
    assert sorted(p.name for p in run.parent.iterdir()) == ["fixed"]  # no hidden folder left
    results["second"].release()


def test_a_new_run_folder_gets_the_users_umask(tmp_path, umask_022):
    RunLog.create(tmp_path / "run", {"seed": 1}).release()
    assert (tmp_path / "run").stat().st_mode & 0o777 == 0o755


def test_a_line_the_disk_has_no_room_for_is_said_and_leaves_no_half_line(tmp_path, monkeypatch):
    import errno

    from labkit.run.log import WriteFailed
    from labkit.run.metrics import STEP

    run = _run_folder(tmp_path)
    log = RunLog.open(run)
    log.append_step({STEP: 0, "rollout/raw_reward": 0.5})
    before = (run / "metrics.jsonl").read_bytes()
    real = os.fsync

    def fsync(fd):  # the line reached the page cache, and the disk had no room for it
        if os.readlink(f"/proc/self/fd/{fd}").endswith("/metrics.jsonl"):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    with pytest.raises(WriteFailed, match=rf"^could not write {run / 'metrics.jsonl'}: the disk "
                                          rf"is full \([\d,]+ MB free\); free some space$"):
        log.append_step({STEP: 1, "rollout/raw_reward": 0.25})
    assert (run / "metrics.jsonl").read_bytes() == before
    log.release()


def test_evaluations_after_the_checkpoint_are_set_aside_with_their_steps(tmp_path):
    from labkit.run.metrics import STEP

    run = _run_folder(tmp_path)
    log = RunLog.open(run)
    for step in range(4):
        log.append_step({STEP: step})
    for trained in (0, 2, 4):  # evaluations after 0, 2 and 4 steps; the checkpoint is after step 1
        log.append_eval({"eval/trained_steps": trained, "eval/made_test": 0.5})
    assert log.set_aside_steps_after(1) == 2
    assert log.evaluated() == {0, 2}  # the one after step 1 (2 steps) goes with the checkpoint
    kept = [json.loads(x) for x in (run / "eval.jsonl.after-checkpoint").read_text().splitlines()]
    assert [r["eval/trained_steps"] for r in kept] == [4]
    log.release()
