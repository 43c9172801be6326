"""labkit.miles.backend: the run folder for miles, the script run in bash against a stub
`ray`, the prompt file, the reward hook, `labkit launch --backend miles`. No GPU, no network."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from labkit.config import RunConfig
from labkit.data import Problem, build_messages, load_problems, rollout_problems
from labkit.miles import backend as miles_backend
from labkit.miles import command as miles_command
from labkit.miles import log as miles_log

GSM8K = Path(__file__).parents[1] / ".." / "shared" / "data" / "gsm8k"
REPO = Path(__file__).parents[1]


# ------------------------------------------------------------------ refusals
def test_main_prints_the_refusal_and_fails(capsys, tmp_path):
    code = miles_backend.launch(RunConfig(), explicit={"engine"}, dry_run=True, out_dir=str(tmp_path))
    assert code == 2
    assert "--engine" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())


def test_launch_refuses_http_rollouts(capsys, tmp_path, monkeypatch):
    """`labkit launch --backend miles --rollout-mode http` fails by name, writing nothing."""
    from labkit.cli import main as labkit

    monkeypatch.chdir(tmp_path)
    for name in ("MILES_EXTRA_ARGS", "MILES_NUM_ROLLOUT"):
        monkeypatch.delenv(name, raising=False)
    code = labkit(["launch", "--backend", "miles", "--dry-run", "--rollout-mode", "http",
                   "--router-url", "http://127.0.0.1:8000"])
    printed = capsys.readouterr()
    assert code == 2
    assert printed.err.startswith("labkit launch --backend miles: ")
    assert "--rollout-mode: http" in printed.err and "--router-url" in printed.err
    assert "#!/usr/bin/env bash" not in printed.out  # no script
    assert not any(tmp_path.iterdir())


def test_launch_refuses_http_rollouts_before_asking_for_a_router(capsys, tmp_path, monkeypatch):
    """Without --router-url the miles refusal still comes first: adding a URL would not help."""
    from labkit.cli import main as labkit

    monkeypatch.chdir(tmp_path)
    for name in ("MILES_EXTRA_ARGS", "MILES_NUM_ROLLOUT"):
        monkeypatch.delenv(name, raising=False)
    code = labkit(["launch", "--backend", "miles", "--dry-run", "--rollout-mode", "http"])
    printed = capsys.readouterr()
    assert code == 2
    assert "--rollout-mode: http" in printed.err
    assert "needs --router-url" not in printed.err


# ------------------------------------------------------------------ the script, run in bash
CHECKOUTS = Path(__file__).parent / "fixtures" / "miles_checkouts"
# The 14 flags of miles' scripts/models/qwen2.5-0.5B.py (main) and .sh (before fe30593dd6de).
QWEN_05B_FLAGS = ["--swiglu", "--num-layers", "24", "--hidden-size", "896", "--ffn-hidden-size",
                  "4864", "--num-attention-heads", "14", "--use-rotary-position-embeddings",
                  "--disable-bias-linear", "--add-qkv-bias", "--normalization", "RMSNorm",
                  "--norm-epsilon", "1e-6", "--rotary-base", "1000000", "--group-query-attention",
                  "--num-query-groups", "2", "--vocab-size", "151936"]
ONE_RUN = [["stop", "--force"], ["start", "--head"], ["job", "submit"], ["stop", "--force"]]


def _stand_in(tmp_path: Path, layout: str = "main") -> dict:
    """A miles checkout laid out like fixtures/miles_checkouts/<layout>, a model folder and
    the stand-in `ray` first on PATH; returns the environment to run the script in."""
    bin_dir, miles_dir, ckpt, state = (tmp_path / n for n in ("bin", "miles", "ckpt", "ray_state"))
    shutil.copytree(CHECKOUTS / layout, miles_dir)
    shutil.copytree(CHECKOUTS / "bin", bin_dir)
    (bin_dir / "ray").chmod(0o755)
    (bin_dir / "python3").symlink_to(sys.executable)
    ckpt.mkdir()
    state.mkdir()
    return {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "HOME": str(tmp_path),
            "MILES_DIR": str(miles_dir), "HF_CHECKPOINT": str(ckpt), "PYTHONPATH": str(REPO),
            "RAY_FAKE_STATE": str(state), "FAKE_TRAIN_RECORD": str(tmp_path / "train_runs.jsonl")}


def _write_script(tmp_path: Path, cfg: RunConfig | None = None) -> Path:
    cfg = RunConfig() if cfg is None else cfg
    run_dir = tmp_path / "run"
    run_dir.mkdir(exist_ok=True)
    (run_dir / miles_backend.PROMPTS).write_text("")
    (run_dir / miles_backend.EVAL_PROMPTS).write_text("")  # the recipe evaluates held-out problems
    script = run_dir / miles_backend.SCRIPT
    script.write_text(miles_backend.render_script(cfg, explicit=set()))
    return script


def _run_script(script: Path, env: dict, cwd: Path) -> subprocess.CompletedProcess:
    cwd.mkdir(exist_ok=True)
    return subprocess.run(["bash", str(script)], env=env, cwd=cwd, capture_output=True,
                          text=True, timeout=120)


def _ray_calls(env: dict) -> list[dict]:
    path = Path(env["RAY_FAKE_STATE"]) / "calls.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _train_runs(env: dict) -> list[dict]:
    path = Path(env["FAKE_TRAIN_RECORD"])
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_script_runs_twice_on_miles_main_from_another_folder(tmp_path):
    """miles main: model flags from its Python helper, train.py found from any folder (also
    with relative paths), and Ray stopped before and after each run, so a second run works."""
    env = _stand_in(tmp_path, "main")
    script = _write_script(tmp_path)
    miles_dir = env["MILES_DIR"]
    helper = f"{miles_dir}/miles/utils/external_utils/model_args_utils.py"
    first = _run_script(script, env, tmp_path / "elsewhere")
    assert first.returncode == 0, first.stderr
    assert f"model args: python3 {helper} qwen2.5-0.5B" in first.stdout
    relative = {**env, "MILES_DIR": "../miles", "HF_CHECKPOINT": "../ckpt"}  # from elsewhere/
    second = _run_script(script, relative, tmp_path / "elsewhere")
    assert second.returncode == 0, second.stderr
    calls = _ray_calls(env)
    assert [c["argv"][:2] for c in calls] == ONE_RUN * 2
    assert all(c["cwd"] == miles_dir for c in calls if c["argv"][0] == "start")
    runs = _train_runs(env)
    assert len(runs) == 2
    for ran in runs:
        assert ran["argv"][0] == f"{miles_dir}/train.py" and ran["cwd"] == miles_dir
        assert ran["argv"][1:1 + len(QWEN_05B_FLAGS)] == QWEN_05B_FLAGS
        assert ran["pythonpath"].split(os.pathsep)[0] == miles_dir  # as miles' command_utils
        flags = miles_command.parse_train_args(ran["argv"])
        ckpt = flags["--hf-checkpoint"]  # made absolute: train.py runs in the miles checkout
        assert os.path.isabs(ckpt) and os.path.normpath(ckpt) == env["HF_CHECKPOINT"]
    assert "perf 0: " in (script.parent / miles_log.LOG).read_text()


def test_script_sources_the_model_file_of_an_older_miles(tmp_path):
    """A checkout from before fe30593dd6de has scripts/models/<type>.sh and no helper."""
    env = _stand_in(tmp_path, "old")
    done = _run_script(_write_script(tmp_path), env, tmp_path / "elsewhere")
    assert done.returncode == 0, done.stderr
    sh = f"{env['MILES_DIR']}/scripts/models/qwen2.5-0.5B.sh"
    assert f"model args: source {sh} (a miles checkout from before fe30593dd6de)" in done.stdout
    (ran,) = _train_runs(env)
    assert ran["argv"][1:1 + len(QWEN_05B_FLAGS)] == QWEN_05B_FLAGS
    assert [c["argv"][:2] for c in _ray_calls(env)] == ONE_RUN


def test_script_submits_to_a_cluster_of_yours_without_stopping_it(tmp_path):
    """With RAY_ADDRESS the job runs where that cluster was started: train.py by its path."""
    env = _stand_in(tmp_path, "main")
    theirs = tmp_path / "cluster_home"
    theirs.mkdir()
    subprocess.run([str(tmp_path / "bin" / "ray"), "start", "--head"], env=env, cwd=theirs, check=True)
    done = _run_script(_write_script(tmp_path), {**env, "RAY_ADDRESS": "http://10.0.0.5:8265"},
                       tmp_path / "elsewhere")
    assert done.returncode == 0, done.stderr
    assert [c["argv"][:2] for c in _ray_calls(env)] == [["start", "--head"], ["job", "submit"]]
    (ran,) = _train_runs(env)
    assert ran["cwd"] == str(theirs) and ran["argv"][0] == f"{env['MILES_DIR']}/train.py"


def test_script_applies_the_course_overrides_at_run_time(tmp_path):
    env = _stand_in(tmp_path)
    env.update(MILES_NUM_ROLLOUT="12",
               MILES_EXTRA_ARGS="--n-samples-per-prompt 4 --global-batch-size 128")
    script = _write_script(tmp_path)
    done = _run_script(script, env, tmp_path / "elsewhere")
    assert done.returncode == 0, done.stderr
    (ran,) = _train_runs(env)
    argv = ran["argv"]
    assert argv[1:3] == ["--swiglu", "--num-layers"]  # model flags first
    flags = miles_command.parse_train_args(argv)
    assert flags["--n-samples-per-prompt"] == "4" and flags["--global-batch-size"] == "128"
    assert flags["--num-rollout"] == flags["--save-interval"] == "12"
    assert flags["--hf-checkpoint"] == env["HF_CHECKPOINT"]
    assert flags["--prompt-data"] == str(tmp_path / "run" / miles_backend.PROMPTS)
    assert flags["--rollout-batch-size"] == "32"
    # what ran is on disk beside the log, and the log is tee'd there
    assert (tmp_path / "run" / miles_log.TRAIN_ARGS).read_text().splitlines() == argv[1:]
    assert "perf 0: " in (tmp_path / "run" / miles_log.LOG).read_text()


def test_script_names_the_fix_when_the_model_is_missing(tmp_path):
    env = _stand_in(tmp_path)
    env["HF_CHECKPOINT"] = str(tmp_path / "nowhere")
    done = _run_script(_write_script(tmp_path), env, tmp_path / "elsewhere")
    assert done.returncode == 1
    assert "hf download Qwen/Qwen2.5-0.5B-Instruct" in done.stderr
    assert _ray_calls(env) == []  # checks come before Ray


def test_script_names_the_fix_for_an_unknown_model_type(tmp_path):
    env = _stand_in(tmp_path)
    done = _run_script(_write_script(tmp_path), {**env, "MODEL_TYPE": "qwen9-1T"},
                       tmp_path / "elsewhere")
    assert done.returncode == 1
    assert "miles has no model flags for MODEL_TYPE=qwen9-1T" in done.stderr
    assert _ray_calls(env) == []


def test_script_says_how_to_install_this_labkit():
    script = miles_backend.render_script(RunConfig(), explicit=set())
    assert "pip install -e <path to the labkit checkout>" in script
    assert "pip install labkit" not in script  # an unrelated package has that name


# ------------------------------------------------------------------ prompts and reward
MADE_UP = [Problem("toy/train/0", "Ann has 3 pens and buys 4 more. How many pens?", "7"),
           Problem("toy/train/1", "A box holds 12 eggs; 5 break. How many are whole?", "7"),
           Problem("toy/train/2", "Bo runs 2.5 km a day for 4 days. How far in km?", "10")]


def test_prompt_file_round_trips(tmp_path):
    path = miles_backend.write_prompt_data(MADE_UP, tmp_path / "p" / "prompts.jsonl")
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    flags = miles_command.parse_train_args(miles_command.build_command(RunConfig(), explicit=set()))
    for row, p in zip(rows, MADE_UP):
        assert row[flags["--input-key"]] == build_messages(p.question)  # labkit's exact prompt
        assert row[flags["--label-key"]] == p.label
    assert miles_backend.read_prompt_data(path) == MADE_UP


@pytest.mark.skipif(not GSM8K.is_dir(), reason="no shared GSM8K copy")
def test_gsm8k_prompts_match_labkit_loader(tmp_path):
    problems = load_problems(str(GSM8K), "train", n=20)
    path = miles_backend.write_prompt_data(problems, tmp_path / "gsm8k.jsonl")
    assert miles_backend.read_prompt_data(path) == problems


def test_prompt_order_is_labkit_order_at_any_batch_size():
    cfg = RunConfig(data="synthetic", num_rollout=5, rollout_batch_size=16, seed=3)
    rows = miles_backend.ordered_problems(cfg)
    problems = load_problems("synthetic", "train", seed=3, synthetic_steps=cfg.synthetic_steps)
    assert len(rows) == len(problems)
    assert sorted(p.id for p in rows) == sorted(p.id for p in problems)  # one full epoch
    for size in (16, 32):  # miles reads rows in order: step k is rows [k*size, (k+1)*size)
        for step in (0, 3):
            assert rows[step * size:(step + 1) * size] == rollout_problems(problems, step, size, 3)


def test_reward_hook_scores_with_labkits_reward():
    args = SimpleNamespace(rm_type="math")
    def sample(text):
        return SimpleNamespace(response=text, label="42")
    assert asyncio.run(miles_backend.miles_reward(args, sample("so 40 + 2\n#### 42"))) == 1.0
    assert asyncio.run(miles_backend.miles_reward(args, sample("the answer is \\boxed{42}"))) == 1.0
    group = [sample("#### 41"), sample("#### 42")]
    assert asyncio.run(miles_backend.miles_reward(args, group)) == [0.0, 1.0]


def test_custom_reward_path_travels_to_the_hook(tmp_path, monkeypatch):
    rm = tmp_path / "my_rm.py"
    rm.write_text("def half(response, label):\n    return 0.5\n")
    script = miles_backend.render_script(RunConfig(custom_rm_path=f"{rm}:half"), explicit={"custom_rm_path"})
    assert ': "${LABKIT_CUSTOM_RM_PATH:=$HERE/my_rm.py:half}"' in script  # the run folder's copy
    module = miles_backend.render_script(RunConfig(custom_rm_path="pkg.rm:f"), explicit={"custom_rm_path"})
    assert ': "${LABKIT_CUSTOM_RM_PATH:=pkg.rm:f}"' in module
    monkeypatch.setenv("LABKIT_CUSTOM_RM_PATH", f"{rm}:half")
    one = SimpleNamespace(response="#### 1", label="2")
    assert asyncio.run(miles_backend.miles_reward(SimpleNamespace(rm_type="math"), one)) == 0.5


def _my_reward(folder: Path) -> Path:
    folder.mkdir(exist_ok=True)
    path = folder / "myreward.py"
    path.write_text("def fn(response, label):\n    return 0.25\n")
    return path


def test_a_relative_custom_reward_file_scores_inside_the_job(tmp_path, monkeypatch, capsys):
    """`--custom-rm-path myreward.py:fn`, relative to where labkit ran: the job runs in the
    miles checkout, so the script scores with the run folder's copy, by its absolute path."""
    env = _stand_in(tmp_path)
    mine = _my_reward(tmp_path / "mine")
    monkeypatch.chdir(mine.parent)
    cfg = RunConfig(data="synthetic", num_rollout=2, eval_split_size=0, custom_rm_path="myreward.py:fn")
    out = tmp_path / "run"
    assert miles_backend.launch(cfg, explicit={"data", "custom_rm_path"}, dry_run=False,
                                out_dir=str(out)) == 0
    assert (out / "myreward.py").read_text() == mine.read_text()
    info = json.loads((out / miles_backend.PROVENANCE).read_text())
    assert info["config"]["custom_rm_path"] == f"{mine}:fn"  # made absolute
    done = _run_script(out / miles_backend.SCRIPT, env, tmp_path / "elsewhere")
    assert done.returncode == 0, done.stderr
    (ran,) = _train_runs(env)
    assert ran["reward"] == 0.25
    # the run folder alone travels (to a cluster): the original file is not needed
    mine.unlink()
    done = _run_script(out / miles_backend.SCRIPT, env, tmp_path / "elsewhere")
    assert done.returncode == 0, done.stderr
    assert [r["reward"] for r in _train_runs(env)] == [0.25, 0.25]


