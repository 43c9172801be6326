"""Several runs from one call: side by side on the GPUs (a process each), or one after another.

Why: the course's central act is comparing group sizes across seeds, and one 0.5B run uses
a fraction of an H200. `launch_many(configs)` starts the runs together on the GPUs, one
process each (vLLM keeps one engine per process), each engine with a fixed KV cache, after
checking that they fit in the GPUs' free memory (labkit.machine.memory); labkit.machine.placement says
which GPU each run goes to, and on several GPUs the runs that do not fit at once wait for
a place. Without a GPU it runs them one after another in this process, with the same API
and the same result: a list of Runs that labkit.analysis reads as any other.

What a user can count on:

* the whole sweep is checked before anything starts (each config, the data, model and
  reward they use and what the machine lacks for them, the run folders, the GPUs asked
  for, the memory): a refusal is one line, nothing started. `prepare_sweep` makes every
  check, and a dry run calls it too, so it refuses exactly what the sweep would;
* a summary never advises a resume that would be refused: a folder it would refuse (no
  checkpoint after its logged steps) is named first, with the way on;
* a run that fails, however (an error, a reward that calls sys.exit), does not stop the
  others; a line names it and why (its status.json);
* one stop (Ctrl-C, a notebook's stop button, SIGTERM, SIGHUP) stops every run after its
  step, with a checkpoint, and runs not yet started (waiting for a GPU, or for their turn)
  are not started; `launch_many` then returns what it has (a second stop interrupts the
  steps in progress). A run's own --time-limit stops that run only: the sweep goes on;
* `resume=True` continues a set of named runs: a completed one of the same config is
  returned as it is, a stopped one goes on from its checkpoint, a missing one starts; a
  folder that holds a run of another config (another seed, lr, data, ...; fields that only
  change bookkeeping or memory do not count) is refused, as is a completed run asked for
  more steps than it has a checkpoint to go on from;
* one progress display for all runs (on several GPUs, with the GPU of each), and each
  side-by-side run's own output in `<output_dir>/<run_name>.log`.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from labkit.config import ConfigError, RunConfig
from labkit.errors import LabkitError, RunLogError, one_line
from labkit.machine.placement import SHARED_GPU_FIELDS, longest_first
from labkit.run import ready, start_results
from labkit.run.files import file_there
from labkit.run.log import (
    CONFIG,
    METRICS,
    RESUMABLE,
    Run,
    RunLog,
    config_mismatches,
    default_run_name,
    read_jsonl,
    saved_config,
)

STOPPED = ("signal", "requested")  # a run's status reasons that end a sweep (a stop)
STOP_SIGNALS = tuple(s for s in (getattr(signal, "SIGTERM", None), getattr(signal, "SIGHUP", None),
                                 signal.SIGINT) if s is not None)


@dataclass(frozen=True)
class Hints:
    """How the caller continues a sweep and renames a run, in the caller's own words."""

    resume: str = "launch_many(..., resume=True)"  # "<resume> continues them"
    rename: str = "another run_name"
    flags: bool = False  # name fields as flags (--save-interval K), not as fields (save_interval=K)

    def set(self, name: str, value) -> str:
        return f"--{name.replace('_', '-')} {value}" if self.flags else f"{name}={value}"


@dataclass
class _Slot:
    """One config of the sweep and what became of it."""

    cfg: RunConfig
    proc: subprocess.Popen | None = None
    outcome: str = "not started"  # completed, stopped, time limit, failed: <why>, not started
    code: int = 0  # what `labkit sweep` exits with for this run (labkit.run.stopping.exit_code)
    resume_dir: str | None = None  # the folder this run continues (resume=True)
    gpu: str | None = None  # the GPU its process saw (CUDA_VISIBLE_DEVICES), once started
    extra: dict = field(default_factory=dict)
    asked: RunConfig | None = None  # the config as the caller gave it (a resume gives it again)
    ready: Path | None = None  # the file it writes once ready to step (the run a stagger starts first)

    def __post_init__(self):
        self.asked = self.asked or self.cfg

    @property
    def dir(self) -> Path:
        return Path(self.cfg.output_dir) / self.cfg.run_name

    def run(self) -> Run | None:
        return Run(self.dir) if (self.dir / CONFIG).exists() else None

    def fail(self, why: str, code: int = 1) -> None:
        """Say that this run failed and why (one line on stderr)."""
        self.outcome, self.code = f"failed: {why}", code
        print(f"labkit: run {self.cfg.run_name} failed: {why}", file=sys.stderr, flush=True)

    def ended(self, status: dict | None) -> None:
        """The outcome and exit code from the status this sweep's run wrote."""
        from labkit.run.stopping import exit_code

        reason = (status or {}).get("reason")
        self.code = exit_code(status)
        self.outcome = {"completed": "completed", "time_limit": "time limit"}.get(
            reason, "stopped" if reason in STOPPED else f"failed: {(status or {}).get('message')}")


