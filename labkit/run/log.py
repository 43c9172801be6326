"""The run folder: how a run is written (RunLog), and a run as the user holds it (Run).

A run must lose nothing when it dies: each step's line is appended, flushed and fsynced
as soon as the step ends, and files that are rewritten (config, status) go through a
temporary file and a rename, so a reader never sees half a file.

Layout of a run folder::

    config.json      the resolved RunConfig (plus labkit version, derived values)
    metrics.jsonl    one line per finished step, keys from labkit.run.metrics (step key rollout/step)
    samples.jsonl    a few completions per step: prompt id (split/index), label, completion, reward
    heat.jsonl       one line per heat pause: start, end, seconds, peak_c, step
    eval.jsonl       one line per held-out evaluation (before the first step, after the last)
    eval_outcomes.jsonl  each evaluation problem by problem: right or not, the answer's length
    status.json      why the run stopped: completed, time_limit, signal, error (with the last step)
    checkpoint/      policy, optimizer and RNG state after a finished step (see labkit.run.checkpoint)
    lock             the pid of the trainer writing the folder, while it runs (one at a time)

A resume reads what an earlier launch wrote, and a file there may be damaged: a line cut
short by a kill (the last line, without its newline) is moved to `<file>.truncated` and said;
anything else that cannot be read (a config that is not JSON, a step line in the middle that
is not one, a file that is a link that loops or a folder: labkit.run.files.file_there) is
refused in one line naming the file, and nothing is changed. A step logged twice keeps the
line the checkpoint follows; the other goes to `<file>.duplicate`, said. A write that
fails (a full disk) is `WriteFailed`, in words, with no half line left behind; a trainer keeps
64 KiB of the disk in `.space-kept.tmp` while it holds the folder, given up for the status.

`labkit.launch(cfg)` returns a `Run`; so does `Run("runs/<name>")` for a finished run. The
same folder can be continued with `--resume`, which only accepts a config that matches the
one the folder was started with (a few bookkeeping fields may change: RESUMABLE). One
trainer writes a folder at a time: it holds `lock` (labkit.run.lock: an flock the kernel drops
when the process dies, so the lock of a killed run is taken over); a second one is refused.
"""

from __future__ import annotations

import errno
import os
import re
import shutil
import tempfile
import time
from collections.abc import Iterable
from dataclasses import fields
from pathlib import Path

from labkit.config import RunConfig
from labkit.errors import LabkitError, RunLogError, one_line
from labkit.run.files import (  # noqa: F401 (named here too)
    WriteFailed,
    append_lines,
    cannot_read,
    file_there,
    folder_there,
    is_step_line,
    json_row,
    read_bytes,
    read_json,
    read_jsonl,
    readable_rows,
    write_all,
    write_bytes_atomic,
    write_failed,
    write_json_atomic,
    write_text_atomic,
)
from labkit.run.files import user_umask as _umask
from labkit.run.lock import RunLock
from labkit.run.metrics import STEP
from labkit.run.outcomes import OUTCOMES
from labkit.run.version import __version__

CONFIG = "config.json"
METRICS = "metrics.jsonl"
SAMPLES = "samples.jsonl"
HEAT = "heat.jsonl"
EVAL = "eval.jsonl"
STATUS = "status.json"
CHECKPOINT = "checkpoint"
LOCK = "lock"
RESERVE = ".space-kept.tmp"  # disk space kept for the status while the run runs (keep_space)
RESERVE_BYTES = 64 * 1024
SET_ASIDE = ".after-checkpoint"  # suffix of the lines a resumed run redoes, kept for the record
TRUNCATED = ".truncated"  # suffix of the lines a kill cut short, kept for the record
DUPLICATE = ".duplicate"  # suffix of the lines of a step logged twice, kept for the record
APPENDED = (METRICS, SAMPLES, HEAT, EVAL, OUTCOMES, "client.jsonl")  # the files a run appends lines to


