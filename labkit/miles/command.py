"""The miles command line of a RunConfig: train.py's flags, the knobs miles cannot take, and
where the recipe's command departs from miles' defaults.

The course's recipe comes from miles (github.com/radixark/miles, a sibling of THUDM/slime:
SGLang rollouts, Megatron training, Ray). `build_command` spells a RunConfig as the
arguments of miles' train.py, grouped by family; labkit.miles.backend wraps them in a
launch script. What was matched, and where (radixark/miles main @ 31f1ca961a94,
2026-08-21, `MILES_CHECKED`; the commit named after a file is the last to change it):

* flags, defaults and checks: `miles/utils/arguments.py` (49cac7b52507); Megatron-LM's own
  defaults for the flags miles does not reset (dropouts 0.1, weight decay 0.01, Adam beta2
  0.999, linear LR decay);
* the shape of a Qwen2.5-0.5B GSM8K run: `tests/e2e/short/test_qwen2.5_0.5B_gsm8k_short.py`
  (babb42903851; Megatron + bridge, colocated, messages/label);
* when a checkpoint is written: `train.py` (e5916b32c1c7) and `should_run_periodic_action`
  in `miles/utils/misc.py`: no --save-interval, no checkpoint, even with --save; any
  interval also saves after the last rollout.

Every value is passed explicitly (miles' defaults differ: `default_differences`),
`MILES_NUM_ROLLOUT` sets `--num-rollout` at run time and `MILES_EXTRA_ARGS` goes last,
where miles' argparse keeps the last value: the course's `-e` lines work unchanged. The
reward is labkit's own, through `--custom-rm-path` (see labkit.miles.backend). Knobs miles
has no equivalent for are refused by name (`refuse_unsupported`), or, the two that change no
number the recipe trains with, left out and said (`IGNORED`); never dropped silently.
`flag_notes` says what becomes of each flag miles takes in another form (--overlap-rollout:
train_async.py, the held-out evaluation: --eval-interval, --save-interval 0: a kept
checkpoint); the script's header lists them and `labkit launch --help` sums them up.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from pathlib import Path

from labkit.config import EMBEDDED_MODEL, RECIPE_MODEL, RunConfig

# The miles commit the command and the script were checked against (radixark/miles main).
MILES_CHECKED = "radixark/miles main @ 31f1ca961a94 (2026-08-21)"
INPUT_KEY, LABEL_KEY = "messages", "label"  # the prompt file's fields (labkit.miles.backend)
EVAL_NAME = "heldout"  # eval/<name> in miles' log
REWARD_HOOK = "labkit.miles.miles_reward"  # the public path of miles_backend.miles_reward

# RunConfig fields with no miles equivalent, and what to do instead.
UNSUPPORTED = {
    "engine": "miles always generates with SGLang",
    "dtype": "Megatron's precision is a model flag (--bf16); set it in MILES_EXTRA_ARGS",
    "time_limit": "miles has no wall-time stop; use your scheduler's time limit",
    "heat_pause_c": "miles has no heat guard",
    "heat_resume_c": "miles has no heat guard",
    "progress": "labkit's progress bar; miles logs every step",
    "n_logged_prompts": "miles keeps no samples.jsonl (see its --save-debug-rollout-data)",
    "router_url": "only for --rollout-mode http, which --backend miles refuses; drop it",
    "max_open_requests": "only for --rollout-mode http, which --backend miles refuses; drop it",
    "request_timeout": "only for --rollout-mode http, which --backend miles refuses; drop it",
    "http_sync_check": "only for --rollout-mode http, which --backend miles refuses; drop it",
    "long_prompts": "miles drops prompts longer than its --rollout-max-prompt-len; set that in "
                    "MILES_EXTRA_ARGS",
}
# RunConfig fields with no miles equivalent that change no number the recipe trains with:
# accepted, left out of the command, and said in the script's header and on stderr.
IGNORED = {
    "rollout_seed_each_answer": "miles seeds single answers only under "
                                "--sglang-enable-deterministic-inference, and then answer i of "
                                "every group gets --rollout-seed + i at every step",
    "rollout_logprob_prompts": "miles' SGLang returns the log-probs of every answer, and its "
                               "train/train_rollout_logprob_abs_diff covers them all",
    "share_prompt": "a layout of labkit's update (the same log-probs, fewer tokens); miles' "
                    "Megatron lays out its passes its own way",
    "padding_free": "a layout of labkit's update (the same log-probs, padding only at the rows' "
                    "ends); miles' Megatron packs its passes without padding itself",
    "use_liger_kernel": "kernels of labkit's update (the same loss to bf16 rounding); Megatron "
                        "fuses its own",
    "torch_compile": "compilation of labkit's update (the same loss to float rounding); "
                     "Megatron runs its own kernels",
    "skip_zero_advantage": "work labkit's update leaves out (answers whose loss and gradient "
                           "are 0); miles computes them, for the same step",
}
# Refused by value (set or not): a fixed KV cache size has no miles flag. SGLang sizes its
# cache as a share of GPU memory (--sglang-mem-fraction-static, which labkit's
# --rollout-gpu-memory-fraction sets) or caps it in tokens, not GiB.
KV_CACHE_GB = ("miles sizes SGLang's KV cache as a share of GPU memory, not in GiB; drop it "
               "and set --rollout-gpu-memory-fraction (passed as --sglang-mem-fraction-static), "
               "or cap the cache in tokens with MILES_EXTRA_ARGS=\"--sglang-max-total-tokens N\"")
# --rollout-mode http is refused by its value (colocate is what miles does with --colocate).
HTTP_ROLLOUTS = ("http sends each answer to the engines behind `labkit serve`'s router, and "
                 "miles cannot: it starts its own SGLang engines and loads new weights into "
                 "them itself. Drop --rollout-mode http (and --router-url, --max-open-requests) "
                 "for --backend miles, or drop --backend miles to train with labkit against "
                 "the router")

# miles' default for each flag the recipe sets (None: unset, miles derives it or fails).
MILES_DEFAULTS: dict[str, object] = {
    "--rollout-batch-size": None, "--n-samples-per-prompt": 1, "--global-batch-size": None,
    "--num-rollout": None, "--rollout-max-response-len": None, "--rollout-temperature": 1.0,
    "--rollout-top-p": 1.0, "--rollout-top-k": -1, "--rollout-seed": 42,
    "--micro-batch-size": 1, "--use-dynamic-batch-size": False, "--max-tokens-per-gpu": None,
    "--lr": 1e-6, "--lr-decay-style": "linear", "--adam-beta1": 0.9, "--adam-beta2": 0.999,
    "--weight-decay": 0.01, "--clip-grad": 1.0, "--seed": 1234, "--eps-clip": 0.2,
    "--eps-clip-high": None, "--kl-loss-coef": 0.0, "--use-kl-loss": False,
    "--kl-loss-type": "k1", "--entropy-coef": 0.0, "--calculate-per-token-loss": False,
    "--disable-grpo-std-normalization": False, "--rm-type": None, "--custom-rm-path": None,
    "--input-key": "input", "--label-key": None, "--apply-chat-template": False,
    "--eval-interval": None, "--save-interval": None, "--colocate": False,
    "--offload-rollout": True,  # miles' default under --colocate, which the recipe passes
    "--actor-num-gpus-per-node": 8, "--num-gpus-per-node": 8,
    "--sglang-mem-fraction-static": None, "--attention-dropout": 0.1, "--hidden-dropout": 0.1,
}

# What miles does with a flag it was not given (None above).
UNSET_MEANS = {
    "--rollout-batch-size": "none (required)",
    "--max-tokens-per-gpu": "unset (required with --use-dynamic-batch-size)",
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
    """Raise MilesUnsupported naming each explicitly set flag miles cannot honour, and
    --rollout-mode http and --rollout-kv-cache-gb (set or not: miles generates with its own
    engines, and sizes their KV cache by memory share)."""
    reasons = {"--rollout-mode": HTTP_ROLLOUTS} if cfg.rollout_mode == "http" else {}
    reasons.update({_flag(f): UNSUPPORTED[f] for f in sorted(explicit) if f in UNSUPPORTED})
    if cfg.rollout_kv_cache_gb is not None:
        reasons["--rollout-kv-cache-gb"] = KV_CACHE_GB
    if cfg.model == EMBEDDED_MODEL or str(cfg.model).endswith(".gguf"):
        reasons["--model"] = (f"{cfg.model!r} is a GGUF file; miles trains a Hugging Face "
                              f"checkpoint, e.g. --model {RECIPE_MODEL}")
    if reasons:
        raise MilesUnsupported(reasons)


# ------------------------------------------------------------------ the command
def evaluates(cfg: RunConfig) -> bool:
    """Whether the miles job evaluates held-out problems: --eval-split-size N > 0, or auto (the
    whole test split, as labkit does on GPU engines) when the data has a test split."""
    if cfg.eval_split_size is None:
        return cfg.data in ("gsm8k", "synthetic") or not Path(cfg.data).expanduser().is_file()
    return cfg.eval_split_size > 0


def build_command(
    cfg: RunConfig, *, explicit: Iterable[str], model_path: str | None = None,
    data_path: str | None = None, eval_data_path: str | None = None, gpus: int = 1,
    save_dir: str | None = None,
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
    a = ["python3", entry_point(cfg)]
    # weights: Megatron reads the HF checkpoint through the bridge; --ref-load is its start
    a += ["--hf-checkpoint", hf, "--ref-load", hf, "--megatron-to-hf-mode", "bridge"]
    # prompts: labkit's messages and labels, already in labkit's order (no --rollout-shuffle)
    a += ["--prompt-data", data_path or "$PROMPT_DATA", "--input-key", INPUT_KEY,
          "--label-key", LABEL_KEY, "--apply-chat-template"]
    # rollout. labkit samples with no top-k, which is miles' -1. (An unmerged miles PR,
    # #2596, would refuse --rollout-top-p < 1 without a positive --rollout-top-k; main at
    # MILES_CHECKED has no such check, and any top-k would change what labkit samples.)
    a += ["--rollout-batch-size", str(cfg.rollout_batch_size),
          "--n-samples-per-prompt", str(cfg.n_samples_per_prompt), "--num-rollout", num_rollout,
          "--rollout-max-response-len", str(cfg.rollout_max_response_len),
          "--rollout-temperature", _num(cfg.rollout_temperature),
          "--rollout-top-p", _num(cfg.rollout_top_p), "--rollout-top-k", "-1",
          "--rollout-seed", str(cfg.seed)]
    a += _training_flags(cfg) + _algorithm_flags(cfg)
    # reward: miles prefers --custom-rm-path, which scores with labkit's reward for --rm-type
    a += ["--rm-type", cfg.rm_type, "--custom-rm-path", REWARD_HOOK]
    # held-out evaluation, greedy (top-k 1), one answer per problem. miles evaluates before
    # the first rollout and after every K-th; K = --num-rollout is labkit's "before the first
    # step and after the last"
    if evaluates(cfg):
        a += ["--eval-interval", str(cfg.eval_interval) if cfg.eval_interval > 0 else num_rollout,
              "--eval-prompt-data", EVAL_NAME, eval_data_path or "$EVAL_DATA",
              "--n-samples-per-eval-prompt", "1",
              "--eval-max-response-len", str(cfg.rollout_max_response_len), "--eval-top-k", "1"]
    # checkpoint: every K rollouts and after the last (miles always saves the last rollout
    # once an interval is set); K = 0: after the last only; K = -1: never, which in miles
    # is no --save-interval (with one, -1 would save every rollout)
    if cfg.save_interval >= 0:
        save_every = str(cfg.save_interval) if cfg.save_interval > 0 else num_rollout
        a += ["--save", save_dir or "$SAVE_DIR", "--save-interval", save_every]
    a += _layout_flags(cfg, gpus)
    # Megatron: no dropout (trainer log-probs must match the engine's), fp32 reductions
    a += ["--attention-dropout", "0.0", "--hidden-dropout", "0.0",
          "--accumulate-allreduce-grads-in-fp32", "--attention-softmax-in-fp32"]
    return a


def entry_point(cfg: RunConfig) -> str:
    """miles' script for `cfg`: train_async.py for --overlap-rollout, else train.py."""
    return "train_async.py" if cfg.overlap_rollout else "train.py"