def launch_many(configs: Sequence[RunConfig | dict], *, resume: bool = False,
                side_by_side: bool | None = None, gpus=None, mps: bool = False,
                stagger_starts: bool = False) -> list[Run]:
    """Run every config (a RunConfig, or a dict of its fields); return the Runs that have a
    folder, in the configs' order.

    `side_by_side`: None picks for the machine (together on the GPUs with the vLLM engine,
    one after another otherwise); True starts a process per run whatever the machine (also
    on a CPU, where the runs then share its cores). `resume`: continue named runs (see
    above). `gpus`: the GPUs side-by-side runs may use, nvidia-smi's numbers (`[0, 1]` or
    "0,1"); None: env LABKIT_GPUS, else every GPU this process sees (labkit.machine.placement).
    `mps`: the runs that share a GPU reach an NVIDIA MPS server of the sweep's own, so their
    kernels run at once (labkit.machine.mps); refused where the runs share no GPU.
    `stagger_starts`: the run seated first starts alone, the others once it is ready to step
    (labkit.run.ready), so that they take vLLM's compiled graphs from its cache instead of
    compiling them at once beside it; refused where the runs go one after another.
    """
    slots = run_sweep(configs, resume=resume, side_by_side=side_by_side, gpus=gpus, mps=mps,
                      stagger_starts=stagger_starts)
    return [r for r in (s.run() for s in slots) if r is not None]


def run_sweep(configs, *, resume: bool = False, side_by_side: bool | None = None,
              hints: Hints = Hints(), gpus=None, mps: bool = False,
              stagger_starts: bool = False) -> list[_Slot]:
    """launch_many, returning each config's slot (its outcome and exit code); `hints` word
    the summary's advice for the caller (`labkit sweep` names its own flags)."""
    prepared = prepare_sweep(configs, resume=resume, side_by_side=side_by_side, hints=hints,
                             gpus=gpus, mps=mps, stagger_starts=stagger_starts)
    slots = prepared.slots
    if not slots:
        return slots
    with _stops_caught() as stops:
        if prepared.plan is not None:
            _side_by_side(slots, stops, prepared.plan, prepared.mps, prepared.stagger_starts)
        else:
            from labkit.run.progress import RESUME_HOW

            said = RESUME_HOW.set(hints.resume)  # a run's stop line words its resume as ours
            try:
                _one_after_another(slots, stops)
            finally:
                RESUME_HOW.reset(said)
    if stops:  # a stop between runs: the runs it kept from starting say which signal
        for s in slots:
            if s.outcome == "not started":
                s.code = 128 + int(stops[0])
    print(f"labkit: {summary(slots, hints)}", flush=True)
    return slots


def sweep_exit_code(slots) -> int:
    """0 when every run completed, else the code of the first that did not (124 its time
    limit, 128 + the signal of a stop, 1 a failure), from what this sweep did."""
    return next((s.code or 1 for s in slots if s.outcome != "completed"), 0)


def summary(slots, hints: Hints = Hints()) -> str:
    """'3 runs: 2 completed (a, b); 1 stopped (c); launch_many(..., resume=True) continues them'
    (runs on several GPUs: 'a on GPU 0, b on GPU 1')."""
    if not slots:
        return "no runs"
    words = {"time limit": "stopped at its --time-limit"}
    several = len({s.gpu for s in slots if s.gpu is not None}) > 1  # then name each run's
    groups: dict[str, list[str]] = {}
    for s in slots:
        kind = s.outcome.split(":", 1)[0]
        where = f" on GPU {s.gpu}" if several and s.gpu is not None else ""
        groups.setdefault(kind, []).append(s.cfg.run_name + where + (
            f" ({s.outcome.split(':', 1)[1].strip()})" if kind == "failed" else ""))
    parts = [f"{len(v)} {words.get(k, k)} ({', '.join(v)})" for k, v in groups.items()]
    tail = ""
    if {"stopped", "time limit", "not started"} & set(groups):
        # the resume advised must go: a folder it would refuse is named first, with the way on
        refused = [why for why in (_resume_refusal(s, hints) for s in slots) if why]
        tail = "; " + "; ".join(refused) + (", then " if refused else "") + \
            f"{hints.resume} continues them"
    return f"{len(slots)} runs: " + "; ".join(parts) + tail


