"""miles backend: the labkit recipe as a miles launch script, and miles' logs read back.

The course's recipe comes from miles (github.com/radixark/miles, a sibling of THUDM/slime:
SGLang rollouts, Megatron training, Ray). `labkit launch --backend miles` writes the same
recipe as a bash script for a GPU cluster, and `read_miles_log` turns what miles printed
into the frame labkit's own runs give, so the lessons' tables and plots read both.

What was matched, and where (radixark/miles at these commits):

* flags and defaults: `miles/utils/arguments.py` @ 00e365d95b8ea10495403d0ea3e075d6f830654b;
  Megatron-LM's own defaults for the flags miles does not reset (dropouts 0.1, weight
  decay 0.01, Adam beta2 0.999, linear LR decay);
* the shape of a Qwen2.5-0.5B GSM8K run: `tests/e2e/short/test_qwen2.5_0.5B_gsm8k_short.py`
  @ 062c380287a6dc733e7f9dd5ff10d0d62b8ddc3c (Megatron + bridge, colocated, messages/label);
* the `math` reward: `miles/rollout/rm_hub/__init__.py` @ 03f9cab162fafe8e71ee0a234b46344114d87e76
  (grade_answer_verl, which reads only `\\boxed{}`); the prompt order: miles' default data
  source, `miles.rollout.data_source.RolloutDataSource`, reads rows in file order unless
  `--rollout-shuffle`;
* log lines, each `logger.info(f"{kind} {id}: {log_dict}")`: `perf N` and `eval N` from
  `miles/ray/rollout/metrics.py` @ 0174ab47d235f96c406b05e8133bf6cb50f5db2a; `rollout N` and
  `step N` from `miles/backends/training_utils/log_utils.py`
  @ 03384eb3f913f4228ec0b6deaeba710990fa7d1b; the trainer's `perf N` from
  `miles/utils/train_metric_utils.py` @ 69c7b28b440fa9be6cfb50e399d889b235a8d590.

Three choices make the two backends run the same experiment:

* Reward. miles' `--rm-type math` grades only a `\\boxed{}` answer, but labkit's prompt asks
  for `#### 42`. So the script also passes `--custom-rm-path labkit.miles.miles_reward`,
  which scores with labkit's own reward (miles prefers a custom path over the rm type);
  labkit must be importable where miles runs.
* Prompts. The prompt file holds labkit's messages and labels in labkit's prompt order
  (`data.rollout_problems`), and the script does not pass `--rollout-shuffle`, so miles'
  step k sees the prompts labkit's step k sees, whatever the batch size.
* Batch. Every value is passed explicitly (miles' defaults differ: `default_differences`),
  `MILES_NUM_ROLLOUT` sets `--num-rollout` at run time and `MILES_EXTRA_ARGS` goes last,
  where miles' argparse keeps the last value: the course's `-e` lines work unchanged.

miles has no heat guard, so its steps carry `heat/clean` = NaN (not recorded). The
analysis treats such a run as all clean: no heat pause can have touched a step of a run
that never pauses, as the course does for its 48-step run made before the guard. Read the
times with that limit: a hot GPU that throttles without pausing still slows a rollout.
"""

from __future__ import annotations

import ast
import asyncio
import functools
import json
import math
import os
import re
import shlex
import sys
import warnings
from collections import defaultdict
from pathlib import Path
from typing import TYPE_CHECKING, Iterable, Optional

from labkit.config import EMBEDDED_MODEL, RECIPE_MODEL, RunConfig
from labkit.metrics import METRICS, STEP

if TYPE_CHECKING:
    import pandas as pd

    from labkit.data import Problem

SCRIPT = "run_miles.sh"
PROMPTS = "prompts_train.jsonl"
EVAL_PROMPTS = "prompts_eval.jsonl"
LOG = "miles.log"
TRAIN_ARGS = "train_args.txt"  # the run's final train.py arguments, written by the script
PROVENANCE = "labkit_miles.json"
INPUT_KEY, LABEL_KEY = "messages", "label"
EVAL_NAME = "heldout"  # eval/<name> in miles' log
REWARD_HOOK = "labkit.miles.miles_reward"
# Megatron needs the architecture as flags; miles keeps them per model in scripts/models/.
MODEL_ARGS_SCRIPTS = {RECIPE_MODEL: "scripts/models/qwen2.5-0.5B.sh"}

# RunConfig fields with no miles equivalent, and what to do instead.
UNSUPPORTED = {
    "engine": "miles always generates with SGLang",
    "dtype": "Megatron's precision is a model flag (--bf16); set it in MILES_EXTRA_ARGS",
    "time_limit": "miles has no wall-time stop; use your scheduler's time limit",
    "heat_pause_c": "miles has no heat guard",
    "heat_resume_c": "miles has no heat guard",
    "progress": "labkit's progress bar; miles logs every step",
    "n_logged_prompts": "miles keeps no samples.jsonl (see its --save-debug-rollout-data)",
}

