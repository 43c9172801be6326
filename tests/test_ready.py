"""labkit.run.ready: a sweep's run says when it is ready to step (`labkit sweep --stagger-starts`)."""

from __future__ import annotations

import json

import labkit
from labkit.run import ready


def test_a_run_says_it_is_ready_after_its_set_up_and_before_its_first_step(tiny_cfg, tmp_path,
                                                                           monkeypatch):
    where = ready.marker(tmp_path / "sweep", "tiny")
    monkeypatch.setenv(ready.ENV, str(where))
    run = labkit.launch(tiny_cfg.replace(num_rollout=1))
    assert ready.is_ready(where)
    first = json.loads((run.dir / "metrics.jsonl").read_text().splitlines()[0])
    assert where.stat().st_mtime <= first["time/start"]


def test_without_the_sweep_s_file_nothing_is_written(tmp_path, monkeypatch):
    monkeypatch.delenv(ready.ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    ready.say()
    assert list(tmp_path.iterdir()) == []


def test_a_file_that_cannot_be_written_is_no_failure(tmp_path, monkeypatch):
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    monkeypatch.setenv(ready.ENV, str(blocked / "ready" / "tiny"))  # its folder is a file
    ready.say()
    assert not ready.is_ready(blocked / "ready" / "tiny")
