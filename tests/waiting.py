"""Waiting on a child process's output with a deadline: a test waits for a line, never forever.

A thread reads the child's lines as they come; `until(prefix)` returns once a line starts with
it and fails at the deadline (or when the child ends first) with what the child said; `rest()`
waits for the child's exit, also with a deadline, and returns what it said after that.
"""

from __future__ import annotations

import queue
import subprocess
import threading
import time

DEADLINE_S = 600.0  # a bound for a broken test, not the expected time


class Lines:
    """The lines a child writes to one of its pipes (`stream`, default its stdout)."""

    def __init__(self, proc: subprocess.Popen, stream=None):
        self.proc, self.seen = proc, []
        self._lines: queue.Queue = queue.Queue()
        self._reader = threading.Thread(target=self._read, args=(stream or proc.stdout,),
                                        daemon=True)
        self._reader.start()

    def _read(self, stream) -> None:
        for line in stream:
            self._lines.put(line)
        self._lines.put(None)  # the child closed it (it ended)

    def until(self, prefix: str, timeout: float = DEADLINE_S) -> list[str]:
        """Lines up to and including the first that starts with `prefix`."""
        end, got = time.monotonic() + timeout, []
        while True:
            try:
                line = self._lines.get(timeout=max(end - time.monotonic(), 0.0))
            except queue.Empty:
                raise AssertionError(f"no line starting {prefix!r} in {timeout:.0f} s:\n"
                                     + "".join(self.seen)) from None
            if line is None:
                self._lines.put(None)
                raise AssertionError(f"the child ended before {prefix!r}:\n" + "".join(self.seen))
            self.seen.append(line)
            got.append(line)
            if line.startswith(prefix):
                return got

    def rest(self, timeout: float = DEADLINE_S) -> str:
        """Wait for the child to end; return what it wrote since the last `until`."""
        self.proc.wait(timeout=timeout)
        self._reader.join(timeout=timeout)
        got = []
        while True:
            line = self._lines.get(timeout=timeout)
            if line is None:
                self._lines.put(None)
                break
            got.append(line)
        self.seen += got
        return "".join(got)
