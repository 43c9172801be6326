"""A user's own reward, loaded from `--custom-rm-path` ("module:function" or "file.py:function").

As miles' `--custom-rm-path`, the function takes (response, label) and returns a float.
What goes wrong in it is the user's to fix, so each failure names the user's file: a file or
module that fails to import is a ConfigError naming it and the first line of why, and
labkit.reward.scoring names the function (`path/to/file.py:function`, reward_name) in what
it says about one that raises or returns what training cannot use.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable
from pathlib import Path

from labkit.errors import ConfigError

RewardFn = Callable[[str, str], float]

_FILE_MODULE = "labkit_custom_rm_"  # the name a reward file is imported under, then its stem
_files: dict[str, str] = {}  # module name -> the file it was imported from


def load_custom(path: str) -> RewardFn:
    """Import "module:function" or "file.py:function" and return the function. A file or
    module that fails to import (a syntax error, a missing package, an exit at import) is a
    ConfigError naming it and the first line of why: it is the user's file, not labkit's."""
    where, sep, name = path.rpartition(":")
    if not sep or not where or not name:
        raise ConfigError(f"--custom-rm-path {path!r}: use package.module:function "
                          f"or path/to/file.py:function")
    file = None
    if where.endswith(".py") or "/" in where or "\\" in where:
        file = Path(where).expanduser()
        if not file.is_file():
            raise FileNotFoundError(f"--custom-rm-path {path!r}: no file {file}")
    try:
        if file is not None:
            spec = importlib.util.spec_from_file_location(f"{_FILE_MODULE}{file.stem}", file)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            _files[module.__name__] = str(file)
        else:
            module = importlib.import_module(where)
    except (Exception, SystemExit) as e:  # whatever the user's file raises
        why = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise ConfigError(f"--custom-rm-path {path!r}: importing {where} failed "
                          f"({e.__class__.__name__}{': ' + why[:200] if why else ''}); fix "
                          f"{where} and try again") from e
    fn = getattr(module, name, None)
    if not callable(fn):
        raise ConfigError(f"--custom-rm-path {path!r}: {where} has no function {name!r}")
    return fn


def reward_name(fn: RewardFn) -> str:
    """A reward function as `--custom-rm-path` spells it: `path/to/file.py:function` for one
    loaded from a file, `package.module:function` otherwise (a callable object: its class)."""
    name = getattr(fn, "__qualname__", None) or type(fn).__qualname__
    module = getattr(fn, "__module__", None) or type(fn).__module__
    code = getattr(fn, "__code__", None)
    if module in _files or module.startswith(_FILE_MODULE):
        module = _files.get(module) or (code.co_filename if code is not None else module)
    return f"{module}:{name}"