def _resume_refusal(s: _Slot, hints: Hints) -> str | None:
    """Why the resume the summary advises would refuse this run's folder (_plan_one, as that
    resume plans it), with the way on; None when it would take the folder (or the run is new,
    or completed)."""
    from labkit.run.checkpoint import latest_checkpoint

    if s.outcome == "completed" or s.run() is None:
        return None
    try:
        _plan_one(_Slot(s.asked), hints)
        return None
    except LabkitError as e:
        refusal = one_line(e)
    try:
        found, logged = latest_checkpoint(s.dir), RunLog(s.dir).last_step()
    except LabkitError:
        return refusal
    if found is None and logged >= 0:  # e.g. a second stop that came during the update
        return (f"{s.dir} keeps no checkpoint to go on from (steps 0-{logged} are logged; its "
                f"status.json says how it stopped), so a resume would refuse it: move it away "
                f"to run it afresh")
    return refusal


def out_of_gpu_memory(status: dict | None, log_text: str = "", log: Path | None = None) -> str | None:
    """The summary's words for a side-by-side run that died of CUDA out-of-memory, when its
    status (message, traceback) or its log says so; None otherwise."""
    texts = [str((status or {}).get("message") or ""), str((status or {}).get("traceback") or ""),
             log_text]
    if not any(mark in t for t in texts for mark in ("CUDA out of memory", "OutOfMemoryError")):
        return None
    where = f" ({log})" if log else ""
    return ("ran out of GPU memory: the memory plan let it start, which it should not have; run "
            f"fewer at once or lower --max-tokens-per-gpu, and keep its log{where} for the plan's fix")


# ----------------------------------------------------------------------------- before it starts
@dataclass
class Prepared:
    """A sweep checked and decided, nothing started: each config's slot, and where the runs
    go side by side (a placement plan; None: one after another in this process)."""

    slots: list[_Slot]
    plan: object | None = None
    mps: bool = False  # the side-by-side runs reach an MPS server of the sweep's own
    stagger_starts: bool = False  # the run seated first starts alone, the others once it is ready


def prepare_sweep(configs, *, resume: bool = False, side_by_side: bool | None = None,
                  hints: Hints = Hints(), gpus=None, mps: bool = False,
                  stagger_starts: bool = False) -> Prepared:
    """Everything a sweep checks and decides before its first run starts, in one place: the
    GPUs asked for, each config, the run folders (what resume does with each), the inputs
    every run reads and what the machine must have for them, whether the runs go side by
    side, and where (the memory plan). A refusal is one line, nothing started. The sweep
    runs it, and `labkit sweep --dry-run` runs it and stops: a dry run refuses exactly what
    the sweep would."""
    from labkit.machine import placement

    wanted = placement.requested(gpus)
    slots = [_Slot(c) for c in _named(_as_configs(configs))]
    if not slots:
        return Prepared(slots)
    for s in slots:
        s.cfg.check()
    _plan(slots, resume, hints)
    todo = [s for s in slots if s.outcome != "completed"]
    _check_folders([s for s in todo if s.resume_dir is None])
    on_gpu = _on_gpu(slots[0].cfg)
    if wanted is not None:
        _check_gpus_reach_the_runs(wanted, gpus, on_gpu, hints)
    if side_by_side is None:  # a GPU asked for is honoured for one run too: its own process
        side_by_side = on_gpu and (len(slots) > 1 or wanted is not None)
    if mps:
        _check_mps(side_by_side and on_gpu, hints)
    if stagger_starts and not side_by_side:
        flag = "--stagger-starts" if hints.flags else "stagger_starts=True"
        raise ConfigError(f"{flag}: these runs go one after another (no GPU with the vLLM engine), "
                          f"so each starts alone already")
    _check_inputs([s.cfg for s in todo])  # the data, the model (a GGUF is dequantized once), ...
    if not side_by_side or not todo:
        return Prepared(slots)
    if on_gpu:
        plan = placement.plan([s.cfg for s in todo if s.resume_dir is None],
                              [s.cfg for s in todo if s.resume_dir is not None], wanted)
    else:
        plan = placement.anywhere(len(todo))
    return Prepared(slots, plan, mps, stagger_starts)


def _check_mps(share_a_gpu: bool, hints: Hints) -> None:
    """Refuse MPS where it would serve nothing (no runs side by side on a GPU) or cannot start."""
    from labkit.machine import mps

    flag = "--mps" if hints.flags else "mps=True"
    if not share_a_gpu:
        raise ConfigError(f"{flag}: these runs share no GPU (MPS serves runs side by side on a "
                          f"GPU with the vLLM engine)")
    why = mps.missing()
    if why:
        raise ConfigError(f"{flag}: {why}")