# miles' default for each flag the recipe sets (None: unset, miles derives it or fails).
MILES_DEFAULTS: dict[str, object] = {
    "--rollout-batch-size": None, "--n-samples-per-prompt": 1, "--global-batch-size": None,
    "--num-rollout": None, "--rollout-max-response-len": None, "--rollout-temperature": 1.0,
    "--rollout-top-p": 1.0, "--rollout-seed": 42, "--micro-batch-size": 1, "--lr": 1e-6,
    "--lr-decay-style": "linear", "--adam-beta1": 0.9, "--adam-beta2": 0.999,
    "--weight-decay": 0.01, "--clip-grad": 1.0, "--seed": 1234, "--eps-clip": 0.2,
    "--eps-clip-high": None, "--kl-loss-coef": 0.0, "--use-kl-loss": False,
    "--kl-loss-type": "k1", "--entropy-coef": 0.0, "--calculate-per-token-loss": False,
    "--disable-grpo-std-normalization": False, "--rm-type": None, "--custom-rm-path": None,
    "--input-key": "input", "--label-key": None, "--apply-chat-template": False,
    "--eval-interval": None, "--save-interval": None, "--colocate": False,
    "--actor-num-gpus-per-node": 8, "--num-gpus-per-node": 8,
    "--sglang-mem-fraction-static": None, "--attention-dropout": 0.1, "--hidden-dropout": 0.1,
}

# What miles does with a flag it was not given (None above).
UNSET_MEANS = {
    "--num-rollout": "unset (from data size x --num-epoch)",
    "--eps-clip-high": "unset (= --eps-clip)",
    "--rollout-max-response-len": "unset (SGLang's max)",
    "--sglang-mem-fraction-static": "unset (SGLang picks)",
}


class MilesUnsupported(ValueError):
    """Flags set on the command line that miles cannot honour; `.flags` lists them."""

    def __init__(self, reasons: dict[str, str]):
        self.flags = list(reasons)
        lines = [f"  {flag}: {why}" for flag, why in reasons.items()]
        super().__init__("these flags have no miles equivalent; drop them for "
                         "--backend miles:\n" + "\n".join(lines))


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _num(x: float) -> str:
    return repr(float(x))


def refuse_unsupported(cfg: RunConfig, explicit: Iterable[str]) -> None:
    """Raise MilesUnsupported naming each explicitly set flag miles cannot honour."""
    reasons = {_flag(f): UNSUPPORTED[f] for f in sorted(explicit) if f in UNSUPPORTED}
    if cfg.model == EMBEDDED_MODEL or str(cfg.model).endswith(".gguf"):
        reasons["--model"] = (f"{cfg.model!r} is a GGUF file; miles trains a Hugging Face "
                              f"checkpoint, e.g. --model {RECIPE_MODEL}")
    if reasons:
        raise MilesUnsupported(reasons)


# ------------------------------------------------------------------ the command
def build_command(
    cfg: RunConfig, *, explicit: Iterable[str], model_path: Optional[str] = None,
    data_path: Optional[str] = None, eval_data_path: Optional[str] = None, gpus: int = 1,
    save_dir: Optional[str] = None,
) -> list[str]:
    """The miles invocation of `cfg`: ["python3", "train.py", *flags], grouped by family.

    Paths left None are shell variables the script defines ($HF_CHECKPOINT, $PROMPT_DATA,
    $EVAL_DATA, $SAVE_DIR); `--num-rollout` reads MILES_NUM_ROLLOUT at run time. Megatron's
    architecture flags (MODEL_ARGS) and MILES_EXTRA_ARGS are added by the script around
    these. Raises MilesUnsupported for explicit flags miles cannot honour.
    """
    refuse_unsupported(cfg, explicit)
    if gpus < 1:
        raise ValueError(f"gpus must be >= 1, got {gpus}")
    hf = model_path or "$HF_CHECKPOINT"
    num_rollout = f"${{MILES_NUM_ROLLOUT:-{cfg.num_rollout}}}"
    a = ["python3", "train.py"]
    # weights: Megatron reads the HF checkpoint through the bridge; --ref-load is its start
    a += ["--hf-checkpoint", hf, "--ref-load", hf, "--megatron-to-hf-mode", "bridge"]
    # prompts: labkit's messages and labels, already in labkit's order (no --rollout-shuffle)
    a += ["--prompt-data", data_path or "$PROMPT_DATA", "--input-key", INPUT_KEY,
          "--label-key", LABEL_KEY, "--apply-chat-template"]
    # rollout (newer miles wants a positive --rollout-top-k once --rollout-top-p < 1)
    a += ["--rollout-batch-size", str(cfg.rollout_batch_size),
          "--n-samples-per-prompt", str(cfg.n_samples_per_prompt), "--num-rollout", num_rollout,
          "--rollout-max-response-len", str(cfg.rollout_max_response_len),
          "--rollout-temperature", _num(cfg.rollout_temperature),
          "--rollout-top-p", _num(cfg.rollout_top_p), "--rollout-seed", str(cfg.seed)]
    # training: AdamW at a constant learning rate, as labkit's trainer
    a += ["--global-batch-size", str(cfg.global_batch_size),
          "--micro-batch-size", str(cfg.micro_batch_size), "--optimizer", "adam",
          "--lr", _num(cfg.lr), "--lr-decay-style", "constant",
          "--adam-beta1", _num(cfg.adam_beta1), "--adam-beta2", _num(cfg.adam_beta2),
          "--weight-decay", _num(cfg.weight_decay), "--clip-grad", _num(cfg.clip_grad),
          "--seed", str(cfg.seed)]
    if cfg.gradient_checkpointing:
        a += ["--recompute-granularity", "full", "--recompute-method", "uniform",
              "--recompute-num-layers", "1"]
    a += _algorithm_flags(cfg)
    # reward: miles prefers --custom-rm-path, which scores with labkit's reward for --rm-type
    a += ["--rm-type", cfg.rm_type, "--custom-rm-path", REWARD_HOOK]
    if cfg.eval_interval > 0:  # greedy (top-k 1), one answer per held-out problem
        a += ["--eval-interval", str(cfg.eval_interval),
              "--eval-prompt-data", EVAL_NAME, eval_data_path or "$EVAL_DATA",
              "--n-samples-per-eval-prompt", "1",
              "--eval-max-response-len", str(cfg.rollout_max_response_len), "--eval-top-k", "1"]
    # checkpoint: every K rollouts, or (K = 0) once, after the last one
    save_every = str(cfg.save_interval) if cfg.save_interval > 0 else num_rollout
    a += ["--save", save_dir or "$SAVE_DIR", "--save-interval", save_every]
    # one node; trainer and SGLang share the GPUs (colocated), as in labkit
    a += ["--actor-num-nodes", "1", "--actor-num-gpus-per-node", str(gpus),
          "--num-gpus-per-node", str(gpus), "--colocate", "--rollout-num-gpus-per-engine", "1",
          "--sglang-mem-fraction-static", _num(cfg.rollout_gpu_memory_fraction)]
    # Megatron: no dropout (trainer log-probs must match the engine's), fp32 reductions
    a += ["--attention-dropout", "0.0", "--hidden-dropout", "0.0",
          "--accumulate-allreduce-grads-in-fp32", "--attention-softmax-in-fp32"]
    return a


