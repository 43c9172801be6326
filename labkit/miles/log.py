"""miles' logs read back as labkit's run frame: one row per rollout, in labkit's metric names.

`read_miles_log` turns what a miles run printed (or its wandb history export) into the frame
labkit's own runs give, so the lessons' tables and plots (labkit.analysis) read both. The
log lines, each `logger.info(f"{kind} {id}: {log_dict}")`, as radixark/miles main
@ 31f1ca961a94 writes them (the commit after a file is the last to change it):
`perf N` and `eval N` from `miles/ray/rollout/metrics.py` (03d4770ecb97); `rollout N` and
`step N` from `miles/backends/training_utils/log_utils.py` (d0e8e7c6444c); the trainer's
`perf N` from `miles/utils/train_metric_utils.py` (d0e8e7c6444c). The dicts are parsed as
literals, never evaluated. Where miles' names or meanings differ from labkit's, the table
in labkit.run.metrics' docstring says how, and `to_labkit_metrics` follows it.

miles has no heat guard, so its steps carry `heat/clean` = NaN (not recorded). The
analysis treats such a run as all clean: no heat pause can have touched a step of a run
that never pauses, as the course does for its 48-step run made before the guard. Read the
times with that limit: a hot GPU that throttles without pausing still slows a rollout.
"""

from __future__ import annotations

import ast
import math
import re
import warnings
from collections import defaultdict
from pathlib import Path
from typing import TYPE_CHECKING

from labkit.miles.command import EVAL_NAME, parse_train_args
from labkit.run.metrics import METRICS, STEP

if TYPE_CHECKING:
    import pandas as pd

LOG = "miles.log"  # miles' stdout, tee'd by run_miles.sh next to itself
TRAIN_ARGS = "train_args.txt"  # the run's final train.py arguments, written by the script

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


def _number(node: ast.AST) -> float | None:
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


def _run_config(path: Path, printed: dict, given: dict) -> dict[str, int | None]:
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


def _zero_std(m: dict, groups: int | None) -> tuple[float, float, float]:
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
    """One step in labkit's metric names (labkit.run.metrics) from miles' rollout-side metrics
    `m`, the step's optimizer-step means `t` and the run's config; NaN where miles logs no
    equivalent (heat/*, perf/reward_time, ...)."""
    p, n, g = (config.get(k) for k in
               ("rollout_batch_size", "n_samples_per_prompt", "global_batch_size"))
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
    if p and n and g and p * n // g > 1:  # labkit's update then has the old-log-prob pass
        out["perf/actor_train_time"] += m.get("perf/log_probs_time", 0.0)
    # both are the loss minimised (KL and entropy terms included), not miles' train/pg_loss
    for name in ("train/loss", "train/pg_clipfrac", "train/ppo_kl", "train/kl_loss",
                 "train/grad_norm", "train/steps", "train/train_rollout_logprob_abs_diff"):
        out[name] = _pick(t, name)
    # miles logs a zero entropy when it does not compute one (entropy coef 0 without
    # --observe-training-entropy); a policy's mean token entropy is never exactly 0
    entropy = _pick(t, "train/entropy_loss", "train/entropy")
    out["train/entropy"] = math.nan if entropy == 0 else entropy
    out["train/lr"] = _pick(t, "train/lr", *sorted(k for k in t if k.startswith("train/lr-")))
    out["eval/accuracy"] = _eval_accuracy(m)
    return out  # heat/clean stays NaN: miles has no heat guard (see the module docstring)


def read_miles_log(
    path, *, rollout_batch_size: int | None = None, n_samples_per_prompt: int | None = None,
    global_batch_size: int | None = None, seed: int | None = None,
) -> pd.DataFrame:
    """miles' metrics as labkit's frame: one row per rollout step, columns in labkit's metric
    names (all of labkit.run.metrics.METRICS, NaN where miles logs no equivalent), then the
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