def _check_gpus_reach_the_runs(wanted: list[str], gpus, on_gpu: bool, hints: Hints) -> None:
    """Refuse GPUs asked for that the runs would not use: on a machine without a GPU (the runs
    would train on the CPU), or for runs that go one after another in this process (not on
    vLLM), which use the GPU torch sees first whatever was asked."""
    import torch

    from labkit.machine import placement

    if gpus is None:
        given, drop = f"{placement.ENV}={os.environ.get(placement.ENV)}", f"unset {placement.ENV}"
    else:
        given = hints.set("gpus", ",".join(wanted))
        drop = "leave --gpus out" if hints.flags else "leave gpus out"
    if not torch.cuda.is_available():
        raise ConfigError(f"{given}: this machine has no GPU torch can use, so the runs would train "
                          f"on the CPU, one after another; {drop} (nothing was started)")
    if not on_gpu:
        raise ConfigError(f"{given}: these runs do not use vLLM on the GPU (--engine hf or "
                          f"--rollout-mode http), so they go one after another in this process, "
                          f"on the GPU torch sees first; choose it with CUDA_VISIBLE_DEVICES "
                          f"instead and {drop} (nothing was started)")


def _check_folders(slots: list[_Slot]) -> None:
    """Refuse, before any run starts, an output folder no run could make its folder in."""
    from labkit.run.log import check_new_run_folder

    for key in dict.fromkeys(str(s.cfg.output_dir) for s in slots):
        check_new_run_folder(next(s.cfg for s in slots if str(s.cfg.output_dir) == key))


def _as_configs(configs) -> list[RunConfig]:
    """RunConfigs from a list of RunConfigs or dicts of RunConfig fields (ConfigError else)."""
    if isinstance(configs, (RunConfig, dict, str, bytes)):
        raise ConfigError("launch_many takes a list of configs (RunConfigs or dicts of their "
                          "fields); for one run use labkit.launch(cfg), or launch_many([cfg])")
    out = []
    for i, c in enumerate(configs):
        if isinstance(c, dict):
            c = RunConfig().replace(**c)  # an unknown field is refused, naming the valid ones
        elif not isinstance(c, RunConfig):
            raise ConfigError(f"launch_many: config {i} is a {type(c).__name__}; pass RunConfigs "
                              f"or dicts of RunConfig fields, e.g. {{'seed': 1}}")
        out.append(c)
    return out


def _plan(slots: list[_Slot], resume: bool, hints: Hints) -> None:
    """Decide what each run does (start, continue its folder, or nothing: completed), and
    refuse in one line, before anything starts, the runs that cannot do what was asked."""
    held = [s for s in slots if file_there(s.dir / CONFIG)] if not resume else []
    if held:  # without resume, a folder that holds a run is never taken
        one = len(held) == 1
        folders = ", ".join(str(s.dir) for s in held)
        raise RunLogError(f"{folders} already hold{'s a run' if one else ' runs'}; {hints.resume} "
                          f"continues {'it' if one else 'them'}, or give "
                          f"{'this config' if one else 'these configs'} {hints.rename} "
                          f"(nothing was started)")
    problems = []
    for s in slots:
        try:
            _plan_one(s, hints)
        except LabkitError as e:
            problems.append(one_line(e))
    if len(problems) == 1:
        raise RunLogError(f"{problems[0]} (nothing was started)")
    if problems:
        raise RunLogError(f"{len(problems)} runs cannot go as asked, nothing was started: "
                          + "; ".join(problems))


def _plan_one(s: _Slot, hints: Hints) -> None:
    """One run's part of _plan with resume: a folder that holds a run is continued only when
    it holds this config (up to RESUMABLE and SHARED_GPU_FIELDS) with steps left."""
    from labkit.lifecycle import check_resumable

    if not file_there(s.dir / CONFIG):  # a config.json there that cannot be read is named
        return  # a new run (RunLog.create refuses a folder that holds one made meanwhile)
    try:
        saved = saved_config(s.dir)
    except (ValueError, TypeError, OSError) as e:  # cut short, edited by hand
        raise RunLogError(f"{s.dir / CONFIG} cannot be read ({e.__class__.__name__}: "
                          f"{one_line(e)}); remove {s.dir} to run it afresh") from None
    changed = [m for m in config_mismatches(saved, s.cfg)
               if m.split(":", 1)[0][2:].replace("-", "_") not in SHARED_GPU_FIELDS]
    if changed:
        raise RunLogError(f"{s.dir} holds a run of another config ({'; '.join(changed)}); give "
                          f"this config {hints.rename}, or remove {s.dir} to start it afresh")
    log, asked = RunLog(s.dir), s.cfg.num_rollout
    done = log.last_step() + 1
    completed = (log.status() or {}).get("reason") == "completed"
    if completed and asked == done:
        s.outcome = "completed"
        return
    if completed and asked < done:
        raise RunLogError(f"{s.dir} completed {done} steps and {asked} were asked; ask for "
                          f"{done}, or give this config {hints.rename}")
    if completed and not _checkpoint_after(s.dir, done - 1):
        raise RunLogError(f"{s.dir} completed {done} steps and keeps no checkpoint to go on to "
                          f"{asked} from; give this config {hints.rename} (with "
                          f"{hints.set('save_interval', 'K')} a completed run keeps one)")
    try:
        check_resumable(log, saved.replace(num_rollout=asked), done)
    except RunLogError as e:
        raise RunLogError(f"{s.dir} cannot go on to step {asked - 1}: {one_line(e)}; or remove "
                          f"{s.dir} to run it afresh") from None
    s.resume_dir = str(s.dir)
    s.cfg = saved.replace(**{k: getattr(s.cfg, k) for k in RESUMABLE})