def _algorithm_flags(cfg: RunConfig) -> list[str]:
    """GRPO's flags: clip, KL (a reference model only when its weight is > 0), entropy,
    std normalization and how the loss is averaged."""
    a = ["--advantage-estimator", cfg.advantage_estimator, "--eps-clip", _num(cfg.eps_clip),
         "--eps-clip-high", _num(cfg.eps_clip_high), "--kl-loss-coef", _num(cfg.kl_loss_coef),
         "--entropy-coef", _num(cfg.entropy_coef)]
    if cfg.kl_loss_coef > 0:  # labkit's KL is k3 to the reference model
        a += ["--use-kl-loss", "--kl-loss-type", "k3"]
    if cfg.disable_grpo_std_normalization:
        a.append("--disable-grpo-std-normalization")
    if cfg.loss_agg_mode == "token-mean":  # miles' default averages per answer (seq-mean)
        a.append("--calculate-per-token-loss")
    return a


def parse_train_args(argv: Iterable[str]) -> dict[str, object]:
    """train.py arguments as {flag: value}: a bare flag is True, a flag with several values
    a list; a repeated flag keeps its last value, as argparse does. Words before the first
    flag (python3 train.py) are ignored."""
    out: dict[str, object] = {}
    flag = None
    for word in argv:
        if word.startswith("--"):
            flag = word
            out[flag] = True
        elif flag is not None:
            value = out[flag]
            if value is True:
                out[flag] = word
            else:
                out[flag] = (value if isinstance(value, list) else [value]) + [word]
    return out


def _literal(value: object) -> object:
    """A command value as Python: a ${VAR:-default} shows its default, numbers are numbers."""
    if isinstance(value, str):
        m = re.fullmatch(r"\$\{\w+:-(.*)\}", value)
        value = m.group(1) if m else value
        for cast in (int, float):
            try:
                return cast(value)
            except ValueError:
                pass
    return value


def default_differences(cfg: RunConfig) -> list[tuple[str, object, object]]:
    """(flag, labkit's value, miles' default) for each flag where the recipe's command and a
    bare miles run differ. Read from the command itself, so the two cannot drift apart."""
    ours = parse_train_args(build_command(cfg, explicit=()))
    rows = []
    for flag, default in MILES_DEFAULTS.items():
        if flag not in ours and not isinstance(default, bool):
            continue  # not passed: miles' default is what runs (e.g. --kl-loss-type at KL 0)
        value = _literal(ours.get(flag, False))
        same = value == default or (isinstance(value, float) and isinstance(default, float)
                                    and math.isclose(value, default))
        if not same:
            rows.append((flag, value, default))
    return rows


def format_differences(rows: list[tuple[str, object, object]]) -> str:
    """The default differences as an aligned three-column text table."""
    head = ("flag", "labkit (passed)", "miles default")
    cells = [head] + [(f, str(v), UNSET_MEANS.get(f, "unset") if d is None else str(d))
                      for f, v, d in rows]
    width = [max(len(r[i]) for r in cells) for i in range(3)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, width)).rstrip() for r in cells]
    return "\n".join([lines[0], "  ".join("-" * w for w in width), *lines[1:]])


# ------------------------------------------------------------------ the script
def _shell_word(word: str) -> str:
    """A word for bash: a $VAR reference is double-quoted (expanded), anything else quoted."""
    return f'"{word}"' if word.startswith("$") else shlex.quote(word)


