"""labkit.miles: the recipe as a miles command and script, the prompt file, the reward hook,
and miles' logs read back. No GPU, no network: the script runs in bash against stub `ray`."""

from __future__ import annotations

import asyncio
import json
import math
import os
import stat
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest

from labkit import miles
from labkit.config import RunConfig, resolve_args
from labkit.data import Problem, build_messages, load_problems, rollout_problems
from labkit.metrics import METRICS, STEP

FIXTURES = Path(__file__).parent / "fixtures" / "miles"
GSM8K = Path(__file__).parents[1] / ".." / "shared" / "data" / "gsm8k"
REPO = Path(__file__).parents[1]

# The recipe (32 prompts x 8 answers, global batch 256) as miles flags, written out by hand.
RECIPE_FLAGS = {
    "--hf-checkpoint": "ckpt", "--ref-load": "ckpt", "--megatron-to-hf-mode": "bridge",
    "--prompt-data": "prompts.jsonl", "--input-key": "messages", "--label-key": "label",
    "--apply-chat-template": True,
    "--rollout-batch-size": "32", "--n-samples-per-prompt": "8",
    "--num-rollout": "${MILES_NUM_ROLLOUT:-24}", "--rollout-max-response-len": "1024",
    "--rollout-temperature": "1.0", "--rollout-top-p": "1.0", "--rollout-seed": "1234",
    "--global-batch-size": "256", "--micro-batch-size": "8", "--optimizer": "adam",
    "--lr": "1e-06", "--lr-decay-style": "constant", "--adam-beta1": "0.9",
    "--adam-beta2": "0.98", "--weight-decay": "0.1", "--clip-grad": "1.0", "--seed": "1234",
    "--advantage-estimator": "grpo", "--eps-clip": "0.2", "--eps-clip-high": "0.28",
    "--kl-loss-coef": "0.0", "--entropy-coef": "0.0", "--calculate-per-token-loss": True,
    "--rm-type": "math", "--custom-rm-path": "labkit.miles.miles_reward",
    "--save": "$SAVE_DIR", "--save-interval": "${MILES_NUM_ROLLOUT:-24}",
    "--actor-num-nodes": "1", "--actor-num-gpus-per-node": "1", "--num-gpus-per-node": "1",
    "--colocate": True, "--rollout-num-gpus-per-engine": "1",
    "--sglang-mem-fraction-static": "0.5", "--attention-dropout": "0.0",
    "--hidden-dropout": "0.0", "--accumulate-allreduce-grads-in-fp32": True,
    "--attention-softmax-in-fp32": True,
}


def flags_of(cfg: RunConfig, **kw) -> dict:
    kw = {"explicit": set(), "model_path": "ckpt", "data_path": "prompts.jsonl", **kw}
    argv = miles.build_command(cfg, **kw)
    assert argv[:2] == ["python3", "train.py"]
    return miles.parse_train_args(argv)


# ------------------------------------------------------------------ the command
def test_recipe_command_flag_by_flag():
    assert flags_of(RunConfig()) == RECIPE_FLAGS


@pytest.mark.parametrize("n, g", [(4, 128), (16, 512)])
def test_group_size_variants_from_miles_extra_args(n, g):
    extra = f"--n-samples-per-prompt {n} --global-batch-size {g}"
    cfg, explicit = resolve_args([], env={"MILES_NUM_ROLLOUT": "24", "MILES_EXTRA_ARGS": extra})
    flags = flags_of(cfg, explicit=explicit)
    assert flags == {**RECIPE_FLAGS, "--n-samples-per-prompt": str(n), "--global-batch-size": str(g)}


def test_command_follows_the_other_knobs():
    cfg = RunConfig(kl_loss_coef=0.01, loss_agg_mode="seq-mean", disable_grpo_std_normalization=True,
                    gradient_checkpointing=True, eval_interval=4, save_interval=6, seed=7)
    flags = flags_of(cfg, gpus=4)
    assert flags["--use-kl-loss"] is True and flags["--kl-loss-type"] == "k3"
    assert flags["--kl-loss-coef"] == "0.01"
    assert "--calculate-per-token-loss" not in flags  # seq-mean is miles' default
    assert flags["--disable-grpo-std-normalization"] is True
    assert flags["--recompute-granularity"] == "full"
    assert flags["--eval-interval"] == "4"
    assert flags["--eval-prompt-data"] == [miles.EVAL_NAME, "$EVAL_DATA"]
    assert flags["--eval-top-k"] == "1"  # greedy, as labkit's eval
    assert flags["--save-interval"] == "6"
    assert flags["--seed"] == flags["--rollout-seed"] == "7"
    assert flags["--actor-num-gpus-per-node"] == flags["--num-gpus-per-node"] == "4"
    assert "--use-kl-loss" not in flags_of(RunConfig())  # no reference model at KL 0