def _checkpoint_after(run_dir: Path, step: int) -> bool:
    from labkit.run.checkpoint import latest_checkpoint

    try:
        found = latest_checkpoint(run_dir)
    except RunLogError:
        return False
    return found is not None and found[0] >= step


# The fields labkit.session.load_inputs reads: configs that agree on them read the same inputs.
INPUT_FIELDS = ("data", "synthetic_steps", "eval_split_size", "rm_type", "custom_rm_path", "model",
                "use_liger_kernel", "gradient_checkpointing", "engine", "rollout_mode")


def _check_inputs(configs: list[RunConfig]) -> None:
    """What every run would refuse at its start, refused once before any starts, by the very
    function each run reads them with (labkit.session.load_inputs): the data and its held-out
    split, the reward, the model, and what the machine lacks; each distinct set read once."""
    from labkit.session import load_inputs

    seen: set = set()
    for c in configs:
        key = tuple(str(getattr(c, name)) for name in INPUT_FIELDS)
        if key not in seen:
            seen.add(key)
            load_inputs(c)


# ----------------------------------------------------------------------------- stops
@contextlib.contextmanager
def _stops_caught():
    """SIGTERM, SIGHUP and SIGINT while the sweep runs, as a list of signal numbers: between
    two runs no trainer catches them, and a stop there must start no further run (a run
    catches them itself while it runs). Main thread only; elsewhere nothing is caught."""
    stops: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield stops
        return

    def note(signum, frame):
        stops.append(signum)
        print(f"labkit: {signal.Signals(signum).name}: the sweep stops; no further run starts",
              file=sys.stderr, flush=True)

    previous = {sig: signal.signal(sig, note) for sig in STOP_SIGNALS}
    try:
        yield stops
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)


# ----------------------------------------------------------------------------- one after another
def _one_after_another(slots: list[_Slot], stops: list[int]) -> None:
    """Each run in this process in turn; a stop ends the sweep after the run it stopped (also
    one that came in a run's last step, which the run then completes)."""
    from labkit.run.stopping import StopController
    from labkit.trainer import CHECKPOINT_RESERVE_S, train

    for s in slots:
        if s.outcome == "completed":
            continue
        if stops:
            return
        stopper = StopController(s.cfg.time_limit_seconds, reserve_s=CHECKPOINT_RESERVE_S)
        try:
            run = train(s.cfg, resume=s.resume_dir, stopper=stopper)
        except KeyboardInterrupt:  # a second stop, or one before the run caught signals
            _interrupted(s)
            return
        except BaseException as e:  # any other end is this run's failure
            s.fail(_failure_words(e), getattr(e, "exit_code", 1))
            continue
        finally:
            if stopper.signal_name:  # the run caught the stop: it is the sweep's too
                stops.append(signal.Signals[stopper.signal_name])
        s.ended(run.status)
        if s.outcome == "stopped":
            return


def _interrupted(s: _Slot) -> None:
    """The outcome of a run a KeyboardInterrupt ended: stopped (not started when it left no
    folder), with the code of the signal its status names (130, SIGINT, when none)."""
    from labkit.run.stopping import exit_code

    run = s.run()
    status = (run.status if run else None) or {}
    s.outcome = "stopped" if run else "not started"
    s.code = exit_code(status) if status.get("reason") == "signal" else 128 + int(signal.SIGINT)


def _failure_words(e: BaseException) -> str:
    """Why a run failed, in one line: a LabkitError's message, else the exception's class and
    message; for sys.exit(), where it was called (a custom reward, most likely)."""
    if isinstance(e, LabkitError):
        return one_line(e)
    if isinstance(e, SystemExit):
        frames = traceback.extract_tb(e.__traceback__)
        where = f" in {frames[-1].filename}, line {frames[-1].lineno}" if frames else ""
        return f"SystemExit: sys.exit({e.code!r}) was called{where}"
    return f"{e.__class__.__name__}: {one_line(e)}"