def _array_lines(argv: list[str]) -> str:
    """train.py's flags as bash array lines, one flag and its values per line."""
    lines, current = [], []
    for word in argv:
        if word.startswith("--") and current:
            lines.append(current)
            current = []
        current.append(_shell_word(word))
    lines.append(current)
    return "\n".join("   " + " ".join(line) for line in lines if line)


# Ray's runtime env for train.py: Megatron on the path, labkit's custom reward (if any).
_RUNTIME_ENV = ('{"env_vars": {"PYTHONPATH": "\'"$MEGATRON_PATH:${PYTHONPATH:-}"\'", '
                '"CUDA_DEVICE_MAX_CONNECTIONS": "1", '
                '"LABKIT_CUSTOM_RM_PATH": "\'"${LABKIT_CUSTOM_RM_PATH:-}"\'"}}')

_SCRIPT_TEMPLATE = """#!/usr/bin/env bash
# The labkit recipe on miles (github.com/radixark/miles): {p} prompts x \
{n} answers, global batch {g}, {num_rollout} rollouts.
# Written by `labkit launch --backend miles`; labkit/miles.py maps each RunConfig flag to miles'.
#
# Run it where miles runs (e.g. in the miles docker image), on {gpus} GPU(s):
#     bash {script}
# The course's overrides work as with labkit (MILES_EXTRA_ARGS goes last and wins):
#     MILES_NUM_ROLLOUT=24 MILES_EXTRA_ARGS="--n-samples-per-prompt 4 --global-batch-size 128" bash {script}
# Paths are environment variables with defaults below. Read the run back in a notebook:
#     labkit.miles.read_miles_log("<this folder>/{log}")
set -euo pipefail
die() {{ echo "{script}: $*" >&2; exit 1; }}

HERE="$(cd "$(dirname "${{BASH_SOURCE[0]}}")" && pwd)"
: "${{MILES_DIR:=$HOME/miles}}"
: "${{MEGATRON_PATH:=$HOME/Megatron-LM}}"
: "${{HF_CHECKPOINT:={hf}}}"
: "${{MODEL_ARGS_SCRIPT:={model_args}}}"
: "${{PROMPT_DATA:=${{HERE}}/{prompts}}}"
: "${{SAVE_DIR:=$HERE/checkpoint}}"
: "${{MILES_LOG:=$HERE/{log}}}"
: "${{LABKIT_CUSTOM_RM_PATH:={custom_rm}}}"
export LABKIT_CUSTOM_RM_PATH
[ -d "$MILES_DIR" ] || die "no miles checkout at $MILES_DIR; set MILES_DIR"
[ -d "$HF_CHECKPOINT" ] || die "no model at $HF_CHECKPOINT; run: hf download {model} --local-dir $HF_CHECKPOINT (or set HF_CHECKPOINT)"
[ -f "${{MODEL_ARGS_SCRIPT:-}}" ] || die "no Megatron model flags at '${{MODEL_ARGS_SCRIPT:-}}'; set MODEL_ARGS_SCRIPT to miles' scripts/models/<model>.sh"
[ -f "$PROMPT_DATA" ] || die "no prompts at $PROMPT_DATA; write them with labkit launch --backend miles (no --dry-run)"
{eval_lines}python3 -c "import labkit.reward" 2>/dev/null || die "labkit is not importable; miles scores with labkit's reward: pip install labkit (or add it to PYTHONPATH)"

source "$MODEL_ARGS_SCRIPT"  # defines MODEL_ARGS, the architecture flags Megatron needs
declare -p MODEL_ARGS >/dev/null 2>&1 || die "$MODEL_ARGS_SCRIPT defines no MODEL_ARGS array"

TRAIN_ARGS=(
{train_args}
)
WANDB_ARGS=()
if [ -n "${{WANDB_API_KEY:-}}" ]; then
   WANDB_ARGS=(--use-wandb --wandb-project "${{WANDB_PROJECT:-labkit}}" --wandb-group {run_name})
fi
eval "EXTRA_ARGS=(${{MILES_EXTRA_ARGS:-}})"  # shell-split, as labkit splits it
ALL_ARGS=("${{MODEL_ARGS[@]}}" "${{TRAIN_ARGS[@]}}" ${{WANDB_ARGS[@]+"${{WANDB_ARGS[@]}}"}} ${{EXTRA_ARGS[@]+"${{EXTRA_ARGS[@]}}"}})
printf '%s\\n' "${{ALL_ARGS[@]}}" > "$HERE/{train_args_file}"

if [ -z "${{RAY_ADDRESS:-}}" ]; then
   ray start --head --node-ip-address 127.0.0.1 --num-gpus {gpus} --disable-usage-stats
   RAY_ADDRESS="http://127.0.0.1:8265"
fi
cd "$MILES_DIR"
ray job submit --address="$RAY_ADDRESS" \\
   --runtime-env-json='{runtime_env}' \\
   -- python3 train.py "${{ALL_ARGS[@]}}" 2>&1 | tee "$MILES_LOG"
"""


