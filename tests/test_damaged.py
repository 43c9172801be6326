"""Resuming a run folder whose files are damaged: a line cut short by a kill is moved aside and
said, anything else is refused in one line naming the file; nothing already written is lost."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import threading
from pathlib import Path

import pytest
import torch

from labkit.cli import main
from labkit.run.log import Run, read_jsonl
from labkit.run.metrics import STEP
from labkit.trainer import train


@pytest.fixture(scope="module")
def stopped_run(tiny_model_dir, tmp_path_factory) -> Path:
    """A 2-step run of the tiny model that kept its checkpoint (after step 1) and evaluated."""
    from labkit.config import RunConfig

    cfg = RunConfig(model=str(tiny_model_dir), data="synthetic", engine="hf", rollout_batch_size=2,
                    n_samples_per_prompt=4, global_batch_size=8, micro_batch_size=4, num_rollout=2,
                    rollout_max_response_len=12, lr=1e-3, seed=7, progress=False, eval_split_size=2,
                    save_interval=1, output_dir=str(tmp_path_factory.mktemp("runs")), run_name="r")
    return train(cfg).dir


@pytest.fixture()
def run_copy(stopped_run, tmp_path) -> Path:
    copy = tmp_path / "r"
    shutil.copytree(stopped_run, copy)
    return copy


def _resume(run: Path, capsys) -> tuple[int, str, str]:
    """`labkit launch --resume RUN --num-rollout 3`: (exit code, stdout, labkit's stderr lines)."""
    code = main(["launch", "--resume", str(run), "--num-rollout", "3"])
    out, err = capsys.readouterr()
    return code, out, "\n".join(line for line in err.splitlines() if line.startswith("labkit"))


def _cut(path: Path, chars: int) -> None:
    path.write_bytes(path.read_bytes()[:-chars])  # a kill in the middle of the last line


def test_a_cut_line_of_the_checkpoints_step_is_said_and_left_as_a_gap(run_copy, capsys):
    """The checkpoint is after step 1 and step 1's line is cut: the step cannot run again
    (the weights are past it). Before, the resumed log lacked it without a word."""
    _cut(run_copy / "metrics.jsonl", 40)
    code, out, err = _resume(run_copy, capsys)
    assert code == 0, err
    assert (f"labkit: {run_copy / 'metrics.jsonl'} ended in a line cut short (the run died while "
            f"writing it); moved it to metrics.jsonl.truncated (step 1)") in out
    assert (f"labkit: {run_copy / 'metrics.jsonl'} has no line for step(s) 1, and the checkpoint "
            f"is after step 1, so they cannot run again: the log keeps that gap") in out
    assert Run(run_copy).metrics[STEP].tolist() == [0, 2]  # the gap the analysis sees
    assert (run_copy / "metrics.jsonl.truncated").read_text().count("\n") == 1


def test_a_cut_line_of_samples_is_moved_aside_not_glued_to_the_next(run_copy, capsys):
    _cut(run_copy / "samples.jsonl", 25)
    code, out, err = _resume(run_copy, capsys)
    assert code == 0, err
    rows, bad = read_jsonl(run_copy / "samples.jsonl")
    assert bad == 0 and rows[-1][STEP] == 2  # step 2's samples start a line of their own
    assert f"labkit: {run_copy / 'samples.jsonl'} ended in a line cut short" in out
    assert (run_copy / "samples.jsonl.truncated").exists()


def _not_json(path: Path) -> None:
    path.write_text("{not json")


def _binary(path: Path) -> None:
    path.write_bytes(b"\xff\xfe\x00\x01" * 8 + b"\n")


def _a_list(path: Path) -> None:
    path.write_text("[1, 2]\n")


def _foreign_checkpoint(path: Path) -> None:
    torch.save({"weights": 1}, path)


REFUSED = [  # (file, damage, what the one line says)
    ("config.json", _not_json, "cannot be read as a run's config (not JSON: "),
    ("config.json", _binary, "cannot be read as a run's config (not JSON: "),
    ("config.json", _a_list, "cannot be read as a run's config (a JSON list, not an object)"),
    ("config.json", lambda p: p.write_text(json.dumps({**json.loads(p.read_text()),
                                                      "n_samples_per_prompt": "four"})),
     "holds a config no run could have (--n-samples-per-prompt must be"),
    ("metrics.jsonl", lambda p: (p.unlink(), p.mkdir()), "is not a file"),
    ("metrics.jsonl", lambda p: p.write_bytes(b"\xff\xfe\n" + p.read_bytes()),
     ": line 1 is not a step's line (not a JSON object): the log is damaged"),
    ("metrics.jsonl", lambda p: p.write_text("[1]\n" + p.read_text()),
     ": line 1 is not a step's line (not a JSON object)"),
    ("checkpoint/latest.json", _binary, "cannot be read as a checkpoint's pointer"),
    ("checkpoint/latest.json", lambda p: p.write_text('{"step": "one", "file": "step-1.pt"}'),
     "is damaged (no step number and file name of the checkpoint in it)"),
    ("checkpoint", lambda p: (shutil.rmtree(p), p.write_text("x")), "is not a folder"),
    ("checkpoint/step-1.pt", _foreign_checkpoint, ": not a labkit checkpoint (it holds no 'step')"),
]


@pytest.mark.parametrize("name,damage,said", REFUSED,
                         ids=[f"{n}-{i}" for i, (n, _, _) in enumerate(REFUSED)])
def test_a_damaged_file_is_refused_in_one_line_naming_it(run_copy, capsys, name, damage, said):
    damage(run_copy / name)
    before = {p.name: p.read_bytes() for p in run_copy.iterdir() if p.is_file()}
    code, _, err = _resume(run_copy, capsys)
    assert code == 2, err
    assert err.count("\n") == 0 and err.startswith(f"labkit launch: {run_copy / name}"), err
    assert said in err and "did not expect" not in err
    after = {p.name: p.read_bytes() for p in run_copy.iterdir() if p.is_file() and p.name != "lock"}
    assert after == {k: v for k, v in before.items() if k != "lock"}  # nothing changed


def test_a_damaged_status_is_moved_aside_and_the_run_goes_on(run_copy, capsys):
    _not_json(run_copy / "status.json")
    code, out, err = _resume(run_copy, capsys)
    assert code == 0, err
    assert (f"labkit: {run_copy / 'status.json'} cannot be read as a run's status (not JSON); "
            f"moved it to status.json.damaged") in out
    assert (run_copy / "status.json.damaged").read_text() == "{not json"
    assert Run(run_copy).status["reason"] == "completed"


def test_an_unreadable_evaluation_line_is_kept_and_the_run_goes_on(run_copy, capsys):
    good = (run_copy / "eval.jsonl").read_bytes()
    (run_copy / "eval.jsonl").write_bytes(b"\xff\xfe\x00\n" + good)
    code, _, err = _resume(run_copy, capsys)
    assert code == 0, err
    lines = (run_copy / "eval.jsonl").read_bytes().splitlines()
    assert lines[0] == b"\xff\xfe\x00" and lines[1:3] == good.splitlines()
    assert [json.loads(x)["eval/trained_steps"] for x in lines[1:]] == [0, 2, 3]


# ----------------------------------------------------------------------------- a step logged twice
@pytest.mark.parametrize("where", ["before", "after"])
def test_a_step_logged_twice_is_said_at_resume_and_each_step_is_logged_once(run_copy, capsys, where):
    """Step 0's line twice (a stray copy before the real one, or after the checkpoint's step):
    the resume keeps the line the checkpoint (after step 1) follows, moves the other aside,
    says so, and the log then holds each step once, as the analysis needs."""
    path = run_copy / "metrics.jsonl"
    lines = path.read_text().splitlines()  # steps 0 and 1; the checkpoint is after step 1
    stray = json.dumps({**json.loads(lines[0]), "rollout/raw_reward": 0.987})
    path.write_text("\n".join([stray, *lines] if where == "before" else [*lines, stray]) + "\n")
    code, out, err = _resume(run_copy, capsys)
    assert code == 0, err
    line = 1 if where == "before" else 3
    assert (f"labkit: {path} logged step(s) 0 more than once (line(s) {line}); kept one line per "
            f"step, the ones the checkpoint after step 1 follows, and moved the other(s) to "
            f"metrics.jsonl.duplicate") in out
    kept = path.read_text().splitlines()
    assert kept[:2] == lines and [json.loads(x)[STEP] for x in kept] == [0, 1, 2]
    assert (run_copy / "metrics.jsonl.duplicate").read_text().splitlines() == [stray]  # not lost
    from labkit.analysis import load_runs

    assert load_runs([run_copy])[STEP].tolist() == [0, 1, 2]  # as labkit compare reads it


# ----------------------------------------------------------------------------- files that are no file
def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink()


def _loop(path: Path) -> None:
    _remove(path)
    path.symlink_to(path.name)  # a link to itself


def _dangling(path: Path) -> None:
    _remove(path)
    path.symlink_to(path.name + ".gone")


def _folder(path: Path) -> None:
    _remove(path)
    path.mkdir()


def _pipe(path: Path) -> None:
    _remove(path)
    os.mkfifo(path)  # a reader that opened it would wait forever


@contextlib.contextmanager
def _pipe_let_go_after_a_deadline(path: Path, deadline_s: float = 20.0):
    """While the block runs: should it still run `deadline_s` after it began with `path` a
    pipe (a reader opened it and waits), open the pipe's other end and close it, so that the
    reader gets an end of file and the test fails instead of hanging. Yields a list that
    holds True when that was needed."""
    done, waited = threading.Event(), []

    def let_go():
        if not done.wait(deadline_s):
            waited.append(True)
            try:
                with open(os.open(path, os.O_WRONLY | os.O_NONBLOCK), "wb"):
                    pass
            except OSError:  # no reader waits on it: nothing to let go
                pass

    watcher = threading.Thread(target=let_go, daemon=True)
    if path.is_fifo():
        watcher.start()
    try:
        yield waited
    finally:
        done.set()


NO_FILE = {"loop": (_loop, "is a symbolic link that loops (it leads back to itself)"),
           "dangling link": (_dangling, "which is not there"),
           "folder": (_folder, "is not a file but a folder"),
           "pipe": (_pipe, "is not a file but a named pipe")}
READ_AT_RESUME = ["config.json", "status.json", "metrics.jsonl", "samples.jsonl", "eval.jsonl",
                  "checkpoint/latest.json", "checkpoint/step-1.pt"]


@pytest.mark.parametrize("name", READ_AT_RESUME)
@pytest.mark.parametrize("kind", list(NO_FILE))
def test_a_file_a_resume_reads_that_is_no_file_is_named_with_what_it_is(run_copy, capsys, name, kind):
    """Each file a resume reads, made a link that loops or leads nowhere, a folder or a pipe:
    one line names it and what it is (before, a config.json that loops read as "no
    config.json"), and nothing in the folder changes."""
    damage, said = NO_FILE[kind]
    damage(run_copy / name)
    before = {p.name: p.read_bytes() for p in run_copy.iterdir() if p.is_file()}
    with _pipe_let_go_after_a_deadline(run_copy / name) as waited:
        code, _, err = _resume(run_copy, capsys)
    assert not waited, "the resume opened the pipe and waited on it"
    assert code == 2, err
    assert err.count("\n") == 0 and err.startswith(f"labkit launch: {run_copy / name} "), err
    assert said in err and "did not expect" not in err and "no config.json" not in err, err
    after = {p.name: p.read_bytes() for p in run_copy.iterdir() if p.is_file() and p.name != "lock"}
    assert after == {k: v for k, v in before.items() if k != "lock"}


def test_a_checkpoint_folder_that_loops_is_named_not_taken_for_none(run_copy, capsys):
    _loop(run_copy / "checkpoint")
    code, _, err = _resume(run_copy, capsys)
    assert code == 2 and err.startswith(f"labkit launch: {run_copy / 'checkpoint'} is a symbolic "
                                        f"link that loops"), err
    assert "no checkpoint" not in err
