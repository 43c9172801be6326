"""`labkit launch --backend miles`: the recipe as a run folder for a miles cluster, and the
reward hook miles calls back.

The run folder holds run_miles.sh (train.py's flags from labkit.miles.command, in a bash
script that checks its inputs, starts Ray and tees miles' output to miles.log), the prompt
file(s) and labkit_miles.json (config, command, miles commit). The script does what miles'
own launchers do (radixark/miles main @ 31f1ca961a94: `examples/experimental/
reproducibility/run-qwen2.5-0.5B-gsm8k.sh`, `miles/utils/external_utils/command_utils.py`):
Megatron's model flags from `miles/utils/external_utils/model_args_utils.py` (the `.sh`
files it replaced in fe30593dd6de are sourced on older checkouts), `ray stop --force`
before its own Ray head, and train.py by its absolute path with the miles checkout on the
job's PYTHONPATH, so it runs from any folder. Two choices make miles run the experiment
labkit runs:

* Reward. miles' `--rm-type math` grades only a `\\boxed{}` answer (grade_answer_verl in
  `miles/rollout/rm_hub/__init__.py`, last changed in 6189c686ce92), but
  labkit's prompt asks for `#### 42`. So the script also passes `--custom-rm-path
  labkit.miles.miles_reward` (`miles_reward` here), which scores with labkit's own reward
  (miles prefers a custom path over the rm type); labkit must be importable where miles runs.
  A reward file of yours (`--custom-rm-path myreward.py:fn`) is checked, copied into the
  run folder and named by its absolute path at run time: the job runs in the miles
  checkout, where a relative path finds nothing.
* Prompts. The prompt file holds labkit's messages and labels in labkit's prompt order
  (`data.rollout_problems`), and the script does not pass `--rollout-shuffle`, so miles'
  step k sees the prompts labkit's step k sees, whatever the batch size: miles' default data
  source, `miles.rollout.data_source.RolloutDataSource`, reads rows in file order.
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import re
import shlex
import shutil
import sys
import textwrap
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from labkit.config import RECIPE_MODEL, RunConfig
from labkit.miles.command import (
    INPUT_KEY,
    LABEL_KEY,
    MILES_CHECKED,
    MilesUnsupported,
    build_command,
    default_differences,
    entry_point,
    evaluates,
    flag_notes,
    format_differences,
    total_gpus,
)
from labkit.miles.log import LOG, TRAIN_ARGS

if TYPE_CHECKING:
    from labkit.data import Problem

SCRIPT = "run_miles.sh"
PROMPTS = "prompts_train.jsonl"
EVAL_PROMPTS = "prompts_eval.jsonl"
PROVENANCE = "labkit_miles.json"
# Megatron needs the architecture as flags; miles keeps them per model type in
# scripts/models/<type>.py (<type>.sh before fe30593dd6de), read by the script.
MODEL_TYPES = {RECIPE_MODEL: "qwen2.5-0.5B"}


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


# Ray's runtime env for train.py: the miles checkout, Megatron and the caller's PYTHONPATH
# ($JOB_PYTHONPATH, as miles' command_utils builds it), labkit's custom reward (if any).
_RUNTIME_ENV = ('{"env_vars": {"PYTHONPATH": "\'"$JOB_PYTHONPATH"\'", '
                '"CUDA_DEVICE_MAX_CONNECTIONS": "1", "PYTHONUNBUFFERED": "1", '
                '"LABKIT_CUSTOM_RM_PATH": "\'"${LABKIT_CUSTOM_RM_PATH:-}"\'"}}')

_SCRIPT_TEMPLATE = """#!/usr/bin/env bash
# The labkit recipe on miles (github.com/radixark/miles): {p} prompts x \
{n} answers, global batch {g}, {num_rollout} rollouts.
# Written by `labkit launch --backend miles`; labkit/miles/command.py maps each RunConfig flag to miles'.
# Checked against {miles_checked}.
{notes}#
# Run it where miles runs (e.g. in the miles docker image), on {gpus} GPU(s), from any folder:
#     bash {script}
# The course's overrides work as with labkit (MILES_EXTRA_ARGS goes last and wins):
#     MILES_NUM_ROLLOUT=24 MILES_EXTRA_ARGS="--n-samples-per-prompt 4 --global-batch-size 128" bash {script}
# Paths are environment variables with defaults below. Read the run back in a notebook:
#     labkit.miles.read_miles_log("<this folder>/{log}")
# Ray: the script stops any Ray of yours on this machine (ray stop --force), starts its own
# head node and stops it when it exits. With RAY_ADDRESS set it submits to that cluster and
# neither starts nor stops Ray.
set -euo pipefail
die() {{ echo "{script}: $*" >&2; exit 1; }}
absolute() {{ case "$1" in /*) printf '%s\\n' "$1" ;; *) printf '%s\\n' "$PWD/$1" ;; esac; }}

HERE="$(cd "$(dirname "${{BASH_SOURCE[0]}}")" && pwd)"
: "${{MILES_DIR:=$HOME/miles}}"
: "${{MEGATRON_PATH:=$HOME/Megatron-LM}}"
: "${{HF_CHECKPOINT:={hf}}}"
: "${{MODEL_TYPE:={model_type}}}"  # Megatron's model flags: miles' scripts/models/<MODEL_TYPE>.py
: "${{MODEL_ARGS_SCRIPT:=}}"  # or a .sh of your own that defines the MODEL_ARGS array
: "${{PROMPT_DATA:=${{HERE}}/{prompts}}}"
: "${{SAVE_DIR:=$HERE/checkpoint}}"
: "${{MILES_LOG:=$HERE/{log}}}"
: "${{LABKIT_CUSTOM_RM_PATH:={custom_rm}}}"
case "$LABKIT_CUSTOM_RM_PATH" in  # a reward file: made absolute, the job runs in the miles checkout
   *.py:*|*/*:*)
      RM_FILE="${{LABKIT_CUSTOM_RM_PATH%:*}}"
      [ -f "$RM_FILE" ] || die "no reward file at $RM_FILE (LABKIT_CUSTOM_RM_PATH=$LABKIT_CUSTOM_RM_PATH); set LABKIT_CUSTOM_RM_PATH to file.py:function"
      LABKIT_CUSTOM_RM_PATH="$(absolute "$RM_FILE"):${{LABKIT_CUSTOM_RM_PATH##*:}}" ;;
esac
export LABKIT_CUSTOM_RM_PATH
[ -f "$MILES_DIR/{entry}" ] || die "no miles checkout at $MILES_DIR (no {entry} there); set MILES_DIR"
[ -d "$HF_CHECKPOINT" ] || die "no model at $HF_CHECKPOINT; run: hf download {model} --local-dir $HF_CHECKPOINT (or set HF_CHECKPOINT)"
[ -n "$MODEL_TYPE$MODEL_ARGS_SCRIPT" ] || die "no Megatron model flags for {model}; set MODEL_TYPE to its name in miles' scripts/models/ (or MODEL_ARGS_SCRIPT to a .sh that defines MODEL_ARGS)"
[ -z "$MODEL_ARGS_SCRIPT" ] || [ -f "$MODEL_ARGS_SCRIPT" ] || die "no file at MODEL_ARGS_SCRIPT=$MODEL_ARGS_SCRIPT"
[ -f "$PROMPT_DATA" ] || die "no prompts at $PROMPT_DATA; write them with labkit launch --backend miles (no --dry-run)"
{eval_lines}python3 -c "import labkit.reward" 2>/dev/null || die "labkit is not importable; miles scores with labkit's reward. Install this labkit from its checkout: pip install -e <path to the labkit checkout> (or add that path to PYTHONPATH); the 'labkit' on PyPI is another package"

# Megatron's model flags, read the way miles' own run scripts read them: its Python helper
# (scripts/models/<type>.py, since miles fe30593dd6de), else the .sh of older checkouts.
MODEL_ARGS_HELPER="$MILES_DIR/miles/utils/external_utils/model_args_utils.py"
if [ -n "$MODEL_ARGS_SCRIPT" ]; then
   MODEL_ARGS_FROM="source $MODEL_ARGS_SCRIPT (MODEL_ARGS_SCRIPT)"
   source "$MODEL_ARGS_SCRIPT"
elif [ -f "$MODEL_ARGS_HELPER" ]; then
   MODEL_ARGS_FROM="python3 $MODEL_ARGS_HELPER $MODEL_TYPE"
   MODEL_ARGS_LINE="$(python3 "$MODEL_ARGS_HELPER" "$MODEL_TYPE")" || die "miles has no model flags for MODEL_TYPE=$MODEL_TYPE (scripts/models/$MODEL_TYPE.py in $MILES_DIR); set MODEL_TYPE"
   read -ra MODEL_ARGS <<< "$MODEL_ARGS_LINE"
elif [ -f "$MILES_DIR/scripts/models/$MODEL_TYPE.sh" ]; then
   MODEL_ARGS_FROM="source $MILES_DIR/scripts/models/$MODEL_TYPE.sh (a miles checkout from before fe30593dd6de)"
   source "$MILES_DIR/scripts/models/$MODEL_TYPE.sh"
else
   die "no model flags for MODEL_TYPE=$MODEL_TYPE in $MILES_DIR: neither miles/utils/external_utils/model_args_utils.py nor scripts/models/$MODEL_TYPE.sh; set MODEL_TYPE or MODEL_ARGS_SCRIPT"
fi
declare -p MODEL_ARGS >/dev/null 2>&1 || die "$MODEL_ARGS_FROM defined no MODEL_ARGS array"
echo "model args: $MODEL_ARGS_FROM"

# train.py runs in the miles checkout: every path it gets is made absolute first
MILES_DIR="$(cd "$MILES_DIR" && pwd)"
for name in MEGATRON_PATH HF_CHECKPOINT PROMPT_DATA {eval_var}SAVE_DIR MILES_LOG; do
   printf -v "$name" '%s' "$(absolute "${{!name}}")"
done

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

# Ray runs a job where `ray start` ran (no working_dir is sent), so Ray starts in the miles
# checkout, and {entry} goes by its absolute path for a cluster of yours (RAY_ADDRESS).
# As miles' scripts do, stop a Ray left by an earlier run first (`ray start --head` fails
# while one runs); unlike them, stop this one on exit. Their `pkill -9 python` is left
# out: it would kill every Python process of yours (other jobs, notebooks), not just Ray's.
cd "$MILES_DIR"
if [ -z "${{RAY_ADDRESS:-}}" ]; then
   ray stop --force
   trap 'ray stop --force >/dev/null 2>&1 || true' EXIT
   trap 'exit 130' INT  # leave through the EXIT trap
   trap 'exit 143' TERM
   ray start --head --node-ip-address 127.0.0.1 --num-gpus {gpus} --disable-usage-stats
   RAY_ADDRESS="http://127.0.0.1:8265"
fi
JOB_PYTHONPATH="$MILES_DIR:$MEGATRON_PATH${{PYTHONPATH:+:$PYTHONPATH}}"
ray job submit --address="$RAY_ADDRESS" \\
   --runtime-env-json='{runtime_env}' \\
   -- python3 "$MILES_DIR/{entry}" "${{ALL_ARGS[@]}}" 2>&1 | tee "$MILES_LOG"
"""


def render_script(
    cfg: RunConfig, *, explicit: Iterable[str], gpus: int = 1, model_path: str | None = None,
    data_path: str | None = None, eval_data_path: str | None = None,
    save_dir: str | None = None, run_name: str = "labkit-miles",
) -> str:
    """The bash script that runs `cfg` on miles (see build_command for the arguments).

    It checks its inputs and names the fix, reads Megatron's model flags from the miles
    checkout, runs its own Ray head (stopped before and after) unless RAY_ADDRESS is set,
    writes the final train.py arguments to train_args.txt and tees miles' output to
    miles.log, next to itself, where read_miles_log finds both. It runs from any folder.
    """
    argv = build_command(cfg, explicit=explicit, model_path=model_path, data_path=data_path,
                         eval_data_path=eval_data_path, gpus=gpus, save_dir=save_dir)
    held_out = evaluates(cfg)
    eval_lines = (f': "${{EVAL_DATA:=$HERE/{EVAL_PROMPTS}}}"\n'
                  f'[ -f "$EVAL_DATA" ] || die "no held-out prompts at $EVAL_DATA"\n'
                  if held_out else "")
    notes = "".join(textwrap.fill(f"{flag}: {text}", 95, initial_indent="# ",
                                  subsequent_indent="#   ", break_on_hyphens=False) + "\n"
                    for flag, text, _ in flag_notes(cfg, explicit, gpus))
    return _SCRIPT_TEMPLATE.format(
        p=cfg.rollout_batch_size, n=cfg.n_samples_per_prompt, g=cfg.global_batch_size,
        num_rollout=cfg.num_rollout, gpus=total_gpus(cfg, gpus), model=cfg.model,
        hf=model_path or f"$HOME/models/{Path(cfg.model).name}",
        model_type=MODEL_TYPES.get(cfg.model, ""), miles_checked=MILES_CHECKED,
        notes=("# What --backend miles does with flags it cannot take as they are:\n" + notes
               if notes else ""), entry=entry_point(cfg),
        eval_var="EVAL_DATA " if held_out else "", custom_rm=_script_custom_rm(cfg.custom_rm_path),
        eval_lines=eval_lines, train_args=_array_lines(argv[2:]), run_name=shlex.quote(run_name),
        runtime_env=_RUNTIME_ENV, script=SCRIPT, log=LOG, prompts=PROMPTS,
        train_args_file=TRAIN_ARGS)


def custom_rm_file(custom_rm_path: str | None) -> Path | None:
    """The file of a --custom-rm-path of the form path/to/file.py:function, made absolute
    (from the folder labkit runs in); None for a module path or none."""
    where, sep, _ = (custom_rm_path or "").rpartition(":")
    if not sep or not (where.endswith(".py") or "/" in where or "\\" in where):
        return None
    return Path(where).expanduser().resolve()


def _script_custom_rm(custom_rm_path: str | None) -> str:
    """LABKIT_CUSTOM_RM_PATH's default in the script, inside "...": a reward file is the copy
    in the run folder (write_run_folder puts it there), found from $HERE wherever the folder
    is run; a module path goes as it is."""
    def quoted(text: str) -> str:
        return re.sub(r'(["$`\\])', r"\\\1", text)

    file = custom_rm_file(custom_rm_path)
    if file is None:
        return quoted(custom_rm_path or "")
    return "$HERE/" + quoted(f"{file.name}:{custom_rm_path.rpartition(':')[2]}")


# ------------------------------------------------------------------ the prompts
def write_prompt_data(problems: list[Problem], path, examples: int = 0) -> Path:
    """Write problems as miles' prompt file: one JSON line each, {"messages": labkit's chat
    messages (after `examples` worked examples), "label": the label, "metadata": {"id": ...}},
    in the given order. Returns the path."""
    from labkit.data import build_messages

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        for p in problems:
            row = {INPUT_KEY: build_messages(p.question, examples), LABEL_KEY: p.label,
                   "metadata": {"id": p.id}}
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    tmp.replace(path)
    return path


def read_prompt_data(path) -> list[Problem]:
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


def ordered_problems(cfg: RunConfig) -> list[Problem]:
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


def _custom_rm_path() -> str | None:
    return os.environ.get("LABKIT_CUSTOM_RM_PATH") or None


@functools.lru_cache(maxsize=8)
def _reward_fn(rm_type: str, custom_rm_path: str | None):
    from labkit.reward import load_reward

    return load_reward(rm_type, custom_rm_path)


# ------------------------------------------------------------------ launch
def default_run_dir(cfg: RunConfig) -> Path:
    """<output_dir>/<run_name>, or <output_dir>/miles-<P>x<N>-g<G>-seed<S> with no run name."""
    name = cfg.run_name or (f"miles-{cfg.rollout_batch_size}x{cfg.n_samples_per_prompt}"
                            f"-g{cfg.global_batch_size}-seed{cfg.seed}")
    return Path(cfg.output_dir) / name


def launch(cfg: RunConfig, *, explicit: Iterable[str], dry_run: bool, out_dir: str | None = None,
         gpus: int = 1) -> int:
    """`labkit launch --backend miles`: print the script and the default differences; without
    dry_run also write run_miles.sh and the prompt file(s) to out_dir (default:
    default_run_dir). Returns the exit code: 2 for a refused flag, an existing script or
    data that cannot be loaded, with the reason on stderr."""
    run_dir = Path(out_dir) if out_dir else default_run_dir(cfg)
    rm_file = custom_rm_file(cfg.custom_rm_path)
    if rm_file is not None and not rm_file.is_file():
        print(f"labkit launch --backend miles: --custom-rm-path {cfg.custom_rm_path!r}: no file "
              f"{rm_file}; name a file.py:function that exists here", file=sys.stderr)
        return 2
    try:
        script = render_script(cfg, explicit=explicit, gpus=gpus, run_name=run_dir.name)
    except MilesUnsupported as e:
        print(f"labkit launch --backend miles: {e}", file=sys.stderr)
        return 2
    for flag, text, lost in flag_notes(cfg, explicit, gpus):
        if lost:
            print(f"labkit launch --backend miles: {flag}: {text}", file=sys.stderr)
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
          + (f", {run_dir / EVAL_PROMPTS}" if evaluates(cfg) else "")
          + (f", {run_dir / rm_file.name}" if rm_file is not None else ""))
    print(f"copy {run_dir} to the cluster, then run:  bash {run_dir / SCRIPT}\n"
          f"read it back:  labkit.miles.read_miles_log('{run_dir / LOG}')")
    return 0


def write_run_folder(cfg: RunConfig, run_dir: Path, script: str, *, explicit: Iterable[str],
                     gpus: int = 1) -> Path:
    """Write the script (executable), the prompts (and held-out prompts when eval is on), a
    copy of the --custom-rm-path file (if it names one) and labkit_miles.json (config, with
    that path made absolute; command; miles commit) into run_dir; return run_dir."""
    from labkit.data import split_eval
    from labkit.run.version import __version__

    run_dir.mkdir(parents=True, exist_ok=True)
    write_prompt_data(ordered_problems(cfg), run_dir / PROMPTS, cfg.prompt_examples)
    if evaluates(cfg):
        held_out = split_eval(cfg.data, cfg.eval_split_size, synthetic_steps=cfg.synthetic_steps)
        write_prompt_data(held_out, run_dir / EVAL_PROMPTS, cfg.prompt_examples)
    rm_file = custom_rm_file(cfg.custom_rm_path)
    if rm_file is not None:  # the script scores with this copy: the folder travels as a whole
        shutil.copyfile(rm_file, run_dir / rm_file.name)
        cfg = cfg.replace(custom_rm_path=f"{rm_file}:{cfg.custom_rm_path.rpartition(':')[2]}")
    info = {"labkit_version": __version__, "config": cfg.to_dict(), "explicit": sorted(explicit),
            "train_args": build_command(cfg, explicit=explicit, gpus=gpus)[2:],
            "miles": MILES_CHECKED}
    (run_dir / PROVENANCE).write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")
    path = run_dir / SCRIPT
    path.write_text(script)
    path.chmod(0o755)
    return run_dir