def test_parse_train_args_keeps_the_last_value_like_argparse():
    got = miles.parse_train_args(["python3", "train.py", "--a", "1", "--b", "--a", "2",
                                  "--pair", "x", "y", "--neg", "-1"])
    assert got == {"--a": "2", "--b": True, "--pair": ["x", "y"], "--neg": "-1"}


# ------------------------------------------------------------------ refusals, defaults
def test_unmappable_flags_are_refused_by_name():
    explicit = {"engine", "heat_pause_c", "time_limit", "dtype", "n_samples_per_prompt"}
    with pytest.raises(miles.MilesUnsupported) as info:
        miles.build_command(RunConfig(), explicit=explicit)
    assert info.value.flags == ["--dtype", "--engine", "--heat-pause-c", "--time-limit"]
    text = str(info.value)
    for flag in info.value.flags:
        assert flag in text
    assert "SGLang" in text and "heat guard" in text
    assert "--n-samples-per-prompt" not in text


def test_gguf_model_is_refused():
    with pytest.raises(miles.MilesUnsupported, match="--model"):
        miles.build_command(RunConfig.preset("cpu"), explicit=set())


def test_main_prints_the_refusal_and_fails(capsys, tmp_path):
    code = miles.main(RunConfig(), explicit={"engine"}, dry_run=True, out_dir=str(tmp_path))
    assert code == 2
    assert "--engine" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())


def test_default_differences_side_by_side():
    rows = {flag: (ours, theirs) for flag, ours, theirs in miles.default_differences(RunConfig())}
    assert rows["--n-samples-per-prompt"] == (8, 1)
    assert rows["--adam-beta2"] == (0.98, 0.999)
    assert rows["--weight-decay"] == (0.1, 0.01)
    assert rows["--rollout-seed"] == (1234, 42)
    assert rows["--lr-decay-style"] == ("constant", "linear")
    assert rows["--calculate-per-token-loss"] == (True, False)
    assert rows["--hidden-dropout"] == (0.0, 0.1)
    assert rows["--eps-clip-high"] == (0.28, None)
    assert rows["--num-rollout"] == (24, None)
    for same in ("--lr", "--eps-clip", "--seed", "--clip-grad", "--kl-loss-coef", "--kl-loss-type"):
        assert same not in rows  # equal, or not passed (KL type at KL weight 0)
    table = miles.format_differences(miles.default_differences(RunConfig()))
    assert "--adam-beta2" in table and "0.999" in table and "= --eps-clip" in table
    seq = {f for f, _, _ in miles.default_differences(RunConfig(loss_agg_mode="seq-mean"))}
    assert "--calculate-per-token-loss" not in seq


# ------------------------------------------------------------------ the script, run in bash
def _stub_cluster(tmp_path: Path) -> dict:
    """A fake miles checkout, model and `ray`; returns the environment to run the script in."""
    bin_dir, miles_dir, ckpt = tmp_path / "bin", tmp_path / "miles", tmp_path / "ckpt"
    (miles_dir / "scripts" / "models").mkdir(parents=True)
    (miles_dir / "scripts" / "models" / "qwen2.5-0.5B.sh").write_text(
        "MODEL_ARGS=(--num-layers 24 --hidden-size 896)\n")
    ckpt.mkdir()
    bin_dir.mkdir()
    ray = bin_dir / "ray"
    ray.write_text('#!/usr/bin/env bash\nif [ "$1" = job ]; then\n'
                   '  while [ "$1" != -- ]; do shift; done; shift\n'
                   '  printf "%s\\n" "$@" > "$RAY_STUB_OUT"; echo "perf 0: {}"\nfi\n')
    ray.chmod(ray.stat().st_mode | stat.S_IEXEC)
    (bin_dir / "python3").symlink_to(sys.executable)
    return {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "HOME": str(tmp_path),
            "MILES_DIR": str(miles_dir), "HF_CHECKPOINT": str(ckpt), "PYTHONPATH": str(REPO),
            "RAY_STUB_OUT": str(tmp_path / "ray_argv.txt")}