class RunLog:
    """Append-only writer for one run folder."""

    def __init__(self, run_dir: Path):
        self.dir = Path(run_dir)
        self.earlier: list[dict] = []  # statuses of the run's earlier launches (resumed runs)
        self._lock: RunLock | None = None  # held while this writer has the folder
        self._created: list[Path] = []  # folders this start made (removed if the start fails)

    # --- creating and opening -------------------------------------------------------
    @classmethod
    def create(cls, run_dir: Path, config: dict) -> RunLog:
        """Start a new run folder and hold its lock; refuse one that already holds a run.
        Raises OSError when the folder cannot be made (the caller names the flag).

        The folder appears whole or not at all: it is made under a hidden name beside it
        (`.<name>.<random>.new`, config.json written, the lock held) and renamed into place.
        A rename does not replace a folder with files in it, so of two starts of one name
        at once one is refused, and removes only its own hidden folder. A folder that is
        there with other files but no run (made by hand) is used in place, under its lock.
        """
        run_dir = Path(run_dir)
        _refuse_existing_run(run_dir)
        log = cls(run_dir)
        parents = [p for p in run_dir.parents if not p.exists()]
        run_dir.parent.mkdir(parents=True, exist_ok=True)
        existed = run_dir.is_dir()
        if existed and any(run_dir.iterdir()):
            return log._take_in_place(config)
        new = Path(tempfile.mkdtemp(dir=run_dir.parent, prefix=f".{run_dir.name}.", suffix=".new"))
        try:
            os.chmod(new, 0o777 & ~_umask())  # mkdtemp's folder is the user's alone
            log._lock = RunLock.acquire(new / LOCK)
            write_json_atomic(new / CONFIG, config)
            os.rename(new, run_dir)  # an empty folder is replaced, one with files is not
        except OSError as e:
            log.release()
            shutil.rmtree(new, ignore_errors=True)
            if e.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                raise
            _refuse_existing_run(run_dir)  # another start put its run there meanwhile
            return log._take_in_place(config)
        except BaseException:
            log.release()
            shutil.rmtree(new, ignore_errors=True)
            raise
        log._lock.moved_to(run_dir / LOCK)
        log._created = [] if existed else [run_dir, *parents]  # an empty folder made by hand stays
        return log

    def _take_in_place(self, config: dict) -> RunLog:
        """Start the run in a folder that is there already (and holds other files): take its
        lock (a second start is refused here, touching nothing), then write the config."""
        self.lock()
        try:
            _refuse_existing_run(self.dir)  # another start may have written it meanwhile
            write_json_atomic(self.dir / CONFIG, config)
        except BaseException:
            self.release()  # nothing of this start's is in the folder yet
            raise
        return self

    @classmethod
    def open(cls, run_dir: Path, *, repair: bool = False) -> RunLog:
        """Open an existing run folder to append to it (resume), holding its lock.

        A line cut short at the end of an appended file (a kill mid-write) is an error
        unless `repair` is set: then it is moved to `<file>.truncated` (kept, not lost) and
        said, and a status.json that is not JSON is moved to `status.json.damaged`. A step
        line of metrics.jsonl that cannot be read is refused either way (RunLogError).
        """
        run_dir = Path(run_dir)
        if not file_there(run_dir / CONFIG):
            raise RunLogError(f"{run_dir} is not a labkit run folder (no {CONFIG})")
        log = cls(run_dir)
        log.lock()
        try:
            for name in APPENDED:
                log._repair_tail(name, repair)
            log._check_steps()
            old = log._earlier_status(repair)
            if old:
                log.earlier = [*old.pop("earlier", []), old]
        except BaseException:
            log.release()
            raise
        return log

    @classmethod
    def check(cls, run_dir: Path) -> RunLog:
        """What open(run_dir, repair=True) would refuse, refused the same way, changing nothing
        and taking no lock (a dry run): a file that cannot be read, a step line in the middle
        of metrics.jsonl that is not one. What open repairs (a line cut short at the end, a
        status that is not JSON) is not refused."""
        run_dir = Path(run_dir)
        if not file_there(run_dir / CONFIG):
            raise RunLogError(f"{run_dir} is not a labkit run folder (no {CONFIG})")
        log = cls(run_dir)
        for name in (*APPENDED, STATUS, LOCK):
            file_there(run_dir / name)
        RunLock.refuse_if_held(run_dir / LOCK)  # a live trainer's folder is refused, as by open
        log._check_steps(cut_tail_too=False)
        return log

    def _cut_tail(self, name: str) -> tuple[bytes, bytes] | None:
        """(the lines before, the last line) when `name` ends in a line cut short (no newline,
        or in metrics.jsonl not a step's JSON line), else None."""
        path = self.dir / name
        if not file_there(path):  # a folder or a pipe in its place is refused, naming it
            return None
        data = read_bytes(path)
        if not data.strip():
            return None
        body, _, last = data.rstrip(b"\n").rpartition(b"\n")
        if data.endswith(b"\n") and (name != METRICS or is_step_line(last)):  # complete
            return None
        return body, last

    def _repair_tail(self, name: str, repair: bool) -> None:
        """Move a last line without its newline (or, in metrics.jsonl, one that is not a
        step's JSON line) to `<name>.truncated`, saying so; refuse it when not `repair`."""
        path = self.dir / name
        cut = self._cut_tail(name)
        if cut is None:
            return
        body, last = cut
        if not repair:
            raise RunLogError(f"{path}: the last line is truncated (the run died while writing it)")
        print(f"labkit: {path} ended in a line cut short (the run died while writing it); "
              f"moved it to {name}{TRUNCATED}{_what_was_cut(name, last)}", flush=True)
        try:
            with open(self.dir / (name + TRUNCATED), "ab") as f:
                f.write(last + b"\n")
            write_bytes_atomic(path, body + b"\n" if body else b"")
        except OSError as e:
            raise write_failed(path, e) from e

    def _check_steps(self, cut_tail_too: bool = True) -> None:
        """Refuse a metrics.jsonl with a line that is not a step's JSON line (one that a kill
        cut short at the end was moved aside already; `cut_tail_too=False`: or is still there,
        to be moved): the log is damaged, not cut."""
        path = self.dir / METRICS
        if not file_there(path):
            return
        lines = read_bytes(path).split(b"\n")
        if not cut_tail_too and self._cut_tail(METRICS) is not None:
            lines = lines[:max(i for i, x in enumerate(lines) if x.strip())]
        for i, line in enumerate(lines, 1):
            if not line.strip():
                continue
            if not is_step_line(line):
                what = ("not a JSON object" if json_row(line) is None
                        else f"no whole number under {STEP!r}")
                raise RunLogError(
                    f"{path}: line {i} is not a step's line ({what}): the log is damaged; "
                    f"remove or repair that line, then resume")

    def _earlier_status(self, repair: bool) -> dict | None:
        """The status of the launch before this one; one that cannot be read is moved to
        status.json.damaged when `repair` (its history is lost, the run is not). One that is
        no file (a link that loops, a folder) is refused, naming it: it is not moved."""
        if not file_there(self.dir / STATUS):
            return None
        try:
            return self.status()
        except RunLogError:
            if not repair:
                raise
            path = self.dir / STATUS
            os.replace(path, self.dir / (STATUS + ".damaged"))
            print(f"labkit: {path} cannot be read as a run's status (not JSON); moved it to "
                  f"{STATUS}.damaged, and the new status starts afresh", flush=True)
            return None

    # --- one writer at a time ---------------------------------------------------------
    def lock(self) -> None:
        """Hold the folder's lock (labkit.run.lock); RunLogError when a live trainer holds it,
        or when the lock file cannot be opened (naming it and why)."""
        file_there(self.dir / LOCK)  # a folder, a pipe or a looping link there is named
        try:
            self._lock = RunLock.acquire(self.dir / LOCK)
        except OSError as e:
            raise RunLogError(f"{cannot_read(self.dir / LOCK, e)} (the run's lock file)") from e

    def release(self) -> None:
        """Give the folder's lock back, and the disk space kept for the status."""
        if self._lock is not None:
            self.give_up_space()
            self._lock.release()
            self._lock = None

    def abandon(self) -> None:
        """Undo a start that failed: remove the folders it created (a new run leaves nothing
        behind), or only the files it wrote into a folder that was there; release the lock.
        The lock is held until the folder is out of the way (renamed, then removed), so the
        next start never finds it half removed, and never loses its own files to this one."""
        if self._created:
            trash = self.dir.with_name(f".{self.dir.name}.{os.getpid()}.abandoned")
            try:
                os.rename(self.dir, trash)
            except OSError:
                trash = self.dir  # removed in place, still under the lock
                shutil.rmtree(trash, ignore_errors=True)
            self.release()
            shutil.rmtree(trash, ignore_errors=True)
            for parent in self._created[1:]:  # parents made for it, if nothing else is in them
                try:
                    parent.rmdir()
                except OSError:
                    break
        else:
            for name in (CONFIG, "client.jsonl"):
                (self.dir / name).unlink(missing_ok=True)
            self.release()

    # --- reading -------------------------------------------------------------------
    def config(self) -> dict:
        """The folder's config.json as written (RunLogError naming it when damaged)."""
        return read_json(self.dir / CONFIG, "a run's config")

    def steps(self) -> list[dict]:
        """The readable lines of metrics.jsonl (a resume refuses a log with others)."""
        return readable_rows(self.dir / METRICS)

    def last_step(self) -> int:
        """The last finished step, or -1 when none finished."""
        steps = self.steps()
        return int(steps[-1][STEP]) if steps else -1

    def status(self) -> dict | None:
        """status.json, or None while the run runs (or when it died without one)."""
        p = self.dir / STATUS
        return read_json(p, "a run's status") if file_there(p) else None

    def set_aside_steps_after(self, step: int) -> int:
        """Move the lines of steps after `step` (logged past the last checkpoint) aside, from
        metrics, samples, heat and eval and its outcomes (an evaluation after step + 1 steps);
        return how many steps.

        They go to `<file>.after-checkpoint`, kept for the record, since the resumed run
        redoes those steps from the checkpoint: each step is logged once. A line that cannot
        be read stays where it is.
        """
        moved = 0
        for name, key, last in ((METRICS, STEP, step), (SAMPLES, STEP, step), (HEAT, "step", step),
                                (EVAL, "eval/trained_steps", step + 1),
                                (OUTCOMES, "eval/trained_steps", step + 1)):
            path = self.dir / name
            if not file_there(path):
                continue
            lines = [x for x in read_bytes(path).split(b"\n") if x.strip()]
            after = [_after(json_row(x), key, last) for x in lines]
            if any(after):
                keep = b"".join(x + b"\n" for x, a in zip(lines, after) if not a)
                extra = b"".join(x + b"\n" for x, a in zip(lines, after) if a)
                try:
                    with open(self.dir / (name + SET_ASIDE), "ab") as f:
                        f.write(extra)
                    write_bytes_atomic(path, keep)
                except OSError as e:
                    raise write_failed(path, e) from e
            if name == METRICS:
                moved = sum(after)
        return moved

    def keep_each_step_once(self, step: int) -> list[int]:
        """Leave one line per step in metrics.jsonl up to `step` (the checkpoint's), once the
        lines after it are set aside: the line of `step` the checkpoint was written after, and
        before it the lines of the run that led there, each step's latest before the next.
        A line of a step already kept (logged twice: a copy, an edit) goes to
        `metrics.jsonl.duplicate`, kept for the record, and is said; returns those steps."""
        path = self.dir / METRICS
        if not file_there(path):
            return []
        lines = [x for x in read_bytes(path).split(b"\n") if x.strip()]
        steps = [int(json_row(x)[STEP]) if is_step_line(x) else None for x in lines]
        anchor = max((i for i, k in enumerate(steps) if k == step), default=len(lines) - 1)
        keep, below = set(), None
        for i in range(anchor, -1, -1):  # back from the checkpoint's step: each step once, in order
            if steps[i] is None or below is None or steps[i] < below:
                keep.add(i)
                below = steps[i] if steps[i] is not None else below
        aside = [i for i in range(len(lines)) if i not in keep and steps[i] is not None]
        if not aside:
            return []
        twice = sorted({steps[i] for i in aside})
        try:
            with open(self.dir / (METRICS + DUPLICATE), "ab") as f:
                f.write(b"".join(lines[i] + b"\n" for i in aside))
            write_bytes_atomic(path, b"".join(x + b"\n" for i, x in enumerate(lines) if i not in aside))
        except OSError as e:
            raise write_failed(path, e) from e
        shown = ", ".join(map(str, twice[:10])) + (", ..." if len(twice) > 10 else "")
        print(f"labkit: {path} logged step(s) {shown} more than once (line(s) "
              f"{', '.join(str(i + 1) for i in aside[:10])}); kept one line per step, the ones "
              f"the checkpoint after step {step} follows, and moved the other(s) to "
              f"{METRICS}{DUPLICATE}", flush=True)
        return twice

    def evaluated(self) -> set[int]:
        """The steps after which an evaluation is in eval.jsonl (eval/trained_steps)."""
        return {int(r["eval/trained_steps"]) for r in readable_rows(self.dir / EVAL)
                if isinstance(r.get("eval/trained_steps"), (int, float))}

    # --- writing -------------------------------------------------------------------
    def append_step(self, metrics: dict) -> None:
        """Append one step's metrics; the line is on disk when this returns."""
        if STEP not in metrics:
            raise ValueError(f"a step line needs the step key {STEP!r}")
        self._append(METRICS, [metrics])

    def append_samples(self, rows: Iterable[dict]) -> None:
        self._append(SAMPLES, list(rows))

    def append_heat(self, rows: Iterable[dict]) -> None:
        self._append(HEAT, list(rows))

    def append_eval(self, row: dict, outcomes: dict | None = None) -> None:
        """Append an evaluation's row to eval.jsonl, after its per-problem `outcomes` (a line
        of eval_outcomes.jsonl: labkit.run.outcomes.outcome_row), when given."""
        if outcomes is not None:
            self._append(OUTCOMES, [outcomes])
        self._append(EVAL, [row])

    def add_to_config(self, **values) -> None:
        """Record facts the run learned at start (e.g. whether the heat guard is on) in
        config.json, beside the config; they are not RunConfig fields, so --resume ignores them."""
        try:
            write_json_atomic(self.dir / CONFIG, {**self.config(), **values})
        except OSError as e:
            raise write_failed(self.dir / CONFIG, e) from e

    def write_status(self, reason: str, last_step: int, message: str = "", **extra) -> None:
        """Say why the run stopped; a resumed run keeps its earlier statuses under `earlier`.
        On a full disk the space kept aside (`keep_space`) is given up for it."""
        status = {"reason": reason, "last_step": last_step, "message": message, **extra}
        if self.earlier:
            status["earlier"] = self.earlier
        try:
            write_json_atomic(self.dir / STATUS, status)
        except OSError as e:
            if not self.give_up_space():
                raise write_failed(self.dir / STATUS, e) from e
            try:
                write_json_atomic(self.dir / STATUS, status)
            except OSError as again:
                raise write_failed(self.dir / STATUS, again) from again

    def keep_space(self, size: int = RESERVE_BYTES) -> None:
        """Keep `size` bytes of the disk aside (a hidden file, swept at the next start), so
        that on a full disk the status still fits (write_status gives them up for it)."""
        path = self.dir / RESERVE
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        except OSError:
            return
        try:
            try:
                os.posix_fallocate(fd, 0, size)  # blocks taken, nothing written
            except (AttributeError, OSError):  # a file system without it: zeros, written
                write_all(fd, b"\0" * size)
            os.fsync(fd)
        except OSError:  # a disk already that full: nothing to keep, the run goes on
            path.unlink(missing_ok=True)
        finally:
            os.close(fd)

    def give_up_space(self) -> bool:
        """Remove the space keep_space kept; True when there was some."""
        try:
            (self.dir / RESERVE).unlink()
            return True
        except OSError:
            return False

    def _append(self, name: str, rows: list[dict]) -> None:
        append_lines(self.dir / name, rows)  # no half line, whatever happens (WriteFailed)


