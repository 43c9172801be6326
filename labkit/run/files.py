"""A run folder's files, written whole and read back: what a kill or a full disk leaves is said.

Files that are rewritten (config, status, the checkpoint's pointer) go through a temporary
file and a rename, so a reader never sees half a file; lines are appended with one write and
an fsync, and a write that fails (a full disk) is cut back, so no half line stays, and
raised as `WriteFailed`, in words: the file, and whether the disk is full. Reading back, a
line that is not a JSON object (cut short, not UTF-8, a list) is counted, never raised, and
a JSON file that is not one object is a RunLogError naming it (labkit.run.log decides what a
resume makes of each). Every reader asks `file_there` first: a file that is not there reads
as missing, and one that is there but cannot be read (a link that loops, a folder in its
place, no permission) is a RunLogError saying which and what, never "missing".
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import stat
import tempfile
from pathlib import Path
from typing import Any

from labkit.errors import RunLogError, one_line
from labkit.run.metrics import STEP


class WriteFailed(RunLogError):
    """A file of the run folder could not be written (the disk is full, the folder is
    read-only, ...); the message says which, and how much room is left."""

    exit_code = 1


def disk_full(e: BaseException, folder: Path, need: int = 0) -> tuple[bool, str]:
    """(whether `e` means the disk is full, the free space in words). A disk with less room
    than `need` bytes counts as full too: torch says a full disk in its own words."""
    try:
        free_bytes = shutil.disk_usage(folder).free
        free = f"{free_bytes / 2**20:,.0f} MB free"
    except OSError:
        free_bytes, free = None, "free space unknown"
    full = (isinstance(e, OSError) and e.errno in (errno.ENOSPC, getattr(errno, "EDQUOT", -1))
            or "file write failed" in str(e) or "No space left" in str(e)
            or (free_bytes is not None and free_bytes < need))
    return full, free


def write_failed(path: Path, e: OSError) -> WriteFailed:
    """The WriteFailed for `e`, met while writing `path`: a full disk is said as such."""
    path = Path(path)
    full, free = disk_full(e, path.parent)
    if full:
        return WriteFailed(f"could not write {path}: the disk is full ({free}); free some space")
    return WriteFailed(f"could not write {path} ({e.strerror or e}; {free})")


# ----------------------------------------------------------------------------- reading
def file_there(path: Path) -> bool:
    """Whether a file of the run folder is there: True for a regular file (or a link to one),
    False when nothing is at `path`. Anything else is a RunLogError that names the file and
    says what is wrong with it (a link that loops or leads nowhere, a folder or a pipe where
    the file should be, a folder on its way that cannot be entered), so that no reader takes
    a damaged file for a missing one ("no config.json" for a link that loops)."""
    path = Path(path)
    st = _stat(path)
    if st is None:
        return False
    if stat.S_ISDIR(st.st_mode):
        raise RunLogError(f"{path} is not a file but a folder; move it away")
    if not stat.S_ISREG(st.st_mode):
        kind = ("a named pipe" if stat.S_ISFIFO(st.st_mode) else "a socket"
                if stat.S_ISSOCK(st.st_mode) else "a device")
        raise RunLogError(f"{path} is not a file but {kind}; move it away")
    return True


def folder_there(path: Path, use: str = "") -> bool:
    """Whether a folder of the run is there: True for a folder (or a link to one), False when
    nothing is at `path`; a RunLogError naming it for anything else (a file, a link that
    loops or leads nowhere). `use`: what the folder is for, said with a file in its place."""
    path = Path(path)
    st = _stat(path)
    if st is None:
        return False
    if not stat.S_ISDIR(st.st_mode):
        raise RunLogError(f"{path} is not a folder{', so ' + use if use else ''}; move it away")
    return True


def _stat(path: Path) -> os.stat_result | None:
    """What is at `path` (through links), None when nothing is; a RunLogError for a link that
    leads nowhere or loops, or a path that cannot be looked at."""
    try:
        return path.stat()
    except FileNotFoundError:
        if path.is_symlink():
            raise RunLogError(f"{path} is a link to {os.readlink(path)}, which is not there; "
                              f"restore what it points to, or remove the link") from None
        return None
    except OSError as e:
        raise RunLogError(cannot_read(path, e)) from None


def cannot_read(path: Path, e: OSError) -> str:
    """Why `path` cannot be read, in words that name it and the fix (for a RunLogError)."""
    path = Path(path)
    if e.errno == errno.ELOOP:
        where = "is a symbolic link" if path.is_symlink() else "lies behind a symbolic link"
        return (f"{path} {where} that loops (it leads back to itself); remove the link, or "
                f"point it at the file")
    if e.errno in (errno.EACCES, errno.EPERM):
        return (f"{path} cannot be read (permission denied); give yourself read access to it "
                f"and its folder (chmod u+r), or run as its owner")
    if e.errno == errno.ENOTDIR:
        return f"{path} cannot be read: a part of its path is a file, not a folder"
    if e.errno == errno.EISDIR:
        return f"{path} is not a file but a folder; move it away"
    return f"{path} cannot be read ({e.strerror or e})"


def read_json(path: Path, what: str) -> dict:
    """A JSON object from `path`; RunLogError naming the file when it is not one (`what`
    says what it should hold, for the message)."""
    path = Path(path)
    try:
        obj = json.loads(read_bytes(path).decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise RunLogError(f"{path} cannot be read as {what} (not JSON: {one_line(e)}); restore "
                          f"it or remove it") from e
    if not isinstance(obj, dict):
        raise RunLogError(f"{path} cannot be read as {what} (a JSON {type(obj).__name__}, not "
                          f"an object); restore it or remove it")
    return obj


def read_jsonl(path: Path, *, strict_tail: bool = False) -> tuple[list[dict], int]:
    """Read a JSONL file; return (rows, bad_lines): a line that is not a JSON object (cut
    short, a list) is counted as bad. A file that is not UTF-8 text raises UnicodeDecodeError
    (the analysis names it as a binary file in a run's place).

    A truncated last line (a run killed mid-write) is counted as bad too, unless
    `strict_tail` is set: then it is refused.
    """
    path = Path(path)
    if not file_there(path):
        return [], 0
    rows, bad = [], 0
    lines = read_bytes(path).decode("utf-8").split("\n")
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        row = json_row(line.encode())
        if row is None:
            if strict_tail and i == len(lines) - 1:
                raise RunLogError(
                    f"{path}: the last line is truncated (the run died while writing it); "
                    f"repair with labkit.run.log.RunLog.open(..., repair=True)"
                )
            bad += 1
        else:
            rows.append(row)
    return rows, bad


def readable_rows(path: Path) -> list[dict]:
    """The lines of a JSONL file that are JSON objects; any other (cut short, not UTF-8) is
    left out. [] when there is no file."""
    path = Path(path)
    if not file_there(path):
        return []
    return [row for row in map(json_row, read_bytes(path).split(b"\n")) if row is not None]


def json_row(line: bytes) -> dict | None:
    """One JSONL line as a dict, or None when it is not a JSON object."""
    try:
        row = json.loads(line.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return None
    return row if isinstance(row, dict) else None


def is_step_line(line: bytes) -> bool:
    """Whether a metrics.jsonl line is a step's: a JSON object with a whole step number."""
    row = json_row(line)
    return row is not None and isinstance(row.get(STEP), int)


def read_bytes(path: Path) -> bytes:
    """The file's bytes; RunLogError naming it, and what is wrong, when it cannot be read
    (file_there, cannot_read)."""
    path = Path(path)
    if not file_there(path):
        raise RunLogError(f"{path} is not there (no such file)")
    try:
        return path.read_bytes()
    except OSError as e:
        raise RunLogError(cannot_read(path, e)) from e


# ----------------------------------------------------------------------------- writing
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


def write_text_atomic(path: Path, text: str) -> None:
    """Replace a text file's contents (UTF-8) through a temp file and a rename."""
    write_bytes_atomic(path, text.encode("utf-8"))


def write_bytes_atomic(path: Path, data: bytes) -> None:
    """Replace a file's bytes through a temp file and a rename (never half written).
    The file keeps its mode, or gets the user's umask when new (mkstemp alone gives 0600)."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        try:
            mode = path.stat().st_mode & 0o7777
        except OSError:
            mode = 0o666 & ~user_umask()
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def user_umask() -> int:
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


def append_lines(path: Path, rows: list[dict]) -> None:
    """Append the rows to `path` as JSON lines, on disk when this returns. A write that fails
    (a full disk) leaves the file as it was, with no half line, and raises WriteFailed."""
    if not rows:
        return
    data = "".join(json.dumps(r, default=_jsonable, sort_keys=True) + "\n" for r in rows)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
    except OSError as e:
        raise write_failed(path, e) from e
    try:
        size = os.fstat(fd).st_size
        try:
            write_all(fd, data.encode())
            os.fsync(fd)
        except OSError as e:
            _cut_back(fd, size)
            raise write_failed(path, e) from e
    finally:
        os.close(fd)


def write_all(fd: int, data: bytes) -> None:
    """os.write until all of `data` is written (a write may take part of it)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _cut_back(fd: int, size: int) -> None:
    """Truncate the file back to `size` bytes: a failed append leaves no half line."""
    try:
        os.ftruncate(fd, size)
    except OSError:  # then the next resume moves the cut line aside
        pass
