"""How a run starts from its folder and ends in it: resume, checkpoints, the final status.

A run must lose nothing when it dies and log nothing twice when it goes on. Before anything
loads, `--resume` checks there is a checkpoint to continue from (or that no step was
logged) and refuses otherwise, naming what is missing; the steps logged after the
checkpoint are set aside, and a step logged twice keeps the line the checkpoint follows.
Between steps the save policy (labkit.run.checkpoint.SavePolicy) decides when to
checkpoint. At the end, whatever ended the run (the last step, a time limit, a signal, an
error), `status.json` is written, then the final checkpoint (a
checkpoint that fills the disk must not cost the status), with the signal handlers still
up so a second signal cannot cut the status short. A step whose weight sync to the engines
failed after its update stands: it is logged and checkpointed, not blamed on the optimizer.

A full disk (a step's line, a checkpoint) ends the run in one line (labkit.run.log.WriteFailed),
with the status written on the room the run kept aside for it, and no checkpoint tried on
the full disk. A user's second signal that cuts a checkpoint short is said as such, not as
a failed write. A held-out evaluation that a stop cut short is owed: --resume does it first
(after the last step too, then the run completes).
"""

from __future__ import annotations

import time
import traceback
from pathlib import Path

from labkit.config import RunConfig
from labkit.engines import keep
from labkit.errors import LabkitError, one_line
from labkit.evaluation import evaluation_due
from labkit.machine import allocator
from labkit.run import ready
from labkit.run.checkpoint import (
    CheckpointWriteFailed,
    SavePolicy,
    latest_checkpoint,
    load_checkpoint,
    remove_auto_checkpoints,
    save_checkpoint,
    sweep_temp_files,
)
from labkit.run.files import WriteFailed
from labkit.run.log import METRICS, RunLog, RunLogError
from labkit.run.metrics import STEP
from labkit.run.stopping import SecondSignal, StopController
from labkit.session import Session, setup


def start_run(cfg: RunConfig, log: RunLog, resume, first_step: int, **kw) -> Session:
    """Everything before the first step: what a resume needs is checked before anything
    loads, then setup, then the checkpoint. Returns the session (first_step set)."""
    sweep_leftovers(log.dir)
    found = check_resumable(log, cfg, first_step) if resume is not None else None
    s = setup(cfg, log, **kw)
    log.keep_space()  # room for the status, should the disk fill
    s.first_step = restore(s, found) if resume is not None else 0
    ready.say()  # a sweep that staggers its starts starts its other runs now
    return s


def evaluation_owed(log: RunLog, cfg: RunConfig, trained_steps: int) -> bool:
    """Whether the run owes a held-out evaluation after `trained_steps` steps: one is due
    there (labkit.evaluation.evaluation_due), the run evaluates at all, and eval.jsonl has
    none for it (a fresh run, or a stop cut it short)."""
    if not evaluation_due(cfg, trained_steps) or cfg.eval_split_size == 0:
        return False
    if log.config().get("eval_split_size") == 0:  # auto, and it came to none
        return False
    return trained_steps not in log.evaluated()


def check_resumable(log: RunLog, cfg: RunConfig, logged_next: int):
    """The checkpoint to resume from, or None when no step was logged (start at step 0).
    Refuses (RunLogError naming what is missing) a run with logged steps and no checkpoint,
    and a completed run with no steps left to run."""
    found = latest_checkpoint(log.dir)
    try:
        status = log.status() or {}
    except RunLogError:  # a status that is not JSON: the resume moves it aside (RunLog.open)
        status = {}
    if (found is not None and found[0] + 1 >= cfg.num_rollout
            and not evaluation_owed(log, cfg, found[0] + 1)):
        raise RunLogError(
            f"--resume {log.dir}: nothing to run, the checkpoint is after step {found[0]} and "
            f"--num-rollout is {cfg.num_rollout}; pass a larger --num-rollout to train further")
    if found is None and logged_next > 0:
        why = ("it was started with --save-interval -1 (no checkpoints)" if cfg.save_interval < 0
               else "it completed, and a completed run keeps none unless --save-interval K"
               if status.get("reason") == "completed"
               else _stopped_without_checkpoint(status) if status.get("reason")
               else "it ended without stopping cleanly (SIGKILL, out of memory, power loss) "
                    "before it wrote one")
        raise RunLogError(
            f"--resume {log.dir}: no checkpoint in {log.dir / 'checkpoint'} to continue from "
            f"(steps 0-{logged_next - 1} are logged; {why}), so resuming would redo them; "
            f"start a new run, with --save-interval K to keep a checkpoint every K steps")
    return found


def _stopped_without_checkpoint(status: dict) -> str:
    """Why a run that stopped cleanly (its status.json says how) left no checkpoint."""
    how = {"signal": f"on {status.get('signal') or 'a signal'}", "time_limit": "at its --time-limit",
           "interrupted": "on an interrupt", "error": "on an error"}.get(status["reason"],
                                                                        f"({status['reason']})")
    said = f": {status['message']}" if status.get("message") else ""
    return f"it stopped {how} and wrote none then (status.json{said})"


