"""labkit's refusals: one error family, each message one line naming the flag or file and the fix.

Every error a user can cause or meet (a bad flag, a data file that is not UTF-8, a model
that is not a model, a run folder in use, engines that stopped answering) is a
`LabkitError`. `labkit <command>` prints its message as one line and exits with its
`exit_code`; the traceback is shown only with `--debug` or `LABKIT_DEBUG=1`. In a
notebook the same errors raise with the same message. Anything else that escapes is a bug
in labkit, and keeps its traceback.

Exit codes of `labkit launch` (labkit.run.stopping adds those of a run that stopped early):
2 refused input (config, data, model, run folder), 1 the run failed (engines, a bug).
"""

from __future__ import annotations

import os


class LabkitError(Exception):
    """Base of labkit's errors: the message is one line that names what to fix."""

    exit_code = 1


class ConfigError(LabkitError, ValueError):
    """A config that cannot run; the message names the flags and the value that fixes it."""

    exit_code = 2


class DataError(LabkitError, ValueError):
    """A data set that cannot be read (the file, the line and the fix are named)."""

    exit_code = 2


class ModelError(LabkitError, RuntimeError):
    """A model that cannot be found or loaded; the message says how to get it."""

    exit_code = 2


class RunLogError(LabkitError, RuntimeError):
    """A run folder that cannot be created, read or continued as asked."""

    exit_code = 2


def debug_enabled() -> bool:
    """True when LABKIT_DEBUG asks for tracebacks (1, true, yes)."""
    return os.environ.get("LABKIT_DEBUG", "").strip().lower() in ("1", "true", "yes")


def one_line(e: BaseException) -> str:
    """An exception's message on one line (a message over several lines is joined with '; ')."""
    text = str(e).strip() or e.__class__.__name__
    return "; ".join(part.strip() for part in text.splitlines() if part.strip())