# ----------------------------------------------------------------------------- side by side
def _side_by_side(slots: list[_Slot], stops: list[int], plan, mps: bool = False,
                  stagger: bool = False) -> None:
    """A process per run, each on the GPU the plan gives it (labkit.machine.placement: checked
    against the GPUs' free memory before any starts, prepare_sweep); wait, forwarding a stop.
    `mps`: every run reaches one MPS server, started first and quit when all have ended.
    `stagger`: the run seated first starts alone, the others once it is ready (_start_seated)."""
    todo = [s for s in slots if s.outcome != "completed"]
    if not todo:
        return
    for s in todo:  # a bar of its own would only fill its log
        s.cfg = s.cfg.replace(progress=False)
    from labkit.machine.mps import server

    with server() if mps else contextlib.nullcontext({}) as env:
        if env:
            print("labkit: the runs share each GPU through an MPS server of this sweep's own",
                  flush=True)
        _wait(todo, plan, stops, env, stagger)


def _start(s: _Slot, resume_dir: str | None, gpu: str | None = None,
           extra_env: dict | None = None) -> subprocess.Popen:
    """The run's process (_command) in a session of its own (so a terminal's Ctrl-C reaches
    only this one, which passes it on once), seeing only `gpu` (all the sweep sees for
    None), `extra_env` added to its environment, its output in <output_dir>/<run_name>.log."""
    from labkit.machine.placement import device_env

    out = Path(s.cfg.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    spec = out / f".{s.cfg.run_name}.config.json"
    spec.write_text(json.dumps(s.cfg.to_dict(), indent=1))
    log = open(out / f"{s.cfg.run_name}.log", "ab")
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **_package_path(), **_allocator(s.cfg),
           **device_env(gpu), start_results.FOLDER_ENV: str(out / ".start"), **(extra_env or {})}
    return subprocess.Popen(_command(spec, resume_dir), stdout=log, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, env=env, start_new_session=True,
                            preexec_fn=_stop_with_parent)


def _command(spec: Path, resume_dir: str | None) -> list[str]:
    """`python -m labkit launch-config SPEC [--resume DIR]`. Python runs with -P, this labkit
    first on its path: a folder named `labkit` where the sweep runs (the one that holds the
    checkout) must not stand in for the package."""
    return [*_python(), "-m", "labkit", "launch-config", str(spec),
            *(["--resume", resume_dir] if resume_dir else [])]


def _allocator(cfg: RunConfig) -> dict:
    """torch's expandable segments for a run that shares a GPU (no sleep mode: vLLM's sleep
    pool does not take them): the same update with less memory held in the allocator's
    cache (12.5 against 13.7 GiB a process, four updates side by side on an H200,
    BENCHMARKS.md). A PYTORCH_CUDA_ALLOC_CONF of the user's own is kept as it is."""
    if cfg.rollout_sleep or not _on_gpu(cfg) or "PYTORCH_CUDA_ALLOC_CONF" in os.environ:
        return {}
    return {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}


def _python() -> tuple[str, ...]:
    """This Python, with -P where it takes it (labkit.serving.cluster.isolated)."""
    from labkit.serving.cluster import isolated

    return isolated(sys.executable)


def _package_path() -> dict:
    """PYTHONPATH for a run's process: the checkout this labkit runs from first (never a
    site-packages), so that the run imports the labkit that started it."""
    root = Path(__file__).resolve().parents[1]  # this module is labkit/sweep.py
    if not (root / "pyproject.toml").is_file():
        return {}
    rest = os.environ.get("PYTHONPATH")
    return {"PYTHONPATH": os.pathsep.join([str(root), *([rest] if rest else [])])}