def _run_script(tmp_path: Path, env: dict, cfg: RunConfig = RunConfig()) -> subprocess.CompletedProcess:
    run_dir = tmp_path / "run"
    run_dir.mkdir(exist_ok=True)
    (run_dir / miles.PROMPTS).write_text("")
    script = run_dir / miles.SCRIPT
    script.write_text(miles.render_script(cfg, explicit=set()))
    return subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=60)


def test_script_applies_the_course_overrides_at_run_time(tmp_path):
    env = _stub_cluster(tmp_path)
    env.update(MILES_NUM_ROLLOUT="12",
               MILES_EXTRA_ARGS="--n-samples-per-prompt 4 --global-batch-size 128")
    done = _run_script(tmp_path, env)
    assert done.returncode == 0, done.stderr
    argv = Path(env["RAY_STUB_OUT"]).read_text().splitlines()
    assert argv[:4] == ["python3", "train.py", "--num-layers", "24"]  # model flags first
    ran = miles.parse_train_args(argv)
    assert ran["--n-samples-per-prompt"] == "4" and ran["--global-batch-size"] == "128"
    assert ran["--num-rollout"] == ran["--save-interval"] == "12"
    assert ran["--hf-checkpoint"] == env["HF_CHECKPOINT"]
    assert ran["--prompt-data"] == str(tmp_path / "run" / miles.PROMPTS)
    assert ran["--rollout-batch-size"] == "32"
    # what ran is on disk beside the log, and the log is tee'd there
    assert (tmp_path / "run" / miles.TRAIN_ARGS).read_text().splitlines() == argv[2:]
    assert "perf 0: {}" in (tmp_path / "run" / miles.LOG).read_text()


def test_script_names_the_fix_when_the_model_is_missing(tmp_path):
    env = _stub_cluster(tmp_path)
    env["HF_CHECKPOINT"] = str(tmp_path / "nowhere")
    done = _run_script(tmp_path, env)
    assert done.returncode == 1
    assert "hf download Qwen/Qwen2.5-0.5B-Instruct" in done.stderr
    assert not Path(env["RAY_STUB_OUT"]).exists()


# ------------------------------------------------------------------ prompts and reward
MADE_UP = [Problem("toy/train/0", "Ann has 3 pens and buys 4 more. How many pens?", "7"),
           Problem("toy/train/1", "A box holds 12 eggs; 5 break. How many are whole?", "7"),
           Problem("toy/train/2", "Bo runs 2.5 km a day for 4 days. How far in km?", "10")]


def test_prompt_file_round_trips(tmp_path):
    path = miles.write_prompt_data(MADE_UP, tmp_path / "p" / "prompts.jsonl")
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    flags = flags_of(RunConfig())
    for row, p in zip(rows, MADE_UP):
        assert row[flags["--input-key"]] == build_messages(p.question)  # labkit's exact prompt
        assert row[flags["--label-key"]] == p.label
    assert miles.read_prompt_data(path) == MADE_UP


@pytest.mark.skipif(not GSM8K.is_dir(), reason="no shared GSM8K copy")
def test_gsm8k_prompts_match_labkit_loader(tmp_path):
    problems = load_problems(str(GSM8K), "train", n=20)
    path = miles.write_prompt_data(problems, tmp_path / "gsm8k.jsonl")
    assert miles.read_prompt_data(path) == problems


def test_prompt_order_is_labkit_order_at_any_batch_size():
    cfg = RunConfig(data="synthetic", num_rollout=5, rollout_batch_size=16, seed=3)
    rows = miles.ordered_problems(cfg)
    problems = load_problems("synthetic", "train", seed=3, synthetic_steps=cfg.synthetic_steps)
    assert len(rows) == len(problems)
    assert sorted(p.id for p in rows) == sorted(p.id for p in problems)  # one full epoch
    for size in (16, 32):  # miles reads rows in order: step k is rows [k*size, (k+1)*size)
        for step in (0, 3):
            assert rows[step * size:(step + 1) * size] == rollout_problems(problems, step, size, 3)


def test_reward_hook_scores_with_labkits_reward():
    args = SimpleNamespace(rm_type="math")
    sample = lambda text: SimpleNamespace(response=text, label="42")
    assert asyncio.run(miles.miles_reward(args, sample("so 40 + 2\n#### 42"))) == 1.0
    assert asyncio.run(miles.miles_reward(args, sample("the answer is \\boxed{42}"))) == 1.0
    group = [sample("#### 41"), sample("#### 42")]
    assert asyncio.run(miles.miles_reward(args, group)) == [0.0, 1.0]


