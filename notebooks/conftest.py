"""Grading the lessons: `pytest --nbval-lax notebooks/students/<lesson>.ipynb` fails an unsolved exercise.

In JupyterLab a check cell only prints its verdict, so Run All goes on past an exercise
not solved yet. pytest reads this file before it runs any notebook below notebooks/, and
the kernels nbval starts inherit its environment: with LABKIT_GRADING set, a check cell
whose answer is wrong or missing (or whose answer cell raised, or ran past its deadline)
raises ExerciseError, and nbval fails that cell (labkit.course.exercises.grading).

Grading runs every cell in a fresh kernel, the launch cells too: a lesson that trains runs
(1.1, and 1.3's rerun cell) trains them again, minutes on a CPU, and pytest prints nothing
while a cell runs. So the first lines of the report say which notebooks do, before they start.
"""

import json
import os
from pathlib import Path

os.environ["LABKIT_GRADING"] = "1"

LAUNCHES = ("labkit.launch(", "labkit.launch_many(")  # a cell that trains a run


def launch_cells(path: Path) -> int:
    """How many code cells of the notebook at `path` launch a run (0 when it cannot be read)."""
    try:
        cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    except (OSError, ValueError, KeyError, TypeError):
        return 0
    sources = ("".join(c.get("source", "")) for c in cells if c.get("cell_type") == "code")
    return sum(any(launch in source for launch in LAUNCHES) for source in sources)


def pytest_report_collectionfinish(config, start_path, items):
    """One line per collected notebook that trains runs: grading trains them again."""
    notebooks = sorted({Path(str(item.fspath)) for item in items
                        if str(item.fspath).endswith(".ipynb")})
    lines = []
    for path in notebooks:
        launches = launch_cells(path)
        if launches:
            lines.append(f"labkit: {path.name} has {launches} cell{'s' * (launches != 1)} that "
                         f"train runs; grading trains them again in its fresh kernel: on a CPU "
                         f"that takes minutes, and nothing is printed while a cell runs")
    return lines