def _what_was_cut(name: str, line: bytes) -> str:
    """'' or, for a step's line, '(step N)' read from what is left of it."""
    found = re.search(rb'"rollout/step": (\d+)', line) if name == METRICS else None
    return f" (step {int(found.group(1))})" if found else ""


def _after(row: dict | None, key: str, step: int) -> bool:
    value = row.get(key) if row is not None else None
    return isinstance(value, (int, float)) and int(value) > step


def _refuse_existing_run(run_dir: Path) -> None:
    if not os.path.isdir(run_dir):
        return  # no folder, no run in it (making it says what is in the way)
    if file_there(run_dir / METRICS) or file_there(run_dir / CONFIG):
        raise RunLogError(
            f"{run_dir} already holds a run; pass --resume {run_dir} to continue it, "
            f"or choose another --output-dir / --run-name"
        )


# ---------------------------------------------------------------- a run as the user holds it
# Fields a resumed run may change: they do not change what a step computes. With
# --rollout-mode http that includes where the engines are: a run may resume against a new
# router (its engines get the checkpoint's weights at start).
RESUMABLE = {"num_rollout", "time_limit", "progress", "output_dir", "run_name", "eval_interval",
             "save_interval", "n_logged_prompts", "heat_pause_c", "heat_resume_c",
             "router_url", "max_open_requests", "http_sync_check", "use_liger_kernel",
             "torch_compile", "skip_zero_advantage"}