def restore(s: Session, found) -> int:
    """Load the checkpoint `found` = (step, file) into the session, set aside what was logged
    after it; return the step to continue from (0 when `found` is None)."""
    if found is None:  # samples of a step killed before its metrics line go aside too
        s.log.set_aside_steps_after(-1)
        print(f"labkit: resuming {s.log.dir} from step 0 (no step was logged)", flush=True)
        return 0
    step, path = found
    load_checkpoint(path, s.policy, s.optimizer)
    s.engine.update_weights(s.policy)
    redo = s.log.set_aside_steps_after(step)
    s.log.keep_each_step_once(step)  # a step logged twice: the line the checkpoint follows stays
    again = (f"; steps {step + 1}-{step + redo} run again (their old lines: *.after-checkpoint)"
             if redo else "")
    if step + 1 >= s.cfg.num_rollout:
        again += ", its last, for the held-out evaluation a stop cut short"
    print(f"labkit: resuming {s.log.dir} after step {step}{again}", flush=True)
    say_gaps(s.log, step)
    return step + 1


def say_gaps(log: RunLog, step: int) -> None:
    """Say the steps up to `step` (the checkpoint's) that have no line in metrics.jsonl (a
    damaged line moved aside): the checkpoint is past them, so they cannot run again, and
    the log keeps the gap, which the analysis sees."""
    logged = {int(r[STEP]) for r in log.steps() if isinstance(r.get(STEP), int)}
    missing = sorted(set(range(step + 1)) - logged)
    if missing:
        steps = ", ".join(map(str, missing[:10])) + (", ..." if len(missing) > 10 else "")
        print(f"labkit: {log.dir / METRICS} has no line for step(s) {steps}, and the checkpoint "
              f"is after step {step}, so they cannot run again: the log keeps that gap",
              flush=True)


def sweep_leftovers(run_dir: Path) -> None:
    files, size = sweep_temp_files(run_dir)
    if files:
        print(f"labkit: removed {files} temporary file(s) ({size / 2**20:,.0f} MB) that a killed "
              f"run left in {run_dir}", flush=True)


def save_between_steps(s: Session, saves: SavePolicy, step: int) -> float:
    """A checkpoint after `step` when the policy asks for one; returns the seconds it took."""
    why = saves.after_step(step)
    if why is None:
        return 0.0
    t = time.time()
    save(s, step, why)
    saves.saved(step)
    return time.time() - t


def save(s: Session, step: int, why: str) -> None:
    """save_checkpoint, where a write that a second signal broke (torch turns the interrupt
    raised inside its writer into "unexpected pos ...") is that signal, not a failed write."""
    before = s.stopper.interrupts if s.stopper is not None else 0
    try:
        save_checkpoint(s.log.dir, step, s.policy, s.optimizer, why=why)
    except CheckpointWriteFailed as e:
        if s.stopper is not None and s.stopper.interrupts > before:
            raise SecondSignal(s.stopper.interrupt_signum) from e
        raise


def failure_status(e: BaseException, stopper: StopController) -> tuple[str, str]:
    """(reason, message) for the status of a run that an exception ended."""
    if isinstance(e, SecondSignal):
        return "signal", f"{stopper.signal_name}, then a second one interrupted the step"
    if isinstance(e, KeyboardInterrupt):
        return "interrupted", "KeyboardInterrupt"
    if isinstance(e, LabkitError):
        return "error", one_line(e)
    return "error", f"{e.__class__.__name__}: {one_line(e)}"


def log_unsynced_step(s: Session, e: BaseException, last: int, message: str) -> tuple[int, str]:
    """(last logged step, status message) for a run that `e` ended. A step whose update
    finished and whose weight sync to the engines failed (labkit.trainer.run_step puts its
    metrics on `e`) stands: it is logged here, so the stop checkpoints after it and a resume
    goes on with the next step, sending these weights to the engines first."""
    trained = getattr(e, "labkit_trained_step", None)
    if trained is None:
        return last, message
    step = int(trained[STEP])
    message = f"the weight sync to the engines after step {step} failed: {message}"
    try:
        s.log.append_step({**trained, **s.startup})
    except WriteFailed:  # the policy stays ahead of the log, and is not saved
        return last, message
    s.phase = "logged"
    return step, f"{message}; step {step} trained and is logged"