def render_script(
    cfg: RunConfig, *, explicit: Iterable[str], gpus: int = 1, model_path: Optional[str] = None,
    data_path: Optional[str] = None, eval_data_path: Optional[str] = None,
    save_dir: Optional[str] = None, run_name: str = "labkit-miles",
) -> str:
    """The bash script that runs `cfg` on miles (see build_command for the arguments).

    It checks its inputs and names the fix, starts Ray unless RAY_ADDRESS is set, writes
    the final train.py arguments to train_args.txt and tees miles' output to miles.log,
    next to itself, where read_miles_log finds both.
    """
    argv = build_command(cfg, explicit=explicit, model_path=model_path, data_path=data_path,
                         eval_data_path=eval_data_path, gpus=gpus, save_dir=save_dir)
    eval_lines = (f': "${{EVAL_DATA:=$HERE/{EVAL_PROMPTS}}}"\n'
                  f'[ -f "$EVAL_DATA" ] || die "no held-out prompts at $EVAL_DATA"\n'
                  if cfg.eval_interval > 0 else "")
    return _SCRIPT_TEMPLATE.format(
        p=cfg.rollout_batch_size, n=cfg.n_samples_per_prompt, g=cfg.global_batch_size,
        num_rollout=cfg.num_rollout, gpus=gpus, model=cfg.model,
        hf=model_path or f"$HOME/models/{Path(cfg.model).name}",
        model_args=(f"$MILES_DIR/{MODEL_ARGS_SCRIPTS[cfg.model]}"
                    if cfg.model in MODEL_ARGS_SCRIPTS else ""),
        custom_rm=re.sub(r'(["$`\\])', r"\\\1", cfg.custom_rm_path or ""),  # inside "..."
        eval_lines=eval_lines, train_args=_array_lines(argv[2:]), run_name=shlex.quote(run_name),
        runtime_env=_RUNTIME_ENV, script=SCRIPT, log=LOG, prompts=PROMPTS,
        train_args_file=TRAIN_ARGS)


# ------------------------------------------------------------------ the prompts
def write_prompt_data(problems: list["Problem"], path) -> Path:
    """Write problems as miles' prompt file: one JSON line each, {"messages": labkit's chat
    messages, "label": the label, "metadata": {"id": ...}}, in the given order. Returns the path."""
    from labkit.data import build_messages

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        for p in problems:
            row = {INPUT_KEY: build_messages(p.question), LABEL_KEY: p.label,
                   "metadata": {"id": p.id}}
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    tmp.replace(path)
    return path


def read_prompt_data(path) -> list["Problem"]:
    """The problems of a prompt file written by write_prompt_data (the question is the last
    user message), in file order."""
    from labkit.data import Problem

    out = []
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        if line.strip():
            row = json.loads(line)
            question = [m["content"] for m in row[INPUT_KEY] if m["role"] == "user"][-1]
            out.append(Problem(row["metadata"]["id"], question, row[LABEL_KEY]))
    return out


def ordered_problems(cfg: RunConfig) -> list["Problem"]:
    """cfg's training problems in labkit's prompt order, at least one epoch and enough rows
    for every rollout: row k*P+i is the i-th prompt of labkit's step k at P prompts a step."""
    from labkit.data import load_problems, rollout_problems

    problems = load_problems(cfg.data, "train", seed=cfg.seed, synthetic_steps=cfg.synthetic_steps)
    rows = max(len(problems), cfg.num_rollout * cfg.rollout_batch_size)
    return rollout_problems(problems, 0, rows, cfg.seed)


async def miles_reward(args, sample, **kwargs):
    """miles' --custom-rm-path hook: labkit's reward for args.rm_type (or the function in
    env LABKIT_CUSTOM_RM_PATH) on sample.response and sample.label. Takes one miles Sample,
    or a list of them (--group-rm); returns a float, or a list of floats."""
    from labkit.reward import score

    fn = _reward_fn(args.rm_type, _custom_rm_path())
    samples = sample if isinstance(sample, list) else [sample]
    rewards = await asyncio.to_thread(score, [s.response for s in samples],
                                      [s.label for s in samples], fn)
    return rewards if isinstance(sample, list) else rewards[0]


def _custom_rm_path() -> Optional[str]:
    return os.environ.get("LABKIT_CUSTOM_RM_PATH") or None


@functools.lru_cache(maxsize=8)
def _reward_fn(rm_type: str, custom_rm_path: Optional[str]):
    from labkit.reward import load_reward

    return load_reward(rm_type, custom_rm_path)


# ------------------------------------------------------------------ launch
def default_run_dir(cfg: RunConfig) -> Path:
    """<output_dir>/<run_name>, or <output_dir>/miles-<P>x<N>-g<G>-seed<S> with no run name."""
    name = cfg.run_name or (f"miles-{cfg.rollout_batch_size}x{cfg.n_samples_per_prompt}"
                            f"-g{cfg.global_batch_size}-seed{cfg.seed}")
    return Path(cfg.output_dir) / name


