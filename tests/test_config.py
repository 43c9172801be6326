"""RunConfig: the batch arithmetic, refusals that name the fix, flags and miles' env vars."""

import pytest

from labkit.config import ConfigError, RunConfig, config_from_args, parse_duration, resolve_args


def test_recipe_defaults_are_the_course_recipe():
    cfg = RunConfig().check()
    assert (cfg.rollout_batch_size, cfg.n_samples_per_prompt, cfg.global_batch_size) == (32, 8, 256)
    assert cfg.rm_type == "math" and cfg.num_rollout == 24
    assert cfg.steps_per_rollout == 1
    assert (cfg.lr, cfg.eps_clip, cfg.eps_clip_high, cfg.kl_loss_coef) == (1e-6, 0.2, 0.28, 0.0)
    assert cfg.rollout_max_response_len == 1024 and cfg.rollout_temperature == 1.0


def test_global_batch_that_does_not_divide_names_the_fix():
    with pytest.raises(ConfigError) as e:
        RunConfig(n_samples_per_prompt=4, global_batch_size=256).check()
    msg = str(e.value)
    assert "--global-batch-size 128 for 32 prompts x 4" in msg
    assert "--rollout-batch-size 32" in msg and "--n-samples-per-prompt 4" in msg


def test_global_batch_larger_than_rollout_is_refused():
    with pytest.raises(ConfigError, match="--global-batch-size 256 for 32 prompts x 8"):
        RunConfig(global_batch_size=512).check()


def test_group_of_one_has_no_baseline():
    with pytest.raises(ConfigError, match="at least 2 answers"):
        RunConfig(n_samples_per_prompt=1, global_batch_size=32).check()


@pytest.mark.parametrize("field", ["rollout_batch_size", "global_batch_size", "num_rollout"])
def test_values_below_one_are_refused(field):
    with pytest.raises(ConfigError, match="--" + field.replace("_", "-")):
        RunConfig(**{field: 0}).check()


def test_several_steps_per_rollout():
    cfg = RunConfig(global_batch_size=64).check()
    assert cfg.steps_per_rollout == 4


def test_unknown_flag_lists_valid_flags():
    with pytest.raises(ConfigError) as e:
        config_from_args(["--n-samples", "4"], env={})
    assert "unknown flag --n-samples" in str(e.value)
    assert "--n-samples-per-prompt" in str(e.value)


def test_unknown_rm_type_lists_valid_ones():
    with pytest.raises(ConfigError, match="--rm-type 'f1' is not valid; valid: math"):
        config_from_args(["--rm-type", "f1"], env={})


def test_flags_parse_into_fields():
    cfg = config_from_args(
        ["--rollout-batch-size", "16", "--n-samples-per-prompt", "8", "--global-batch-size", "128",
         "--rm-type", "math", "--lr", "1e-5", "--gradient-checkpointing"], env={})
    assert (cfg.rollout_batch_size, cfg.global_batch_size, cfg.lr) == (16, 128, 1e-5)
    assert cfg.gradient_checkpointing is True


def test_miles_env_vars_as_the_course_writes_them():
    env = {"MILES_NUM_ROLLOUT": "24",
           "MILES_EXTRA_ARGS": "--n-samples-per-prompt 4 --global-batch-size 128"}
    cfg, explicit = resolve_args(["--num-rollout", "3", "--n-samples-per-prompt", "16"], env=env)
    # argv beats MILES_NUM_ROLLOUT; MILES_EXTRA_ARGS comes last and beats argv
    assert cfg.num_rollout == 3
    assert (cfg.n_samples_per_prompt, cfg.global_batch_size) == (4, 128)
    assert {"num_rollout", "n_samples_per_prompt", "global_batch_size"} <= explicit


def test_miles_num_rollout_alone():
    assert config_from_args([], env={"MILES_NUM_ROLLOUT": "5"}).num_rollout == 5


def test_extra_args_that_break_the_arithmetic_are_refused():
    with pytest.raises(ConfigError, match="--global-batch-size 128 for 32 prompts x 4"):
        config_from_args([], env={"MILES_EXTRA_ARGS": "--n-samples-per-prompt 4"})