def test_a_relative_reward_file_set_at_run_time_is_made_absolute(tmp_path):
    env = _stand_in(tmp_path)
    _my_reward(tmp_path / "elsewhere")
    script = _write_script(tmp_path)
    done = _run_script(script, {**env, "LABKIT_CUSTOM_RM_PATH": "myreward.py:fn"}, tmp_path / "elsewhere")
    assert done.returncode == 0, done.stderr
    assert [r["reward"] for r in _train_runs(env)] == [0.25]
    missing = _run_script(script, {**env, "LABKIT_CUSTOM_RM_PATH": "nothere.py:fn"}, tmp_path / "elsewhere")
    assert missing.returncode == 1
    assert "no reward file at nothere.py" in missing.stderr
    assert [c["argv"][:2] for c in _ray_calls(env)] == ONE_RUN  # checked before Ray


def test_a_missing_custom_reward_file_is_refused_before_the_script(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    cfg = RunConfig(custom_rm_path="nothere.py:fn")
    assert miles_backend.launch(cfg, explicit={"custom_rm_path"}, dry_run=True, out_dir="run") == 2
    printed = capsys.readouterr()
    assert printed.err.count("\n") == 1 and "--custom-rm-path 'nothere.py:fn': no file" in printed.err
    assert printed.out == ""  # no script


# ------------------------------------------------------------------ flags miles cannot take as they are
def test_overlap_rollout_runs_train_async_on_two_gpus(tmp_path, capsys):
    """--overlap-rollout is miles' train_async.py, which asserts nothing is colocated."""
    env = _stand_in(tmp_path)
    cfg = RunConfig(overlap_rollout=True)
    script = _write_script(tmp_path, cfg)
    text = script.read_text()
    assert "--overlap-rollout: miles' train_async.py" in text and "on 2 GPU(s)" in text
    done = _run_script(script, env, tmp_path / "elsewhere")
    assert done.returncode == 0, done.stderr
    (ran,) = _train_runs(env)
    assert ran["argv"][0] == f"{env['MILES_DIR']}/train_async.py"
    flags = miles_command.parse_train_args(ran["argv"])
    assert "--colocate" not in flags and "--offload-rollout" not in flags
    assert flags["--use-rollout-logprobs"] is True and flags["--no-offload-rollout"] is True
    assert flags["--actor-num-gpus-per-node"] == flags["--rollout-num-gpus"] == "1"
    assert flags["--num-gpus-per-node"] == "2"
    (start,) = [c["argv"] for c in _ray_calls(env) if c["argv"][0] == "start"]
    assert start[start.index("--num-gpus") + 1] == "2"
    assert miles_backend.launch(cfg, explicit={"overlap_rollout"}, dry_run=True,
                                out_dir=str(tmp_path / "x")) == 0
    assert "--overlap-rollout: miles' train_async.py" in capsys.readouterr().err


@pytest.mark.parametrize("flag, value", [("rollout_seed_each_answer", True),
                                         ("rollout_logprob_prompts", 16)])
def test_flags_with_no_miles_equivalent_are_said_to_be_ignored(flag, value, tmp_path, capsys):
    cfg = RunConfig(**{flag: value})
    name = "--" + flag.replace("_", "-")
    assert miles_backend.launch(cfg, explicit={flag}, dry_run=True, out_dir=str(tmp_path / "r")) == 0
    printed = capsys.readouterr()
    assert f"labkit launch --backend miles: {name}: no miles equivalent, ignored" in printed.err
    assert f"# {name}: no miles equivalent, ignored" in printed.out  # the script's header
    assert name not in miles_command.build_command(cfg, explicit={flag})  # nothing passed
    miles_backend.launch(RunConfig(), explicit=set(), dry_run=True, out_dir=str(tmp_path / "r"))
    assert "ignored" not in capsys.readouterr().err  # left at labkit's default: nothing to say


def test_the_held_out_evaluation_and_save_interval_0_are_said_in_the_script():
    script = miles_backend.render_script(RunConfig(), explicit=set())
    header = script.split("set -euo pipefail")[0]
    assert "# --eval-split-size: the whole test split (auto" in header
    assert "# --eval-split-size: 50 held-out problems" in miles_backend.render_script(
        RunConfig(eval_split_size=50), explicit=set())
    assert "after the last\n#   (--eval-interval = --num-rollout)" in header
    assert "# --save-interval 0: labkit keeps a checkpoint only for --resume" in header
    assert "keeps it" in header
    assert "--eval-split-size" not in miles_backend.render_script(RunConfig(eval_split_size=0),
                                                                  explicit=set())


@pytest.mark.parametrize("cfg", [RunConfig(), RunConfig(eval_interval=2, kl_loss_coef=0.1),
                                 RunConfig(gradient_checkpointing=True, save_interval=3),
                                 RunConfig(save_interval=-1, rollout_sleep=False,
                                           use_dynamic_batch_size=False),
                                 RunConfig(model="someone/Other-7B"),
                                 RunConfig(overlap_rollout=True, custom_rm_path="a.py:f")])
def test_scripts_are_valid_bash(cfg, tmp_path):
    script = tmp_path / "s.sh"
    script.write_text(miles_backend.render_script(cfg, explicit=set(), gpus=2, run_name="a b"))
    done = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


# ------------------------------------------------------------------ launch
def test_main_writes_the_run_folder(tmp_path, capsys):
    cfg = RunConfig(data="synthetic", num_rollout=2, eval_interval=1, eval_split_size=4)
    out = tmp_path / "run"
    assert miles_backend.launch(cfg, explicit={"data"}, dry_run=True, out_dir=str(out)) == 0
    assert not out.exists()
    printed = capsys.readouterr().out
    assert "--n-samples-per-prompt 8" in printed and "--adam-beta2" in printed
    assert miles_backend.launch(cfg, explicit={"data"}, dry_run=False, out_dir=str(out)) == 0
    script = out / miles_backend.SCRIPT
    assert script.stat().st_mode & stat.S_IXUSR
    assert len(miles_backend.read_prompt_data(out / miles_backend.PROMPTS)) == 5000
    assert len(miles_backend.read_prompt_data(out / miles_backend.EVAL_PROMPTS)) == 4
    info = json.loads((out / miles_backend.PROVENANCE).read_text())
    assert info["config"]["n_samples_per_prompt"] == 8 and "31f1ca961a94" in info["miles"]
    assert miles_backend.launch(cfg, explicit={"data"}, dry_run=False, out_dir=str(out)) == 2  # no overwrite


def test_launch_help_says_what_miles_makes_of_each_flag(capsys):
    from labkit.cli import main as labkit

    assert labkit(["launch", "--help"]) == 0
    text = " ".join(re.sub(r"-\n\s+", "-", capsys.readouterr().out).split())
    assert "--overlap-rollout runs miles' train_async.py" in text
    assert ("--rollout-seed-each-answer and --rollout-logprob-prompts have no miles equivalent "
            "and are ignored") in text
    assert "The held-out evaluation (--eval-split-size) becomes --eval-interval" in text
    assert "--save-interval 0 (labkit: a checkpoint only for --resume" in text