def main(cfg: RunConfig, *, explicit: Iterable[str], dry_run: bool, out_dir: Optional[str] = None,
         gpus: int = 1) -> int:
    """`labkit launch --backend miles`: print the script and the default differences; without
    dry_run also write run_miles.sh and the prompt file(s) to out_dir (default:
    default_run_dir). Returns the exit code: 2 for a refused flag, an existing script or
    data that cannot be loaded, with the reason on stderr."""
    run_dir = Path(out_dir) if out_dir else default_run_dir(cfg)
    try:
        script = render_script(cfg, explicit=explicit, gpus=gpus, run_name=run_dir.name)
    except MilesUnsupported as e:
        print(f"labkit launch --backend miles: {e}", file=sys.stderr)
        return 2
    print(script)
    print("Flags where the recipe differs from a bare miles run (all are passed explicitly):")
    print(format_differences(default_differences(cfg)))
    if dry_run:
        print("\n(dry run: nothing written; drop --dry-run to write the script and the prompts)")
        return 0
    if (run_dir / SCRIPT).exists():
        print(f"labkit launch --backend miles: {run_dir / SCRIPT} exists; choose another "
              f"--run-name or --output-dir", file=sys.stderr)
        return 2
    try:
        write_run_folder(cfg, run_dir, script, explicit=explicit, gpus=gpus)
    except (ValueError, OSError, ImportError, RuntimeError) as e:  # data.py's errors name the fix
        print(f"labkit launch --backend miles: {e}", file=sys.stderr)
        return 2
    print(f"\nwrote {run_dir / SCRIPT}, {run_dir / PROMPTS}"
          + (f", {run_dir / EVAL_PROMPTS}" if cfg.eval_interval > 0 else ""))
    print(f"copy {run_dir} to the cluster, then run:  bash {run_dir / SCRIPT}\n"
          f"read it back:  labkit.miles.read_miles_log('{run_dir / LOG}')")
    return 0


def write_run_folder(cfg: RunConfig, run_dir: Path, script: str, *, explicit: Iterable[str],
                     gpus: int = 1) -> Path:
    """Write the script (executable), the prompts (and held-out prompts when eval is on) and
    labkit_miles.json (config, command, miles commit) into run_dir; return run_dir."""
    from labkit import __version__
    from labkit.data import split_eval

    run_dir.mkdir(parents=True, exist_ok=True)
    write_prompt_data(ordered_problems(cfg), run_dir / PROMPTS)
    if cfg.eval_interval > 0:
        held_out = split_eval(cfg.data, cfg.eval_split_size, synthetic_steps=cfg.synthetic_steps)
        write_prompt_data(held_out, run_dir / EVAL_PROMPTS)
    info = {"labkit_version": __version__, "config": cfg.to_dict(), "explicit": sorted(explicit),
            "train_args": build_command(cfg, explicit=explicit, gpus=gpus)[2:],
            "miles": "radixark/miles, flags as of miles/utils/arguments.py @ 00e365d9"}
    (run_dir / PROVENANCE).write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")
    path = run_dir / SCRIPT
    path.write_text(script)
    path.chmod(0o755)
    return run_dir


# ------------------------------------------------------------------ reading logs back
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_METRIC_LINE = re.compile(r"(?<![\w-])(rollout|perf|eval|step) (\d+): (?=\{)")
# Megatron prints its arguments as "  name ........ value" at start-up.
_PRINTED_ARG = re.compile(
    r"(?<!\S)(rollout_batch_size|n_samples_per_prompt|global_batch_size|seed) \.{3,} (\S+)\s*$")
CONFIG_FLAGS = {"rollout_batch_size": "--rollout-batch-size", "seed": "--seed",
                "n_samples_per_prompt": "--n-samples-per-prompt",
                "global_batch_size": "--global-batch-size"}
_NUMBER_CALL = re.compile(r"(?:float|int|uint|bool_|tensor|Tensor|item)\d*")


def parse_log_dict(text: str) -> dict[str, float]:
    """The numbers of a logged metrics dict, e.g. "{'rollout/raw_reward': np.float64(0.5)}".

    Parsed as a Python literal, never evaluated. Number wrappers (np.float64(x),
    tensor(x, device=...)), nan and inf are read as numbers; strings, lists and other
    values are dropped. Raises ValueError when the text is not a dict literal."""
    try:
        node = ast.parse(text.strip(), mode="eval").body
    except SyntaxError as e:
        raise ValueError(f"not a metrics dict: {e.msg}") from None
    if not isinstance(node, ast.Dict):
        raise ValueError("not a metrics dict")
    out = {}
    for k, v in zip(node.keys, node.values):
        if isinstance(k, ast.Constant) and isinstance(k.value, str):
            value = _number(v)
            if value is not None:
                out[k.value] = value
    return out


def _number(node: ast.AST) -> Optional[float]:
    """The number an AST node spells, or None."""
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
        return float(node.value)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        inner = _number(node.operand)
        return None if inner is None else (-inner if isinstance(node.op, ast.USub) else inner)
    if isinstance(node, ast.Name) and node.id.lower() in ("nan", "inf", "infinity"):
        return float(node.id.lower().replace("infinity", "inf"))
    if isinstance(node, ast.Call) and node.args:
        f = node.func
        func = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
        if _NUMBER_CALL.fullmatch(func):
            return _number(node.args[0])
    return None


