"""A CPU run's memory kept for reuse: glibc's malloc told not to give freed buffers back.

Every step of a run on a CPU allocates and frees the same large buffers again (activations,
the output layer's logits, the gradients). By default glibc's malloc hands each buffer over
its mmap threshold (at most 32 MiB) back to the kernel when it is freed, and trims the top of
its heap past 128 KiB, so the next step faults the same memory in again, a 4 KiB page at a
time. On the course's 2-core box the kernel's share of the CPU time reached 80% during an
update. With mmap off (every buffer from the heap) and no automatic trimming, freed memory
is reused instead; the peak does not grow, it is what a step holds at its largest either way
(`BENCHMARKS.md`, "Memory kept for reuse on a CPU"). When a run ends, `give_back()` returns
the heap's free pages at once (malloc_trim), so a notebook's kernel does not sit on them.

On a system without glibc (macOS, Windows, musl) both calls do nothing and say so by
returning False. The answers of a run are the same either way: only where memory comes from
changes.
"""

from __future__ import annotations

import ctypes
import sys

# mallopt's parameters (glibc's malloc.h)
M_TRIM_THRESHOLD = -1
M_MMAP_MAX = -4
NEVER_TRIM = 2**31 - 1  # the largest value mallopt takes (an int): no automatic trimming

_libc = None
_kept = False  # keep_freed_memory() took in this process: give_back() has pages to return


def _glibc():
    """glibc's C library when this process runs on it, else None."""
    global _libc
    if _libc is None:
        _libc = False
        if sys.platform.startswith("linux"):
            try:
                lib = ctypes.CDLL(None)
                if lib.gnu_get_libc_version:  # glibc only (musl has mallopt, not this)
                    _libc = lib
            except (OSError, AttributeError):
                pass
    return _libc or None


def keep_freed_memory() -> bool:
    """Tell malloc to keep what is freed for reuse (no mmap, no automatic trim) for the rest
    of this process; True when it took. Calling it again changes nothing."""
    global _kept
    libc = _glibc()
    _kept = _kept or bool(libc and libc.mallopt(M_MMAP_MAX, 0)
                          and libc.mallopt(M_TRIM_THRESHOLD, NEVER_TRIM))
    return _kept


def give_back() -> bool:
    """Return the heap's free pages to the kernel now; True when it did. Only after
    keep_freed_memory() took (a run on a CPU, glibc): else malloc trims as it always does."""
    if not _kept:
        return False
    _glibc().malloc_trim(0)
    return True
