"""The run folder's lock: one trainer writes a run folder at a time.

Two trainers on one folder (a second `--resume` while the first still runs) interleave their
steps in one log. So the trainer holds `runs/<name>/lock`: an exclusive flock, which the
kernel drops when the process dies however it dies, on a file that names the holder (pid,
host, start time) for the message that refuses the second trainer. The lock of a trainer
that was killed is therefore free, and is taken over with a line saying whose it was.
"""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

from labkit.errors import RunLogError


class RunLock:
    """A held lock file; `acquire` takes it or raises RunLogError naming the holder."""

    def __init__(self, path: Path, file):
        self.path, self._file = Path(path), file

    @classmethod
    def acquire(cls, path: Path) -> RunLock:
        path = Path(path)
        for _ in range(5):
            f = open(path, "a+")
            if not _try_flock(f):
                f.close()
                raise RunLogError(_in_use(path))
            if _same_file(f, path):  # not a file a releasing holder unlinked meanwhile
                break
            f.close()
        else:
            raise RunLogError(f"{path}: could not take the lock (it keeps changing)")
        stale = _read_lock(path)
        if stale.get("pid") and stale.get("pid") != os.getpid():
            print(f"labkit: {path}: pid {stale['pid']} held this folder and is gone; taking it "
                  f"over", flush=True)
        f.seek(0)
        f.truncate()
        f.write(json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                            "started": time.time()}) + "\n")
        f.flush()
        return cls(path, f)

    @staticmethod
    def refuse_if_held(path: Path) -> None:
        """RunLogError, in acquire's words, when a live trainer holds the lock at `path`;
        takes nothing and makes nothing (a dry run asks)."""
        path = Path(path)
        if not path.is_file():
            return
        with open(path) as f:  # closing it drops the lock this took, if it took one
            if not _try_flock(f):
                raise RunLogError(_in_use(path))

    def moved_to(self, path: Path) -> None:
        """The lock file was renamed with its folder (a new run folder put in place): the
        kernel's lock stays on the file, and release() now removes it at `path`."""
        self.path = Path(path)

    def release(self) -> None:
        """Remove the file, then drop the kernel's lock (closing the file)."""
        if self._file is None:
            return
        self.path.unlink(missing_ok=True)
        self._file.close()
        self._file = None


def _in_use(path: Path) -> str:
    """The refusal of a second trainer: who holds the folder, and the way on."""
    owner, folder = _read_lock(path), path.parent
    return (f"{folder} is in use by another trainer (pid {owner.get('pid', '?')} on "
            f"{owner.get('host', '?')}, {path}); wait for it to stop or stop it, then "
            f"--resume {folder}")


def _try_flock(f) -> bool:
    """Take an exclusive lock on an open file without waiting; True when taken."""
    try:
        import fcntl
    except ImportError:  # no flock (Windows): the pid in the file is all there is
        owner = _read_lock(Path(f.name))
        return not owner.get("pid") or not _alive(int(owner["pid"]))
    try:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except OSError:
        return False


def _same_file(f, path: Path) -> bool:
    try:
        return os.fstat(f.fileno()).st_ino == path.stat().st_ino
    except OSError:
        return False


def _read_lock(path: Path) -> dict:
    try:
        info = json.loads(Path(path).read_text() or "{}")
        return info if isinstance(info, dict) else {}
    except (OSError, ValueError):
        return {}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
