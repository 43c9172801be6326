"""Several runs from one call: side by side on one GPU (a process each), or one after another.

Why: the course's central act is comparing group sizes across seeds, and one 0.5B run uses
a fraction of an H200. `launch_many(configs)` starts the runs together on the GPU, one
process each (vLLM keeps one engine per process), each engine with a fixed KV cache, after
checking that they fit in the GPU's free memory (labkit.memory). Without a GPU it runs them
one after another in this process, with the same API and the same result: a list of Runs
that labkit.analysis reads as any other.

What a user can count on:

* nothing starts when the runs do not fit (one line says what would fit);
* a run that fails does not stop the others; a line names it and why (its status.json);
* one stop (Ctrl-C, a notebook's stop button, SIGTERM) stops every run after its step, with
  a checkpoint, and runs not yet started are not started; `launch_many` then returns what
  it has (a second stop interrupts the steps in progress);
* `resume=True` continues a set of named runs: a completed one is returned as it is, a
  stopped one goes on from its checkpoint, a missing one starts;
* one progress display for all runs, and each side-by-side run's own output in
  `<output_dir>/<run_name>.log`.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from labkit.config import RunConfig
from labkit.errors import LabkitError, one_line
from labkit.runlog import CONFIG, METRICS, Run, default_run_name, read_jsonl

STOPPED = ("signal", "requested", "time_limit")  # a run's status reasons that end a sweep


@dataclass
class _Slot:
    """One config of the sweep and what became of it."""

    cfg: RunConfig
    proc: subprocess.Popen | None = None
    outcome: str = "not started"  # completed, stopped, failed: <why>, not started
    extra: dict = field(default_factory=dict)

    @property
    def dir(self) -> Path:
        return Path(self.cfg.output_dir) / self.cfg.run_name

    def run(self) -> Run | None:
        return Run(self.dir) if (self.dir / CONFIG).exists() else None


def launch_many(configs: Sequence[RunConfig], *, resume: bool = False,
                side_by_side: bool | None = None) -> list[Run]:
    """Run every config; return the Runs that have a folder, in the configs' order.

    `side_by_side`: None picks for the machine (together on a GPU with the vLLM engine, one
    after another otherwise); True starts a process per run whatever the machine (also on a
    CPU, where the runs then share its cores). `resume`: continue named runs (see above).
    """
    slots = [_Slot(c) for c in _named(configs)]
    for s in slots:
        s.cfg.check()
    if side_by_side is None:
        side_by_side = len(slots) > 1 and _on_gpu(slots[0].cfg)
    if side_by_side:
        _side_by_side(slots, resume)
    else:
        _one_after_another(slots, resume)
    print(f"labkit: {summary(slots)}", flush=True)
    return [r for r in (s.run() for s in slots) if r is not None]


def summary(slots) -> str:
    """'3 runs: 2 completed (a, b); 1 stopped (c: resume=True continues it)'."""
    groups: dict[str, list[str]] = {}
    for s in slots:
        kind = s.outcome.split(":", 1)[0]
        groups.setdefault(kind, []).append(s.cfg.run_name + (f" ({s.outcome.split(':', 1)[1].strip()})"
                                                             if kind == "failed" else ""))
    parts = [f"{len(v)} {k} ({', '.join(v)})" for k, v in groups.items()]
    tail = "; launch_many(..., resume=True) continues them" if {"stopped", "not started"} & set(groups) else ""
    return f"{len(slots)} runs: " + "; ".join(parts) + tail


# ----------------------------------------------------------------------------- one after another
def _one_after_another(slots: list[_Slot], resume: bool) -> None:
    """Each run in this process in turn; a stop ends the sweep after the run it stopped."""
    from labkit.trainer import train

    for s in slots:
        done = _resume_point(s) if resume else None
        if done == "completed":
            s.outcome = "completed"
            continue
        try:
            run = train(s.cfg, resume=done)
        except KeyboardInterrupt:  # a second stop, or one between two runs
            s.outcome = "stopped" if s.run() else "not started"
            return
        except Exception as e:  # noqa: BLE001 - one run's failure is said and the sweep goes on
            s.outcome = f"failed: {one_line(e)}" if isinstance(e, LabkitError) else \
                f"failed: {e.__class__.__name__}: {one_line(e)}"
            print(f"labkit: run {s.cfg.run_name} failed: {s.outcome[8:]}", file=sys.stderr, flush=True)
            continue
        reason = (run.status or {}).get("reason")
        s.outcome = "completed" if reason == "completed" else "stopped"
        if reason in STOPPED:
            return


def _resume_point(s: _Slot) -> str | None:
    """'completed' (nothing to do), the folder to continue, or None (start afresh)."""
    run = s.run()
    if run is None:
        return None
    if (run.status or {}).get("reason") == "completed":
        return "completed"
    return str(s.dir)


# ----------------------------------------------------------------------------- side by side
def _side_by_side(slots: list[_Slot], resume: bool) -> None:
    """A process per run, started together after the memory check; wait, forwarding a stop."""
    from labkit import memory
    from labkit.models import resolve_model

    todo = []
    for s in slots:
        point = _resume_point(s) if resume else None
        if point == "completed":
            s.outcome = "completed"
        else:
            todo.append((s, point))
    if not todo:
        return
    fresh = [s for s, point in todo if point is None]
    if fresh and _on_gpu(fresh[0].cfg):
        path = resolve_model(fresh[0].cfg.model)  # a GGUF is dequantized once, not per process
        shape = memory.ModelShape.of(path)
        free = memory.gpu_free_gib()
        for s in fresh:
            s.cfg = _shared_gpu(s.cfg, shape, len(todo), free)
        if free is not None:
            need = memory.plan_runs([s.cfg for s in fresh], shape, free)
            print(f"labkit: {memory.describe_plan(fresh[0].cfg, need[0], len(todo), free)}", flush=True)
        else:
            print("labkit: the GPU's free memory could not be read; starting without the check",
                  file=sys.stderr, flush=True)
    for s, point in todo:
        s.proc = _start(s, point)
        s.outcome = "running"
    _wait(slots)


def _shared_gpu(cfg: RunConfig, shape, runs: int, free: float | None) -> RunConfig:
    """A run's settings for a GPU it shares: a fixed KV cache, no sleep mode (vLLM's memory
    checks measure the whole GPU), no progress bar of its own, and what lets every run fit:
    gradient checkpointing (where auto), else a smaller token budget per micro-batch (where
    the config kept the default budget): labkit.memory.share_gpu."""
    from labkit import memory

    # vLLM still checks at start that the free memory covers its fraction of the whole GPU
    # (with a fixed KV cache the fraction sizes nothing else): keep it within one share.
    changes = dict(rollout_sleep=False, progress=False,
                   rollout_gpu_memory_fraction=min(cfg.rollout_gpu_memory_fraction, 0.5 / runs))
    if cfg.rollout_kv_cache_gb is None:
        changes["rollout_kv_cache_gb"] = memory.DEFAULT_KV_CACHE_GIB
    cfg = cfg.replace(**changes)
    return memory.share_gpu(cfg, shape, runs, free, default_tokens=RunConfig().max_tokens_per_gpu)


def _start(s: _Slot, resume_dir: str | None) -> subprocess.Popen:
    """`labkit launch` in a process of its own session (so a terminal's Ctrl-C reaches only
    this one, which passes it on once), its output in <output_dir>/<run_name>.log."""
    out = Path(s.cfg.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    if resume_dir:
        cmd = ["launch", "--resume", resume_dir, "--num-rollout", str(s.cfg.num_rollout), "--no-progress"]
    else:
        spec = out / f".{s.cfg.run_name}.config.json"
        spec.write_text(json.dumps(s.cfg.to_dict(), indent=1))
        cmd = ["launch-config", str(spec)]
    log = open(out / f"{s.cfg.run_name}.log", "ab")
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen([sys.executable, "-m", "labkit", *cmd], stdout=log, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, env=env, start_new_session=True,
                            preexec_fn=_stop_with_parent)


def _stop_with_parent() -> None:
    """In the child: SIGTERM when the sweep's process dies (a killed kernel), so no run is
    left holding the GPU; it then stops after its step, as for any SIGTERM (Linux only)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _wait(slots: list[_Slot]) -> None:
    """Show every run's progress until all have ended; a stop goes to each run once (the
    second interrupts their steps, the third kills them)."""
    board = _Board(slots)
    stops = 0
    try:
        while any(s.proc and s.proc.poll() is None for s in slots):
            try:
                board.refresh()
                _sleep_until_exit(slots, 1.0)
            except KeyboardInterrupt:
                stops += 1
                sig = signal.SIGKILL if stops >= 3 else signal.SIGINT
                for s in slots:
                    if s.proc and s.proc.poll() is None:
                        s.proc.send_signal(sig)
                board.say("stopping every run after its step (stop again to interrupt now)"
                          if stops == 1 else "interrupting the runs now")
        board.refresh()
    finally:
        board.close()
    for s in slots:
        if s.proc is None:
            continue
        status = (s.run().status if s.run() else None) or {}
        reason = status.get("reason")
        if reason == "completed":
            s.outcome = "completed"
        elif reason in STOPPED:
            s.outcome = "stopped"
        else:
            why = status.get("message") or _last_line(Path(s.cfg.output_dir) / f"{s.cfg.run_name}.log")
            if s.proc.returncode < 0:  # no status: the process was killed (out of memory?)
                name = signal.Signals(-s.proc.returncode).name
                why = f"killed by {name} (the system's out-of-memory killer, or a kill); last output: {why}"
            s.outcome = f"failed: {why}"
            print(f"labkit: run {s.cfg.run_name} failed: {why}", file=sys.stderr, flush=True)


