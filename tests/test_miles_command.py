"""labkit.miles.command: the recipe as miles' train.py flags, refusals, miles' defaults."""

from __future__ import annotations

import pytest

from labkit.config import RunConfig, resolve_args
from labkit.miles import command as miles_command

# The recipe (32 prompts x 8 answers, global batch 256) as miles flags, written out by hand.
RECIPE_FLAGS = {
    "--hf-checkpoint": "ckpt", "--ref-load": "ckpt", "--megatron-to-hf-mode": "bridge",
    "--prompt-data": "prompts.jsonl", "--input-key": "messages", "--label-key": "label",
    "--apply-chat-template": True,
    "--rollout-batch-size": "32", "--n-samples-per-prompt": "8",
    "--num-rollout": "${MILES_NUM_ROLLOUT:-24}", "--rollout-max-response-len": "1024",
    "--rollout-temperature": "1.0", "--rollout-top-p": "1.0", "--rollout-top-k": "-1",
    "--rollout-seed": "1234", "--global-batch-size": "256", "--micro-batch-size": "8",
    "--use-dynamic-batch-size": True, "--max-tokens-per-gpu": "12288", "--optimizer": "adam",
    "--lr": "1e-06", "--lr-decay-style": "constant", "--adam-beta1": "0.9",
    "--adam-beta2": "0.98", "--weight-decay": "0.1", "--clip-grad": "1.0", "--seed": "1234",
    "--advantage-estimator": "grpo", "--eps-clip": "0.2", "--eps-clip-high": "0.28",
    "--kl-loss-coef": "0.0", "--entropy-coef": "0.0", "--calculate-per-token-loss": True,
    "--rm-type": "math", "--custom-rm-path": "labkit.miles.miles_reward",
    # the held-out evaluation: before the first rollout and after the last, greedy
    "--eval-interval": "${MILES_NUM_ROLLOUT:-24}", "--eval-prompt-data": ["heldout", "$EVAL_DATA"],
    "--n-samples-per-eval-prompt": "1", "--eval-max-response-len": "1024", "--eval-top-k": "1",
    "--save": "$SAVE_DIR", "--save-interval": "${MILES_NUM_ROLLOUT:-24}",
    "--actor-num-nodes": "1", "--actor-num-gpus-per-node": "1", "--num-gpus-per-node": "1",
    "--colocate": True, "--rollout-num-gpus-per-engine": "1",
    "--sglang-mem-fraction-static": "0.5", "--offload-rollout": True, "--attention-dropout": "0.0",
    "--hidden-dropout": "0.0", "--accumulate-allreduce-grads-in-fp32": True,
    "--attention-softmax-in-fp32": True,
}


def flags_of(cfg: RunConfig, **kw) -> dict:
    kw = {"explicit": set(), "model_path": "ckpt", "data_path": "prompts.jsonl", **kw}
    argv = miles_command.build_command(cfg, **kw)
    assert argv[:2] == ["python3", "train_async.py" if cfg.overlap_rollout else "train.py"]
    return miles_command.parse_train_args(argv)


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
    assert flags["--eval-prompt-data"] == [miles_command.EVAL_NAME, "$EVAL_DATA"]
    assert flags["--eval-top-k"] == "1"  # greedy, as labkit's eval
    assert flags["--save-interval"] == "6"
    assert flags["--seed"] == flags["--rollout-seed"] == "7"
    assert flags["--actor-num-gpus-per-node"] == flags["--num-gpus-per-node"] == "4"
    assert "--use-kl-loss" not in flags_of(RunConfig())  # no reference model at KL 0


def test_dynamic_batch_size_maps_to_miles_with_its_token_cap():
    """miles asserts --max-tokens-per-gpu with --use-dynamic-batch-size; off, neither is
    passed and --micro-batch-size applies, in both."""
    flags = flags_of(RunConfig(max_tokens_per_gpu=4096))
    assert flags["--use-dynamic-batch-size"] is True and flags["--max-tokens-per-gpu"] == "4096"
    fixed = flags_of(RunConfig(use_dynamic_batch_size=False, max_tokens_per_gpu=4096))
    assert "--use-dynamic-batch-size" not in fixed and "--max-tokens-per-gpu" not in fixed
    assert fixed["--micro-batch-size"] == "8"


def test_held_out_evaluation_follows_eval_split_size():
    """labkit evaluates --eval-split-size problems before the first step and after the last
    (and every --eval-interval K steps); 0 problems: no evaluation, whatever K is."""
    assert flags_of(RunConfig())["--eval-interval"] == "${MILES_NUM_ROLLOUT:-24}"
    assert flags_of(RunConfig(eval_interval=6))["--eval-interval"] == "6"
    for none in (RunConfig(eval_split_size=0), RunConfig(eval_split_size=0, eval_interval=3)):
        assert not any(f.startswith("--eval") for f in flags_of(none))
    notes = {f: (t, lost) for f, t, lost in miles_command.flag_notes(RunConfig(eval_interval=5), set())}
    assert notes["--eval-split-size"][1] is True and "not after the last" in notes["--eval-split-size"][0]
    notes = {f: (t, lost) for f, t, lost in miles_command.flag_notes(RunConfig(eval_interval=6), set())}
    assert notes["--eval-split-size"][1] is False  # 24 rollouts: the 24th is evaluated


def test_overlap_rollout_is_train_async_without_colocation():
    flags = flags_of(RunConfig(overlap_rollout=True), gpus=2)
    assert "--colocate" not in flags and flags["--use-rollout-logprobs"] is True
    assert flags["--actor-num-gpus-per-node"] == flags["--rollout-num-gpus"] == "2"
    assert flags["--num-gpus-per-node"] == "4" and flags["--no-offload-rollout"] is True
    assert miles_command.total_gpus(RunConfig(overlap_rollout=True), 2) == 4


