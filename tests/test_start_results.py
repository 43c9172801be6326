"""A sweep's runs share their starting model's result: one computes it under a lock, the
others wait for the lock and read it; a stop ends the wait, a failure leaves it to the next."""

from __future__ import annotations

import threading

import pytest

from labkit.engines.base import Cancelled
from labkit.run import start_results

DEADLINE_S = 60


def test_without_a_folder_each_run_computes(monkeypatch):
    monkeypatch.delenv(start_results.FOLDER_ENV, raising=False)
    calls = []
    for _ in range(2):
        assert start_results.shared("k", lambda: calls.append(1) or {"acc": 0.5}, who="r") == ({"acc": 0.5}, None)
    assert len(calls) == 2


def test_the_first_run_computes_and_the_next_reads(tmp_path, monkeypatch):
    monkeypatch.setenv(start_results.FOLDER_ENV, str(tmp_path / ".start"))
    assert start_results.shared("k", lambda: {"acc": 0.25, "right": [True, False]}, who="r1") == (
        {"acc": 0.25, "right": [True, False]}, None)
    never = lambda: pytest.fail("computed again")  # noqa: E731
    assert start_results.shared("k", never, who="r2") == ({"acc": 0.25, "right": [True, False]}, "r1")
    assert start_results.shared("other", lambda: {"acc": 0.0}, who="r2") == ({"acc": 0.0}, None)


def test_keys_differ_with_anything_that_makes_the_result():
    base = ("eval", "model", "vllm", [[1, 2], [3]], 1024, [7], "bfloat16")
    assert start_results.key_of(*base) == start_results.key_of(*base)
    for i, other in enumerate(["x", "y", "hf", [[1, 2], [4]], 512, [8], "float32"]):
        changed = list(base)
        changed[i] = other
        assert start_results.key_of(*changed) != start_results.key_of(*base)


def _computing_run(where, started, go, out):
    def compute():
        started.set()
        assert go.wait(DEADLINE_S), "never let go"
        return {"acc": 0.3}

    out["first"] = start_results.shared("k", compute, who="first", where=where)


def test_a_run_waits_while_another_computes_then_reads_its_result(tmp_path):
    started, go, out = threading.Event(), threading.Event(), {}
    first = threading.Thread(target=_computing_run, args=(tmp_path, started, go, out))
    first.start()
    assert started.wait(DEADLINE_S)
    calls = []
    second = threading.Thread(target=lambda: out.update(second=start_results.shared(
        "k", lambda: calls.append(1) or {"acc": 9.9}, who="second", where=tmp_path)))
    second.start()
    go.set()
    first.join(DEADLINE_S)
    second.join(DEADLINE_S)
    assert out == {"first": ({"acc": 0.3}, None), "second": ({"acc": 0.3}, "first")}
    assert calls == []


def test_a_stop_ends_the_wait_and_a_failure_leaves_the_result_to_the_next(tmp_path):
    started, go, out = threading.Event(), threading.Event(), {}
    first = threading.Thread(target=_computing_run, args=(tmp_path, started, go, out))
    first.start()
    assert started.wait(DEADLINE_S)
    with pytest.raises(Cancelled, match="stopped while another run"):
        start_results.shared("k", lambda: {"acc": 9.9}, who="second", where=tmp_path, stopping=lambda: True)
    go.set()
    first.join(DEADLINE_S)

    def fails():
        raise RuntimeError("out of memory")

    with pytest.raises(RuntimeError):
        start_results.shared("fresh", fails, who="a", where=tmp_path)
    assert start_results.shared("fresh", lambda: {"acc": 0.1}, who="b", where=tmp_path) == ({"acc": 0.1}, None)


def test_a_later_reader_waits_while_the_result_is_computed_and_finds_none_where_none_was(tmp_path):
    assert start_results.read_when_free("k", where=tmp_path / "absent") == (None, None)
    assert not start_results.written("k", where=tmp_path)
    started, go, out = threading.Event(), threading.Event(), {}
    first = threading.Thread(target=_computing_run, args=(tmp_path, started, go, out))
    first.start()
    assert started.wait(DEADLINE_S)
    assert not start_results.written("k", where=tmp_path)
    reader = threading.Thread(target=lambda: out.update(read=start_results.read_when_free("k", where=tmp_path)))
    reader.start()
    go.set()
    first.join(DEADLINE_S)
    reader.join(DEADLINE_S)
    assert out["read"] == ({"acc": 0.3}, "first") and start_results.written("k", where=tmp_path)
    assert start_results.read_when_free("other", where=tmp_path) == (None, None)
    import fcntl

    with open(tmp_path / "held.lock", "a+") as holder, pytest.raises(Cancelled):
        fcntl.flock(holder.fileno(), fcntl.LOCK_EX)  # another run computes "held"
        start_results.read_when_free("held", where=tmp_path, stopping=lambda: True)