def _read_text_log(path: Path):
    """(rollout id -> merged metrics, train step id -> metrics, printed config, bad lines)."""
    rollouts, steps, printed, bad = defaultdict(dict), defaultdict(dict), {}, 0
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            line = _ANSI.sub("", line.rstrip("\n"))
            m = _METRIC_LINE.search(line)
            if m is None:
                if a := _PRINTED_ARG.search(line):
                    printed.setdefault(a.group(1), a.group(2))
                continue
            try:
                metrics = parse_log_dict(line[m.end():])
            except ValueError:
                bad += 1
                continue
            (steps if m.group(1) == "step" else rollouts)[int(m.group(2))].update(metrics)
    return rollouts, steps, {CONFIG_FLAGS[k]: v for k, v in printed.items()}, bad


def _read_wandb_csv(path: Path):
    """The same four things from a wandb history export (metric-named columns, _step)."""
    import pandas as pd

    bad_lines = []
    frame = pd.read_csv(path, engine="python", on_bad_lines=lambda line: bad_lines.append(line))
    frame.columns = [str(c).rsplit(" - ", 1)[-1] for c in frame.columns]  # "<run> - metric"
    frame = frame[[c for c in frame.columns if not c.endswith(("__MIN", "__MAX"))]]
    numeric = frame.apply(pd.to_numeric, errors="coerce")
    unreadable = (numeric.isna() & frame.notna()).any(axis=1)
    numeric = numeric[~unreadable]
    key = "rollout/step" if "rollout/step" in numeric else "_step"
    if key not in numeric:
        raise ValueError(f"{path}: a wandb export needs a rollout/step or _step column; "
                         f"found {', '.join(frame.columns)}")
    rollouts, steps = defaultdict(dict), defaultdict(dict)
    for row in numeric.to_dict("records"):
        metrics = {k: v for k, v in row.items() if not k.startswith("_") and pd.notna(v)}
        train = row.get("train/step")
        if pd.notna(train) and pd.isna(row.get("rollout/step")):
            steps[int(train)].update(metrics)
        elif pd.notna(row.get(key)):
            rollouts[int(row[key])].update(metrics)
        elif pd.notna(row.get("eval/step")):
            rollouts[int(row["eval/step"])].update(metrics)
    return rollouts, steps, {}, len(bad_lines) + int(unreadable.sum())


def _run_config(path: Path, printed: dict, given: dict) -> dict[str, Optional[int]]:
    """rollout_batch_size, n_samples_per_prompt, global_batch_size, seed of the run: the
    values given, else train_args.txt beside the log (what the script ran), else the
    arguments miles printed at start-up; None when none shows one."""
    ran = {}
    if (path.parent / TRAIN_ARGS).is_file():
        ran = parse_train_args((path.parent / TRAIN_ARGS).read_text().splitlines())
    out = {}
    for name, flag in CONFIG_FLAGS.items():
        value = given.get(name)
        if value is None:
            value = ran.get(flag, printed.get(flag))
        try:
            out[name] = None if value is None else int(str(value))
        except ValueError:
            out[name] = None
    return out


