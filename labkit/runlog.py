"""The run folder: how a run is written (RunLog), and a run as the user holds it (Run).

A run must lose nothing when it dies: each step's line is appended, flushed and fsynced
as soon as the step ends, and files that are rewritten (config, status) go through a
temporary file and a rename, so a reader never sees half a file.

Layout of a run folder::

    config.json      the resolved RunConfig (plus labkit version, derived values)
    metrics.jsonl    one line per finished step, keys from labkit.metrics (step key rollout/step)
    samples.jsonl    a few completions per step: prompt id (split/index), label, completion, reward
    heat.jsonl       one line per heat pause: start, end, seconds, peak_c, step
    eval.jsonl       one line per held-out evaluation (before the first step, after the last)
    status.json      why the run stopped: completed, time_limit, signal, error (with the last step)
    checkpoint/      policy, optimizer and RNG state after a finished step (see labkit.checkpoint)
    lock             the pid of the trainer writing the folder, while it runs (one at a time)

`labkit.launch(cfg)` returns a `Run`; so does `Run("runs/<name>")` for a finished run. The
same folder can be continued with `--resume`, which only accepts a config that matches the
one the folder was started with (a few bookkeeping fields may change: RESUMABLE). One
trainer writes a folder at a time: it holds `lock` (labkit.runlock: an flock the kernel drops
when the process dies, so the lock of a killed run is taken over); a second one is refused.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import tempfile
import time
from dataclasses import fields
from pathlib import Path
from typing import Any, Iterable

from labkit import __version__
from labkit.config import RunConfig
from labkit.errors import RunLogError
from labkit.metrics import STEP
from labkit.runlock import RunLock

CONFIG = "config.json"
METRICS = "metrics.jsonl"
SAMPLES = "samples.jsonl"
HEAT = "heat.jsonl"
EVAL = "eval.jsonl"
STATUS = "status.json"
CHECKPOINT = "checkpoint"
LOCK = "lock"
SET_ASIDE = ".after-checkpoint"  # suffix of the lines a resumed run redoes, kept for the record


def write_json_atomic(path: Path, obj: Any) -> None:
    """Write `obj` as JSON to `path` through a temp file and a rename (never half written)."""
    write_text_atomic(path, json.dumps(obj, indent=2, sort_keys=True, default=_jsonable) + "\n")


def _jsonable(x: Any) -> Any:
    if hasattr(x, "item"):
        return x.item()
    if isinstance(x, Path):
        return str(x)
    if isinstance(x, (set, tuple)):
        return list(x)
    raise TypeError(f"not JSON serializable: {type(x).__name__}")


def read_jsonl(path: Path, *, strict_tail: bool = False) -> tuple[list[dict], int]:
    """Read a JSONL file; return (rows, bad_lines).

    A truncated last line (a run killed mid-write) is counted as bad, not raised, unless
    `strict_tail` is set; a bad line in the middle is always counted.
    """
    path = Path(path)
    if not path.exists():
        return [], 0
    rows, bad = [], 0
    lines = path.read_text().splitlines()
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            if strict_tail and i == len(lines) - 1:
                raise RunLogError(
                    f"{path}: the last line is truncated (the run died while writing it); "
                    f"repair with labkit.runlog.RunLog.open(..., repair=True)"
                )
            bad += 1
    return rows, bad


class RunLog:
    """Append-only writer for one run folder."""

    def __init__(self, run_dir: Path):
        self.dir = Path(run_dir)
        self.earlier: list[dict] = []  # statuses of the run's earlier launches (resumed runs)
        self._lock: RunLock | None = None  # held while this writer has the folder
        self._created: list[Path] = []  # folders this start made (removed if the start fails)

    # --- creating and opening -------------------------------------------------------
    @classmethod
    def create(cls, run_dir: Path, config: dict) -> "RunLog":
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

    def _take_in_place(self, config: dict) -> "RunLog":
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
    def open(cls, run_dir: Path, *, repair: bool = False) -> "RunLog":
        """Open an existing run folder to append to it (resume), holding its lock.

        A truncated last line in metrics.jsonl is an error unless `repair` is set, in which
        case that line is moved to `metrics.jsonl.truncated` (kept, not lost) and dropped.
        """
        run_dir = Path(run_dir)
        if not (run_dir / CONFIG).exists():
            raise RunLogError(f"{run_dir} is not a labkit run folder (no {CONFIG})")
        log = cls(run_dir)
        log.lock()
        try:
            log._repair_tail(repair)
            old = log.status()
            if old:
                log.earlier = [*old.pop("earlier", []), old]
        except BaseException:
            log.release()
            raise
        return log

    def _repair_tail(self, repair: bool) -> None:
        path = self.dir / METRICS
        if not path.exists():
            return
        lines = path.read_text().splitlines(keepends=True)
        if not lines:
            return
        last = lines[-1]
        try:
            json.loads(last)
            ok = last.endswith("\n")
        except json.JSONDecodeError:
            ok = False
        if ok:
            return
        if not repair:
            raise RunLogError(f"{path}: the last line is truncated (the run died while writing it)")
        print(f"labkit: {path} ended in a truncated line (the run died while "
              f"writing it); moved it to {METRICS}.truncated", flush=True)
        with open(self.dir / (METRICS + ".truncated"), "a") as f:
            f.write(last.rstrip("\n") + "\n")
        write_text_atomic(path, "".join(lines[:-1]))

    # --- one writer at a time ---------------------------------------------------------
    def lock(self) -> None:
        """Hold the folder's lock (labkit.runlock); RunLogError when a live trainer holds it."""
        self._lock = RunLock.acquire(self.dir / LOCK)

    def release(self) -> None:
        """Give the folder's lock back."""
        if self._lock is not None:
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
        return json.loads((self.dir / CONFIG).read_text())

    def steps(self) -> list[dict]:
        rows, _ = read_jsonl(self.dir / METRICS)
        return rows

    def last_step(self) -> int:
        """The last finished step, or -1 when none finished."""
        steps = self.steps()
        return int(steps[-1][STEP]) if steps else -1

    def status(self) -> dict | None:
        p = self.dir / STATUS
        return json.loads(p.read_text()) if p.exists() else None

    def set_aside_steps_after(self, step: int) -> int:
        """Move the lines of steps after `step` (logged past the last checkpoint) aside, from
        metrics, samples and heat; return how many steps.

        They go to `<file>.after-checkpoint`, kept for the record, since the resumed run
        redoes those steps from the checkpoint: each step is logged once.
        """
        moved = 0
        for name, key in ((METRICS, STEP), (SAMPLES, STEP), (HEAT, "step")):
            rows, _ = read_jsonl(self.dir / name)
            keep = [r for r in rows if not _after(r, key, step)]
            extra = [r for r in rows if _after(r, key, step)]
            if extra:
                self._append(name + SET_ASIDE, extra)
                write_text_atomic(self.dir / name, "".join(
                    json.dumps(r, default=_jsonable, sort_keys=True) + "\n" for r in keep))
            if name == METRICS:
                moved = len(extra)
        return moved

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

    def append_eval(self, row: dict) -> None:
        self._append(EVAL, [row])

    def add_to_config(self, **values) -> None:
        """Record facts the run learned at start (e.g. whether the heat guard is on) in
        config.json, beside the config; they are not RunConfig fields, so --resume ignores them."""
        write_json_atomic(self.dir / CONFIG, {**self.config(), **values})

    def write_status(self, reason: str, last_step: int, message: str = "", **extra) -> None:
        """Say why the run stopped; a resumed run keeps its earlier statuses under `earlier`."""
        status = {"reason": reason, "last_step": last_step, "message": message, **extra}
        if self.earlier:
            status["earlier"] = self.earlier
        write_json_atomic(self.dir / STATUS, status)

    def _append(self, name: str, rows: list[dict]) -> None:
        if not rows:
            return
        data = "".join(json.dumps(r, default=_jsonable, sort_keys=True) + "\n" for r in rows)
        with open(self.dir / name, "a") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())