def _sleep_until_exit(slots, seconds: float) -> None:
    """Wait up to `seconds`, returning early when a run's process exits."""
    live = [s.proc for s in slots if s.proc and s.proc.poll() is None]
    if live:
        try:
            live[0].wait(timeout=seconds)
        except subprocess.TimeoutExpired:
            pass


def _last_line(path: Path) -> str:
    try:
        lines = [x for x in path.read_text(errors="replace").splitlines() if x.strip()]
    except OSError:
        return "no output"
    return lines[-1][:300] if lines else "no output"


class _Board:
    """One progress bar per run, fed by the runs' metrics files (steps and last reward)."""

    def __init__(self, slots):
        from tqdm.auto import tqdm

        width = max(len(s.cfg.run_name) for s in slots)
        self.slots = [s for s in slots if s.proc is not None]
        self.bars = [tqdm(total=s.cfg.num_rollout, desc=s.cfg.run_name.ljust(width), unit="step",
                          position=i, leave=True, dynamic_ncols=True)
                     for i, s in enumerate(self.slots)]

    def refresh(self) -> None:
        for s, bar in zip(self.slots, self.bars):
            rows, _ = read_jsonl(s.dir / METRICS)
            if len(rows) > bar.n:
                bar.update(len(rows) - bar.n)
                bar.set_postfix_str(f"reward {rows[-1].get('rollout/raw_reward', float('nan')):.3f}")
            if s.proc.poll() is not None and not bar.disable:
                state = (s.run().status or {}).get("reason", "ended") if s.run() else "failed"
                bar.set_postfix_str(f"{state}" + (f", reward {rows[-1]['rollout/raw_reward']:.3f}"
                                                  if rows else ""))

    def say(self, line: str) -> None:
        if self.bars:
            self.bars[0].write(f"labkit: {line}")

    def close(self) -> None:
        for bar in self.bars:
            bar.close()


# ----------------------------------------------------------------------------- helpers
def _named(configs: Sequence[RunConfig]) -> list[RunConfig]:
    """Every config with a run folder name of its own (made unique where two would clash)."""
    out, seen = [], set()
    for c in configs:
        name = c.run_name or default_run_name(c)
        base, k = name, 2
        while (c.output_dir, name) in seen:
            name, k = f"{base}-{k}", k + 1
        seen.add((c.output_dir, name))
        out.append(c.replace(run_name=name))
    return out


def _on_gpu(cfg: RunConfig) -> bool:
    """True when the run would use the colocated vLLM engine on a GPU."""
    from labkit.engines import resolve_engine

    try:
        return cfg.rollout_mode == "colocate" and resolve_engine(cfg) == "vllm"
    except LabkitError:
        return False