def test_save_interval_keeps_labkits_meaning():
    """K: every K and after the last; 0: after the last; -1: never. miles saves nothing
    without --save-interval, and with -1 would save every rollout."""
    assert flags_of(RunConfig(save_interval=5))["--save-interval"] == "5"
    assert flags_of(RunConfig(save_interval=0))["--save-interval"] == "${MILES_NUM_ROLLOUT:-24}"
    never = flags_of(RunConfig(save_interval=-1))
    assert "--save-interval" not in never and "--save" not in never


def test_rollout_sleep_is_the_rollout_offload_of_miles():
    assert flags_of(RunConfig())["--offload-rollout"] is True
    awake = flags_of(RunConfig(rollout_sleep=False), explicit={"rollout_sleep"})
    assert awake["--no-offload-rollout"] is True and "--offload-rollout" not in awake
    rows = {f: (o, t) for f, o, t in miles_command.default_differences(RunConfig(rollout_sleep=False))}
    assert rows["--offload-rollout"] == (False, True)
    assert "--offload-rollout" not in {f for f, _, _ in miles_command.default_differences(RunConfig())}


def test_top_p_goes_with_no_top_k_as_in_labkit():
    flags = flags_of(RunConfig(rollout_top_p=0.9))
    assert flags["--rollout-top-p"] == "0.9" and flags["--rollout-top-k"] == "-1"


def test_kv_cache_in_gib_is_refused_by_value():
    """A fixed KV cache size has no miles flag: refused, set on the command line or not."""
    for explicit in ({"rollout_kv_cache_gb"}, set()):
        with pytest.raises(miles_command.MilesUnsupported) as info:
            miles_command.build_command(RunConfig(rollout_kv_cache_gb=8.0), explicit=explicit)
        assert info.value.flags == ["--rollout-kv-cache-gb"]
        assert "--sglang-mem-fraction-static" in str(info.value)
        assert "--sglang-max-total-tokens" in str(info.value)


def test_parse_train_args_keeps_the_last_value_like_argparse():
    got = miles_command.parse_train_args(["python3", "train.py", "--a", "1", "--b", "--a", "2",
                                  "--pair", "x", "y", "--neg", "-1"])
    assert got == {"--a": "2", "--b": True, "--pair": ["x", "y"], "--neg": "-1"}


# ------------------------------------------------------------------ refusals, defaults
def test_unmappable_flags_are_refused_by_name():
    explicit = {"engine", "heat_pause_c", "time_limit", "dtype", "n_samples_per_prompt"}
    with pytest.raises(miles_command.MilesUnsupported) as info:
        miles_command.build_command(RunConfig(), explicit=explicit)
    assert info.value.flags == ["--dtype", "--engine", "--heat-pause-c", "--time-limit"]
    text = str(info.value)
    for flag in info.value.flags:
        assert flag in text
    assert "SGLang" in text and "heat guard" in text
    assert "--n-samples-per-prompt" not in text


def test_gguf_model_is_refused():
    with pytest.raises(miles_command.MilesUnsupported, match="--model"):
        miles_command.build_command(RunConfig.preset("cpu"), explicit=set())


def test_http_rollouts_are_refused_by_name():
    """--rollout-mode http sends answers to `labkit serve`'s engines; miles has its own."""
    cfg = RunConfig(rollout_mode="http", router_url="http://127.0.0.1:8000", max_open_requests=64)
    with pytest.raises(miles_command.MilesUnsupported) as info:
        miles_command.build_command(cfg, explicit={"rollout_mode", "router_url", "max_open_requests"})
    assert info.value.flags == ["--rollout-mode", "--max-open-requests", "--router-url"]
    text = str(info.value)
    assert "  --rollout-mode: http sends each answer" in text
    assert "Drop --rollout-mode http" in text and "drop --backend miles" in text
    # set without a flag (a preset, a notebook's RunConfig): refused all the same
    with pytest.raises(miles_command.MilesUnsupported, match="--rollout-mode: http"):
        miles_command.build_command(cfg, explicit=set())
    # colocate is what miles does (--colocate): asking for it is fine
    colocated = flags_of(RunConfig(rollout_mode="colocate"), explicit={"rollout_mode"})
    assert colocated["--colocate"] is True


def test_default_differences_side_by_side():
    rows = {flag: (ours, theirs) for flag, ours, theirs in miles_command.default_differences(RunConfig())}
    assert rows["--n-samples-per-prompt"] == (8, 1)
    assert rows["--adam-beta2"] == (0.98, 0.999)
    assert rows["--weight-decay"] == (0.1, 0.01)
    assert rows["--rollout-seed"] == (1234, 42)
    assert rows["--lr-decay-style"] == ("constant", "linear")
    assert rows["--calculate-per-token-loss"] == (True, False)
    assert rows["--hidden-dropout"] == (0.0, 0.1)
    assert rows["--eps-clip-high"] == (0.28, None)
    assert rows["--num-rollout"] == (24, None)
    assert rows["--use-dynamic-batch-size"] == (True, False)
    assert rows["--max-tokens-per-gpu"] == (12288, None)
    for same in ("--lr", "--eps-clip", "--seed", "--clip-grad", "--kl-loss-coef", "--kl-loss-type",
                 "--rollout-top-k", "--offload-rollout"):
        assert same not in rows  # equal, or not passed (KL type at KL weight 0)
    table = miles_command.format_differences(miles_command.default_differences(RunConfig()))
    assert "--adam-beta2" in table and "0.999" in table and "= --eps-clip" in table
    seq = {f for f, _, _ in miles_command.default_differences(RunConfig(loss_agg_mode="seq-mean"))}
    assert "--calculate-per-token-loss" not in seq