def write_text_atomic(path: Path, text: str) -> None:
    """Replace a text file's contents through a temp file and a rename (never half written).
    The file keeps its mode, or gets the user's umask when new (mkstemp alone gives 0600)."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        try:
            mode = path.stat().st_mode & 0o7777
        except OSError:
            mode = 0o666 & ~_umask()
        os.fchmod(fd, mode)
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _umask() -> int:
    """The process's umask (read from /proc where it can be, so it is not changed even briefly)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _after(row: dict, key: str, step: int) -> bool:
    value = row.get(key)
    return isinstance(value, (int, float)) and int(value) > step


def _refuse_existing_run(run_dir: Path) -> None:
    if (run_dir / METRICS).exists() or (run_dir / CONFIG).exists():
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
             "router_url", "max_open_requests"}


class Run:
    """A run folder with readers for what the run wrote."""

    def __init__(self, run_dir: str | Path):
        self.dir = Path(run_dir)
        if not (self.dir / CONFIG).exists():
            raise RunLogError(f"{self.dir} is not a labkit run folder (no {CONFIG})")

    @property
    def config(self) -> dict:
        return RunLog(self.dir).config()

    @property
    def metrics(self):
        """One row per finished step, columns named as in labkit.metrics."""
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
    """The RunConfig a run folder was started with."""
    saved = RunLog(Path(run_dir)).config()
    known = {f.name for f in fields(RunConfig)}
    return RunConfig(**{k: v for k, v in saved.items() if k in known})


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
    if not run_dir.is_dir():
        raise RunLogError(f"--resume {run_dir}: no such folder; name a run folder, e.g. runs/<name>")
    log = RunLog.open(run_dir, repair=True)
    bad = config_mismatches(saved_config(run_dir), cfg)
    if bad:
        log.release()
        raise RunLogError(
            f"--resume {run_dir}: the config does not match the run folder:\n  " + "\n  ".join(bad)
            + "\nresume with the folder's config (labkit launch --resume DIR and no other flags)"
        )
    return run_dir, log, log.last_step() + 1
