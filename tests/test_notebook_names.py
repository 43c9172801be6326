"""Every labkit name the lessons use exists: `labkit.a.b.name` and `from labkit.a import name`
in the notebooks' code cells resolve, so a moved or renamed module breaks a test, not a lesson."""

from __future__ import annotations

import importlib
import json
import re

import pytest
from public_faces import NOTEBOOKS

DOTTED = re.compile(r"\blabkit(?:\.\w+)+")
FROM_IMPORT = re.compile(r"^\s*from (labkit(?:\.\w+)*) import (?:\(([^)]*)\)|([^\n]+))", re.M)


def code_cells():
    for nb in sorted(NOTEBOOKS.rglob("*.ipynb")):
        for cell in json.loads(nb.read_text())["cells"]:
            if cell["cell_type"] == "code":
                yield nb.relative_to(NOTEBOOKS), "".join(cell["source"])


def names_in_notebooks() -> set[str]:
    """Dotted names: `labkit.x.y` as written, and `labkit.x.name` for each `from labkit.x import name`."""
    found = set()
    for _, source in code_cells():
        source = re.sub(r"#.*", "", source)  # comments may mention names loosely
        found |= set(DOTTED.findall(source))
        for module, wrapped, line in FROM_IMPORT.findall(source):
            names = (wrapped or line).replace("\n", " ").split(",")
            found |= {f"{module}.{n.split(' as ')[0].strip()}" for n in names if n.strip()}
    return found


def resolve(dotted: str):
    """Import the longest module prefix of `dotted`, then take the rest as attributes."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for attr in parts[cut:]:
            obj = getattr(obj, attr)
        return obj
    raise ModuleNotFoundError(dotted)


def test_the_scan_finds_the_lessons_calls():
    names = names_in_notebooks()
    assert {"labkit.launch", "labkit.course.profiles.pick", "labkit.analysis.load_runs",
            "labkit.serving.replay.replay", "labkit.grpo.compute_advantages"} <= names


@pytest.mark.parametrize("dotted", sorted(names_in_notebooks()))
def test_every_name_a_lesson_uses_exists(dotted):
    resolve(dotted)