def total_gpus(cfg: RunConfig, gpus: int) -> int:
    """GPUs the run takes: `gpus`, or twice that with --overlap-rollout (see _layout_flags)."""
    return 2 * gpus if cfg.overlap_rollout else gpus


def _layout_flags(cfg: RunConfig, gpus: int) -> list[str]:
    """Where the trainer and SGLang run. One node; colocated (sharing the GPUs) as in labkit,
    where labkit's engine sleep (KV cache and weights released while the trainer runs) is
    miles' rollout offload. --overlap-rollout is miles' train_async.py, which asserts that
    nothing is colocated: the trainer takes `gpus` GPUs and SGLang as many more, and the PPO
    ratio is taken against the engine's own log-probs (--use-rollout-logprobs), as labkit's
    overlap takes it. Nothing is offloaded there (train_async.py never loads it back)."""
    a = ["--actor-num-nodes", "1", "--actor-num-gpus-per-node", str(gpus),
         "--num-gpus-per-node", str(total_gpus(cfg, gpus))]
    if cfg.overlap_rollout:
        a += ["--rollout-num-gpus", str(gpus), "--rollout-num-gpus-per-engine", "1",
              "--sglang-mem-fraction-static", _num(cfg.rollout_gpu_memory_fraction),
              "--no-offload-rollout", "--use-rollout-logprobs"]
    else:
        a += ["--colocate", "--rollout-num-gpus-per-engine", "1",
              "--sglang-mem-fraction-static", _num(cfg.rollout_gpu_memory_fraction),
              "--offload-rollout" if cfg.rollout_sleep else "--no-offload-rollout"]
    return a


