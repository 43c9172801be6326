"""labkit.miles.log: miles' stdout logs and wandb exports read into labkit's metric names."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pytest

from labkit.miles import log as miles_log
from labkit.run.metrics import METRICS, STEP

FIXTURES = Path(__file__).parent / "fixtures" / "miles"


def test_parse_log_dict_reads_numbers_and_never_evaluates():
    text = ("{'a': np.float64(0.5), 'b': tensor(2, device='cuda:0'), 'c': nan, 'd': -3,"
            " 'e': 'text', 'f': [1, 2], 'g': __import__('os').getcwd(), 'h': numpy.int64(7)}")
    got = miles_log.parse_log_dict(text)
    assert got.keys() == {"a", "b", "c", "d", "h"}
    assert (got["a"], got["b"], got["d"], got["h"]) == (0.5, 2.0, -3.0, 7.0)
    assert math.isnan(got["c"])
    for bad in ("{'a': 1", "[1, 2]", "not a dict"):
        with pytest.raises(ValueError):
            miles_log.parse_log_dict(bad)


def test_text_log_reads_into_labkit_names():
    with pytest.warns(UserWarning, match="skipped 1 malformed"):
        df = miles_log.read_miles_log(FIXTURES / "text_run" / "miles.log")
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
    # miles' train/loss, the loss minimised as labkit's is; not train/pg_loss (0.011 at step 0)
    assert df["train/loss"].tolist() == [0.012, -0.004, 0.02]
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
        df = miles_log.read_miles_log(FIXTURES / "text_run", n_samples_per_prompt=16, seed=9)
    assert df["n_samples_per_prompt"].iloc[0] == 16 and df["seed"].iloc[0] == 9
    assert df["global_batch_size"].iloc[0] == 128  # not given: from train_args.txt


def test_printed_arguments_and_several_optimizer_steps():
    df = miles_log.read_miles_log(FIXTURES / "printed_args" / "miles.log")
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
        df = miles_log.read_miles_log(FIXTURES / "wandb_history.csv", rollout_batch_size=32,
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


def test_update_time_counts_the_old_log_prob_pass_only_with_several_steps(tmp_path):
    """labkit's perf/actor_train_time includes an old-log-prob pass only when a rollout gives
    several optimizer steps; miles always runs one and times it as perf/log_probs_time."""
    log = tmp_path / "miles.log"
    log.write_text("perf 0: {'perf/actor_train_time': 10.0, 'perf/log_probs_time': 2.0}\n"
                   "step 0: {'train/loss': 0.5}\nstep 1: {'train/loss': 0.7}\n")
    two_steps = miles_log.read_miles_log(log, rollout_batch_size=32, n_samples_per_prompt=16,
                                         global_batch_size=256)
    assert two_steps["perf/actor_train_time"].tolist() == [12.0]
    one_step = miles_log.read_miles_log(log, rollout_batch_size=32, n_samples_per_prompt=16,
                                        global_batch_size=512)
    assert one_step["perf/actor_train_time"].iloc[0] == 10.0  # (steps 0 and 1: two rollouts)


def test_entropy_miles_did_not_compute_reads_as_missing(tmp_path):
    """miles logs train/entropy_loss = 0 when it computes no entropy (coefficient 0 without
    --observe-training-entropy); labkit's train/entropy is then not recorded (NaN)."""
    log = tmp_path / "miles.log"
    log.write_text("step 0: {'train/loss': 0.1, 'train/entropy_loss': 0.0}\n"
                   "step 1: {'train/loss': 0.2, 'train/entropy_loss': 0.37}\n")
    df = miles_log.read_miles_log(log, rollout_batch_size=4, n_samples_per_prompt=4,
                                  global_batch_size=16)
    assert math.isnan(df["train/entropy"].iloc[0]) and df["train/entropy"].iloc[1] == 0.37


def test_unknown_batch_sizes_warn_and_take_one_step_per_rollout(tmp_path):
    log = tmp_path / "out.log"
    log.write_text("step 0: {'train/loss': 1.0}\nstep 1: {'train/loss': 3.0}\n")
    with pytest.warns(UserWarning, match="batch sizes unknown"):
        df = miles_log.read_miles_log(log)
    assert df[STEP].tolist() == [0, 1] and df["train/loss"].tolist() == [1.0, 3.0]


def test_a_log_without_metrics_is_refused(tmp_path):
    log = tmp_path / "sglang.log"
    log.write_text("Decode batch. #running-req: 12\n")
    with pytest.raises(ValueError, match="no miles metric lines"):
        miles_log.read_miles_log(log)
    with pytest.raises(FileNotFoundError, match="miles.log"):
        miles_log.read_miles_log(tmp_path)


def test_analysis_reads_miles_runs_as_all_clean():
    from labkit.analysis import load_runs

    with pytest.warns(UserWarning):
        runs = load_runs([FIXTURES / "text_run" / "miles.log", FIXTURES / "printed_args" / "miles.log"])
    assert set(runs["group_size"]) == {4, 16}
    assert runs["clean"].all() and not runs["heat_guard"].any()
    assert isinstance(runs, pd.DataFrame)
