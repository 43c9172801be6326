"""Checks shared by the tests of labkit's public-face modules (analysis, miles)."""

from __future__ import annotations

import json
import re
from pathlib import Path

NOTEBOOKS = Path(__file__).parents[1] / "notebooks"


def assert_reexports(face, homes) -> None:
    """Every name in face.__all__ is the very object its home module defines.

    A name's home is the first of `homes` that has it (later ones import from earlier ones).
    """
    assert len(face.__all__) == len(set(face.__all__))
    for name in face.__all__:
        home = next((m for m in homes if hasattr(m, name)), None)
        assert home is not None, f"{face.__name__} lists {name}, which none of its modules defines"
        assert getattr(face, name) is getattr(home, name), name


def names_used_in_notebooks(module: str) -> set[str]:
    """Names the lessons take from `module` (`labkit.x.name` or `from labkit.x import ...`)."""
    used: set[str] = set()
    dotted = re.escape(module)
    for nb in NOTEBOOKS.rglob("*.ipynb"):
        for cell in json.loads(nb.read_text())["cells"]:
            source = "".join(cell["source"])
            used |= set(re.findall(rf"\b{dotted}\.(\w+)", source))
            for names in re.findall(rf"from {dotted} import ([\w, ]+)", source):
                used |= {n.strip() for n in names.split(",")}
    return used