def test_custom_reward_path_travels_to_the_hook(tmp_path, monkeypatch):
    rm = tmp_path / "my_rm.py"
    rm.write_text("def half(response, label):\n    return 0.5\n")
    script = miles.render_script(RunConfig(custom_rm_path=f"{rm}:half"), explicit={"custom_rm_path"})
    assert f': "${{LABKIT_CUSTOM_RM_PATH:={rm}:half}}"' in script
    monkeypatch.setenv("LABKIT_CUSTOM_RM_PATH", f"{rm}:half")
    one = SimpleNamespace(response="#### 1", label="2")
    assert asyncio.run(miles.miles_reward(SimpleNamespace(rm_type="math"), one)) == 0.5


@pytest.mark.parametrize("cfg", [RunConfig(), RunConfig(eval_interval=2, kl_loss_coef=0.1),
                                 RunConfig(gradient_checkpointing=True, save_interval=3)])
def test_scripts_are_valid_bash(cfg, tmp_path):
    script = tmp_path / "s.sh"
    script.write_text(miles.render_script(cfg, explicit=set(), gpus=2, run_name="a b"))
    done = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


# ------------------------------------------------------------------ launch
def test_main_writes_the_run_folder(tmp_path, capsys):
    cfg = RunConfig(data="synthetic", num_rollout=2, eval_interval=1, eval_split_size=4)
    out = tmp_path / "run"
    assert miles.main(cfg, explicit={"data"}, dry_run=True, out_dir=str(out)) == 0
    assert not out.exists()
    printed = capsys.readouterr().out
    assert "--n-samples-per-prompt 8" in printed and "--adam-beta2" in printed
    assert miles.main(cfg, explicit={"data"}, dry_run=False, out_dir=str(out)) == 0
    script = out / miles.SCRIPT
    assert script.stat().st_mode & stat.S_IXUSR
    assert len(miles.read_prompt_data(out / miles.PROMPTS)) == 5000
    assert len(miles.read_prompt_data(out / miles.EVAL_PROMPTS)) == 4
    info = json.loads((out / miles.PROVENANCE).read_text())
    assert info["config"]["n_samples_per_prompt"] == 8 and "00e365d" in info["miles"]
    assert miles.main(cfg, explicit={"data"}, dry_run=False, out_dir=str(out)) == 2  # no overwrite


# ------------------------------------------------------------------ logs back
def test_parse_log_dict_reads_numbers_and_never_evaluates():
    text = ("{'a': np.float64(0.5), 'b': tensor(2, device='cuda:0'), 'c': nan, 'd': -3,"
            " 'e': 'text', 'f': [1, 2], 'g': __import__('os').getcwd(), 'h': numpy.int64(7)}")
    got = miles.parse_log_dict(text)
    assert got.keys() == {"a", "b", "c", "d", "h"}
    assert (got["a"], got["b"], got["d"], got["h"]) == (0.5, 2.0, -3.0, 7.0)
    assert math.isnan(got["c"])
    for bad in ("{'a': 1", "[1, 2]", "not a dict"):
        with pytest.raises(ValueError):
            miles.parse_log_dict(bad)


def test_text_log_reads_into_labkit_names():
    with pytest.warns(UserWarning, match="skipped 1 malformed"):
        df = miles.read_miles_log(FIXTURES / "text_run" / "miles.log")
    assert list(df.columns[:len(METRICS)]) == list(METRICS)
    assert df[STEP].tolist() == [0, 1, 2]
    assert df["rollout/raw_reward"].tolist() == [0.40625, 0.4375, 0.5]
    assert df["rollout/response_len/mean"].iloc[:2].tolist() == [212.5, 208.0]
    assert math.isnan(df["rollout/response_len/mean"].iloc[2])  # its perf line was cut off
    assert df["perf/rollout_time"].iloc[:2].tolist() == [30.5, 29.75]
    assert df["perf/actor_train_time"].tolist() == [12.25, 12.0, 11.5]
    # zero_std: (5 all-0 + 3 all-1 groups) / 32 prompts
    assert df["rollout/zero_std/frac_groups"].iloc[0] == 8 / 32
    assert df["rollout/zero_std/all_zero_percentage"].iloc[0] == 5 / 32
    assert df["rollout/tokens"].iloc[0] == 212.5 * 32 * 4
    assert df["perf/tokens_per_s"].iloc[0] == pytest.approx(212.5 * 128 / 30.5)
    assert df["train/loss"].tolist() == [0.011, -0.004, 0.02]  # the policy loss (pg_loss)
    assert df["train/grad_norm"].tolist() == [0.31, 0.29, 0.35]  # one was a tensor(...)
    assert df["train/entropy"].iloc[0] == 0.41 and df["train/lr"].iloc[0] == 1e-6
    assert df["train/steps"].tolist() == [1, 1, 1]  # the critic-step line is not the actor's
    assert df["eval/accuracy"].iloc[0] == 0.34375 and math.isnan(df["eval/accuracy"].iloc[1])
    assert df["heat/clean"].isna().all()  # miles has no heat guard
    # config: train_args.txt, where MILES_EXTRA_ARGS came last and won
    assert df[["rollout_batch_size", "n_samples_per_prompt", "global_batch_size", "seed"]].iloc[0].tolist() \
        == [32, 4, 128, 1234]
    assert (df["run_name"] == "text_run").all()