def _stop_with_parent() -> None:
    """In the child: SIGTERM when the sweep's process dies (a killed kernel), so no run is
    left holding the GPU; it then stops after its step, as for any SIGTERM (Linux only)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _wait(todo: list[_Slot], plan, stops: list[int], extra_env: dict | None = None,
          stagger: bool = False) -> None:
    """Start the runs as the plan seats them, each waiting one when a run ends; show every
    run's progress until all have ended. A stop starts no further run and goes to each
    running one once (the second interrupts their steps, the third kills them). Should the
    wait itself fail, the runs are stopped after their step, not left running unseen."""
    order = longest_first([s.cfg for s in todo]) if plan.shape is not None else range(len(todo))
    waiting = [todo[k] for k in order]
    extra_env = dict(extra_env or {})
    board = _Board(todo, plan.several)
    forwarded = 0
    try:
        while True:
            if not stops:
                _start_seated(waiting, todo, plan, extra_env, stagger)
            if not any(_running(s) for s in todo):
                break
            try:
                board.refresh()
                _sleep_until_exit(todo, 1.0, stops)
            except KeyboardInterrupt:  # where no handler of ours was installed (not the main thread)
                stops.append(signal.SIGINT)
            while forwarded < len(stops):
                forwarded += 1
                _forward(todo, signal.SIGKILL if forwarded >= 3 else signal.SIGINT)
                board.say("stopping every run after its step (stop again to interrupt now)"
                          if forwarded == 1 else "interrupting the runs now")
        board.refresh(ended=True)
    except BaseException:
        _forward(todo, signal.SIGINT)
        raise
    finally:
        board.close()
    for s in todo:
        if s.proc is not None:
            _said_how_it_ended(s)


def _start_seated(waiting: list[_Slot], todo: list[_Slot], plan, extra_env: dict,
                  stagger: bool = False) -> None:
    """Start waiting runs, in order, where the plan has a seat and room for each (Plan.place:
    a later, smaller run may start where an earlier one does not fit yet). The first runs
    seated name the sweep's start evaluator in `extra_env` (start_evaluator), before any of
    them starts, for every run of the sweep. `stagger`: of the first runs seated, the first
    (the longest) starts alone, and the rest wait until it is ready to step or has ended
    (labkit.run.ready); the evaluator is still one of them, so the first does not evaluate."""
    if stagger and _starting_first(todo) is not None:
        return
    first = stagger and all(s.proc is None for s in todo)
    line = list(waiting)  # the line as it stands, each run's config as it was asked
    asked = {id(s): s.cfg for s in line}
    seated = []
    for s in list(waiting):
        running = [(r.gpu, r.cfg) for r in todo if _running(r) or r in seated]
        placed = plan.place(s.cfg, running, resumed=s.resume_dir is not None)
        if placed is None:
            if not running:  # the plan checked that each run fits alone: never here, but say it
                waiting.remove(s)
                s.fail("it does not fit in the GPU's free memory, even alone")
            continue
        waiting.remove(s)
        gpu, s.cfg = placed
        s.gpu = gpu.id
        seated.append(s)
    chosen = start_evaluator(seated)
    if chosen is not None:
        extra_env.setdefault(start_results.EVALUATOR_ENV, chosen)
    if first and len(seated) > 1:
        for s in seated[1:]:  # back in the line, in their places, as they were asked
            s.cfg, s.gpu = asked[id(s)], None
        waiting[:] = [s for s in line if s is not seated[0]]
        seated = seated[:1]
        seated[0].ready = ready.marker(seated[0].cfg.output_dir, seated[0].cfg.run_name)
        seated[0].ready.unlink(missing_ok=True)  # an earlier sweep's
        print(f"labkit: run {seated[0].cfg.run_name} starts first; the others start when it is "
              f"ready to step, and take vLLM's compiled graphs from its cache", flush=True)
    for s in seated:
        env = extra_env if s.ready is None else {**extra_env, ready.ENV: str(s.ready)}
        try:
            s.proc = _start(s, s.resume_dir, s.gpu, env)
            s.outcome = "running"
        except OSError as e:  # no process for this run (a full disk, too many processes)
            s.fail(f"could not start its process ({e.strerror or e})")


def start_evaluator(seated: list[_Slot]) -> str | None:
    """Of runs started together, the one that evaluates the starting model for the sweep
    (labkit.run.start_results): a fresh run, the one with the fewest answers a step (its steps
    are the shortest, so the wait costs the sweep least); None when none starts fresh."""
    fresh = [s for s in seated if s.resume_dir is None]
    if not fresh:
        return None
    answers = lambda s: s.cfg.rollout_batch_size * s.cfg.n_samples_per_prompt  # noqa: E731
    return min(reversed(fresh), key=answers).cfg.run_name  # ties: the last seated


def _running(s: _Slot) -> bool:
    return s.proc is not None and s.proc.poll() is None


def _starting_first(slots: list[_Slot]) -> _Slot | None:
    """The run a stagger started first, while it runs and is not yet ready to step; else None."""
    return next((s for s in slots if s.ready is not None and _running(s)
                 and not ready.is_ready(s.ready)), None)


def _forward(slots: list[_Slot], sig: int) -> None:
    for s in slots:
        if s.proc and s.proc.poll() is None:
            s.proc.send_signal(sig)


def _said_how_it_ended(s: _Slot) -> None:
    """A side-by-side run's outcome from its status.json, else from its process and log."""
    status = (s.run().status if s.run() else None) or {}
    if status.get("reason") in ("completed", "time_limit", *STOPPED):
        s.ended(status)
        return
    log = Path(s.cfg.output_dir) / f"{s.cfg.run_name}.log"
    why = status.get("message") or _last_line(log)
    oom = out_of_gpu_memory(status, _tail(log), log)
    if oom:
        why = oom
    elif s.proc.returncode < 0:  # no status: the process was killed (out of memory?)
        name = signal.Signals(-s.proc.returncode).name
        why = f"killed by {name} (the system's out-of-memory killer, or a kill); last output: {why}"
    s.fail(why)


