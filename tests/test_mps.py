"""labkit.machine.mps: a sweep's own MPS server, reached by its runs and quit after them.

No GPU here: a stand-in `nvidia-cuda-mps-control` on PATH writes down how it was called
(start, the pipe folder, what it was told on stdin), as the real one takes them.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from labkit import sweep
from labkit.cli import main
from labkit.machine import mps

CONTROL = """#!/bin/sh
calls="$(dirname "$0")/calls"
if [ "$1" = "-d" ]; then
  [ -n "$FAIL" ] && { echo "$FAIL" >&2; exit 1; }
  [ -d "$CUDA_MPS_PIPE_DIRECTORY" ] && [ -d "$CUDA_MPS_LOG_DIRECTORY" ] || exit 3
  echo "start $CUDA_MPS_PIPE_DIRECTORY" >> "$calls"
  exit 0
fi
read -r said
echo "$said $CUDA_MPS_PIPE_DIRECTORY" >> "$calls"
"""

REWARD = """
import os
from pathlib import Path

def records_mps(response, label):
    seen = os.environ.get("CUDA_MPS_PIPE_DIRECTORY", "none")
    Path(__file__).with_name(f"seen-{os.getpid()}").write_text(seen)
    return float(len(response) % 2)
"""


@pytest.fixture
def control(tmp_path, monkeypatch) -> Path:
    """The stand-in control program, first on PATH; returns the file of its calls."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    path = bin_dir / mps.CONTROL
    path.write_text(CONTROL)
    path.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv("FAIL", raising=False)
    return bin_dir / "calls"


def test_the_server_is_started_with_a_private_folder_and_quit_after(control):
    with mps.server() as env:
        pipe = env[mps.PIPE_ENV]
        assert Path(pipe).is_dir() and Path(env[mps.LOG_ENV]).is_dir()
        assert control.read_text().splitlines() == [f"start {pipe}"]
    assert control.read_text().splitlines() == [f"start {pipe}", f"quit {pipe}"]
    assert not Path(pipe).parent.exists()  # its folder goes with it


def test_the_server_quits_when_the_work_inside_fails(control):
    with pytest.raises(RuntimeError, match="inside"):
        with mps.server() as env:
            raise RuntimeError("inside")
    assert control.read_text().splitlines()[-1] == f"quit {env[mps.PIPE_ENV]}"


def test_a_server_that_does_not_start_is_one_line(control, monkeypatch):
    monkeypatch.setenv("FAIL", "cannot reach the GPU")
    with pytest.raises(mps.MPSError) as caught:
        with mps.server():
            pytest.fail("no server: nothing runs inside")
    assert str(caught.value) == (f"the MPS server did not start ({mps.CONTROL} -d: exit 1: "
                                 f"cannot reach the GPU)")
    assert not control.exists()


def test_a_machine_without_the_control_program_is_said_so(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    assert mps.missing() == (f"{mps.CONTROL} is not on PATH (it comes with NVIDIA's driver "
                             f"utilities)")


def test_a_sweeps_runs_reach_its_server_and_it_quits_after_them(tiny_cfg, control, tmp_path,
                                                                monkeypatch, capsys):
    """Two runs as processes (as on a GPU): both see the sweep's own pipe folder; the server
    is started once before them and quit once after. The GPU checks are the next test's."""
    monkeypatch.setattr(sweep, "_check_mps", lambda share_a_gpu, hints: None)
    rewards = tmp_path / "rewards.py"
    rewards.write_text(REWARD)
    base = tiny_cfg.replace(num_rollout=1, save_interval=0, custom_rm_path=f"{rewards}:records_mps")
    runs = sweep.launch_many([base.replace(run_name="a", seed=1), base.replace(run_name="b", seed=2)],
                             side_by_side=True, mps=True)
    assert [run.status["reason"] for run in runs] == ["completed", "completed"]
    calls = control.read_text().splitlines()
    assert len(calls) == 2 and calls[0].startswith("start ") and calls[1].startswith("quit ")
    pipe = calls[0].removeprefix("start ")
    assert calls[1] == f"quit {pipe}"
    seen = {p.read_text() for p in tmp_path.glob("seen-*")}
    assert seen == {pipe} and len(list(tmp_path.glob("seen-*"))) == 2  # one process a run
    assert "through an MPS server of this sweep's own" in capsys.readouterr().out


def test_mps_is_refused_where_the_runs_share_no_gpu(capsys):
    assert main(["sweep", "--preset", "cpu", "--seed", "1,2", "--mps", "--dry-run"]) == 2
    assert capsys.readouterr().err.strip() == (
        "labkit sweep: --mps: these runs share no GPU (MPS serves runs side by side on a GPU "
        "with the vLLM engine)")


def test_mps_on_a_gpu_without_the_control_program_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(sweep.ConfigError, match=r"^mps=True: nvidia-cuda-mps-control is not on PATH"):
        sweep._check_mps(True, sweep.Hints())