class Run:
    """A run folder with readers for what the run wrote."""

    def __init__(self, run_dir: str | Path):
        self.dir = Path(run_dir)
        if not file_there(self.dir / CONFIG):
            raise RunLogError(f"{self.dir} is not a labkit run folder (no {CONFIG})")

    @property
    def config(self) -> dict:
        return RunLog(self.dir).config()

    @property
    def metrics(self):
        """One row per finished step, columns named as in labkit.run.metrics."""
        import pandas as pd

        rows, _ = read_jsonl(self.dir / METRICS)
        return pd.DataFrame(rows)

    @property
    def samples(self):
        """The logged completions: step, prompt id, label, completion, reward."""
        import pandas as pd

        rows, _ = read_jsonl(self.dir / SAMPLES)
        return pd.DataFrame(rows)

    @property
    def status(self) -> dict | None:
        return RunLog(self.dir).status()

    def __repr__(self) -> str:
        st = self.status or {}
        return (f"Run({str(self.dir)!r}: {len(self.metrics)} steps, "
                f"{st.get('reason', 'running or died')})")


def default_run_name(cfg: RunConfig) -> str:
    """A readable, unique-enough folder name: time, prompts x answers, seed."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return f"{stamp}-p{cfg.rollout_batch_size}-n{cfg.n_samples_per_prompt}-s{cfg.seed}"


def saved_config(run_dir: str | Path) -> RunConfig:
    """The RunConfig a run folder was started with; a value there that no run could have
    (the file edited by hand) is a RunLogError naming the file."""
    saved = RunLog(Path(run_dir)).config()
    known = {f.name for f in fields(RunConfig)}
    try:
        return RunConfig(**{k: v for k, v in saved.items() if k in known}).check()
    except (LabkitError, TypeError, ValueError) as e:
        raise RunLogError(f"{Path(run_dir) / CONFIG} holds a config no run could have "
                          f"({one_line(e)}); restore it or remove it") from e


def config_mismatches(saved: RunConfig, given: RunConfig) -> list[str]:
    """Flags whose values differ between a run folder and a config, outside RESUMABLE."""
    out = []
    for f in fields(RunConfig):
        a, b = getattr(saved, f.name), getattr(given, f.name)
        if f.name in ("eval_split_size", "gradient_checkpointing") and b is None:
            continue  # auto: the folder holds what it was resolved to, and the run keeps that
        if f.name not in RESUMABLE and a != b:
            out.append(f"--{f.name.replace('_', '-')}: folder has {a!r}, given {b!r}")
    return out


def check_new_run_folder(cfg: RunConfig) -> None:
    """Refuse, making nothing, what open_run_folder refuses for a new run: a folder that holds
    a run, or an --output-dir in which no run folder can be made (a file on its way, a folder
    not writable). A dry run and a sweep check here before anything starts."""
    run_dir = Path(cfg.output_dir) / (cfg.run_name or default_run_name(cfg))
    _refuse_existing_run(run_dir)
    there = run_dir
    while not os.path.lexists(there) and there != there.parent:
        there = there.parent  # the nearest that is there must take a folder (or be the folder)
    why = ("Not a directory" if not os.path.isdir(there)
           else "Permission denied" if not os.access(there, os.W_OK | os.X_OK) else None)
    if why:
        raise RunLogError(f"--output-dir {cfg.output_dir}: cannot create the run folder {run_dir} "
                          f"({why}); choose a folder you can write to")


def open_run_folder(cfg: RunConfig, resume: str | Path | None) -> tuple[Path, RunLog, int]:
    """Create the run folder, or open `resume` after checking its config matches `cfg`.
    Either way the returned RunLog holds the folder's lock (release it with log.release())."""
    if resume is None:
        run_dir = Path(cfg.output_dir) / (cfg.run_name or default_run_name(cfg))
        try:
            log = RunLog.create(run_dir, {**cfg.to_dict(), "labkit_version": __version__})
        except OSError as e:
            raise RunLogError(
                f"--output-dir {cfg.output_dir}: cannot create the run folder {run_dir} "
                f"({e.strerror or e}); choose a folder you can write to") from e
        return run_dir, log, 0
    run_dir = Path(resume)
    if not folder_there(run_dir, "it holds no run to resume"):
        raise RunLogError(f"--resume {run_dir}: no such folder; name a run folder, e.g. runs/<name>")
    log = RunLog.open(run_dir, repair=True)
    try:
        refuse_other_config(run_dir, cfg)
    except BaseException:
        log.release()
        raise
    return run_dir, log, log.last_step() + 1


def refuse_other_config(run_dir: Path, cfg: RunConfig) -> None:
    """RunLogError when `cfg` differs from the config `run_dir` was started with, outside
    RESUMABLE (what --resume refuses)."""
    bad = config_mismatches(saved_config(run_dir), cfg)
    if bad:
        raise RunLogError(
            f"--resume {run_dir}: the config does not match the run folder:\n  " + "\n  ".join(bad)
            + "\nresume with the folder's config (labkit launch --resume DIR and no other flags)"
        )
