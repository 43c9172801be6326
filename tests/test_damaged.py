"""Resuming a run folder whose files are damaged: a line cut short by a kill is moved aside and
said, anything else is refused in one line naming the file; nothing already written is lost."""

from __future__ import annotations

import json
import shutil
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