def test_preset_cpu_is_small_and_offline():
    cfg = RunConfig.preset("cpu").check()
    assert cfg.model == "smollm2" and cfg.data == "synthetic" and cfg.engine == "hf"
    assert cfg.samples_per_rollout == cfg.global_batch_size
    with pytest.raises(ConfigError, match="unknown preset"):
        RunConfig.preset("gpu-xl")


def test_replace_refuses_unknown_fields():
    with pytest.raises(ConfigError, match="unknown field 'group_size'; valid fields: .*n_samples_per_prompt"):
        RunConfig().replace(group_size=4)


@pytest.mark.parametrize("text,seconds", [("90", 90), ("90m", 5400), ("2h", 7200), ("1h30m", 5400), (45, 45)])
def test_durations(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["two hours", "-5", "0", "5x"])
def test_bad_durations(text):
    with pytest.raises(ConfigError, match="--time-limit"):
        parse_duration(text)


def test_heat_thresholds_checked():
    with pytest.raises(ConfigError, match="--heat-resume-c 90"):
        RunConfig(heat_pause_c=85, heat_resume_c=90).check()


def test_optional_number_flags_parse_as_numbers():
    from labkit.config import resolve_args

    cfg, _ = resolve_args(["--rollout-kv-cache-gb", "8", "--no-rollout-sleep"])
    assert cfg.rollout_kv_cache_gb == 8.0 and cfg.rollout_sleep is False
    with pytest.raises(ConfigError, match="--rollout-kv-cache-gb"):
        resolve_args(["--rollout-kv-cache-gb", "0"])


# ------------------------------------------------------------------ numbers are checked
FLOAT_FIELDS = [f.name for f in __import__("dataclasses").fields(RunConfig)
                if str(f.type) in ("float", "float | None")]


@pytest.mark.parametrize("bad", ["nan", "inf", "-inf"])
@pytest.mark.parametrize("field", FLOAT_FIELDS)
def test_every_float_flag_refuses_nan_and_infinity(field, bad):
    flag = "--" + field.replace("_", "-")
    with pytest.raises(ConfigError, match=f"{flag} must be a finite number, got {bad}"):
        config_from_args([f"{flag}={bad}"], env={})


@pytest.mark.parametrize("flags, message", [
    (["--clip-grad=-1"], r"--clip-grad must be > 0 \(a negative threshold reverses every update"),
    (["--clip-grad", "0"], "--clip-grad must be > 0"),
    (["--weight-decay=-0.1"], "--weight-decay must be >= 0"),
    (["--rollout-temperature", "0"], "--rollout-temperature must be > 0 .*greedy decoding is for "
                                     "evaluation only"),
    (["--adam-beta2", "1"], r"--adam-beta2 must be in \[0, 1\)"),
    (["--kl-loss-coef=-1"], "--kl-loss-coef must be >= 0"),
    (["--request-timeout", "0"], "--request-timeout must be > 0 seconds"),
    (["--save-interval=-2"], "--save-interval must be a whole number >= -1"),
    (["--seed", "99999999999999999999"], "--seed must be a whole number from 0 to 4294967295"),
    (["--seed", "-1"], "--seed must be a whole number from 0 to 4294967295, got -1"),
])
def test_numbers_out_of_range_name_the_flag(flags, message):
    with pytest.raises(ConfigError, match=message):
        config_from_args(flags, env={})


def test_a_number_of_the_wrong_kind_is_refused_in_a_notebook():
    with pytest.raises(ConfigError, match=r"--lr must be a number, got '1e-5'"):
        RunConfig(lr="1e-5").check()


def test_dry_run_checks_the_numbers_too(capsys):
    from labkit.cli import main

    assert main(["launch", "--dry-run", "--lr", "nan"]) == 2
    assert capsys.readouterr().err.strip() == "labkit launch: --lr must be a finite number, got nan"