def _train_means(steps: dict[int, dict], per_rollout: int) -> dict[int, dict]:
    """Optimizer-step metrics as means per rollout (step s belongs to rollout s // per_rollout),
    with the number of steps as train/steps."""
    grouped = defaultdict(list)
    for step, metrics in steps.items():
        grouped[step // per_rollout].append(metrics)
    out = {}
    for rollout, rows in grouped.items():
        keys = {k for r in rows for k in r}
        out[rollout] = {k: sum(r[k] for r in rows if k in r) / sum(k in r for r in rows)
                        for k in keys}
        out[rollout]["train/steps"] = float(len(rows))
    return out


def _pick(metrics: dict, *names: str) -> float:
    for name in names:
        value = metrics.get(name)
        if value is not None and not math.isnan(value):
            return value
    return math.nan


def _zero_std(m: dict, groups: Optional[int]) -> tuple[float, float, float]:
    """(frac_groups, all_zero, all_one) from miles' zero_std counts and percentages.

    miles logs a count per reward value of the groups whose rewards are all equal
    (zero_std/count_0.0, ...) and, in newer versions, the all-0 and all-1 shares; with the
    group count (prompts per rollout) every share follows from the counts. Without it,
    frac_groups is all-0 + all-1, exact for 0/1 rewards."""
    counts = {k.rsplit("count_", 1)[1]: v for k, v in m.items()
              if k.startswith("rollout/zero_std/count_")}
    shares = {w: m.get(f"rollout/zero_std/all_{w}_percentage") for w in ("zero", "one")}
    if not counts and shares["zero"] is None:
        return math.nan, math.nan, math.nan
    by_count = {"zero": "0.0", "one": "1.0"}
    zero, one = (shares[w] if shares[w] is not None
                 else counts.get(by_count[w], 0.0) / groups if groups else math.nan
                 for w in ("zero", "one"))
    frac = sum(counts.values()) / groups if counts and groups else zero + one
    return frac, zero, one


def _eval_accuracy(m: dict) -> float:
    """Mean reward of the one eval data set (eval/<name>); NaN when none or several."""
    if f"eval/{EVAL_NAME}" in m:
        return m[f"eval/{EVAL_NAME}"]
    names = [k for k in m if k.startswith("eval/") and "/" not in k[5:] and "-" not in k[5:]
             and not k[5:].startswith(("step", "skipped")) and "@" not in k]
    return m[names[0]] if len(names) == 1 else math.nan


def to_labkit_metrics(step: int, m: dict, t: dict, config: dict) -> dict[str, float]:
    """One step in labkit's metric names (labkit.metrics) from miles' rollout-side metrics
    `m`, the step's optimizer-step means `t` and the run's config; NaN where miles logs no
    equivalent (heat/*, perf/reward_time, ...)."""
    p, n = config.get("rollout_batch_size"), config.get("n_samples_per_prompt")
    out = dict.fromkeys(METRICS, math.nan)
    out[STEP] = step
    out["rollout/raw_reward"] = _pick(m, "rollout/raw_reward", "rollout/episode_raw_reward")
    for name in ("rollout/response_len/mean", "rollout/response_len/max", "rollout/truncated_ratio",
                 "perf/rollout_time", "perf/actor_train_time", "perf/update_weights_time",
                 "perf/step_time"):
        out[name] = _pick(m, name)
    (out["rollout/zero_std/frac_groups"], out["rollout/zero_std/all_zero_percentage"],
     out["rollout/zero_std/all_one_percentage"]) = _zero_std(m, p)
    if p and n:
        out["rollout/n_prompts"], out["rollout/n_samples_per_prompt"] = p, n
        out["rollout/tokens"] = out["rollout/response_len/mean"] * p * n
        out["perf/tokens_per_s"] = out["rollout/tokens"] / out["perf/rollout_time"]
    out["train/loss"] = _pick(t, "train/pg_loss", "train/loss")  # labkit's is the policy loss
    for name in ("train/pg_clipfrac", "train/ppo_kl", "train/kl_loss", "train/grad_norm",
                 "train/steps", "train/train_rollout_logprob_abs_diff"):
        out[name] = _pick(t, name)
    out["train/entropy"] = _pick(t, "train/entropy_loss", "train/entropy")
    out["train/lr"] = _pick(t, "train/lr", *sorted(k for k in t if k.startswith("train/lr-")))
    out["eval/accuracy"] = _eval_accuracy(m)
    return out  # heat/clean stays NaN: miles has no heat guard (see the module docstring)


def read_miles_log(
    path, *, rollout_batch_size: Optional[int] = None, n_samples_per_prompt: Optional[int] = None,
    global_batch_size: Optional[int] = None, seed: Optional[int] = None,
) -> "pd.DataFrame":
    """miles' metrics as labkit's frame: one row per rollout step, columns in labkit's metric
    names (all of labkit.metrics.METRICS, NaN where miles logs no equivalent), then the
    config columns rollout_batch_size, n_samples_per_prompt, global_batch_size, seed and
    run_name.

    `path` is miles' stdout log (run_miles.sh tees it to miles.log), a folder holding
    miles.log, or a wandb history export (.csv: metric-named columns, rollout/step or
    _step). Config values passed here win over train_args.txt beside the log, which wins
    over the arguments miles printed. Malformed lines are counted and skipped, with one
    warning."""
    import pandas as pd

    path = Path(path)
    if path.is_dir():
        if not (path / LOG).is_file():
            raise FileNotFoundError(f"{path}: no {LOG}; name the miles log file or the wandb .csv")
        path = path / LOG
    reader = _read_wandb_csv if path.suffix == ".csv" else _read_text_log
    rollouts, steps, printed, bad = reader(path)
    if bad:
        warnings.warn(f"{path}: skipped {bad} malformed metric line(s)", stacklevel=2)
    if not rollouts and not steps:
        raise ValueError(f"{path}: no miles metric lines ('rollout N: {{...}}', 'perf N: {{...}}', "
                         f"'step N: {{...}}'); pass miles' stdout log or a wandb history .csv")
    given = dict(rollout_batch_size=rollout_batch_size, n_samples_per_prompt=n_samples_per_prompt,
                 global_batch_size=global_batch_size, seed=seed)
    config = _run_config(path, printed, given)
    train = _train_means(steps, _steps_per_rollout(config, bool(steps), path))
    rows = [to_labkit_metrics(s, rollouts.get(s, {}), train.get(s, {}), config)
            for s in sorted(set(rollouts) | set(train))]
    frame = pd.DataFrame(rows, columns=list(METRICS))
    frame[STEP] = frame[STEP].astype(int)
    for name, value in config.items():
        frame[name] = pd.array([value] * len(frame), dtype="Int64")
    frame["run_name"] = path.parent.name if path.name == LOG else path.stem
    return frame


def _steps_per_rollout(config: dict, have_steps: bool, path: Path) -> int:
    """Optimizer steps per rollout (prompts x answers / global batch); 1, with a warning,
    when the config does not say and the log has optimizer steps to place."""
    p, n, g = (config.get(k) for k in
               ("rollout_batch_size", "n_samples_per_prompt", "global_batch_size"))
    if p and n and g:
        return max(1, p * n // g)
    if have_steps:
        warnings.warn(f"{path}: batch sizes unknown, so each optimizer step is taken as one "
                      f"rollout; pass rollout_batch_size, n_samples_per_prompt and "
                      f"global_batch_size to read_miles_log", stacklevel=3)
    return 1