def test_config_given_wins_over_the_files():
    with pytest.warns(UserWarning):
        df = miles.read_miles_log(FIXTURES / "text_run", n_samples_per_prompt=16, seed=9)
    assert df["n_samples_per_prompt"].iloc[0] == 16 and df["seed"].iloc[0] == 9
    assert df["global_batch_size"].iloc[0] == 128  # not given: from train_args.txt


def test_printed_arguments_and_several_optimizer_steps():
    df = miles.read_miles_log(FIXTURES / "printed_args" / "miles.log")
    assert df[["rollout_batch_size", "n_samples_per_prompt", "global_batch_size", "seed"]].iloc[0].tolist() \
        == [32, 16, 256, 7]
    # 32 x 16 / 256 = 2 optimizer steps per rollout: steps 0,1 -> rollout 0; 2,3 -> rollout 1
    assert df["train/steps"].tolist() == [2, 2]
    assert df["train/loss"].tolist() == pytest.approx([0.2, -0.1])
    assert df["train/grad_norm"].tolist() == pytest.approx([0.6, 0.5])
    # counts only (an older miles): shares from counts / 32 prompts
    assert df["rollout/zero_std/all_zero_percentage"].tolist() == [6 / 32, 2 / 32]
    assert df["rollout/zero_std/frac_groups"].tolist() == [6 / 32, 8 / 32]


def test_wandb_export_reads_like_the_text_log():
    with pytest.warns(UserWarning, match="skipped 2 malformed"):
        df = miles.read_miles_log(FIXTURES / "wandb_history.csv", rollout_batch_size=32,
                                  n_samples_per_prompt=16, global_batch_size=256, seed=3)
    assert df[STEP].tolist() == [0, 1]
    assert df["rollout/raw_reward"].tolist() == [0.375, 0.4375]
    assert df["perf/rollout_time"].tolist() == [120.5, 118.0]
    assert df["perf/actor_train_time"].tolist() == [25.0, 24.0]
    assert df["train/loss"].tolist() == pytest.approx([0.06, -0.01])
    assert df["train/steps"].tolist() == [2, 1]  # step 3's row is unreadable, step 2's extra row bad
    assert df["rollout/zero_std/frac_groups"].tolist() == pytest.approx([0.3125, 0.3125])
    assert df["eval/accuracy"].iloc[0] == 0.25
    assert df["seed"].tolist() == [3, 3]


def test_unknown_batch_sizes_warn_and_take_one_step_per_rollout(tmp_path):
    log = tmp_path / "out.log"
    log.write_text("step 0: {'train/loss': 1.0}\nstep 1: {'train/loss': 3.0}\n")
    with pytest.warns(UserWarning, match="batch sizes unknown"):
        df = miles.read_miles_log(log)
    assert df[STEP].tolist() == [0, 1] and df["train/loss"].tolist() == [1.0, 3.0]


def test_a_log_without_metrics_is_refused(tmp_path):
    log = tmp_path / "sglang.log"
    log.write_text("Decode batch. #running-req: 12\n")
    with pytest.raises(ValueError, match="no miles metric lines"):
        miles.read_miles_log(log)
    with pytest.raises(FileNotFoundError, match="miles.log"):
        miles.read_miles_log(tmp_path)


def test_analysis_reads_miles_runs_as_all_clean():
    from labkit.analysis import load_runs

    with pytest.warns(UserWarning):
        runs = load_runs([FIXTURES / "text_run" / "miles.log", FIXTURES / "printed_args" / "miles.log"])
    assert set(runs["group_size"]) == {4, 16}
    assert runs["clean"].all() and not runs["heat_guard"].any()
    assert isinstance(runs, pd.DataFrame)