def _training_flags(cfg: RunConfig) -> list[str]:
    """The update's flags: batches, AdamW at a constant learning rate (as labkit's
    trainer), recomputation."""
    a = ["--global-batch-size", str(cfg.global_batch_size),
         "--micro-batch-size", str(min(cfg.micro_batch_size, cfg.global_batch_size))]
    if cfg.use_dynamic_batch_size:  # miles ignores --micro-batch-size then, as labkit does
        # Both cap a pass's tokens; labkit counts padded ones (rows x longest), miles the
        # sum of the samples' own lengths, so miles' passes hold at least as many samples.
        a += ["--use-dynamic-batch-size", "--max-tokens-per-gpu", str(cfg.max_tokens_per_gpu)]
    a += ["--optimizer", "adam", "--lr", _num(cfg.lr), "--lr-decay-style", "constant",
          "--adam-beta1", _num(cfg.adam_beta1), "--adam-beta2", _num(cfg.adam_beta2),
          "--weight-decay", _num(cfg.weight_decay), "--clip-grad", _num(cfg.clip_grad),
          "--seed", str(cfg.seed)]
    if cfg.gradient_checkpointing:
        a += ["--recompute-granularity", "full", "--recompute-method", "uniform",
              "--recompute-num-layers", "1"]
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