def test_a_micro_batch_the_user_never_set_follows_a_small_global_batch():
    cfg = config_from_args(["--rollout-batch-size", "1", "--n-samples-per-prompt", "4",
                            "--global-batch-size", "4"], env={})
    assert cfg.micro_batch_size == 4
    with pytest.raises(ConfigError, match="--micro-batch-size 8 is larger than --global-batch-size 4"):
        config_from_args(["--rollout-batch-size", "1", "--n-samples-per-prompt", "4",
                          "--global-batch-size", "4", "--micro-batch-size", "8"], env={})
    RunConfig(rollout_batch_size=1, n_samples_per_prompt=4, global_batch_size=4).check()


def test_an_unbalanced_quote_in_miles_extra_args_names_the_variable():
    with pytest.raises(ConfigError, match=r"MILES_EXTRA_ARGS: no closing quotation in "
                                          r"\"--lr '1e-5\"; balance the quotes"):
        config_from_args([], env={"MILES_EXTRA_ARGS": "--lr '1e-5"})


def test_a_custom_reward_file_that_is_not_there_is_refused_before_loading(tmp_path):
    with pytest.raises(ConfigError, match=r"--custom-rm-path '.*nope.py:score': no file .*nope.py"):
        config_from_args(["--custom-rm-path", f"{tmp_path}/nope.py:score"], env={})
    with pytest.raises(ConfigError, match="use package.module:function"):
        config_from_args(["--custom-rm-path", "no_colon"], env={})


# ------------------------------------------------------------------ hostile values, said in one line
def test_synthetic_steps_above_the_bound_are_refused_before_any_problem_is_written():
    from labkit.config import MAX_SYNTHETIC_STEPS
    from labkit.data import synthetic_problems

    with pytest.raises(ConfigError, match=rf"--synthetic-steps must be a whole number from 0 .* "
                                          rf"to {MAX_SYNTHETIC_STEPS} .*got 1000000"):
        config_from_args(["--synthetic-steps", "1000000"], env={})
    assert config_from_args(["--synthetic-steps", str(MAX_SYNTHETIC_STEPS)], env={})
    with pytest.raises(ValueError, match="steps from 0 to"):
        synthetic_problems(1, MAX_SYNTHETIC_STEPS + 1, seed=0)
    longest = max(len(p.question) for p in synthetic_problems(50, MAX_SYNTHETIC_STEPS, seed=0))
    assert longest < 2000  # what the bound buys: a question of a few hundred tokens at most


def test_a_second_preset_is_refused_not_silently_put_in_place_of_the_first():
    with pytest.raises(ConfigError, match=r"--preset given twice \(cpu, recipe\): .* keep one"):
        config_from_args(["--preset", "cpu", "--preset", "recipe"], env={})
    with pytest.raises(ConfigError, match=r"\(cpu, recipe\) \(the last from MILES_EXTRA_ARGS\)"):
        config_from_args(["--preset", "cpu"], env={"MILES_EXTRA_ARGS": "--preset recipe"})
    assert config_from_args(["--preset", "cpu", "--preset", "cpu"], env={}).model == "smollm2"
    assert config_from_args([], env={"MILES_EXTRA_ARGS": "--preset cpu"}).model == "smollm2"


def test_an_upper_clip_below_the_lower_one_is_refused():
    with pytest.raises(ConfigError, match=r"--eps-clip-high 0.1 is below --eps-clip 0.2.*"
                                          r"use --eps-clip-high 0.2 or more"):
        config_from_args(["--eps-clip-high", "0.1"], env={})
    assert config_from_args(["--eps-clip", "0.2", "--eps-clip-high", "0.2"], env={})


@pytest.mark.parametrize("env, message", [
    ({"MILES_NUM_ROLLOUT": "abc"}, r"MILES_NUM_ROLLOUT='abc': the number of rollouts "
                                   r"\(--num-rollout\) is a whole number >= 1"),
    ({"MILES_NUM_ROLLOUT": "0"}, r"MILES_NUM_ROLLOUT='0': "),
    ({"MILES_EXTRA_ARGS": "--num-rollout abc"}, r"MILES_EXTRA_ARGS='--num-rollout abc': argument "
                                                r"--num-rollout: invalid int value: 'abc'"),
    ({"MILES_EXTRA_ARGS": "--n-samples 4"}, r"MILES_EXTRA_ARGS='--n-samples 4': unknown flag --n-samples"),
    ({"MILES_EXTRA_ARGS": "--lr nan"}, r"--lr must be a finite number, got nan \(--lr comes from "
                                      r"MILES_EXTRA_ARGS='--lr nan'\)"),
])
def test_a_bad_value_from_miles_environment_variables_names_the_variable(env, message):
    with pytest.raises(ConfigError, match=message):
        config_from_args([], env=env)