def finish_run(s: Session, reason: str, last: int, message: str, bar, saves: SavePolicy,
               error: BaseException | None = None) -> None:
    """Say why the run stopped (status.json), checkpoint what a resume needs, close the engine.

    The status is written first, before the checkpoint, and again after it only when the
    checkpoint adds to it: a checkpoint that fills the disk must not leave the run with no
    status. After a failure in the middle of the optimizer steps the policy is ahead of the
    log, so no checkpoint is written then: the previous one (if any) stays the one to resume
    from. A second signal may cut the checkpoint short; the status is written whatever happens.
    """
    try:
        if bar is not None:
            bar.close(reason)  # a clean stop is not drawn as a failure
        try:
            s.log.append_heat(p.to_dict() for p in s.guard.take_new_pauses())
        except WriteFailed as e:  # a full disk: the status matters more than the pauses
            print(f"labkit: {e}", flush=True)
        extra = {}
        if reason == "signal" and s.stopper is not None:
            extra["signal"] = s.stopper.signal_name
        if error is not None and reason == "error":
            extra["traceback"] = "".join(traceback.format_exception(type(error), error,
                                                                    error.__traceback__))
        try:
            written = _write_status(s, reason, last, message, extra, say=False)
            note = final_checkpoint(s, reason, last, saves, error)
        except KeyboardInterrupt:  # a second signal while the first status was written
            written, note = False, (f"; a second signal came before the checkpoint of step "
                                    f"{last}: {resume_note(s.log.dir)}")
        if s.stopper is not None:
            s.stopper.finishing()  # from here a signal is noted, never raised
        if note or not written:
            written = _write_status(s, reason, last, message + note, extra, say=True)
        if error is not None and reason == "error" and written:
            error.labkit_run_dir = s.log.dir  # the command line names the status file
        if s.owns_engine:
            s.engine.close()
        elif error is not None and keep.is_kept(s.engine):
            keep.drop_engine()  # stopped mid-call, it may still hold requests: not for the next run
        s.prefetched.clear()
        when = f"after step {last}" if last >= 0 else "before its first step"
        print(f"labkit: run stopped ({reason}{': ' + message if message else ''}{note}) {when}; "
              f"log in {s.log.dir}", flush=True)
        if reason != "completed":
            kept = kept_checkpoint(s.log.dir)
            if kept:
                print(f"labkit: {kept}", flush=True)
    finally:
        s.log.release()  # the next trainer may take the folder
        allocator.give_back()  # the heap's free pages, kept for reuse during the run


def _write_status(s: Session, reason: str, last: int, message: str, extra: dict, *,
                  say: bool) -> bool:
    """Write status.json; on a failure say so when `say` (the last try). True when written."""
    try:
        s.log.write_status(reason, last, message, **extra)
        return True
    except WriteFailed as e:
        if say:
            print(f"labkit: {e}; the run's status is only in this output", flush=True)
        return False


def final_checkpoint(s: Session, reason: str, last: int, saves: SavePolicy,
                     error: BaseException | None = None) -> str:
    """Write the checkpoint a stop needs (labkit.run.checkpoint.SavePolicy), or remove the default
    policy's when the run completed. Returns a note for the status ('' when all went well).
    A run that a failed write ended (a checkpoint, a log line) does not try: the disk that was
    full still is."""
    if s.phase in ("train", "sync"):  # the policy is ahead of the log
        during = ("the update (its passes and optimizer steps)" if s.phase == "train"
                  else "the step that was not logged")
        return (f"; the failure came during {during}, so the policy was not saved: "
                + resume_note(s.log.dir))
    if isinstance(error, WriteFailed):  # the disk that was full still is: not tried again
        return f"; {resume_note(s.log.dir)}"
    why = saves.at_end(last, completed=reason == "completed")
    try:
        if why is not None:
            save(s, last, why)
            saves.saved(last)
        elif reason == "completed" and s.cfg.save_interval == 0:
            remove_auto_checkpoints(s.log.dir)
    except CheckpointWriteFailed as e:
        return f"; {e}; {resume_note(s.log.dir)}"
    except KeyboardInterrupt:
        return f"; a second signal cut the checkpoint of step {last} short: {resume_note(s.log.dir)}"
    return ""


def kept_checkpoint(run_dir: Path) -> str:
    """'checkpoint after step 1 kept in <dir>/checkpoint (1.6 GB): <how to resume> continues
    the run; delete that folder to free the space', or '' when the run keeps none. The way
    to resume is a cell's in a notebook (labkit.run.progress.in_notebook), the command line's
    elsewhere: a stopped run's checkpoint is large, and it is there only to resume."""
    from labkit.run.progress import RESUME_HOW, in_notebook

    try:
        found = latest_checkpoint(run_dir)
    except RunLogError:
        return ""
    if found is None:
        return ""
    folder = found[1].parent
    size = sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())
    how = RESUME_HOW.get() or (f"labkit.launch(cfg, resume={str(run_dir)!r})" if in_notebook()
                               else f"labkit launch --resume {run_dir}")
    return (f"checkpoint after step {found[0]} kept in {folder} ({_size_text(size)}): {how} "
            f"continues the run; delete that folder to free the space")


def _size_text(size: int) -> str:
    """'1.6 GB', '350 MB', '12 kB': a file size as a person reads it."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6)):
        if size >= scale:
            return f"{size / scale:.1f} {unit}" if size < 10 * scale else f"{size / scale:.0f} {unit}"
    return f"{max(size / 1e3, 1):.0f} kB"


def resume_note(run_dir: Path) -> str:
    """What --resume of `run_dir` will do, in words, for a status message."""
    try:
        found = latest_checkpoint(run_dir)
        logged = bool(RunLog(run_dir).steps())
    except RunLogError:
        found, logged = None, True
    if found is None:
        if not logged:
            return "no step was logged, so --resume starts it again from step 0"
        return "there is no checkpoint, so --resume is refused"
    return f"--resume continues after step {found[0]}, the last checkpoint"