def _sleep_until_exit(slots, seconds: float, stops: list[int]) -> None:
    """Wait up to `seconds`, returning early when a run's process exits (its seat is free)
    or a stop comes."""
    live = [s.proc for s in slots if s.proc and s.proc.poll() is None]
    end, stopped = time.monotonic() + seconds, len(stops)
    while live and time.monotonic() < end and len(stops) == stopped:
        if any(p.poll() is not None for p in live):
            return
        time.sleep(0.05)


def _tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def _last_line(path: Path) -> str:
    lines = [x for x in _tail(path).splitlines() if x.strip()]
    return lines[-1][:300] if lines else "no output"


class _Board:
    """One progress bar per run, fed by the runs' metrics files (steps and last reward); a
    run waiting for a GPU says so, and on several GPUs each bar names its run's."""

    def __init__(self, slots, name_gpus: bool = False):
        from tqdm.auto import tqdm

        self.slots, self.name_gpus = list(slots), name_gpus
        self.width = max((len(s.cfg.run_name) for s in self.slots), default=0)
        self.bars = [tqdm(total=s.cfg.num_rollout, desc=self._label(s), unit="step",
                          position=i, leave=True, dynamic_ncols=True)
                     for i, s in enumerate(self.slots)]

    def _label(self, s: _Slot) -> str:
        if not self.name_gpus:
            return s.cfg.run_name.ljust(self.width)
        return f"{s.cfg.run_name.ljust(self.width)} GPU {s.gpu if s.gpu is not None else '-'}"

    def refresh(self, ended: bool = False) -> None:
        """Each bar as its run stands; `ended`: the sweep is over (a run still waiting then
        was not started)."""
        first = _starting_first(self.slots)
        for s, bar in zip(self.slots, self.bars):
            if bar.desc != self._label(s):
                bar.set_description_str(self._label(s), refresh=False)
            if s.proc is None:
                _say_on(bar, "failed to start" if s.outcome.startswith("failed")
                        else "not started" if ended
                        else f"waiting for {first.cfg.run_name} to start" if first
                        else "waiting for a GPU")
                continue
            rows, _ = read_jsonl(s.dir / METRICS)
            if not rows and s.proc.poll() is None:
                _say_on(bar, "starting")  # loading its model and engine
            if len(rows) > bar.n:
                bar.update(len(rows) - bar.n)
                _say_on(bar, f"reward {rows[-1].get('rollout/raw_reward', float('nan')):.3f}")
            if s.proc.poll() is not None and not bar.disable:
                state = (s.run().status or {}).get("reason", "ended") if s.run() else "failed"
                _say_on(bar, f"{state}" + (f", reward {rows[-1]['rollout/raw_reward']:.3f}"
                                           if rows else ""))

    def say(self, line: str) -> None:
        if self.bars:
            self.bars[0].write(f"labkit: {line}")

    def close(self) -> None:
        for bar in self.bars:
            bar.close()


def _say_on(bar, text: str) -> None:
    """Set a bar's words only when they change: each redraw of a notebook's bar is a message
    that a grader (nbval) holds until the cell ends, and the board asks every second."""
    if getattr(bar, "postfix", None) != text:  # a disabled bar has none
        bar.set_postfix_str(text)


# ----------------------------------------------------------------------------- helpers
def _named(configs: Sequence[RunConfig]) -> list[RunConfig]:
    """Every config with a run folder of its own: where two would share one (however the
    folder is spelled: `runs` and `runs/`), the later is given `<name>-2` (said when the
    name was given, not made)."""
    out, seen = [], set()
    for c in configs:
        name = c.run_name or default_run_name(c)
        base, k = name, 2
        while _folder(c.output_dir, name) in seen:
            name, k = f"{base}-{k}", k + 1
        if c.run_name and name != base:
            print(f"labkit: two configs name the run folder {Path(c.output_dir) / base}; this one "
                  f"runs as {name}", file=sys.stderr, flush=True)
        seen.add(_folder(c.output_dir, name))
        out.append(c.replace(run_name=name))
    return out


def _folder(output_dir: str, name: str) -> str:
    return os.path.normpath(os.path.abspath(os.path.join(os.path.expanduser(str(output_dir)), name)))


def _on_gpu(cfg: RunConfig) -> bool:
    """True when the run would use the colocated vLLM engine on a GPU."""
    from labkit.engines import resolve_engine

    try:
        return cfg.rollout_mode == "colocate" and resolve_engine(cfg) == "vllm"
    except LabkitError:
        return False