@pytest.mark.parametrize("value", ["-5m", "-5", "-1h30m"])
def test_a_negative_time_limit_is_refused_as_negative_not_as_missing(value):
    with pytest.raises(ConfigError, match=rf"--time-limit '{value}' must be positive"):
        config_from_args(["--time-limit", value], env={})
    with pytest.raises(ConfigError, match=rf"--time-limit '{value}' must be positive"):
        config_from_args([], env={"MILES_EXTRA_ARGS": f"--time-limit {value}"})


def test_a_value_starting_with_a_dash_is_read_as_the_value():
    cfg = config_from_args(["--run-name", "-x", "--lr", "-1e-3", "--lr", "2e-5"], env={})
    assert cfg.run_name == "-x" and cfg.lr == 2e-5
    with pytest.raises(ConfigError, match="--seed: invalid int value: '-1e3'"):
        config_from_args(["--seed", "-1e3"], env={})
    with pytest.raises(ConfigError, match="--run-name: expected one argument"):
        config_from_args(["--run-name", "--lr", "1"], env={})  # a flag is still a flag


def test_a_rollout_too_large_to_build_is_refused_before_anything_loads():
    from labkit.config import MAX_SAMPLES_PER_ROLLOUT

    with pytest.raises(ConfigError, match=r"--rollout-batch-size 100000000000 x --n-samples-per-prompt "
                                          r"2 = 200,000,000,000 answers per rollout; labkit takes "
                                          r"at most 65,536"):
        config_from_args(["--rollout-batch-size", "100000000000", "--n-samples-per-prompt", "2",
                          "--global-batch-size", "200000000000"], env={})
    RunConfig(rollout_batch_size=MAX_SAMPLES_PER_ROLLOUT // 8,
              global_batch_size=MAX_SAMPLES_PER_ROLLOUT).check()


def test_a_huge_synthetic_split_is_the_whole_split_not_a_hang():
    from labkit.data import SYNTHETIC_SPLIT_MAX, load_problems

    assert len(load_problems("synthetic", "test", n=10**20)) == SYNTHETIC_SPLIT_MAX


def test_local_copies_of_the_recipes_model_and_data_come_from_the_environment(monkeypatch, tmp_path):
    assert (RunConfig().model, RunConfig().data) == ("Qwen/Qwen2.5-0.5B-Instruct", "gsm8k")
    model, data = tmp_path / "qwen.gguf", tmp_path / "gsm8k"
    monkeypatch.setenv("LABKIT_MODEL", str(model))
    monkeypatch.setenv("LABKIT_DATA", str(data))
    assert (RunConfig().model, RunConfig().data) == (str(model), str(data))
    assert (config_from_args([]).model, config_from_args([]).data) == (str(model), str(data))
    # a flag, a field or a preset that names its own model and data still wins
    assert config_from_args(["--model", "smollm2", "--data", "synthetic"]).model == "smollm2"
    assert RunConfig(data="synthetic").data == "synthetic"
    cpu = RunConfig.preset("cpu")
    assert (cpu.model, cpu.data) == ("smollm2", "synthetic")
    monkeypatch.setenv("LABKIT_MODEL", " ")  # set but blank: the recipe's own
    assert RunConfig().model == "Qwen/Qwen2.5-0.5B-Instruct"


@pytest.mark.parametrize("name", ["../x", "/abs", "a/b", "..", ".hidden", "", "a\\b"])
def test_a_run_name_that_is_not_one_folder_is_refused(name):
    with pytest.raises(ConfigError) as e:
        RunConfig(run_name=name).check()
    assert str(e.value).startswith(f"--run-name {name!r}: a run name is one folder inside --output-dir")
    assert "\n" not in str(e.value)
    RunConfig(run_name="n8-s1.v2").check()  # dots and dashes inside are a plain name