# ------------------------------------------------------------------ what becomes of each flag
# For `labkit launch --help` and the README: what --backend miles does with the flags whose
# meaning it cannot keep as it is (the rest map one to one, or are refused: UNSUPPORTED).
MILES_FLAGS_HELP = (
    "--backend miles maps the recipe's flags to miles' train.py and refuses those it cannot "
    "honour. What becomes of the rest: --overlap-rollout runs miles' train_async.py, which "
    "cannot colocate, so the trainer gets its GPUs and SGLang as many more, with the PPO ratio "
    "against the engine's log-probs (--use-rollout-logprobs). --rollout-seed-each-answer and "
    "--rollout-logprob-prompts have no miles equivalent and are ignored (said in the script and "
    "on stderr). The held-out evaluation (--eval-split-size) becomes --eval-interval with the "
    "held-out prompts: before the first rollout and after the last (--eval-interval K: after "
    "every K rollouts, and after the last only when --num-rollout is a multiple of K or with "
    "--overlap-rollout). --save-interval 0 (labkit: a checkpoint only for --resume, removed "
    "when the run completes) becomes one checkpoint after the last rollout, kept; -1 saves "
    "nothing.")


def flag_notes(cfg: RunConfig, explicit: Iterable[str], gpus: int = 1) -> list[tuple[str, str, bool]]:
    """(flag, what miles does with it, whether labkit's meaning is lost) for each flag of
    `cfg` that miles ignores or does not take one to one; the script's header lists them,
    and `launch` prints those marked lost on stderr."""
    explicit = set(explicit)
    notes = []
    if cfg.overlap_rollout:
        notes.append(("--overlap-rollout",
                      f"miles' train_async.py: rollout k+1 is written while rollout k trains, the "
                      f"PPO ratio against the engine's log-probs (--use-rollout-logprobs). It "
                      f"cannot colocate: the trainer gets {gpus} GPU{'s' if gpus > 1 else ''} and "
                      f"SGLang {gpus} more, {total_gpus(cfg, gpus)} in all", True))
    default = RunConfig()
    for name, why in IGNORED.items():
        if name in explicit and getattr(cfg, name) != getattr(default, name):
            notes.append((_flag(name), f"no miles equivalent, ignored: {why}", True))
    if evaluates(cfg):
        k = cfg.eval_interval
        every = (f"after every {k} rollouts" if k > 0 else
                 "after the last (--eval-interval = --num-rollout)")
        lost = k > 0 and cfg.num_rollout % k != 0 and not cfg.overlap_rollout
        what = (f"{cfg.eval_split_size} held-out problems" if cfg.eval_split_size else
                "the whole test split (auto, as labkit does on a GPU)")
        notes.append(("--eval-split-size",
                      f"{what}, greedy, as miles' evaluation "
                      f"(--eval-prompt-data {EVAL_NAME}): before the first rollout and {every}"
                      + (f"; not after the last, where labkit evaluates too ({cfg.num_rollout} "
                         f"rollouts is not a multiple of {k})" if lost else ""), lost))
    if cfg.save_interval == 0:
        notes.append(("--save-interval 0",
                      "labkit keeps a checkpoint only for --resume and removes it when the run "
                      "completes; miles has no such checkpoint, so the script saves once, after "
                      "the last rollout, and keeps it ($SAVE_DIR; --save-interval -1: none)",
                      False))
    return notes


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
